//! `nibblejmp`: inspect and use a shared store from the shell.
//!
//! ```text
//! nibblejmp create STORE [--capacity 64M] [--seg-bytes 1M] [--heads N]
//! nibblejmp info STORE            geometry, segments, live bytes, processes (alive/dead), lease
//! nibblejmp keys STORE [--limit N]
//! nibblejmp get STORE KEY         prints the value; exit 1 if absent
//! nibblejmp put STORE KEY VALUE
//! nibblejmp del STORE KEY         exit 1 if absent
//! nibblejmp compact STORE         compaction passes now (under the lease)
//! nibblejmp recover STORE         reattach with an index rebuild from the log (exclusive)
//! nibblejmp remove STORE          delete the store's files (refused while attached)
//! ```
//!
//! STORE is a directory if it contains a `/`, else a name under
//! `/dev/shm/nibblejmp-<uid>/`. Errors go to stderr with exit status 2.

use std::path::PathBuf;
use std::process::ExitCode;

use nibblejmp::{default_dir, Error, Options, SharedStore};

const USAGE: &str = "usage: nibblejmp create STORE [--capacity 64M] [--seg-bytes N] [--heads N]
       nibblejmp info|keys|compact|recover|remove STORE
       nibblejmp get|del STORE KEY
       nibblejmp put STORE KEY VALUE
STORE: a directory (contains '/') or a name under /dev/shm/nibblejmp-<uid>/";

fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1u64 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

fn store_path(s: &str) -> PathBuf {
    if s.contains('/') {
        PathBuf::from(s)
    } else {
        default_dir(s)
    }
}

fn cli_opts() -> Options {
    Options {
        compaction_thread: false,
        ..Options::default()
    }
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

enum Outcome {
    Ok,
    Absent,
}

fn run(args: &[String]) -> Result<Outcome, Error> {
    let bad = || Error::InvalidArgument(USAGE.into());
    let cmd = args.first().ok_or_else(bad)?.as_str();
    let store = store_path(args.get(1).ok_or_else(bad)?);
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .map(|v| {
                parse_size(v)
                    .ok_or_else(|| Error::InvalidArgument(format!("{name} {v}: not a size")))
            })
            .transpose()
    };
    match cmd {
        "create" => {
            let capacity = flag("--capacity")?.unwrap_or(64 << 20);
            let opts = Options {
                seg_bytes: flag("--seg-bytes")?,
                heads: flag("--heads")?.map(|h| h as usize),
                ..cli_opts()
            };
            let s = SharedStore::create(&store, capacity, &opts)?;
            let g = s.geometry();
            println!(
                "created {} ({}): {} segments of {} KiB, {} index buckets, {} heads",
                store.display(),
                mib(capacity),
                g.log_segments,
                g.seg_bytes >> 10,
                g.index_buckets,
                g.heads
            );
            s.close()?;
        }
        "info" => {
            let s = SharedStore::attach(&store, &cli_opts())?;
            let st = s.stats();
            let g = s.geometry();
            let r = s.recovery_report();
            let me = std::process::id();
            println!("store       {}", store.display());
            println!(
                "capacity    {} bytes ({}): log {} x {} KiB segments, index {} buckets ({} keys max), {} heads, reserve {} segments",
                g.capacity_bytes,
                mib(g.capacity_bytes),
                g.log_segments,
                g.seg_bytes >> 10,
                g.index_buckets,
                g.index_buckets * nibblejmp::layout::ENTRIES_PER_BUCKET as u64,
                g.heads,
                g.reserve_segments
            );
            println!(
                "segments    free {}, open {}, closed {}, compacting {}, retired {}",
                st.segments_free,
                st.segments_open,
                st.segments_closed,
                st.segments_compacting,
                st.segments_retired
            );
            println!(
                "live        {} bytes ({:.1}% of the log), {} keys, index load {:.3}",
                st.live_bytes,
                100.0 * st.live_bytes as f64 / (g.log_segments * g.seg_bytes) as f64,
                st.objects,
                st.index_load
            );
            println!(
                "shutdown    {}; attaches {}, recoveries {}, rebuilds {}",
                if r.ran && r.unclean {
                    "previous run did not shut down cleanly (recovered at this attach)"
                } else {
                    "clean (or other processes attached)"
                },
                st.attaches,
                st.recoveries,
                st.rebuilds
            );
            println!(
                "repairs     locks broken {}, slots of dead processes reclaimed {}",
                st.broken_locks, st.slots_reclaimed
            );
            println!(
                "compaction  {} segments compacted, lease {}, takeovers {}",
                st.compactions,
                match st.lease_holder {
                    Some((pid, alive)) =>
                        format!("pid {pid} ({})", if alive { "alive" } else { "dead" }),
                    None => "free".into(),
                },
                st.lease_takeovers
            );
            for (pid, slots, alive) in &st.processes {
                println!(
                    "process     pid {pid}: {slots} epoch slots, {}{}",
                    if *alive { "alive" } else { "dead" },
                    if *pid == me { " (this command)" } else { "" }
                );
            }
            s.close()?;
        }
        "keys" => {
            let s = SharedStore::attach(&store, &cli_opts())?;
            let limit = flag("--limit")?.unwrap_or(u64::MAX) as usize;
            for k in s.keys()?.into_iter().take(limit) {
                println!("{}", String::from_utf8_lossy(&k));
            }
            s.close()?;
        }
        "get" => {
            let key = args.get(2).ok_or_else(bad)?;
            let s = SharedStore::attach(&store, &cli_opts())?;
            let v = s.get(key.as_bytes())?;
            s.close()?;
            match v {
                Some(v) => println!("{}", String::from_utf8_lossy(&v)),
                None => return Ok(Outcome::Absent),
            }
        }
        "put" => {
            let (key, value) = (args.get(2).ok_or_else(bad)?, args.get(3).ok_or_else(bad)?);
            let s = SharedStore::attach(&store, &cli_opts())?;
            s.put(key.as_bytes(), value.as_bytes())?;
            s.close()?;
        }
        "del" => {
            let key = args.get(2).ok_or_else(bad)?;
            let s = SharedStore::attach(&store, &cli_opts())?;
            let found = s.delete(key.as_bytes())?;
            s.close()?;
            if !found {
                return Ok(Outcome::Absent);
            }
        }
        "compact" => {
            let s = SharedStore::attach(&store, &cli_opts())?;
            let n = s.compact_now()?;
            println!("compacted {n} segments; {} free", s.stats().segments_free);
            s.close()?;
        }
        "recover" => {
            let s = SharedStore::attach(
                &store,
                &Options {
                    rebuild: true,
                    ..cli_opts()
                },
            )?;
            println!("{:?}", s.recovery_report());
            s.close()?;
        }
        "remove" => {
            SharedStore::remove(&store)?;
            println!("removed {}", store.display());
        }
        _ => return Err(bad()),
    }
    Ok(Outcome::Ok)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(Outcome::Ok) => ExitCode::SUCCESS,
        Ok(Outcome::Absent) => ExitCode::from(1),
        Err(e) => {
            eprintln!("nibblejmp: {e}");
            ExitCode::from(2)
        }
    }
}
