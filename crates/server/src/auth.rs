//! Who may talk to the server: passwords, memcached's authfile, protected
//! mode, the limits on a client that has not authenticated, and throttling
//! of failed attempts.
//!
//! One keyspace, one rule: every port that serves it asks for credentials
//! when any port does. The Redis side uses `requirepass` (AUTH, or HELLO
//! with AUTH); the memcached side uses memcached's own text-protocol
//! authentication (memcached 1.5.15+, `-Y authfile`): the first command of
//! a connection is a `set` of any key whose data is `username password`,
//! checked against a file of `username:password` lines; `STORED` means
//! authenticated, `CLIENT_ERROR authentication failure` means not, and
//! every other command before that gets `CLIENT_ERROR unauthenticated`.
//! [`check_ports`] refuses a start in which one protocol is protected and
//! the other is not, unless `memcached-unauthenticated yes` says in so
//! many words that the memcached port is open.
//!
//! Before a connection has authenticated it is bounded the way
//! redis-server bounds it: at most [`UNAUTH_MAX_MULTIBULK`] arguments and
//! [`UNAUTH_MAX_BULK_BYTES`] per argument (`Protocol error: unauthenticated
//! multibulk length` / `bulk length`, then close), and its input buffer at
//! most [`UNAUTH_QUERY_BUFFER_BYTES`]; a memcached client's auth `set` at
//! most [`MC_AUTH_MAX_BYTES`] of data. So a client that never
//! authenticates holds a few tens of KB (its two buffers), whatever it
//! sends.
//!
//! Protected mode is Redis's: with `protected-mode yes` (the default) and
//! no password, a client whose address is not loopback gets the `DENIED`
//! error and is closed; loopback and Unix-socket clients are served. The
//! memcached port follows the same rule when it has no authfile.
//!
//! A failed attempt (AUTH, HELLO ... AUTH, the memcached auth `set`) costs
//! its connection [`auth_fail_delay`] before the reply goes out and before
//! the next pipelined request is read, so a client cannot try passwords
//! faster than a few a second; the failure is logged at warn with the
//! peer's address, through a [`LogLimiter`] so that a flood of attempts on
//! many connections cannot flood the log. Passwords are compared in
//! constant time and never logged.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::config::ServerConfig;

/// Most arguments of a request before AUTH (redis-server: 10).
pub const UNAUTH_MAX_MULTIBULK: usize = 10;
/// Longest argument before AUTH (redis-server: 16 KB).
pub const UNAUTH_MAX_BULK_BYTES: usize = 16 << 10;
/// Largest input buffer of a connection before AUTH.
pub const UNAUTH_QUERY_BUFFER_BYTES: u64 = 32 << 10;
/// Largest data block of memcached's auth `set`.
pub const MC_AUTH_MAX_BYTES: usize = 1024;
/// Largest memcached authfile read at start.
pub const MC_AUTHFILE_MAX_BYTES: u64 = 1 << 20;
/// First failed attempt's delay; each further failure doubles it.
pub const AUTH_FAIL_DELAY_MS: u64 = 100;
/// Longest delay after a failed attempt.
pub const AUTH_FAIL_DELAY_MAX_MS: u64 = 2_000;

/// Redis's protected-mode refusal (a RESP error line).
pub const DENIED: &str = "-DENIED Running in protected mode because protected mode is enabled and no password is set for the default user. In this mode connections are only accepted from the loopback interface. If you want to connect from external computers, you may adopt one of the following solutions: 1) Disable protected mode by sending the command 'CONFIG SET protected-mode no' from the loopback interface, but MAKE SURE the server is not publicly accessible from the internet if you do so. 2) Set 'protected-mode no' in the configuration file, or start the server with '--protected-mode no'. 3) Set a password with requirepass (and memcached-authfile for the memcached port). NOTE: You only need to do one of the above things in order for the server to start accepting connections from the outside.\r\n";
/// The memcached port's protected-mode refusal.
pub const MC_DENIED: &str = "SERVER_ERROR protected mode: this port has no authentication (memcached-authfile) and accepts only loopback clients; set protected-mode no or configure memcached-authfile\r\n";

/// Compare two byte strings in time that depends only on their lengths.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    // `black_box` keeps the compiler from turning the fold back into an
    // early-exit compare.
    std::hint::black_box(diff) == 0
}

/// The users of memcached's authfile (`username:password` per line).
#[derive(Clone, PartialEq, Eq)]
pub struct McUsers {
    users: Vec<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for McUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "McUsers({} entries)", self.users.len())
    }
}

