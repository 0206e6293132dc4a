//! The shared benchmark's captions and result rows.

use super::*;

// Rows

pub(super) fn notes(o: &Opts, rep: &mut Reporter, data_dir: bool) {
    let common = format!(
        "{} keys (\"key:\"+12 digits) of {} B pseudo-random values, preloaded; each client process sends one \
         request at a time (uniform keys), {} ms warm-up + {} ms measured, all processes in the same window; \
         direct = the nibblejmp store attached by each client process (compaction in the parent); nibble, \
         nibble-data-dir and redis = RESP over a Unix socket (nibble: the server with its own process-private \
         engine; nibble-data-dir: the server on a nibblejmp store, `--data-dir`, the direct rows' engine; \
         redis-server --save '' --appendonly no). threads = client processes. ops_per_sec: sum over processes, median of {} runs \
         [min, max]; p50/p99_ns: every {}th request, all processes, median over runs. Every GET checks the \
         whole value.",
        o.keys,
        o.value_size,
        o.warmup.as_millis(),
        o.measure.as_millis(),
        o.repeat,
        SAMPLE_EVERY_OPS
    );
    let cells = !o.cells.is_empty();
    if o.cells.iter().any(|c| c.in_ops) {
        rep.note(BENCH, &format!("Fig. 10a/b: 100% GET, 100% SET. {common}"));
    }
    if o.cells.iter().any(|c| c.in_mix) {
        rep.note(MIX, &format!("Fig. 10c: rising SET share. {common}"));
    }
    if cells {
        rep.note(
        RATIO,
        &format!(
            "Throughput of direct over the server for the same cell, per run, median [min, max]; issue 8 \
             expects direct >= {GOAL_DIRECT_OVER_REDIS}x redis for GET and SET with 1 client process."
        ),
    );
    }
    if o.workloads.contains(&Workload::Restart) {
        rep.note(
        RESTART,
        &format!(
            "{} MiB of data ({} keys of {} B values); ms from spawn to the first correct GET answer (the probe \
             asks every {} ms; direct: the client process's own time of the answer). direct-attach: a fresh \
             process attaches the closed store; -after-kill: the last attached process was SIGKILLed, so \
             attach recovers. redis-rdb: redis-server loading its RDB (BGSAVE of the same data, on disk in {}, \
             just written so in the page cache). \
             nibble-data-dir{}: the server restarted on its --data-dir store after SIGTERM, -after-kill after \
             SIGKILL. Median of {} runs [min, max].",
            o.restart_bytes >> 20,
            restart_keys(o),
            o.restart_value_size,
            PROBE_INTERVAL.as_millis(),
            o.rdb_dir.display(),
            if data_dir { "" } else { " (not available)" },
            o.repeat
        ),
    );
    }
    if o.quick {
        rep.note(
            BENCH,
            "--quick: short cells, a small restart store; figures are rough.",
        );
    }
}

