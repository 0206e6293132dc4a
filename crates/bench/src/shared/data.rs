//! Keys, values that check themselves, store sizing, and the monotonic clock
//! the processes share.

use super::*;

/// The key of number `n`.
pub(super) fn key(n: u64) -> [u8; KEY_LEN] {
    load::key(n)
}

/// splitmix64: the word stream values are made of.
#[inline]
pub(super) fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Word `i` of key `k`'s value.
#[inline]
pub(super) fn value_word(k: u64, i: u64) -> [u8; 8] {
    mix64(k.wrapping_mul(0x1000_0000_01b3) ^ i.wrapping_mul(0x9e37_79b9)).to_le_bytes()
}

/// Write key `k`'s value (pseudo-random bytes, incompressible) into `buf`.
pub(super) fn fill_value(k: u64, buf: &mut [u8]) {
    for (i, c) in buf.chunks_mut(8).enumerate() {
        let w = value_word(k, i as u64);
        c.copy_from_slice(&w[..c.len()]);
    }
}

/// Whether `v` is key `k`'s value of `len` bytes.
pub(super) fn value_ok(k: u64, v: &[u8], len: usize) -> bool {
    v.len() == len
        && v.chunks(8)
            .enumerate()
            .all(|(i, c)| c == &value_word(k, i as u64)[..c.len()])
}

/// Bytes a store needs per object: the prefix (state word + nibble's wide
/// header, `nibblejmp::layout`), key and value, 8-aligned.
pub(super) fn object_bytes(value_size: usize) -> u64 {
    (OBJ_PREFIX_BYTES + KEY_LEN as u64 + value_size as u64).next_multiple_of(8)
}

/// CLOCK_MONOTONIC in ns (the clock of `Instant`, comparable across
/// processes).
pub(super) fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The `Instant` of CLOCK_MONOTONIC time `ns`.
pub(super) fn instant_at(ns: u64) -> Instant {
    let (now_i, now_ns) = (Instant::now(), mono_ns());
    if ns >= now_ns {
        now_i + Duration::from_nanos(ns - now_ns)
    } else {
        now_i
            .checked_sub(Duration::from_nanos(now_ns - ns))
            .unwrap_or(now_i)
    }
}
