//! memcached's meta commands and the corners of the text protocol,
//! compared where possible with the real memcached (`/usr/bin/memcached`,
//! started on a free port; the comparison is SKIPPED when it is absent).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, start, Mc};

/// A real memcached on a free port, killed on drop.
pub struct RealMc {
    child: Child,
    pub port: u16,
}

impl Drop for RealMc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Start `/usr/bin/memcached`, or print a SKIPPED line and return None.
pub fn real_memcached(test: &str) -> Option<RealMc> {
    let bin = "/usr/bin/memcached";
    if !std::path::Path::new(bin).exists() {
        println!("SKIPPED {test}: no {bin} (apt-get install memcached)");
        return None;
    }
    let port = free_port();
    let child = Command::new(bin)
        .args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1"])
        .args(["-u", "nobody", "-m", "64", "-t", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let deadline = Instant::now() + Duration::from_secs(5);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            println!("SKIPPED {test}: memcached did not start");
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Some(RealMc { child, port })
}

/// Send `req` then `sentinel`, and read until the reply ends with
/// `end` (the sentinel's answer); returns what came before it.
pub fn exchange(port: u16, req: &[u8], sentinel: &[u8], end: &[u8]) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(req).unwrap();
    s.write_all(sentinel).unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    while !got.ends_with(end) {
        let n = s.read(&mut b).unwrap_or(0);
        if n == 0 {
            break;
        }
        got.extend_from_slice(&b[..n]);
    }
    got.truncate(got.len().saturating_sub(end.len()));
    got
}

#[test]
fn stats_noreply_and_groups() {
    let s = start();
    let mut m = Mc::new(s.memcached_port().unwrap());
    assert_eq!(m.req("stats noreply\r\n"), "ERROR");
    assert_eq!(m.req("stats reset\r\n"), "RESET");
    assert_eq!(m.req("stats bogus\r\n"), "ERROR");
    assert_eq!(m.req("stats items\r\n"), "END");
    m.send(b"stats\r\n");
    assert!(m.until_end().len() > 5);
    // With other misuses of noreply and extra tokens.
    let script = b"stats noreply\r\nstats reset\r\nstats bogus\r\nstats items\r\n\
        verbosity 1 noreply\r\nverbosity noreply\r\nverbosity\r\n\
        set a 0 0 1 noreply extra\r\nx\r\ndelete a noreply extra\r\n\
        incr a 1 noreply extra\r\ntouch a 1 noreply extra\r\n\
        flush_all 0 noreply extra\r\nset n 0 0 1\r\n1\r\nincr n 1 noreply\r\n\
        decr n 1 noreply\r\ntouch n 0 noreply\r\ndelete n noreply\r\n\
        flush_all noreply\r\nflush_all 0 noreply\r\nflush_all bogus\r\n\
        verbosity 1 2\r\nget\r\ngets\r\nset s 0 0 1\r\nx\r\nincr s 1 noreply\r\n\
        incr s abc noreply\r\nset a 0 x 1 noreply\r\ntouch s abc noreply\r\n\
        cas a 0 0 1 noreply\r\nx\r\nappend zz 0 0 1 noreply\r\nx\r\nincr s abc\r\n";
    let Some(real) = real_memcached("stats_noreply_and_groups") else {
        return;
    };
    let sentinel: &[u8] = b"verbosity 1\r\n";
    let ours = exchange(s.memcached_port().unwrap(), script, sentinel, b"OK\r\n");
    let theirs = exchange(real.port, script, sentinel, b"OK\r\n");
    assert_eq!(
        String::from_utf8_lossy(&ours),
        String::from_utf8_lossy(&theirs)
    );
}

/// Replace CAS values (`c<digits>` return flags) with `c#`: the two
/// servers number versions differently.
fn mask_cas(b: &[u8]) -> String {
    String::from_utf8_lossy(b)
        .split("\r\n")
        .map(|l| {
            l.split(' ')
                .map(|t| match t.strip_prefix('c') {
                    Some(d) if !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()) => "c#",
                    _ => t,
                })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("\r\n")
}

/// The same meta commands sent to nibble and to memcached 1.6 get the same
/// replies (CAS values masked).
#[test]
fn meta_commands_match_memcached() {
    let long_key = "k".repeat(251);
    let script = format!(
        "ms foo 2 T0 F5 c k O123\r\nhi\r\n\
         mg foo v k f s t c O9 q\r\nmg foo s v\r\nmg miss v\r\nmg miss v q O1\r\n\
         mg foo z\r\nmg foo k v\r\nms foo 2 MA\r\nxx\r\nmg foo v\r\n\
         ms bar 2 ME q\r\nab\r\nms bar 2 ME\r\nab\r\nms bar 2 MR\r\ncd\r\n\
         ms nob 2 MR\r\ncd\r\nms nob 2 MA\r\ncd\r\nms bar 2 MP\r\n<<\r\nmg bar v f\r\n\
         ms bar 2 C999999\r\nab\r\nms bar 2 F7 T100 c\r\nab\r\nmg bar f t v\r\n\
         md bar q\r\nmd bar\r\nmd bar q\r\nmd bar O5 k\r\n\
         ma cnt\r\nma cnt N0 J10 v\r\nma cnt v MD D3 t\r\nma cnt q\r\nma cnt v\r\n\
         ma cnt MI D5 v k O1\r\nma cnt q v\r\nma cnt M- D100 v\r\nma foo\r\n\
         mg foo T30 t\r\nmg foo\r\nms foo x\r\nms foo 2 MX\r\nzz\r\n\
         ms foo 2 Fx\r\nzz\r\nma cnt Mx\r\nmd cnt x\r\nmd cnt C999999 q\r\n\
         mg {long_key} v\r\nms big 2 T-1\r\nzz\r\nmg big v\r\nmg big q\r\n\
         mg\r\nms\r\nmd\r\nmn\r\nmn x\r\nme nope\r\nms e 0\r\n\r\nmg e v s\r\n\
         ms Zm9vYg== 2 b k c\r\nhi\r\nmg Zm9vYg== b k v\r\nmg foob v\r\n\
         mg @@@ b v\r\nmd Zm9vYg== b q k\r\nma Y250Mg b N0 J5 v k\r\nmg cnt2 v\r\n\
         ma Y250Mg== b N0 J5 v k\r\nmg cnt2 v\r\nms Y250Mg 1 b\r\n1\r\n\
         md Y250Mg b\r\nms @@@@ 1 b\r\n1\r\nmd @@@@ b\r\n"
    );
    let sentinel: &[u8] = b"ms __end 3 k\r\nend\r\n";
    let end: &[u8] = b"HD k__end\r\n";
    let s = start();
    let ours = exchange(
        s.memcached_port().unwrap(),
        script.as_bytes(),
        sentinel,
        end,
    );
    assert!(mask_cas(&ours).contains("VA 2 kfoo f5 s2 t-1 c# O9\r\nhi\r\n"));
    let Some(real) = real_memcached("meta_commands_match_memcached") else {
        return;
    };
    let theirs = exchange(real.port, script.as_bytes(), sentinel, end);
    assert_eq!(mask_cas(&ours), mask_cas(&theirs));
}

#[test]
fn meta_cas_vivify_and_debug() {
    let s = crate::common::start_with(|c| c.proto_max_bulk_len = 1 << 20);
    let mut m = Mc::new(s.memcached_port().unwrap());
    m.send(b"ms k 3 c\r\nabc\r\n");
    let l = m.line();
    let cas: u64 = l.strip_prefix("HD c").unwrap().parse().unwrap();
    assert_eq!(m.req("mg k c\r\n"), format!("HD c{cas}"));
    // The classic gets sees the same CAS value.
    m.send(b"gets k\r\n");
    assert_eq!(m.until_end()[0], format!("VALUE k 0 3 {cas}"));
    assert_eq!(m.req(&format!("ms k 1 C{}\r\nx\r\n", cas + 1)), "EX");
    m.send(format!("ms k 1 C{cas} c\r\nx\r\n").as_bytes());
    let cas2: u64 = m.line().strip_prefix("HD c").unwrap().parse().unwrap();
    assert_ne!(cas, cas2);
    assert_eq!(m.req(&format!("md k C{cas}\r\n")), "EX");
    assert!(m.req("me k\r\n").starts_with("ME k exp=-1 la=0 cas="));
    assert_eq!(m.req(&format!("md k C{cas2}\r\n")), "HD");
    assert_eq!(m.req("me k\r\n"), "EN");
    // Vivify on miss: the creator gets W and an empty value.
    m.send(b"mg v N30 v t\r\n");
    assert_eq!(m.line(), "VA 0 t30 W");
    assert_eq!(m.line(), "");
    assert_eq!(m.req("mg v s\r\n"), "HD s0");
    // Quiet pipeline ended by mn: only the misses' absence and MN.
    m.send(b"mg nope1 v q\r\nms q1 1 q\r\n1\r\nmd nope2 q\r\nmn\r\n");
    assert_eq!(m.line(), "NF");
    assert_eq!(m.line(), "MN");
    // A too-large ms is refused and its data skipped.
    let big = "x".repeat(2 << 20);
    m.send(format!("ms big {} T0\r\n{big}\r\n", big.len()).as_bytes());
    assert_eq!(m.line(), "SERVER_ERROR object too large for cache");
    assert_eq!(m.req("mn\r\n"), "MN");
    // Meta commands count as gets and sets in stats.
    m.send(b"stats\r\n");
    let st = m.until_end();
    assert!(st.iter().any(|l| l.starts_with("STAT get_hits ")));
}
