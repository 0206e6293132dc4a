//! TLS for the Redis protocol, with Redis's settings.
//!
//! **What is encrypted.** With `tls-port` set (0 or absent = off, as in
//! Redis), every worker also listens on that port, on every `bind` address,
//! with its own `SO_REUSEPORT` socket exactly like the plain RESP
//! listeners, and speaks RESP (RESP2, RESP3, inline) inside TLS 1.3 or 1.2.
//! The plain `port`, the Unix socket and the memcached port stay plaintext
//! (Redis also keeps `port` open next to `tls-port` unless `port 0`); run
//! with `--port -1` to serve TLS only. Data at rest is not encrypted.
//!
//! **Settings**, fixed at start and shown (read-only) by CONFIG GET:
//! `tls-port`, `tls-cert-file` (the server's PEM certificate chain, leaf
//! first), `tls-key-file` (its PEM private key: PKCS#8, PKCS#1 or SEC1),
//! `tls-ca-cert-file` (PEM CA certificates that sign client
//! certificates), `tls-auth-clients` (`yes`, the default as in Redis: a
//! client must present a certificate that verifies against the CA file;
//! `optional`: one is asked for and verified if presented, a client without
//! one is served too; `no`: none is asked for). They are checked once, when
//! the server starts ([`server_config`]): a missing or unreadable file, a
//! file with no PEM certificate or key in it, a key that does not match the
//! certificate, or `tls-auth-clients yes|optional` without a CA file stops
//! the start with an error that names the setting and the file, as Redis
//! refuses to start. `tls-port` equal to `port` or `memcached-port` is
//! refused too (with `SO_REUSEPORT` both binds would succeed and share the
//! port's connections). Not implemented: `tls-ca-cert-dir`,
//! `tls-protocols`, `tls-ciphers`, `tls-dh-params-file`, client
//! certificate revocation lists, TLS for replication or cluster (there is
//! neither), reloading certificates while running.
//!
//! **What is verified.** The server presents the chain of `tls-cert-file`;
//! a client checks it against its own trust store (for the test
//! certificates below, the CA that signed them). A client certificate, when
//! asked for, is verified by rustls's `WebPkiClientVerifier` against the
//! CA certificates of `tls-ca-cert-file`: the chain must end at one of them,
//! every certificate must be within its validity period, and an extended
//! key usage, if present, must allow client authentication. A client's
//! name is not checked (Redis does not either); the certificate's subject
//! is not mapped to a user (no ACL here).
//!
//! **The handshake timeout.** A connection on the TLS port is admitted
//! (counted against `maxclients`) when it is accepted, then its handshake
//! runs in the connection's own task under [`TLS_HANDSHAKE_TIMEOUT_MS`]
//! (10 s), so a client that connects and says nothing, or stops half-way,
//! holds its slot for 10 s at most, not forever. The idle `timeout`
//! applies after the handshake, as on the plain port. A failed handshake
//! (plaintext or garbage on the TLS port, no client certificate when one is
//! required, a certificate from another CA, a timeout) is logged at info
//! level with the peer's address and closes that connection only. A client
//! over `maxclients` is closed at once without a handshake, as Redis does
//! (no error reply can be sent before the handshake).
//!
//! **Cost.** The handshake (an ECDHE key exchange and one signature with
//! the server's key, plus a verification of the client's chain) runs on the
//! worker thread that accepted the connection, between other connections'
//! requests (one `openssl s_time` client completes ~570 full TLS 1.3
//! handshakes a second against an ECDSA P-256 certificate on the 2-vCPU
//! VM, client included). After it, each read and write is one AES-GCM (or
//! ChaCha20-Poly1305) pass over the bytes: `redis-benchmark` over TLS
//! keeps 0.62-0.72 of the plain port's throughput there (redis-server
//! 0.58-0.61); docs/BENCHMARKS.md, "TLS cost".
//!
//! **Why rustls with ring.** rustls is TLS in safe Rust (no `unsafe` in
//! this module or the protocol state machine), so a malformed handshake
//! from the network meets bounds-checked parsing, and it has no
//! renegotiation, no TLS 1.0/1.1 and no weak cipher suites to switch off.
//! `ring` supplies the cryptography; it builds with only a C compiler,
//! whereas aws-lc-rs (rustls's default provider) needs cmake and a much
//! longer build, and OpenSSL would tie the binary to the system's library
//! version. The dependency tree has neither (`cargo tree -p server -e
//! normal | grep -i -E 'openssl|aws-lc'` prints nothing).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls::server::WebPkiClientVerifier;
use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;

