//! `appendfsync`: when a write to a store on disk (`--data-dir`) is
//! durable, in Redis's terms (redis.conf's APPEND ONLY MODE section).
//!
//! The shared store is a log on disk already (`nibblejmp`): there is no
//! separate append-only file to write, only the question of when the
//! log's dirty pages are forced to the disk. The policies are Redis's:
//!
//! | `appendfsync` | a write is acknowledged | lost in a power cut |
//! |---|---|---|
//! | `always` | after a flush that covers it | nothing acknowledged |
//! | `everysec` (default) | at once; a thread flushes once a second | about the last second (up to 2 s if a flush is slow) |
//! | `no` | at once; the kernel writes back when it likes | up to ~30 s (`vm.dirty_expire_centisecs`) |
//!
//! A flush is `nibblejmp::SharedStore::flush_to_disk` (`msync(MS_SYNC)`
//! of the meta segment, then of the log; the index is rebuilt by recovery
//! instead, see `nibblejmp`'s `store/durability.rs` for what has to reach
//! the disk and why recovery then finds a consistent store). With
//! `always` or `everysec` the store's two durability rules are on: a
//! replaced object is killed only after its replacement is durable, and a
//! compacted segment is reused only after its copies are.
//!
//! ## Group commit (`always`)
//!
//! One flusher thread does every flush; connections never flush. A
//! connection that ran a write command (`Session::dirty`, a memcached
//! text request that `McCommand::may_write`, or any binary one) takes a ticket before it writes its replies: it
//! bumps the write sequence number `seq` (after its writes, so they are in
//! the page cache before any flush that reads a `seq` at least as large)
//! and wakes the flusher, then awaits `durable >= ticket` on a watch
//! channel, and other connections of its worker run meanwhile (the wait
//! is a tokio await, not a blocked thread). The flusher loads `seq`,
//! flushes, publishes that number as `durable`, and loops while tickets
//! are ahead of it. So every ticket taken while a flush runs is covered
//! by the next one: with 32 clients, one flush answers all the writes
//! that arrived during the previous one, and the flush rate is bounded
//! by the disk's flush latency, not by the write rate (Redis's
//! `always` does one `fsync` per event-loop turn, which also batches the
//! clients served in that turn). Replies of a pipelined batch wait once,
//! at the end of the batch (or when the output buffer is flushed early).
//!
//! `everysec`: the same thread flushes once a second. `no`: it sleeps.
//! `CONFIG SET appendfsync` takes effect at once; tickets taken under
//! `always` are still honoured after a switch.
//!
//! A flush that fails (a disk error) is logged and counted
//! (`aof_last_write_status:err`); under `always` the waiting writes are
//! not acknowledged until a later flush succeeds.
//!
//! Index checkpoints: with `always` or `everysec` at start and
//! `--checkpoint-interval` > 0 (default 60 s), `start` turns on the
//! store's checkpoint thread (`nibblejmp`'s `store/checkpoint.rs`), so a
//! restart after a power cut walks only the log written since the last
//! checkpoint; `INFO persistence` reports `checkpoints`,
//! `checkpoint_last_ms` and the tombstones deletes wrote. A later `CONFIG
//! SET appendfsync no` leaves them running (with no guarantee after a
//! power cut under `no`, as without them).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::state::Shared;

/// Interval of the `everysec` flush.
pub const EVERYSEC_INTERVAL_MS: u64 = 1000;
/// Longest the flusher sleeps between checks of shutdown and policy.
const FLUSHER_NAP_MS: u64 = 100;

/// The policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Appendfsync {
    /// Acknowledge after a flush (group commit).
    Always,
    /// Flush once a second.
    Everysec,
    /// Leave it to the kernel.
    No,
}

impl Appendfsync {
    /// The redis.conf name.
    pub fn name(self) -> &'static str {
        match self {
            Appendfsync::Always => "always",
            Appendfsync::Everysec => "everysec",
            Appendfsync::No => "no",
        }
    }

    fn to_byte(self) -> u8 {
        self as u8
    }

    fn from_byte(b: u8) -> Appendfsync {
        match b {
            0 => Appendfsync::Always,
            1 => Appendfsync::Everysec,
            _ => Appendfsync::No,
        }
    }
}

