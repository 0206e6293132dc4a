//! Test helpers: an in-process server on ephemeral ports, a raw RESP
//! reply reader (for RESP3 and malformed-input tests), and a raw line
//! reader for memcached.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use server::config::ServerConfig;
use server::Server;

/// A server with small defaults: 2 workers, unpinned, 32 MiB, RESP and
/// memcached on ephemeral ports.
pub fn start_with(f: impl FnOnce(&mut ServerConfig)) -> Server {
    let mut c = ServerConfig {
        port: Some(0),
        memcached_port: Some(0),
        capacity: 32 << 20,
        threads: 2,
        pin: false,
        ..Default::default()
    };
    f(&mut c);
    Server::start(c).expect("server starts")
}

pub fn start() -> Server {
    start_with(|_| {})
}

pub fn client(s: &Server) -> redis::Connection {
    let url = format!("redis://127.0.0.1:{}/", s.resp_port().unwrap());
    let c = redis::Client::open(url).unwrap();
    let con = c.get_connection().unwrap();
    con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    con
}

/// Send a command, return the result (errors as `Err`).
pub fn cmd(con: &mut redis::Connection, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
}

/// The error text of a failing command (code + message).
pub fn err(con: &mut redis::Connection, args: &[&str]) -> String {
    match cmd(con, args) {
        Ok(v) => panic!("{args:?} succeeded with {v:?}"),
        Err(e) => {
            let code = e.code().unwrap_or("").to_string();
            let detail = e.detail().unwrap_or("").to_string();
            format!("{code} {detail}")
        }
    }
}

/// A raw connection subscribed to `channel` that will never read again:
/// the slow subscriber of the output-buffer-limit tests.
pub fn stalled_subscriber(port: u16, channel: &str) -> TcpStream {
    let mut s = raw(port);
    s.write_all(
        format!(
            "*2\r\n$9\r\nSUBSCRIBE\r\n${}\r\n{channel}\r\n",
            channel.len()
        )
        .as_bytes(),
    )
    .unwrap();
    let mut buf = [0u8; 64];
    let _ = s.read(&mut buf).unwrap();
    s
}

/// Reads `s` until the server closes it (or 10 s pass without a byte);
/// returns the bytes received.
pub fn drain_until_closed(s: &mut TcpStream) -> usize {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut sink = vec![0u8; 1 << 20];
    let mut got = 0usize;
    loop {
        match s.read(&mut sink) {
            Ok(0) | Err(_) => return got,
            Ok(n) => got += n,
        }
    }
}

pub fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.set_nodelay(true).unwrap();
    s
}

/// A RESP2/RESP3 value as the tests see it.
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Simple(String),
    Err(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<V>),
    Map(Vec<(V, V)>),
    Set(Vec<V>),
    Double(String),
    Bool(bool),
    Verbatim(String),
    /// RESP3 push (`>`).
    Push(Vec<V>),
}

pub struct Resp {
    pub r: BufReader<TcpStream>,
}

impl Resp {
    pub fn new(port: u16) -> Resp {
        Resp {
            r: BufReader::new(raw(port)),
        }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.r.get_mut().write_all(b).unwrap();
    }

    pub fn cmd(&mut self, args: &[&str]) -> V {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.send(&b);
        self.read()
    }

    fn line(&mut self) -> String {
        let mut l = String::new();
        let n = self.r.read_line(&mut l).unwrap();
        assert!(n > 0, "connection closed");
        l.trim_end_matches("\r\n").to_string()
    }

