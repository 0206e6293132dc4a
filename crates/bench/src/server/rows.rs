//! The server benchmark's result rows: per-phase medians, memory columns and
//! ratios against the peers.

use super::*;

pub(super) fn spread(xs: impl Iterator<Item = f64>) -> Option<Spread> {
    let v: Vec<f64> = xs.filter(|x| x.is_finite()).collect();
    (!v.is_empty()).then(|| Spread::of(&v))
}

pub(super) fn emit(
    o: &Opts,
    targets: &[Target],
    samples: &[Sample],
    rep: &mut Reporter,
) -> std::io::Result<()> {
    let names: Vec<&str> = targets.iter().map(Target::name).collect();
    let of = |sys: &str, phase: &str, threads: Option<usize>| -> Vec<&Sample> {
        samples
            .iter()
            .filter(|s| {
                s.system == sys && s.phase == phase && threads.is_none_or(|t| s.threads == t)
            })
            .collect()
    };
    // Throughput phases.
    let mut keys: Vec<(String, usize)> = Vec::new();
    if !measured(o).is_empty() {
        let max_threads = o.threads.iter().copied().max().unwrap_or(1);
        keys.push(("load".into(), max_threads));
    }
    for &t in &o.threads {
        for p in measured(o) {
            keys.push((p.name().into(), t));
        }
    }
    for (phase, threads) in &keys {
        for &sys in &names {
            let v = of(sys, phase, Some(*threads));
            let Some(ops) = spread(v.iter().map(|s| s.ops_per_sec)) else {
                continue;
            };
            let med = |f: fn(&Sample) -> Option<f64>| spread(v.iter().filter_map(|s| f(s)));
            let mut row = Row::new(BENCH, sys, *threads)
                .set("phase", phase.as_str())
                .set("wire", proto_of(o, sys).name())
                .set("distribution", o.dist.name())
                .set("connections", o.connections)
                .set("pipeline", o.pipeline)
                .set("keys", o.keys)
                .set("value_size", o.value_size)
                .set_spread("ops_per_sec", &ops, 0);
            row = match phase.as_str() {
                "load" => row
                    .set("p50_ns", None::<u64>)
                    .set("p99_ns", None::<u64>)
                    .set("p999_ns", None::<u64>),
                _ => row
                    .set_f("p50_ns", med(|s| s.p50).map_or(f64::NAN, |x| x.median), 0)
                    .set_f("p99_ns", med(|s| s.p99).map_or(f64::NAN, |x| x.median), 0)
                    .set_f("p999_ns", med(|s| s.p999).map_or(f64::NAN, |x| x.median), 0),
            };
            if let Some(c) = med(|s| s.cpu_ns_per_op) {
                row = row.set_spread("server_cpu_ns_per_op", &c, 0);
            }
            row = set_mem(row, &v);
            rep.emit(row.set("runs", v.len()))?;
        }
    }
    // Churn.
    for &sys in &names {
        let v = of(sys, "churn", None);
        if v.is_empty() {
            continue;
        }
        let mut row = Row::new(CHURN, sys, v[0].threads)
            .set("wire", proto_of(o, sys).name())
            .set("target_bytes", o.churn_bytes);
        row = set_mem(row, &v);
        let start = spread(v.iter().filter_map(|s| s.rss_start.map(|x| x as f64)));
        row = row.set("rss_start_bytes", start.map(|s| s.median as u64));
        let purged = spread(v.iter().filter_map(|s| s.rss_purged.map(|x| x as f64)));
        row = row.set("rss_purged_bytes", purged.map(|s| s.median as u64));
        let settle = spread(
            v.iter()
                .filter_map(|s| s.settle.map(|d| d.as_millis() as f64)),
        );
        row = row.set("settle_ms", settle.map(|s| s.median as u64));
        let sk = spread(v.iter().filter_map(|s| s.server_keys.map(|x| x as f64)));
        let lk = spread(v.iter().filter_map(|s| s.live_keys.map(|x| x as f64)));
        row = row
            .set("live_keys", lk.map(|s| s.median as u64))
            .set("server_keys", sk.map(|s| s.median as u64))
            .set("completed", v.iter().all(|s| s.completed))
            .set_f(
                "secs",
                spread(v.iter().map(|s| s.secs)).map_or(f64::NAN, |s| s.median),
                2,
            )
            .set("runs", v.len());
        rep.emit(row)?;
    }
    // redis-benchmark.
    for test in sut::RB_TESTS.iter().map(|t| format!("rb:{t}")) {
        let test = test.as_str();
        for &sys in &names {
            let v = of(sys, test, None);
            let Some(ops) = spread(v.iter().map(|s| s.ops_per_sec)) else {
                continue;
            };
            let p50 = spread(v.iter().filter_map(|s| s.p50));
            rep.emit(
                Row::new(RB, sys, 1)
                    .set("phase", &test[3..])
                    .set("clients", 50)
                    .set("pipeline", 16)
                    .set("requests", o.rb_requests)
                    .set_spread("ops_per_sec", &ops, 0)
                    .set_f("p50_ns", p50.map_or(f64::NAN, |s| s.median), 0)
                    .set("runs", v.len()),
            )?;
        }
    }
    // Ratios of the nibble variants to the peers.
    let subjects: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n == "nibble" || *n == "nibble2")
        .collect();
    let peers: Vec<&str> = names
        .iter()
        .copied()
        .filter(|n| *n == "redis" || *n == "memcached")
        .collect();
    let paired =
        |a: &str, b: &str, phase: &str, threads: Option<usize>, f: fn(&Sample) -> Option<f64>| {
            let xs: Vec<f64> = (0..o.repeat)
                .filter_map(|r| {
                    let x = of(a, phase, threads).into_iter().find(|s| s.run == r)?;
                    let y = of(b, phase, threads).into_iter().find(|s| s.run == r)?;
                    Some(f(x)? / f(y)?)
                })
                .collect();
            spread(xs.into_iter())
        };
    if !subjects.is_empty() && !peers.is_empty() {
        rep.note(
            RATIO,
            &format!(
                "Run by run (paired), median [min, max]: ratio = system / vs throughput, p99_ratio = system / \
                 vs p99 latency. Goals (issue 4): ratio >= {GOAL_OPS}, p99_ratio <= {GOAL_P99}; churn: \
                 bloat <= {GOAL_BLOAT} where the peer's bloat exceeds {PEER_BLOAT}."
            ),
        );
    }
    for &sys in &subjects {
        for &peer in &peers {
            let mut rows = Vec::new();
            for &t in &o.threads {
                for p in measured(o) {
                    let ops = paired(sys, peer, p.name(), Some(t), |s| Some(s.ops_per_sec));
                    let p99 = paired(sys, peer, p.name(), Some(t), |s| s.p99);
                    if let (Some(ops), Some(p99)) = (ops, p99) {
                        rows.push(ratio_row(sys, peer, p.name(), t, ops, Some(p99)));
                    }
                }
            }
            if peer == "redis" {
                for test in sut::RB_TESTS.iter().map(|t| format!("rb:{t}")) {
                    let test = test.as_str();
                    if let Some(ops) = paired(sys, peer, test, None, |s| Some(s.ops_per_sec)) {
                        let name = format!("redis-benchmark {}", &test[3..]);
                        rows.push(ratio_row(sys, peer, &name, 1, ops, None));
                    }
                }
            }
            if let (Some(b), Some(pb)) = (
                spread(of(sys, "churn", None).iter().filter_map(|s| s.bloat())),
                spread(of(peer, "churn", None).iter().filter_map(|s| s.bloat())),
            ) {
                let threads = of(sys, "churn", None).first().map_or(1, |s| s.threads);
                rows.push(
                    Row::new(RATIO, sys, threads)
                        .set("vs", peer)
                        .set("phase", "churn")
                        .set_f("bloat", b.median, 3)
                        .set_f("vs_bloat", pb.median, 3)
                        .set(
                            "goal",
                            format!("bloat <= {GOAL_BLOAT} where vs_bloat > {PEER_BLOAT}"),
                        )
                        .set(
                            "goal_met",
                            if pb.median > PEER_BLOAT {
                                serde_json::Value::from(b.median <= GOAL_BLOAT)
                            } else {
                                serde_json::Value::Null
                            },
                        ),
                );
            }
            for row in rows {
                rep.emit(row)?;
            }
        }
    }
    Ok(())
}

