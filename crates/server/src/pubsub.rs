//! Pub/sub delivery across worker threads: a sharded channel registry and
//! one bounded mailbox per subscribed connection.
//!
//! A subscriber's connection task lives on one worker's single-threaded
//! runtime; a publisher can be on any other. PUBLISH therefore never
//! writes to another connection's socket or output buffer. It appends an
//! `Arc` of the message to each receiver's [`Mailbox`] (a short mutex per
//! receiver, never held across I/O) and wakes that receiver's task with a
//! [`tokio::sync::Notify`] when its mailbox goes from empty to non-empty.
//! The receiving task encodes the messages in its own protocol (RESP2
//! array or RESP3 push) when it drains them, at most one output chunk at a
//! time, then writes them:
//!
//! ```text
//!   worker 0: PUBLISH ch m ── shard(ch).read() ── for each mailbox: lock, push Arc(m), unlock ── wake if it was empty
//!   worker 1: subscriber task: (woken) ── drain ≤ OUT_SOFT bytes, encode ── write ── drain again ── wait
//! ```
//!
//! No global lock on PUBLISH's path: channels are spread over
//! [`CHANNEL_SHARDS`] reader-writer locks by the channel's hash; PUBLISH
//! takes its channel's shard shared (SUBSCRIBE and UNSUBSCRIBE take it
//! exclusively, briefly). Pattern subscriptions are one list under one
//! reader-writer lock, skipped entirely (one relaxed load) while nobody
//! has a pattern: patterns must be matched against every published
//! channel, so there is no key to shard them by.
//!
//! Output buffer limits, as Redis's `client-output-buffer-limit pubsub
//! 32mb 8mb 60` (the defaults; CONFIG SET and the config file change
//! them, read at every push from [`OutputLimits`]): a mailbox counts the
//! bytes it holds (channel, pattern, payload and
//! [`MESSAGE_OVERHEAD_BYTES`] per message; CLIENT LIST shows them as
//! `omem`). A push that takes it past the hard limit (default
//! [`PUBSUB_HARD_LIMIT_BYTES`]), or that finds it above the soft limit
//! ([`PUBSUB_SOFT_LIMIT_BYTES`]) continuously for the soft seconds
//! ([`PUBSUB_SOFT_LIMIT_SECS`]), kills the subscriber; 0 turns a limit off: its queue is freed at
//! once, later pushes are dropped, and its task (woken through `killed`
//! even while it is blocked writing to a client that does not read)
//! closes the connection. So the memory one subscriber can hold is the
//! hard limit plus one output chunk ([`crate::conn::OUT_SOFT`]) plus the
//! kernel's socket buffer. A connection that closes removes its
//! subscriptions from the registry ([`Subs`]'s `Drop`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_utils::CachePadded;
use parking_lot::{Mutex, RwLock};
use tokio::sync::Notify;

use crate::config::{OutputLimits, OBUF_PUBSUB};
use crate::resp::{Proto, Reply};
use crate::state::ClientInfo;

/// Disconnect a subscriber whose pending messages pass this many bytes.
pub const PUBSUB_HARD_LIMIT_BYTES: usize = 32 << 20;
/// ... or stay above this many bytes ...
pub const PUBSUB_SOFT_LIMIT_BYTES: usize = 8 << 20;
/// ... for this many seconds.
pub const PUBSUB_SOFT_LIMIT_SECS: u64 = 60;
/// Bytes counted per message on top of its channel, pattern and payload
/// (the queue entry and the RESP framing).
pub const MESSAGE_OVERHEAD_BYTES: usize = 48;
/// Shards of the channel registry (a power of two).
pub const CHANNEL_SHARDS: usize = 64;

/// One published message, shared by all its receivers.
pub struct Message {
    channel: Box<[u8]>,
    payload: Box<[u8]>,
}

/// A message in one mailbox: the pattern it matched, if it came by one;
/// `shard` for SPUBLISH's (`smessage`).
struct Delivery {
    msg: Arc<Message>,
    pattern: Option<Arc<[u8]>>,
    shard: bool,
}