impl McUsers {
    /// Parse an authfile's text: `username:password` per line (the
    /// password may contain `:`; blank lines are skipped). Neither part may
    /// be empty or contain a space, since the auth `set` separates them
    /// with one.
    pub fn parse(text: &str) -> Result<McUsers, String> {
        let mut users = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.is_empty() {
                continue;
            }
            let Some((u, p)) = line.split_once(':') else {
                return Err(format!(
                    "line {}: expected username:password (the password is not shown)",
                    i + 1
                ));
            };
            if u.is_empty() || p.is_empty() || u.contains(' ') || p.contains(' ') {
                return Err(format!(
                    "line {}: username and password must be non-empty and contain no space",
                    i + 1
                ));
            }
            users.push((u.as_bytes().to_vec(), p.as_bytes().to_vec()));
        }
        if users.is_empty() {
            return Err("no username:password entries".into());
        }
        Ok(McUsers { users })
    }

    /// Read and parse an authfile.
    pub fn load(path: &Path) -> Result<McUsers, String> {
        let what = |e: String| format!("memcached-authfile {}: {e}", path.display());
        let meta = std::fs::metadata(path).map_err(|e| what(e.to_string()))?;
        if meta.len() > MC_AUTHFILE_MAX_BYTES {
            return Err(what(format!("larger than {MC_AUTHFILE_MAX_BYTES} bytes")));
        }
        let text = std::fs::read_to_string(path).map_err(|e| what(e.to_string()))?;
        McUsers::parse(&text).map_err(what)
    }

    /// Check the data of an auth `set`: `username password`.
    pub fn check(&self, data: &[u8]) -> bool {
        let data = data.strip_suffix(b"\r").unwrap_or(data);
        let Some(sp) = data.iter().position(|&b| b == b' ') else {
            return false;
        };
        let (user, pass) = (&data[..sp], &data[sp + 1..]);
        // Check every entry, so the time does not tell which user exists.
        self.users
            .iter()
            .fold(false, |ok, (u, p)| ok | (ct_eq(u, user) & ct_eq(p, pass)))
    }
}

/// Refuse a start in which one protocol asks for credentials and the
/// other serves the same keyspace without them.
pub fn check_ports(cfg: &ServerConfig) -> Result<(), String> {
    let Some(mc_port) = cfg.memcached_port else {
        return Ok(());
    };
    if cfg.requirepass.is_some()
        && cfg.memcached_authfile.is_none()
        && !cfg.memcached_unauthenticated
    {
        return Err(format!(
            "requirepass is set, but the memcached port {mc_port} has no authentication: any \
             client could read and write the keyspace there without the password. Set \
             memcached-authfile FILE (memcached's -Y format: username:password lines), or set \
             memcached-unauthenticated yes to serve that port without authentication anyway"
        ));
    }
    let resp_listens = cfg.port.is_some() || cfg.unixsocket.is_some() || cfg.tls.port.is_some();
    if cfg.memcached_authfile.is_some() && cfg.requirepass.is_none() && resp_listens {
        return Err(
            "memcached-authfile is set, but the Redis protocol has no password: any client \
             could read and write the keyspace there. Set requirepass too, or disable the \
             Redis listeners (port -1, no unixsocket)"
                .into(),
        );
    }
    Ok(())
}

/// The delay a connection pays after its `failures`-th failed attempt.
pub fn auth_fail_delay(failures: u32) -> Duration {
    let shift = failures.saturating_sub(1).min(16);
    Duration::from_millis((AUTH_FAIL_DELAY_MS << shift).min(AUTH_FAIL_DELAY_MAX_MS))
}

/// Is `peer` a loopback address (IPv4-mapped IPv6 included)?
pub fn is_loopback(peer: &std::net::SocketAddr) -> bool {
    peer.ip().to_canonical().is_loopback()
}

/// A log line budget: at most `per_sec` lines a second; the lines over it
/// are counted and the count is reported with the next line let through.
pub struct LogLimiter {
    per_sec: u64,
    /// Second (since `epoch`) of the current window.
    window: AtomicU64,
    /// Lines let through in the window.
    used: AtomicU64,
    /// Lines suppressed since the last line let through.
    suppressed: AtomicU64,
    epoch: std::sync::OnceLock<Instant>,
}

impl LogLimiter {
    /// A limiter of `per_sec` lines a second.
    pub const fn new(per_sec: u64) -> LogLimiter {
        LogLimiter {
            per_sec,
            window: AtomicU64::new(0),
            used: AtomicU64::new(0),
            suppressed: AtomicU64::new(0),
            epoch: std::sync::OnceLock::new(),
        }
    }

