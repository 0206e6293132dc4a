//! RDB snapshots: SAVE, BGSAVE and the import of a `dump.rdb` at start,
//! in the file format redis-server 7.0 writes and reads (RDB version 10).
//!
//! ## Why a log-structured store snapshots without fork
//!
//! Redis's BGSAVE forks: the child sees a frozen copy of the parent's
//! memory and writes it out, and every page a client writes during the
//! save is copied by the kernel — under a write-heavy load RSS can
//! approach twice the data. That buys a point-in-time snapshot.
//!
//! Here the engine is already safe to read concurrently: readers run
//! under epochs and never see a torn value, and the index has a cursor
//! that returns every key present for the whole walk (`Engine::scan`). So
//! BGSAVE is a plain thread that walks the index with that cursor, reads
//! each key (value, type, expiry) and streams it to a temp file through
//! a 1 MiB buffer, while the workers keep serving. Nothing is copied but
//! the key being written; memory grows by the buffer and a set of 16-byte
//! key fingerprints (the local engine's cursor may return a key twice
//! while its index grows, and redis-server refuses a file that holds a
//! key twice), not by a copy of the store.
//! The thread runs at a lower priority (nice +10) so the workers win the
//! CPU when they need it.
//!
//! ```text
//!  client writes  ──▶ workers ──▶ engine (epochs, per-key versions)
//!                                   ▲ scan(cursor, 1024), get_into(key)
//!  BGSAVE ──▶ thread "nibble-bgsave" ┘──▶ Writer (1 MiB chunks, crc64)
//!                                         ──▶ DIR/temp-PID-N.rdb
//!                                         ──▶ fsync, rename to DIR/dump.rdb, fsync DIR
//! ```
//!
//! ## What the snapshot is (and is not)
//!
//! Each key is saved as it was at one instant during the save, whole
//! (never a torn value, a hash never half-updated), with the expiry it
//! had at that instant. Keys present from the start to the end of the
//! save are all in the file; a key created or deleted during the save
//! may or may not be. It is **not** a point-in-time image of the whole
//! store, as Redis's fork gives: two keys written one after the other
//! during the save may be saved one old, one new, and a RENAME during
//! the save can leave the file with both names or neither. A SAVE with
//! no writers running (SHUTDOWN, or a quiet store) is point-in-time. A
//! true point-in-time BGSAVE would need copy-on-write of keys written
//! during the save (their old value kept for the saver); it is not built.
//!
//! ## Files and settings
//!
//! `dir` (default: the working directory, or the `--data-dir` of a
//! shared store) and `dbfilename` (default `dump.rdb`), as in Redis,
//! from flags, the config file or CONFIG SET. A save writes
//! `DIR/temp-PID-N.rdb`, fsyncs it, renames it over the target and
//! fsyncs the directory: a crash at any point leaves the old dump or the
//! new one, never half of one. `save "3600 1 300 100"` snapshot points
//! start a BGSAVE when that many seconds passed and that many write
//! commands ran since the last save; the default here is no points
//! (Redis's is `3600 1 300 100 60 10000`). With points set, a shutdown
//! saves, as Redis does.
//!
//! At start, `--load-rdb FILE`, or else `DIR/dbfilename` if it exists,
//! is imported (for a `--data-dir` store only when the store was just
//! created: a store that survived a restart has its own data). A file
//! that fails its checksum, is truncated or malformed stops the start
//! with a message naming the file and the byte offset, as redis-server
//! refuses to start on a bad dump; nothing is imported from a file whose
//! checksum fails. See [`load`] for what is imported and how the rest is
//! reported.
//!
//! | module | concern |
//! |---|---|
//! | [`decode`] | file and value parser (every 7.0 encoding, older ones) |
//! | [`encode`] | streaming writer (magic, aux, keys, EOF, crc64) |
//! | [`persist`] | SAVE/BGSAVE/LASTSAVE, save points, INFO persistence, CONFIG dir/dbfilename/save |
//! | [`load`] | the import at start, per type |

pub mod decode;
pub mod encode;
pub mod load;
pub mod persist;

use std::path::PathBuf;

pub use persist::Persistence;

/// A value as an RDB file holds it, independent of how this server
/// stores it: the parser's output and the writer's input.
#[derive(Debug, Clone, PartialEq)]
pub enum RdbValue {
    /// A string (integers as their decimal text).
    String(Vec<u8>),
    /// A list, head first.
    List(Vec<Vec<u8>>),
    /// A set's members.
    Set(Vec<Vec<u8>>),
    /// A sorted set's members and scores.
    ZSet(Vec<(Vec<u8>, f64)>),
    /// A hash's fields and values.
    Hash(Vec<(Vec<u8>, Vec<u8>)>),
}

