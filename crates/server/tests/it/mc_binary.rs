//! memcached's binary protocol on the memcached port: the opcodes, SASL
//! against the authfile, malformed headers, a differential run against
//! the real memcached, and libmemcached's `memccapable` when installed.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::common::{start, start_with};
use crate::mc_meta::real_memcached;

/// One binary request.
fn req(op: u8, key: &[u8], extras: &[u8], value: &[u8], cas: u64, opaque: u32) -> Vec<u8> {
    let mut b = vec![0x80, op];
    b.extend_from_slice(&(key.len() as u16).to_be_bytes());
    b.push(extras.len() as u8);
    b.extend_from_slice(&[0, 0, 0]);
    let body = (extras.len() + key.len() + value.len()) as u32;
    b.extend_from_slice(&body.to_be_bytes());
    b.extend_from_slice(&opaque.to_be_bytes());
    b.extend_from_slice(&cas.to_be_bytes());
    b.extend_from_slice(extras);
    b.extend_from_slice(key);
    b.extend_from_slice(value);
    b
}

/// One response: (opcode, status, opaque, cas, extras, key, value).
#[derive(Debug, PartialEq, Eq)]
struct Res {
    op: u8,
    status: u16,
    opaque: u32,
    cas: u64,
    extras: Vec<u8>,
    key: Vec<u8>,
    value: Vec<u8>,
}

fn read_res(s: &mut TcpStream) -> Option<Res> {
    let mut h = [0u8; 24];
    s.read_exact(&mut h).ok()?;
    assert_eq!(h[0], 0x81, "response magic");
    let klen = usize::from(u16::from_be_bytes([h[2], h[3]]));
    let elen = usize::from(h[4]);
    let blen = u32::from_be_bytes([h[8], h[9], h[10], h[11]]) as usize;
    let mut body = vec![0u8; blen];
    s.read_exact(&mut body).ok()?;
    Some(Res {
        op: h[1],
        status: u16::from_be_bytes([h[6], h[7]]),
        opaque: u32::from_be_bytes([h[12], h[13], h[14], h[15]]),
        cas: u64::from_be_bytes(h[16..24].try_into().unwrap()),
        extras: body[..elen].to_vec(),
        key: body[elen..elen + klen].to_vec(),
        value: body[elen + klen..].to_vec(),
    })
}

fn conn(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s
}

