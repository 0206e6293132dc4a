//! Segment heaps and the types that may live in segments.
//!
//! SpaceJMP §4.1 ("Runtime library"): the allocator is built over dlmalloc's
//! `m_space`, "an allocator's internal state \[that\] may be placed at
//! arbitrary locations"; each segment has its own `m_space`, so memory
//! allocated by one process can be freed by another and found again after a
//! restart. Here the state is a [`HeapState`] in the segment header:
//!
//! ```text
//!  header.heap: lock | top | end | free[class] (absolute addresses) | live
//!  data:        [16 B block header: class, magic][payload ...] ...  top→ ... end
//! ```
//!
//! Size classes are powers of two from 16 B (payload + 16 B header); a free
//! block goes on its class's list (the link is written in the payload), a
//! miss bumps `top`. Links are absolute addresses: a segment is always
//! mapped at its base, so a pointer is a pointer in every process. Every
//! operation takes the heap's own cross-process lock (the same robust lock
//! as lockable segments), so two processes may allocate in one non-lockable
//! segment; under the segment's exclusive lock it is uncontended. Power-of-two
//! classes waste up to half of a block; there is no coalescing. That is
//! enough for pointer-rich indexes built once and read often, which is what
//! SpaceJMP targets.
//!
//! # Safety in the type system (§3.3)
//!
//! The paper's compiler pass inserts checks that a pointer is dereferenced
//! only in the VAS it belongs to and that no pointer to another VAS (or to
//! process-private memory) is stored in a segment. Here:
//!
//! - [`SegSafe`] marks types that may be stored in a segment: no pointers to
//!   process-private memory, no destructors. It is implemented for plain
//!   data and for the segment pointer types, and derived for user structs by
//!   [`seg_struct!`](crate::seg_struct), which checks every field.
//! - A [`SegPtr<T>`] is an address, not a reference. It is dereferenced only
//!   through an [`Active`] guard (`ptr.get(&active)`), which checks that the
//!   address lies in a segment of the active VAS and ties the returned
//!   reference to the guard's lifetime: it cannot be used after switching
//!   away. Mutation needs `&mut Active` and a segment attached writable.
//! - [`Active::vcast`] is the paper's `vcast`: a checked conversion of a raw
//!   pointer into a reference valid in the active VAS.

use crate::error::{Error, Result};
use crate::lock::{Mode, RawRwLock};
use crate::vas::Active;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};

/// Number of power-of-two size classes (16 B .. 2^51 B).
pub const CLASSES: usize = 48;
const BLOCK_HDR: u64 = 16;
const MIN_BLOCK: u64 = 16;
const LIVE_MAGIC: u64 = 0x5345_474d_414c_4c4f; // "SEGMALLO"
const FREE_MAGIC: u64 = 0x5345_4746_5245_4544; // "SEGFREED"

/// Allocator state stored in the segment header (`m_space`).
#[repr(C)]
pub struct HeapState {
    lock: RawRwLock,
    top: AtomicU64,
    end: AtomicU64,
    free: [AtomicU64; CLASSES],
    live: AtomicU64,
}

fn class_of(total: u64) -> usize {
    let t = total.max(MIN_BLOCK).next_power_of_two();
    t.trailing_zeros() as usize - MIN_BLOCK.trailing_zeros() as usize
}

fn class_size(c: usize) -> u64 {
    MIN_BLOCK << c
}

impl HeapState {
    pub(crate) fn init(&mut self, start: u64, end: u64) {
        *self.top.get_mut() = start;
        *self.end.get_mut() = end;
    }

    pub(crate) fn copy_from(&mut self, o: &HeapState) {
        *self.top.get_mut() = o.top.load(Ordering::Acquire);
        *self.end.get_mut() = o.end.load(Ordering::Acquire);
        for (d, s) in self.free.iter_mut().zip(&o.free) {
            *d.get_mut() = s.load(Ordering::Acquire);
        }
        *self.live.get_mut() = o.live.load(Ordering::Acquire);
    }

