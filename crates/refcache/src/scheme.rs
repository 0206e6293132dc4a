//! One interface over the three ways to count references to one shared
//! object, so a benchmark (RadixVM Figure 8: N threads repeatedly take and
//! drop a reference to one shared page) can be written once and the
//! scheme picked by one parameter, [`CounterKind`].

use alloc::boxed::Box;
use core::fmt;
use core::str::FromStr;

use crate::baseline::{SharedCount, Snzi, DEFAULT_SNZI_LEAVES};
use crate::cache::{Config, Counted, Local, Refcache};

/// One shared object's reference count, under some scheme. The object
/// starts with one reference, held by the counter itself.
pub trait RefCounter: Send + Sync {
    /// A thread's view: whatever per-thread state the scheme keeps.
    type Thread<'a>: ThreadCount
    where
        Self: 'a;

    /// Which scheme.
    fn kind(&self) -> CounterKind;

    /// Attaches the calling thread, numbered `thread` (0-based).
    fn thread(&self, thread: usize) -> Self::Thread<'_>;

    /// Bytes of counting state per object.
    fn bytes_per_object(&self) -> usize;
}

/// Per-thread operations on the shared object.
pub trait ThreadCount {
    /// Takes a reference.
    fn inc(&mut self);
    /// Drops a reference taken by this thread's `inc`.
    fn dec(&mut self);
}

/// Which counting scheme: the parameter benchmarks vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CounterKind {
    /// Refcache (§3.1). Name `refcache`.
    Refcache,
    /// One shared atomic word. Name `shared`.
    SharedAtomic,
    /// A SNZI tree. Name `snzi`.
    Snzi,
}

impl CounterKind {
    /// Every kind, in Figure 8's order.
    pub const ALL: [CounterKind; 3] = [
        CounterKind::Refcache,
        CounterKind::SharedAtomic,
        CounterKind::Snzi,
    ];

    /// The name [`FromStr`] accepts.
    pub fn name(self) -> &'static str {
        match self {
            CounterKind::Refcache => "refcache",
            CounterKind::SharedAtomic => "shared",
            CounterKind::Snzi => "snzi",
        }
    }
}

impl fmt::Display for CounterKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A name that is not a [`CounterKind`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseCounterKindError;

impl fmt::Display for ParseCounterKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("unknown counter (expected `refcache`, `shared` or `snzi`)")
    }
}

impl FromStr for CounterKind {
    type Err = ParseCounterKindError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        CounterKind::ALL
            .into_iter()
            .find(|kind| kind.name().eq_ignore_ascii_case(s.trim()))
            .ok_or(ParseCounterKindError)
    }
}

/// A shared object counted by Refcache, with its own domain.
pub struct RefcacheCounter {
    // Field order: the object's reference is given back in `drop` before
    // the domain (which then frees it) is dropped.
    object: Option<Counted<()>>,
    domain: Refcache,
}

impl RefcacheCounter {
    /// A domain configured by `config` and one object in it.
    pub fn new(config: Config) -> RefcacheCounter {
        let domain = Refcache::new(config);
        let object = {
            let local = domain.register().expect("a fresh domain has room");
            local.alloc(())
        };
        RefcacheCounter {
            object: Some(object),
            domain,
        }
    }

    /// The domain.
    pub fn domain(&self) -> &Refcache {
        &self.domain
    }
}

impl Drop for RefcacheCounter {
    fn drop(&mut self) {
        if let Some(object) = self.object.take() {
            if let Some(local) = self.domain.register() {
                local.release(object);
            }
        }
    }
}

/// A thread of a [`RefcacheCounter`].
pub struct RefcacheThread<'a> {
    local: Local<'a>,
    object: &'a Counted<()>,
}

impl ThreadCount for RefcacheThread<'_> {
    fn inc(&mut self) {
        self.local.inc(self.object);
    }
    fn dec(&mut self) {
        // SAFETY: `ThreadCount::dec` follows this thread's own `inc`, so
        // the reference it drops exists; the counter's own reference keeps
        // the object alive meanwhile.
        unsafe { self.local.dec(self.object) };
    }
}

impl RefCounter for RefcacheCounter {
    type Thread<'a> = RefcacheThread<'a>;

    fn kind(&self) -> CounterKind {
        CounterKind::Refcache
    }

    fn thread(&self, _thread: usize) -> RefcacheThread<'_> {
        RefcacheThread {
            local: self
                .domain
                .register()
                .expect("more threads than Config::max_threads"),
            object: self.object.as_ref().expect("alive until drop"),
        }
    }

    fn bytes_per_object(&self) -> usize {
        Refcache::BYTES_PER_OBJECT
    }
}

impl ThreadCount for &SharedCount {
    fn inc(&mut self) {
        SharedCount::inc(self);
    }
    fn dec(&mut self) {
        SharedCount::dec(self);
    }
}

impl RefCounter for SharedCount {
    type Thread<'a> = &'a SharedCount;

    fn kind(&self) -> CounterKind {
        CounterKind::SharedAtomic
    }

    fn thread(&self, _thread: usize) -> &SharedCount {
        self
    }

    fn bytes_per_object(&self) -> usize {
        SharedCount::BYTES_PER_OBJECT
    }
}

/// A thread of a [`Snzi`] counter: its leaf.
pub struct SnziThread<'a> {
    tree: &'a Snzi,
    thread: usize,
}

impl ThreadCount for SnziThread<'_> {
    fn inc(&mut self) {
        self.tree.inc(self.thread);
    }
    fn dec(&mut self) {
        self.tree.dec(self.thread);
    }
}

impl RefCounter for Snzi {
    type Thread<'a> = SnziThread<'a>;

    fn kind(&self) -> CounterKind {
        CounterKind::Snzi
    }

    fn thread(&self, thread: usize) -> SnziThread<'_> {
        SnziThread { tree: self, thread }
    }

    fn bytes_per_object(&self) -> usize {
        Snzi::bytes_per_object(self)
    }
}

/// Runs `body` with a counter of `kind` (default settings, `threads`
/// SNZI leaves): static dispatch for each scheme.
pub fn with_counter<R>(
    kind: CounterKind,
    threads: usize,
    body: impl FnOnce(&dyn DynRefCounter) -> R,
) -> R {
    match kind {
        CounterKind::Refcache => body(&RefcacheCounter::new(Config::default())),
        CounterKind::SharedAtomic => body(&SharedCount::new(1)),
        CounterKind::Snzi => body(&Snzi::new(threads.clamp(1, DEFAULT_SNZI_LEAVES), 1)),
    }
}

/// Object-safe form of [`RefCounter`], for choosing a scheme at run time
/// where one virtual call per operation does not matter.
pub trait DynRefCounter: Sync {
    /// Which scheme.
    fn kind(&self) -> CounterKind;
    /// Attaches thread `thread`.
    fn dyn_thread(&self, thread: usize) -> Box<dyn ThreadCount + '_>;
    /// Bytes of counting state per object.
    fn bytes_per_object(&self) -> usize;
}

impl<C: RefCounter> DynRefCounter for C {
    fn kind(&self) -> CounterKind {
        RefCounter::kind(self)
    }
    fn dyn_thread(&self, thread: usize) -> Box<dyn ThreadCount + '_> {
        Box::new(self.thread(thread))
    }
    fn bytes_per_object(&self) -> usize {
        RefCounter::bytes_per_object(self)
    }
}
