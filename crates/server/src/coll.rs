//! Collections in the log: Redis hashes and sets as engine items, small
//! ones in one item, large ones as a linear-hashing table whose buckets
//! are items of their own.
//!
//! # Why
//!
//! A hash used to be one engine item rewritten whole on every HSET: O(n)
//! per update, 291 HSETs/s at 5 k fields, and a log that filled with
//! copies. Here an update of one element of a large collection reads and
//! writes a constant number of items, whatever the collection's size,
//! and every byte still lives in engine items: the engine's capacity,
//! maxmemory, OOM, compaction and a `--data-dir` restart cover
//! collections exactly as they cover strings.
//!
//! # Layout
//!
//! ```text
//!  user key K ── flags HASH_FLAGS / SET_FLAGS (types.rs) ──────────────────────────
//!   small:  HASH_MAGIC | n | (len field len value)*        hash, insertion order ("listpack")
//!           SET_MAGIC  | n | (len member)*                 set, insertion order  ("listpack")
//!           INTSET_MAGIC | n | (len member)*               set of integers, ascending ("intset")
//!   large:  ROOT_MAGIC | kind | id u64 | count u64 | nbuckets u32 | first u32 ("hashtable")
//!   (a list is always a root, its two ends inline after these fields, and
//!   chunks: `crate::list`; same root fields, same keys)
//!
//!  internal keys (engine.rs keeps them out of every user key's reach):
//!   0xFF 0x00 'i' id            ─▶ kind | K             the instance record: who owns id
//!   0xFF 0x00 'n' id bucket(u32) ─▶ n | (len elem len value)*   one bucket, ~BUCKET_SPLIT_ELEMS elements
//! ```
//!
//! A small collection is read, changed and written back whole, as Redis
//! rewrites a listpack. While a command works on it, it stays the bytes
//! of its item (a [`PairBuf`], `crate::packed`): a lookup walks the
//! length fields, an insert or removal is one memmove, and the write
//! sends the bytes back as they are (type byte first), so an HSET into
//! a hash of 500 fields allocates nothing per field (decoding it into one `Vec`
//! per field and value, and freeing them, used to cost ~160 k
//! instructions per HSET, the most of a 5,000-HSET run into a new hash).
//! It turns large the first time a write leaves it
//! over the `hash-max-listpack-*` / `set-max-intset-entries` /
//! `set-max-listpack-*` thresholds, and, as in Redis, never turns back.
//!
//! Under Nibble-2 a small collection is stored with spare room after its
//! pairs (`crate::packed`, [`Room::Small`](crate::packed::Room)), and
//! the [`PairBuf`] keeps the type byte as its head, so the item's bytes
//! are never shifted. A command that sets or removes one element (HSET
//! of one field, HDEL of one, SADD and SREM of one member:
//! [`modify_one`]) is then one engine read-modify-write of the key: the
//! item is read, validated, changed and written back under the engine's
//! lock on the key, in place while the pairs fit the room (no append, no
//! garbage for compaction, no index swap, one index lookup): the item
//! is copied twice per HSET, out and back, where the general path
//! appends a new copy to the log and leaves the old one to compaction;
//! the appends left (the room used up) amortize to about eight times a
//! pair's bytes per insert. A change that turns
//! the collection large, turns an intset into a listpack, or empties it
//! runs the general way ([`modify`]), as does everything under Nibble
//! (append-only) and the shared store.
//!
//! A large collection is a linear-hashing table (Litwin, 1980) over
//! `nbuckets` buckets. Element e lives in bucket `h mod 2p`, or `h mod p`
//! when that is `>= nbuckets`, where `h = xxh3(e)` and p is the largest
//! power of two `<= nbuckets`. When `count > nbuckets *
//! BUCKET_SPLIT_ELEMS`, bucket `nbuckets - p` is split into itself and a
//! new bucket `nbuckets`: one bucket read, two written. So an insert
//! or delete costs: read the root, read one bucket, write it, write the
//! root (count) — four engine operations, plus an amortized split —
//! independent of the size. Under Nibble-2 the bucket's read and write
//! are one engine read-modify-write of its item
//! (`Coll::change_bucket`), so three. A write that leaves the root as it was (a
//! field overwritten, HSET of the value a field has, SADD of a present
//! member: the latter two write nothing at all) skips the root write.
//! Both writes are usually Nibble-2 in-place overwrites, not appends: the
//! root has a fixed size, and a bucket is stored with spare room
//! (`crate::packed`), so an insert keeps its item's size until the room
//! is used up. Buckets hold 16 elements on average (the split load): a
//! lookup scans and copies half as much as at 32, for about 40 % more
//! bucket items (still a third of redis-server's memory per element). Buckets only ever split into higher indices,
//! so HSCAN/SSCAN's cursor is the bucket index and keeps Redis's
//! guarantee (an element present for the whole iteration is returned at
//! least once).
//!
//! # Atomicity
//!
//! A command runs under its key's stripe lock (keylock.rs), exclusive for
//! writes, so readers never see a half-applied multi-item update and
//! writers never interleave. Within a command [`Coll`] caches the buckets
//! it touches and [`Coll::commit`] writes them, then the root, the root
//! last and with `IfVersion`: the only writers that bypass the stripe are
//! memcached `set`/`delete` and expiry, and they can only make the whole
//! collection dead, never change its elements.
//!
//! # Reclaiming
//!
//! Each large collection has a unique id, so its nodes can be found from
//! its root. DEL/UNLINK, an emptying HDEL/SREM/SPOP, and the STORE forms
//! over an existing large destination delete the nodes at once (O(n / 16)
//! items, as Redis's DEL of a big collection is O(n)). A large collection
//! can also die without a command seeing it: its root expires, or SET or
//! memcached `set`/`delete` replaces it. The sweeper thread ([`sweeper`])
//! walks the engine's keys every [`SWEEP_INTERVAL_MS`] to
//! [`SWEEP_MAX_INTERVAL_MS`] while internal items exist; for each id it finds it reads the instance record, takes
//! the owner key's stripe, and deletes the nodes of an id whose owner no
//! longer points at it. Ids are never reused, so a dead id stays dead; the
//! instance record is written before any node and the root after all of
//! them, so a collection being built (under its stripe) is never mistaken
//! for a dead one. Nothing leaks longer than the longest pause plus one
//! pass.
//!
//! # Known limits
//!
//! A crash (SIGKILL of a `--data-dir` server) between a bucket write and
//! the root write can leave the root's count off by that command's
//! changes. Random picks (SPOP, SRANDMEMBER, HRANDFIELD) on a large
//! collection pick a random bucket, then a random element: fair only as
//! far as bucket sizes are even, like Redis's own dict sampling.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use nibble::{Condition, Expiry, ItemMeta, PutOptions};

use crate::commands::{CmdError, WRONGTYPE};
use crate::engine::{is_internal_key, Engine, INTERNAL_KEY_TAG, KEY_ESCAPE_BYTE};
use crate::packed::{give_buf, take_buf, take_stale_buf, PairBuf, Room, Upserted};
use crate::state::Shared;
use crate::types::{HASH_FLAGS, HASH_MAGIC, LIST_FLAGS, SET_FLAGS, ZSET_FLAGS};

/// Average elements per bucket above which a large collection splits one
/// bucket.
pub const BUCKET_SPLIT_ELEMS: u64 = 16;
/// Capacity of a fresh bucket read buffer: a bucket of ~16 short
/// elements and its spare room fit, so neither the read nor an insert
/// reallocates.
const BUCKET_READ_BYTES: usize = 2048;
/// Capacity of a root read buffer (a root is 26 bytes, a zset's 38; a
/// small collection grows the buffer as it needs).
pub(crate) const ROOT_READ_BYTES: usize = 64;
/// First byte of a small set (insertion order).
pub const SET_MAGIC: u8 = 0xB6;
/// First byte of a small set of integers (ascending).
pub const INTSET_MAGIC: u8 = 0xB7;
/// First byte of a large collection's root.
pub const ROOT_MAGIC: u8 = 0xB8;
/// Third byte of a node key.
const NODE_TAG: u8 = b'n';
/// Third byte of an instance record's key.
const INSTANCE_TAG: u8 = b'i';
/// Pause between two sweeper passes after one that reclaimed something.
pub const SWEEP_INTERVAL_MS: u64 = 2_000;
/// Longest pause: passes that reclaim nothing double the pause up to this.
pub const SWEEP_MAX_INTERVAL_MS: u64 = 30_000;
/// Set when a large collection is created: the sweeper, idle while the
/// store holds no internal key, has work again.
static LARGE_CREATED: AtomicBool = AtomicBool::new(false);
/// The sweeper's nap between checks of the shutdown flag.
const SWEEP_NAP_MS: u64 = 50;
/// Keys the sweeper asks the engine for per cursor step.
const SWEEP_SCAN_KEYS: usize = 1024;

/// A pair: element and value (empty for a set).
pub type Pair = (Vec<u8>, Vec<u8>);