impl Delivery {
    fn bytes(&self) -> usize {
        self.msg.channel.len()
            + self.msg.payload.len()
            + self.pattern.as_ref().map_or(0, |p| p.len())
            + MESSAGE_OVERHEAD_BYTES
    }

    fn encode(&self, r: &mut Reply) {
        match &self.pattern {
            None => {
                r.push(3);
                r.bulk(if self.shard { b"smessage" } else { b"message" });
            }
            Some(p) => {
                r.push(4);
                r.bulk(b"pmessage");
                r.bulk(p);
            }
        }
        r.bulk(&self.msg.channel);
        r.bulk(&self.msg.payload);
    }
}

#[derive(Default)]
struct Queue {
    items: VecDeque<Delivery>,
    bytes: usize,
    /// Since when the queue has been above the soft limit.
    soft_since: Option<Instant>,
    /// The soft limit the last push saw (bytes; 0 = none).
    soft_limit: u64,
}

/// One subscribed connection's pending messages.
pub struct Mailbox {
    queue: Mutex<Queue>,
    /// Wakes the connection when the queue becomes non-empty.
    pub wake: Notify,
    /// Wakes the connection when it is killed (also while it writes).
    pub kill: Notify,
    killed: AtomicBool,
    /// Its client (the log line, CLIENT LIST's `omem`).
    info: Arc<ClientInfo>,
}

impl Mailbox {
    fn new(info: Arc<ClientInfo>) -> Mailbox {
        Mailbox {
            queue: Mutex::default(),
            wake: Notify::new(),
            kill: Notify::new(),
            killed: AtomicBool::new(false),
            info,
        }
    }

    /// Over an output buffer limit: the connection must close.
    pub fn is_killed(&self) -> bool {
        self.killed.load(Ordering::Acquire)
    }

    fn push(&self, d: Delivery, limits: &OutputLimits) {
        if self.is_killed() {
            return;
        }
        let (hard, soft, soft_secs) = limits.get(OBUF_PUBSUB);
        let mut q = self.queue.lock();
        let was_empty = q.items.is_empty();
        q.soft_limit = soft;
        q.bytes += d.bytes();
        q.items.push_back(d);
        let bytes = q.bytes as u64;
        let over = if hard > 0 && bytes > hard {
            true
        } else if soft > 0 && bytes > soft {
            let since = *q.soft_since.get_or_insert_with(Instant::now);
            since.elapsed().as_secs() >= soft_secs
        } else {
            false
        };
        self.info.omem.store(bytes, Ordering::Relaxed);
        if over {
            *q = Queue::default();
            drop(q);
            self.info.omem.store(0, Ordering::Relaxed);
            self.killed.store(true, Ordering::Release);
            crate::warn_limited!(
                KILL_LOG,
                "client id={} closed for overcoming of output buffer limits ({} bytes of pub/sub messages pending)",
                self.info.id,
                bytes
            );
            self.kill.notify_one();
            self.wake.notify_one();
        } else {
            drop(q);
            if was_empty {
                self.wake.notify_one();
            }
        }
    }

    /// Encode pending messages into `out` until it holds `budget` bytes;
    /// true if some remain.
    pub fn drain(&self, out: &mut Vec<u8>, proto: Proto, budget: usize) -> bool {
        let mut q = self.queue.lock();
        let mut r = Reply { out, proto };
        while r.out.len() < budget {
            let Some(d) = q.items.pop_front() else { break };
            q.bytes -= d.bytes();
            d.encode(&mut r);
        }
        // Below the soft limit now: its clock starts again next time.
        if q.bytes as u64 <= q.soft_limit {
            q.soft_since = None;
        }
        self.info.omem.store(q.bytes as u64, Ordering::Relaxed);
        !q.items.is_empty()
    }

    /// Messages waiting?
    pub fn has_mail(&self) -> bool {
        !self.queue.lock().items.is_empty()
    }
}

/// Subscribers closed for their output buffer: 10 log lines a second.
static KILL_LOG: crate::auth::LogLimiter = crate::auth::LogLimiter::new(10);