pub(super) fn ratio_row(
    sys: &str,
    peer: &str,
    phase: &str,
    threads: usize,
    ops: Spread,
    p99: Option<Spread>,
) -> Row {
    let mut row = Row::new(RATIO, sys, threads)
        .set("vs", peer)
        .set("phase", phase)
        .set_spread("ratio", &ops, 3);
    let mut met = ops.median >= GOAL_OPS;
    let mut goal = format!("ops >= {GOAL_OPS}x");
    if let Some(p) = p99 {
        row = row.set_spread("p99_ratio", &p, 3);
        met &= p.median <= GOAL_P99;
        goal.push_str(&format!(", p99 <= {GOAL_P99}x"));
    }
    row.set("goal", goal).set("goal_met", met)
}

/// Memory columns: median RSS, peak, live bytes, bloat [min, max], server-reported use.
pub(super) fn set_mem(row: Row, v: &[&Sample]) -> Row {
    let rss = spread(v.iter().filter_map(|s| s.rss.map(|x| x as f64)));
    let hwm = spread(v.iter().filter_map(|s| s.hwm.map(|x| x as f64)));
    let live = spread(v.iter().filter_map(|s| s.live.map(|x| x as f64)));
    let used = spread(v.iter().filter_map(|s| s.server_used.map(|x| x as f64)));
    let bloat = spread(v.iter().filter_map(|s| s.bloat()));
    let int = |s: Option<Spread>| s.map(|s| s.median as u64);
    let mut row = row
        .set("rss_bytes", int(rss))
        .set("rss_peak_bytes", int(hwm))
        .set("live_bytes", int(live));
    row = match bloat {
        Some(b) => row.set_spread("bloat", &b, 3),
        None => row.set("bloat", None::<f64>),
    };
    if used.is_some() {
        row = row.set("server_used_bytes", int(used));
    }
    row
}

pub(super) fn proto_of(o: &Opts, sys: &str) -> Proto {
    match sys {
        "redis" => Proto::Resp,
        "memcached" => Proto::Memcached,
        _ => o.protocol,
    }
}
