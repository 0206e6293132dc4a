//! The command table: one [`Spec`] per command, in the order COMMAND
//! lists them. Dispatch ([`lookup`](super::lookup)) indexes it once into
//! buckets; COMMAND COUNT/INFO/DOCS read it as is.

use crate::replica;

use super::{
    admin, bits, blocking, dump, hash, keys, lcs, list, multi, pubsub, set, strings, zset, Spec,
};

// Flag sets (Redis's command flags, as COMMAND INFO reports them).
const W: &[&str] = &["write", "denyoom", "fast"];
const WS: &[&str] = &["write", "denyoom"];
const WD: &[&str] = &["write", "fast"];
const R: &[&str] = &["readonly", "fast"];
const RS: &[&str] = &["readonly"];
const A: &[&str] = &["fast"];
const N: &[&str] = &["noauth", "fast"];
// Transactions and pub/sub (Redis 7's flags for them).
const TX: &[&str] = &["noscript", "loading", "stale", "fast", "allow_busy"];
const TX_EXEC: &[&str] = &["noscript", "loading", "stale", "skip_slowlog"];
// Blocking commands.
const WB: &[&str] = &["write", "noscript", "blocking"];
const WBM: &[&str] = &["write", "denyoom", "noscript", "blocking"];
const PS: &[&str] = &["pubsub", "noscript", "loading", "stale"];
const PS_PUB: &[&str] = &["pubsub", "loading", "stale", "fast", "may_replicate"];

macro_rules! spec {
    ($name:literal, $arity:expr, $flags:expr, $keys:expr, $group:literal, $summary:literal, $run:expr) => {
        Spec {
            name: $name,
            arity: $arity,
            flags: $flags,
            keys: $keys,
            group: $group,
            summary: $summary,
            run: $run,
        }
    };
}

const K1: (i32, i32, i32) = (1, 1, 1);
const K0: (i32, i32, i32) = (0, 0, 0);
const KALL: (i32, i32, i32) = (1, -1, 1);