fn set_extras(flags: u32, exptime: u32) -> Vec<u8> {
    let mut e = flags.to_be_bytes().to_vec();
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

fn arith_extras(delta: u64, initial: u64, exptime: u32) -> Vec<u8> {
    let mut e = delta.to_be_bytes().to_vec();
    e.extend_from_slice(&initial.to_be_bytes());
    e.extend_from_slice(&exptime.to_be_bytes());
    e
}

/// A pipelined script ending in NOOP; returns every response (CAS values
/// replaced by whether they are nonzero, texts of errors kept).
fn script(port: u16) -> Vec<Res> {
    let mut s = conn(port);
    let mut b = Vec::new();
    b.extend(req(0x08, b"", &[], b"", 0, 1)); // flush
    b.extend(req(0x01, b"a", &set_extras(7, 0), b"hello", 0, 2)); // set
    b.extend(req(0x00, b"a", &[], b"", 0, 3)); // get
    b.extend(req(0x0c, b"a", &[], b"", 0, 4)); // getk
    b.extend(req(0x00, b"nope", &[], b"", 0, 5)); // get miss
    b.extend(req(0x09, b"nope", &[], b"", 0, 6)); // getq miss: silent
    b.extend(req(0x0d, b"a", &[], b"", 0, 7)); // getkq hit
    b.extend(req(0x02, b"a", &set_extras(0, 0), b"x", 0, 8)); // add exists
    b.extend(req(0x03, b"zz", &set_extras(0, 0), b"x", 0, 9)); // replace miss
    b.extend(req(0x11, b"q", &set_extras(0, 0), b"x", 0, 10)); // setq: silent
    b.extend(req(0x0e, b"a", &[], b"!!", 0, 11)); // append
    b.extend(req(0x0f, b"a", &[], b"<<", 0, 12)); // prepend
    b.extend(req(0x0e, b"zz", &[], b"!!", 0, 13)); // append miss
    b.extend(req(0x00, b"a", &[], b"", 0, 14));
    b.extend(req(0x05, b"n", &arith_extras(1, 10, 0), b"", 0, 15)); // incr creates
    b.extend(req(0x05, b"n", &arith_extras(5, 0, 0), b"", 0, 16));
    b.extend(req(0x06, b"n", &arith_extras(100, 0, 0), b"", 0, 17));
    b.extend(req(0x05, b"m", &arith_extras(1, 0, u32::MAX), b"", 0, 18)); // no create
    b.extend(req(0x05, b"a", &arith_extras(1, 0, 0), b"", 0, 19)); // non-numeric
    b.extend(req(0x15, b"n", &arith_extras(1, 0, 0), b"", 0, 20)); // incrq: silent
    b.extend(req(0x04, b"q", &[], b"", 0, 21)); // delete
    b.extend(req(0x04, b"q", &[], b"", 0, 22)); // delete miss
    b.extend(req(0x1c, b"a", &100u32.to_be_bytes(), b"", 0, 23)); // touch
    b.extend(req(0x1c, b"zz", &100u32.to_be_bytes(), b"", 0, 24)); // touch miss
    b.extend(req(0x1d, b"a", &100u32.to_be_bytes(), b"", 0, 25)); // gat
    b.extend(req(0x1e, b"zz", &100u32.to_be_bytes(), b"", 0, 26)); // gatq miss
    b.extend(req(0x01, b"c", &set_extras(0, 0), b"v", 999_999, 27)); // cas miss
    b.extend(req(0x50, b"", &[], b"", 0, 30)); // unknown opcode
    b.extend(req(0x0a, b"", &[], b"", 0, 32)); // noop
    s.write_all(&b).unwrap();
    let mut v = Vec::new();
    loop {
        let seen: Vec<u32> = v.iter().map(|r: &Res| r.opaque).collect();
        let mut r = read_res(&mut s).unwrap_or_else(|| panic!("a response after {seen:?}"));
        r.cas = u64::from(r.cas != 0);
        let last = r.opaque == 32;
        v.push(r);
        if last {
            return v;
        }
    }
}

#[test]
fn binary_opcodes() {
    let s = start();
    let port = s.memcached_port().unwrap();
    let ours = script(port);
    let get = ours.iter().find(|r| r.opaque == 3).unwrap();
    assert_eq!((get.status, &get.value[..]), (0, &b"hello"[..]));
    assert_eq!(get.extras, 7u32.to_be_bytes());
    let unknown = ours.iter().find(|r| r.opaque == 30).unwrap();
    assert_eq!(unknown.status, 0x81);
    assert!(ours.iter().all(|r| ![6, 10, 20, 26].contains(&r.opaque)));
    // Requests of the wrong shape answer EINVAL and keep the connection
    // (memcached closes it).
    let mut c = conn(port);
    c.write_all(&req(0x00, b"", &[], b"", 0, 1)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 4);
    c.write_all(&req(0x01, b"c", &[], b"v", 0, 2)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 4);
    // Version, stat.
    c.write_all(&req(0x0b, b"", &[], b"", 0, 1)).unwrap();
    assert!(read_res(&mut c).unwrap().value.starts_with(b"1.6"));
    c.write_all(&req(0x10, b"", &[], b"", 0, 2)).unwrap();
    let mut n = 0;
    while !read_res(&mut c).unwrap().key.is_empty() {
        n += 1;
    }
    assert!(n > 5);
    // An over-limit body is refused and skipped; the connection goes on.
    let s2 = start_with(|c| c.proto_max_bulk_len = 1 << 16);
    let mut c = conn(s2.memcached_port().unwrap());
    let big = vec![b'x'; 1 << 17];
    c.write_all(&req(0x01, b"big", &set_extras(0, 0), &big, 0, 1))
        .unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 3);
    c.write_all(&req(0x0a, b"", &[], b"", 0, 2)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().opaque, 2);
    // Quit answers and closes.
    c.write_all(&req(0x07, b"", &[], b"", 0, 3)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0);
    assert!(read_res(&mut c).is_none());
    let Some(real) = real_memcached("binary_opcodes") else {
        return;
    };
    let theirs = script(real.port);
    for (a, b) in ours.iter().zip(&theirs) {
        assert_eq!(a, b, "opaque {}", a.opaque);
    }
    assert_eq!(ours.len(), theirs.len());
}