    /// Bytes handed out and not freed (block sizes, headers included).
    pub fn live_bytes(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Bytes never yet handed out.
    pub fn unused_bytes(&self) -> u64 {
        self.end.load(Ordering::Relaxed) - self.top.load(Ordering::Relaxed)
    }

    /// Allocate `size` payload bytes aligned to 16; returns the payload
    /// address. The segment must be mapped writable.
    pub(crate) fn alloc(&self, size: u64) -> Option<u64> {
        let total = size.checked_add(BLOCK_HDR)?;
        let c = class_of(total);
        if c >= CLASSES {
            return None;
        }
        self.lock.lock(Mode::Exclusive, None).ok()?;
        let head = self.free[c].load(Ordering::Relaxed);
        let block = if head != 0 {
            // SAFETY: `head` is a free block of class `c` in this segment,
            // which is mapped writable; its payload holds the next link.
            let next = unsafe { *((head + BLOCK_HDR) as *const u64) };
            self.free[c].store(next, Ordering::Relaxed);
            Some(head)
        } else {
            let top = self.top.load(Ordering::Relaxed);
            let sz = class_size(c);
            if top
                .checked_add(sz)
                .is_some_and(|e| e <= self.end.load(Ordering::Relaxed))
            {
                self.top.store(top + sz, Ordering::Relaxed);
                Some(top)
            } else {
                None
            }
        };
        if let Some(b) = block {
            // SAFETY: `b` is the start of a block of at least 16 bytes in the
            // writable data area of this segment, owned by us now.
            unsafe {
                *(b as *mut u64) = c as u64;
                *((b + 8) as *mut u64) = LIVE_MAGIC;
            }
            self.live.fetch_add(class_size(c), Ordering::Relaxed);
        }
        self.lock.unlock(Mode::Exclusive);
        block.map(|b| b + BLOCK_HDR)
    }

    /// Free a payload address returned by `alloc` (from any process).
    pub(crate) fn free(&self, payload: u64) -> Result<()> {
        let b = payload - BLOCK_HDR;
        self.lock.lock(Mode::Exclusive, None)?;
        // SAFETY: the caller checked that `payload` lies in this segment's
        // writable data area; the block header precedes it.
        let (c, magic) = unsafe { (*(b as *const u64), *((b + 8) as *const u64)) };
        let res = if magic != LIVE_MAGIC || c as usize >= CLASSES {
            Err(Error::BadPointer { addr: payload })
        } else {
            // SAFETY: the block is live and ours to free; its payload has
            // room for the link.
            unsafe {
                *((b + 8) as *mut u64) = FREE_MAGIC;
                *(payload as *mut u64) = self.free[c as usize].load(Ordering::Relaxed);
            }
            self.free[c as usize].store(b, Ordering::Relaxed);
            self.live
                .fetch_sub(class_size(c as usize), Ordering::Relaxed);
            Ok(())
        };
        self.lock.unlock(Mode::Exclusive);
        res
    }
}

/// Types that may be stored in a segment: no pointers into process-private
/// memory (heap `Box`, `Vec`, `String`, references), no destructors.
///
/// # Safety
///
/// Implement only for types whose every field is itself `SegSafe`; use
/// [`seg_struct!`](crate::seg_struct), which checks this at compile time.
pub unsafe trait SegSafe: Copy + 'static {}

macro_rules! seg_safe_prims {
    ($($t:ty),*) => { $(
        // SAFETY: plain data without pointers.
        unsafe impl SegSafe for $t {}
    )* };
}
seg_safe_prims!(
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    bool,
    char,
    ()
);

// SAFETY: an array of segment-safe values is segment-safe.
unsafe impl<T: SegSafe, const N: usize> SegSafe for [T; N] {}
// SAFETY: an option of a segment-safe value is segment-safe.
unsafe impl<T: SegSafe> SegSafe for Option<T> {}
// SAFETY: tuples of segment-safe values.
unsafe impl<A: SegSafe, B: SegSafe> SegSafe for (A, B) {}
// SAFETY: tuples of segment-safe values.
unsafe impl<A: SegSafe, B: SegSafe, C: SegSafe> SegSafe for (A, B, C) {}

/// Define a `#[repr(C)]`, `Copy` struct that may be stored in segments;
/// every field type must be [`SegSafe`] (checked at compile time).
///
/// ```
/// spacejmp::seg_struct! {
///     pub struct Node { pub key: u64, pub next: spacejmp::SegPtr<Node> }
/// }
/// ```
#[macro_export]
macro_rules! seg_struct {
    ($(#[$m:meta])* $vis:vis struct $name:ident { $($fvis:vis $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Clone, Copy, Debug)]
        $vis struct $name { $($fvis $field: $ty),* }
        const _: () = {
            fn _assert_seg_safe<T: $crate::SegSafe>() {}
            fn _check() { $(_assert_seg_safe::<$ty>();)* }
        };
        // SAFETY: every field is SegSafe (checked above) and the struct is
        // Copy, so it has no destructor.
        unsafe impl $crate::SegSafe for $name {}
    };
}

/// An address in a segment, typed. Copy, comparable, and meaningful in every
/// process (segments are always mapped at their base). Null is 0.
#[repr(C)]
pub struct SegPtr<T> {
    addr: u64,
    _t: PhantomData<T>,
}

impl<T> Clone for SegPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SegPtr<T> {}
impl<T> PartialEq for SegPtr<T> {
    fn eq(&self, o: &Self) -> bool {
        self.addr == o.addr
    }
}
impl<T> Eq for SegPtr<T> {}
impl<T> std::fmt::Debug for SegPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SegPtr({:#x})", self.addr)
    }
}
// SAFETY: a SegPtr points into a segment, never into private memory.
unsafe impl<T: 'static> SegSafe for SegPtr<T> {}

impl<T> SegPtr<T> {
    /// The null pointer.
    pub const fn null() -> Self {
        SegPtr {
            addr: 0,
            _t: PhantomData,
        }
    }
    /// Whether this is null.
    pub fn is_null(self) -> bool {
        self.addr == 0
    }
    /// The address.
    pub fn addr(self) -> u64 {
        self.addr
    }
    /// A pointer from a raw address (not checked until dereferenced).
    pub fn from_addr(addr: u64) -> Self {
        SegPtr {
            addr,
            _t: PhantomData,
        }
    }
}

impl<T: SegSafe> SegPtr<T> {
    /// Dereference in the active VAS (checked: the whole `T` must lie in one
    /// of its segments and be aligned).
    pub fn get<'a>(self, a: &'a Active<'_>) -> Result<&'a T> {
        a.check(
            self.addr,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
            false,
        )?;
        // SAFETY: the range is mapped in the active VAS for at least the
        // guard's lifetime, aligned, and `T: SegSafe` is plain data for which
        // any bit pattern written through this API is valid.
        Ok(unsafe { &*(self.addr as *const T) })
    }

    /// Mutable dereference; the segment must be attached writable.
    pub fn get_mut<'a>(self, a: &'a mut Active<'_>) -> Result<&'a mut T> {
        a.check(
            self.addr,
            std::mem::size_of::<T>() as u64,
            std::mem::align_of::<T>() as u64,
            true,
        )?;
        // SAFETY: as in `get`, and `&mut Active` makes this the only live
        // reference into the VAS from this thread; other threads/processes
        // are excluded by the segment's exclusive lock (lockable segments).
        Ok(unsafe { &mut *(self.addr as *mut T) })
    }
}

/// The issue's name for an owned allocation in a segment: a [`SegPtr`]
/// returned by [`Active::alloc`] and released with [`Active::free`] (no
/// destructor runs; segment memory outlives processes).
pub type SegBox<T> = SegPtr<T>;

/// A growable array whose buffer lives in the segment heap.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegVec<T> {
    ptr: u64,
    len: u64,
    cap: u64,
    _t: PhantomData<T>,
}
// SAFETY: the fields are plain integers (the buffer is named by its segment
// address, not a process pointer), the type is `Copy` without a destructor,
// and the elements are themselves `SegSafe`.
unsafe impl<T: SegSafe> SegSafe for SegVec<T> {}

impl<T: SegSafe> Default for SegVec<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: SegSafe> SegVec<T> {
    /// An empty vector (allocates on first push).
    pub const fn new() -> Self {
        SegVec {
            ptr: 0,
            len: 0,
            cap: 0,
            _t: PhantomData,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A vector in segment `seg` holding a copy of `items`.
    pub fn from_slice(a: &mut Active<'_>, seg: &str, items: &[T]) -> Result<Self> {
        if std::mem::align_of::<T>() > 16 {
            return Err(Error::InvalidArgument("alignment above 16".into()));
        }
        let mut v = Self::new();
        if !items.is_empty() {
            let bytes = std::mem::size_of_val(items) as u64;
            v.ptr = a.alloc_raw(seg, bytes.max(1))?;
            // SAFETY: `v.ptr` is a fresh writable block of `bytes` bytes,
            // 16-aligned (enough for T up to 16-byte alignment, checked by
            // alloc_raw's caller contract below).
            unsafe {
                std::ptr::copy_nonoverlapping(items.as_ptr(), v.ptr as *mut T, items.len());
            }
            v.len = items.len() as u64;
            v.cap = v.len;
        }
        Ok(v)
    }

    /// The elements, valid while `a` is active.
    pub fn as_slice<'a>(&self, a: &'a Active<'_>) -> Result<&'a [T]> {
        if self.len == 0 {
            return Ok(&[]);
        }
        let bytes = self.len * std::mem::size_of::<T>() as u64;
        a.check(self.ptr, bytes, std::mem::align_of::<T>() as u64, false)?;
        // SAFETY: checked to lie in the active VAS; `len` elements were
        // initialized by push/from_slice.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr as *const T, self.len as usize) })
    }

    /// Append, growing the buffer in segment `seg`.
    pub fn push(&mut self, a: &mut Active<'_>, seg: &str, v: T) -> Result<()> {
        if std::mem::align_of::<T>() > 16 {
            return Err(Error::InvalidArgument("alignment above 16".into()));
        }
        if self.len == self.cap {
            let ncap = (self.cap * 2).max(4);
            let sz = ncap * std::mem::size_of::<T>() as u64;
            let np = a.alloc_raw(seg, sz.max(1))?;
            if self.ptr != 0 {
                a.check(
                    self.ptr,
                    self.len * std::mem::size_of::<T>() as u64,
                    1,
                    true,
                )?;
                // SAFETY: both ranges are in writable segments of the active
                // VAS and do not overlap (np is a fresh block).
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        self.ptr as *const T,
                        np as *mut T,
                        self.len as usize,
                    )
                };
                a.free_raw(self.ptr)?;
            }
            self.ptr = np;
            self.cap = ncap;
        }
        // SAFETY: `ptr` has room for `cap > len` elements in a writable
        // segment of the active VAS.
        unsafe { (self.ptr as *mut T).add(self.len as usize).write(v) };
        self.len += 1;
        Ok(())
    }

