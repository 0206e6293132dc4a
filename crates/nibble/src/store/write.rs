//! The write path: PUT (Nibble and Nibble-2), DEL and expiry changes
//! (dissertation §4.1, §4.4, §6.2).
//!
//! ```text
//!  put_with   check ─ start_put (header, prefetch) ─ pin
//!             ─ Nibble-2: overwrite_in_place (bucket lock; condition; fits? write value + header)
//!             ─ optimistic condition ─ append_object (local head; full log: wait for compaction unpinned)
//!             ─ publish (bucket lock: condition, version, expiry; swap entry; old dead;
//!               a kept TTL the new object has no expiry slot for: append again with it)
//!  read_modify_write  pin ─ Nibble-2: bucket lock ─ copy the live value out ─ caller's closure
//!             ─ fits? write value + header (new version; flags, TTL kept) ─ unlock
//!             ─ Nibble, or a read that fails: optimistic read ─ closure (no write)
//!  delete_if  pin ─ bucket lock ─ condition ─ remove entry ─ old dead ─ live−
//!  set_expiry pin ─ bucket lock ─ expiry slot, or no TTL: header rewritten in place
//!             ─ else relocate: append a copy with the slot (full log: half the
//!               compaction reserve, then wait for compaction unlocked), swap entry
//! ```
//!
//! `read_modify_write` is a collection write's one engine operation: the
//! read and the in-place overwrite of `put_with` under one bucket lock,
//! one index lookup and no seqlock validation (nobody else writes the
//! object while the lock is held). What does not fit the allocation goes
//! back to the caller, which appends it with `put_with` conditioned on
//! the version it read.
//!
//! Every write to a published object's bytes happens under its bucket
//! lock, so an optimistic reader that raced it fails its seqlock
//! validation and retries; an appended object is written before the index
//! names it, so nobody reads it half-made.
use super::*;

