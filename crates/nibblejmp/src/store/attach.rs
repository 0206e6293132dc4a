//! Create, attach and detach: mapping the three SpaceJMP segments (meta,
//! index, log) at the same address in every process (dissertation §10.4,
//! §12.1.3; SpaceJMP §5.3).
//!
//! `create` plans the geometry, makes the segment files in the store's
//! directory and writes the meta segment; `attach` maps them at the window
//! recorded in the SpaceJMP registry, checks magic, layout version and
//! geometry, claims this process's epoch slots and, when it is the only
//! process, runs recovery (`crate::recovery`). Both hold the directory's
//! `flock` ([`AttachLock`]), which serializes attach, recovery and
//! detach and which the kernel releases if the holder dies. The last
//! process to detach syncs the segments and sets the clean flag, so the
//! next attach can skip verification.

use super::*;

/// The default directory of a store named `name`:
/// `/dev/shm/nibblejmp-<uid>/<name>` (tmpfs: survives processes, not
/// reboots; pass a disk directory for that).
pub fn default_dir(name: &str) -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    PathBuf::from(format!("/dev/shm/nibblejmp-{uid}")).join(name)
}

/// A held `flock` on the store's attach lock file.
pub(crate) struct AttachLock(std::fs::File);

impl AttachLock {
    pub(crate) fn take(dir: &Path) -> Result<AttachLock> {
        let p = dir.join(ATTACH_LOCK_FILE);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&p)
            .map_err(|e| Error::Io {
                what: "open".into(),
                path: p.clone(),
                source: e,
            })?;
        // SAFETY: a valid descriptor owned by `f`.
        if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(Error::Io {
                what: "flock".into(),
                path: p,
                source: std::io::Error::last_os_error(),
            });
        }
        Ok(AttachLock(f))
    }
}

impl Drop for AttachLock {
    fn drop(&mut self) {
        // SAFETY: a valid descriptor owned by `self.0`.
        unsafe { libc::flock(self.0.as_raw_fd(), libc::LOCK_UN) };
    }
}

pub(super) fn io_err(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::Io {
        what: what.into(),
        path: path.to_path_buf(),
        source: e,
    }
}

impl SharedStore {
    /// Create a store of `capacity_bytes` in directory `dir` (a SpaceJMP
    /// store directory of its own: registry + three segment files).
    pub fn create(
        dir: impl AsRef<Path>,
        capacity_bytes: u64,
        opts: &Options,
    ) -> Result<SharedStore> {
        let dir = dir.as_ref().to_path_buf();
        let geo = Geometry::plan(capacity_bytes, opts)?;
        if dir.join("registry").exists() {
            return Err(Error::Exists(dir));
        }
        std::fs::create_dir_all(&dir).map_err(|e| io_err("create", &dir, e))?;
        let lock = AttachLock::take(&dir)?;
        if dir.join("registry").exists() {
            return Err(Error::Exists(dir));
        }
        let res = Self::create_locked(&dir, geo, opts);
        if res.is_err() {
            // Leave nothing half-made behind.
            for name in [SEG_META, SEG_INDEX, SEG_LOG] {
                let _ = std::fs::remove_file(spacejmp::segment::seg_path(&dir, name));
            }
            let _ = std::fs::remove_file(dir.join("registry"));
        }
        let inner = res?;
        drop(lock);
        Ok(Self::start(inner, RecoveryReport::default()))
    }