use crate::conn::{serve, Protocol};
use crate::state::{ClientInfo, Shared};

/// Longest a TLS handshake may take from accept, ms.
pub const TLS_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// `tls-auth-clients`: whether a client certificate is asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AuthClients {
    /// Required, and verified against `tls-ca-cert-file` (Redis's default).
    #[default]
    Yes,
    /// Asked for; verified if presented; a client without one is served.
    Optional,
    /// Not asked for.
    No,
}

impl AuthClients {
    /// The setting's value as Redis writes it.
    pub fn name(self) -> &'static str {
        match self {
            AuthClients::Yes => "yes",
            AuthClients::Optional => "optional",
            AuthClients::No => "no",
        }
    }
}

impl std::str::FromStr for AuthClients {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "yes" => Ok(AuthClients::Yes),
            "optional" => Ok(AuthClients::Optional),
            "no" => Ok(AuthClients::No),
            _ => Err(format!(
                "invalid value {s:?} for tls-auth-clients (yes, optional or no)"
            )),
        }
    }
}

/// The TLS settings, fixed at start (part of
/// [`ServerConfig`](crate::config::ServerConfig)).
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// `tls-port`: `None` = no TLS listener. The setting `tls-port 0`
    /// means off, as in Redis; `Some(0)` here (set in code, as the tests
    /// do) binds a port the system picks.
    pub port: Option<u16>,
    /// `tls-cert-file`.
    pub cert_file: Option<PathBuf>,
    /// `tls-key-file`.
    pub key_file: Option<PathBuf>,
    /// `tls-ca-cert-file`.
    pub ca_cert_file: Option<PathBuf>,
    /// `tls-auth-clients`.
    pub auth_clients: AuthClients,
    /// Longest handshake ([`TLS_HANDSHAKE_TIMEOUT_MS`]; not a setting,
    /// shorter in tests).
    pub handshake_timeout: Duration,
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            port: None,
            cert_file: None,
            key_file: None,
            ca_cert_file: None,
            auth_clients: AuthClients::Yes,
            handshake_timeout: Duration::from_millis(TLS_HANDSHAKE_TIMEOUT_MS),
        }
    }
}

fn path_setting(value: &str) -> Option<PathBuf> {
    (!value.is_empty()).then(|| PathBuf::from(value))
}

fn shown(p: &Option<PathBuf>) -> String {
    p.as_ref()
        .map_or(String::new(), |p| p.display().to_string())
}

impl TlsConfig {
    /// Apply one `tls-*` setting (config-file name, lower case).
    pub fn apply(&mut self, name: &str, value: &str) -> Result<(), String> {
        match name {
            "tls-port" => {
                let p: u16 = value
                    .parse()
                    .map_err(|_| format!("invalid tls-port {value:?} (0-65535; 0 = off)"))?;
                self.port = (p != 0).then_some(p);
            }
            "tls-cert-file" => self.cert_file = path_setting(value),
            "tls-key-file" => self.key_file = path_setting(value),
            "tls-ca-cert-file" => self.ca_cert_file = path_setting(value),
            "tls-auth-clients" => self.auth_clients = value.parse()?,
            _ => return Err(format!("unknown setting {name:?}")),
        }
        Ok(())
    }

    /// Apply the command line's `--tls-*` flags (after the config file).
    pub fn apply_flags(&mut self, f: &TlsFlags) -> Result<(), String> {
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        for (name, v) in [
            ("tls-port", f.tls_port.map(|p| p.to_string())),
            ("tls-cert-file", path(&f.tls_cert_file)),
            ("tls-key-file", path(&f.tls_key_file)),
            ("tls-ca-cert-file", path(&f.tls_ca_cert_file)),
            ("tls-auth-clients", f.tls_auth_clients.clone()),
        ] {
            if let Some(v) = v {
                self.apply(name, &v)?;
            }
        }
        Ok(())
    }

