//! What a client says about an item and learns about it: the write
//! options ([`PutOptions`]: a [`Condition`], an [`Expiry`], client flags)
//! and an item's metadata ([`ItemMeta`]).
//!
//! These are the server-facing half of the object header (dissertation
//! §4.2 keeps only key, value and version; the expiry, flags and
//! conditional writes are what the Redis and memcached protocols add).
//! They live in a module of their own because two engines share them:
//! `nibble::Store` and `nibblejmp::SharedStore` take the same options and
//! return the same metadata, so the server drives either the same way.
//! The rules that turn options into header fields ([`check_condition`],
//! [`Expiry::expiry_ms`], [`ItemMeta::of`]) are here once for both.

use crate::object::{Header, MAX_EXPIRY_MS};

/// What a write requires of the existing item.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Condition {
    /// Nothing.
    #[default]
    Always,
    /// The key must not exist (memcached `add`, Redis `SET NX`).
    IfAbsent,
    /// The key must exist (memcached `replace`, Redis `SET XX`).
    IfPresent,
    /// The key must exist with this version (memcached `cas`).
    IfVersion(u64),
}

/// What a write does to the expiry time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Expiry {
    /// No expiry.
    #[default]
    Never,
    /// Expire at this Unix time in ms.
    At(u64),
    /// Keep the existing item's expiry (Redis `KEEPTTL`).
    Keep,
}

/// Options of a write.
#[derive(Clone, Copy, Debug, Default)]
pub struct PutOptions {
    /// Condition.
    pub condition: Condition,
    /// Expiry.
    pub expiry: Expiry,
    /// Opaque client flags (memcached).
    pub flags: u32,
}

/// What a read-modify-write ([`crate::KvEngine::read_modify_write`])
/// saw and did: the closure's result, the item it read (`None`: absent
/// or expired), and the new version if the engine wrote the closure's
/// bytes in place. `written` is `None` when the closure asked for no
/// write, or asked for one the engine could not do in place (no live
/// item, a value that does not fit its allocation, an append-only
/// engine): the new bytes are then in the caller's buffer, for a
/// `put_with` conditioned on `old` (`IfVersion`, or `IfAbsent`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rmw<T> {
    /// What the closure returned.
    pub out: T,
    /// The item the closure was given.
    pub old: Option<ItemMeta>,
    /// The version written in place, if the write happened.
    pub written: Option<u64>,
}

impl<T> Rmw<T> {
    /// `f` run over a value read without the lock (`old`, in `buf`), as an
    /// engine that cannot overwrite in place does it: nothing is written,
    /// the caller appends `buf` conditioned on `old`.
    pub fn unwritten(
        old: Option<ItemMeta>,
        buf: &mut Vec<u8>,
        f: impl FnOnce(Option<ItemMeta>, &mut Vec<u8>) -> (T, bool),
    ) -> Rmw<T> {
        let (out, _) = f(old, buf);
        Rmw {
            out,
            old,
            written: None,
        }
    }
}

/// Metadata of an item.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ItemMeta {
    /// Value length.
    pub value_len: usize,
    /// Version.
    pub version: u64,
    /// Client flags.
    pub flags: u32,
    /// Expiry (Unix ms), if any.
    pub expiry_ms: Option<u64>,
}

impl ItemMeta {
    /// The metadata recorded in an object header.
    pub fn of(h: &Header) -> ItemMeta {
        ItemMeta {
            value_len: h.value_len as usize,
            version: h.version,
            flags: h.flags,
            expiry_ms: (h.expiry_ms != 0).then_some(h.expiry_ms),
        }
    }
}

impl Expiry {
    /// The expiry field (Unix ms, 0 = never) of an object written with
    /// this option, replacing `old` (the live item, if any). A time is
    /// clamped into the header's 47-bit field, and away from 0, which
    /// means "never".
    #[inline]
    pub fn expiry_ms(self, old: Option<&Header>) -> u64 {
        match self {
            Expiry::Never => 0,
            Expiry::At(t) => t.clamp(1, MAX_EXPIRY_MS),
            Expiry::Keep => old.map_or(0, |h| h.expiry_ms),
        }
    }
}

/// Why a write's or a delete's [`Condition`] does not hold. Each engine
/// turns it into its own error (`From`), so `check_condition(..)?` works
/// in both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConditionFailed {
    /// `IfAbsent`: the key exists.
    Exists,
    /// `IfPresent` or `IfVersion`: the key does not exist (or expired).
    NotFound,
    /// `IfVersion`: the key has another version.
    VersionMismatch {
        /// The current version.
        current: u64,
    },
}

/// Check a condition against the current item's header (`None` = absent
/// or expired). The engines call it under the key's bucket lock, where the
/// answer cannot change before the write it guards.
#[inline]
pub fn check_condition(cond: Condition, cur: Option<&Header>) -> Result<(), ConditionFailed> {
    match (cond, cur) {
        (Condition::Always, _) | (Condition::IfAbsent, None) | (Condition::IfPresent, Some(_)) => {
            Ok(())
        }
        (Condition::IfAbsent, Some(_)) => Err(ConditionFailed::Exists),
        (Condition::IfPresent, None) | (Condition::IfVersion(_), None) => {
            Err(ConditionFailed::NotFound)
        }
        (Condition::IfVersion(v), Some(h)) if h.version == v => Ok(()),
        (Condition::IfVersion(_), Some(h)) => {
            Err(ConditionFailed::VersionMismatch { current: h.version })
        }
    }
}