    /// Free the buffer.
    pub fn free(&mut self, a: &mut Active<'_>) -> Result<()> {
        if self.ptr != 0 {
            a.free_raw(self.ptr)?;
        }
        *self = Self::new();
        Ok(())
    }
}

/// A UTF-8 string in a segment.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SegStr(SegVec<u8>);
// SAFETY: the only field is a `SegVec<u8>`, which is `SegSafe`.
unsafe impl SegSafe for SegStr {}

impl SegStr {
    /// Copy `s` into segment `seg`.
    pub fn new(a: &mut Active<'_>, seg: &str, s: &str) -> Result<SegStr> {
        Ok(SegStr(SegVec::from_slice(a, seg, s.as_bytes())?))
    }
    /// The string, valid while `a` is active.
    pub fn as_str<'a>(&self, a: &'a Active<'_>) -> Result<&'a str> {
        let b = self.0.as_slice(a)?;
        std::str::from_utf8(b).map_err(|_| Error::BadPointer { addr: self.0.ptr })
    }
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }
    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MapNode<V> {
    next: u64,
    hash: u64,
    key_ptr: u64,
    key_len: u64,
    val: V,
}

/// A chained hash map from byte strings to `V` whose table, nodes and keys
/// all live in one segment. Built once by a writer, read in place by any
/// process that switches into a VAS holding the segment.
///
/// The `SegMap` value itself is a small `Copy` header (table address, size,
/// length). When it is stored in the segment (e.g. under the root), update it
/// by copying it out, inserting, and writing it back — the guard cannot be
/// borrowed mutably twice:
///
/// ```ignore
/// let mut m = root.get(&a)?.map;
/// m.insert(&mut a, b"k", 1)?;
/// root.get_mut(&mut a)?.map = m;
/// ```
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SegMap<V> {
    seg_base: u64,
    buckets: u64,
    nbuckets: u64,
    len: u64,
    _v: PhantomData<V>,
}
// SAFETY: all memory referenced is in the segment.
unsafe impl<V: SegSafe> SegSafe for SegMap<V> {}

fn fnv(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= b as u64;
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h ^ (h >> 29)
}

impl<V: SegSafe> SegMap<V> {
    /// An empty map whose storage will be allocated in segment `seg`.
    pub fn new(a: &mut Active<'_>, seg: &str, buckets: u64) -> Result<Self> {
        let n = buckets.max(16).next_power_of_two();
        let p = a.alloc_raw(seg, n * 8)?;
        // SAFETY: fresh writable block of n*8 bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, (n * 8) as usize) };
        Ok(SegMap {
            seg_base: a.seg_base(seg)?,
            buckets: p,
            nbuckets: n,
            len: 0,
            _v: PhantomData,
        })
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// Whether empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check_table(&self, a: &Active<'_>, write: bool) -> Result<()> {
        a.check(self.buckets, self.nbuckets * 8, 8, write)
    }