    /// `CONFIG GET` names and values (as Redis shows them: port 0 = off,
    /// an unset file is empty).
    pub fn config_get(&self) -> [(&'static str, String); 5] {
        [
            ("tls-port", self.port.unwrap_or(0).to_string()),
            ("tls-cert-file", shown(&self.cert_file)),
            ("tls-key-file", shown(&self.key_file)),
            ("tls-ca-cert-file", shown(&self.ca_cert_file)),
            ("tls-auth-clients", self.auth_clients.name().into()),
        ]
    }
}

/// The `--tls-*` flags (flattened into [`Cli`](crate::config::Cli)).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct TlsFlags {
    /// TLS port for RESP (0 or absent = no TLS).
    #[arg(long)]
    pub tls_port: Option<u16>,
    /// The server's certificate chain, PEM.
    #[arg(long)]
    pub tls_cert_file: Option<PathBuf>,
    /// The server's private key, PEM.
    #[arg(long)]
    pub tls_key_file: Option<PathBuf>,
    /// CA certificates that sign client certificates, PEM.
    #[arg(long)]
    pub tls_ca_cert_file: Option<PathBuf>,
    /// Client certificates: yes (required, the default), optional, no.
    #[arg(long)]
    pub tls_auth_clients: Option<String>,
}

fn read_certs(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let what = || format!("{setting} {}", path.display());
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", what()))?;
    let certs = CertificateDer::pem_slice_iter(&text)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: bad PEM: {e}", what()))?;
    if certs.is_empty() {
        return Err(format!(
            "{}: no PEM certificate (-----BEGIN CERTIFICATE-----) in it",
            what()
        ));
    }
    Ok(certs)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let what = || format!("tls-key-file {}", path.display());
    let text = std::fs::read(path).map_err(|e| format!("{}: {e}", what()))?;
    PrivateKeyDer::from_pem_slice(&text).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => format!(
            "{}: no PEM private key (PKCS#8, PKCS#1 or SEC1) in it",
            what()
        ),
        e => format!("{}: bad PEM: {e}", what()),
    })
}

fn required<'a>(setting: &str, p: &'a Option<PathBuf>) -> Result<&'a Path, String> {
    p.as_deref()
        .ok_or_else(|| format!("tls-port is set but {setting} is not"))
}

/// Build the rustls server configuration from the settings, checking
/// every file; `Err` says which setting and file is wrong.
pub fn server_config(c: &TlsConfig) -> Result<Arc<rustls::ServerConfig>, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs = read_certs("tls-cert-file", required("tls-cert-file", &c.cert_file)?)?;
    let key = read_key(required("tls-key-file", &c.key_file)?)?;
    let verifier = match (c.auth_clients, &c.ca_cert_file) {
        (AuthClients::No, _) => WebPkiClientVerifier::no_client_auth(),
        (mode, None) => {
            return Err(format!(
                "tls-auth-clients {} needs tls-ca-cert-file (the CA certificates that sign \
                 client certificates); set it, or set tls-auth-clients no",
                mode.name()
            ))
        }
        (mode, Some(ca)) => {
            let mut roots = RootCertStore::empty();
            for cert in read_certs("tls-ca-cert-file", ca)? {
                roots.add(cert).map_err(|e| {
                    format!(
                        "tls-ca-cert-file {}: not a CA certificate: {e}",
                        ca.display()
                    )
                })?;
            }
            let b = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone());
            let b = if mode == AuthClients::Optional {
                b.allow_unauthenticated()
            } else {
                b
            };
            b.build()
                .map_err(|e| format!("tls-ca-cert-file {}: {e}", ca.display()))?
        }
    };
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(|e| format!("TLS: {e}"))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(certs, key)
        .map_err(|e| {
            format!(
                "tls-cert-file {} / tls-key-file {}: {e}",
                shown(&c.cert_file),
                shown(&c.key_file)
            )
        })?;
    Ok(Arc::new(cfg))
}

/// What a worker needs to accept TLS connections (cheap to clone).
#[derive(Clone)]
pub struct TlsAccept {
    /// The server configuration, built once at start.
    pub acceptor: TlsAcceptor,
    /// Longest handshake.
    pub handshake_timeout: Duration,
}

/// One worker's TLS listeners (one per `bind` address).
pub struct TlsListeners {
    /// How to accept.
    pub accept: TlsAccept,
    /// The listening sockets.
    pub listeners: Vec<std::net::TcpListener>,
}