pub(super) fn emit(
    o: &Opts,
    systems: &[System],
    samples: &[Sample],
    restarts: &[RestartSample],
    rep: &mut Reporter,
) -> std::io::Result<()> {
    for table in [BENCH, MIX] {
        for cell in &o.cells {
            if (table == BENCH && !cell.in_ops) || (table == MIX && !cell.in_mix) {
                continue;
            }
            for &sys in systems {
                let got: Vec<&Sample> = samples
                    .iter()
                    .filter(|s| s.sys == sys && s.cell == *cell)
                    .collect();
                if got.is_empty() {
                    continue;
                }
                let f = |g: &dyn Fn(&CellOut) -> f64| {
                    Spread::of(&got.iter().map(|s| g(&s.out)).collect::<Vec<_>>())
                };
                let row = Row::new(table, sys.name(), cell.processes)
                    .set("processes", cell.processes)
                    .set("op", cell.op())
                    .set("set_pct", cell.set_pct)
                    .set("value_size", o.value_size)
                    .set("keys", o.keys)
                    .set_spread("ops_per_sec", &f(&|c| c.ops_per_sec), 0)
                    .set_f("p50_ns", f(&|c| c.p50_ns).median, 0)
                    .set_f("p99_ns", f(&|c| c.p99_ns).median, 0)
                    .set_f("gets", f(&|c| c.gets as f64).median, 0)
                    .set_f("sets", f(&|c| c.sets as f64).median, 0)
                    .set("runs", got.len());
                rep.emit(row)?;
            }
        }
    }
    // Ratios: direct over each server, per repeat.
    for cell in &o.cells {
        for peer in [System::Redis, System::Nibble, System::NibbleDataDir] {
            if !systems.contains(&System::Direct) || !systems.contains(&peer) {
                continue;
            }
            let ratios: Vec<f64> = (0..o.repeat)
                .filter_map(|r| {
                    let get = |s: System| {
                        samples
                            .iter()
                            .find(|x| x.repeat == r && x.sys == s && x.cell == *cell)
                            .map(|x| x.out.ops_per_sec)
                    };
                    Some(get(System::Direct)? / get(peer)?)
                })
                .collect();
            if ratios.is_empty() {
                continue;
            }
            let sp = Spread::of(&ratios);
            let mut row = Row::new(RATIO, &format!("direct/{}", peer.name()), cell.processes)
                .set("processes", cell.processes)
                .set("op", cell.op())
                .set_spread("ratio", &sp, 2);
            if peer == System::Redis && cell.processes == 1 && matches!(cell.set_pct, 0 | 100) {
                row = row
                    .set("goal", format!(">= {GOAL_DIRECT_OVER_REDIS}x"))
                    .set("goal_met", sp.median >= GOAL_DIRECT_OVER_REDIS);
            }
            rep.emit(row)?;
        }
    }
    // Restart rows.
    let mut names: Vec<&str> = Vec::new();
    for s in restarts {
        if !names.contains(&s.system.as_str()) {
            names.push(&s.system);
        }
    }
    let med = |name: &str| -> Option<Spread> {
        let v: Vec<f64> = restarts
            .iter()
            .filter(|s| s.system == name)
            .map(|s| s.ms)
            .collect();
        (!v.is_empty()).then(|| Spread::of(&v))
    };
    for name in &names {
        let Some(sp) = med(name) else { continue };
        let of: Vec<&RestartSample> = restarts.iter().filter(|s| s.system == *name).collect();
        let mut row = Row::new(RESTART, name, 1)
            .set("data_bytes", o.restart_bytes)
            .set("keys", of[0].keys)
            .set("value_size", o.restart_value_size)
            .set_spread("first_reply_ms", &sp, 2)
            .set(
                "loading_replies",
                of.iter().map(|s| s.loading_replies).max().unwrap_or(0),
            )
            .set("runs", of.len());
        if name.starts_with("nibble-data-dir") {
            row = row
                .set("goal", format!("<= {GOAL_RESTART_MS} ms"))
                .set("goal_met", sp.median <= GOAL_RESTART_MS);
        }
        rep.emit(row)?;
    }
    // Restart ratios: redis's load over each other restart, per repeat.
    for name in &names {
        if *name == "redis-rdb" {
            continue;
        }
        let ratios: Vec<f64> = (0..o.repeat)
            .filter_map(|r| {
                let get = |n: &str| {
                    restarts
                        .iter()
                        .find(|s| s.repeat == r && s.system == n)
                        .map(|s| s.ms)
                };
                Some(get("redis-rdb")? / get(name)?)
            })
            .collect();
        if ratios.is_empty() {
            continue;
        }
        rep.emit(
            Row::new(RESTART_RATIO, &format!("redis-rdb/{name}"), 1)
                .set("data_bytes", o.restart_bytes)
                .set_spread("ratio", &Spread::of(&ratios), 1),
        )?;
    }
    Ok(())
}