/// What a collection holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Field-value pairs.
    Hash,
    /// Members (values empty).
    Set,
    /// A list (`crate::list`): chunks of elements in order.
    List,
    /// A sorted set (`crate::zset`): a member table and a counted B+tree.
    Zset,
}

impl Kind {
    /// The item flags of this type.
    pub fn flags(self) -> u32 {
        match self {
            Kind::Hash => HASH_FLAGS,
            Kind::Set => SET_FLAGS,
            Kind::List => LIST_FLAGS,
            Kind::Zset => ZSET_FLAGS,
        }
    }

    pub(crate) fn tag(self) -> u8 {
        match self {
            Kind::Hash => b'h',
            Kind::Set => b's',
            Kind::List => b'l',
            Kind::Zset => b'z',
        }
    }

    fn of_tag(t: u8) -> Option<Kind> {
        match t {
            b'h' => Some(Kind::Hash),
            b's' => Some(Kind::Set),
            b'l' => Some(Kind::List),
            b'z' => Some(Kind::Zset),
            _ => None,
        }
    }

    /// The kind of items with flags `flags`, if a collection.
    pub fn of_flags(flags: u32) -> Option<Kind> {
        match flags {
            HASH_FLAGS => Some(Kind::Hash),
            SET_FLAGS => Some(Kind::Set),
            LIST_FLAGS => Some(Kind::List),
            ZSET_FLAGS => Some(Kind::Zset),
            _ => None,
        }
    }
}

/// The thresholds below which a collection stays one item.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Most elements of a listpack.
    pub entries: usize,
    /// Longest element (or value) of a listpack.
    pub value: usize,
    /// Most members of an intset (sets only).
    pub intset: usize,
}

impl Limits {
    /// The current tunables for `kind`.
    pub fn of(shared: &Shared, kind: Kind) -> Limits {
        let t = &shared.settings.tunables;
        match kind {
            Kind::Hash => Limits {
                entries: t.get_usize("hash-max-listpack-entries"),
                value: t.get_usize("hash-max-listpack-value"),
                intset: 0,
            },
            Kind::Set => Limits {
                entries: t.get_usize("set-max-listpack-entries"),
                value: t.get_usize("set-max-listpack-value"),
                intset: t.get_usize("set-max-intset-entries"),
            },
            Kind::List | Kind::Zset => Limits {
                entries: 0,
                value: 0,
                intset: 0,
            },
        }
    }
}

/// What a change of a bucket returns: whether it changed the bucket.
trait Changed {
    fn changed(&self) -> bool;
}

impl Changed for Upserted {
    fn changed(&self) -> bool {
        *self != Upserted::Unchanged
    }
}

impl Changed for bool {
    fn changed(&self) -> bool {
        *self
    }
}

/// A large collection's root: its nodes are numbered `first ..
/// first + nbuckets` (hash and set: buckets from 0; list: chunks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Root {
    pub(crate) id: u64,
    pub(crate) count: u64,
    pub(crate) nbuckets: u32,
    pub(crate) first: u32,
}

pub(crate) const ROOT_BYTES: usize = 2 + 8 + 8 + 4 + 4;

pub(crate) fn encode_root(kind: Kind, r: &Root) -> Vec<u8> {
    let mut v = Vec::with_capacity(ROOT_BYTES);
    encode_root_into(kind, r, &mut v);
    v
}

/// [`encode_root`] appended to `v`.
pub(crate) fn encode_root_into(kind: Kind, r: &Root, v: &mut Vec<u8>) {
    v.push(ROOT_MAGIC);
    v.push(kind.tag());
    v.extend_from_slice(&r.id.to_le_bytes());
    v.extend_from_slice(&r.count.to_le_bytes());
    v.extend_from_slice(&r.nbuckets.to_le_bytes());
    v.extend_from_slice(&r.first.to_le_bytes());
}

pub(crate) fn decode_root(b: &[u8]) -> Option<(Kind, Root)> {
    if b.len() < ROOT_BYTES || b[0] != ROOT_MAGIC {
        return None;
    }
    let kind = Kind::of_tag(b[1])?;
    // A zset's root carries its tree's fields after coll's; a list's, its
    // two ends (`crate::list`), and it may have no chunk at all.
    let fits = match kind {
        Kind::Zset => b.len() == ROOT_BYTES + 12,
        Kind::List => true,
        Kind::Hash | Kind::Set => b.len() == ROOT_BYTES,
    };
    if !fits {
        return None;
    }
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap_or([0; 8]));
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap_or([0; 4]));
    let nbuckets = u32_at(18);
    (nbuckets > 0 || kind == Kind::List).then_some((
        kind,
        Root {
            id: u64_at(2),
            count: u64_at(10),
            nbuckets,
            first: u32_at(22),
        },
    ))
}

/// A fresh instance id: the start time in ns plus a counter, so ids are
/// unique across restarts of a `--data-dir` store and never reused.
pub(crate) fn new_id() -> u64 {
    static BASE: OnceLock<u64> = OnceLock::new();
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let base = *BASE.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    base.wrapping_add(SEQ.fetch_add(1, Ordering::Relaxed))
}

pub(crate) fn node_key(id: u64, bucket: u32) -> [u8; 15] {
    let mut k = [0u8; 15];
    k[0] = KEY_ESCAPE_BYTE;
    k[1] = INTERNAL_KEY_TAG;
    k[2] = NODE_TAG;
    k[3..11].copy_from_slice(&id.to_be_bytes());
    k[11..15].copy_from_slice(&bucket.to_be_bytes());
    k
}

pub(crate) fn instance_key(id: u64) -> [u8; 11] {
    let mut k = [0u8; 11];
    k[0] = KEY_ESCAPE_BYTE;
    k[1] = INTERNAL_KEY_TAG;
    k[2] = INSTANCE_TAG;
    k[3..11].copy_from_slice(&id.to_be_bytes());
    k
}

/// The id an internal key belongs to.
fn id_of_internal(raw: &[u8]) -> Option<u64> {
    if !is_internal_key(raw) || raw.len() < 11 {
        return None;
    }
    Some(u64::from_be_bytes(raw[3..11].try_into().ok()?))
}

/// Encode pairs: `n | (len a len b)*`, or without values for a set.
pub(crate) fn encode_pairs(out: &mut Vec<u8>, items: &[Pair], values: bool) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for (a, b) in items {
        out.extend_from_slice(&(a.len() as u32).to_le_bytes());
        out.extend_from_slice(a);
        if values {
            out.extend_from_slice(&(b.len() as u32).to_le_bytes());
            out.extend_from_slice(b);
        }
    }
}

/// The pairs of `items` as owned pairs.
fn pairs_of(items: &PairBuf) -> Vec<Pair> {
    items
        .iter()
        .map(|(a, v)| (a.to_vec(), v.to_vec()))
        .collect()
}

/// The bucket of hash `h` in a table of `n` buckets (linear hashing).
pub(crate) fn bucket_of(h: u64, n: u32) -> u32 {
    let p = 1u64 << (63 - u64::from(n).leading_zeros());
    let b = h % (2 * p);
    if b >= u64::from(n) {
        (h % p) as u32
    } else {
        b as u32
    }
}

fn elem_hash(e: &[u8]) -> u64 {
    nibble::hash_key(e)
}

/// Wake the sweeper: a large collection was just created.
pub(crate) fn note_large_created() {
    LARGE_CREATED.store(true, Ordering::Relaxed);
}

/// A tiny xorshift generator for the random picks (no crate needed).
pub fn random_u64() -> u64 {
    use std::cell::Cell;
    thread_local! {
        static S: Cell<u64> = Cell::new(new_id() | 1);
    }
    S.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        x
    })
}

fn is_int(m: &[u8]) -> Option<i64> {
    crate::commands::parse_i64(m)
}

/// Where integer `n` goes in the ascending small intset `items`: before
/// its first member not below `n`; `None` if `n` is a member already.
fn intset_slot(items: &PairBuf, n: i64) -> Option<usize> {
    let mut at = 0;
    for (a, _) in items.iter() {
        match is_int(a) {
            Some(x) if x < n => at += 1,
            Some(x) if x == n => return None,
            _ => break,
        }
    }
    Some(at)
}

/// How the collection is held during one command.
enum Repr {
    Small {
        /// The pairs as stored after the type byte, patched in place
        /// (`crate::packed`): a write into a listpack-sized collection
        /// neither decodes nor re-encodes its other elements.
        items: PairBuf,
        intset: bool,
    },
    Big {
        root: Root,
        /// Buckets read or written by this command (their items' bytes,
        /// patched in place), and whether changed.
        cache: HashMap<u32, (PairBuf, bool)>,
        /// The instance record is still to be written (converted now).
        fresh: bool,
    },
}

/// One collection, opened by one command (under its key's stripe).
pub struct Coll<'e> {
    store: &'e Engine,
    key: &'e [u8],
    kind: Kind,
    limits: Limits,
    /// The root item's version; `None` if the key was absent.
    version: Option<u64>,
    /// A large collection's root as stored: a commit that leaves it so
    /// (a value overwritten, a member already present) writes no root.
    stored_root: Option<Root>,
    repr: Repr,
    dirty: bool,
}

