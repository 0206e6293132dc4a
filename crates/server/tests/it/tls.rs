//! TLS on `tls-port`: certificates made with rcgen at test time, a rustls
//! client over a std `TcpStream`; the three `tls-auth-clients` modes,
//! plaintext, silence and garbage on the TLS port, start-up refusals, the
//! real binary's flags, and `redis-cli --tls` where it is installed.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use server::config::ServerConfig;
use server::tls::AuthClients;
use server::Server;

use crate::common::{free_port, ready_port, start_with, wait_ready};

/// A certificate and its key, as DER (for the rustls client) and as PEM
/// files (for the server and redis-cli).
struct Cred {
    cert: CertificateDer<'static>,
    key: Vec<u8>,
    cert_file: PathBuf,
    key_file: PathBuf,
}

impl Cred {
    fn key(&self) -> PrivateKeyDer<'static> {
        PrivatePkcs8KeyDer::from(self.key.clone()).into()
    }
}

/// A CA, a server certificate for localhost / 127.0.0.1 and a client
/// certificate signed by it, and a second, unrelated CA with its own
/// client certificate; all written to a fresh temp dir.
struct Pki {
    dir: PathBuf,
    ca: Cred,
    server: Cred,
    client: Cred,
    other_client: Cred,
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn ca(dir: &Path, name: &str) -> (Cred, rcgen::Certificate, KeyPair) {
    let key = KeyPair::generate().unwrap();
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = p.self_signed(&key).unwrap();
    let cred = Cred {
        cert: cert.der().clone(),
        key: key.serialize_der(),
        cert_file: write(dir, &format!("{name}.crt"), &cert.pem()),
        key_file: write(dir, &format!("{name}.key"), &key.serialize_pem()),
    };
    (cred, cert, key)
}

fn leaf(
    dir: &Path,
    name: &str,
    sans: &[&str],
    eku: ExtendedKeyUsagePurpose,
    issuer: &(rcgen::Certificate, KeyPair),
) -> Cred {
    let key = KeyPair::generate().unwrap();
    let mut p =
        CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![eku];
    let cert = p.signed_by(&key, &issuer.0, &issuer.1).unwrap();
    Cred {
        cert: cert.der().clone(),
        key: key.serialize_der(),
        cert_file: write(dir, &format!("{name}.crt"), &cert.pem()),
        key_file: write(dir, &format!("{name}.key"), &key.serialize_pem()),
    }
}

impl Pki {
    fn new(test: &str) -> Pki {
        let dir = std::env::temp_dir().join(format!("nibble-tls-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_cred, ca_cert, ca_key) = ca(&dir, "ca");
        let issuer = (ca_cert, ca_key);
        let server = leaf(
            &dir,
            "server",
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &issuer,
        );
        let client = leaf(
            &dir,
            "client",
            &["client"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &issuer,
        );
        let (_, other_cert, other_key) = ca(&dir, "other-ca");
        let other_client = leaf(
            &dir,
            "other-client",
            &["client"],
            ExtendedKeyUsagePurpose::ClientAuth,
            &(other_cert, other_key),
        );
        Pki {
            dir,
            ca: ca_cred,
            server,
            client,
            other_client,
        }
    }

    /// Configure `c` for TLS on an ephemeral port with this PKI.
    fn configure(&self, c: &mut ServerConfig, auth: AuthClients) {
        c.tls.port = Some(0);
        c.tls.cert_file = Some(self.server.cert_file.clone());
        c.tls.key_file = Some(self.server.key_file.clone());
        c.tls.ca_cert_file = Some(self.ca.cert_file.clone());
        c.tls.auth_clients = auth;
    }

    fn start(&self, auth: AuthClients) -> Server {
        self.start_with(auth, |_| {})
    }

    /// [`Pki::start`], then `f` changes the configuration.
    fn start_with(&self, auth: AuthClients, f: impl FnOnce(&mut ServerConfig)) -> Server {
        start_with(|c| {
            self.configure(c, auth);
            f(c);
        })
    }

    /// A client that trusts this CA and presents `cred`, if any.
    fn client_config(&self, cred: Option<&Cred>) -> Arc<ClientConfig> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.cert.clone()).unwrap();
        let b =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_root_certificates(roots);
        Arc::new(match cred {
            Some(c) => b
                .with_client_auth_cert(vec![c.cert.clone()], c.key())
                .unwrap(),
            None => b.with_no_client_auth(),
        })
    }
}

/// A RESP client over TLS (blocking).
struct TlsClient {
    r: BufReader<StreamOwned<ClientConnection, TcpStream>>,
}

impl TlsClient {
    fn connect(port: u16, cfg: Arc<ClientConfig>) -> TlsClient {
        TlsClient::connect_to("127.0.0.1", port, cfg)
    }

