//! INCRBYFLOAT and HINCRBYFLOAT arithmetic in C's `long double`, exactly as
//! redis-server computes and prints it (`csrc/longdouble.c`).
//!
//! Redis parses the stored value and the increment with `strtold`, adds
//! them in `long double` (x87 80-bit on x86-64) and prints the sum with
//! `%.17Lf` minus trailing zeros, so `0.1 + 0.2` is `0.3` and
//! `1e308 + 1e308` is a 309-digit integer, where 64-bit floats give
//! `0.30000000000000004` and infinity. The C helper runs the same
//! expressions, so the results are redis-server's bit for bit on the same
//! platform.

/// Why an increment failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncrError {
    /// The current value is not a float.
    Current,
    /// The increment is not a float.
    Increment,
    /// The increment is NaN or infinite (HINCRBYFLOAT checks this first).
    IncrementNotFinite,
    /// The sum is NaN or infinite.
    Result,
}

/// Longest text the helper writes (redis's MAX_LONG_DOUBLE_CHARS).
const LD_MAX_CHARS: usize = 5 * 1024;

extern "C" {
    fn nibble_ld_incr(
        cur: *const u8,
        cur_len: usize,
        incr: *const u8,
        incr_len: usize,
        check_incr: i32,
        out: *mut u8,
        cap: usize,
    ) -> std::ffi::c_long;
}

/// `cur` (`None`: missing, 0) plus `incr`, formatted as redis does.
/// `check_incr`: refuse an infinite increment first (HINCRBYFLOAT).
pub fn incr(cur: Option<&[u8]>, incr: &[u8], check_incr: bool) -> Result<String, IncrError> {
    let mut out = vec![0u8; LD_MAX_CHARS];
    let (cp, cl) = cur.map_or((std::ptr::null(), 0), |c| (c.as_ptr(), c.len()));
    // SAFETY: every pointer is valid for the length passed with it (`cur`
    // may be null with length 0, which the helper reads as "missing"); the
    // helper writes at most `cap` bytes to `out` and reads only the given
    // lengths.
    let n = unsafe {
        nibble_ld_incr(
            cp,
            cl,
            incr.as_ptr(),
            incr.len(),
            i32::from(check_incr),
            out.as_mut_ptr(),
            out.len(),
        )
    };
    match n {
        -1 => Err(IncrError::Current),
        -2 => Err(IncrError::Increment),
        -3 => Err(IncrError::IncrementNotFinite),
        n if n < 0 => Err(IncrError::Result),
        n => {
            out.truncate(n as usize);
            Ok(String::from_utf8(out).unwrap_or_default())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn as_redis_prints() {
        assert_eq!(incr(Some(b"0.1"), b"0.2", false).unwrap(), "0.3");
        assert_eq!(incr(None, b"10.5", false).unwrap(), "10.5");
        assert_eq!(incr(Some(b"5.0e3"), b"2.0e2", false).unwrap(), "5200");
        assert_eq!(incr(Some(b"1"), b"-1", false).unwrap(), "0");
        assert_eq!(incr(Some(b"x"), b"1", false), Err(IncrError::Current));
        assert_eq!(incr(Some(b"1"), b" 1", false), Err(IncrError::Increment));
        assert_eq!(incr(None, b"+inf", false), Err(IncrError::Result));
        assert_eq!(
            incr(None, b"+inf", true),
            Err(IncrError::IncrementNotFinite)
        );
        assert_eq!(incr(Some(b"1e308"), b"1e308", false).unwrap().len(), 309);
    }
}
