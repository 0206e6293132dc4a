//! `memlab refcache` and `memlab tree`: the scalable primitives of issue 6,
//! measured by the benchmark functions their crates export
//! (`refcache::bench`, `bonsai::bench`), reported the memlab way.
//!
//! * `refcache` — RadixVM Fig. 8: N threads repeatedly take and drop a
//!   reference to one shared object, for Refcache, the shared atomic
//!   counter and SNZI; plus bytes of memory per counted object. The
//!   `refcache-ratio` rows divide each scheme by the shared counter at the
//!   same thread count.
//! * `tree` — RadixVM Figs. 6-7 and Bonsai's claim: 1,000 present keys;
//!   readers look up random present keys while 0 or 1 writers insert and
//!   delete absent keys, for the Bonsai tree, the radix map (with and
//!   without node collapse), `crossbeam-skiplist` and `RwLock<BTreeMap>`. A
//!   *busy* control runs a thread spinning on private work instead of the
//!   writer, to separate "a writer shares my cache lines" from "a writer
//!   shares my CPU" on a machine with few cores. `tree-ratio` rows: lookups
//!   per reader with a writer (or the control) / without.

use std::collections::HashMap;

use crate::report::{Reporter, Row};

/// Options of `memlab refcache`.
pub struct RefcacheOpts {
    pub threads: Vec<usize>,
    pub secs: f64,
    pub runs: usize,
}

/// Run `memlab refcache`.
pub fn run_refcache(o: &RefcacheOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "refcache";
    rep.note(
        BENCH,
        &format!(
            "RadixVM Fig. 8: threads take and drop a reference to one shared object as fast as they \
             can; pairs_per_sec = inc+dec pairs per second, all threads; median of {} runs of {:.1} s \
             (spread_pct = (max - min) / median). bytes_per_object: counter memory per object.",
            o.runs, o.secs
        ),
    );
    let opts = refcache::bench::Options {
        threads: o.threads.clone(),
        secs: o.secs,
        runs: o.runs,
        ..Default::default()
    };
    let rows = refcache::bench::run(&opts, |_| {});
    let mut shared: HashMap<usize, f64> = HashMap::new();
    for r in &rows {
        if r.kind == refcache::CounterKind::SharedAtomic {
            shared.insert(r.threads, r.pairs_per_sec);
        }
        rep.emit(
            Row::new(BENCH, r.kind.name(), r.threads)
                .set_f("pairs_per_sec", r.pairs_per_sec, 0)
                .set_f("spread_pct", r.spread_pct, 1)
                .set("runs", r.runs)
                .set("bytes_per_object", r.bytes_per_object),
        )?;
    }
    rep.note(
        "refcache-ratio",
        "ratio = pairs_per_sec of the scheme / that of the shared atomic counter, same thread count.",
    );
    for r in &rows {
        if let Some(&base) = shared.get(&r.threads) {
            rep.emit(Row::new("refcache-ratio", r.kind.name(), r.threads).set_f(
                "ratio",
                r.pairs_per_sec / base.max(1.0),
                3,
            ))?;
        }
    }
    rep.flush()
}

/// Options of `memlab tree`.
pub struct TreeOpts {
    pub readers: Vec<usize>,
    pub writers: Vec<usize>,
    pub secs: f64,
    pub runs: usize,
    pub systems: Option<Vec<String>>,
}

/// Run `memlab tree`.
pub fn run_tree(o: &TreeOpts, rep: &mut Reporter) -> std::io::Result<()> {
    const BENCH: &str = "tree";
    rep.note(
        BENCH,
        &format!(
            "1,000 present keys; readers look up random present keys while `writers` threads insert \
             and delete absent keys (busy > 0: that many threads spin on private work instead, the \
             control). Per-reader lookups/s and per-writer writes/s, median of {} runs of {:.1} s; \
             threads = readers + writers + busy.",
            o.runs, o.secs
        ),
    );
    let mut opts = bonsai::bench::Options {
        readers: o.readers.clone(),
        writers: o.writers.clone(),
        secs: o.secs,
        runs: o.runs,
        ..Default::default()
    };
    if let Some(s) = &o.systems {
        opts.systems = s.clone();
    }
    let rows = bonsai::bench::run(&opts, |_| {});
    for r in &rows {
        rep.emit(
            Row::new(BENCH, &r.system, r.readers + r.writers + r.busy)
                .set("readers", r.readers)
                .set("writers", r.writers)
                .set("busy", r.busy)
                .set_f(
                    "lookups_per_sec_per_reader",
                    r.lookups_per_sec_per_reader,
                    0,
                )
                .set_f("writes_per_sec_per_writer", r.writes_per_sec_per_writer, 0)
                .set_f("spread_pct", r.spread_pct, 1),
        )?;
    }
    rep.note(
        "tree-ratio",
        "ratio = lookups per reader with writers (or busy control threads) / with neither, same system \
         and reader count. The issue's bar: >= 0.8 with one writer.",
    );
    for r in rows.iter().filter(|r| r.writers + r.busy > 0) {
        let base = rows.iter().find(|b| {
            b.system == r.system && b.readers == r.readers && b.writers == 0 && b.busy == 0
        });
        if let Some(b) = base {
            let ratio = r.lookups_per_sec_per_reader / b.lookups_per_sec_per_reader.max(1.0);
            rep.emit(
                Row::new("tree-ratio", &r.system, r.readers + r.writers + r.busy)
                    .set("readers", r.readers)
                    .set("writers", r.writers)
                    .set("busy", r.busy)
                    .set_f("ratio", ratio, 3),
            )?;
        }
    }
    rep.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_benchmarks_run_and_report() {
        let mut rep = Reporter::new(true, None).unwrap();
        run_refcache(
            &RefcacheOpts {
                threads: vec![1, 2],
                secs: 0.02,
                runs: 1,
            },
            &mut rep,
        )
        .unwrap();
        run_tree(
            &TreeOpts {
                readers: vec![1],
                writers: vec![0, 1],
                secs: 0.02,
                runs: 1,
                systems: Some(vec!["bonsai".into(), "radix".into()]),
            },
            &mut rep,
        )
        .unwrap();
        assert_eq!(rep.exit_code(), 0);
    }
}
