//! A Redis server that speaks TLS only ([`TlsRedis`]), as a managed Redis
//! does: a private certificate authority and a server certificate made by the
//! test with rcgen, and the machine's `redis-server` (Debian's is built with
//! TLS) started on them.

use super::*;

/// A private CA and a certificate it signed for `localhost` and `127.0.0.1`,
/// as PEM files in a scratch directory.
pub struct TestPki {
    dir: TempDir,
}

impl TestPki {
    /// Makes the CA and the server certificate.
    pub fn new() -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let dir = TempDir::new();
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "black-box test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("CA key");
        let ca_cert = ca.self_signed(&ca_key).expect("self-sign the CA");
        let issuer = Issuer::new(ca, ca_key);

        let mut server = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".into()])
            .expect("server params");
        server
            .distinguished_name
            .push(DnType::CommonName, "localhost");
        let server_key = KeyPair::generate().expect("server key");
        let server_cert = server
            .signed_by(&server_key, &issuer)
            .expect("sign the server certificate");

        // A second CA that signed nothing here: a client trusting it only
        // must refuse the server.
        let mut other = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        other.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        other
            .distinguished_name
            .push(DnType::CommonName, "another CA");
        let other_key = KeyPair::generate().expect("CA key");
        let other_cert = other.self_signed(&other_key).expect("self-sign");

        let write = |name: &str, pem: String| {
            std::fs::write(dir.path().join(name), pem).expect("write PEM");
        };
        write("ca.pem", ca_cert.pem());
        write("server.pem", server_cert.pem());
        write("server.key", server_key.serialize_pem());
        write("other-ca.pem", other_cert.pem());
        TestPki { dir }
    }

    /// The CA certificate (PEM file): `REDIS_CA_FILE`.
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A CA certificate that did not sign the server's.
    pub fn other_ca_file(&self) -> PathBuf {
        self.dir.path().join("other-ca.pem")
    }

    fn server_cert(&self) -> PathBuf {
        self.dir.path().join("server.pem")
    }

    fn server_key(&self) -> PathBuf {
        self.dir.path().join("server.key")
    }
}

impl Default for TestPki {
    fn default() -> Self {
        Self::new()
    }
}

/// `redis-server` with TLS on a free port and no plain-text port; killed on
/// drop.
pub struct TlsRedis {
    /// Its certificates.
    pub pki: TestPki,
    /// The TLS port.
    pub port: u16,
    child: Child,
    dir: TempDir,
}

impl TlsRedis {
    /// Starts the server and waits (10 s) until it answers a TLS `PING`; on a
    /// free port picked here, so a port another test took meanwhile is
    /// retried (three times) on another one.
    pub async fn start() -> Self {
        let pki = TestPki::new();
        let dir = TempDir::new();
        let mut log = String::new();
        for _ in 0..3 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("a free port")
                .port();
            let mut child = spawn_server(&pki, dir.path(), port);
            let url = format!("rediss://127.0.0.1:{port}");
            let up = wait_until(Duration::from_secs(10), || async {
                tls_ping(&url, &pki.ca_file()).await.is_ok()
            })
            .await;
            if up {
                return TlsRedis {
                    pki,
                    port,
                    child,
                    dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
            log = std::fs::read_to_string(dir.path().join("redis.log")).unwrap_or_default();
        }
        panic!("redis-server with TLS did not answer; its log:\n{log}");
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The server's log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    async fn try_conn(&self) -> ::redis::RedisResult<::redis::aio::MultiplexedConnection> {
        tls_ping(&self.url(), &self.pki.ca_file()).await
    }

    /// A TLS connection of the test itself (trusting the test CA).
    pub async fn conn(&self) -> ::redis::aio::MultiplexedConnection {
        self.try_conn()
            .await
            .unwrap_or_else(|e| panic!("TLS connection to {}: {e}", self.url()))
    }

    /// Every key matching `pattern`.
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.conn().await;
        ::redis::cmd("KEYS")
            .arg(pattern)
            .query_async(&mut c)
            .await
            .expect("KEYS")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `redis-server` with TLS only on `port`, its files in `dir`.
fn spawn_server(pki: &TestPki, dir: &Path, port: u16) -> Child {
    Command::new("redis-server")
        .args(["--port", "0", "--bind", "127.0.0.1"])
        .args(["--tls-port", &port.to_string()])
        .arg("--tls-cert-file")
        .arg(pki.server_cert())
        .arg("--tls-key-file")
        .arg(pki.server_key())
        .arg("--tls-ca-cert-file")
        .arg(pki.ca_file())
        .args(["--tls-auth-clients", "no"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server (TLS): {e}"))
}

/// A TLS connection to `url` trusting only `ca_file`, checked with `PING`.
async fn tls_ping(
    url: &str,
    ca_file: &Path,
) -> ::redis::RedisResult<::redis::aio::MultiplexedConnection> {
    worker::redis_client::install_crypto_provider();
    let client = ::redis::Client::build_with_tls(
        url,
        ::redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(std::fs::read(ca_file).expect("CA file")),
        },
    )?;
    let mut c = tokio::time::timeout(
        Duration::from_secs(2),
        client.get_multiplexed_async_connection(),
    )
    .await
    .map_err(|_| std::io::Error::other("TLS connect timed out"))??;
    ::redis::cmd("PING").query_async::<String>(&mut c).await?;
    Ok(c)
}