    /// True if the server closed the connection (EOF).
    pub fn closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(self.r.read(&mut b), Ok(0) | Err(_))
    }

    pub fn read(&mut self) -> V {
        let l = self.line();
        let (t, rest) = l.split_at(1);
        let n = || rest.parse::<i64>().unwrap();
        match t {
            "+" => V::Simple(rest.into()),
            "-" => V::Err(rest.into()),
            ":" => V::Int(n()),
            "_" => V::Null,
            "," => V::Double(rest.into()),
            "#" => V::Bool(rest == "t"),
            "$" | "=" => {
                if n() < 0 {
                    return V::Null;
                }
                let mut b = vec![0u8; n() as usize + 2];
                self.r.read_exact(&mut b).unwrap();
                b.truncate(n() as usize);
                if t == "=" {
                    V::Verbatim(String::from_utf8(b[4..].to_vec()).unwrap())
                } else {
                    V::Bulk(b)
                }
            }
            "*" | "~" => {
                if n() < 0 {
                    return V::Null;
                }
                let items = (0..n()).map(|_| self.read()).collect();
                if t == "*" {
                    V::Array(items)
                } else {
                    V::Set(items)
                }
            }
            ">" => V::Push((0..n()).map(|_| self.read()).collect()),
            "%" => V::Map((0..n()).map(|_| (self.read(), self.read())).collect()),
            _ => panic!("bad reply line {l:?}"),
        }
    }
}

pub fn bulk(s: &str) -> V {
    V::Bulk(s.as_bytes().to_vec())
}

/// A memcached text connection.
pub struct Mc {
    pub r: BufReader<TcpStream>,
}

impl Mc {
    pub fn new(port: u16) -> Mc {
        Mc {
            r: BufReader::new(raw(port)),
        }
    }

    pub fn send(&mut self, b: &[u8]) {
        self.r.get_mut().write_all(b).unwrap();
    }

    pub fn line(&mut self) -> String {
        let mut l = String::new();
        self.r.read_line(&mut l).unwrap();
        l.trim_end_matches("\r\n").to_string()
    }

    /// Send `b` and read one line.
    pub fn req(&mut self, b: &str) -> String {
        self.send(b.as_bytes());
        self.line()
    }

    /// Read lines up to and including END.
    pub fn until_end(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        loop {
            let mut l = String::new();
            if self.r.read_line(&mut l).unwrap_or(0) == 0 {
                return v;
            }
            let l = l.trim_end_matches("\r\n").to_string();
            if l == "END" {
                return v;
            }
            v.push(l);
        }
    }
}

/// Run a command and convert the reply.
pub fn q<T: redis::FromRedisValue>(con: &mut redis::Connection, args: &[&str]) -> T {
    let mut c = redis::cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c.query(con)
        .unwrap_or_else(|e| panic!("{args:?} failed: {e}"))
}

/// The number `field` of an `INFO` reply.
pub fn info_u64(info: &str, field: &str) -> u64 {
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no {field} in {info}"))
        .trim()
        .parse()
        .unwrap()
}

/// Parse `WHAT Some(PORT)` (e.g. `resp Some(6379)`) out of the server's
/// ready line.
pub fn ready_port(line: &str, what: &str) -> Option<u16> {
    let rest = line.split(&format!("{what} Some(")).nth(1)?;
    rest.split(')').next()?.parse().ok()
}

/// Reads a spawned server's piped stderr until its "ready" line (panics if
/// it exits first or takes longer than `timeout`); returns that line and
/// the reader, for the caller to keep draining or read to the end.
pub fn wait_ready(
    child: &mut std::process::Child,
    timeout: Duration,
) -> (String, BufReader<std::process::ChildStderr>) {
    let mut err = BufReader::new(child.stderr.take().expect("stderr piped"));
    let mut line = String::new();
    let deadline = std::time::Instant::now() + timeout;
    while !line.contains("ready") {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "server exited");
        assert!(std::time::Instant::now() < deadline, "server not ready");
    }
    (line, err)
}

/// A port nobody listens on now (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A key whose stripe worker `w` of 2 owns (see `server::migrate`).
pub fn key_owned_by(w: usize, prefix: &str) -> String {
    (0..)
        .map(|i| format!("{prefix}{i}"))
        .find(|k| {
            server::migrate::owner_of(server::keylock::KeyLocks::stripe_of(k.as_bytes()), 2) == w
        })
        .expect("a key")
}