impl Store {
    fn check(&self, key: &[u8], value_len: usize) -> Result<(), Error> {
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::BadKey { len: key.len() });
        }
        if value_len > self.inner.cfg.max_value_bytes {
            return Err(Error::ValueTooLarge {
                len: value_len,
                max: self.inner.cfg.max_value_bytes,
            });
        }
        Ok(())
    }

    /// Store `value` under `key`. Returns the new version.
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(key, value, PutOptions::default())
    }

    /// Store only if absent (memcached `add`).
    pub fn put_if_absent(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfAbsent,
                ..Default::default()
            },
        )
    }

    /// Store only if present (memcached `replace`).
    pub fn replace(&self, key: &[u8], value: &[u8]) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfPresent,
                ..Default::default()
            },
        )
    }

    /// Store only if the current version is `version` (memcached `cas`).
    pub fn compare_and_swap(&self, key: &[u8], value: &[u8], version: u64) -> Result<u64, Error> {
        self.put_with(
            key,
            value,
            PutOptions {
                condition: Condition::IfVersion(version),
                ..Default::default()
            },
        )
    }

    /// The general write: `opts.condition` decided against the live item
    /// under its bucket lock, `opts.expiry` and `opts.flags` applied.
    /// Returns the new version.
    ///
    /// The steps: check the sizes, build the header and start the cache
    /// misses ahead of the index work; pin; in Nibble-2, try the in-place
    /// overwrite (the condition decided under the bucket lock); otherwise
    /// check the condition optimistically (so a failing one leaves no dead
    /// object in the log), append the object and publish it in the index.
    pub fn put_with(&self, key: &[u8], value: &[u8], opts: PutOptions) -> Result<u64, Error> {
        self.put_inner(key, value, opts, false)
    }

    /// As [`put_with`](Store::put_with), and cache mode must never evict
    /// the item (it relocates it, as compaction does): the server writes
    /// the internal pieces of big collections this way, since a lone
    /// piece must not disappear. The mark is in the object header (the
    /// shape word's top bit); an overwrite takes the new write's
    /// setting, and a TTL still expires the item.
    pub fn put_never_evict(
        &self,
        key: &[u8],
        value: &[u8],
        opts: PutOptions,
    ) -> Result<u64, Error> {
        self.put_inner(key, value, opts, true)
    }

    fn put_inner(
        &self,
        key: &[u8],
        value: &[u8],
        opts: PutOptions,
        pinned: bool,
    ) -> Result<u64, Error> {
        self.check(key, value.len())?;
        let inner = &*self.inner;
        let hash = hash_key(key);
        let mut h = Header {
            pinned,
            ..self.start_put(hash, key, value, &opts)
        };
        let guard = inner.epochs.try_pin()?;
        // Start the old version's lines too: the bucket lock below reads
        // its header and key (and Nibble-2 overwrites its value), a miss
        // that otherwise waits for the lock and then stalls the write.
        let old_bytes = match inner.cfg.mode {
            Mode::Nibble2 => crate::object::HEADER_MIN_BYTES + key.len() + value.len(),
            Mode::Nibble => crate::object::HEADER_MIN_BYTES + key.len(),
        };
        // A key the peek does not see is probably new (a load) and will be
        // appended: its destination's lines are already coming, since
        // this thread's previous append prefetched its head's next object
        // (`Log::append`).
        let seen = inner.prefetch_old(hash, old_bytes);
        // Nibble-2 tries the in-place overwrite only where the peek saw a
        // candidate: for a new key it would lock the buckets just to find
        // nothing. A key the peek missed (a racing resize or writer) is
        // appended and published like any other, which is correct, only
        // not in place. The overwrite decides the condition and a kept
        // TTL under the bucket lock itself, so it comes before the
        // optimistic check below, which only an append needs.
        if inner.cfg.mode == Mode::Nibble2 && seen {
            if let Some(version) = self.overwrite_in_place(hash, key, value, &opts, &mut h)? {
                return Ok(version);
            }
        }
        if opts.condition != Condition::Always || opts.expiry == Expiry::Keep {
            // Cheap optimistic check before appending, so a failing
            // condition does not leave a dead object in the log; and a
            // kept TTL needs the expiry slot (`publish` checks again under
            // the lock).
            let cur = self.read_header(hash, key);
            check_condition(opts.condition, cur.as_ref())?;
            if opts.expiry == Expiry::Keep {
                h.expiry_ms = opts.expiry.expiry_ms(cur.as_ref());
                h.expiry_slot |= h.expiry_ms != 0;
            }
        }
        let mut guard = guard;
        loop {
            let (app, g) = self.append_object(&h, key, value, guard)?;
            match self.publish(hash, key, &opts, h, app)? {
                Some(version) => return Ok(version),
                // The old item's TTL, kept, needs the slot: append again
                // with it (`publish` marked this copy dead).
                None => {
                    h.expiry_slot = true;
                    guard = g;
                }
            }
        }
    }

    /// A put's new header, with the index buckets and (in Nibble mode)
    /// the append's destination already being fetched: the misses then
    /// overlap the rest of the put's work before it needs them.
    #[inline]
    fn start_put(&self, hash: u64, key: &[u8], value: &[u8], opts: &PutOptions) -> Header {
        let inner = &*self.inner;
        inner.index.prefetch_for_lock(hash);
        let h = Header::new(
            key.len(),
            value.len(),
            opts.flags,
            next_log_version(0),
            // No old item yet: `Keep` means none until `publish` sees one.
            opts.expiry.expiry_ms(None),
            false,
        );
        if inner.cfg.mode == Mode::Nibble {
            inner.prefetch_append(h.object_bytes());
        }
        h
    }

    /// Nibble-2 (§6.2): overwrite the live object of `key` in place when
    /// the new value fits its allocation. `Ok(Some(version))` if it did;
    /// `Ok(None)` if the put must append, in which case `h` gets a slack
    /// slot when it replaces a value of another size, so that a later,
    /// shorter value can be written in place.
    fn overwrite_in_place(
        &self,
        hash: u64,
        key: &[u8],
        value: &[u8],
        opts: &PutOptions,
        h: &mut Header,
    ) -> Result<Option<u64>, Error> {
        let mem = &self.inner.mem;
        let g = self.inner.index.lock(hash);
        let mut old = None;
        let Some(slot) = g.find(|l| {
            old = header_if_key(mem, off_of(l), key);
            old.is_some()
        }) else {
            return Ok(None);
        };
        let off = off_of(g.loc(slot));
        let Some(old) = old else {
            return Ok(None);
        };
        let live = !old.expired();
        check_condition(opts.condition, live.then_some(&old))?;
        let expiry_ms = opts.expiry.expiry_ms(live.then_some(&old));
        if !(old.can_hold(value.len()) && old.fits_flags(opts.flags) && old.fits_expiry(expiry_ms))
        {
            h.slack_slot = old.value_cap as usize != value.len();
            if expiry_ms != 0 {
                h.expiry_slot = true;
            }
            return Ok(None);
        }
        let new = Header {
            value_len: value.len() as u32,
            flags: opts.flags,
            version: next_log_version(old.version),
            expiry_ms,
            pinned: h.pinned,
            ..old
        };
        // SAFETY: we hold the key's bucket locks (`g`) and an epoch guard:
        // the object is live and we are its only writer; `can_hold`
        // checked that the value fits its allocation. Readers validate
        // their copy against the bucket version.
        unsafe {
            mem.write_part(off, old.header_bytes() + old.key_len as usize, value);
            mem.write_header(off, &new);
        }
        note_expiry(mem, off, new.expiry_ms);
        Ok(Some(new.version))
    }

    /// Read `key`'s value into `buf`, let `f` change it, and write the
    /// result back in place, all under the key's bucket lock (Nibble-2):
    /// one index lookup for the read and the write, and no concurrent
    /// writer between them. `f` gets the live item's metadata (`None`,
    /// and `buf` empty, if absent or expired) and `buf`, and returns its
    /// result and whether to write `buf`. The in-place write keeps the
    /// item's flags, expiry and eviction mark and gives it a new version;
    /// it happens when the item is live and `buf` fits its allocation
    /// (`Header::can_hold`). Otherwise (`Rmw::written` is `None`) the
    /// new bytes stay in `buf` for the caller to `put_with`, conditioned
    /// on `Rmw::old`. In Nibble mode (no in-place overwrite) the read is
    /// the optimistic one of [`get_into`](Store::get_into) and nothing is
    /// written.
    ///
    /// `f` runs with the bucket lock held: it must not call into this
    /// store (a read of a key in a locked bucket waits for the lock), and
    /// should be short, since readers of the bucket retry meanwhile.
    pub fn read_modify_write<T>(
        &self,
        key: &[u8],
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Result<Rmw<T>, Error> {
        if key.len() > MAX_KEY_BYTES {
            return Err(Error::BadKey { len: key.len() });
        }
        let inner = &*self.inner;
        if inner.cfg.mode != Mode::Nibble2 {
            let old = self.get_into(key, buf)?;
            return Ok(Rmw::unwritten(old, buf, f));
        }
        let mem = &inner.mem;
        let max_value = inner.cfg.max_value_bytes;
        let _guard = inner.epochs.try_pin()?;
        let hash = hash_key(key);
        inner.index.prefetch_for_lock(hash);
        let g = inner.index.lock(hash);
        let mut old = None;
        let found = g.find(|l| {
            old = header_if_key(mem, off_of(l), key);
            old.is_some()
        });
        let cur = match (found, old) {
            (Some(slot), Some(h)) if !h.expired() => {
                let off = off_of(g.loc(slot));
                let n = (h.value_len.min(h.value_cap) as usize).min(max_value);
                buf.resize(n, 0);
                if !mem.read_part(off, h.header_bytes() + key.len(), buf) {
                    // A published object reads whole under its lock; if
                    // it did not, read it the lock-free way and write
                    // nothing here.
                    drop(g);
                    let old = self.get_into(key, buf)?;
                    return Ok(Rmw::unwritten(old, buf, f));
                }
                Some((off, h))
            }
            _ => {
                buf.clear();
                None
            }
        };
        let meta = cur.map(|(_, h)| ItemMeta::of(&h));
        let (out, write) = f(meta, buf);
        let written = match cur {
            Some((off, h)) if write && h.can_hold(buf.len()) => {
                let new = Header {
                    value_len: buf.len() as u32,
                    version: next_log_version(h.version),
                    ..h
                };
                // SAFETY: we hold the key's bucket locks (`g`) and an epoch
                // guard: the object is live and we are its only writer;
                // `can_hold` checked that the value fits its allocation.
                // Readers validate their copy against the bucket version.
                unsafe {
                    mem.write_part(off, h.header_bytes() + h.key_len as usize, buf);
                    mem.write_header(off, &new);
                }
                Some(new.version)
            }
            _ => None,
        };
        drop(g);
        Ok(Rmw {
            out,
            old: meta,
            written,
        })
    }

    /// Append the object (`h`, `key`, `value`) to this CPU's log head.
    /// When the log is full, waits for compaction with the epoch guard
    /// dropped (segments retired meanwhile are freed only once every
    /// older guard is gone) and pins again; returns where the object went
    /// and the guard it holds. `Err(OutOfMemory)` when the wait gives up.
    fn append_object<'s>(
        &'s self,
        h: &Header,
        key: &[u8],
        value: &[u8],
        mut guard: epoch::Guard<'s>,
    ) -> Result<(crate::log::Appended, epoch::Guard<'s>), Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let len = h.object_bytes();
        let head_bytes = h.header_bytes();
        let fill = |off| {
            // SAFETY: `Log::append` calls `fill` with `len` bytes it just
            // reserved under the head's lock and has not published: this
            // thread is their only writer.
            unsafe {
                mem.write_header(off, h);
                mem.write_part(off, head_bytes, key);
                mem.write_part(off, head_bytes + key.len(), value);
            }
            // Under the head's lock, so before the segment can close: the
            // expiry pass never sees a latest expiry that misses it.
            note_expiry(mem, off, h.expiry_ms);
        };
        // Made at the first failed append only (it reads the clock).
        let mut wait = None;
        loop {
            match inner.try_append(len, h.expiry_ms, &fill) {
                Ok(a) => return Ok((a, guard)),
                Err(_) => {
                    if wait.is_none() && inner.known_full() {
                        return Err(Error::OutOfMemory { what: "log" });
                    }
                    drop(guard);
                    let w = wait.get_or_insert_with(|| SpaceWait::new(inner));
                    inner.wait_for_space(w)?;
                    guard = inner.epochs.try_pin()?;
                }
            }
        }
    }

    /// Point the index at the appended object `app`, under the key's
    /// bucket lock: the condition is decided there, and so are the
    /// version (above the old one's) and a kept expiry, written into the
    /// unpublished object's header before the entry store that publishes
    /// it. The old object, if any, is marked dead and its live bytes
    /// subtracted. Grows the index and retries when both buckets are full.
    /// Returns the new version; `None` when the old item's kept expiry
    /// (`Expiry::Keep`) needs an expiry slot the appended object lacks (a
    /// TTL set since the put's optimistic look): the appended object is
    /// then marked dead and the caller appends again with the slot.
    fn publish(
        &self,
        hash: u64,
        key: &[u8],
        opts: &PutOptions,
        mut h: Header,
        app: crate::log::Appended,
    ) -> Result<Option<u64>, Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let len = h.object_bytes();
        let new_loc = loc_of(app.off);
        loop {
            let mut g = inner.index.lock(hash);
            let mut old = None;
            match g.find(|l| {
                old = header_if_key(mem, off_of(l), key);
                old.is_some()
            }) {
                Some(slot) => {
                    let old_off = off_of(g.loc(slot));
                    let old = old.unwrap_or_default();
                    let live = !old.expired();
                    check_condition(opts.condition, live.then_some(&old))?;
                    let version = crate::object::log_version_after(h.version, old.version);
                    let expiry = opts.expiry.expiry_ms(live.then_some(&old));
                    if !h.fits_expiry(expiry) {
                        // SAFETY: the object is ours, appended above and
                        // never published; we hold an epoch guard.
                        unsafe { mem.mark_dead(app.off) };
                        return Ok(None);
                    }
                    if version != h.version || expiry != h.expiry_ms {
                        h.version = version;
                        h.expiry_ms = expiry;
                        // SAFETY: the object is ours, appended above and
                        // not yet published (the index store is below).
                        unsafe { mem.write_header(app.off, &h) };
                    }
                    g.replace(slot, new_loc);
                    note_expiry(mem, app.off, h.expiry_ms);
                    mem.live().add(app.seg, len as i64);
                    // Under the bucket lock, like every in-place write:
                    // a reader that sees the mark fails its validation.
                    // SAFETY: the bucket is locked and the old object just
                    // unlinked; we hold an epoch guard.
                    unsafe { mem.mark_dead(old_off) };
                    drop(g);
                    mem.live()
                        .add(mem.seg_of(old_off), -(old.object_bytes() as i64));
                    inner.note_reclaimable();
                    return Ok(Some(version));
                }
                None => {
                    check_condition(opts.condition, None)?;
                    match g.insert(new_loc) {
                        Ok(_) => {
                            note_expiry(mem, app.off, h.expiry_ms);
                            mem.live().add(app.seg, len as i64);
                            return Ok(Some(h.version));
                        }
                        Err(_) => {
                            drop(g);
                            if inner.index.grow(hash).is_err() && !self.evict_neighbour(hash) {
                                // The index may be waiting for log blocks
                                // to borrow: let compaction free some for
                                // the next write.
                                inner.wake_workers();
                                return Err(Error::OutOfMemory { what: "index" });
                            }
                        }
                    }
                }
            }
        }
    }

    /// Cache mode, index full (its budget spent): evict an item of
    /// `hash`'s full neighbourhood to make room for the new key, an
    /// unread one if there is one (the accessed bit), never a pinned one
    /// (nor, under `volatile_only`, one without an expiry). Returns
    /// whether an entry was freed. Segment eviction frees log space; this
    /// frees the index entries a store of small objects runs out of first.
    fn evict_neighbour(&self, hash: u64) -> bool {
        let inner = &*self.inner;
        let e = inner.eviction();
        if !e.evicts() {
            return false;
        }
        let mem = &inner.mem;
        let mut g = inner.index.lock(hash);
        let evictable = |l: Loc| {
            mem.header(off_of(l))
                .is_some_and(|h| !(h.pinned || (e.volatile_only && h.expiry_ms == 0)))
        };
        let slot = g
            .find_any(|l| evictable(l) && !mem.accessed(off_of(l)))
            .or_else(|| g.find_any(evictable));
        let Some(slot) = slot else {
            // Nothing evictable; but a racing eviction or delete may have
            // emptied a slot since the insert failed: then retry.
            let mut used = 0;
            g.find_any(|_| {
                used += 1;
                false
            });
            return used < 2 * crate::index::ENTRIES_PER_BUCKET;
        };
        let off = off_of(g.loc(slot));
        let h = mem.header(off).unwrap_or_default();
        g.remove(slot);
        // SAFETY: the bucket is locked and the object just unlinked; the
        // caller's epoch guard keeps its segment from reuse.
        unsafe { mem.mark_dead(off) };
        drop(g);
        mem.live().add(mem.seg_of(off), -(h.object_bytes() as i64));
        inner.stats.evicted.fetch_add(1, Ordering::Relaxed);
        inner
            .stats
            .evicted_bytes
            .fetch_add(h.object_bytes() as u64, Ordering::Relaxed);
        true
    }

    /// Remove `key`. Returns whether a live item was removed.
    pub fn delete(&self, key: &[u8]) -> Result<bool, Error> {
        match self.delete_if(key, Condition::Always) {
            Ok(()) => Ok(true),
            Err(Error::NotFound) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Delete `key` if `cond` holds for it, atomically (under the bucket
    /// lock): `IfVersion(v)` deletes only the version a client read (Redis
    /// GETDEL, RENAME). `Err(NotFound)` if absent (or expired; an expired
    /// item is removed either way), `Err(VersionMismatch)` if the version
    /// differs, `Err(Exists)` for `IfAbsent` on a live item.
    pub fn delete_if(&self, key: &[u8], cond: Condition) -> Result<(), Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let _guard = inner.epochs.try_pin()?;
        let hash = hash_key(key);
        let mut g = inner.index.lock(hash);
        let Some(slot) = g.find(|l| mem.key_equals(off_of(l), key)) else {
            return Err(Error::NotFound);
        };
        let h = mem.header(off_of(g.loc(slot))).unwrap_or_default();
        let live = !h.expired();
        if live {
            check_condition(cond, Some(&h))?;
        }
        let off = off_of(g.remove(slot));
        // SAFETY: the bucket is locked and the object just unlinked; we
        // hold an epoch guard.
        unsafe { mem.mark_dead(off) };
        drop(g);
        mem.live().add(mem.seg_of(off), -(h.object_bytes() as i64));
        inner.note_reclaimable();
        if live {
            Ok(())
        } else {
            Err(Error::NotFound)
        }
    }

    /// Set (or clear, with `None`) the expiry of `key`. Returns whether the
    /// key exists. It is metadata, not a new version of the value: the
    /// version stays. An object with an expiry slot (or a clear on one
    /// without: nothing to do) is updated in place under the bucket lock.
    /// Setting a TTL on an object without the slot relocates it, like an
    /// overwrite: a copy with the slot is appended and the index entry
    /// swapped, both under the bucket lock (readers that raced retry on
    /// the bucket version, so they see the old object or the new one,
    /// never a mix). On a full log the copy may take blocks of the
    /// compaction reserve, all such copies together at most half of it
    /// until compaction has given them back (Redis allows EXPIRE over
    /// maxmemory; `Inner::expiry_may_use_reserve`); past that it waits
    /// for compaction with the lock and the epoch guard dropped, as a put
    /// does, and `Err(OutOfMemory)` when the wait gives up: the object
    /// and its old expiry are kept.
    pub fn set_expiry(&self, key: &[u8], expiry_ms: Option<u64>) -> Result<bool, Error> {
        let inner = &*self.inner;
        let mem = &inner.mem;
        let want = expiry_ms.unwrap_or(0);
        let hash = hash_key(key);
        // Made at the first failed append only (it reads the clock).
        let mut wait = None;
        loop {
            let guard = inner.epochs.try_pin()?;
            let mut g = inner.index.lock(hash);
            let Some(slot) = g.find(|l| mem.key_equals(off_of(l), key)) else {
                return Ok(false);
            };
            let off = off_of(g.loc(slot));
            let Some(h) = mem.header(off) else {
                return Ok(false);
            };
            if h.expired() {
                return Ok(false);
            }
            if h.fits_expiry(want) {
                if h.expiry_slot {
                    let h = Header {
                        expiry_ms: want,
                        ..h
                    };
                    // SAFETY: the key's buckets are locked and we hold an
                    // epoch guard: we are the object's only writer;
                    // readers validate their copy.
                    unsafe { mem.write_header(off, &h) };
                    note_expiry(mem, off, want);
                }
                return Ok(true);
            }
            let new = Header {
                expiry_ms: want,
                expiry_slot: true,
                value_cap: h.value_len,
                ..h
            };
            let len = new.object_bytes();
            let body = h.key_len as usize + h.value_len as usize;
            let copied = std::cell::Cell::new(true);
            let fill = |to: u64| {
                // SAFETY: `Log::append` calls `fill` with `len` bytes it
                // just reserved and has not published (this thread is
                // their only writer); the source is published and its
                // bucket is locked (nobody writes it), and fresh space
                // never overlaps it.
                unsafe {
                    mem.write_header(to, &new);
                    if body > 0 {
                        let ok = match (
                            mem.advance(off, h.header_bytes()),
                            mem.advance(to, new.header_bytes()),
                        ) {
                            (Some(src), Some(dst)) => mem.copy(src, dst, body),
                            _ => false,
                        };
                        copied.set(ok);
                    }
                }
                // Under the head's lock, as for any append.
                note_expiry(mem, to, want);
            };
            let appended = inner.try_append(len, want, &fill).or_else(|e| {
                if inner.expiry_may_use_reserve(len) {
                    inner.try_append_in(len, want, true, &fill)
                } else {
                    Err(e)
                }
            });
            match appended {
                Ok(app) if copied.get() => {
                    g.replace(slot, loc_of(app.off));
                    mem.live().add(app.seg, len as i64);
                    // SAFETY: the bucket is locked and the old object
                    // just unlinked; we hold an epoch guard.
                    unsafe { mem.mark_dead(off) };
                    drop(g);
                    mem.live().add(mem.seg_of(off), -(h.object_bytes() as i64));
                    inner.note_reclaimable();
                    return Ok(true);
                }
                Ok(app) => {
                    // A published object always reads whole under its
                    // lock; if it did not, keep it and say so.
                    // SAFETY: the copy is ours and never published.
                    unsafe { mem.mark_dead(app.off) };
                    return Err(Error::OutOfMemory {
                        what: "log (unreadable object)",
                    });
                }
                Err(_) => {
                    drop(g);
                    drop(guard);
                    // As a put: refused at once on a store known full.
                    if wait.is_none() && inner.known_full() {
                        return Err(Error::OutOfMemory { what: "log" });
                    }
                    let w = wait.get_or_insert_with(|| SpaceWait::new(inner));
                    inner.wait_for_space(w)?;
                }
            }
        }
    }
}

/// Record that the object at `off` expires at `expiry_ms` (0 = never):
/// its segment's earliest expiry (a hint for compaction and the expiry
/// pass) and latest expiry (an upper bound: the expiry pass frees the
/// segment whole once it has passed). Each is a load first and a write
/// only when it moves, so a segment of objects without an expiry costs
/// one load per write once its latest expiry is `u64::MAX`.
pub(crate) fn note_expiry(mem: &Memory, off: u64, expiry_ms: u64) {
    let info = mem.seg(mem.seg_of(off));
    if expiry_ms != 0 && info.min_expiry_ms.load(Ordering::Relaxed) > expiry_ms {
        info.min_expiry_ms.fetch_min(expiry_ms, Ordering::AcqRel);
    }
    let latest = if expiry_ms == 0 { u64::MAX } else { expiry_ms };
    if info.max_expiry_ms.load(Ordering::Relaxed) < latest {
        info.max_expiry_ms.fetch_max(latest, Ordering::AcqRel);
    }
}
