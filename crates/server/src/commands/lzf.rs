//! LZF, the compression Redis applies to strings over 20 bytes in a DUMP
//! payload (and in RDB files): a port of liblzf 3.6's `lzf_compress` as
//! Redis builds it (`HLOG` 16, `VERY_FAST`), so a payload is the same
//! bytes redis-server writes, and `lzf_decompress` for RESTORE.
//!
//! The format: a control byte below 32 starts a run of `ctrl + 1`
//! literal bytes; otherwise its top 3 bits are a length (7 = another byte
//! follows with the rest) and a back reference of `length + 2` bytes at
//! distance `((ctrl & 31) << 8 | next) + 1`. The compressor hashes every
//! 3-byte window into a table of the last position that had that hash
//! and emits a reference when the bytes there match; its quirks are
//! Redis's too and are kept: position 0 is never referenced, a match
//! leaves the last two bytes as literals unless the 16-byte unrolled
//! comparison ran past its bound, and after a match only the two
//! positions before its end are hashed.
//!
//! liblzf leaves the hash table uninitialized (`INIT_HTAB 0`): a stale
//! entry can only produce another valid match. Here the table starts
//! empty, which is what redis-server's output shows in practice (tested
//! against it).

/// log2 of the hash table's slots (`HLOG`).
const HLOG: u32 = 16;
/// Hash table slots.
const HSIZE: usize = 1 << HLOG;
/// Longest literal run.
const MAX_LIT: usize = 1 << 5;
/// Farthest back reference.
const MAX_OFF: usize = 1 << 13;
/// Longest back reference, minus 2.
const MAX_REF: usize = (1 << 8) + (1 << 3);

/// `IDX` of liblzf's `VERY_FAST` mode.
#[inline]
fn idx(h: u32) -> usize {
    ((h >> (3 * 8 - HLOG)).wrapping_sub(h.wrapping_mul(5)) as usize) & (HSIZE - 1)
}

/// The hash table, kept per thread and reused: zeroing (or mapping)
/// 512 KiB per call cost ~50 µs, 50x the compression of a 1 KB value
/// (an RDB save of a million values spent most of its time there). Each
/// entry carries the number of the call that wrote it; an entry of an
/// earlier call reads as empty, so every call starts from an empty table
/// exactly as before (the output is unchanged).
struct Htab {
    call: u64,
    slots: Vec<u64>,
}

impl Htab {
    /// Position + 1 stored in `slot` by this call, 0 if none.
    #[inline]
    fn get(&self, slot: usize) -> usize {
        let e = self.slots[slot];
        if e >> 32 == self.call {
            (e & 0xFFFF_FFFF) as usize
        } else {
            0
        }
    }

    #[inline]
    fn set(&mut self, slot: usize, pos1: u32) {
        self.slots[slot] = (self.call << 32) | u64::from(pos1);
    }
}

thread_local! {
    static HTAB: std::cell::RefCell<Htab> = const {
        std::cell::RefCell::new(Htab { call: 0, slots: Vec::new() })
    };
}

/// `lzf_compress(input, out_len)`: the compressed bytes, or `None` if
/// they would not fit in `out_len` bytes (liblzf's 0).
pub fn compress(input: &[u8], out_len: usize) -> Option<Vec<u8>> {
    HTAB.with(|t| {
        let mut t = t.borrow_mut();
        if t.slots.is_empty() || t.call >= u64::from(u32::MAX) {
            t.slots = vec![0; HSIZE];
            t.call = 0;
        }
        t.call += 1;
        compress_with(input, out_len, &mut t)
    })
}