#[test]
fn binary_sasl_uses_the_authfile() {
    let dir = std::env::temp_dir().join(format!("nibble-mcbin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("authfile");
    std::fs::write(&file, "alice:wonder-land\n").unwrap();
    let s = start_with(|c| {
        c.memcached_authfile = Some(file.clone());
        c.requirepass = Some("Pw-9xQ".into());
    });
    let mut c = conn(s.memcached_port().unwrap());
    c.write_all(&req(0x00, b"k", &[], b"", 0, 1)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0x20);
    c.write_all(&req(0x20, b"", &[], b"", 0, 2)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().value, b"PLAIN");
    c.write_all(&req(0x21, b"PLAIN", &[], b"\0alice\0wrong", 0, 3))
        .unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0x20);
    c.write_all(&req(0x21, b"PLAIN", &[], b"\0alice\0wonder-land", 0, 4))
        .unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0);
    c.write_all(&req(0x01, b"k", &set_extras(0, 0), b"v", 0, 5))
        .unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0);
    // Before authentication, a body over 1 KiB is refused and the
    // connection closed.
    let mut c = conn(s.memcached_port().unwrap());
    // (Only the header is sent: the server must not wait for the body.)
    let _ = c.write_all(&req(0x21, b"PLAIN", &[], &[b'x'; 4096], 0, 6)[..24]);
    assert_eq!(read_res(&mut c).unwrap().status, 3);
    assert!(read_res(&mut c).is_none());
    // Without an authfile, SASL opcodes are unknown commands.
    let s2 = start();
    let mut c = conn(s2.memcached_port().unwrap());
    c.write_all(&req(0x20, b"", &[], b"", 0, 1)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().status, 0x81);
}

#[test]
fn random_headers_never_crash() {
    let s = start();
    let port = s.memcached_port().unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for _ in 0..200 {
        let mut c = conn(port);
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut h = vec![0x80u8];
        h.extend((0..23 + next() % 40).map(|_| next() as u8));
        if next() % 2 == 0 {
            // A small body length, so most requests are complete.
            h[8..12].copy_from_slice(&((next() % 32) as u32).to_be_bytes());
        }
        let _ = c.write_all(&h);
        let mut b = [0u8; 4096];
        let _ = c.read(&mut b);
    }
    let mut c = conn(port);
    c.write_all(&req(0x0a, b"", &[], b"", 0, 9)).unwrap();
    assert_eq!(read_res(&mut c).unwrap().opaque, 9);
}

/// libmemcached's conformance test, when installed.
#[test]
fn memccapable_passes() {
    let Some(bin) = ["/usr/bin/memccapable", "/usr/bin/memcapable"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        println!("SKIPPED memccapable_passes: no memccapable (apt-get install libmemcached-tools)");
        return;
    };
    let s = start();
    let port = s.memcached_port().unwrap().to_string();
    let out = std::process::Command::new(bin)
        .args(["-h", "127.0.0.1", "-p", &port, "-t", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let passed = text.matches("[pass]").count();
    assert!(
        out.status.success() && text.contains("All tests passed"),
        "{text}"
    );
    println!("memccapable: {passed} tests passed");
}