    /// `Some(n)` if a line may be logged now (`n` lines were suppressed
    /// before it), `None` if it must be dropped.
    pub fn admit(&self) -> Option<u64> {
        let now = self.epoch.get_or_init(Instant::now).elapsed().as_secs() + 1;
        let w = self.window.load(Ordering::Relaxed);
        if w != now
            && self
                .window
                .compare_exchange(w, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            self.used.store(0, Ordering::Relaxed);
        }
        if self.used.fetch_add(1, Ordering::Relaxed) < self.per_sec {
            Some(self.suppressed.swap(0, Ordering::Relaxed))
        } else {
            self.suppressed.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

/// Log at `level` through `limiter`, noting lines it dropped before.
#[macro_export]
macro_rules! log_limited {
    ($limiter:expr, $level:expr, $($arg:tt)+) => {
        if let Some(dropped) = $limiter.admit() {
            if dropped > 0 {
                log::log!($level, "{} ({} similar lines suppressed)", format_args!($($arg)+), dropped);
            } else {
                log::log!($level, $($arg)+);
            }
        }
    };
}

/// [`log_limited!`] at warn.
#[macro_export]
macro_rules! warn_limited {
    ($limiter:expr, $($arg:tt)+) => {
        $crate::log_limited!($limiter, log::Level::Warn, $($arg)+)
    };
}

/// Failed-authentication lines: 10 a second.
pub static AUTH_FAIL_LOG: LogLimiter = LogLimiter::new(10);
/// Protected-mode refusals: 10 a second.
pub static DENIED_LOG: LogLimiter = LogLimiter::new(10);
/// Clients refused by maxclients: 2 a second.
pub static REFUSED_LOG: LogLimiter = LogLimiter::new(2);
/// Failed TLS handshakes: 10 a second.
pub static TLS_FAIL_LOG: LogLimiter = LogLimiter::new(10);
/// accept() errors: 2 a second.
pub static ACCEPT_ERR_LOG: LogLimiter = LogLimiter::new(2);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authfile() {
        let u = McUsers::parse("alice:s3cret\n\nbob:pa:ss\r\n").unwrap();
        assert!(u.check(b"alice s3cret"));
        assert!(u.check(b"bob pa:ss"));
        assert!(!u.check(b"alice s3cre"));
        assert!(!u.check(b"alice s3cret "));
        assert!(!u.check(b"alices3cret"));
        assert!(!u.check(b"carol s3cret"));
        assert!(!u.check(b""));
        assert!(McUsers::parse("").is_err());
        assert!(McUsers::parse("nocolon").is_err());
        assert!(McUsers::parse(":pw").is_err());
        assert!(McUsers::parse("u:").is_err());
        assert!(McUsers::parse("u:p w").is_err());
        assert!(!format!("{u:?}").contains("s3cret"));
    }

    #[test]
    fn delays_grow_and_cap() {
        assert_eq!(auth_fail_delay(1), Duration::from_millis(100));
        assert_eq!(auth_fail_delay(2), Duration::from_millis(200));
        assert_eq!(auth_fail_delay(5), Duration::from_millis(1600));
        assert_eq!(auth_fail_delay(6), Duration::from_millis(2000));
        assert_eq!(auth_fail_delay(u32::MAX), Duration::from_millis(2000));
    }

    #[test]
    fn limiter() {
        let l = LogLimiter::new(3);
        assert_eq!(l.admit(), Some(0));
        assert_eq!(l.admit(), Some(0));
        assert_eq!(l.admit(), Some(0));
        assert_eq!(l.admit(), None);
        assert_eq!(l.admit(), None);
    }

    #[test]
    fn ports() {
        let mut c = ServerConfig {
            memcached_port: Some(0),
            requirepass: Some("pw".into()),
            ..Default::default()
        };
        assert!(check_ports(&c)
            .unwrap_err()
            .contains("memcached-unauthenticated"));
        c.memcached_unauthenticated = true;
        assert!(check_ports(&c).is_ok());
        c.memcached_unauthenticated = false;
        c.memcached_authfile = Some("/x".into());
        assert!(check_ports(&c).is_ok());
        c.requirepass = None;
        assert!(check_ports(&c).unwrap_err().contains("requirepass"));
        c.port = None;
        assert!(check_ports(&c).is_ok());
    }

    #[test]
    fn loopback() {
        assert!(is_loopback(&"127.0.0.1:1".parse().unwrap()));
        assert!(is_loopback(&"127.9.9.9:1".parse().unwrap()));
        assert!(is_loopback(&"[::1]:1".parse().unwrap()));
        assert!(is_loopback(&"[::ffff:127.0.0.1]:1".parse().unwrap()));
        assert!(!is_loopback(&"192.0.2.1:1".parse().unwrap()));
        assert!(!is_loopback(&"[::ffff:192.0.2.1]:1".parse().unwrap()));
    }
}