type Subscribers = Vec<Arc<Mailbox>>;
/// One shard of the channel registry: channel → its subscribers.
type ChannelShard = CachePadded<RwLock<HashMap<Box<[u8]>, Subscribers>>>;
/// Pattern subscriptions: (pattern, subscriber).
type PatternList = Vec<(Arc<[u8]>, Arc<Mailbox>)>;

/// The registry of channel and pattern subscriptions.
pub struct Hub {
    shards: Box<[ChannelShard]>,
    /// Shard channels (SSUBSCRIBE/SPUBLISH), a registry of their own.
    sshards: Box<[ChannelShard]>,
    patterns: RwLock<PatternList>,
    /// Pattern subscriptions (so PUBLISH can skip the list when 0).
    npatterns: AtomicUsize,
    /// client-output-buffer-limit (the pubsub class applies here).
    limits: Arc<OutputLimits>,
}

impl Default for Hub {
    fn default() -> Self {
        Hub::new()
    }
}

fn shard_of(channel: &[u8]) -> usize {
    (nibble::hash_key(channel) as usize) & (CHANNEL_SHARDS - 1)
}

impl Hub {
    /// An empty registry with Redis's default output buffer limits.
    pub fn new() -> Hub {
        Hub::with_limits(Arc::default())
    }

    /// An empty registry under these output buffer limits.
    pub fn with_limits(limits: Arc<OutputLimits>) -> Hub {
        Hub {
            limits,
            shards: (0..CHANNEL_SHARDS).map(|_| Default::default()).collect(),
            sshards: (0..CHANNEL_SHARDS).map(|_| Default::default()).collect(),
            patterns: RwLock::default(),
            npatterns: AtomicUsize::new(0),
        }
    }

    /// Deliver `payload` to every subscriber of `channel` and of every
    /// pattern that matches it; returns how many deliveries were made.
    pub fn publish(&self, channel: &[u8], payload: &[u8]) -> usize {
        let msg = Arc::new(Message {
            channel: channel.into(),
            payload: payload.into(),
        });
        let mut n = 0;
        if let Some(subs) = self.shards[shard_of(channel)].read().get(channel) {
            for mb in subs {
                mb.push(
                    Delivery {
                        msg: msg.clone(),
                        pattern: None,
                        shard: false,
                    },
                    &self.limits,
                );
                n += 1;
            }
        }
        if self.npatterns.load(Ordering::Relaxed) > 0 {
            for (pat, mb) in self.patterns.read().iter() {
                if crate::glob::matches(pat, channel) {
                    mb.push(
                        Delivery {
                            msg: msg.clone(),
                            pattern: Some(pat.clone()),
                            shard: false,
                        },
                        &self.limits,
                    );
                    n += 1;
                }
            }
        }
        n
    }

    /// SPUBLISH: deliver to the subscribers of shard channel `channel`
    /// (patterns do not apply); returns how many.
    pub fn spublish(&self, channel: &[u8], payload: &[u8]) -> usize {
        let guard = self.sshards[shard_of(channel)].read();
        let Some(subs) = guard.get(channel) else {
            return 0;
        };
        let msg = Arc::new(Message {
            channel: channel.into(),
            payload: payload.into(),
        });
        for mb in subs {
            mb.push(
                Delivery {
                    msg: msg.clone(),
                    pattern: None,
                    shard: true,
                },
                &self.limits,
            );
        }
        subs.len()
    }

    /// Active channels (with at least one subscriber) matching `pattern`.
    pub fn channels(&self, pattern: Option<&[u8]>) -> Vec<Box<[u8]>> {
        Self::list(&self.shards, pattern)
    }

    /// Active shard channels matching `pattern`.
    pub fn shard_channels(&self, pattern: Option<&[u8]>) -> Vec<Box<[u8]>> {
        Self::list(&self.sshards, pattern)
    }

    /// Subscribers of shard channel `channel`.
    pub fn shard_numsub(&self, channel: &[u8]) -> usize {
        self.sshards[shard_of(channel)]
            .read()
            .get(channel)
            .map_or(0, Vec::len)
    }

