//! Differential tests: the same commands to `nibble` and to a real
//! redis-server 7.0, replies compared exactly (errors included).
//!
//! A case is a list of commands run in order on both servers after a
//! FLUSHALL; every reply must be equal, value for value, as the RESP
//! reader decodes it (so simple strings, errors, integers, bulk strings,
//! nulls and arrays all count). Only replies that must differ are
//! normalized, and each such command says so where it is listed:
//! a time to live or an absolute expiry (TTL, PTTL, EXPIRETIME,
//! PEXPIRETIME, OBJECT IDLETIME) is compared within a tolerance, since
//! the two servers read the clock at different instants.
//!
//! When redis-server is not installed, each test prints a `SKIPPED` line
//! and passes. Modules: [`harness`] (servers and the comparison), the case
//! lists by command group, and [`prop`] (random command sequences).

mod bits;
mod blocking;
mod collections;
mod dump;
pub mod harness;
mod keyspace;
mod lists;
mod multi;
mod prop;
mod strings;
mod zsets;
