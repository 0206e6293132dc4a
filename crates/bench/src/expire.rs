//! `memlab expire`: bulk TTL expiry in process (issue 23; Segcache
//! NSDI'21 §4.1-4.2): with TTL placement, objects that expire together
//! share segments and the expiry pass frees those segments whole reading
//! only them; without it, expired objects sit in mixed segments that must
//! be read (and compacted) to get their memory back. Both run side by
//! side in one invocation (`Config::ttl_placement` on and off).
//!
//! ```text
//!  per mode x placement (a fresh store of --capacity-mib):
//!    load:  P persistent keys (no TTL), value V bytes
//!    write: for W s, one writer at R writes/s of new keys: a third
//!           without a TTL, a third with a 1 s TTL, a third with 5 s
//!    drain: D s without writes (the last TTL keys expire at W + 5 s)
//!    every 100 ms: blocks in segments (memory held), live bytes, RSS,
//!    and the bytes the writer's schedule says are unexpired
//! ```
//!
//! Rows: `expire-sample` (every `EMIT_EVERY` samples: `t_ms` since the
//! write phase began, `held_bytes`
//! = blocks in segments x 64 KiB, `live_bytes`, `unexpired_bytes` from the
//! schedule, `rss_bytes`, `items`) and `expire` per cell:
//! `ttl_bytes_written` (every one of them expires), `expiry_bytes_read`,
//! `read_per_expired` (their ratio), `expired_segments`,
//! `bytes_relocated` (compaction's copying), `excess_mean_bytes` (held
//! minus unexpired, mean over the write phase: memory held by expired
//! objects and open segments), and `reuse_lag_ms`: from the last expiry
//! (W + 5 s) until the memory held falls to the persistent data's
//! segments (at most `SETTLED_SLACK_BYTES` above its live bytes); -1 if it
//! never does within the drain.

use std::time::{Duration, Instant};

use nibble::{Config, Expiry, Mode, PutOptions, Store};

use crate::report::{Reporter, Row};

/// What a run measures.
pub struct ExpireOpts {
    /// Persistent keys.
    pub keys: u64,
    pub value_bytes: usize,
    /// Writes per second during the write phase.
    pub rate: u64,
    /// Write phase, seconds.
    pub write_secs: f64,
    /// Drain phase, seconds.
    pub drain_secs: f64,
    pub capacity_mib: usize,
    /// Runs of every cell (each its own rows, numbered by `run`).
    pub repeat: usize,
}

/// How often the memory is sampled.
const SAMPLE_MS: u64 = 100;
/// Samples between two `expire-sample` rows.
const EMIT_EVERY: usize = 5;
/// Writes between two rate checks.
const RATE_BATCH: u64 = 256;
/// The short and the long TTL, ms.
const TTLS_MS: [u64; 2] = [1000, 5000];
/// "Settled": memory held at most this far above the live bytes
/// (segment tails, open heads).
const SETTLED_SLACK_BYTES: u64 = 4 << 20;
/// Bytes per object besides key and value (the engine's common header).
const HEADER_BYTES: u64 = nibble::object::HEADER_MIN_BYTES as u64;

fn key_bytes(prefix: &str, k: u64, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(format!("{prefix}:{k:012}").as_bytes());
}

struct Sample {
    t_ms: u64,
    held: u64,
    live: u64,
    unexpired: u64,
    rss: u64,
    items: u64,
}

struct Cell {
    samples: Vec<Sample>,
    ttl_bytes: u64,
    stats: nibble::Stats,
    reuse_lag_ms: i64,
    excess_mean: f64,
}

