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
use crate::object::Header;

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
    pub(crate) fn of(h: &Header) -> ItemMeta {
        ItemMeta {
            value_len: h.value_len as usize,
            version: h.version,
            flags: h.flags,
            expiry_ms: (h.expiry_ms != 0).then_some(h.expiry_ms),
        }
    }
}
