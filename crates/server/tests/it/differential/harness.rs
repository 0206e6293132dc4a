//! The two servers and the comparison (see the parent module).

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use server::Server;

use crate::common::{free_port, start, Resp, V};

/// A redis-server child process, stopped on drop.
pub struct Redis {
    child: Child,
    pub port: u16,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start redis-server on a free port, or `None` (after printing the
/// SKIPPED line for `test`) if it is not installed.
pub fn redis(test: &str) -> Option<Redis> {
    let port = free_port();
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let Ok(child) = child else {
        println!("SKIPPED: {test}: no redis-server (apt-get install redis-server)");
        return None;
    };
    let r = Redis { child, port };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "redis-server did not start");
        std::thread::sleep(Duration::from_millis(10));
    }
    Some(r)
}

/// How a reply is compared.
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum Cmp {
    /// Exactly.
    Exact,
    /// Integers within this much of each other (times, TTLs).
    Near(i64),
    /// Arrays as multisets (an order the servers choose differently, such
    /// as KEYS, or CONFIG GET's pairs).
    Unordered,
    /// Only the kind of reply (both errors, both integers, ...), for
    /// replies that are legitimately different (INFO text, random picks).
    Kind,
}

/// One command: its arguments and how its reply is compared.
#[derive(Clone, Debug)]
pub struct Step {
    pub args: Vec<Vec<u8>>,
    pub cmp: Cmp,
}

/// Parse a command line: arguments split on spaces, `""` is an empty
/// argument, `\x` a hex byte pair is not supported (use [`Step`] directly
/// for binary arguments). A leading `~N ` compares within N, `@ ` as a
/// multiset, `? ` by kind only.
pub fn step(line: &str) -> Step {
    let (cmp, rest) = if let Some(r) = line.strip_prefix("@ ") {
        (Cmp::Unordered, r)
    } else if let Some(r) = line.strip_prefix("? ") {
        (Cmp::Kind, r)
    } else if let Some(r) = line.strip_prefix('~') {
        let (n, r) = r.split_once(' ').unwrap();
        (Cmp::Near(n.parse().unwrap()), r)
    } else {
        (Cmp::Exact, line)
    };
    let args = rest
        .split(' ')
        .map(|a| {
            if a == "\"\"" {
                Vec::new()
            } else {
                a.as_bytes().to_vec()
            }
        })
        .collect();
    Step { args, cmp }
}

/// A RESP connection to either server.
pub struct Conn(pub Resp);

impl Conn {
    pub fn new(port: u16) -> Conn {
        Conn(Resp::new(port))
    }

    /// Send one command (binary-safe) and read its reply.
    pub fn run(&mut self, args: &[Vec<u8>]) -> V {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        self.0.send(&b);
        self.0.read()
    }
}

fn kind(v: &V) -> std::mem::Discriminant<V> {
    std::mem::discriminant(v)
}

fn sorted(v: &V) -> V {
    match v {
        V::Array(items) => {
            let mut s: Vec<String> = items.iter().map(|i| format!("{i:?}")).collect();
            s.sort();
            V::Array(s.into_iter().map(V::Simple).collect())
        }
        v => v.clone(),
    }
}

/// Whether two replies agree under `cmp`.
pub fn agree(cmp: Cmp, ours: &V, theirs: &V) -> bool {
    match cmp {
        Cmp::Exact => ours == theirs,
        Cmp::Near(t) => match (ours, theirs) {
            (V::Int(a), V::Int(b)) => (a - b).abs() <= t,
            _ => ours == theirs,
        },
        Cmp::Unordered => sorted(ours) == sorted(theirs),
        Cmp::Kind => kind(ours) == kind(theirs),
    }
}

/// Both servers, one connection to each.
pub struct Pair {
    pub ours: Conn,
    pub theirs: Conn,
    /// Commands compared so far.
    pub compared: usize,
    _server: Server,
    _redis: Redis,
}

impl Pair {
    /// Start both, or `None` if redis-server is missing (SKIPPED printed).
    pub fn start(test: &str) -> Option<Pair> {
        let redis = redis(test)?;
        let server = start();
        let ours = Conn::new(server.resp_port().unwrap());
        let theirs = Conn::new(redis.port);
        Some(Pair {
            ours,
            theirs,
            compared: 0,
            _server: server,
            _redis: redis,
        })
    }

    /// nibble's RESP port.
    pub fn ours_port(&self) -> u16 {
        self._server.resp_port().unwrap()
    }

    /// Items in nibble's index (expired ones not reclaimed yet included).
    pub fn ours_indexed(&self) -> u64 {
        self._server.shared().store.len()
    }

    /// redis-server's port.
    pub fn theirs_port(&self) -> u16 {
        self._redis.port
    }

    /// Run one step on both; the two replies, panicking with `ctx` if
    /// they disagree.
    pub fn check(&mut self, s: &Step, ctx: &str) -> (V, V) {
        let a = self.ours.run(&s.args);
        let b = self.theirs.run(&s.args);
        self.compared += 1;
        assert!(
            agree(s.cmp, &a, &b),
            "{ctx}\ncommand: {:?}\n  nibble: {a:?}\n  redis:  {b:?}",
            s.args
                .iter()
                .map(|x| String::from_utf8_lossy(x).into_owned())
                .collect::<Vec<_>>()
        );
        (a, b)
    }

    /// FLUSHALL both, then run every line of every case.
    pub fn cases(&mut self, cases: &[&[&str]]) {
        for (i, c) in cases.iter().enumerate() {
            self.check(&step("FLUSHALL"), "flush");
            let ctx = format!("case {i}: {c:?}");
            for line in *c {
                self.check(&step(line), &ctx);
            }
        }
    }
}

/// The proptest runner of the random-sequence tests: `NIBBLE_DIFF_CASES`
/// sequences (default 24), no failure file (a failing sequence is
/// printed; the servers' state would not replay from a file anyway).
pub fn sequence_runner() -> proptest::test_runner::TestRunner {
    let cases: u32 = std::env::var("NIBBLE_DIFF_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(24);
    proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases,
        failure_persistence: None,
        ..proptest::test_runner::Config::default()
    })
}