/// The command table (also the truth for COMMAND COUNT/INFO/DOCS).
pub static COMMANDS: &[Spec] = &[
    // Connection and server.
    spec!(
        "ping",
        -1,
        A,
        K0,
        "connection",
        "Returns the server's liveliness response.",
        admin::ping
    ),
    spec!(
        "role",
        1,
        &["noscript", "loading", "stale", "fast"],
        K0,
        "server",
        "Returns the replication role.",
        replica::role
    ),
    spec!(
        "replicaof",
        3,
        &["admin", "noscript", "stale", "no_async_loading"],
        K0,
        "server",
        "Configures a server as replica of another, or promotes it to a master.",
        replica::replicaof
    ),
    spec!(
        "slaveof",
        3,
        &["admin", "noscript", "stale", "no_async_loading"],
        K0,
        "server",
        "Sets a Redis server as a replica of another, or promotes it to being a master.",
        replica::replicaof
    ),
    spec!(
        "echo",
        2,
        A,
        K0,
        "connection",
        "Returns the given string.",
        admin::echo
    ),
    spec!(
        "quit",
        -1,
        N,
        K0,
        "connection",
        "Closes the connection.",
        admin::quit
    ),
    spec!(
        "hello",
        -1,
        N,
        K0,
        "connection",
        "Handshakes with the server.",
        admin::hello
    ),
    spec!(
        "auth",
        -2,
        N,
        K0,
        "connection",
        "Authenticates the connection.",
        admin::auth
    ),
    spec!(
        "select",
        2,
        A,
        K0,
        "connection",
        "Changes the selected database (only 0 exists).",
        admin::select
    ),
    spec!(
        "client",
        -2,
        RS,
        K0,
        "connection",
        "CLIENT SETNAME, GETNAME, SETINFO, ID, INFO, LIST.",
        admin::client
    ),
    spec!(
        "command",
        -1,
        RS,
        K0,
        "server",
        "COMMAND, COUNT, DOCS, INFO, LIST.",
        admin::command
    ),
    spec!(
        "config",
        -2,
        RS,
        K0,
        "server",
        "CONFIG GET, SET, RESETSTAT.",
        admin::config
    ),
    spec!(
        "info",
        -1,
        RS,
        K0,
        "server",
        "Returns information and statistics about the server.",
        admin::info
    ),
    spec!(
        "dbsize",
        1,
        R,
        K0,
        "server",
        "Returns the number of keys.",
        admin::dbsize
    ),
    spec!(
        "flushall",
        -1,
        WD,
        K0,
        "server",
        "Removes all keys.",
        admin::flushall
    ),
    spec!(
        "flushdb",
        -1,
        WD,
        K0,
        "server",
        "Removes all keys.",
        admin::flushall
    ),
    spec!(
        "shutdown",
        -1,
        RS,
        K0,
        "server",
        "Stops the server.",
        admin::shutdown
    ),
    spec!(
        "save",
        1,
        RS,
        K0,
        "server",
        "Synchronously saves the database(s) to disk.",
        crate::rdb::persist::save_cmd
    ),
    spec!(
        "bgsave",
        -1,
        RS,
        K0,
        "server",
        "Asynchronously saves the database(s) to disk.",
        crate::rdb::persist::bgsave_cmd
    ),
    spec!(
        "lastsave",
        1,
        A,
        K0,
        "server",
        "Returns the Unix timestamp of the last successful save to disk.",
        crate::rdb::persist::lastsave_cmd
    ),
    spec!(
        "debug",
        -2,
        RS,
        K0,
        "server",
        "DEBUG POPULATE count [prefix] [size] | MIGRATE worker.",
        admin::debug
    ),
    spec!(
        "time",
        1,
        A,
        K0,
        "server",
        "Returns the server time.",
        admin::time
    ),
    // Strings.
    spec!(
        "get",
        2,
        R,
        K1,
        "string",
        "Returns the string value of a key.",
        strings::get
    ),
    spec!(
        "set",
        -3,
        WS,
        K1,
        "string",
        "Sets the string value of a key, with options.",
        strings::set
    ),
    spec!(
        "setex",
        4,
        WS,
        K1,
        "string",
        "Sets a value and its expiry in seconds.",
        strings::setex
    ),
    spec!(
        "psetex",
        4,
        WS,
        K1,
        "string",
        "Sets a value and its expiry in milliseconds.",
        strings::psetex
    ),
    spec!(
        "setnx",
        3,
        W,
        K1,
        "string",
        "Sets a key only if it does not exist.",
        strings::setnx
    ),
    spec!(
        "getset",
        3,
        W,
        K1,
        "string",
        "Sets a value and returns the old one.",
        strings::getset
    ),
    spec!(
        "getdel",
        2,
        WD,
        K1,
        "string",
        "Returns a value and deletes the key.",
        strings::getdel
    ),
    spec!(
        "getex",
        -2,
        WD,
        K1,
        "string",
        "Returns a value and changes its expiry.",
        strings::getex
    ),
    spec!(
        "mget",
        -2,
        R,
        KALL,
        "string",
        "Returns the values of several keys.",
        strings::mget
    ),
    spec!(
        "mset",
        -3,
        WS,
        (1, -1, 2),
        "string",
        "Sets several keys.",
        strings::mset
    ),
    spec!(
        "msetnx",
        -3,
        WS,
        (1, -1, 2),
        "string",
        "Sets several keys only if none exists.",
        strings::msetnx
    ),
    spec!(
        "append",
        3,
        W,
        K1,
        "string",
        "Appends to a value.",
        strings::append
    ),
    spec!(
        "strlen",
        2,
        R,
        K1,
        "string",
        "Returns the length of a value.",
        strings::strlen
    ),
    spec!(
        "getrange",
        4,
        RS,
        K1,
        "string",
        "Returns a substring of a value.",
        strings::getrange
    ),
    spec!(
        "substr",
        4,
        RS,
        K1,
        "string",
        "Returns a substring of a value.",
        strings::getrange
    ),
    spec!(
        "setrange",
        4,
        WS,
        K1,
        "string",
        "Overwrites part of a value.",
        strings::setrange
    ),
    spec!(
        "incr",
        2,
        W,
        K1,
        "string",
        "Increments an integer value by one.",
        strings::incr
    ),
    spec!(
        "decr",
        2,
        W,
        K1,
        "string",
        "Decrements an integer value by one.",
        strings::decr
    ),
    spec!(
        "incrby",
        3,
        W,
        K1,
        "string",
        "Increments an integer value.",
        strings::incrby
    ),
    spec!(
        "decrby",
        3,
        W,
        K1,
        "string",
        "Decrements an integer value.",
        strings::decrby
    ),
    spec!(
        "incrbyfloat",
        3,
        W,
        K1,
        "string",
        "Increments a floating point value.",
        strings::incrbyfloat
    ),
    spec!(
        "lcs",
        -3,
        RS,
        (1, 2, 1),
        "string",
        "Finds the longest common substring.",
        lcs::lcs
    ),
    // Bitmaps.
    spec!(
        "setbit",
        4,
        W,
        K1,
        "bitmap",
        "Sets or clears the bit at offset of a string value.",
        bits::setbit
    ),
    spec!(
        "getbit",
        3,
        R,
        K1,
        "bitmap",
        "Returns a bit value by offset.",
        bits::getbit
    ),
    spec!(
        "bitcount",
        -2,
        RS,
        K1,
        "bitmap",
        "Counts the number of set bits in a string.",
        bits::bitcount
    ),
    spec!(
        "bitpos",
        -3,
        RS,
        K1,
        "bitmap",
        "Finds the first set or clear bit in a string.",
        bits::bitpos
    ),
    spec!(
        "bitop",
        -4,
        WS,
        (2, -1, 1),
        "bitmap",
        "Performs bitwise operations on strings and stores the result.",
        bits::bitop
    ),
    spec!(
        "bitfield",
        -2,
        WS,
        K1,
        "bitmap",
        "Performs arbitrary bitfield integer operations on strings.",
        bits::bitfield
    ),
    spec!(
        "bitfield_ro",
        -2,
        R,
        K1,
        "bitmap",
        "Performs arbitrary read-only bitfield integer operations on strings.",
        bits::bitfield_ro
    ),
    // Keys.
    spec!("del", -2, WD, KALL, "generic", "Deletes keys.", keys::del),
    spec!(
        "unlink",
        -2,
        WD,
        KALL,
        "generic",
        "Deletes keys.",
        keys::del
    ),
    spec!(
        "exists",
        -2,
        R,
        KALL,
        "generic",
        "Counts the keys that exist.",
        keys::exists
    ),
    spec!(
        "expire",
        -3,
        WD,
        K1,
        "generic",
        "Sets a key's expiry in seconds.",
        keys::expire
    ),
    spec!(
        "pexpire",
        -3,
        WD,
        K1,
        "generic",
        "Sets a key's expiry in milliseconds.",
        keys::pexpire
    ),
    spec!(
        "expireat",
        -3,
        WD,
        K1,
        "generic",
        "Sets a key's expiry as a Unix time in seconds.",
        keys::expireat
    ),
    spec!(
        "pexpireat",
        -3,
        WD,
        K1,
        "generic",
        "Sets a key's expiry as a Unix time in milliseconds.",
        keys::pexpireat
    ),
    spec!(
        "ttl",
        2,
        R,
        K1,
        "generic",
        "Returns a key's time to live in seconds.",
        keys::ttl
    ),
    spec!(
        "pttl",
        2,
        R,
        K1,
        "generic",
        "Returns a key's time to live in milliseconds.",
        keys::pttl
    ),
    spec!(
        "expiretime",
        2,
        R,
        K1,
        "generic",
        "Returns a key's expiry as a Unix time in seconds.",
        keys::expiretime
    ),
    spec!(
        "pexpiretime",
        2,
        R,
        K1,
        "generic",
        "Returns a key's expiry as a Unix time in milliseconds.",
        keys::pexpiretime
    ),
    spec!(
        "persist",
        2,
        WD,
        K1,
        "generic",
        "Removes a key's expiry.",
        keys::persist
    ),
    spec!(
        "type",
        2,
        R,
        K1,
        "generic",
        "Returns the type of a key.",
        keys::type_
    ),
    spec!(
        "rename",
        3,
        WD,
        (1, 2, 1),
        "generic",
        "Renames a key.",
        keys::rename
    ),
    spec!(
        "renamenx",
        3,
        WD,
        (1, 2, 1),
        "generic",
        "Renames a key if the new name is free.",
        keys::renamenx
    ),
    spec!(
        "touch",
        -2,
        R,
        KALL,
        "generic",
        "Returns the number of existing keys out of those specified.",
        keys::touch
    ),
    spec!(
        "copy",
        -3,
        WS,
        (1, 2, 1),
        "generic",
        "Copies the value of a key to a new key.",
        keys::copy
    ),
    spec!(
        "object",
        -2,
        RS,
        K0,
        "generic",
        "OBJECT ENCODING, REFCOUNT, IDLETIME, FREQ, HELP.",
        keys::object
    ),
    spec!(
        "dump",
        2,
        RS,
        K1,
        "generic",
        "Returns a serialized representation of the value stored at a key.",
        dump::dump
    ),
    spec!(
        "restore",
        -4,
        WS,
        K1,
        "generic",
        "Creates a key from the serialized representation of a value.",
        dump::restore
    ),
    spec!(
        "keys",
        2,
        RS,
        K0,
        "generic",
        "Returns the keys matching a pattern.",
        keys::keys
    ),
    spec!(
        "scan",
        -2,
        RS,
        K0,
        "generic",
        "Iterates over the keys.",
        keys::scan
    ),
    spec!(
        "randomkey",
        1,
        RS,
        K0,
        "generic",
        "Returns a key (not uniformly random).",
        keys::randomkey
    ),
    // Hashes.
    spec!("hset", -4, W, K1, "hash", "Sets hash fields.", hash::hset),
    spec!("hmset", -4, W, K1, "hash", "Sets hash fields.", hash::hmset),
    spec!(
        "hsetnx",
        4,
        W,
        K1,
        "hash",
        "Sets a hash field if absent.",
        hash::hsetnx
    ),
    spec!(
        "hget",
        3,
        R,
        K1,
        "hash",
        "Returns a hash field.",
        hash::hget
    ),
    spec!(
        "hmget",
        -3,
        R,
        K1,
        "hash",
        "Returns hash fields.",
        hash::hmget
    ),
    spec!(
        "hgetall",
        2,
        RS,
        K1,
        "hash",
        "Returns all fields and values.",
        hash::hgetall
    ),
    spec!(
        "hdel",
        -3,
        WD,
        K1,
        "hash",
        "Deletes hash fields.",
        hash::hdel
    ),
    spec!(
        "hexists",
        3,
        R,
        K1,
        "hash",
        "Tells whether a field exists.",
        hash::hexists
    ),
    spec!(
        "hlen",
        2,
        R,
        K1,
        "hash",
        "Returns the number of fields.",
        hash::hlen
    ),
    spec!(
        "hkeys",
        2,
        RS,
        K1,
        "hash",
        "Returns the fields.",
        hash::hkeys
    ),
    spec!(
        "hvals",
        2,
        RS,
        K1,
        "hash",
        "Returns the values.",
        hash::hvals
    ),
    spec!(
        "hstrlen",
        3,
        R,
        K1,
        "hash",
        "Returns the length of a field's value.",
        hash::hstrlen
    ),
    spec!(
        "hincrby",
        4,
        W,
        K1,
        "hash",
        "Increments an integer field.",
        hash::hincrby
    ),
    spec!(
        "hincrbyfloat",
        4,
        W,
        K1,
        "hash",
        "Increments a floating point field.",
        hash::hincrbyfloat
    ),
    spec!(
        "hscan",
        -3,
        RS,
        K1,
        "hash",
        "Iterates over fields and values of a hash.",
        hash::hscan
    ),
    spec!(
        "hrandfield",
        -2,
        RS,
        K1,
        "hash",
        "Returns one or more random fields from a hash.",
        hash::hrandfield
    ),
    spec!(
        "sadd",
        -3,
        W,
        K1,
        "set",
        "Adds members to a set.",
        set::sadd
    ),
    spec!(
        "srem",
        -3,
        WD,
        K1,
        "set",
        "Removes members from a set.",
        set::srem
    ),
    spec!(
        "sismember",
        3,
        R,
        K1,
        "set",
        "Tells whether a member belongs to a set.",
        set::sismember
    ),
    spec!(
        "smismember",
        -3,
        R,
        K1,
        "set",
        "Tells whether several members belong to a set.",
        set::smismember
    ),
    spec!(
        "smembers",
        2,
        RS,
        K1,
        "set",
        "Returns all members of a set.",
        set::smembers
    ),
    spec!(
        "scard",
        2,
        R,
        K1,
        "set",
        "Returns the number of members of a set.",
        set::scard
    ),
    spec!(
        "spop",
        -2,
        WD,
        K1,
        "set",
        "Removes and returns random members of a set.",
        set::spop
    ),
    spec!(
        "srandmember",
        -2,
        RS,
        K1,
        "set",
        "Returns random members of a set.",
        set::srandmember
    ),
    spec!(
        "sinter",
        -2,
        RS,
        KALL,
        "set",
        "Returns the intersection of sets.",
        set::sinter
    ),
    spec!(
        "sunion",
        -2,
        RS,
        KALL,
        "set",
        "Returns the union of sets.",
        set::sunion
    ),
    spec!(
        "sdiff",
        -2,
        RS,
        KALL,
        "set",
        "Returns the difference of sets.",
        set::sdiff
    ),
    spec!(
        "sinterstore",
        -3,
        WS,
        KALL,
        "set",
        "Stores the intersection of sets.",
        set::sinterstore
    ),
    spec!(
        "sunionstore",
        -3,
        WS,
        KALL,
        "set",
        "Stores the union of sets.",
        set::sunionstore
    ),
    spec!(
        "sdiffstore",
        -3,
        WS,
        KALL,
        "set",
        "Stores the difference of sets.",
        set::sdiffstore
    ),
    spec!(
        "sintercard",
        -3,
        RS,
        K0,
        "set",
        "Returns the number of members of the intersection of sets.",
        set::sintercard
    ),
    spec!(
        "smove",
        4,
        WD,
        (1, 2, 1),
        "set",
        "Moves a member from one set to another.",
        set::smove
    ),
    spec!(
        "sscan",
        -3,
        RS,
        K1,
        "set",
        "Iterates over members of a set.",
        set::sscan
    ),
    spec!(
        "zadd",
        -4,
        W,
        K1,
        "sorted_set",
        "Adds one or more members to a sorted set, or updates their scores.",
        zset::zadd
    ),
    spec!(
        "zincrby",
        4,
        W,
        K1,
        "sorted_set",
        "Increments the score of a member in a sorted set.",
        zset::zincrby
    ),
    spec!(
        "zrem",
        -3,
        WD,
        K1,
        "sorted_set",
        "Removes one or more members from a sorted set.",
        zset::zrem
    ),
    spec!(
        "zscore",
        3,
        R,
        K1,
        "sorted_set",
        "Returns the score of a member in a sorted set.",
        zset::zscore
    ),
    spec!(
        "zmscore",
        -3,
        R,
        K1,
        "sorted_set",
        "Returns the score of one or more members in a sorted set.",
        zset::zmscore
    ),
    spec!(
        "zcard",
        2,
        R,
        K1,
        "sorted_set",
        "Returns the number of members in a sorted set.",
        zset::zcard
    ),
    spec!(
        "zcount",
        4,
        R,
        K1,
        "sorted_set",
        "Returns the count of members in a sorted set that have scores within a range.",
        zset::zcount
    ),
    spec!(
        "zlexcount",
        4,
        R,
        K1,
        "sorted_set",
        "Returns the number of members in a sorted set within a lexicographical range.",
        zset::zlexcount
    ),
    spec!(
        "zrange",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a range of indexes.",
        zset::zrange
    ),
    spec!(
        "zrevrange",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a range of indexes in reverse order.",
        zset::zrevrange
    ),
    spec!(
        "zrangebyscore",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a range of scores.",
        zset::zrangebyscore
    ),
    spec!(
        "zrevrangebyscore",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a range of scores in reverse order.",
        zset::zrevrangebyscore
    ),
    spec!(
        "zrangebylex",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a lexicographical range.",
        zset::zrangebylex
    ),
    spec!(
        "zrevrangebylex",
        -4,
        RS,
        K1,
        "sorted_set",
        "Returns members in a sorted set within a lexicographical range in reverse order.",
        zset::zrevrangebylex
    ),
    spec!(
        "zrank",
        3,
        R,
        K1,
        "sorted_set",
        "Returns the index of a member in a sorted set ordered by ascending scores.",
        zset::zrank
    ),
    spec!(
        "zrevrank",
        3,
        R,
        K1,
        "sorted_set",
        "Returns the index of a member in a sorted set ordered by descending scores.",
        zset::zrevrank
    ),
    spec!(
        "zremrangebyrank",
        4,
        WS,
        K1,
        "sorted_set",
        "Removes members in a sorted set within a range of indexes.",
        zset::zremrangebyrank
    ),
    spec!(
        "zremrangebyscore",
        4,
        WS,
        K1,
        "sorted_set",
        "Removes members in a sorted set within a range of scores.",
        zset::zremrangebyscore
    ),
    spec!(
        "zremrangebylex",
        4,
        WS,
        K1,
        "sorted_set",
        "Removes members in a sorted set within a lexicographical range.",
        zset::zremrangebylex
    ),
    spec!(
        "zpopmin",
        -2,
        WD,
        K1,
        "sorted_set",
        "Returns the lowest-scoring members from a sorted set after removing them.",
        zset::zpopmin
    ),
    spec!(
        "zpopmax",
        -2,
        WD,
        K1,
        "sorted_set",
        "Returns the highest-scoring members from a sorted set after removing them.",
        zset::zpopmax
    ),
    spec!(
        "bzpopmin",
        -3,
        &["write", "noscript", "fast", "blocking"],
        (1, -2, 1),
        "sorted_set",
        "Removes and returns the member with the lowest score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.",
        blocking::bzpopmin
    ),
    spec!(
        "bzpopmax",
        -3,
        &["write", "noscript", "fast", "blocking"],
        (1, -2, 1),
        "sorted_set",
        "Removes and returns the member with the highest score from one or more sorted sets. Blocks until a member available otherwise. Deletes the sorted set if the last element was popped.",
        blocking::bzpopmax
    ),
    spec!(
        "bzmpop",
        -5,
        WB,
        K0,
        "sorted_set",
        "Removes and returns a member by score from one or more sorted sets. Blocks until a member is available otherwise. Deletes the sorted set if the last element was popped.",
        blocking::bzmpop
    ),
    spec!(
        "zmpop",
        -4,
        &["write"],
        K0,
        "sorted_set",
        "Returns the highest- or lowest-scoring members from one or more sorted sets after removing them. Deletes the sorted set if the last member was popped.",
        blocking::zmpop
    ),
    spec!(
        "zrangestore",
        -5,
        WS,
        (1, 2, 1),
        "sorted_set",
        "Stores a range of members from sorted set in a key.",
        zset::zrangestore
    ),
    spec!(
        "zintercard",
        -3,
        RS,
        K0,
        "sorted_set",
        "Returns the number of members of the intersect of multiple sorted sets.",
        zset::zintercard
    ),
    spec!(
        "zrandmember",
        -2,
        RS,
        K1,
        "sorted_set",
        "Returns one or more random members from a sorted set.",
        zset::zrandmember
    ),
    spec!(
        "zscan",
        -3,
        RS,
        K1,
        "sorted_set",
        "Iterates over members and scores of a sorted set.",
        zset::zscan
    ),
    spec!(
        "zunion",
        -3,
        RS,
        K0,
        "sorted_set",
        "Adds multiple sorted sets.",
        zset::zunion
    ),
    spec!(
        "zinter",
        -3,
        RS,
        K0,
        "sorted_set",
        "Returns the intersect of multiple sorted sets.",
        zset::zinter
    ),
    spec!(
        "zdiff",
        -3,
        RS,
        K0,
        "sorted_set",
        "Returns the difference between multiple sorted sets.",
        zset::zdiff
    ),
    spec!(
        "zunionstore",
        -4,
        WS,
        K0,
        "sorted_set",
        "Stores the union of multiple sorted sets in a key.",
        zset::zunionstore
    ),
    spec!(
        "zinterstore",
        -4,
        WS,
        K0,
        "sorted_set",
        "Stores the intersect of multiple sorted sets in a key.",
        zset::zinterstore
    ),
    spec!(
        "zdiffstore",
        -4,
        WS,
        K0,
        "sorted_set",
        "Stores the difference of multiple sorted sets in a key.",
        zset::zdiffstore
    ),
    spec!(
        "lpush",
        -3,
        W,
        K1,
        "list",
        "Prepends elements to a list.",
        list::lpush
    ),
    spec!(
        "rpush",
        -3,
        W,
        K1,
        "list",
        "Appends elements to a list.",
        list::rpush
    ),
    spec!(
        "lpushx",
        -3,
        W,
        K1,
        "list",
        "Prepends elements to an existing list.",
        list::lpushx
    ),
    spec!(
        "rpushx",
        -3,
        W,
        K1,
        "list",
        "Appends elements to an existing list.",
        list::rpushx
    ),
    spec!(
        "lpop",
        -2,
        WD,
        K1,
        "list",
        "Removes and returns the first elements of a list.",
        list::lpop
    ),
    spec!(
        "rpop",
        -2,
        WD,
        K1,
        "list",
        "Removes and returns the last elements of a list.",
        list::rpop
    ),
    spec!(
        "llen",
        2,
        R,
        K1,
        "list",
        "Returns the length of a list.",
        list::llen
    ),
    spec!(
        "lrange",
        4,
        RS,
        K1,
        "list",
        "Returns a range of elements of a list.",
        list::lrange
    ),
    spec!(
        "lindex",
        3,
        RS,
        K1,
        "list",
        "Returns an element of a list by its index.",
        list::lindex
    ),
    spec!(
        "lset",
        4,
        WS,
        K1,
        "list",
        "Sets the value of an element of a list by its index.",
        list::lset
    ),
    spec!(
        "lrem",
        4,
        WD,
        K1,
        "list",
        "Removes elements from a list.",
        list::lrem
    ),
    spec!(
        "ltrim",
        4,
        WD,
        K1,
        "list",
        "Trims a list to a range.",
        list::ltrim
    ),
    spec!(
        "linsert",
        5,
        WS,
        K1,
        "list",
        "Inserts an element before or after another.",
        list::linsert
    ),
    spec!(
        "lpos",
        -3,
        RS,
        K1,
        "list",
        "Returns the index of matching elements of a list.",
        list::lpos
    ),
    spec!(
        "lmove",
        5,
        WS,
        (1, 2, 1),
        "list",
        "Moves an element from one list to another.",
        list::lmove
    ),
    spec!(
        "rpoplpush",
        3,
        WS,
        (1, 2, 1),
        "list",
        "Moves the last element of a list to the head of another.",
        list::rpoplpush
    ),
    spec!(
        "blpop",
        -3,
        WB,
        (1, -2, 1),
        "list",
        "Removes and returns the first element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.",
        blocking::blpop
    ),
    spec!(
        "brpop",
        -3,
        WB,
        (1, -2, 1),
        "list",
        "Removes and returns the last element in a list. Blocks until an element is available otherwise. Deletes the list if the last element was popped.",
        blocking::brpop
    ),
    spec!(
        "blmove",
        6,
        WBM,
        (1, 2, 1),
        "list",
        "Pops an element from a list, pushes it to another list and returns it. Blocks until an element is available otherwise. Deletes the list if the last element was moved.",
        blocking::blmove
    ),
    spec!(
        "brpoplpush",
        4,
        WBM,
        (1, 2, 1),
        "list",
        "Pops an element from a list, pushes it to another list and returns it. Block until an element is available otherwise. Deletes the list if the last element was popped.",
        blocking::brpoplpush
    ),
    spec!(
        "blmpop",
        -5,
        WB,
        K0,
        "list",
        "Pops the first element from one of multiple lists. Blocks until an element is available otherwise. Deletes the list if the last element was popped.",
        blocking::blmpop
    ),
    spec!(
        "lmpop",
        -4,
        &["write"],
        K0,
        "list",
        "Returns multiple elements from a list after removing them. Deletes the list if the last element was popped.",
        blocking::lmpop
    ),
    // Transactions (commands/multi.rs).
    spec!(
        "multi",
        1,
        TX,
        K0,
        "transactions",
        "Starts a transaction.",
        multi::multi
    ),
    spec!(
        "exec",
        1,
        TX_EXEC,
        K0,
        "transactions",
        "Executes all commands in a transaction.",
        multi::exec
    ),
    spec!(
        "discard",
        1,
        TX,
        K0,
        "transactions",
        "Discards a transaction.",
        multi::discard
    ),
    spec!(
        "watch",
        -2,
        TX,
        KALL,
        "transactions",
        "Monitors changes to keys to determine the execution of a transaction.",
        multi::watch
    ),
    spec!(
        "unwatch",
        1,
        TX,
        K0,
        "transactions",
        "Forgets about watched keys of a transaction.",
        multi::unwatch
    ),
    spec!(
        "reset",
        1,
        &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "noauth",
            "allow_busy"
        ],
        K0,
        "connection",
        "Resets the connection.",
        multi::reset
    ),
    // Pub/sub (commands/pubsub.rs).
    spec!(
        "subscribe",
        -2,
        PS,
        K0,
        "pubsub",
        "Listens for messages published to channels.",
        pubsub::subscribe
    ),
    spec!(
        "unsubscribe",
        -1,
        PS,
        K0,
        "pubsub",
        "Stops listening to messages posted to channels.",
        pubsub::unsubscribe
    ),
    spec!(
        "psubscribe",
        -2,
        PS,
        K0,
        "pubsub",
        "Listens for messages published to channels that match one or more patterns.",
        pubsub::psubscribe
    ),
    spec!(
        "punsubscribe",
        -1,
        PS,
        K0,
        "pubsub",
        "Stops listening to messages published to channels that match one or more patterns.",
        pubsub::punsubscribe
    ),
    spec!(
        "publish",
        3,
        PS_PUB,
        K0,
        "pubsub",
        "Posts a message to a channel.",
        pubsub::publish
    ),
    spec!(
        "ssubscribe",
        -2,
        PS,
        K0,
        "pubsub",
        "Listens for messages published to shard channels.",
        pubsub::ssubscribe
    ),
    spec!(
        "sunsubscribe",
        -1,
        PS,
        K0,
        "pubsub",
        "Stops listening to messages posted to shard channels.",
        pubsub::sunsubscribe
    ),
    spec!(
        "spublish",
        3,
        PS_PUB,
        K0,
        "pubsub",
        "Post a message to a shard channel",
        pubsub::spublish
    ),
    spec!(
        "pubsub",
        -2,
        &["pubsub"],
        K0,
        "pubsub",
        "A container for Pub/Sub commands.",
        pubsub::pubsub
    ),
];