impl std::str::FromStr for Appendfsync {
    type Err = String;
    fn from_str(s: &str) -> Result<Appendfsync, String> {
        match s.to_ascii_lowercase().as_str() {
            "always" => Ok(Appendfsync::Always),
            "everysec" => Ok(Appendfsync::Everysec),
            "no" => Ok(Appendfsync::No),
            _ => Err(format!(
                "invalid appendfsync {s:?}: expected always, everysec or no"
            )),
        }
    }
}

/// The server's durability state (one per server).
pub struct Durability {
    policy: AtomicU8,
    /// A store on disk is being served (`--data-dir`); otherwise the
    /// policy is shown but nothing is flushed.
    enabled: bool,
    /// Tickets taken (write batches waiting under `always`).
    seq: AtomicU64,
    /// The highest ticket a flush has covered.
    durable: watch::Sender<u64>,
    /// The flusher, to wake it.
    flusher: OnceLock<std::thread::Thread>,
    /// The last flush failed.
    failed: AtomicBool,
    /// When the last successful flush ended (ms since the server started).
    last_flush_ms: AtomicU64,
    /// Write batches that waited for a flush.
    waits: AtomicU64,
}

impl Durability {
    /// `policy` at start; `enabled` when a data-dir store is served.
    pub fn new(policy: Appendfsync, enabled: bool) -> Durability {
        Durability {
            policy: AtomicU8::new(policy.to_byte()),
            enabled,
            seq: AtomicU64::new(0),
            durable: watch::channel(0).0,
            flusher: OnceLock::new(),
            failed: AtomicBool::new(false),
            last_flush_ms: AtomicU64::new(0),
            waits: AtomicU64::new(0),
        }
    }

    /// The policy in force.
    pub fn policy(&self) -> Appendfsync {
        Appendfsync::from_byte(self.policy.load(Ordering::Relaxed))
    }

    /// True when replies to writes must wait for a flush.
    #[inline]
    pub fn waits_for_flush(&self) -> bool {
        self.enabled && self.policy.load(Ordering::Relaxed) == Appendfsync::Always.to_byte()
    }

    /// Take a ticket for the writes this connection has done and wait
    /// until a flush covers it (module essay).
    pub async fn wait_durable(&self) {
        let ticket = self.seq.fetch_add(1, Ordering::SeqCst) + 1;
        self.waits.fetch_add(1, Ordering::Relaxed);
        let mut rx = self.durable.subscribe();
        self.wake();
        // The sender lives as long as `self`; an error cannot happen
        // while a connection holds the server state.
        let _ = rx.wait_for(|d| *d >= ticket).await;
    }

    fn wake(&self) {
        if let Some(t) = self.flusher.get() {
            t.unpark();
        }
    }

    /// Switch the policy (CONFIG SET); turns the store's durability
    /// rules on or off to match.
    pub fn set_policy(&self, shared: &Shared, p: Appendfsync) -> Result<(), String> {
        self.policy.store(p.to_byte(), Ordering::Relaxed);
        if let Some(s) = shared.store.shared() {
            s.store()
                .set_durable(p != Appendfsync::No)
                .map_err(|e| format!("flushing the store: {e}"))?;
        }
        self.wake();
        Ok(())
    }

    /// The INFO persistence section `rdb` (that of `crate::rdb`) with
    /// Redis's `aof_enabled` and `aof_last_write_status` filled in and
    /// the flush lines added at its end.
    pub fn info_section(&self, shared: &Shared, rdb: String) -> String {
        let mut o = rdb
            .replace(
                "aof_enabled:0\r\n",
                &format!("aof_enabled:{}\r\n", u8::from(self.enabled)),
            )
            .replace(
                "aof_last_write_status:ok\r\n",
                &format!("aof_last_write_status:{}\r\n", self.status()),
            );
        if o.ends_with("\r\n\r\n") {
            o.truncate(o.len() - 2);
        }
        o.push_str(&self.info(shared));
        o.push_str("\r\n");
        o
    }

