//! Redis's glob matching (`stringmatchlen`) for KEYS and SCAN MATCH.
//!
//! `*` matches any run, `?` one byte, `[abc]`, `[^abc]` and `[a-z]` a class,
//! and `\x` the byte `x`. Matching is on bytes. The recursion for `*` is
//! bounded by trying each suffix in a loop with backtracking over the last
//! star only, so a hostile pattern like `*a*a*a*a*b` stays linear-ish
//! (the classic two-pointer wildcard algorithm, extended with classes).

/// Match one class starting after `[`; returns (matched, bytes of pattern used).
fn class(p: &[u8], c: u8) -> (bool, usize) {
    let mut i = 0;
    let negate = p.first() == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut hit = false;
    loop {
        match p.get(i) {
            None => break,
            Some(b']') => {
                i += 1;
                break;
            }
            Some(b'\\') if i + 1 < p.len() => {
                if p[i + 1] == c {
                    hit = true;
                }
                i += 2;
            }
            // As stringmatchlen: a range needs three bytes left, and its end
            // may be `]` (`[a-]` is a..=']').
            Some(&lo) if p.get(i + 1) == Some(&b'-') && i + 2 < p.len() => {
                let hi = p[i + 2];
                let (a, b) = if lo <= hi { (lo, hi) } else { (hi, lo) };
                if a <= c && c <= b {
                    hit = true;
                }
                i += 3;
            }
            Some(&x) => {
                if x == c {
                    hit = true;
                }
                i += 1;
            }
        }
    }
    (hit != negate, i)
}

/// Whether `s` matches the glob `pat`.
pub fn matches(pat: &[u8], s: &[u8]) -> bool {
    let (mut p, mut i) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while i < s.len() {
        let step = match pat.get(p) {
            Some(b'*') => {
                while pat.get(p) == Some(&b'*') {
                    p += 1;
                }
                if p == pat.len() {
                    return true;
                }
                star = Some((p, i));
                continue;
            }
            Some(b'?') => Some(1),
            Some(b'[') => {
                let (hit, used) = class(&pat[p + 1..], s[i]);
                hit.then_some(1 + used)
            }
            Some(b'\\') if p + 1 < pat.len() => (pat[p + 1] == s[i]).then_some(2),
            Some(&c) => (c == s[i]).then_some(1),
            None => None,
        };
        match step {
            Some(n) => {
                p += n;
                i += 1;
            }
            None => match star {
                Some((sp, si)) => {
                    p = sp;
                    i = si + 1;
                    star = Some((sp, si + 1));
                }
                None => return false,
            },
        }
    }
    pat[p.min(pat.len())..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs() {
        assert!(matches(b"*", b"anything"));
        assert!(matches(b"h?llo", b"hello"));
        assert!(matches(b"h*llo", b"heeeello"));
        assert!(matches(b"h[ae]llo", b"hallo"));
        assert!(!matches(b"h[^e]llo", b"hello"));
        assert!(matches(b"h[a-b]llo", b"hbllo"));
        assert!(matches(b"key:*", b"key:1"));
        assert!(!matches(b"key:*", b"kex:1"));
        assert!(matches(b"a\\*b", b"a*b"));
        assert!(!matches(b"abc", b"ab"));
        assert!(matches(b"*a*a*b", b"aaaaaaab"));
        // Unterminated class and a range ending in `]`, as stringmatchlen.
        assert!(matches(b"[a-", b"a"));
        assert!(matches(b"[a-", b"-"));
        assert!(!matches(b"[a-", b"b"));
        assert!(matches(b"[a-]", b"_"));
    }
}
