//! Redis's encoding tunables, accepted by CONFIG SET and shown by CONFIG
//! GET; the hash, set and sorted set thresholds decide when a collection
//! leaves its one-item form (see `coll`, `zset`), the others have no
//! effect on this server.
//!
//! Redis picks a compact encoding (listpack, intset) for small hashes,
//! sets, sorted sets and lists, and these parameters say how small is
//! small. Client libraries, admin tools and test suites set them (often
//! with `CONFIG SET hash-max-ziplist-entries ...`) and fail if the server
//! refuses. They are validated with redis-server 7.0's ranges and error
//! texts, stored, and echoed back; `hash-max-listpack-*`,
//! `set-max-intset-entries` and `set-max-listpack-*` are read by `coll`
//! on every hash or set write, `zset-max-listpack-*` by `zset` on every
//! sorted set command. A pre-7.0 `ziplist`
//! name is an alias of its `listpack` name, as in Redis: setting either
//! changes both, and CONFIG GET lists both.
//!
//! `appendonly` is stored the same way (`yes` or `no`); the server has no
//! append-only file either way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// How a tunable's value is checked.
#[derive(Clone, Copy)]
enum Kind {
    /// An integer in the inclusive range.
    Int(i64, i64),
    /// A memory value (`64`, `1kb`, `2m`) of at most `i64::MAX` bytes.
    Mem,
    /// `yes` or `no`.
    Bool,
}

/// (name, alias, default, kind). The alias shares the value.
const TUNABLES: &[(&str, Option<&str>, &str, Kind)] = &[
    (
        "hash-max-listpack-entries",
        Some("hash-max-ziplist-entries"),
        "512",
        Kind::Int(0, i64::MAX),
    ),
    (
        "hash-max-listpack-value",
        Some("hash-max-ziplist-value"),
        "64",
        Kind::Mem,
    ),
    (
        "zset-max-listpack-entries",
        Some("zset-max-ziplist-entries"),
        "128",
        Kind::Int(0, i64::MAX),
    ),
    (
        "zset-max-listpack-value",
        Some("zset-max-ziplist-value"),
        "64",
        Kind::Mem,
    ),
    (
        "set-max-intset-entries",
        None,
        "512",
        Kind::Int(0, i64::MAX),
    ),
    (
        "set-max-listpack-entries",
        None,
        "128",
        Kind::Int(0, i64::MAX),
    ),
    ("set-max-listpack-value", None, "64", Kind::Mem),
    (
        "list-max-listpack-size",
        Some("list-max-ziplist-size"),
        "-2",
        Kind::Int(i32::MIN as i64, i32::MAX as i64),
    ),
    (
        "list-compress-depth",
        None,
        "0",
        Kind::Int(0, i32::MAX as i64),
    ),
    ("appendonly", None, "no", Kind::Bool),
];

/// The thresholds `coll` and `zset` read on every hash, set or sorted
/// set command, mirrored in atomics so the request path takes no lock for
/// them.
const HOT: [&str; 7] = [
    "hash-max-listpack-entries",
    "hash-max-listpack-value",
    "set-max-intset-entries",
    "set-max-listpack-entries",
    "set-max-listpack-value",
    "zset-max-listpack-entries",
    "zset-max-listpack-value",
];

/// The tunables' current values.
pub struct Tunables {
    values: Mutex<BTreeMap<&'static str, String>>,
    hot: [AtomicUsize; HOT.len()],
}

impl Default for Tunables {
    fn default() -> Self {
        let values: BTreeMap<&'static str, String> =
            TUNABLES.iter().map(|t| (t.0, t.2.to_string())).collect();
        let hot = HOT.map(|n| AtomicUsize::new(parse_usize(values.get(n))));
        Tunables {
            values: Mutex::new(values),
            hot,
        }
    }
}

fn parse_usize(v: Option<&String>) -> usize {
    v.and_then(|s| s.parse().ok()).unwrap_or(0)
}