    fn create_locked(dir: &Path, geo: Geometry, opts: &Options) -> Result<Inner> {
        let meta_len = meta_bytes(geo.log_segments);
        let index_len = geo.index_buckets * BUCKET_BYTES;
        let log_len = geo.log_segments * geo.seg_bytes;
        let win_len =
            (meta_len + index_len + log_len + (64 << 20)).next_multiple_of(WINDOW_GRANULE_BYTES);
        let gran = win_len.next_power_of_two();
        let slots = (WINDOW_AREA_END - WINDOW_AREA_BASE) / gran;
        if slots == 0 {
            return Err(Error::InvalidArgument(format!(
                "capacity {} too large for the address window",
                geo.capacity_bytes
            )));
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        dir.hash(&mut hasher);
        std::process::id().hash(&mut hasher);
        let first = hasher.finish() % slots;
        let mut jmp = None;
        for i in 0..64 {
            let base = WINDOW_AREA_BASE + ((first + i) % slots) * gran;
            // Jmp::open reserves the window with MAP_FIXED_NOREPLACE and
            // reports a collision as WindowTaken: try the next slot.
            let _ = std::fs::remove_file(dir.join("registry"));
            match Jmp::open(Config::with_store(dir).window(base, win_len)) {
                Ok(j) => {
                    jmp = Some(j);
                    break;
                }
                Err(spacejmp::Error::WindowTaken { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        let jmp = Box::new(
            jmp.ok_or_else(|| Error::Busy("no free address window for the store".into()))?,
        );
        let so = SegOptions {
            lockable: false,
            mode: 0o660,
            ..SegOptions::default()
        };
        jmp.seg_alloc(SEG_META, meta_len, &so)?;
        jmp.seg_alloc(SEG_INDEX, index_len, &so)?;
        jmp.seg_alloc(SEG_LOG, log_len, &so)?;
        jmp.vas_create(VAS_NAME, 0o660)?;
        for s in [SEG_META, SEG_INDEX, SEG_LOG] {
            jmp.seg_attach(VAS_NAME, s, Access::Write)?;
        }
        let inner = Self::map(dir, jmp, opts, Some(geo))?;
        let h = inner.hdr();
        h.layout_version.store(LAYOUT_VERSION, Ordering::Relaxed);
        h.capacity_bytes
            .store(geo.capacity_bytes, Ordering::Relaxed);
        h.seg_bytes.store(geo.seg_bytes, Ordering::Relaxed);
        h.log_segments.store(geo.log_segments, Ordering::Relaxed);
        h.index_buckets.store(geo.index_buckets, Ordering::Relaxed);
        h.heads.store(geo.heads, Ordering::Relaxed);
        h.reserve_segments
            .store(geo.reserve_segments, Ordering::Relaxed);
        h.created_unix_ms
            .store(nibble::object::now_ms(), Ordering::Relaxed);
        h.attaches.store(1, Ordering::Relaxed);
        h.geometry_crc
            .store(inner.geometry_crc(), Ordering::Relaxed);
        // Magic last: a creator killed before this leaves "not a store".
        h.magic.store(MAGIC, Ordering::Release);
        let mut inner = inner;
        inner.claim_local_slots()?;
        Ok(inner)
    }

    /// Map the VAS and build the process-side handle; validates the meta
    /// header unless `creating`.
    fn map(dir: &Path, jmp: Box<Jmp>, opts: &Options, creating: Option<Geometry>) -> Result<Inner> {
        let not_store = |what: String| Error::NotAStore {
            path: dir.to_path_buf(),
            what,
        };
        let vh = match jmp.vas_attach(VAS_NAME, AttachOptions::default()) {
            Ok(v) => v,
            Err(spacejmp::Error::NotFound { .. }) => {
                return Err(not_store("no `nibblejmp` VAS in the registry".into()))
            }
            Err(e) => return Err(e.into()),
        };
        // SAFETY: `vh` borrows the Jmp in the Box, whose address is stable;
        // Inner keeps both and drops `vh` first (see `Drop for Inner`).
        let vh: VasHandle<'static> =
            unsafe { std::mem::transmute::<VasHandle<'_>, VasHandle<'static>>(vh) };
        let mut addr = [(0u64, 0u64); 3];
        for (info, _) in vh.segments() {
            let i = match info.name.as_str() {
                SEG_META => 0,
                SEG_INDEX => 1,
                SEG_LOG => 2,
                _ => continue,
            };
            addr[i] = (info.data_start(), info.size - info.header_size);
        }
        if addr.iter().any(|a| a.0 == 0) {
            return Err(not_store(
                "the VAS lacks the meta, index or log segment".into(),
            ));
        }
        if addr[0].1 < core::mem::size_of::<Meta>() as u64 {
            return Err(not_store("meta segment too small".into()));
        }
        let meta = addr[0].0 as *const Meta;
        // SAFETY: the meta segment is mapped read-write and is at least
        // `size_of::<Meta>()` bytes (checked just above).
        let hdr = unsafe { &(*meta).hdr };
        let geo = match creating {
            Some(g) => g,
            None => {
                let magic = hdr.magic.load(Ordering::Acquire);
                if magic != MAGIC {
                    return Err(not_store(if magic == 0 {
                        "creation did not finish (no magic)".into()
                    } else {
                        format!("bad magic {magic:#x}")
                    }));
                }
                let v = hdr.layout_version.load(Ordering::Relaxed);
                if v != LAYOUT_VERSION {
                    return Err(Error::WrongVersion {
                        path: dir.to_path_buf(),
                        found: v,
                        expected: LAYOUT_VERSION,
                    });
                }
                let g = Geometry {
                    capacity_bytes: hdr.capacity_bytes.load(Ordering::Relaxed),
                    seg_bytes: hdr.seg_bytes.load(Ordering::Relaxed),
                    log_segments: hdr.log_segments.load(Ordering::Relaxed),
                    index_buckets: hdr.index_buckets.load(Ordering::Relaxed),
                    heads: hdr.heads.load(Ordering::Relaxed),
                    reserve_segments: hdr.reserve_segments.load(Ordering::Relaxed),
                };
                let sane = g.seg_bytes >= BLOCK_BYTES
                    && g.seg_bytes.is_multiple_of(BLOCK_BYTES)
                    && g.log_segments > 0
                    && g.index_buckets.is_power_of_two()
                    && g.index_buckets >= 2
                    && (1..=MAX_HEADS as u64).contains(&g.heads)
                    && addr[0].1 >= meta_bytes(g.log_segments)
                    && addr[1].1 >= g.index_buckets * BUCKET_BYTES
                    && addr[2].1 / g.seg_bytes >= g.log_segments;
                if !sane {
                    return Err(not_store(format!(
                        "geometry {g:?} does not match the segments"
                    )));
                }
                g
            }
        };
        Ok(Inner {
            vh: ManuallyDrop::new(vh),
            jmp: ManuallyDrop::new(jmp),
            dir: dir.to_path_buf(),
            meta,
            segtab: (addr[0].0 + core::mem::size_of::<Meta>() as u64) as *const SegEntry,
            index: addr[1].0 as *const Bucket,
            log: addr[2].0 as *mut u8,
            geo,
            me: proc_id::self_id(),
            local: Vec::new(),
            opts: opts.clone(),
            compactor: Mutex::new(CompactorState::default()),
            closed: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            dur: durability::Durability::new(),
            ck: checkpoint::Ckpt::new(),
        })
    }

    /// Attach an existing store. Reclaims slots of dead processes; after
    /// an unclean shutdown of the last process (or with `opts.rebuild`),
    /// runs recovery (see [`crate::recovery`]).
    pub fn attach(dir: impl AsRef<Path>, opts: &Options) -> Result<SharedStore> {
        let dir = dir.as_ref().to_path_buf();
        if !dir.join("registry").exists() {
            return Err(Error::NotFound(dir));
        }
        let lock = AttachLock::take(&dir)?;
        let jmp = Box::new(Jmp::open(Config::with_store(&dir))?);
        let mut inner = Self::map(&dir, jmp, opts, None)?;
        inner.init_checkpoint_state();
        if inner.hdr().geometry_crc.load(Ordering::Acquire) != inner.geometry_crc() {
            return Err(Error::NotAStore {
                path: dir.clone(),
                what: "the geometry in the meta header fails its checksum (damaged header)".into(),
            });
        }
        let unclean = inner.hdr().clean.load(Ordering::Acquire) == 0;
        // After a clean shutdown nobody is attached (every attach clears
        // the flag under the attach lock, which we hold): check the seal
        // before anything here changes the meta segment.
        let seal = if unclean {
            SealCheck {
                meta_ok: true,
                index_ok: true,
            }
        } else {
            // SAFETY: we hold the attach lock and the clean flag says no
            // process is attached, so nobody writes the meta or index
            // segment while they are read.
            unsafe { inner.check_seal() }
        };
        // After a power cut the meta segment on disk may be older than the
        // log (flushes write the log only; see `durability`): an unclean
        // store that may have lost power re-derives its segment table
        // from the log, as one with a bad meta seal does.
        let rederive = unclean && durability::may_lose_power(&dir) && !inner.others_alive();
        let seal = SealCheck {
            meta_ok: seal.meta_ok && !rederive,
            ..seal
        };
        if !seal.meta_ok {
            // Lease, slots, heads and the segment table are not to be
            // trusted; no process is attached, so the slots can be freed
            // outright and recovery re-derives the rest from the log.
            inner.clear_slots();
        }
        inner.hdr().attaches.fetch_add(1, Ordering::Relaxed);
        inner.reclaim_dead_slots();
        let others = inner.others_alive();
        if opts.rebuild && others {
            return Err(Error::Busy(
                "rebuild needs exclusive use; other processes are attached".into(),
            ));
        }
        let rebuild = opts.rebuild || !seal.index_ok || !seal.meta_ok;
        let report = if !others && (unclean || rebuild) {
            let mut r = inner.recover(unclean, rebuild, seal, rederive)?;
            if rederive {
                r.meta_seal_bad = false;
                r.meta_rederived = true;
            }
            r
        } else {
            RecoveryReport::default()
        };
        inner.hdr().clean.store(0, Ordering::Release);
        inner.claim_local_slots()?;
        drop(lock);
        Ok(Self::start(inner, report))
    }

    pub(super) fn detach(&mut self) -> Result<()> {
        let i = &self.inner;
        if i.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        i.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        i.stop_checkpoints();
        // Without the lock file (the directory was removed under us) the
        // slots are still given back; only the clean mark needs the lock.
        let lock = AttachLock::take(&i.dir);
        i.release_lease();
        // Wait for this process's operations to finish, then free slots.
        for l in &i.local {
            while l
                .busy
                .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                std::thread::yield_now();
            }
            let s = i.slot(l.slot);
            s.tsc.store(0, Ordering::Relaxed);
            s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
            s.owner.store(0, Ordering::Release);
        }
        // Deferred kills (see `durability`) now that every operation of
        // this process has ended: the log then holds exactly the indexed
        // objects as live, as a clean store must.
        i.drain_kills();
        let lock = lock?;
        if !i.others_alive() {
            // On a disk directory the files must reach the disk before the
            // store is called clean (a no-op cost on tmpfs). The seal
            // (checksums of the index and the meta segment) is written
            // with the flag; the next attach trusts neither without it.
            // SAFETY: we hold the attach lock, no other process is
            // attached, and every operation of this process has ended
            // (all local slots taken above, the compaction thread joined).
            unsafe { i.write_seal() };
            i.sync()?;
            // Versions must keep growing after a reboot (see
            // `checkpoint`).
            i.write_version_floor()?;
            i.hdr().clean.store(1, Ordering::Release);
            i.sync()?;
        }
        drop(lock);
        Ok(())
    }

    /// Remove the store's files. Refused with `Busy` while a live process
    /// is attached.
    pub fn remove(dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref().to_path_buf();
        let s = SharedStore::attach(
            &dir,
            &Options {
                compaction_thread: false,
                ..Options::default()
            },
        )?;
        if s.inner.others_alive() {
            return Err(Error::Busy("other processes are attached".into()));
        }
        drop(s);
        std::fs::remove_dir_all(&dir).map_err(|e| io_err("remove", &dir, e))
    }
}

impl Inner {
    /// `msync` the three segments' data.
    fn sync(&self) -> Result<()> {
        let ranges = [
            (self.meta as u64, meta_bytes(self.geo.log_segments)),
            (self.index as u64, self.geo.index_buckets * BUCKET_BYTES),
            (self.log as u64, self.log_bytes()),
        ];
        for (addr, len) in ranges {
            // SAFETY: each range is the page-aligned start of a segment's
            // data, mapped shared by `vh`, of at most the segment's length.
            if unsafe { libc::msync(addr as *mut libc::c_void, len as usize, libc::MS_SYNC) } != 0 {
                return Err(io_err("msync", &self.dir, std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }

    /// Free every epoch slot (attach with an untrusted meta segment, when
    /// no process is attached).
    fn clear_slots(&self) {
        for i in 0..EPOCH_SLOTS {
            let s = self.slot(i);
            s.tsc.store(0, Ordering::Relaxed);
            s.intent_kind.store(INTENT_NONE, Ordering::Relaxed);
            s.owner.store(0, Ordering::Release);
        }
    }

    /// Claim this process's epoch slots.
    fn claim_local_slots(&mut self) -> Result<()> {
        let want = match self.opts.epoch_slots {
            Some(n) if (1..=MAX_PROCESS_SLOTS).contains(&n) => n,
            Some(n) => {
                return Err(Error::InvalidArgument(format!(
                    "epoch_slots {n} must be in 1..={MAX_PROCESS_SLOTS}"
                )))
            }
            None => std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(2)
                .clamp(2, MAX_LOCAL_SLOTS),
        };
        let mut local = Vec::new();
        for i in 0..EPOCH_SLOTS {
            if local.len() == want {
                break;
            }
            let s = self.slot(i);
            if s.owner.load(Ordering::Relaxed) == 0
                && s.owner
                    .compare_exchange(0, self.me, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                s.tsc.store(0, Ordering::Relaxed);
                s.intent_kind.store(INTENT_NONE, Ordering::Release);
                local.push(LocalSlot {
                    slot: i,
                    busy: AtomicBool::new(false),
                });
            }
        }
        if local.is_empty() {
            return Err(Error::Busy(format!(
                "all {EPOCH_SLOTS} epoch slots are held by live processes"
            )));
        }
        self.local = local;
        Ok(())
    }
}