    /// Insert or replace.
    pub fn insert(&mut self, a: &mut Active<'_>, key: &[u8], val: V) -> Result<()> {
        self.check_table(a, true)?;
        let seg = a.seg_name_at(self.seg_base)?;
        if self.len >= self.nbuckets {
            self.grow(a)?;
        }
        let h = fnv(key);
        let slot = self.buckets + (h & (self.nbuckets - 1)) * 8;
        // SAFETY: the table and every node reachable from it lie in the
        // map's segment, checked writable above and mapped while `a` is.
        unsafe {
            let mut n = *(slot as *const u64);
            while n != 0 {
                let node = &mut *(n as *mut MapNode<V>);
                if node.hash == h
                    && std::slice::from_raw_parts(node.key_ptr as *const u8, node.key_len as usize)
                        == key
                {
                    node.val = val;
                    return Ok(());
                }
                n = node.next;
            }
        }
        let kp = a.alloc_raw(&seg, (key.len() as u64).max(1))?;
        let np = a.alloc_raw(&seg, std::mem::size_of::<MapNode<V>>() as u64)?;
        // SAFETY: fresh writable blocks of the requested sizes; the slot is
        // in the checked table.
        unsafe {
            std::ptr::copy_nonoverlapping(key.as_ptr(), kp as *mut u8, key.len());
            (np as *mut MapNode<V>).write(MapNode {
                next: *(slot as *const u64),
                hash: h,
                key_ptr: kp,
                key_len: key.len() as u64,
                val,
            });
            *(slot as *mut u64) = np;
        }
        self.len += 1;
        Ok(())
    }