/// Check the TLS settings against the rest of `cfg` and build the
/// acceptor; `None` when `tls-port` is off (the files are then not read,
/// as in Redis).
pub fn setup(cfg: &crate::config::ServerConfig) -> Result<Option<TlsAccept>, String> {
    let Some(port) = cfg.tls.port else {
        return Ok(None);
    };
    if port != 0 {
        for (name, p) in [("port", cfg.port), ("memcached-port", cfg.memcached_port)] {
            if p == Some(port) {
                return Err(format!("tls-port {port} is also {name}"));
            }
        }
    }
    Ok(Some(TlsAccept {
        acceptor: TlsAcceptor::from(server_config(&cfg.tls)?),
        handshake_timeout: cfg.tls.handshake_timeout,
    }))
}

/// Run one admitted TLS connection: the handshake under the timeout, then
/// [`serve`] as RESP. A failed handshake is logged and closes the
/// connection.
pub async fn serve_tls(
    accept: TlsAccept,
    s: TcpStream,
    shared: Arc<Shared>,
    worker: usize,
    info: Arc<ClientInfo>,
    denied: bool,
    mut shutdown: watch::Receiver<bool>,
) {
    let handshake = tokio::time::timeout(accept.handshake_timeout, accept.acceptor.accept(s));
    let r = tokio::select! {
        r = handshake => r,
        _ = shutdown.wait_for(|v| *v) => return,
    };
    match r {
        Ok(Ok(mut stream)) if denied => {
            // Protected mode (see `auth`): the refusal can be sent only
            // once the channel exists.
            let _ = stream.write_all(crate::auth::DENIED.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        Ok(Ok(stream)) => serve(stream, None, Protocol::Resp, shared, worker, info, shutdown).await,
        Ok(Err(e)) => crate::log_limited!(
            crate::auth::TLS_FAIL_LOG,
            log::Level::Info,
            "TLS handshake with {} failed: {e}",
            info.addr
        ),
        Err(_) => crate::log_limited!(
            crate::auth::TLS_FAIL_LOG,
            log::Level::Info,
            "TLS handshake with {} timed out after {} ms",
            info.addr,
            accept.handshake_timeout.as_millis()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Cli, ServerConfig};
    use clap::Parser;

    #[test]
    fn settings_from_file_and_flags() {
        let mut c = ServerConfig::default();
        assert_eq!(c.tls.port, None);
        assert_eq!(c.tls.auth_clients, AuthClients::Yes);
        c.apply_file_text(
            "tls-port 6380\ntls-cert-file \"/etc/n/server.crt\"\ntls-key-file /etc/n/server.key\n\
             tls-ca-cert-file /etc/n/ca.crt\ntls-auth-clients optional\n",
        )
        .unwrap();
        assert_eq!(c.tls.port, Some(6380));
        assert_eq!(c.tls.cert_file, Some(PathBuf::from("/etc/n/server.crt")));
        assert_eq!(c.tls.auth_clients, AuthClients::Optional);
        c.apply("tls-port", "0").unwrap();
        assert_eq!(c.tls.port, None, "tls-port 0 = off, as in Redis");
        assert!(c.apply("tls-port", "-1").is_err());
        assert!(c.apply("tls-auth-clients", "maybe").is_err());
        assert!(c.apply("tls-protocols", "TLSv1.3").is_err());
        let cli = Cli::parse_from([
            "nibble",
            "--tls-port",
            "7000",
            "--tls-cert-file",
            "c.pem",
            "--tls-key-file",
            "k.pem",
            "--tls-auth-clients",
            "no",
        ]);
        let c = ServerConfig::from_cli(&cli).unwrap();
        assert_eq!(c.tls.port, Some(7000));
        assert_eq!(c.tls.key_file, Some(PathBuf::from("k.pem")));
        assert_eq!(c.tls.auth_clients, AuthClients::No);
        let shown: Vec<_> = c.tls.config_get().into_iter().collect();
        assert_eq!(shown[0], ("tls-port", "7000".to_string()));
        assert_eq!(shown[3], ("tls-ca-cert-file", String::new()));
        assert_eq!(shown[4], ("tls-auth-clients", "no".to_string()));
    }
}