impl Tunables {
    /// The entry for `name` (the canonical name or its alias).
    fn find(
        name: &str,
    ) -> Option<&'static (&'static str, Option<&'static str>, &'static str, Kind)> {
        TUNABLES.iter().find(|t| t.0 == name || t.1 == Some(name))
    }

    /// Every name (aliases included) with its value.
    pub fn get_all(&self) -> Vec<(&'static str, String)> {
        let v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for t in TUNABLES {
            let val = v.get(t.0).cloned().unwrap_or_default();
            if let Some(a) = t.1 {
                out.push((a, val.clone()));
            }
            out.push((t.0, val));
        }
        out
    }

    /// The value of the numeric tunable `name` (0 if unset or not a
    /// number): one lock and one parse, for the collection writes that
    /// check the encoding thresholds on every call.
    pub fn get_usize(&self, name: &str) -> usize {
        if let Some(i) = HOT.iter().position(|h| *h == name) {
            return self.hot[i].load(Ordering::Relaxed);
        }
        let v = self.values.lock().unwrap_or_else(|e| e.into_inner());
        parse_usize(v.get(name))
    }

    /// CONFIG SET `name` `value`: `None` if `name` is not a tunable, else
    /// the outcome with redis-server's error text.
    pub fn set(&self, name: &str, value: &str) -> Option<Result<(), String>> {
        let t = Self::find(name)?;
        let failed = |why: &str| {
            format!("ERR CONFIG SET failed (possibly related to argument '{name}') - {why}")
        };
        let stored = match t.3 {
            Kind::Int(lo, hi) => {
                let Ok(n) = value.parse::<i64>() else {
                    return Some(Err(failed("argument couldn't be parsed into an integer")));
                };
                if n < lo || n > hi {
                    return Some(Err(failed(&format!(
                        "argument must be between {lo} and {hi} inclusive"
                    ))));
                }
                n.to_string()
            }
            Kind::Mem => match mem_value(value) {
                Some(n) if n <= i64::MAX as u64 => n.to_string(),
                Some(_) => {
                    return Some(Err(failed(&format!(
                        "argument must be between 0 and {} inclusive",
                        i64::MAX
                    ))))
                }
                None => return Some(Err(failed("argument must be a memory value"))),
            },
            Kind::Bool => match value.to_ascii_lowercase().as_str() {
                v @ ("yes" | "no") => v.to_string(),
                _ => return Some(Err(failed("argument must be 'yes' or 'no'"))),
            },
        };
        if let Some(i) = HOT.iter().position(|h| *h == t.0) {
            self.hot[i].store(parse_usize(Some(&stored)), Ordering::Relaxed);
        }
        self.values
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(t.0, stored);
        Some(Ok(()))
    }
}

/// Redis's `memtoull`: digits and an optional unit (`b`, `k`, `kb`, `m`,
/// `mb`, `g`, `gb`; the `b` forms are powers of 1024).
fn mem_value(v: &str) -> Option<u64> {
    let digits = v.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    let n: u64 = v[..digits].parse().ok()?;
    let mul: u64 = match v[digits..].to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" => 1000,
        "kb" => 1024,
        "m" => 1000 * 1000,
        "mb" => 1024 * 1024,
        "g" => 1000 * 1000 * 1000,
        "gb" => 1024 * 1024 * 1024,
        _ => return None,
    };
    n.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alias_shares_the_value() {
        let t = Tunables::default();
        assert_eq!(t.set("hash-max-ziplist-entries", "7"), Some(Ok(())));
        let all = t.get_all();
        assert!(all.contains(&("hash-max-listpack-entries", "7".into())));
        assert!(all.contains(&("hash-max-ziplist-entries", "7".into())));
        assert!(t.set("list-compress-depth", "-1").unwrap().is_err());
        assert!(t.set("list-max-ziplist-size", "x").unwrap().is_err());
        assert_eq!(t.set("appendonly", "YES"), Some(Ok(())));
        assert!(t.set("nope", "1").is_none());
        assert_eq!(t.set("hash-max-listpack-value", "1kb"), Some(Ok(())));
        assert_eq!(t.get_usize("hash-max-listpack-value"), 1024);
        assert_eq!(t.set("set-max-intset-entries", "7"), Some(Ok(())));
        assert_eq!(t.get_usize("set-max-intset-entries"), 7);
        assert!(t
            .get_all()
            .contains(&("hash-max-ziplist-value", "1024".into())));
        assert!(t.set("hash-max-listpack-value", "x").unwrap().is_err());
    }
}