    fn grow(&mut self, a: &mut Active<'_>) -> Result<()> {
        let seg = a.seg_name_at(self.seg_base)?;
        let n = self.nbuckets * 2;
        let p = a.alloc_raw(&seg, n * 8)?;
        // SAFETY: fresh table of n*8 bytes; old nodes are in the same
        // writable segment and are relinked, not copied.
        unsafe {
            std::ptr::write_bytes(p as *mut u8, 0, (n * 8) as usize);
            for i in 0..self.nbuckets {
                let mut node = *((self.buckets + i * 8) as *const u64);
                while node != 0 {
                    let nd = &mut *(node as *mut MapNode<V>);
                    let next = nd.next;
                    let s = p + (nd.hash & (n - 1)) * 8;
                    nd.next = *(s as *const u64);
                    *(s as *mut u64) = node;
                    node = next;
                }
            }
        }
        a.free_raw(self.buckets)?;
        self.buckets = p;
        self.nbuckets = n;
        Ok(())
    }

    /// Look up `key`; the value reference is valid while `a` is active.
    pub fn get<'a>(&self, a: &'a Active<'_>, key: &[u8]) -> Result<Option<&'a V>> {
        if self.nbuckets == 0 {
            return Ok(None);
        }
        self.check_table(a, false)?;
        let seg_end = a.seg_end_at(self.seg_base)?;
        let h = fnv(key);
        // SAFETY: the table is checked to be in the active VAS; nodes were
        // written by `insert` in the same segment, and each node address is
        // range-checked against the segment before it is read.
        unsafe {
            let mut n = *((self.buckets + (h & (self.nbuckets - 1)) * 8) as *const u64);
            while n != 0 {
                if n < self.seg_base || n + std::mem::size_of::<MapNode<V>>() as u64 > seg_end {
                    return Err(Error::BadPointer { addr: n });
                }
                let node = &*(n as *const MapNode<V>);
                if node.key_ptr < self.seg_base || node.key_ptr + node.key_len > seg_end {
                    return Err(Error::BadPointer { addr: node.key_ptr });
                }
                if node.hash == h
                    && node.key_len as usize == key.len()
                    && std::slice::from_raw_parts(node.key_ptr as *const u8, key.len()) == key
                {
                    return Ok(Some(&node.val));
                }
                n = node.next;
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes() {
        assert_eq!(class_of(1), 0);
        assert_eq!(class_of(16), 0);
        assert_eq!(class_of(17), 1);
        assert_eq!(class_size(class_of(4096 + 16)), 8192);
    }
}
