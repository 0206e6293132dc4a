//! Integration tests of the `nibble` server, in one test binary so that it
//! links once: every module starts its own in-process server on ephemeral
//! ports (or the real binary, in `process`).

mod blocking;
mod collections;
mod commands;
mod common;
mod datadir;
mod differential;
mod eviction;
mod expiry;
mod hashes_admin;
mod limits;
mod mc_binary;
mod mc_meta;
mod memcached;
mod migrate;
mod multi;
mod obuf;
mod parsers;
mod pipeline;
mod power;
mod process;
mod rdb;
mod replica;
mod resp3;
mod security;
mod steer;
mod tls;
