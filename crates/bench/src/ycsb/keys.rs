//! YCSB's key and value generators: FNV-hashed keys, the scrambled zipfian
//! chooser, and values stamped so every read checks what it got.

use super::*;

/// YCSB's `Utils.fnvhash64`: FNV-1a over the 8 bytes of `val`, low byte
/// first, as a Java `long`, then `Math.abs` (which leaves `Long.MIN_VALUE`
/// negative, as Java does).
pub fn fnvhash64(mut val: i64) -> i64 {
    const FNV_OFFSET_BASIS_64: u64 = 0xCBF2_9CE4_8422_2325;
    const FNV_PRIME_64: u64 = 1_099_511_628_211;
    let mut h = FNV_OFFSET_BASIS_64;
    for _ in 0..8 {
        let octet = (val & 0xff) as u64;
        val >>= 8;
        h ^= octet;
        h = h.wrapping_mul(FNV_PRIME_64);
    }
    (h as i64).wrapping_abs()
}

/// YCSB's `ZipfianGenerator` (Gray et al., "Quickly generating
/// billion-record synthetic databases", SIGMOD 1994) over `0..=items-1`
/// with a precomputed ζ(items).
#[derive(Clone, Copy, Debug)]
pub struct Zipfian {
    pub(super) items: f64,
    pub(super) zetan: f64,
    pub(super) alpha: f64,
    pub(super) eta: f64,
    /// `1 + 0.5^θ`: below it (times ζ(n)) the draw is item 1.
    pub(super) two_cut: f64,
}

impl Zipfian {
    /// `items` items, constant `theta`, ζ(items, theta) = `zetan`.
    pub fn new(items: u64, theta: f64, zetan: f64) -> Zipfian {
        let zeta2theta = 1.0 + 0.5f64.powf(theta);
        let items = items as f64;
        Zipfian {
            items,
            zetan,
            alpha: 1.0 / (1.0 - theta),
            eta: (1.0 - (2.0 / items).powf(1.0 - theta)) / (1.0 - zeta2theta / zetan),
            two_cut: zeta2theta,
        }
    }

    /// The generator `ScrambledZipfianGenerator` wraps: items
    /// `0..=ZIPF_ITEM_COUNT` (YCSB passes min 0, max ITEM_COUNT).
    pub fn ycsb_scrambled_base() -> Zipfian {
        Zipfian::new(ZIPF_ITEM_COUNT + 1, ZIPFIAN_CONSTANT, ZIPF_ZETAN)
    }

    /// The draw for a uniform `u` in `[0, 1)` (YCSB's `nextLong`).
    #[inline]
    pub fn draw(&self, u: f64) -> i64 {
        let uz = u * self.zetan;
        if uz < 1.0 {
            return 0;
        }
        if uz < self.two_cut {
            return 1;
        }
        (self.items * (self.eta * u - self.eta + 1.0).powf(self.alpha)) as i64
    }
}

/// Picks key numbers in `[0, records)`.
#[derive(Clone, Copy, Debug)]
pub struct KeyChooser {
    pub(super) dist: Dist,
    pub(super) records: u64,
    pub(super) zipf: Zipfian,
}

impl KeyChooser {
    pub fn new(dist: Dist, records: u64) -> KeyChooser {
        KeyChooser {
            dist,
            records: records.max(1),
            zipf: Zipfian::ycsb_scrambled_base(),
        }
    }

    #[inline]
    pub fn next(&self, rng: &mut Rng) -> u64 {
        match self.dist {
            Dist::Uniform => rng.range(0, self.records),
            Dist::Zipfian => {
                // ScrambledZipfianGenerator(0, records): itemcount records+1;
                // CoreWorkload redraws keys not yet inserted.
                let itemcount = self.records as i64 + 1;
                loop {
                    let d = self.zipf.draw(rng.next_f64());
                    let k = fnvhash64(d).rem_euclid(itemcount) as u64;
                    if k < self.records {
                        return k;
                    }
                }
            }
        }
    }
}

/// A key built in place, without allocating.
pub struct KeyBuf {
    pub(super) buf: [u8; KEY_BYTES_MAX],
}

impl Default for KeyBuf {
    fn default() -> Self {
        KeyBuf {
            buf: [0; KEY_BYTES_MAX],
        }
    }
}

impl KeyBuf {
    /// YCSB's key of record `keynum`: `"user"` + `fnvhash64(keynum)` in decimal.
    #[inline]
    pub fn ycsb(&mut self, keynum: u64) -> &[u8] {
        let h = fnvhash64(keynum as i64);
        self.buf[..4].copy_from_slice(b"user");
        let mut digits = [0u8; 20];
        let mut n = h.unsigned_abs();
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (n % 10) as u8;
            n /= 10;
            if n == 0 {
                break;
            }
        }
        let mut at = 4;
        if h < 0 {
            self.buf[at] = b'-';
            at += 1;
        }
        let d = &digits[i..];
        self.buf[at..at + d.len()].copy_from_slice(d);
        &self.buf[..at + d.len()]
    }
}

/// A value of `size` bytes of pseudo-random filler.
pub fn filler_value(size: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed ^ 0x5eed);
    (0..size).map(|_| rng.next_u64() as u8).collect()
}

/// Write the key number and a version into a value (`value.len() >= 16`).
#[inline]
pub fn stamp(value: &mut [u8], keynum: u64, version: u64) {
    value[..8].copy_from_slice(&keynum.to_le_bytes());
    value[8..16].copy_from_slice(&version.to_le_bytes());
}

/// Is `v` a value of `size` bytes stamped for `keynum`?
#[inline]
pub fn value_ok(v: &[u8], keynum: u64, size: usize) -> bool {
    v.len() == size && v[..8] == keynum.to_le_bytes()
}

/// Nibble capacity for `records` values of `value_size` bytes.
pub fn capacity_for(records: u64, value_size: usize) -> usize {
    let need = CAPACITY_FACTOR
        * records as f64
        * (KEY_BYTES_MAX + value_size + nibble::object::HEADER_MIN_BYTES) as f64;
    (need as usize).max(MIN_CAPACITY)
}