    fn connect_to(host: &str, port: u16, cfg: Arc<ClientConfig>) -> TlsClient {
        let sock = TcpStream::connect((host, port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let conn = ClientConnection::new(cfg, ServerName::try_from("localhost").unwrap()).unwrap();
        TlsClient {
            r: BufReader::new(StreamOwned::new(conn, sock)),
        }
    }

    /// Finish the handshake now (it otherwise runs on the first write).
    fn handshake(&mut self) -> std::io::Result<()> {
        let s = self.r.get_mut();
        while s.conn.is_handshaking() {
            s.conn.complete_io(&mut s.sock)?;
        }
        Ok(())
    }

    fn send(&mut self, b: &[u8]) -> std::io::Result<()> {
        let s = self.r.get_mut();
        s.write_all(b)?;
        s.flush()
    }

    fn line(&mut self) -> std::io::Result<String> {
        let mut l = String::new();
        if self.r.read_line(&mut l)? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        Ok(l.trim_end_matches("\r\n").to_string())
    }

    /// One reply, flattened to text: `+OK` -> "OK", `-ERR x` -> "-ERR x",
    /// `:1` -> "1", a bulk -> its bytes, nil -> "(nil)", an array -> its
    /// items joined with '\n'.
    fn read(&mut self) -> std::io::Result<String> {
        let l = self.line()?;
        let (t, rest) = l.split_at(1);
        Ok(match t {
            "+" | ":" => rest.to_string(),
            "-" => l,
            "$" => {
                let n: i64 = rest.parse().unwrap();
                if n < 0 {
                    return Ok("(nil)".into());
                }
                let mut b = vec![0u8; n as usize + 2];
                self.r.read_exact(&mut b)?;
                b.truncate(n as usize);
                String::from_utf8(b).unwrap()
            }
            "*" => {
                let n: usize = rest.parse().unwrap();
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.read()?);
                }
                items.join("\n")
            }
            _ => panic!("unexpected reply line {l:?}"),
        })
    }

    fn cmd(&mut self, args: &[&str]) -> std::io::Result<String> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        self.send(&b)?;
        self.read()
    }
}

/// PING over a fresh TLS connection: the handshake and the first reply.
fn ping(port: u16, cfg: Arc<ClientConfig>) -> std::io::Result<String> {
    TlsClient::connect(port, cfg).cmd(&["PING"])
}

/// PING over a fresh TLS connection as each client: none, one with a
/// certificate from the CA, one with a certificate from another CA.
/// Which got PONG.
fn pongs(pki: &Pki, port: u16) -> [bool; 3] {
    [None, Some(&pki.client), Some(&pki.other_client)]
        .map(|cred| ping(port, pki.client_config(cred)).is_ok_and(|r| r == "PONG"))
}

/// Read until EOF or an error; the bytes read. Panics after `within`.
fn read_to_close(s: &mut TcpStream, within: Duration) -> Vec<u8> {
    s.set_read_timeout(Some(within)).unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                panic!("not closed within {within:?} ({:?})", t.elapsed())
            }
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                panic!("not closed within {within:?} ({:?})", t.elapsed())
            }
            Err(_) => return got,
        }
    }
}

