//! `nibble` — start the server. See the crate README for the options.
//!
//! `nibble` (or `nibble serve`) with no arguments listens on
//! 127.0.0.1:6379. SIGINT and SIGTERM (and the SHUTDOWN command) stop it
//! gracefully: listeners close, connections finish their current batch,
//! workers join, the engine is dropped.

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
    let srv = match server::Server::start(cfg) {
        Ok(s) => s,
        Err(e) => {
            log::error!("cannot start: {e}");
            std::process::exit(1);
        }
    };
    let mut stop = srv.shutdown_signal();
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
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(e) => {
                log::error!("SIGTERM handler: {e}");
                return;
            }
        };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => log::warn!("SIGINT received, shutting down"),
            _ = term.recv() => log::warn!("SIGTERM received, shutting down"),
            _ = stop.wait_for(|v| *v) => {}
        }
    });
    srv.join();
}