fn compress_with(input: &[u8], out_len: usize, htab: &mut Htab) -> Option<Vec<u8>> {
    let in_len = input.len();
    if in_len == 0 || out_len == 0 {
        return None;
    }
    // Positions + 1 (0: empty), as liblzf's `ref > in_data` never takes
    // position 0 either.
    // Slack past out_len: the bound checks below are liblzf's, made on
    // positions before writing.
    let mut out = vec![0u8; out_len + 4];
    let frst = |p: usize| (u32::from(input[p]) << 8) | u32::from(input[p + 1]);
    let next = |v: u32, p: usize| (v << 8) | u32::from(input[p + 2]);
    let (mut ip, mut op, mut lit) = (0usize, 1usize, 0usize);
    let in_end = in_len;
    // liblzf reads two bytes here even of a one-byte input; no window
    // exists then and the loop below does not run.
    let mut hval = if in_len >= 2 { frst(0) } else { 0 };
    while in_len >= 3 && ip < in_end - 2 {
        hval = next(hval, ip);
        let slot = idx(hval);
        let r = htab.get(slot);
        htab.set(slot, ip as u32 + 1);
        let matched = r > 1 && {
            let rf = r - 1;
            let off = ip - rf - 1;
            off < MAX_OFF
                && input[rf + 2] == input[ip + 2]
                && input[rf..rf + 2] == input[ip..ip + 2]
        };
        if matched {
            let rf = r - 1;
            let off = ip - rf - 1;
            let mut len = 2usize;
            let maxlen = (in_end - ip - len).min(MAX_REF);
            if op + 3 + 1 >= out_len && op - usize::from(lit == 0) + 3 + 1 >= out_len {
                return None;
            }
            out[op - lit - 1] = (lit as u8).wrapping_sub(1);
            op -= usize::from(lit == 0);
            'cmp: {
                if maxlen > 16 {
                    for _ in 0..16 {
                        len += 1;
                        if input[rf + len] != input[ip + len] {
                            break 'cmp;
                        }
                    }
                }
                loop {
                    len += 1;
                    if !(len < maxlen && input[rf + len] == input[ip + len]) {
                        break;
                    }
                }
            }
            len -= 2;
            ip += 1;
            if len < 7 {
                out[op] = ((off >> 8) + (len << 5)) as u8;
                op += 1;
            } else {
                out[op] = ((off >> 8) + (7 << 5)) as u8;
                out[op + 1] = (len - 7) as u8;
                op += 2;
            }
            out[op] = off as u8;
            op += 1;
            lit = 0;
            op += 1;
            ip += len + 1;
            if ip >= in_end - 2 {
                break;
            }
            ip -= 2;
            hval = frst(ip);
            hval = next(hval, ip);
            htab.set(idx(hval), ip as u32 + 1);
            ip += 1;
            hval = next(hval, ip);
            htab.set(idx(hval), ip as u32 + 1);
            ip += 1;
        } else {
            if op >= out_len {
                return None;
            }
            lit += 1;
            out[op] = input[ip];
            op += 1;
            ip += 1;
            if lit == MAX_LIT {
                out[op - lit - 1] = (lit - 1) as u8;
                lit = 0;
                op += 1;
            }
        }
    }
    if op + 3 > out_len {
        return None;
    }
    while ip < in_end {
        lit += 1;
        out[op] = input[ip];
        op += 1;
        ip += 1;
        if lit == MAX_LIT {
            out[op - lit - 1] = (lit - 1) as u8;
            lit = 0;
            op += 1;
        }
    }
    out[op - lit - 1] = (lit as u8).wrapping_sub(1);
    op -= usize::from(lit == 0);
    out.truncate(op);
    Some(out)
}

/// LZF decompression; `None` unless the output is exactly `len` bytes.
pub fn decompress(mut c: &[u8], len: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(len);
    while let Some((&ctrl, rest)) = c.split_first() {
        c = rest;
        if ctrl < 32 {
            // A literal run of ctrl + 1 bytes.
            let n = usize::from(ctrl) + 1;
            if c.len() < n || out.len() + n > len {
                return None;
            }
            out.extend_from_slice(&c[..n]);
            c = &c[n..];
        } else {
            // A back reference: length (3 bits, or 7 + the next byte) + 2,
            // offset (5 high bits + the next byte) + 1.
            let mut n = usize::from(ctrl >> 5);
            if n == 7 {
                let (&extra, rest) = c.split_first()?;
                c = rest;
                n += usize::from(extra);
            }
            n += 2;
            let (&lo, rest) = c.split_first()?;
            c = rest;
            let back = ((usize::from(ctrl & 0x1f) << 8) | usize::from(lo)) + 1;
            if back > out.len() || out.len() + n > len {
                return None;
            }
            let from = out.len() - back;
            // Byte by byte: the reference may overlap what it writes.
            for i in 0..n {
                out.push(out[from + i]);
            }
        }
    }
    (out.len() == len).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Payload bytes redis-server 7.0.15 wrote for these strings.
    #[test]
    fn compresses_as_redis() {
        let a65 = vec![b'a'; 65];
        assert_eq!(
            compress(&a65, a65.len() - 4).unwrap(),
            b"\x01aa\xe04\x00\x01aa".to_vec()
        );
        let fox = b"the quick brown fox jumps over the lazy dog the quick brown fox";
        assert_eq!(
            compress(fox, fox.len() - 4).unwrap(),
            b"\x1fthe quick brown fox jumps over t \x1e\x07lazy dog`\x0c\xe0\x04+\x01ox".to_vec()
        );
        for input in [&a65[..], fox] {
            let c = compress(input, input.len() - 4).unwrap();
            assert_eq!(decompress(&c, input.len()).unwrap(), input);
        }
    }

    #[test]
    fn incompressible_is_refused() {
        let x: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5a).collect();
        assert_eq!(compress(&x, x.len() - 4), None);
        assert_eq!(decompress(&[0x01, b'a', b'a', 0xC0, 0x01], 9), None);
    }
}
