//! S3 server: `s3s-fs`, a real S3 server checking SigV4 signatures ([`S3Server`]).

use super::*;

/// Where the `s3s-fs` binary is: on `PATH`, in `$CARGO_HOME/bin` or in
/// `~/.cargo/bin`.
fn s3s_fs_binary() -> Option<PathBuf> {
    let name = bin_name("s3s-fs");
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        dirs.push(PathBuf::from(home).join("bin"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        dirs.push(PathBuf::from(home).join(".cargo").join("bin"));
    }
    dirs.into_iter()
        .map(|d| d.join(&name))
        .find(|p| p.is_file())
}

/// A real S3 server checking SigV4 signatures: `s3s-fs` on
/// `127.0.0.1:<free port>` with random keys over its own scratch root.
/// A bucket is a directory `<root>/<bucket>` and an object `<key>` of it the
/// file `<root>/<bucket>/<key>`. Killed on drop.
pub struct S3Server {
    /// Listening address.
    pub addr: SocketAddr,
    /// Access key id the server accepts.
    pub access_key: String,
    /// Secret key the server accepts.
    pub secret_key: String,
    /// The bucket created at start.
    pub bucket: String,
    root: TempDir,
    child: Child,
    stderr: Arc<Mutex<String>>,
}

impl S3Server {
    /// Starts `s3s-fs` with one empty bucket and waits (15 s) until it
    /// accepts TCP connections. Panics when the binary is not installed.
    pub async fn start() -> Self {
        let binary =
            s3s_fs_binary().unwrap_or_else(|| panic!("s3s-fs not found: run bash .ci/test.sh"));
        let root = TempDir::new();
        let bucket = format!("bkt-{}", rand_hex(12));
        std::fs::create_dir_all(root.path().join(&bucket)).expect("create the bucket directory");
        let access_key = format!("AK{}", rand_hex(16).to_ascii_uppercase());
        let secret_key = format!("{}{}", rand_hex(20), rand_hex(20));
        let mut last_error = String::new();
        // A free port is picked by binding port 0; another process may take
        // it before s3s-fs binds, so retry a few times.
        for _ in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|l| l.local_addr())
                .expect("pick a free port")
                .port();
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let mut child = Command::new(&binary)
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--access-key", &access_key, "--secret-key", &secret_key])
                .arg(root.path())
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("spawn {}: {e}", binary.display()));
            let stderr = Arc::new(Mutex::new(String::new()));
            capture(child.stderr.take().expect("stderr"), stderr.clone());
            let deadline = Instant::now() + Duration::from_secs(15);
            loop {
                if TcpStream::connect(addr).await.is_ok() {
                    return S3Server {
                        addr,
                        access_key,
                        secret_key,
                        bucket,
                        root,
                        child,
                        stderr,
                    };
                }
                if let Ok(Some(status)) = child.try_wait() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    last_error = format!(
                        "s3s-fs exited ({status}); stderr:\n{}",
                        stderr.lock().expect("lock")
                    );
                    break;
                }
                if Instant::now() >= deadline {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = format!(
                        "s3s-fs did not accept connections on {addr} within 15 s; stderr:\n{}",
                        stderr.lock().expect("lock")
                    );
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("could not start s3s-fs: {last_error}");
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The scratch root (one directory per bucket).
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// `<root>/<bucket>`: the object `<key>` is the file `<bucket_dir>/<key>`.
    pub fn bucket_dir(&self) -> PathBuf {
        self.root.path().join(&self.bucket)
    }

    /// `env` with the object store set to this server's bucket:
    /// `STORAGE_URL=s3://<bucket>`, the keys, `AWS_REGION=us-east-1`,
    /// `AWS_ENDPOINT_URL` and `AWS_ALLOW_HTTP=true`.
    pub fn configure(&self, env: EnvMap) -> EnvMap {
        env.with("STORAGE_URL", format!("s3://{}", self.bucket))
            .with("AWS_ACCESS_KEY_ID", &self.access_key)
            .with("AWS_SECRET_ACCESS_KEY", &self.secret_key)
            .with("AWS_REGION", "us-east-1")
            .with("AWS_ENDPOINT_URL", self.endpoint())
            .with("AWS_ALLOW_HTTP", "true")
    }

    /// What the server printed on stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