    fn list(shards: &[ChannelShard], pattern: Option<&[u8]>) -> Vec<Box<[u8]>> {
        let mut v = Vec::new();
        for s in shards.iter() {
            for ch in s.read().keys() {
                if pattern.is_none_or(|p| crate::glob::matches(p, ch)) {
                    v.push(ch.clone());
                }
            }
        }
        v
    }

    /// Subscribers of `channel`.
    pub fn numsub(&self, channel: &[u8]) -> usize {
        self.shards[shard_of(channel)]
            .read()
            .get(channel)
            .map_or(0, Vec::len)
    }

    /// Distinct patterns subscribed to.
    pub fn numpat(&self) -> usize {
        let p = self.patterns.read();
        p.iter().map(|(pat, _)| pat).collect::<HashSet<_>>().len()
    }

    fn add_channel(&self, channel: &[u8], mb: &Arc<Mailbox>, shard: bool) {
        let shards = if shard { &self.sshards } else { &self.shards };
        shards[shard_of(channel)]
            .write()
            .entry(channel.into())
            .or_default()
            .push(mb.clone());
    }

    fn remove_channel(&self, channel: &[u8], mb: &Arc<Mailbox>, shard: bool) {
        let shards = if shard { &self.sshards } else { &self.shards };
        let mut s = shards[shard_of(channel)].write();
        if let Some(v) = s.get_mut(channel) {
            v.retain(|m| !Arc::ptr_eq(m, mb));
            if v.is_empty() {
                s.remove(channel);
            }
        }
    }

    fn add_pattern(&self, pattern: &[u8], mb: &Arc<Mailbox>) {
        self.patterns.write().push((pattern.into(), mb.clone()));
        self.npatterns.fetch_add(1, Ordering::Relaxed);
    }

    fn remove_pattern(&self, pattern: &[u8], mb: &Arc<Mailbox>) {
        let mut p = self.patterns.write();
        let before = p.len();
        p.retain(|(pat, m)| !(Arc::ptr_eq(m, mb) && &pat[..] == pattern));
        self.npatterns
            .fetch_sub(before - p.len(), Ordering::Relaxed);
    }
}

/// One connection's subscriptions; dropping it (the connection closed, or
/// RESET, or its last UNSUBSCRIBE) removes them from the registry.
pub struct Subs {
    hub: Arc<Hub>,
    info: Arc<ClientInfo>,
    /// This connection's mailbox.
    pub mailbox: Arc<Mailbox>,
    channels: HashSet<Box<[u8]>>,
    patterns: HashSet<Box<[u8]>>,
    schannels: HashSet<Box<[u8]>>,
}

impl Subs {
    /// No subscriptions yet.
    pub fn new(hub: Arc<Hub>, info: Arc<ClientInfo>) -> Subs {
        Subs {
            mailbox: Arc::new(Mailbox::new(info.clone())),
            hub,
            info,
            channels: HashSet::new(),
            patterns: HashSet::new(),
            schannels: HashSet::new(),
        }
    }

    /// Channels plus patterns (the count SUBSCRIBE and friends report).
    pub fn count(&self) -> usize {
        self.channels.len() + self.patterns.len()
    }

    /// Shard channels (the count SSUBSCRIBE and SUNSUBSCRIBE report).
    pub fn shard_count(&self) -> usize {
        self.schannels.len()
    }

    /// Every subscription: none left ends the subscribed state.
    pub fn total(&self) -> usize {
        self.count() + self.shard_count()
    }

    fn publish_counts(&self) {
        self.info
            .sub
            .store(self.channels.len() as u32, Ordering::Relaxed);
        self.info
            .psub
            .store(self.patterns.len() as u32, Ordering::Relaxed);
        self.info
            .ssub
            .store(self.schannels.len() as u32, Ordering::Relaxed);
    }

    /// Subscribe to `channel` (no-op if subscribed already).
    pub fn subscribe(&mut self, channel: &[u8]) {
        if self.channels.insert(channel.into()) {
            self.hub.add_channel(channel, &self.mailbox, false);
            self.publish_counts();
        }
    }

