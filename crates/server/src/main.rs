//! `nibble` — start the server. See the crate README for the options.
//!
//! `nibble` (or `nibble serve`) with no arguments listens on
//! 127.0.0.1:6379. SIGINT and SIGTERM (and the SHUTDOWN command) stop it
//! gracefully: listeners close, connections finish their current batch,
//! workers join, the engine is dropped (a `--data-dir` store is closed
//! cleanly). The handlers are installed before the server starts, so a
//! signal that arrives once it is ready is never fatal.

use clap::Parser;
use server::config::{Cli, ServerConfig};

fn init_logging(level: &str) {
    let filter = match level.to_ascii_lowercase().as_str() {
        "trace" => log::LevelFilter::Trace,
        "debug" | "verbose" => log::LevelFilter::Debug,
        "warn" | "warning" => log::LevelFilter::Warn,
        "error" => log::LevelFilter::Error,
        "off" | "nothing" => log::LevelFilter::Off,
        _ => log::LevelFilter::Info,
    };
    let mut b = env_logger::Builder::new();
    b.filter_level(filter);
    if let Ok(s) = std::env::var("RUST_LOG") {
        b.parse_filters(&s);
    }
    b.target(env_logger::Target::Stderr).init();
}

fn main() {
    let cli = Cli::parse();
    let cfg = match ServerConfig::from_cli(&cli) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("nibble: {e}");
            std::process::exit(2);
        }
    };
    init_logging(&cfg.loglevel);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            log::error!("signal runtime: {e}");
            std::process::exit(1);
        }
    };
    // Handlers first: a SIGTERM or SIGINT that arrives once the server has
    // said "ready" must stop it gracefully (with --data-dir, a clean close
    // of the shared store), not kill it.
    let signals = {
        use tokio::signal::unix::{signal, SignalKind};
        let _guard = rt.enter();
        signal(SignalKind::terminate()).and_then(|t| Ok((t, signal(SignalKind::interrupt())?)))
    };
    let (mut term, mut int) = match signals {
        Ok(s) => s,
        Err(e) => {
            log::error!("signal handlers: {e}");
            std::process::exit(1);
        }
    };
    let srv = match server::Server::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot start: {e}");
            std::process::exit(1);
        }
    };
    let mut stop = srv.shutdown_signal();
    rt.block_on(async {
        tokio::select! {
            _ = int.recv() => log::warn!("SIGINT received, shutting down"),
            _ = term.recv() => log::warn!("SIGTERM received, shutting down"),
            _ = stop.wait_for(|v| *v) => {}
        }
    });
    srv.join();
}
