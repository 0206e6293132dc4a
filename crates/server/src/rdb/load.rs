//! The import of an RDB file at start.
//!
//! Every key goes through [`import`], which hands the value to one
//! function per type. Strings, hashes, sets, lists and sorted sets are
//! stored as the server stores them (`types`, `coll`, `list`, `zset`: one
//! item while small, a root and nodes past the thresholds). A value of a
//! type the server has no representation for (none of RDB 10's types
//! today; the `Unsupported` outcome stays for future ones) is reported: a
//! count per type in the [`LoadReport`] and INFO
//! `rdb_last_load_keys_unsupported`, a log line naming the type and the
//! first keys. Nothing is dropped silently and nothing crashes: an empty
//! collection, a key of a database other than 0, and a key already
//! expired are counted as such.
//!
//! A key whose value does not fit the engine (larger than its largest
//! item) is reported and skipped; a store that fills up (OOM) stops the
//! import and the start, since a partial import would be silent loss.

use std::path::{Path, PathBuf};

use nibble::{Condition, Expiry, PutOptions};

use super::decode::{self, Entry, RdbError};
use super::RdbValue;
use crate::coll::{self, Kind, Pair};
use crate::state::{unix_ms, Shared};

/// Keys named per unsupported type in the log.
pub const LOG_KEYS_PER_TYPE: usize = 5;

/// What the import did.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    /// The file read (`None`: nothing was imported).
    pub file: Option<PathBuf>,
    /// Keys stored.
    pub loaded: u64,
    /// Keys already expired, not stored.
    pub expired: u64,
    /// Keys of types the server cannot store yet: (type, count, first keys).
    pub unsupported: Vec<(&'static str, u64, Vec<String>)>,
    /// Empty collections (Redis skips them too).
    pub empty: u64,
    /// Keys of databases other than 0 (this server has one).
    pub other_db: u64,
    /// Keys too large for the engine.
    pub too_large: u64,
    /// RDB version of the file.
    pub version: u16,
    /// Import time, seconds.
    pub secs: f64,
}

impl LoadReport {
    /// Keys of unsupported types, all types.
    pub fn unsupported_total(&self) -> u64 {
        self.unsupported.iter().map(|u| u.1).sum()
    }

    fn unsupported(&mut self, ty: &'static str, key: &[u8]) {
        let i = match self.unsupported.iter().position(|u| u.0 == ty) {
            Some(i) => i,
            None => {
                self.unsupported.push((ty, 0, Vec::new()));
                self.unsupported.len() - 1
            }
        };
        let u = &mut self.unsupported[i];
        u.1 += 1;
        if u.2.len() < LOG_KEYS_PER_TYPE {
            u.2.push(crate::commands::shown(key));
        }
    }
}