    /// INFO persistence lines of the policy and the flushes.
    fn info(&self, shared: &Shared) -> String {
        let fs = shared
            .store
            .shared()
            .map(|s| s.store().flush_stats())
            .unwrap_or_default();
        let cs = shared
            .store
            .shared()
            .map(|s| s.store().checkpoint_stats())
            .unwrap_or_default();
        let last = self.last_flush_ms.load(Ordering::Relaxed);
        let age = if last == 0 {
            -1
        } else {
            ((shared.started.elapsed().as_millis() as u64).saturating_sub(last) / 1000) as i64
        };
        format!(
            "appendfsync:{}\r\naof_durable_store:{}\r\naof_flushes:{}\r\naof_flush_us_total:{}\r\naof_flush_errors:{}\r\naof_group_commit_waits:{}\r\naof_deferred_kills:{}\r\naof_inline_flushes:{}\r\naof_last_flush_age_sec:{age}\r\ncheckpoints:{}\r\ncheckpoint_errors:{}\r\ncheckpoint_last_epoch:{}\r\ncheckpoint_last_ms:{}\r\ncheckpoint_last_bytes:{}\r\ncheckpoint_tombstones:{}\r\n",
            self.policy().name(),
            u8::from(self.enabled),
            fs.flushes,
            fs.flush_us_total,
            fs.flush_errors,
            self.waits.load(Ordering::Relaxed),
            fs.deferred_kills,
            fs.inline_flushes,
            cs.checkpoints,
            cs.errors,
            cs.last_epoch,
            cs.last_ms,
            cs.last_bytes,
            cs.tombstones,
        )
    }

    /// `aof_last_write_status`.
    fn status(&self) -> &'static str {
        if self.failed.load(Ordering::Relaxed) {
            "err"
        } else {
            "ok"
        }
    }
}

/// Start the flusher thread if a store on disk is served: turn the
/// store's durability rules on (flushing once, so the store is marked in
/// use on disk) and flush by the policy until shutdown.
pub fn start(shared: &Arc<Shared>) -> std::io::Result<Option<std::thread::JoinHandle<()>>> {
    let Some(s) = shared.store.shared() else {
        return Ok(None);
    };
    let d = &shared.durability;
    s.store()
        .set_durable(d.policy() != Appendfsync::No)
        .map_err(|e| std::io::Error::other(format!("flushing the store at start: {e}")))?;
    // Index checkpoints bound the walk after a power cut; they rely on
    // the durability rules, so `appendfsync no` takes none.
    let every = shared.config.checkpoint_interval_s;
    if every > 0 && d.policy() != Appendfsync::No {
        s.store()
            .set_checkpoint_interval(Some(Duration::from_secs(every)))
            .map_err(|e| std::io::Error::other(format!("starting checkpoints: {e}")))?;
    }
    let sh = shared.clone();
    let h = std::thread::Builder::new()
        .name("nibble-aof".into())
        .spawn(move || flusher(&sh))?;
    let _ = d.flusher.set(h.thread().clone());
    Ok(Some(h))
}

fn flusher(shared: &Shared) {
    let d = &shared.durability;
    let Some(s) = shared.store.shared() else {
        return;
    };
    let mut last = Instant::now();
    while !shared.stopping.load(Ordering::Relaxed) {
        let covered = *d.durable.borrow();
        let pending = d.seq.load(Ordering::SeqCst);
        let due = match d.policy() {
            // Tickets are honoured whatever the policy is now.
            _ if pending > covered => true,
            Appendfsync::Everysec => last.elapsed() >= Duration::from_millis(EVERYSEC_INTERVAL_MS),
            _ => false,
        };
        if !due {
            let nap = match d.policy() {
                Appendfsync::Everysec => Duration::from_millis(EVERYSEC_INTERVAL_MS)
                    .saturating_sub(last.elapsed())
                    .min(Duration::from_millis(FLUSHER_NAP_MS)),
                _ => Duration::from_millis(FLUSHER_NAP_MS),
            };
            std::thread::park_timeout(nap);
            continue;
        }
        last = Instant::now();
        match s.store().flush_to_disk() {
            Ok(()) => {
                if d.failed.swap(false, Ordering::Relaxed) {
                    log::warn!("flushing the store in {} works again", s.dir.display());
                }
                d.last_flush_ms.store(
                    (shared.started.elapsed().as_millis() as u64).max(1),
                    Ordering::Relaxed,
                );
                d.durable.send_if_modified(|v| {
                    let grew = pending > *v;
                    *v = (*v).max(pending);
                    grew
                });
            }
            Err(e) => {
                if !d.failed.swap(true, Ordering::Relaxed) {
                    log::error!("flushing the store in {}: {e}", s.dir.display());
                }
                std::thread::sleep(Duration::from_millis(FLUSHER_NAP_MS));
            }
        }
    }
}