/// Wait until the server counts `n` connected clients.
fn wait_connected(s: &Server, n: usize) {
    let t = Instant::now();
    while s.shared().connected.load(Ordering::Acquire) != n {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "connected = {}, want {n}",
            s.shared().connected.load(Ordering::Acquire)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn tls_ping_set_get_config_and_large_replies() {
    let pki = Pki::new("basic");
    let s = pki.start(AuthClients::Yes);
    let port = s.tls_port().unwrap();
    assert_ne!(Some(port), s.resp_port());
    let mut c = TlsClient::connect(port, pki.client_config(Some(&pki.client)));
    assert_eq!(c.cmd(&["PING"]).unwrap(), "PONG");
    assert_eq!(c.cmd(&["SET", "k", "over tls"]).unwrap(), "OK");
    assert_eq!(c.cmd(&["GET", "k"]).unwrap(), "over tls");
    // One store behind both ports.
    let mut plain = crate::common::client(&s);
    assert_eq!(
        crate::common::q::<String>(&mut plain, &["GET", "k"]),
        "over tls"
    );
    // The settings are shown, read-only.
    let got = c.cmd(&["CONFIG", "GET", "tls-*"]).unwrap();
    let m: std::collections::HashMap<&str, &str> = got
        .split('\n')
        .collect::<Vec<_>>()
        .chunks(2)
        .map(|kv| (kv[0], kv[1]))
        .collect();
    assert_eq!(m["tls-port"], port.to_string());
    assert_eq!(m["tls-auth-clients"], "yes");
    assert_eq!(
        m["tls-cert-file"],
        pki.server.cert_file.display().to_string()
    );
    assert_eq!(m["tls-key-file"], pki.server.key_file.display().to_string());
    assert_eq!(
        m["tls-ca-cert-file"],
        pki.ca.cert_file.display().to_string()
    );
    assert_eq!(
        c.cmd(&["CONFIG", "SET", "tls-auth-clients", "no"]).unwrap(),
        "-ERR CONFIG SET failed (possibly related to argument 'tls-auth-clients') - can't set immutable config"
    );
    // Replies larger than a TLS record and than the output buffer, and a
    // deep pipeline, all arrive whole.
    let big = "v".repeat(3 << 20);
    assert_eq!(c.cmd(&["SET", "big", &big]).unwrap(), "OK");
    assert_eq!(c.cmd(&["GET", "big"]).unwrap().len(), big.len());
    // A client that starts reading only after the server's socket buffer
    // has filled: the server must go on writing as it drains.
    c.send(&b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n".repeat(4))
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    for _ in 0..4 {
        assert_eq!(c.read().unwrap().len(), big.len());
    }
    let mut batch = Vec::new();
    for _ in 0..2000 {
        batch.extend_from_slice(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
    c.send(&batch).unwrap();
    for _ in 0..2000 {
        assert_eq!(c.read().unwrap(), "over tls");
    }
    assert_eq!(c.cmd(&["QUIT"]).unwrap(), "OK");
}

#[test]
fn tls_auth_clients_yes_requires_a_cert_from_the_ca() {
    let pki = Pki::new("yes");
    let s = pki.start(AuthClients::Yes);
    let port = s.tls_port().unwrap();
    let mut kept = TlsClient::connect(port, pki.client_config(Some(&pki.client)));
    assert_eq!(kept.cmd(&["SET", "k", "1"]).unwrap(), "OK");
    // Only the client with a certificate from the CA.
    assert_eq!(pongs(&pki, port), [false, true, false]);
    // The refused handshakes touched nobody else.
    assert_eq!(kept.cmd(&["GET", "k"]).unwrap(), "1");
    drop(kept);
    wait_connected(&s, 0);
}

#[test]
fn tls_auth_clients_optional_and_no() {
    let pki = Pki::new("optional");
    let s = pki.start(AuthClients::Optional);
    // A presented certificate is verified.
    assert_eq!(pongs(&pki, s.tls_port().unwrap()), [true, true, false]);
    drop(s);
    // `no`: nothing is asked for, so a client certificate from any CA is
    // never sent, and no CA file is needed.
    let s = pki.start_with(AuthClients::No, |c| {
        c.tls.ca_cert_file = None;
    });
    assert_eq!(pongs(&pki, s.tls_port().unwrap()), [true, true, true]);
}

#[test]
fn tls_port_closes_plaintext_and_serves_others() {
    let pki = Pki::new("plain");
    let s = pki.start(AuthClients::No);
    let port = s.tls_port().unwrap();
    let mut good = TlsClient::connect(port, pki.client_config(None));
    assert_eq!(good.cmd(&["PING"]).unwrap(), "PONG");
    for req in [&b"PING\r\n"[..], b"*1\r\n$4\r\nPING\r\n"] {
        let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
        t.write_all(req).unwrap();
        let got = read_to_close(&mut t, Duration::from_secs(5));
        assert!(!got.windows(4).any(|w| w == b"PONG"), "{got:?}");
    }
    assert_eq!(good.cmd(&["PING"]).unwrap(), "PONG");
    // The plain port is unaffected.
    let mut r = crate::common::Resp::new(s.resp_port().unwrap());
    assert_eq!(r.cmd(&["PING"]), crate::common::V::Simple("PONG".into()));
}

#[test]
fn tls_silent_client_is_closed_after_the_handshake_timeout() {
    let pki = Pki::new("silent");
    let s = pki.start_with(AuthClients::No, |c| {
        c.tls.handshake_timeout = Duration::from_millis(300);
        c.maxclients = 1;
    });
    let port = s.tls_port().unwrap();
    let t = Instant::now();
    let mut silent = TcpStream::connect(("127.0.0.1", port)).unwrap();
    wait_connected(&s, 1);
    // While it holds the only slot, another TLS client is closed at once.
    let mut over = TcpStream::connect(("127.0.0.1", port)).unwrap();
    read_to_close(&mut over, Duration::from_secs(2));
    assert!(read_to_close(&mut silent, Duration::from_secs(2)).is_empty());
    let took = t.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "{took:?}"
    );
    // Its slot is free again.
    wait_connected(&s, 0);
    assert_eq!(ping(port, pki.client_config(None)).unwrap(), "PONG");
    // The handshake timeout ends with the handshake: a client quiet for
    // longer afterwards is still served.
    wait_connected(&s, 0);
    let mut c = TlsClient::connect(port, pki.client_config(None));
    c.handshake().unwrap();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(c.cmd(&["PING"]).unwrap(), "PONG");
}

/// A TLS ClientHello as a rustls client sends it.
fn client_hello(cfg: Arc<ClientConfig>) -> Vec<u8> {
    let mut conn = ClientConnection::new(cfg, ServerName::try_from("localhost").unwrap()).unwrap();
    let mut out = Vec::new();
    while conn.wants_write() {
        conn.write_tls(&mut out).unwrap();
    }
    out
}

#[test]
fn tls_garbage_never_hurts_the_server() {
    let pki = Pki::new("fuzz");
    let s = pki.start_with(AuthClients::Yes, |c| {
        c.tls.handshake_timeout = Duration::from_millis(500);
    });
    let port = s.tls_port().unwrap();
    let mut good = TlsClient::connect(port, pki.client_config(Some(&pki.client)));
    assert_eq!(good.cmd(&["SET", "keep", "me"]).unwrap(), "OK");
    let hello = client_hello(pki.client_config(Some(&pki.client)));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for i in 0..200 {
        let input = match i % 4 {
            // Random bytes of random length.
            0 => (0..next() % 3000).map(|_| next() as u8).collect(),
            // A TLS handshake record header, then random bytes.
            1 => {
                let mut v = vec![0x16, 0x03, 0x01, (next() % 0x48) as u8, next() as u8];
                v.extend((0..next() % 600).map(|_| next() as u8));
                v
            }
            // A real ClientHello with a few bytes changed, maybe cut short.
            _ => {
                let mut v = hello.clone();
                for _ in 0..1 + next() % 8 {
                    let at = (next() as usize) % v.len();
                    v[at] = next() as u8;
                }
                if i % 4 == 3 {
                    v.truncate((next() as usize) % v.len());
                }
                v
            }
        };
        let mut t = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let _ = t.write_all(&input);
        let _ = t.shutdown(Shutdown::Write);
        read_to_close(&mut t, Duration::from_secs(5));
    }
    assert_eq!(good.cmd(&["GET", "keep"]).unwrap(), "me");
    assert_eq!(
        ping(port, pki.client_config(Some(&pki.client))).unwrap(),
        "PONG"
    );
    drop(good);
    wait_connected(&s, 0);
}

/// One thread, 16 MB, a RESP port of the kernel's choice, no memcached.
fn small_config() -> ServerConfig {
    ServerConfig {
        port: Some(0),
        capacity: 16 << 20,
        threads: 1,
        pin: false,
        ..Default::default()
    }
}

#[test]
fn tls_start_refusals() {
    let pki = Pki::new("refusals");
    let missing = pki.dir.join("no-such.pem");
    let junk = write(&pki.dir, "junk.pem", "this is not PEM\n");
    let broken = write(
        &pki.dir,
        "broken.pem",
        "-----BEGIN CERTIFICATE-----\n!!!!\n-----END CERTIFICATE-----\n",
    );
    let refused = |f: &dyn Fn(&mut ServerConfig), want: &str| {
        let mut c = small_config();
        pki.configure(&mut c, AuthClients::Yes);
        f(&mut c);
        match Server::start(c) {
            Ok(_) => panic!("started; want a refusal with {want:?}"),
            Err(e) => assert!(e.to_string().contains(want), "{e} (want {want:?})"),
        }
    };
    refused(
        &|c| c.tls.key_file = None,
        "tls-port is set but tls-key-file is not",
    );
    refused(
        &|c| c.tls.cert_file = None,
        "tls-port is set but tls-cert-file is not",
    );
    refused(&|c| c.tls.key_file = Some(missing.clone()), "No such file");
    refused(
        &|c| c.tls.cert_file = Some(junk.clone()),
        "no PEM certificate",
    );
    refused(&|c| c.tls.cert_file = Some(broken.clone()), "bad PEM");
    refused(
        &|c| c.tls.key_file = Some(junk.clone()),
        "no PEM private key",
    );
    // The client's key does not belong to the server's certificate.
    refused(
        &|c| c.tls.key_file = Some(pki.client.key_file.clone()),
        "tls-key-file",
    );
    refused(
        &|c| c.tls.ca_cert_file = None,
        "tls-auth-clients yes needs tls-ca-cert-file",
    );
    refused(
        &|c| {
            c.tls.ca_cert_file = None;
            c.tls.auth_clients = AuthClients::Optional;
        },
        "tls-auth-clients optional needs tls-ca-cert-file",
    );
    refused(
        &|c| c.tls.ca_cert_file = Some(junk.clone()),
        "tls-ca-cert-file",
    );
    refused(
        &|c| {
            c.port = Some(7399);
            c.tls.port = Some(7399);
        },
        "tls-port 7399 is also port",
    );
    // tls-port off: the files are not read, as in Redis.
    let mut c = small_config();
    c.tls.cert_file = Some(missing.clone());
    let s = Server::start(c).unwrap();
    assert_eq!(s.tls_port(), None);
}

const BIN: &str = env!("CARGO_BIN_EXE_nibble");

#[test]
fn tls_binary_flags_config_file_and_refusal() {
    let pki = Pki::new("binary");
    let conf = write(
        &pki.dir,
        "nibble.conf",
        &format!(
            "port 0\nmaxmemory 16mb\nthreads 1\ntls-cert-file \"{}\"\ntls-key-file {}\ntls-auth-clients optional\n",
            pki.server.cert_file.display(),
            pki.server.key_file.display()
        ),
    );
    let tls_port = free_port();
    let mut child = Command::new(BIN)
        .arg("--config")
        .arg(&conf)
        .args(["--no-pin", "--tls-port", &tls_port.to_string()])
        .arg("--tls-ca-cert-file")
        .arg(&pki.ca.cert_file)
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let (line, _err) = wait_ready(&mut child, Duration::from_secs(20));
    assert!(ready_port(&line, "resp").is_some(), "{line}");
    let mut c = TlsClient::connect(tls_port, pki.client_config(None));
    assert_eq!(c.cmd(&["PING"]).unwrap(), "PONG");
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "tls-auth-clients"]).unwrap(),
        "tls-auth-clients\noptional"
    );
    assert_eq!(
        c.cmd(&["CONFIG", "GET", "tls-port"]).unwrap(),
        format!("tls-port\n{tls_port}")
    );
    let _ = c.cmd(&["SHUTDOWN"]);
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}");
    // `tls-auth-clients yes` (the default) without a CA file: refused.
    let out = Command::new(BIN)
        .args(["--port", "0", "--no-pin", "--maxmemory", "16mb"])
        .args(["--tls-port", &free_port().to_string()])
        .arg("--tls-cert-file")
        .arg(&pki.server.cert_file)
        .arg("--tls-key-file")
        .arg(&pki.server.key_file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("tls-auth-clients yes needs tls-ca-cert-file"),
        "{err}"
    );
    // A bad value is a configuration error.
    let out = Command::new(BIN)
        .args(["--tls-auth-clients", "maybe"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("tls-auth-clients"));
}

#[test]
fn tls_redis_cli() {
    let help = Command::new("redis-cli").arg("--help").output();
    let has_tls = match &help {
        Ok(o) => {
            String::from_utf8_lossy(&o.stdout).contains("--tls")
                || String::from_utf8_lossy(&o.stderr).contains("--tls")
        }
        Err(_) => false,
    };
    if !has_tls {
        println!(
            "SKIPPED: tls_redis_cli: {}",
            if help.is_err() {
                "redis-cli is not installed (Debian package redis-tools)"
            } else {
                "this redis-cli was built without TLS (no --tls in --help)"
            }
        );
        return;
    }
    let pki = Pki::new("redis-cli");
    let s = pki.start(AuthClients::Yes);
    let port = s.tls_port().unwrap().to_string();
    let cli = |cert: &Cred, args: &[&str]| {
        Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&pki.ca.cert_file)
            .arg("--cert")
            .arg(&cert.cert_file)
            .arg("--key")
            .arg(&cert.key_file)
            .args(["-h", "127.0.0.1", "-p", &port])
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&pki.client, &["ping"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{out:?}"
    );
    let out = cli(&pki.client, &["set", "k", "v"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "OK", "{out:?}");
    let out = cli(&pki.client, &["get", "k"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "v", "{out:?}");
    // A certificate from another CA is refused.
    let out = cli(&pki.other_client, &["ping"]);
    assert_ne!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{out:?}"
    );
}

#[test]
fn tls_port_needs_authentication_for_every_data_command() {
    let pki = Pki::new("auth");
    let s = pki.start_with(AuthClients::No, |c| {
        c.requirepass = Some("tls-Pw-9".into());
        c.memcached_port = None;
    });
    let mut t = TlsClient::connect(s.tls_port().unwrap(), pki.client_config(None));
    let mut refused = 0;
    for spec in server::commands::COMMANDS {
        if spec.flags.contains(&"noauth") {
            continue;
        }
        let n = spec.arity.unsigned_abs().max(1) as usize;
        let mut args = vec![spec.name.to_string()];
        args.extend((1..n).map(|i| format!("a{i}")));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let want = if spec.name == "exec" {
            "-EXECABORT Transaction discarded because of: NOAUTH Authentication required."
        } else {
            "-NOAUTH Authentication required."
        };
        assert_eq!(
            t.cmd(&args).unwrap(),
            want,
            "{} over TLS without AUTH",
            spec.name
        );
        refused += 1;
    }
    assert!(refused > 60);
    // Redis's pre-AUTH bounds hold on this port too.
    t.send(b"*11\r\n").unwrap();
    assert_eq!(
        t.read().unwrap(),
        "-ERR Protocol error: unauthenticated multibulk length"
    );
    let mut t = TlsClient::connect(s.tls_port().unwrap(), pki.client_config(None));
    assert_eq!(t.cmd(&["AUTH", "tls-Pw-9"]).unwrap(), "OK");
    assert_eq!(t.cmd(&["SET", "k", "v"]).unwrap(), "OK");
}

#[test]
fn tls_port_applies_protected_mode() {
    crate::security::in_private_netns(|| {
        let pki = Pki::new("protected");
        let s = pki.start_with(AuthClients::No, |c| {
            c.bind = vec!["0.0.0.0".into()];
            c.memcached_port = None;
        });
        let port = s.tls_port().unwrap();
        // From 192.0.2.1 (not loopback), no password: DENIED after the
        // handshake, then closed.
        let mut t = TlsClient::connect_to("192.0.2.1", port, pki.client_config(None));
        t.send(b"PING\r\n").unwrap();
        assert!(t.read().unwrap().starts_with("-DENIED "));
        assert!(t.line().is_err(), "closed after DENIED");
        // Loopback is served.
        assert_eq!(ping(port, pki.client_config(None)).unwrap(), "PONG");
    });
}