/// What became of one key.
#[derive(Debug, Clone, PartialEq)]
pub enum Imported {
    /// Stored.
    Stored,
    /// The server cannot store this type yet.
    Unsupported(&'static str),
    /// An empty collection.
    Empty,
    /// Larger than the engine's largest item.
    TooLarge,
}

/// Store one key (`expire_ms` already checked to be in the future),
/// replacing whatever the key held.
pub fn import(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    value: RdbValue,
) -> Result<Imported, String> {
    match value {
        RdbValue::String(s) => import_string(shared, key, expire_ms, s),
        RdbValue::Hash(h) => import_hash(shared, key, expire_ms, h),
        RdbValue::List(l) => import_list(shared, key, expire_ms, l),
        RdbValue::Set(s) => import_set(shared, key, expire_ms, s),
        RdbValue::ZSet(z) => import_zset(shared, key, expire_ms, z),
    }
}

fn failed(key: &[u8], e: impl std::fmt::Display) -> String {
    format!(
        "storing key {:?}: {e} (is maxmemory large enough for this dump?)",
        crate::commands::shown(key)
    )
}

/// Free `key` (a collection's nodes too).
fn free(shared: &Shared, key: &[u8]) -> Result<(), String> {
    coll::delete_key(&shared.store, key)
        .map(|_| ())
        .map_err(|e| failed(key, e.0))
}

/// A string.
pub fn import_string(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    s: Vec<u8>,
) -> Result<Imported, String> {
    free(shared, key)?;
    let opts = PutOptions {
        condition: Condition::Always,
        expiry: expire_ms.map_or(Expiry::Never, Expiry::At),
        flags: 0,
    };
    match shared.store.put_with(key, &s, opts) {
        Ok(_) => Ok(Imported::Stored),
        Err(nibble::Error::ValueTooLarge { .. }) | Err(nibble::Error::BadKey { .. }) => {
            Ok(Imported::TooLarge)
        }
        Err(e) => Err(failed(key, e)),
    }
}

/// A collection of `kind` (the `coll` representation: one item while
/// small, a root and nodes past the thresholds).
fn import_collection(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    kind: Kind,
    items: Vec<Pair>,
) -> Result<Imported, String> {
    if items.is_empty() {
        return Ok(Imported::Empty);
    }
    free(shared, key)?;
    match coll::create(shared, key, kind, &items, expire_ms) {
        Ok(()) => Ok(Imported::Stored),
        Err(e) if e.0.starts_with("ERR string exceeds") || e.0.contains("longer than") => {
            Ok(Imported::TooLarge)
        }
        Err(e) => Err(failed(key, e.0)),
    }
}

/// A hash (fields in file order).
pub fn import_hash(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    h: Vec<(Vec<u8>, Vec<u8>)>,
) -> Result<Imported, String> {
    import_collection(shared, key, expire_ms, Kind::Hash, h)
}

/// A list (head first).
pub fn import_list(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    l: Vec<Vec<u8>>,
) -> Result<Imported, String> {
    let items = l.into_iter().map(|e| (e, Vec::new())).collect();
    import_collection(shared, key, expire_ms, Kind::List, items)
}

/// A set.
pub fn import_set(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    s: Vec<Vec<u8>>,
) -> Result<Imported, String> {
    let items = s.into_iter().map(|e| (e, Vec::new())).collect();
    import_collection(shared, key, expire_ms, Kind::Set, items)
}

/// A sorted set (`zset`: one item while small, a member table and a
/// counted B+tree of items past the thresholds).
pub fn import_zset(
    shared: &Shared,
    key: &[u8],
    expire_ms: Option<u64>,
    z: Vec<(Vec<u8>, f64)>,
) -> Result<Imported, String> {
    if z.is_empty() {
        return Ok(Imported::Empty);
    }
    free(shared, key)?;
    let entries: Vec<crate::zset::Entry> = z.into_iter().map(|(m, s)| (s, m)).collect();
    match crate::zset::create(shared, key, &entries) {
        Ok(()) => {}
        Err(e) if e.0.starts_with("ERR string exceeds") || e.0.contains("longer than") => {
            return Ok(Imported::TooLarge)
        }
        Err(e) => return Err(failed(key, e.0)),
    }
    if expire_ms.is_some() {
        shared
            .store
            .set_expiry(key, expire_ms)
            .map_err(|e| failed(key, e.to_string()))?;
    }
    Ok(Imported::Stored)
}

/// Import the file at `path` into `store`.
pub fn load_file(shared: &Shared, path: &Path) -> Result<LoadReport, String> {
    let data =
        std::fs::read(path).map_err(|e| format!("reading RDB file {}: {e}", path.display()))?;
    let mut rep = load_bytes(shared, &data, &path.display().to_string())?;
    rep.file = Some(path.to_path_buf());
    Ok(rep)
}

/// Import a whole RDB image (a file's bytes, or a replication payload;
/// `shown` names it in messages) into `store`.
pub fn load_bytes(shared: &Shared, data: &[u8], shown: &str) -> Result<LoadReport, String> {
    let t = std::time::Instant::now();
    let mut rep = LoadReport::default();
    let now = unix_ms() as i64;
    let mut fatal: Option<String> = None;
    let res = decode::parse(data, |e: Entry| {
        if e.db != 0 {
            rep.other_db += 1;
            return Ok(());
        }
        if let Some(at) = e.expire_ms {
            if at <= now {
                rep.expired += 1;
                return Ok(());
            }
        }
        let ty = e.value.type_name();
        match import(shared, &e.key, e.expire_ms.map(|x| x as u64), e.value) {
            Ok(Imported::Stored) => rep.loaded += 1,
            Ok(Imported::Unsupported(_)) => rep.unsupported(ty, &e.key),
            Ok(Imported::Empty) => rep.empty += 1,
            Ok(Imported::TooLarge) => {
                rep.too_large += 1;
                log::warn!(
                    "RDB {shown}: key {:?} is too large for the engine; not loaded",
                    crate::commands::shown(&e.key)
                );
            }
            Err(msg) => {
                fatal = Some(msg);
                return Err(RdbError {
                    offset: 0,
                    what: "import stopped".into(),
                });
            }
        }
        Ok(())
    });
    if let Some(msg) = fatal {
        return Err(format!("loading RDB file {shown}: {msg}"));
    }
    let info = res.map_err(|e| format!("bad RDB file {shown}: {e}"))?;
    rep.version = info.version;
    rep.secs = t.elapsed().as_secs_f64();
    log::info!(
        "RDB {shown} (version {}) loaded in {:.3} s: {} keys stored, {} expired, {} empty, {} of other databases, {} too large",
        rep.version,
        rep.secs,
        rep.loaded,
        rep.expired,
        rep.empty,
        rep.other_db,
        rep.too_large
    );
    for (ty, n, keys) in &rep.unsupported {
        log::warn!(
            "RDB {shown}: {n} keys of type {ty} not loaded: this server cannot store {ty} values yet (first keys: {})",
            keys.join(", ")
        );
    }
    if info.functions_skipped > 0 {
        log::warn!(
            "RDB {shown}: {} function libraries skipped (no functions here)",
            info.functions_skipped
        );
    }
    Ok(rep)
}

/// The import at start (see the module text of `rdb`): `--load-rdb`, or
/// `dir`/`dbfilename` if it exists (for a `--data-dir` store only when
/// it was just created). An error stops the start.
pub fn load_at_start(shared: &Shared) -> Result<LoadReport, String> {
    let (cfg, store) = (&shared.config, &shared.store);
    if let Some(path) = &cfg.rdb.load_rdb {
        return load_file(shared, path);
    }
    let name = cfg
        .rdb
        .dbfilename
        .as_deref()
        .unwrap_or(super::DEFAULT_DBFILENAME);
    let path = super::persist::default_dir(cfg).join(name);
    if !path.exists() {
        return Ok(LoadReport::default());
    }
    if let Some(s) = store.shared() {
        if s.start != "created" {
            log::info!(
                "{} not loaded: the store in {} already holds its data ({}); use --load-rdb to import it over them",
                path.display(),
                s.dir.display(),
                s.start
            );
            return Ok(LoadReport::default());
        }
    }
    load_file(shared, &path)
}