/// Load the collection of `kind` at `key`: `Ok(None)` if absent,
/// WRONGTYPE if the key holds another type.
pub fn open<'e>(
    store: &'e Engine,
    key: &'e [u8],
    kind: Kind,
    limits: Limits,
) -> Result<Option<Coll<'e>>, CmdError> {
    let mut buf = take_buf(ROOT_READ_BYTES);
    let m = store.get_into(key, &mut buf)?;
    open_read(store, key, kind, limits, m, buf)
}

/// [`open`] over an item already read: `m` and its bytes `buf` (`None`:
/// absent; `buf` goes back to the pool).
fn open_read<'e>(
    store: &'e Engine,
    key: &'e [u8],
    kind: Kind,
    limits: Limits,
    m: Option<ItemMeta>,
    mut buf: Vec<u8>,
) -> Result<Option<Coll<'e>>, CmdError> {
    let Some(m) = m else {
        give_buf(buf);
        return Ok(None);
    };
    if m.flags != kind.flags() {
        give_buf(buf);
        return Err(WRONGTYPE.into());
    }
    let corrupt = || CmdError::from("ERR corrupt collection value");
    let repr = match buf.first() {
        Some(&HASH_MAGIC) if kind == Kind::Hash => Repr::Small {
            items: small_items(std::mem::take(&mut buf), true).ok_or_else(corrupt)?,
            intset: false,
        },
        Some(&m @ (SET_MAGIC | INTSET_MAGIC)) if kind == Kind::Set => Repr::Small {
            items: small_items(std::mem::take(&mut buf), false).ok_or_else(corrupt)?,
            intset: m == INTSET_MAGIC,
        },
        Some(&ROOT_MAGIC) => {
            let (k, root) = decode_root(&buf).ok_or_else(corrupt)?;
            if k != kind {
                return Err(corrupt());
            }
            Repr::Big {
                root,
                cache: HashMap::new(),
                fresh: false,
            }
        }
        _ => return Err(corrupt()),
    };
    give_buf(buf);
    let stored_root = match &repr {
        Repr::Big { root, .. } => Some(*root),
        Repr::Small { .. } => None,
    };
    Ok(Some(Coll {
        store,
        key,
        kind,
        limits,
        version: Some(m.version),
        stored_root,
        repr,
        dirty: false,
    }))
}

/// [`open`], or a new empty collection if the key is absent.
pub fn open_or_new<'e>(
    store: &'e Engine,
    key: &'e [u8],
    kind: Kind,
    limits: Limits,
) -> Result<Coll<'e>, CmdError> {
    Ok(open(store, key, kind, limits)?.unwrap_or_else(|| empty_coll(store, key, kind, limits)))
}

/// A new empty collection at the absent `key`.
fn empty_coll<'e>(store: &'e Engine, key: &'e [u8], kind: Kind, limits: Limits) -> Coll<'e> {
    Coll {
        store,
        key,
        kind,
        limits,
        version: None,
        stored_root: None,
        repr: Repr::Small {
            items: PairBuf::with_head(SMALL_HEAD_BYTES, kind == Kind::Hash),
            intset: kind == Kind::Set,
        },
        dirty: false,
    }
}

impl Drop for Coll<'_> {
    /// The buckets' (or the small item's) buffers go back to the thread's
    /// pool for the next command.
    fn drop(&mut self) {
        match self.take_repr() {
            Repr::Big { mut cache, .. } => {
                for (_, (items, _)) in cache.drain() {
                    give_buf(items.into_bytes());
                }
            }
            Repr::Small { items, .. } => give_buf(items.into_bytes()),
        }
    }
}

/// Head bytes of a small collection's item: its type byte.
const SMALL_HEAD_BYTES: usize = 1;

/// A small collection's item bytes (type byte first) as a [`PairBuf`]
/// that keeps the type byte as its head: the pairs are validated once
/// and the spare room after them (`crate::packed`) stripped, nothing is
/// moved; `None` if they are not pairs.
fn small_items(buf: Vec<u8>, values: bool) -> Option<PairBuf> {
    PairBuf::from_bytes_after(buf, SMALL_HEAD_BYTES, values)
}

/// True if the pairs `items` fit a listpack under `l` (count and every
/// element's and value's length).
fn fits_listpack(items: &PairBuf, l: Limits) -> bool {
    items.len() <= l.entries
        && items
            .iter()
            .all(|(a, b)| a.len() <= l.value && b.len() <= l.value)
}

/// `room` where the engine overwrites in place, none elsewhere (an
/// append would only carry the zeros).
fn room_on(store: &Engine, room: Room) -> Room {
    if store.overwrites_in_place() {
        room
    } else {
        Room::None
    }
}

/// The type byte of a small collection of `kind`.
fn small_magic(kind: Kind, intset: bool) -> Result<u8, CmdError> {
    match (kind, intset) {
        (Kind::Hash, _) => Ok(HASH_MAGIC),
        (Kind::Set, true) => Ok(INTSET_MAGIC),
        (Kind::Set, false) => Ok(SET_MAGIC),
        (Kind::List | Kind::Zset, _) => Err("ERR not a hash or set".into()),
    }
}