    /// Unsubscribe from `channel` (no-op if not subscribed).
    pub fn unsubscribe(&mut self, channel: &[u8]) {
        if self.channels.remove(channel) {
            self.hub.remove_channel(channel, &self.mailbox, false);
            self.publish_counts();
        }
    }

    /// Subscribe to shard channel `channel`.
    pub fn ssubscribe(&mut self, channel: &[u8]) {
        if self.schannels.insert(channel.into()) {
            self.hub.add_channel(channel, &self.mailbox, true);
            self.publish_counts();
        }
    }

    /// Unsubscribe from shard channel `channel`.
    pub fn sunsubscribe(&mut self, channel: &[u8]) {
        if self.schannels.remove(channel) {
            self.hub.remove_channel(channel, &self.mailbox, true);
            self.publish_counts();
        }
    }

    /// Shard channels subscribed to.
    pub fn shard_channel_list(&self) -> Vec<Box<[u8]>> {
        self.schannels.iter().cloned().collect()
    }

    /// Subscribe to `pattern`.
    pub fn psubscribe(&mut self, pattern: &[u8]) {
        if self.patterns.insert(pattern.into()) {
            self.hub.add_pattern(pattern, &self.mailbox);
            self.publish_counts();
        }
    }

    /// Unsubscribe from `pattern`.
    pub fn punsubscribe(&mut self, pattern: &[u8]) {
        if self.patterns.remove(pattern) {
            self.hub.remove_pattern(pattern, &self.mailbox);
            self.publish_counts();
        }
    }

    /// Channels subscribed to.
    pub fn channel_list(&self) -> Vec<Box<[u8]>> {
        self.channels.iter().cloned().collect()
    }

    /// Patterns subscribed to.
    pub fn pattern_list(&self) -> Vec<Box<[u8]>> {
        self.patterns.iter().cloned().collect()
    }
}

impl Drop for Subs {
    fn drop(&mut self) {
        for c in std::mem::take(&mut self.channels) {
            self.hub.remove_channel(&c, &self.mailbox, false);
        }
        for c in std::mem::take(&mut self.schannels) {
            self.hub.remove_channel(&c, &self.mailbox, true);
        }
        for p in std::mem::take(&mut self.patterns) {
            self.hub.remove_pattern(&p, &self.mailbox);
        }
        self.publish_counts();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> Arc<ClientInfo> {
        Arc::new(ClientInfo::new(1, String::new(), String::new(), 0))
    }

    #[test]
    fn publish_reaches_channels_and_patterns_and_drop_unregisters() {
        let hub = Arc::new(Hub::new());
        let mut a = Subs::new(hub.clone(), info());
        a.subscribe(b"news");
        a.psubscribe(b"n*");
        assert_eq!(hub.publish(b"news", b"hi"), 2);
        assert_eq!(hub.publish(b"other", b"hi"), 0);
        let mut out = Vec::new();
        assert!(!a.mailbox.drain(&mut out, Proto::Resp2, 1 << 20));
        assert_eq!(
            out,
            b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$2\r\nhi\r\n*4\r\n$8\r\npmessage\r\n$2\r\nn*\r\n$4\r\nnews\r\n$2\r\nhi\r\n"
        );
        assert_eq!(hub.numsub(b"news"), 1);
        assert_eq!(hub.numpat(), 1);
        drop(a);
        assert_eq!(hub.numsub(b"news"), 0);
        assert_eq!(hub.numpat(), 0);
        assert_eq!(hub.publish(b"news", b"hi"), 0);
        assert!(hub.channels(None).is_empty());
    }

    #[test]
    fn a_mailbox_over_the_hard_limit_is_killed_and_emptied() {
        let hub = Arc::new(Hub::new());
        let mut a = Subs::new(hub.clone(), info());
        a.subscribe(b"c");
        let payload = vec![0u8; 1 << 20];
        for _ in 0..(PUBSUB_HARD_LIMIT_BYTES >> 20) + 1 {
            hub.publish(b"c", &payload);
        }
        assert!(a.mailbox.is_killed());
        assert!(!a.mailbox.has_mail());
    }
}