/// One cell: a fresh store, load, write, drain.
fn cell(o: &ExpireOpts, mode: Mode, placement: bool) -> Cell {
    let mut cfg = Config::new(o.capacity_mib << 20);
    cfg.mode = mode;
    cfg.ttl_placement = placement;
    let s = Store::new(cfg).expect("store");
    let value = vec![b'v'; o.value_bytes];
    let mut key = Vec::new();
    for k in 0..o.keys {
        key_bytes("keep", k, &mut key);
        s.put(&key, &value).expect("load");
    }
    let obj_bytes = 16 + o.value_bytes as u64 + HEADER_BYTES;
    // A TTL write's object carries the expiry slot too.
    let ttl_obj_bytes = obj_bytes + nibble::object::EXPIRY_SLOT_BYTES as u64;
    let mut persistent = o.keys * obj_bytes;
    let start = Instant::now();
    let write = Duration::from_secs_f64(o.write_secs);
    let end = write + Duration::from_secs_f64(o.drain_secs);
    // The expiry of every TTL write, per TTL, in order: unexpired bytes at t
    // are those with expiry > t (two FIFO queues, one per TTL).
    let mut expiries: [std::collections::VecDeque<u64>; 2] = Default::default();
    let mut samples = Vec::new();
    let mut next_sample = Duration::ZERO;
    let (mut n, mut ttl_bytes, mut fresh) = (0u64, 0u64, 0u64);
    loop {
        let el = start.elapsed();
        if el >= next_sample {
            let now = nibble::object::now_ms();
            for q in &mut expiries {
                while q.front().is_some_and(|&e| e <= now) {
                    q.pop_front();
                }
            }
            let st = s.stats();
            samples.push(Sample {
                t_ms: el.as_millis() as u64,
                held: st.blocks_in_use * 65536,
                live: st.live_bytes,
                unexpired: persistent
                    + (expiries[0].len() + expiries[1].len()) as u64 * ttl_obj_bytes,
                rss: crate::util::rss_bytes().unwrap_or(0),
                items: st.items,
            });
            next_sample += Duration::from_millis(SAMPLE_MS);
        }
        if el >= end {
            break;
        }
        if el >= write {
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        // Keep to the rate: RATE_BATCH writes, then wait for the schedule.
        let due = (el.as_secs_f64() * o.rate as f64) as u64;
        if n >= due {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        for _ in 0..RATE_BATCH {
            match n % 3 {
                0 => {
                    key_bytes("keep", o.keys + n, &mut key);
                    s.put(&key, &value).expect("write");
                    persistent += obj_bytes;
                }
                c => {
                    let t = (c - 1) as usize;
                    let at = nibble::object::now_ms() + TTLS_MS[t];
                    key_bytes("ttl", fresh, &mut key);
                    fresh += 1;
                    let opts = PutOptions {
                        expiry: Expiry::At(at),
                        ..Default::default()
                    };
                    s.put_with(&key, &value, opts).expect("ttl write");
                    expiries[t].push_back(at);
                    ttl_bytes += ttl_obj_bytes;
                }
            }
            n += 1;
        }
    }
    let last_expiry_ms = (write.as_millis() as u64 + TTLS_MS[1]) as i64;
    let settled = samples
        .iter()
        .find(|x| x.t_ms as i64 >= last_expiry_ms && x.held <= persistent + SETTLED_SLACK_BYTES);
    let reuse_lag_ms = settled.map_or(-1, |x| x.t_ms as i64 - last_expiry_ms);
    let writing: Vec<&Sample> = samples
        .iter()
        .filter(|x| x.t_ms <= write.as_millis() as u64)
        .collect();
    let excess_mean = writing
        .iter()
        .map(|x| x.held.saturating_sub(x.unexpired) as f64)
        .sum::<f64>()
        / writing.len().max(1) as f64;
    Cell {
        samples,
        ttl_bytes,
        stats: s.stats(),
        reuse_lag_ms,
        excess_mean,
    }
}

/// Run it all.
pub fn run(o: &ExpireOpts, rep: &mut Reporter) -> std::io::Result<()> {
    for run in 0..o.repeat.max(1) {
        for mode in [Mode::Nibble, Mode::Nibble2] {
            for placement in [true, false] {
                let c = cell(o, mode, placement);
                let placement_name = if placement { "on" } else { "off" };
                for x in c.samples.iter().step_by(EMIT_EVERY) {
                    rep.emit(
                        Row::new("expire-sample", mode.name(), 1)
                            .set("placement", placement_name)
                            .set("run", run as u64)
                            .set("t_ms", x.t_ms)
                            .set("held_bytes", x.held)
                            .set("live_bytes", x.live)
                            .set("unexpired_bytes", x.unexpired)
                            .set("rss_bytes", x.rss)
                            .set("items", x.items),
                    )?;
                }
                let st = &c.stats;
                rep.emit(
                    Row::new("expire", mode.name(), 1)
                        .set("placement", placement_name)
                        .set("run", run as u64)
                        .set("ttl_bytes_written", c.ttl_bytes)
                        .set("expiry_bytes_read", st.expiry_bytes_read)
                        .set_f(
                            "read_per_expired",
                            st.expiry_bytes_read as f64 / c.ttl_bytes.max(1) as f64,
                            3,
                        )
                        .set("expired_segments", st.expired_segments)
                        .set("expiry_mixed_scans", st.expiry_mixed_scans)
                        .set("bytes_relocated", st.bytes_relocated)
                        .set("segment_bytes", st.segment_bytes)
                        .set_f("excess_mean_bytes", c.excess_mean, 0)
                        .set("reuse_lag_ms", c.reuse_lag_ms),
                )?;
            }
        }
    }
    rep.finish()
}