impl Coll<'_> {
    /// The representation, leaving an empty large one (no allocation) in
    /// its place.
    fn take_repr(&mut self) -> Repr {
        let empty = Repr::Big {
            root: Root {
                id: 0,
                count: 0,
                nbuckets: 0,
                first: 0,
            },
            cache: HashMap::new(),
            fresh: false,
        };
        std::mem::replace(&mut self.repr, empty)
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        match &self.repr {
            Repr::Small { items, .. } => items.len() as u64,
            Repr::Big { root, .. } => root.count,
        }
    }

    /// True if empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// OBJECT ENCODING's name for the current representation.
    pub fn encoding(&self) -> &'static str {
        match &self.repr {
            Repr::Small { intset: true, .. } => "intset",
            Repr::Small { items, .. } => {
                // A small item over thresholds lowered since it was written
                // reports what Redis would report after converting it.
                if fits_listpack(items, self.limits) {
                    "listpack"
                } else {
                    "hashtable"
                }
            }
            Repr::Big { .. } => "hashtable",
        }
    }

    /// The bucket `b` of a large collection, loaded into the cache.
    fn bucket(&mut self, b: u32) -> Result<&mut (PairBuf, bool), CmdError> {
        let Repr::Big { root, cache, .. } = &mut self.repr else {
            unreachable!("bucket() on a small collection")
        };
        match cache.entry(b) {
            Entry::Occupied(o) => Ok(o.into_mut()),
            Entry::Vacant(v) => {
                let mut data = take_buf(BUCKET_READ_BYTES);
                let items = match self.store.raw_get_into(&node_key(root.id, b), &mut data)? {
                    Some(_) => PairBuf::from_bytes(data, true)
                        .ok_or(CmdError::from("ERR corrupt collection node"))?,
                    None => {
                        give_buf(data);
                        PairBuf::new(true)
                    }
                };
                Ok(v.insert((items, false)))
            }
        }
    }

    /// Change bucket `b` of a large collection with `change` in one
    /// engine read-modify-write of its item (`Engine::read_modify_write`:
    /// one index lookup, the write in place under the item's lock), where
    /// the engine overwrites in place and the bucket is not cached yet.
    /// `change` returns what it did, and whether it changed the bucket
    /// (`Changed::changed`). The bucket is cached afterwards, clean when
    /// the write happened in place; a change that outgrows the item's
    /// room, or empties the bucket (its item is deleted), stays dirty for
    /// [`commit`](Coll::commit). Elsewhere (no in-place engine, a cached
    /// or absent bucket) `change` runs on the cached
    /// [`bucket`](Coll::bucket), left dirty if it changed.
    ///
    /// Writing the bucket before the root is the order `commit` keeps
    /// anyway (nodes first, the root last): the command holds the key's
    /// stripe, and a root that changed meanwhile makes the command rerun
    /// over a new collection, whose nodes these are not.
    fn change_bucket<R: Changed>(
        &mut self,
        b: u32,
        mut change: impl FnMut(&mut PairBuf) -> R,
    ) -> Result<R, CmdError> {
        if let Some(r) = self.change_bucket_in_place(b, &mut change)? {
            return Ok(r);
        }
        let (items, dirty) = self.bucket(b)?;
        let r = change(items);
        *dirty |= r.changed();
        Ok(r)
    }

    /// [`change_bucket`](Coll::change_bucket)'s read-modify-write;
    /// `Ok(None)` where it does not apply, `change` not run.
    fn change_bucket_in_place<R: Changed>(
        &mut self,
        b: u32,
        change: &mut impl FnMut(&mut PairBuf) -> R,
    ) -> Result<Option<R>, CmdError> {
        let Repr::Big { root, cache, .. } = &mut self.repr else {
            return Ok(None);
        };
        if !self.store.overwrites_in_place() || cache.contains_key(&b) {
            return Ok(None);
        }
        let store = self.store;
        let max = usize::try_from(store.max_value_bytes()).unwrap_or(usize::MAX);
        let mut buf = take_stale_buf();
        let rmw = store.raw_read_modify_write(&node_key(root.id, b), &mut buf, |old, buf| {
            if old.is_none() {
                return (None, false);
            }
            let Some(mut items) = PairBuf::from_bytes(std::mem::take(buf), true) else {
                return (Some(None), false);
            };
            let r = change(&mut items);
            if !r.changed() || items.is_empty() {
                return (Some(Some((r, items))), false);
            }
            *buf = take_buf(BUCKET_READ_BYTES);
            items.write_with(Room::Node, max, |bytes| buf.extend_from_slice(bytes));
            (Some(Some((r, items))), true)
        });
        give_buf(buf);
        let rmw = rmw?;
        let Some(done) = rmw.out else {
            return Ok(None);
        };
        let (r, items) = done.ok_or(CmdError::from("ERR corrupt collection node"))?;
        let dirty = r.changed() && rmw.written.is_none();
        cache.insert(b, (items, dirty));
        Ok(Some(r))
    }

    /// The value of element `e`, if present.
    pub fn get(&mut self, e: &[u8]) -> Result<Option<Vec<u8>>, CmdError> {
        match &self.repr {
            Repr::Small { items, .. } => Ok(items.get(e).map(<[u8]>::to_vec)),
            Repr::Big { root, .. } => {
                let b = bucket_of(elem_hash(e), root.nbuckets);
                let (items, _) = self.bucket(b)?;
                Ok(items.get(e).map(<[u8]>::to_vec))
            }
        }
    }

    /// True if `e` is present.
    pub fn contains(&mut self, e: &[u8]) -> Result<bool, CmdError> {
        match &self.repr {
            Repr::Small { items, .. } => Ok(items.get(e).is_some()),
            Repr::Big { root, .. } => {
                let b = bucket_of(elem_hash(e), root.nbuckets);
                Ok(self.bucket(b)?.0.get(e).is_some())
            }
        }
    }

    /// Set `e` to `v` (insert or overwrite); true if `e` is new. Setting
    /// an element to the value it has changes nothing, so writes nothing.
    pub fn insert(&mut self, e: &[u8], v: &[u8]) -> Result<bool, CmdError> {
        let new = match &mut self.repr {
            Repr::Small { items, intset } => {
                if *intset {
                    if let Some(n) = is_int(e) {
                        let Some(at) = intset_slot(items, n) else {
                            return Ok(false);
                        };
                        items.insert_nth(at, e, &[]);
                        self.dirty = true;
                        self.grow_if_needed()?;
                        return Ok(true);
                    }
                }
                match items.upsert(e, v) {
                    Upserted::Unchanged => return Ok(false),
                    Upserted::Changed => {
                        self.dirty = true;
                        return Ok(false);
                    }
                    Upserted::New => {}
                }
                *intset = false;
                self.dirty = true;
                self.grow_if_needed()?;
                true
            }
            Repr::Big { root, .. } => {
                let b = bucket_of(elem_hash(e), root.nbuckets);
                match self.change_bucket(b, |items| items.upsert(e, v))? {
                    Upserted::Unchanged => false,
                    Upserted::Changed => {
                        self.dirty = true;
                        false
                    }
                    Upserted::New => {
                        self.dirty = true;
                        if let Repr::Big { root, .. } = &mut self.repr {
                            root.count += 1;
                        }
                        self.split_if_needed()?;
                        true
                    }
                }
            }
        };
        Ok(new)
    }

    /// Remove `e`; true if it was present.
    pub fn remove(&mut self, e: &[u8]) -> Result<bool, CmdError> {
        match &mut self.repr {
            Repr::Small { items, .. } => {
                if !items.remove(e) {
                    return Ok(false);
                }
            }
            Repr::Big { root, .. } => {
                let b = bucket_of(elem_hash(e), root.nbuckets);
                if !self.change_bucket(b, |items| items.remove(e))? {
                    return Ok(false);
                }
                if let Repr::Big { root, .. } = &mut self.repr {
                    root.count -= 1;
                }
            }
        }
        self.dirty = true;
        Ok(true)
    }

    /// Every element with its value (small: in order; large: by bucket).
    pub fn all(&mut self) -> Result<Vec<Pair>, CmdError> {
        match &self.repr {
            Repr::Small { items, .. } => Ok(pairs_of(items)),
            Repr::Big { root, .. } => {
                let mut out = Vec::with_capacity(root.count as usize);
                for b in 0..root.nbuckets {
                    out.extend(
                        self.bucket(b)?
                            .0
                            .iter()
                            .map(|(a, v)| (a.to_vec(), v.to_vec())),
                    );
                }
                Ok(out)
            }
        }
    }

    /// One SCAN step from `cursor`, at least `count` elements (large) or
    /// everything with cursor 0 (small, as Redis for listpacks).
    pub fn scan(&mut self, cursor: u64, count: usize) -> Result<(u64, Vec<Pair>), CmdError> {
        let n = match &self.repr {
            Repr::Small { items, .. } => return Ok((0, pairs_of(items))),
            Repr::Big { root, .. } => root.nbuckets,
        };
        let mut out = Vec::new();
        let mut b = cursor;
        while b < u64::from(n) && out.len() < count {
            out.extend(
                self.bucket(b as u32)?
                    .0
                    .iter()
                    .map(|(a, v)| (a.to_vec(), v.to_vec())),
            );
            b += 1;
        }
        Ok((if b >= u64::from(n) { 0 } else { b }, out))
    }

    /// A random element (roughly uniform; see the module notes).
    pub fn random(&mut self) -> Result<Option<Pair>, CmdError> {
        if self.is_empty() {
            return Ok(None);
        }
        match &self.repr {
            Repr::Small { items, .. } => {
                let j = (random_u64() % items.len() as u64) as usize;
                let (a, v) = items.iter().nth(j).ok_or("ERR corrupt collection value")?;
                Ok(Some((a.to_vec(), v.to_vec())))
            }
            Repr::Big { root, .. } => {
                let n = root.nbuckets;
                let start = (random_u64() % u64::from(n)) as u32;
                for i in 0..n {
                    let (items, _) = self.bucket((start + i) % n)?;
                    if !items.is_empty() {
                        let j = (random_u64() % items.len() as u64) as usize;
                        let (a, v) = items.iter().nth(j).ok_or("ERR corrupt collection node")?;
                        return Ok(Some((a.to_vec(), v.to_vec())));
                    }
                }
                Ok(None)
            }
        }
    }

    /// Turn a small collection that outgrew its thresholds into a large
    /// one (in memory; written by [`commit`](Coll::commit)).
    fn grow_if_needed(&mut self) -> Result<(), CmdError> {
        let Repr::Small { items, intset } = &mut self.repr else {
            return Ok(());
        };
        let l = self.limits;
        if *intset {
            if items.len() <= l.intset {
                return Ok(());
            }
            // Over the intset limit: a listpack if it fits one, as Redis.
            *intset = false;
        }
        if fits_listpack(items, l) {
            return Ok(());
        }
        let Repr::Small { items, .. } = self.take_repr() else {
            unreachable!("matched as small above")
        };
        let nbuckets =
            ((items.len() as u64 / BUCKET_SPLIT_ELEMS) + 1).min(u64::from(u32::MAX)) as u32;
        let mut cache: HashMap<u32, (PairBuf, bool)> = (0..nbuckets)
            .map(|b| (b, (PairBuf::new(true), true)))
            .collect();
        let count = items.len() as u64;
        for (a, v) in items.iter() {
            let b = bucket_of(elem_hash(a), nbuckets);
            cache.get_mut(&b).expect("every bucket").0.push(a, v);
        }
        give_buf(items.into_bytes());
        self.repr = Repr::Big {
            root: Root {
                id: new_id(),
                count,
                nbuckets,
                first: 0,
            },
            cache,
            fresh: true,
        };
        Ok(())
    }

    /// Split one bucket if the table is over its load.
    fn split_if_needed(&mut self) -> Result<(), CmdError> {
        let Repr::Big { root, .. } = &self.repr else {
            return Ok(());
        };
        let n = root.nbuckets;
        if root.count <= u64::from(n) * BUCKET_SPLIT_ELEMS || n == u32::MAX {
            return Ok(());
        }
        let p = 1u32 << (31 - n.leading_zeros());
        let s = n - p;
        let (items, _) = self.bucket(s)?;
        let (mut stay, mut go) = (PairBuf::new(true), PairBuf::new(true));
        for (a, v) in items.iter() {
            if bucket_of(elem_hash(a), n + 1) == s {
                stay.push(a, v);
            } else {
                go.push(a, v);
            }
        }
        let Repr::Big { root, cache, .. } = &mut self.repr else {
            unreachable!()
        };
        cache.insert(s, (stay, true));
        cache.insert(n, (go, true));
        root.nbuckets = n + 1;
        Ok(())
    }

    /// Write what this command changed: the buckets, then the root (or
    /// delete everything if the collection is now empty). `Ok(false)`:
    /// the root changed under us (memcached or expiry); rerun the command.
    pub fn commit(&mut self) -> Result<bool, CmdError> {
        if !self.dirty {
            return Ok(true);
        }
        let store = self.store;
        let cond = self
            .version
            .map_or(Condition::IfAbsent, Condition::IfVersion);
        let flags = self.kind.flags();
        let opts = PutOptions {
            condition: cond,
            expiry: Expiry::Keep,
            flags,
        };
        match &mut self.repr {
            Repr::Small { items, intset } => {
                if items.is_empty() {
                    return self.delete_root();
                }
                items.head_mut()[0] = small_magic(self.kind, *intset)?;
                let max = usize::try_from(store.max_value_bytes()).unwrap_or(usize::MAX);
                if items.item_len() > max {
                    return Err("ERR collection exceeds the largest value the engine stores".into());
                }
                let room = room_on(store, Room::Small);
                let put = items.write_with(room, max, |v| store.put_with(self.key, v, opts));
                match put {
                    Ok(_) => Ok(true),
                    Err(e) if crate::commands::is_race(&e) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
            Repr::Big { root, cache, fresh } => {
                let root = *root;
                if *fresh {
                    let mut rec = vec![self.kind.tag()];
                    rec.extend_from_slice(self.key);
                    store.raw_put_with(&instance_key(root.id), &rec, PutOptions::default())?;
                    *fresh = false;
                    LARGE_CREATED.store(true, Ordering::Relaxed);
                }
                for (b, (items, dirty)) in cache.iter_mut() {
                    if !*dirty {
                        continue;
                    }
                    let k = node_key(root.id, *b);
                    if items.is_empty() {
                        store.raw_delete(&k)?;
                    } else {
                        put_node(store, &k, items)?;
                    }
                    *dirty = false;
                }
                if root.count == 0 {
                    return self.delete_root();
                }
                if self.stored_root == Some(root) {
                    // Only buckets changed. Under the stripe nothing else
                    // writes the root but expiry (or eviction), which can
                    // only make the whole collection dead: then these
                    // buckets are a dead id's, reclaimed by the sweeper,
                    // and this command ordered before that death.
                    self.dirty = false;
                    return Ok(true);
                }
                let mut bytes = take_buf(ROOT_READ_BYTES);
                encode_root_into(self.kind, &root, &mut bytes);
                let put = store.put_with(self.key, &bytes, opts);
                give_buf(bytes);
                match put {
                    Ok(ver) => {
                        self.version = Some(ver);
                        self.stored_root = Some(root);
                        self.dirty = false;
                        Ok(true)
                    }
                    Err(e) if crate::commands::is_race(&e) => Ok(false),
                    Err(e) => Err(e.into()),
                }
            }
        }
    }

    /// Delete the (now empty) collection: root, then its nodes.
    fn delete_root(&mut self) -> Result<bool, CmdError> {
        if let Some(v) = self.version {
            match self.store.delete_if(self.key, Condition::IfVersion(v)) {
                Ok(()) => {}
                Err(e) if crate::commands::is_race(&e) => return Ok(false),
                Err(e) => return Err(e.into()),
            }
        }
        if let Repr::Big { root, .. } = &self.repr {
            drop_nodes(self.store, root)?;
        }
        self.dirty = false;
        Ok(true)
    }
}

/// Write the bucket or list chunk `node` under the internal key `key`,
/// with spare room where the engine overwrites in place (`crate::packed`).
pub(crate) fn put_node(store: &Engine, key: &[u8], node: &mut PairBuf) -> Result<(), CmdError> {
    let room = room_on(store, Room::Node);
    let max = usize::try_from(store.max_value_bytes()).unwrap_or(usize::MAX);
    node.write_with(room, max, |b| {
        store.raw_put_with(key, b, PutOptions::default())
    })?;
    Ok(())
}

/// Delete the nodes and the instance record of the large collection of
/// `root`.
pub(crate) fn drop_nodes(store: &Engine, root: &Root) -> Result<(), CmdError> {
    for i in 0..root.nbuckets {
        store.raw_delete(&node_key(root.id, root.first.wrapping_add(i)))?;
    }
    store.raw_delete(&instance_key(root.id))?;
    Ok(())
}

/// The large-collection id and bucket count of the root bytes `v` of an
/// item with flags `flags`, if it is one.
fn big_root_of(flags: u32, v: &[u8]) -> Option<(Kind, Root)> {
    if !crate::types::is_reserved_flags(flags) {
        return None;
    }
    decode_root(v)
}

/// Delete the key `key` whatever it holds, with a large collection's
/// nodes (DEL, UNLINK, the STORE forms, RENAME over a collection).
/// Whether a live key was removed. Caller holds `key`'s stripe.
pub fn delete_key(store: &Engine, key: &[u8]) -> Result<bool, CmdError> {
    let mut buf = Vec::new();
    let Some(m) = store.get_into(key, &mut buf)? else {
        return Ok(store.delete(key)?);
    };
    let removed = store.delete(key)?;
    match big_root_of(m.flags, &buf) {
        Some((Kind::Zset, _)) => crate::zset::drop_if_big(store, &buf)?,
        Some((_, root)) => drop_nodes(store, &root)?,
        None => {}
    }
    Ok(removed)
}

/// After RENAME moved the item `v` (flags `flags`) to `dst`: point a large
/// collection's instance record at its new owner.
pub fn renamed(store: &Engine, flags: u32, v: &[u8], dst: &[u8]) -> Result<(), CmdError> {
    if let Some((kind, root)) = big_root_of(flags, v) {
        let mut rec = vec![kind.tag()];
        rec.extend_from_slice(dst);
        store.raw_put_with(&instance_key(root.id), &rec, PutOptions::default())?;
    }
    Ok(())
}

/// True if `v` (flags `flags`) is a large collection's root, which must
/// not be copied byte for byte (COPY, RESTORE).
pub fn is_big_root(flags: u32, v: &[u8]) -> bool {
    big_root_of(flags, v).is_some()
}

/// A whole collection as read: its kind, elements and OBJECT ENCODING.
pub type Loaded = (Kind, Vec<Pair>, &'static str);

/// Every element of the collection whose item is `(flags, v)` as read
/// from `key`: for DUMP, COPY and OBJECT. `None` if not a collection.
pub fn load_all(shared: &Shared, key: &[u8], flags: u32) -> Result<Option<Loaded>, CmdError> {
    let kind = match flags {
        HASH_FLAGS => Kind::Hash,
        SET_FLAGS => Kind::Set,
        LIST_FLAGS => {
            let Some(items) = crate::list::load_all(&shared.store, key)? else {
                return Ok(None);
            };
            let pairs = items.into_iter().map(|e| (e, Vec::new())).collect();
            return Ok(Some((Kind::List, pairs, "quicklist")));
        }
        ZSET_FLAGS => {
            let Some((es, enc)) = crate::zset::read(shared, key, |z| Ok((z.all()?, z.encoding())))?
            else {
                return Ok(None);
            };
            let pairs = es
                .into_iter()
                .map(|(s, m)| (m, s.to_le_bytes().to_vec()))
                .collect();
            return Ok(Some((Kind::Zset, pairs, enc)));
        }
        _ => return Ok(None),
    };
    let Some(mut c) = open(&shared.store, key, kind, Limits::of(shared, kind))? else {
        return Ok(None);
    };
    let all = c.all()?;
    Ok(Some((kind, all, c.encoding())))
}

/// The bytes of a small set holding `items` (RESTORE): an intset when
/// every member is an integer (sorted), else insertion order.
pub fn encode_small_set(items: &[Pair]) -> Vec<u8> {
    let ints: Option<Vec<i64>> = items.iter().map(|(m, _)| is_int(m)).collect();
    let mut v = Vec::new();
    match ints {
        Some(mut ns) => {
            ns.sort_unstable();
            let sorted: Vec<Pair> = ns
                .iter()
                .map(|n| (n.to_string().into_bytes(), Vec::new()))
                .collect();
            v.push(INTSET_MAGIC);
            encode_pairs(&mut v, &sorted, false);
        }
        None => {
            v.push(SET_MAGIC);
            encode_pairs(&mut v, items, false);
        }
    }
    v
}

/// OBJECT ENCODING of the collection at `key` (flags `flags`).
pub fn encoding_of(shared: &Shared, key: &[u8], flags: u32) -> Option<&'static str> {
    let kind = match flags {
        HASH_FLAGS => Kind::Hash,
        SET_FLAGS => Kind::Set,
        LIST_FLAGS => return Some("quicklist"),
        ZSET_FLAGS => {
            return crate::zset::read(shared, key, |z| Ok(z.encoding()))
                .ok()
                .flatten()
        }
        _ => return None,
    };
    open(&shared.store, key, kind, Limits::of(shared, kind))
        .ok()
        .flatten()
        .map(|c| c.encoding())
}

/// Build a new collection of `kind` at `key` from `items` (the key must be
/// free: the caller deleted it), with `expiry`.
pub fn create(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    items: &[Pair],
    expiry: Option<u64>,
) -> Result<(), CmdError> {
    let store = &shared.store;
    if kind == Kind::List {
        let elems: Vec<Vec<u8>> = items.iter().map(|p| p.0.clone()).collect();
        crate::list::create(store, key, &elems)?;
        if let Some(at) = expiry {
            store.set_expiry(key, Some(at))?;
        }
        return Ok(());
    }
    if kind == Kind::Zset {
        let es: Vec<crate::zset::Entry> = items
            .iter()
            .map(|(m, s)| {
                (
                    f64::from_le_bytes(s[..].try_into().unwrap_or([0; 8])),
                    m.clone(),
                )
            })
            .collect();
        crate::zset::create(shared, key, &es)?;
        if let Some(at) = expiry {
            store.set_expiry(key, Some(at))?;
        }
        return Ok(());
    }
    let mut c = open_or_new(store, key, kind, Limits::of(shared, kind))?;
    for (a, b) in items {
        c.insert(a, b)?;
    }
    if !c.commit()? {
        return Err("ERR the key changed while it was written".into());
    }
    if let Some(at) = expiry {
        store.set_expiry(key, Some(at))?;
    }
    Ok(())
}

/// Run `f` over the collection at `key` (new if absent), commit, and rerun
/// on a lost race with a writer outside the stripe. For write commands.
pub fn modify<T>(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    f: impl FnMut(&mut Coll) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    modify_from(&shared.store, Limits::of(shared, kind), key, kind, None, f)
}

/// [`modify`], its first pass over the item `first` already read (its
/// metadata and bytes), if given.
fn modify_from<T>(
    store: &Engine,
    limits: Limits,
    key: &[u8],
    kind: Kind,
    mut first: Option<(Option<ItemMeta>, Vec<u8>)>,
    mut f: impl FnMut(&mut Coll) -> Result<T, CmdError>,
) -> Result<T, CmdError> {
    loop {
        let c = match first.take() {
            Some((m, buf)) => open_read(store, key, kind, limits, m, buf)?,
            None => open(store, key, kind, limits)?,
        };
        let mut c = c.unwrap_or_else(|| empty_coll(store, key, kind, limits));
        let out = f(&mut c)?;
        if c.commit()? {
            return Ok(out);
        }
    }
}

/// What [`change_small`] did with a small collection's item.
enum SmallChange {
    /// The key is absent, or holds no small collection of this kind: the
    /// item's bytes are left in the buffer, for [`open_read`].
    NotSmall,
    /// Not a change done here (the collection would turn large, an intset
    /// would become a listpack, the last element would go, the item
    /// would pass the engine's largest value): the command runs the
    /// general way.
    Elsewhere,
    /// Done: whether the element was new (insert) or present (removal),
    /// and whether the buffer holds new bytes to write.
    Done(bool, bool),
}

/// Set element `e` of the small collection read into `buf` (`m`) to
/// `v`, or remove it (`v` `None`), as [`Coll::insert`] and
/// [`Coll::remove`] do, leaving the new item's bytes (type byte, pairs,
/// room) in `buf`. Runs under the engine's lock on the key: calls
/// nothing in the engine.
fn change_small(
    kind: Kind,
    limits: Limits,
    m: Option<ItemMeta>,
    buf: &mut Vec<u8>,
    e: &[u8],
    v: Option<&[u8]>,
    max_bytes: usize,
) -> SmallChange {
    let Some(m) = m else {
        return SmallChange::NotSmall;
    };
    let magic = match buf.first() {
        Some(&b) if m.flags == kind.flags() => b,
        _ => return SmallChange::NotSmall,
    };
    // The type byte stays the item's first byte: an intset's remains one
    // (a change that would make it a listpack runs elsewhere).
    let intset = match (kind, magic) {
        (Kind::Hash, HASH_MAGIC) | (Kind::Set, SET_MAGIC) => false,
        (Kind::Set, INTSET_MAGIC) => true,
        _ => return SmallChange::NotSmall,
    };
    let Some(mut items) = small_items(std::mem::take(buf), kind == Kind::Hash) else {
        return SmallChange::Elsewhere;
    };
    let done = match v {
        None if !items.remove(e) => SmallChange::Done(false, false),
        None if items.is_empty() => SmallChange::Elsewhere,
        None => SmallChange::Done(true, true),
        Some(_) if intset => match is_int(e) {
            Some(n) => match intset_slot(&items, n) {
                None => SmallChange::Done(false, false),
                Some(_) if items.len() >= limits.intset => SmallChange::Elsewhere,
                Some(at) => {
                    items.insert_nth(at, e, &[]);
                    SmallChange::Done(true, true)
                }
            },
            None => SmallChange::Elsewhere,
        },
        // As Redis's hashTypeSet / setTypeAdd: the new element's length
        // and the count decide, the others fit when they were written.
        Some(v) if e.len() > limits.value || v.len() > limits.value => SmallChange::Elsewhere,
        Some(v) => match items.upsert(e, v) {
            Upserted::Unchanged => SmallChange::Done(false, false),
            Upserted::Changed => SmallChange::Done(false, true),
            Upserted::New if items.len() <= limits.entries => SmallChange::Done(true, true),
            Upserted::New => SmallChange::Elsewhere,
        },
    };
    match done {
        SmallChange::Done(r, true) if items.item_len() <= max_bytes => {
            *buf = items.into_stored(Room::Small, max_bytes);
            SmallChange::Done(r, true)
        }
        SmallChange::Done(r, false) => {
            give_buf(items.into_bytes());
            SmallChange::Done(r, false)
        }
        _ => {
            give_buf(items.into_bytes());
            SmallChange::Elsewhere
        }
    }
}

/// Set element `e` of the hash or set at `key` to `v` (insert or
/// overwrite; true if new), or remove it (`v` `None`; true if it was
/// present): the one-element HSET, SADD, HDEL and SREM.
///
/// Where the engine overwrites in place (Nibble-2) and the collection is
/// small, this is one engine read-modify-write of the key
/// (`change_small`): the item is read, changed and written back under
/// the engine's lock on it, in place when the new bytes keep the item's
/// size, which its spare room (`crate::packed`) makes the usual case;
/// the write keeps the item's flags and expiry and gives it a new
/// version (WATCH sees it). New bytes that do not fit are put with
/// `IfVersion` of the item read, as [`Coll::commit`] does. Anything
/// else (a large or absent collection, another type, a change that
/// turns the collection large or empties it, Nibble mode) runs through
/// [`modify`], over the item this read already fetched.
pub fn modify_one(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    e: &[u8],
    v: Option<&[u8]>,
) -> Result<bool, CmdError> {
    change_one(&shared.store, Limits::of(shared, kind), key, kind, e, v)
}

/// Add each of `elems` with value `v` (SADD: `Some(b"")`) or remove each
/// (`None`: HDEL, SREM); the count of elements added or removed.
/// One element is [`modify_one`], several one [`modify`].
pub fn change_each(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    elems: &[&[u8]],
    v: Option<&[u8]>,
) -> Result<i64, CmdError> {
    if let [e] = elems {
        return Ok(i64::from(modify_one(shared, key, kind, e, v)?));
    }
    modify(shared, key, kind, |c| {
        let mut n = 0;
        for e in elems {
            n += i64::from(match v {
                Some(v) => c.insert(e, v)?,
                None => c.remove(e)?,
            });
        }
        Ok(n)
    })
}

/// [`modify_one`] on `store` under the thresholds `limits`.
fn change_one(
    store: &Engine,
    limits: Limits,
    key: &[u8],
    kind: Kind,
    e: &[u8],
    v: Option<&[u8]>,
) -> Result<bool, CmdError> {
    let change = |c: &mut Coll| match v {
        Some(v) => c.insert(e, v),
        None => c.remove(e),
    };
    if !store.overwrites_in_place() {
        return modify_from(store, limits, key, kind, None, change);
    }
    let max = usize::try_from(store.max_value_bytes()).unwrap_or(usize::MAX);
    let mut buf = take_stale_buf();
    let rmw = match store.read_modify_write(key, &mut buf, |m, buf| {
        let r = change_small(kind, limits, m, buf, e, v, max);
        let write = matches!(r, SmallChange::Done(_, true));
        (r, write)
    }) {
        Ok(rmw) => rmw,
        Err(err) => {
            give_buf(buf);
            return Err(err.into());
        }
    };
    let first = match rmw.out {
        SmallChange::NotSmall => Some((rmw.old, buf)),
        SmallChange::Elsewhere => {
            give_buf(buf);
            None
        }
        SmallChange::Done(r, false) => {
            give_buf(buf);
            return Ok(r);
        }
        SmallChange::Done(r, true) => {
            let put = match (rmw.written, rmw.old) {
                (Some(_), _) => Ok(0),
                (None, Some(old)) => store.put_with(
                    key,
                    &buf,
                    PutOptions {
                        condition: Condition::IfVersion(old.version),
                        expiry: Expiry::Keep,
                        flags: kind.flags(),
                    },
                ),
                (None, None) => unreachable!("a change of an item read"),
            };
            give_buf(buf);
            match put {
                Ok(_) => return Ok(r),
                // Replaced meanwhile (memcached, expiry): rerun.
                Err(err) if crate::commands::is_race(&err) => None,
                Err(err) => return Err(err.into()),
            }
        }
    };
    modify_from(store, limits, key, kind, first, change)
}

/// Run `f` over the collection at `key` if present (`None` if absent).
/// For read commands.
pub fn read<T>(
    shared: &Shared,
    key: &[u8],
    kind: Kind,
    f: impl FnOnce(&mut Coll) -> Result<T, CmdError>,
) -> Result<Option<T>, CmdError> {
    match open(&shared.store, key, kind, Limits::of(shared, kind))? {
        Some(mut c) => Ok(Some(f(&mut c)?)),
        None => Ok(None),
    }
}

/// One sweeper pass: reclaim the nodes of every dead large collection.
/// Returns the number of internal items deleted and the number seen.
pub fn sweep_once(shared: &Shared) -> Result<(u64, u64), CmdError> {
    let store = &shared.store;
    let mut alive: HashMap<u64, bool> = HashMap::new();
    let (mut deleted, mut seen) = (0, 0);
    let mut cursor = 0;
    let mut buf = Vec::new();
    loop {
        let (next, keys) = store.raw_scan(cursor, SWEEP_SCAN_KEYS)?;
        for k in keys {
            let Some(id) = id_of_internal(&k) else {
                continue;
            };
            seen += 1;
            let live = match alive.get(&id) {
                Some(&l) => l,
                None => {
                    let l = is_alive(shared, id, &mut buf)?;
                    alive.insert(id, l);
                    l
                }
            };
            if !live && store.raw_delete(&k)? {
                deleted += 1;
            }
        }
        if next == 0 || shared.stopping.load(Ordering::Relaxed) {
            return Ok((deleted, seen));
        }
        cursor = next;
    }
}

/// Whether large collection `id` still has an owner pointing at it.
fn is_alive(shared: &Shared, id: u64, buf: &mut Vec<u8>) -> Result<bool, CmdError> {
    let store = &shared.store;
    loop {
        let Some(_) = store.raw_get_into(&instance_key(id), buf)? else {
            return Ok(false);
        };
        let Some(kind) = buf.first().and_then(|&t| Kind::of_tag(t)) else {
            return Ok(false);
        };
        let owner = buf[1..].to_vec();
        // The owner's stripe: no command is half-way through building,
        // renaming or deleting this collection while we look.
        let _g = shared.keylocks.lock([&owner[..]], true);
        // A RENAME may have moved it before we took the stripe.
        match store.raw_get_into(&instance_key(id), buf)? {
            Some(_) if buf[1..] == owner[..] => {}
            Some(_) => continue,
            None => return Ok(false),
        }
        let Some(m) = store.get_into(&owner, buf)? else {
            return Ok(false);
        };
        return Ok(m.flags == kind.flags()
            && decode_root(buf).is_some_and(|(k, r)| k == kind && r.id == id));
    }
}

/// The sweeper thread's body, until the server stops: a pass
/// [`SWEEP_INTERVAL_MS`] after one that reclaimed something, backing off
/// to [`SWEEP_MAX_INTERVAL_MS`] while passes reclaim nothing, and no pass
/// at all while the store holds no internal key and no large collection
/// was created since (a store of strings is never walked after the first
/// pass). So an orphan waits at most the longest pause plus one pass.
pub fn sweeper(shared: std::sync::Arc<Shared>) {
    let stopping = || shared.stopping.load(Ordering::Relaxed);
    let mut pause_ms = SWEEP_INTERVAL_MS;
    let mut idle = false;
    while !stopping() {
        // Short naps, so shutdown (which joins this thread) is prompt.
        for _ in 0..pause_ms / SWEEP_NAP_MS {
            if stopping() {
                return;
            }
            std::thread::sleep(Duration::from_millis(SWEEP_NAP_MS));
        }
        let created = LARGE_CREATED.swap(false, Ordering::Relaxed);
        if idle && !created {
            continue;
        }
        match sweep_once(&shared) {
            Ok((deleted, seen)) => {
                idle = seen == 0;
                pause_ms = if deleted > 0 || created {
                    SWEEP_INTERVAL_MS
                } else {
                    (pause_ms * 2).min(SWEEP_MAX_INTERVAL_MS)
                };
                if deleted > 0 {
                    log::info!("collection sweeper reclaimed {deleted} orphaned items");
                }
            }
            Err(e) => log::warn!("collection sweeper: {}", e.0),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Two small local engines: append-only Nibble and Nibble-2 (in-place
    /// overwrites, so nodes are stored with spare room).
    pub(crate) fn both_modes() -> [Engine; 2] {
        [nibble::Mode::Nibble, nibble::Mode::Nibble2].map(|mode| {
            let mut cfg = nibble::Config::new(64 << 20);
            cfg.mode = mode;
            Engine::Local(nibble::Store::new(cfg).expect("engine"))
        })
    }

    #[test]
    fn linear_hashing_buckets_stay_in_range_and_split_upwards() {
        for n in 1..200u32 {
            for h in 0..1000u64 {
                let b = bucket_of(h.wrapping_mul(0x9E37_79B9_7F4A_7C15), n);
                assert!(b < n);
                // Growing to n + 1 moves an element only from the split
                // bucket n - p to the new bucket n.
                let b2 = bucket_of(h.wrapping_mul(0x9E37_79B9_7F4A_7C15), n + 1);
                let p = 1u32 << (31 - n.leading_zeros());
                assert!(b2 == b || (b == n - p && b2 == n), "n={n} b={b} b2={b2}");
            }
        }
    }

    #[test]
    fn root_and_pairs_roundtrip() {
        let r = Root {
            id: 7,
            count: 9,
            nbuckets: 3,
            first: 5,
        };
        assert_eq!(
            decode_root(&encode_root(Kind::Set, &r)),
            Some((Kind::Set, r))
        );
        let items = vec![(b"a".to_vec(), b"1".to_vec()), (b"bb".to_vec(), Vec::new())];
        let mut v = Vec::new();
        encode_pairs(&mut v, &items, true);
        let p = PairBuf::from_exact_bytes(v.clone(), true).unwrap();
        assert_eq!(pairs_of(&p), items);
        assert!(PairBuf::from_exact_bytes(v[..v.len() - 1].to_vec(), true).is_none());
        let mut padded = v.clone();
        padded.push(0);
        assert!(
            PairBuf::from_exact_bytes(padded, true).is_none(),
            "exact bytes take no spare room"
        );
        // The type byte stays as the head; zero bytes after the pairs
        // (spare room) are stripped, anything else after them refused.
        let mut item = vec![HASH_MAGIC];
        item.extend_from_slice(&v);
        let p = small_items(item.clone(), true).unwrap();
        assert_eq!(pairs_of(&p), items);
        assert_eq!(p.item_len(), item.len());
        for room in [1, 7, 64, 300] {
            let mut roomy = item.clone();
            roomy.resize(item.len() + room, 0);
            let p = small_items(roomy.clone(), true).unwrap();
            assert_eq!(pairs_of(&p), items, "room {room}");
            assert_eq!(p.item_len(), item.len());
            *roomy.last_mut().unwrap() = 1;
            assert!(small_items(roomy, true).is_none(), "room {room}");
        }
        assert!(small_items(Vec::new(), true).is_none());
        assert!(small_items(vec![HASH_MAGIC], true).is_none());
        assert!(small_items(item[..item.len() - 1].to_vec(), true).is_none());
    }

    /// One-element changes (`change_one`, the one-field HSET / HDEL /
    /// SADD / SREM) mixed with `Coll`'s on hashes, sets and intsets big
    /// enough to carry spare room: contents, order and encoding match a
    /// model after every change, in both modes; the key keeps its expiry
    /// and gets a new version on every write; under Nibble-2 the item
    /// has room (zero bytes after the pairs) and most inserts keep its
    /// size (in-place overwrites), under Nibble it is the pairs alone.
    #[test]
    fn one_element_changes_match_a_model() {
        let limits = Limits {
            entries: 120,
            value: 40,
            intset: 150,
        };
        for (mode, store) in both_modes().iter().enumerate() {
            for (kind, ints) in [(Kind::Hash, false), (Kind::Set, false), (Kind::Set, true)] {
                let key = format!("one{kind:?}{ints}").into_bytes();
                // Insertion order (what HGETALL returns for a small one).
                let mut model: Vec<Pair> = Vec::new();
                let mut large = false;
                let mut kept_size = 0;
                let mut x = 0x9E37_79B9_u64 + mode as u64;
                let expiry = nibble::object::now_ms() + 3_600_000;
                for step in 0..3000u32 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = x >> 33;
                    let n = r % 140;
                    let e = if ints || r.is_multiple_of(17) && kind == Kind::Hash {
                        n.to_string().into_bytes()
                    } else {
                        format!("element:{n:06}").into_bytes()
                    };
                    let v = if kind == Kind::Hash {
                        vec![b'a' + (r % 26) as u8; (r >> 8) as usize % 24]
                    } else {
                        Vec::new()
                    };
                    let mut before = Vec::new();
                    let old = store.get_into(&key, &mut before).unwrap();
                    let remove = (r >> 16).is_multiple_of(5);
                    let pos = model.iter().position(|(a, _)| *a == e);
                    let via_coll = (r >> 20).is_multiple_of(4);
                    let got = if via_coll {
                        let mut c = open_or_new(store, &key, kind, limits).unwrap();
                        let got = if remove {
                            c.remove(&e).unwrap()
                        } else {
                            c.insert(&e, &v).unwrap()
                        };
                        assert!(c.commit().unwrap());
                        got
                    } else {
                        let v = (!remove).then_some(&v[..]);
                        change_one(store, limits, &key, kind, &e, v).unwrap()
                    };
                    let changed = match (remove, pos) {
                        (true, Some(i)) => {
                            model.remove(i);
                            assert!(got, "step {step}");
                            true
                        }
                        (true, None) => {
                            assert!(!got, "step {step}");
                            false
                        }
                        (false, Some(i)) => {
                            assert!(!got, "step {step}");
                            let same = model[i].1 == v;
                            model[i].1 = v.clone();
                            !same
                        }
                        (false, None) => {
                            assert!(got, "step {step}");
                            if ints {
                                let at = model
                                    .iter()
                                    .position(|(a, _)| is_int(a) > is_int(&e))
                                    .unwrap_or(model.len());
                                model.insert(at, (e.clone(), v.clone()));
                            } else {
                                model.push((e.clone(), v.clone()));
                            }
                            true
                        }
                    };
                    let mut after = Vec::new();
                    let Some(m) = store.get_into(&key, &mut after).unwrap() else {
                        assert!(model.is_empty(), "step {step}");
                        large = false;
                        continue;
                    };
                    match old {
                        Some(old) => {
                            assert_eq!(m.expiry_ms, Some(expiry), "step {step}");
                            // (A large one's root keeps its version
                            // when only a bucket changed.)
                            if !large {
                                assert_eq!(m.version != old.version, changed, "step {step}");
                            }
                        }
                        None => assert!(store.set_expiry(&key, Some(expiry)).unwrap()),
                    }
                    let mut c = open(store, &key, kind, limits).unwrap().unwrap();
                    assert_eq!(c.len(), model.len() as u64, "step {step}");
                    let mut all = c.all().unwrap();
                    large |= c.encoding() == "hashtable";
                    if large {
                        all.sort();
                        let mut want = model.clone();
                        want.sort();
                        assert_eq!(all, want, "step {step}");
                        continue;
                    }
                    assert_eq!(all, model, "step {step}");
                    assert_eq!(c.encoding(), if ints { "intset" } else { "listpack" });
                    let exact = 5 + model
                        .iter()
                        .map(|(a, b)| {
                            4 + a.len() + if kind == Kind::Hash { 4 + b.len() } else { 0 }
                        })
                        .sum::<usize>();
                    if mode == 1 {
                        assert!(after.len() >= exact, "step {step}");
                        assert!(after[exact..].iter().all(|&b| b == 0), "step {step}");
                        kept_size += usize::from(
                            changed && !remove && pos.is_none() && before.len() == after.len(),
                        );
                    } else {
                        assert_eq!(after.len(), exact, "step {step}");
                    }
                }
                if mode == 1 {
                    assert!(kept_size > 100, "{kind:?} {ints}: {kept_size} in place");
                }
            }
        }
    }

    /// Several inserts, overwrites and removes per command on a large
    /// hash, with values long enough that a bucket outgrows its room: on
    /// Nibble-2 the first change of a bucket is written in place at once
    /// (`Coll::change_bucket_in_place`), a later one in the same command
    /// goes to the cached bucket, a grown or emptied one to the commit;
    /// the collection matches a model after every command, in both
    /// modes, and the count in the root stays right.
    #[test]
    fn several_changes_per_command_match_a_model() {
        use std::collections::BTreeMap;
        let limits = Limits {
            entries: 4,
            value: 8,
            intset: 0,
        };
        for store in &both_modes() {
            let key = b"multi".to_vec();
            let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
            let mut x = 0x1234_5678_u64;
            for round in 0..400u32 {
                let mut c = open_or_new(store, &key, Kind::Hash, limits).unwrap();
                for _ in 0..1 + round % 5 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let r = x >> 33;
                    let e = format!("f{}", r % 700).into_bytes();
                    if (r >> 10).is_multiple_of(4) {
                        assert_eq!(c.remove(&e).unwrap(), model.remove(&e).is_some());
                    } else {
                        let v = vec![b'a' + (r % 26) as u8; (r >> 12) as usize % 90];
                        let new = c.insert(&e, &v).unwrap();
                        assert_eq!(new, model.insert(e, v).is_none());
                    }
                }
                assert!(c.commit().unwrap());
                let mut c = open(store, &key, Kind::Hash, limits).unwrap().unwrap();
                assert_eq!(c.len(), model.len() as u64, "round {round}");
                let all: BTreeMap<_, _> = c.all().unwrap().into_iter().collect();
                assert_eq!(all, model, "round {round}");
            }
        }
    }

    /// Random inserts, overwrites and removes on a large-capable hash and
    /// set (thresholds of 4, so both representations and many splits are
    /// exercised), against a `BTreeMap` model: lengths, lookups, a full
    /// read and a full SCAN agree after every command. Every other round
    /// runs on Nibble-2, where buckets carry spare room.
    #[test]
    fn collections_match_a_model() {
        use proptest::prelude::*;
        use std::collections::BTreeMap;
        let stores = both_modes();
        let limits = Limits {
            entries: 4,
            value: 8,
            intset: 4,
        };
        let op = (0u8..6, 0u32..300, 0usize..12);
        let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
            cases: 24,
            failure_persistence: None,
            ..Default::default()
        });
        let round = std::cell::Cell::new(0u32);
        runner
            .run(&proptest::collection::vec(op, 1..400), |ops| {
                round.set(round.get() + 1);
                let store = &stores[round.get() as usize % 2];
                for kind in [Kind::Hash, Kind::Set] {
                    let key = format!("k{}{kind:?}", round.get()).into_bytes();
                    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
                    for &(o, e, vlen) in &ops {
                        // Integers and words, so intsets turn to listpacks.
                        let e = if e % 3 == 0 {
                            format!("w{e}").into_bytes()
                        } else {
                            e.to_string().into_bytes()
                        };
                        let v = if kind == Kind::Hash {
                            vec![b'v'; vlen]
                        } else {
                            Vec::new()
                        };
                        match o {
                            // The one-field HSET/SADD and HDEL/SREM.
                            4 => {
                                let new = change_one(store, limits, &key, kind, &e, Some(&v));
                                prop_assert_eq!(new.unwrap(), model.insert(e.clone(), v).is_none());
                            }
                            5 => {
                                let had = change_one(store, limits, &key, kind, &e, None);
                                prop_assert_eq!(had.unwrap(), model.remove(&e).is_some());
                            }
                            _ => {
                                let mut c = open_or_new(store, &key, kind, limits).unwrap();
                                match o {
                                    0 | 1 => {
                                        let new = c.insert(&e, &v).unwrap();
                                        prop_assert_eq!(new, model.insert(e.clone(), v).is_none());
                                    }
                                    2 => {
                                        let had = c.remove(&e).unwrap();
                                        prop_assert_eq!(had, model.remove(&e).is_some());
                                    }
                                    _ => {
                                        prop_assert_eq!(c.get(&e).unwrap(), model.get(&e).cloned());
                                    }
                                }
                                prop_assert!(c.commit().unwrap());
                            }
                        }
                        let Some(mut c) = open(store, &key, kind, limits).unwrap() else {
                            prop_assert!(model.is_empty());
                            continue;
                        };
                        prop_assert_eq!(c.len(), model.len() as u64);
                        let all: BTreeMap<_, _> = c.all().unwrap().into_iter().collect();
                        prop_assert_eq!(&all, &model);
                        let mut scanned = BTreeMap::new();
                        let mut cursor = 0;
                        loop {
                            let (next, items) = c.scan(cursor, 3).unwrap();
                            scanned.extend(items);
                            if next == 0 {
                                break;
                            }
                            cursor = next;
                        }
                        prop_assert_eq!(&scanned, &model);
                    }
                    // Deleting the key takes every node with it.
                    delete_key(store, &key).unwrap();
                    let mut cursor = 0;
                    loop {
                        let (next, keys) = store.raw_scan(cursor, 1024).unwrap();
                        prop_assert!(keys.iter().all(|k| !is_internal_key(k)), "nodes left");
                        if next == 0 {
                            break;
                        }
                        cursor = next;
                    }
                }
                Ok(())
            })
            .unwrap();
    }
}
