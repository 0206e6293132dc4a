//! `maxmemory-policy`: Redis's eviction names over the engine's cache
//! mode (issue 23; the engine side is `nibble`'s `compaction::evict`).
//!
//! The engine evicts whole log segments, never single keys, so Redis's
//! eight policies map onto what it offers:
//!
//! | Redis name | engine setting | why |
//! |---|---|---|
//! | `noeviction` | `NoEviction` | writes past maxmemory get `-OOM` / `SERVER_ERROR out of memory` |
//! | `allkeys-lru` | `Merge` | Segcache merge eviction: keeps what was read since it was written (CLOCK at segment grain), LRU-level hit ratio |
//! | `allkeys-lfu` | `Merge` | the same: one accessed bit per object, no frequency counter |
//! | `allkeys-random` | `Random` | a random segment, whole |
//! | `volatile-lru`, `volatile-lfu` | `Merge`, volatile only | keys without a TTL are relocated, never evicted |
//! | `volatile-random` | `Random`, volatile only | as above |
//! | `volatile-ttl` | `Merge`, volatile only | the engine keeps no expiry order; merge is the closest it offers |
//!
//! One keyspace, two protocols. Redis's default is `noeviction`;
//! memcached is a cache and evicts unless started with `-M`. The server
//! has one engine for both ports, so one policy; its default follows what
//! the server is for:
//!
//! * `--maxmemory-policy` (or `maxmemory-policy` in the config file, or
//!   `CONFIG SET`) always wins;
//! * else, a server that serves only memcached (no RESP port, socket or
//!   TLS port) evicts as memcached does (`allkeys-lru`), unless
//!   `--memcached-no-evict` (memcached's `-M`) asks it to refuse;
//! * else `noeviction`: a server that serves RESP keeps Redis's promise
//!   that data is not dropped behind a client's back, and its memcached
//!   clients get `SERVER_ERROR out of memory` when it is full (logged at
//!   start). Name an `allkeys-*` policy for cache behaviour on both.
//!
//! The shared store (`--data-dir`) never evicts: its segment table is
//! shared with other processes, and only `noeviction` is accepted there.

use crate::config::ServerConfig;

/// Redis's `maxmemory-policy` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaxmemoryPolicy {
    /// Refuse writes when full.
    NoEviction,
    /// Any key, recently used kept.
    AllkeysLru,
    /// Any key, frequently used kept.
    AllkeysLfu,
    /// Any key, at random.
    AllkeysRandom,
    /// Keys with a TTL, recently used kept.
    VolatileLru,
    /// Keys with a TTL, frequently used kept.
    VolatileLfu,
    /// Keys with a TTL, at random.
    VolatileRandom,
    /// Keys with a TTL, nearest expiry first.
    VolatileTtl,
}

const ALL: [MaxmemoryPolicy; 8] = [
    MaxmemoryPolicy::NoEviction,
    MaxmemoryPolicy::AllkeysLru,
    MaxmemoryPolicy::AllkeysLfu,
    MaxmemoryPolicy::AllkeysRandom,
    MaxmemoryPolicy::VolatileLru,
    MaxmemoryPolicy::VolatileLfu,
    MaxmemoryPolicy::VolatileRandom,
    MaxmemoryPolicy::VolatileTtl,
];