impl RdbValue {
    /// Redis's name of the type (as TYPE answers).
    pub fn type_name(&self) -> &'static str {
        match self {
            RdbValue::String(_) => "string",
            RdbValue::List(_) => "list",
            RdbValue::Set(_) => "set",
            RdbValue::ZSet(_) => "zset",
            RdbValue::Hash(_) => "hash",
        }
    }
}

/// Default `dbfilename`.
pub const DEFAULT_DBFILENAME: &str = "dump.rdb";

/// A snapshot point: save after `secs` seconds if at least `changes`
/// write commands ran.
pub type SavePoint = (u64, u64);

/// The `--dir`, `--dbfilename`, `--load-rdb` and `--save` flags
/// (flattened into [`Cli`](crate::config::Cli)).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct RdbFlags {
    /// Directory of RDB snapshots (default: the working directory; with
    /// --data-dir, that directory).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// File name of RDB snapshots in `dir` (default dump.rdb).
    #[arg(long)]
    pub dbfilename: Option<String>,
    /// Import this RDB file at start (instead of DIR/dbfilename).
    #[arg(long)]
    pub load_rdb: Option<PathBuf>,
    /// Snapshot points, "SECS CHANGES ..." (default "": none).
    #[arg(long, allow_hyphen_values = true)]
    pub save: Option<String>,
}

/// RDB settings fixed at start (`dir`, `dbfilename` and `save` may
/// change later through CONFIG SET, in [`Persistence`]).
#[derive(Clone, Debug, Default)]
pub struct RdbConfig {
    /// `dir`; `None` = the default (see the module text).
    pub dir: Option<PathBuf>,
    /// `dbfilename`; `None` = `dump.rdb`.
    pub dbfilename: Option<String>,
    /// `--load-rdb`.
    pub load_rdb: Option<PathBuf>,
    /// `save` points.
    pub save: Vec<SavePoint>,
}

/// Parse Redis's `save` value: pairs of integers, or "" for none.
pub fn parse_save(v: &str) -> Result<Vec<SavePoint>, String> {
    let words: Vec<&str> = v.split_whitespace().collect();
    if !words.len().is_multiple_of(2) {
        return Err("Invalid save parameters".into());
    }
    words
        .chunks(2)
        .map(|c| match (c[0].parse::<u64>(), c[1].parse::<u64>()) {
            (Ok(s), Ok(n)) => Ok((s, n)),
            _ => Err("Invalid save parameters".into()),
        })
        .collect()
}

/// `save` as CONFIG GET shows it.
pub fn show_save(points: &[SavePoint]) -> String {
    points
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect::<Vec<_>>()
        .join(" ")
}

impl RdbConfig {
    /// Whether `name` (config-file syntax) is an RDB setting.
    pub fn owns(name: &str) -> bool {
        matches!(
            name,
            "dir" | "dbfilename" | "load-rdb" | "save" | "rdbcompression" | "rdbchecksum"
        )
    }

    /// Apply one `name value` setting.
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "dir" => self.dir = Some(PathBuf::from(value)),
            "dbfilename" => self.dbfilename = Some(check_dbfilename(value)?),
            "load-rdb" => self.load_rdb = (!value.is_empty()).then(|| PathBuf::from(value)),
            "save" => self.save = parse_save(value)?,
            // Always on here: accepted for redis.conf compatibility.
            "rdbcompression" | "rdbchecksum" => {
                crate::config::parse_yes_no(name, value)?;
            }
            _ => return Err(format!("unknown setting {name:?}")),
        }
        Ok(())
    }

    /// Apply the flags (after the config file).
    pub fn apply_flags(&mut self, f: &RdbFlags) -> Result<(), String> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        for (name, v) in [
            ("dir", path(&f.dir)),
            ("dbfilename", f.dbfilename.clone()),
            ("load-rdb", path(&f.load_rdb)),
            ("save", f.save.clone()),
        ] {
            if let Some(v) = v {
                self.apply(name, &v).map_err(|e| format!("--{name}: {e}"))?;
            }
        }
        Ok(())
    }
}

/// `dbfilename` must be a plain file name, as Redis requires.
pub fn check_dbfilename(v: &str) -> Result<String, String> {
    if v.is_empty() || v.contains('/') {
        return Err("dbfilename can't be a path, just a filename".into());
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn save_points() {
        assert_eq!(parse_save("").unwrap(), vec![]);
        assert_eq!(
            parse_save("3600 1 300 100").unwrap(),
            vec![(3600, 1), (300, 100)]
        );
        assert!(parse_save("3600").is_err());
        assert!(parse_save("a b").is_err());
        assert_eq!(show_save(&[(1, 2), (3, 4)]), "1 2 3 4");
        assert!(check_dbfilename("a/b").is_err());
    }
}
