//! `jmp`: inspect and manage a SpaceJMP store.
//!
//! ```text
//! cargo run -p spacejmp --bin jmp -- [--store DIR] COMMAND
//!   list                         segments (base, size, lock holders, alive?) and VASes
//!   create NAME SIZE [--base HEX] [--no-lock]
//!   vas NAME [SEG:r|SEG:w ...]   create a VAS with segments
//!   rm NAME                      remove a segment
//!   rm-vas NAME                  remove a VAS
//!   inspect NAME                 dump a segment header
//!   recover NAME                 drop dead lock holders and mark consistent
//! ```

use spacejmp::{segment, Access, Config, Error, Jmp, Registry, SegOptions};
use std::process::ExitCode;

fn parse_size(s: &str) -> Option<u64> {
    let (n, m) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1u64 << 10),
        'M' | 'm' => (&s[..s.len() - 1], 1 << 20),
        'G' | 'g' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    n.parse::<u64>().ok().map(|v| v * m)
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).ok()
}

fn usage() -> Error {
    Error::InvalidArgument(
        "usage: jmp [--store DIR] list | create NAME SIZE [--base HEX] [--no-lock] | \
         vas NAME [SEG:r|w ...] | rm NAME | rm-vas NAME | inspect NAME | recover NAME"
            .into(),
    )
}

fn holders(reg: &Registry, name: &str, hdr: u64) -> Result<String, Error> {
    let v = spacejmp::HeaderView::open_path(&segment::seg_path(reg.dir(), name), hdr)?;
    let h = v.header();
    let mut out: Vec<String> = h
        .lock
        .holders()
        .iter()
        .map(|h| {
            format!(
                "{}{}{}{}",
                if h.writer { "W:" } else { "R:" },
                h.pid,
                if h.count > 1 {
                    format!("x{}", h.count)
                } else {
                    String::new()
                },
                if h.alive { "" } else { "(dead)" }
            )
        })
        .collect();
    if h.lock.is_inconsistent() {
        out.push("INCONSISTENT".into());
    }
    Ok(if out.is_empty() {
        "-".into()
    } else {
        out.join(",")
    })
}

fn run(args: &[String]) -> Result<(), Error> {
    let mut cfg = Config::default();
    let mut args = args.to_vec();
    if args.first().map(String::as_str) == Some("--store") {
        cfg.store = args.get(1).ok_or_else(usage)?.into();
        args.drain(..2);
    }
    let cmd = args.first().ok_or_else(usage)?.clone();
    let arg = |i: usize| args.get(i).cloned().ok_or_else(usage);
    match cmd.as_str() {
        "list" => {
            let reg = Registry::open(&cfg.store, cfg.window)?;
            let st = reg.snapshot()?;
            println!(
                "store {}  window [{:#x}, {:#x})",
                reg.dir().display(),
                st.window.0,
                st.window.0 + st.window.1
            );
            println!(
                "{:<24} {:>16} {:>12} {:>5} holders",
                "segment", "base", "size", "lock"
            );
            for s in &st.segs {
                let h = holders(&reg, &s.name, s.header_size).unwrap_or_else(|e| format!("? {e}"));
                println!(
                    "{:<24} {:>#16x} {:>12} {:>5} {h}",
                    s.name,
                    s.base,
                    s.size,
                    if s.lockable() { "yes" } else { "no" }
                );
            }
            for v in &st.vases {
                let segs: Vec<String> = v
                    .segs
                    .iter()
                    .map(|(n, a)| format!("{n}:{}", if *a == Access::Write { "w" } else { "r" }))
                    .collect();
                println!("vas {:<20} {:o} {}", v.name, v.mode, segs.join(" "));
            }
        }
        "create" => {
            let name = arg(1)?;
            let size = parse_size(&arg(2)?).ok_or_else(usage)?;
            let mut opts = SegOptions::default();
            let mut i = 3;
            while i < args.len() {
                match args[i].as_str() {
                    "--base" => {
                        opts.base = Some(hex(&arg(i + 1)?).ok_or_else(usage)?);
                        i += 1;
                    }
                    "--no-lock" => opts.lockable = false,
                    _ => return Err(usage()),
                }
                i += 1;
            }
            let reg = Registry::open(&cfg.store, cfg.window)?;
            let s = reg.seg_alloc(&name, size, &opts)?;
            println!("created {} at {:#x}, {} bytes", s.name, s.base, s.size);
        }
        "vas" => {
            let jmp = Jmp::open(cfg)?;
            let name = arg(1)?;
            jmp.vas_create(&name, 0o660)?;
            for s in &args[2..] {
                let (n, m) = s.rsplit_once(':').ok_or_else(usage)?;
                let a = if m == "w" {
                    Access::Write
                } else {
                    Access::Read
                };
                jmp.seg_attach(&name, n, a)?;
            }
            println!("created VAS {name}");
        }
        "rm" => Registry::open(&cfg.store, cfg.window)?.seg_remove(&arg(1)?)?,
        "rm-vas" => Registry::open(&cfg.store, cfg.window)?.vas_remove(&arg(1)?)?,
        "inspect" | "recover" => {
            let reg = Registry::open(&cfg.store, cfg.window)?;
            let name = arg(1)?;
            let info = reg.seg_find(&name)?;
            let v = spacejmp::HeaderView::open_path(
                &segment::seg_path(reg.dir(), &name),
                info.header_size,
            )?;
            if cmd == "recover" {
                let n = v.header().lock.recover(true);
                println!("removed {n} dead holder(s); {name} marked consistent");
            }
            let h = v.header();
            println!("name      {}", segment::header_name(h));
            println!("magic     {:#x} version {}", h.magic, h.version);
            println!("base      {:#x}", h.base);
            println!("size      {:#x} (header {:#x})", h.size, h.header_size);
            println!(
                "flags     {:#x} (lockable {})",
                h.flags,
                h.flags & segment::FLAG_LOCKABLE != 0
            );
            println!(
                "owner     uid {} mode {:o}",
                h.owner_uid,
                h.mode.load(std::sync::atomic::Ordering::Acquire)
            );
            println!(
                "root      {:#x}",
                h.root.load(std::sync::atomic::Ordering::Acquire)
            );
            println!(
                "heap      live {} B, never used {} B",
                h.heap.live_bytes(),
                h.heap.unused_bytes()
            );
            println!("holders   {}", holders(&reg, &name, info.header_size)?);
        }
        _ => return Err(usage()),
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("jmp: {e}");
            ExitCode::FAILURE
        }
    }
}