impl MaxmemoryPolicy {
    /// The Redis name.
    pub fn name(self) -> &'static str {
        match self {
            MaxmemoryPolicy::NoEviction => "noeviction",
            MaxmemoryPolicy::AllkeysLru => "allkeys-lru",
            MaxmemoryPolicy::AllkeysLfu => "allkeys-lfu",
            MaxmemoryPolicy::AllkeysRandom => "allkeys-random",
            MaxmemoryPolicy::VolatileLru => "volatile-lru",
            MaxmemoryPolicy::VolatileLfu => "volatile-lfu",
            MaxmemoryPolicy::VolatileRandom => "volatile-random",
            MaxmemoryPolicy::VolatileTtl => "volatile-ttl",
        }
    }

    /// The policy as one byte (for the run-time setting).
    pub fn to_byte(self) -> u8 {
        ALL.iter().position(|&p| p == self).unwrap_or(0) as u8
    }

    /// The policy from [`MaxmemoryPolicy::to_byte`].
    pub fn from_byte(b: u8) -> MaxmemoryPolicy {
        ALL.get(b as usize)
            .copied()
            .unwrap_or(MaxmemoryPolicy::NoEviction)
    }

    /// The engine setting it maps onto (see the module table).
    pub fn engine(self) -> nibble::Eviction {
        use nibble::EvictionPolicy as P;
        let (policy, volatile_only) = match self {
            MaxmemoryPolicy::NoEviction => (P::NoEviction, false),
            MaxmemoryPolicy::AllkeysLru | MaxmemoryPolicy::AllkeysLfu => (P::Merge, false),
            MaxmemoryPolicy::AllkeysRandom => (P::Random, false),
            MaxmemoryPolicy::VolatileLru
            | MaxmemoryPolicy::VolatileLfu
            | MaxmemoryPolicy::VolatileTtl => (P::Merge, true),
            MaxmemoryPolicy::VolatileRandom => (P::Random, true),
        };
        nibble::Eviction {
            policy,
            volatile_only,
        }
    }

    /// The policy a server starts with (see the module docs).
    pub fn at_start(cfg: &ServerConfig) -> MaxmemoryPolicy {
        if let Some(p) = cfg.maxmemory_policy {
            return p;
        }
        let serves_resp = cfg.port.is_some() || cfg.unixsocket.is_some() || cfg.tls.port.is_some();
        if cfg.memcached_port.is_some() && !serves_resp && !cfg.memcached_no_evict {
            MaxmemoryPolicy::AllkeysLru
        } else {
            MaxmemoryPolicy::NoEviction
        }
    }
}

impl std::str::FromStr for MaxmemoryPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.to_ascii_lowercase();
        ALL.into_iter().find(|p| p.name() == s).ok_or_else(|| {
            format!(
                "invalid maxmemory-policy {s:?} (one of {})",
                ALL.map(MaxmemoryPolicy::name).join(", ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_map() {
        for p in ALL {
            assert_eq!(p.name().parse::<MaxmemoryPolicy>().unwrap(), p);
            assert_eq!(MaxmemoryPolicy::from_byte(p.to_byte()), p);
        }
        assert!(!MaxmemoryPolicy::NoEviction.engine().evicts());
        assert!(MaxmemoryPolicy::AllkeysLru.engine().evicts());
        assert!(MaxmemoryPolicy::VolatileTtl.engine().volatile_only);
        assert!("allkeys-lfu".parse::<MaxmemoryPolicy>().is_ok());
        assert!("lru".parse::<MaxmemoryPolicy>().is_err());
    }

    #[test]
    fn default_follows_the_ports() {
        let mut c = ServerConfig::default();
        assert_eq!(MaxmemoryPolicy::at_start(&c), MaxmemoryPolicy::NoEviction);
        c.memcached_port = Some(0);
        assert_eq!(
            MaxmemoryPolicy::at_start(&c),
            MaxmemoryPolicy::NoEviction,
            "RESP is served too: Redis's default"
        );
        c.port = None;
        assert_eq!(MaxmemoryPolicy::at_start(&c), MaxmemoryPolicy::AllkeysLru);
        c.memcached_no_evict = true;
        assert_eq!(MaxmemoryPolicy::at_start(&c), MaxmemoryPolicy::NoEviction);
        c.maxmemory_policy = Some(MaxmemoryPolicy::AllkeysRandom);
        assert_eq!(
            MaxmemoryPolicy::at_start(&c),
            MaxmemoryPolicy::AllkeysRandom
        );
    }
}
