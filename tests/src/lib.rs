//! Harness of the black-box tests: every test starts the real `api` / `worker`
//! binaries against its own PostgreSQL database and its own Redis key space,
//! talks HTTP to them and reads what they did from PostgreSQL, Redis, an SMTP
//! sink or a fake email API.
//!
//! * [`Stack`]: one test's world — a fresh database ([`TestDb`]), a unique
//!   queue prefix ([`RedisNs`]) and a scratch directory ([`TempDir`]); all
//!   removed when dropped.
//! * [`Proc`]: a spawned binary (clean environment, captured output, killed on drop).
//! * [`SmtpSink`]: a real SMTP server inside the test process.
//! * [`TcpProxy`]: a switchable TCP forwarder to simulate outages.
//! * [`Reply`]: a fully read HTTP answer with problem-details assertions.
//!
//! The binaries are the ones `cargo build --workspace --bins` put next to the
//! test executable (`target/debug/`).

use std::{
    collections::BTreeMap,
    future::Future,
    io::{BufRead, BufReader, Read},
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use reqwest::{header::HeaderMap, StatusCode};
use sea_orm::sqlx::{self, postgres::PgPoolOptions, PgPool};
use serde_json::Value;
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader as TokioBufReader},
    net::{TcpListener, TcpStream},
    sync::watch,
    task::JoinHandle,
};

pub use reqwest;
pub use serde_json::json;

// ---------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------

/// A short random lowercase hex string (`len` ≤ 32).
pub fn rand_hex(len: usize) -> String {
    let s = uuid::Uuid::new_v4().simple().to_string();
    s[..len.min(32)].to_string()
}

/// Polls `f` every 100 ms until it returns true or `timeout` passes.
/// Returns whether it became true.
pub async fn wait_until<F, Fut>(timeout: Duration, mut f: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if f().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints a line on the real stderr, bypassing libtest's output capture, so
/// timings of heavy tests show in every run (not only with `--nocapture`).
pub fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr().lock(), "{line}");
}

/// The HTTP client of the tests: no proxy, 15 s overall timeout.
pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("reqwest client")
}

/// `target/<profile>/` holding the binaries (from the test executable's path,
/// `target/<profile>/deps/<test>-<hash>`; `CARGO_TARGET_DIR` is honoured).
pub fn bin_dir() -> PathBuf {
    if let Ok(exe) = std::env::current_exe() {
        if let Some(dir) = exe.parent().and_then(Path::parent) {
            if dir.join(bin_name("api")).exists() {
                return dir.to_path_buf();
            }
        }
    }
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("debug")
}

fn bin_name(name: &str) -> String {
    format!("{name}{}", std::env::consts::EXE_SUFFIX)
}

/// Path of one of the workspace binaries (`api`, `worker`, `migration`).
pub fn bin(name: &str) -> PathBuf {
    let p = bin_dir().join(bin_name(name));
    assert!(
        p.exists(),
        "{} not found: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}

/// Absolute path of the plan catalogue.
pub fn plans_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/plans.toml")
}

/// A scratch directory, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// Creates `<tmp>/bbt-<random>`.
    pub fn new() -> Self {
        let p = std::env::temp_dir().join(format!("bbt-{}", rand_hex(16)));
        std::fs::create_dir_all(&p).expect("create temp dir");
        TempDir(p)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Default for TempDir {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs `fut` to completion on a fresh runtime in a fresh thread (usable from
/// `Drop` inside an async test).
fn block_on_thread<F>(fut: F)
where
    F: Future<Output = ()> + Send + 'static,
{
    let _ = std::thread::spawn(move || {
        if let Ok(rt) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            rt.block_on(fut);
        }
    })
    .join();
}

// ---------------------------------------------------------------------------
// PostgreSQL
// ---------------------------------------------------------------------------

/// The administrative PostgreSQL URL (`TEST_DATABASE_ADMIN_URL`).
pub fn admin_database_url() -> String {
    std::env::var("TEST_DATABASE_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// A fresh PostgreSQL database `t_<random>`, dropped (`WITH (FORCE)`) on drop.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// URL of the database.
    pub url: String,
    admin_url: String,
}

impl TestDb {
    /// Creates the database.
    pub async fn create() -> Self {
        let admin_url = admin_database_url();
        let name = format!("t_{}", rand_hex(20));
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {admin_url}: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&admin)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        admin.close().await;
        let mut url = reqwest::Url::parse(&admin_url).expect("TEST_DATABASE_ADMIN_URL is a URL");
        url.set_path(&format!("/{name}"));
        TestDb {
            name,
            url: url.to_string(),
            admin_url,
        }
    }

    /// The database URL with host and port replaced by `addr` (a [`TcpProxy`]).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = reqwest::Url::parse(&self.url).expect("url");
        url.set_host(Some(&addr.ip().to_string())).expect("host");
        url.set_port(Some(addr.port())).expect("port");
        url.to_string()
    }

    /// A small pool on the database, for assertions.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.name))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        block_on_thread(async move {
            if let Ok(admin) = PgPoolOptions::new()
                .max_connections(1)
                .connect(&admin_url)
                .await
            {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&admin)
                .await;
                admin.close().await;
            }
        });
    }
}

// ---------------------------------------------------------------------------
// Redis
// ---------------------------------------------------------------------------

/// The Redis URL of the tests (`TEST_REDIS_URL`).
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A unique queue prefix `t<random>` on the test Redis; every `<prefix>:*`
/// key is deleted on drop.
pub struct RedisNs {
    /// Redis URL.
    pub url: String,
    /// The `QUEUE_PREFIX`.
    pub prefix: String,
    client: redis::Client,
}

impl RedisNs {
    /// A fresh namespace.
    pub fn new() -> Self {
        let url = redis_url();
        let client = redis::Client::open(url.as_str()).expect("TEST_REDIS_URL");
        RedisNs {
            url,
            prefix: format!("t{}", rand_hex(12)),
            client,
        }
    }

    /// `<prefix>:<suffix>`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.prefix)
    }

    /// The Redis URL with host and port replaced by `addr` (a [`TcpProxy`]).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = reqwest::Url::parse(&self.url).expect("url");
        url.set_host(Some(&addr.ip().to_string())).expect("host");
        url.set_port(Some(addr.port())).expect("port");
        url.to_string()
    }

    /// An async connection.
    pub async fn conn(&self) -> redis::aio::MultiplexedConnection {
        self.client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot reach Redis at {}: {e}", self.url))
    }

    /// Every key matching `<prefix>:<pattern>` (SCAN).
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.conn().await;
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(self.key(pattern))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
                .expect("SCAN");
            out.extend(keys);
            cursor = next;
            if cursor == 0 {
                return out;
            }
        }
    }

    /// Sum of `MEMORY USAGE` over every `<prefix>:*` key, and the key count.
    pub async fn memory(&self) -> (u64, usize) {
        let keys = self.keys("*").await;
        let mut c = self.conn().await;
        let mut total = 0u64;
        for chunk in keys.chunks(1000) {
            let mut pipe = redis::pipe();
            for k in chunk {
                pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
            }
            let sizes: Vec<Option<u64>> = pipe.query_async(&mut c).await.expect("MEMORY USAGE");
            total += sizes.into_iter().flatten().sum::<u64>();
        }
        (total, keys.len())
    }

    /// A Redis command's integer result on a key of the namespace, e.g.
    /// `count("LLEN", "email:active")`.
    pub async fn count(&self, cmd: &str, suffix: &str) -> u64 {
        let mut c = self.conn().await;
        redis::cmd(cmd)
            .arg(self.key(suffix))
            .query_async(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{cmd} {}: {e}", self.key(suffix)))
    }
}

impl Default for RedisNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RedisNs {
    fn drop(&mut self) {
        let Ok(mut c) = self.client.get_connection() else {
            return;
        };
        let pattern = format!("{}:*", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let Ok((next, keys)) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query::<(u64, Vec<String>)>(&mut c)
            else {
                return;
            };
            if !keys.is_empty() {
                let _ = redis::cmd("UNLINK").arg(&keys).query::<u64>(&mut c);
            }
            cursor = next;
            if cursor == 0 {
                return;
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Environment of the binaries
// ---------------------------------------------------------------------------

/// Environment variables passed to a spawned binary (on top of `PATH` only).
#[derive(Debug, Clone, Default)]
pub struct EnvMap(pub BTreeMap<String, String>);

impl EnvMap {
    /// Sets `k=v`.
    pub fn with(mut self, k: &str, v: impl Into<String>) -> Self {
        self.0.insert(k.to_string(), v.into());
        self
    }

    /// Removes `k`.
    pub fn without(mut self, k: &str) -> Self {
        self.0.remove(k);
        self
    }

    /// The value of `k`.
    pub fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }

    /// Dummy values for every readiness gate except contact's (auth, billing,
    /// payments, admin, AI all become ready).
    pub fn with_other_features_configured(self) -> Self {
        self.with("NEXT_PUBLIC_BACKEND_URL", "http://127.0.0.1:9")
            .with("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY", "pk_test_dummy")
            .with(
                "BACKEND_SERVICE_ROLE_KEY",
                "service-role-dummy-0123456789abcdef0123",
            )
            .with(
                "BACKEND_JWT_SECRET",
                "jwt-secret-dummy-0123456789abcdef0123456789",
            )
            .with("PROVIDER_B_CLIENT_ID", "client-dummy")
            .with("PROVIDER_B_SECRET_KEY", "secret-dummy")
            .with("OPENAI_API_KEY", "sk-dummy")
    }

    /// Switches auth, payments, admin and AI off by their toggles.
    pub fn with_other_features_off(self) -> Self {
        self.with("NEXT_PUBLIC_ENABLE_AUTH", "false")
            .with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false")
            .with("NEXT_PUBLIC_ENABLE_ADMIN", "false")
            .with("NEXT_PUBLIC_ENABLE_AI", "false")
    }
}

/// Sender address used by the tests.
pub const EMAIL_FROM: &str = "site@example.com";
/// Contact inbox used by the tests.
pub const CONTACT_EMAIL: &str = "inbox@example.com";

/// One test's world: its database, its Redis namespace, its scratch directory.
pub struct Stack {
    /// The PostgreSQL database.
    pub db: TestDb,
    /// The Redis namespace.
    pub redis: RedisNs,
    /// Working directory of the spawned binaries (`DATA_DIR` is `<dir>/data`).
    pub dir: TempDir,
}

impl Stack {
    /// A fresh database, prefix and directory.
    pub async fn new() -> Self {
        Stack {
            db: TestDb::create().await,
            redis: RedisNs::new(),
            dir: TempDir::new(),
        }
    }

    /// The production-like base environment: PostgreSQL + Redis of this test,
    /// port 0, JSON logs, `TRUST_PROXY=true`, a generous rate limit (tests of
    /// the limit remove `RATE_LIMIT_PUBLIC_PER_HOUR` to get the default 5),
    /// `EMAIL_FROM` set. No email transport and no other feature configured.
    pub fn env(&self) -> EnvMap {
        EnvMap::default()
            .with("HOST", "127.0.0.1")
            .with("PORT", "0")
            .with("DATABASE_URL", &self.db.url)
            .with("REDIS_URL", &self.redis.url)
            .with("QUEUE_PREFIX", &self.redis.prefix)
            .with(
                "DATA_DIR",
                self.dir.path().join("data").display().to_string(),
            )
            .with("PLANS_FILE", plans_file().display().to_string())
            .with("LOG_FORMAT", "json")
            .with("RUST_LOG", "info")
            .with("TRUST_PROXY", "true")
            .with("RATE_LIMIT_PUBLIC_PER_HOUR", "100000")
            .with("EMAIL_FROM", EMAIL_FROM)
    }

    /// Starts `api` (optionally `--with-worker`) and waits for its listening line.
    pub async fn api(&self, env: &EnvMap) -> Proc {
        Proc::api(env, &[], self.dir.path()).await
    }

    /// Starts `api --with-worker`.
    pub async fn api_with_worker(&self, env: &EnvMap) -> Proc {
        Proc::api(env, &["--with-worker"], self.dir.path()).await
    }

    /// Starts `worker` and waits until it logs that it started.
    pub async fn worker(&self, env: &EnvMap) -> Proc {
        let p = Proc::spawn("worker", &[], env, self.dir.path());
        p.wait_stderr("worker started", Duration::from_secs(30))
            .await;
        p
    }

    /// Runs `worker <args>` to completion and returns (status, stdout, stderr).
    pub async fn run_worker_command(
        &self,
        env: &EnvMap,
        args: &[&str],
    ) -> (ExitStatus, String, String) {
        let mut p = Proc::spawn("worker", args, env, self.dir.path());
        let status = p
            .wait_exit(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| {
                panic!(
                    "worker {args:?} did not finish in 30 s; stderr:\n{}",
                    p.stderr()
                )
            });
        // Let the reader threads drain the pipes.
        tokio::time::sleep(Duration::from_millis(200)).await;
        (status, p.stdout(), p.stderr())
    }
}

// ---------------------------------------------------------------------------
// Processes
// ---------------------------------------------------------------------------

/// A spawned binary with captured stdout/stderr; SIGKILLed on drop.
pub struct Proc {
    /// `api` or `worker`.
    pub name: String,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// `http://127.0.0.1:PORT` for an api.
    pub base_url: String,
}

fn capture<R: Read + Send + 'static>(r: R, buf: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(r);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => return,
                Ok(_) => {
                    let s = String::from_utf8_lossy(&line);
                    buf.lock().expect("capture lock").push_str(&s);
                }
            }
        }
    });
}

impl Proc {
    /// Spawns `target/debug/<name> <args>` with a clean environment (`PATH`
    /// plus `env`) in `cwd`.
    pub fn spawn(name: &str, args: &[&str], env: &EnvMap, cwd: &Path) -> Proc {
        let mut cmd = Command::new(bin(name));
        cmd.args(args)
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(&env.0)
            .current_dir(cwd)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        capture(child.stdout.take().expect("stdout"), stdout.clone());
        capture(child.stderr.take().expect("stderr"), stderr.clone());
        Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            base_url: String::new(),
        }
    }

    /// Spawns `api <args>` and waits (30 s) for `api listening on http://…` on stdout.
    pub async fn api(env: &EnvMap, args: &[&str], cwd: &Path) -> Proc {
        let mut p = Proc::spawn("api", args, env, cwd);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(url) = p.stdout().lines().find_map(|l| {
                l.trim()
                    .strip_prefix("api listening on ")
                    .map(str::to_string)
            }) {
                p.base_url = url.trim_end_matches('/').to_string();
                return p;
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                panic!(
                    "api exited ({status}) before listening; stderr:\n{}",
                    p.stderr()
                );
            }
            if Instant::now() >= deadline {
                panic!(
                    "api did not print its listening line within 30 s; stderr:\n{}",
                    p.stderr()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `base_url + path`.
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base_url)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().expect("lock").clone()
    }

    /// Everything printed on stderr so far (JSON log lines).
    pub fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").clone()
    }

    /// Waits until stderr contains `needle`; panics with stderr after `timeout`.
    pub async fn wait_stderr(&self, needle: &str, timeout: Duration) {
        let ok = wait_until(timeout, || async { self.stderr().contains(needle) }).await;
        assert!(
            ok,
            "{} did not log {needle:?} within {timeout:?}; stderr:\n{}",
            self.name,
            self.stderr()
        );
    }

    /// Sends SIGTERM.
    pub fn term(&self) {
        self.signal("TERM");
    }

    /// Sends a signal by name (`TERM`, `INT`, `KILL`, …) with `kill(1)`.
    pub fn signal(&self, name: &str) {
        let _ = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status();
    }

    /// Sends SIGKILL and reaps the process.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits up to `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------------------
// HTTP answers
// ---------------------------------------------------------------------------

/// A fully read HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body as text (lossy).
    pub text: String,
    /// Body as JSON, when it is JSON.
    pub json: Value,
    /// Time from sending to the full body.
    pub elapsed: Duration,
}

impl Reply {
    /// Sends `req` and reads the whole answer.
    pub async fn send(req: reqwest::RequestBuilder) -> Reply {
        let t = Instant::now();
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        Self::read(resp, t).await
    }

    /// Like [`Reply::send`] but a transport error (timeout, reset) is returned.
    pub async fn try_send(req: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let t = Instant::now();
        let resp = req.send().await?;
        Ok(Self::read(resp, t).await)
    }

    async fn read(resp: reqwest::Response, t: Instant) -> Reply {
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.unwrap_or_default();
        let text = String::from_utf8_lossy(&bytes).to_string();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Reply {
            status,
            headers,
            text,
            json,
            elapsed: t.elapsed(),
        }
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header parsed as an integer (panics with context when absent).
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("header {name} missing; headers: {:?}", self.headers));
        v.parse()
            .unwrap_or_else(|_| panic!("header {name} = {v:?} is not an integer"))
    }

    /// Checks the answer is a problem-details body with `status`, `code`
    /// (when given) and `field` (when given); returns the body. Every problem
    /// carries `type`, `title`, `status`, `detail`, `code`, `error` (= detail)
    /// and the response an `x-request-id`.
    pub fn assert_problem(&self, status: u16, code: Option<&str>, field: Option<&str>) -> &Value {
        if let Err(e) = self.check_problem(Some(status), code, field) {
            panic!("{e}");
        }
        &self.json
    }

    /// Non-panicking form of [`Reply::assert_problem`]; `status: None`
    /// accepts any 4xx.
    pub fn check_problem(
        &self,
        status: Option<u16>,
        code: Option<&str>,
        field: Option<&str>,
    ) -> Result<(), String> {
        let ctx = || format!("status {}, body {}", self.status, self.text);
        match status {
            Some(s) if self.status.as_u16() != s => {
                return Err(format!("expected status {s}; got {}", ctx()))
            }
            None if !self.status.is_client_error() => {
                return Err(format!("expected a 4xx; got {}", ctx()))
            }
            _ => {}
        }
        let ct = self.header("content-type").unwrap_or("");
        if !ct.starts_with("application/problem+json") {
            return Err(format!(
                "content-type {ct:?} is not application/problem+json; {}",
                ctx()
            ));
        }
        if self.header("x-request-id").is_none_or(str::is_empty) {
            return Err(format!("no x-request-id; {}", ctx()));
        }
        let b = &self.json;
        for k in ["type", "title", "detail", "code", "error"] {
            if !b[k].is_string() {
                return Err(format!(
                    "problem member {k:?} missing or not a string; {}",
                    ctx()
                ));
            }
        }
        if b["status"].as_u64() != Some(u64::from(self.status.as_u16())) {
            return Err(format!(
                "problem `status` differs from the HTTP status; {}",
                ctx()
            ));
        }
        if b["error"] != b["detail"] {
            return Err(format!("problem `error` differs from `detail`; {}", ctx()));
        }
        if let Some(c) = code {
            if b["code"] != c {
                return Err(format!("expected code {c:?}; {}", ctx()));
            }
        }
        if let Some(f) = field {
            if b["field"] != f {
                return Err(format!("expected field {f:?}; {}", ctx()));
            }
        }
        Ok(())
    }
}

/// `POST url` with a JSON body, as client IP `ip` (`X-Forwarded-For`).
pub async fn post_json(url: &str, ip: &str, body: &Value) -> Reply {
    Reply::send(client().post(url).header("x-forwarded-for", ip).json(body)).await
}

/// `GET url`.
pub async fn get(url: &str) -> Reply {
    Reply::send(client().get(url)).await
}

/// A random client IP in 10.0.0.0/8 for `X-Forwarded-For`.
pub fn random_ip() -> String {
    let b = uuid::Uuid::new_v4().into_bytes();
    format!("10.{}.{}.{}", b[0], b[1], b[2].max(1))
}

// ---------------------------------------------------------------------------
// SMTP sink
// ---------------------------------------------------------------------------

/// One message received by the [`SmtpSink`].
#[derive(Debug, Clone)]
pub struct Mail {
    /// `MAIL FROM` address.
    pub envelope_from: String,
    /// `RCPT TO` addresses.
    pub envelope_to: Vec<String>,
    /// The message as received (dot-unstuffed), headers and body.
    pub data: String,
}

impl Mail {
    fn split(&self) -> (&str, &str) {
        let d = self.data.as_str();
        match d.find("\r\n\r\n") {
            Some(i) => (&d[..i], &d[i + 4..]),
            None => match d.find("\n\n") {
                Some(i) => (&d[..i], &d[i + 2..]),
                None => (d, ""),
            },
        }
    }

    /// Header lines, unfolded, as (name, raw value).
    pub fn headers(&self) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = Vec::new();
        for line in self.split().0.lines() {
            if line.starts_with([' ', '\t']) {
                if let Some(last) = out.last_mut() {
                    last.1.push(' ');
                    last.1.push_str(line.trim());
                }
            } else if let Some((n, v)) = line.split_once(':') {
                out.push((n.trim().to_string(), v.trim().to_string()));
            }
        }
        out
    }

    /// The first header `name` (case-insensitive), RFC 2047 encoded words decoded.
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers()
            .into_iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| decode_words(&v))
    }

    /// Every header named `name`.
    pub fn header_all(&self, name: &str) -> Vec<String> {
        self.headers()
            .into_iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| decode_words(&v))
            .collect()
    }

    /// The body decoded from its `Content-Transfer-Encoding` (7bit, 8bit,
    /// quoted-printable, base64). Single-part messages only.
    pub fn body(&self) -> String {
        let raw = self.split().1;
        let cte = self
            .header("content-transfer-encoding")
            .unwrap_or_default()
            .to_ascii_lowercase();
        match cte.as_str() {
            "quoted-printable" => {
                String::from_utf8_lossy(&decode_qp(raw.as_bytes(), false)).to_string()
            }
            "base64" => String::from_utf8_lossy(&decode_b64(raw)).to_string(),
            _ => raw.to_string(),
        }
    }
}

fn decode_b64(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    let mut acc: u32 = 0;
    let mut bits = 0;
    for c in s.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => continue,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

fn decode_qp(s: &[u8], underscore_space: bool) -> Vec<u8> {
    let hex = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        match s[i] {
            b'=' if s.get(i + 1) == Some(&b'\r') && s.get(i + 2) == Some(&b'\n') => i += 3,
            b'=' if s.get(i + 1) == Some(&b'\n') => i += 2,
            b'=' => match (
                s.get(i + 1).and_then(|c| hex(*c)),
                s.get(i + 2).and_then(|c| hex(*c)),
            ) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 3;
                }
                _ => {
                    out.push(b'=');
                    i += 1;
                }
            },
            b'_' if underscore_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Decodes RFC 2047 encoded words (`=?utf-8?b?…?=`, `=?utf-8?q?…?=`).
fn decode_words(v: &str) -> String {
    let mut out = String::new();
    let mut rest = v;
    let mut last_was_word = false;
    while let Some(start) = rest.find("=?") {
        let before = &rest[..start];
        let after = &rest[start + 2..];
        let parts: Vec<&str> = after.splitn(3, '?').collect();
        if parts.len() == 3 {
            if let Some(end) = parts[2].find("?=") {
                let text = &parts[2][..end];
                let decoded = match parts[1].to_ascii_lowercase().as_str() {
                    "b" => decode_b64(text),
                    _ => decode_qp(text.as_bytes(), true),
                };
                if !(last_was_word && before.trim().is_empty()) {
                    out.push_str(before);
                }
                out.push_str(&String::from_utf8_lossy(&decoded));
                let consumed = start + 2 + parts[0].len() + 1 + parts[1].len() + 1 + end + 2;
                rest = &rest[consumed..];
                last_was_word = true;
                continue;
            }
        }
        out.push_str(&rest[..start + 2]);
        rest = &rest[start + 2..];
        last_was_word = false;
    }
    out.push_str(rest);
    out
}

#[derive(Default)]
struct SinkState {
    mails: Mutex<Vec<Mail>>,
    in_data: AtomicUsize,
    connections: AtomicUsize,
}

/// A real SMTP server on `127.0.0.1:<free port>` inside the test process:
/// EHLO/HELO, MAIL FROM, RCPT TO, DATA, RSET, NOOP, QUIT; any number of
/// concurrent connections and messages per connection. Every accepted
/// message is recorded. Stops on drop.
pub struct SmtpSink {
    /// Listening address.
    pub addr: SocketAddr,
    state: Arc<SinkState>,
    task: JoinHandle<()>,
}

impl SmtpSink {
    /// Starts a sink that accepts at once.
    pub async fn start() -> Self {
        Self::start_with_delay(Duration::ZERO).await
    }

    /// Starts a sink that waits `delay` after receiving a message before
    /// answering `250` (the message counts as received only then).
    pub async fn start_with_delay(delay: Duration) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind SMTP sink");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(SinkState::default());
        let st = state.clone();
        let task = tokio::spawn(async move {
            let mut sessions = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((sock, _)) = accepted else { continue };
                        st.connections.fetch_add(1, Ordering::SeqCst);
                        let st = st.clone();
                        sessions.spawn(async move {
                            let _ = smtp_session(sock, st, delay).await;
                        });
                    }
                    Some(_) = sessions.join_next(), if !sessions.is_empty() => {}
                }
            }
        });
        SmtpSink { addr, state, task }
    }

    /// `smtp://127.0.0.1:PORT` (plain SMTP) for `SMTP_URL`.
    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    /// Messages received so far.
    pub fn mails(&self) -> Vec<Mail> {
        self.state.mails.lock().expect("lock").clone()
    }

    /// How many messages were received.
    pub fn count(&self) -> usize {
        self.state.mails.lock().expect("lock").len()
    }

    /// Sessions currently inside DATA (message being received, not yet answered).
    pub fn in_data(&self) -> usize {
        self.state.in_data.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.state.connections.load(Ordering::SeqCst)
    }

    /// Waits until at least `n` messages arrived; returns them.
    pub async fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Mail> {
        let ok = wait_until(timeout, || async { self.count() >= n }).await;
        assert!(
            ok,
            "SMTP sink got {} of {n} expected messages within {timeout:?}",
            self.count()
        );
        self.mails()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn angle_addr(arg: &str) -> String {
    let a = arg.trim();
    let inner = match (a.find('<'), a.find('>')) {
        (Some(s), Some(e)) if e > s => &a[s + 1..e],
        _ => a.split_whitespace().next().unwrap_or(""),
    };
    inner.to_string()
}

async fn smtp_session(sock: TcpStream, st: Arc<SinkState>, delay: Duration) -> std::io::Result<()> {
    let (r, mut w) = sock.into_split();
    let mut r = TokioBufReader::new(r);
    w.write_all(b"220 sink.test ESMTP test sink\r\n").await?;
    let mut from = String::new();
    let mut to: Vec<String> = Vec::new();
    let mut line = Vec::new();
    loop {
        line.clear();
        if r.read_until(b'\n', &mut line).await? == 0 {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&line).trim_end().to_string();
        let upper = text.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") {
            b"250-sink.test\r\n250-8BITMIME\r\n250-SMTPUTF8\r\n250 SIZE 10485760\r\n"
        } else if upper.starts_with("HELO") {
            b"250 sink.test\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            from = angle_addr(&text[10..]);
            to.clear();
            b"250 2.1.0 OK\r\n"
        } else if upper.starts_with("RCPT TO:") {
            to.push(angle_addr(&text[8..]));
            b"250 2.1.5 OK\r\n"
        } else if upper == "DATA" {
            if to.is_empty() {
                w.write_all(b"503 5.5.1 RCPT first\r\n").await?;
                continue;
            }
            w.write_all(b"354 End data with <CR><LF>.<CR><LF>\r\n")
                .await?;
            st.in_data.fetch_add(1, Ordering::SeqCst);
            let mut data: Vec<u8> = Vec::new();
            let ended = loop {
                line.clear();
                if r.read_until(b'\n', &mut line).await? == 0 {
                    break false;
                }
                if line == b".\r\n" || line == b".\n" {
                    break true;
                }
                if line.starts_with(b"..") {
                    data.extend_from_slice(&line[1..]);
                } else {
                    data.extend_from_slice(&line);
                }
            };
            if !ended {
                st.in_data.fetch_sub(1, Ordering::SeqCst);
                return Ok(());
            }
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            st.mails.lock().expect("lock").push(Mail {
                envelope_from: std::mem::take(&mut from),
                envelope_to: std::mem::take(&mut to),
                data: String::from_utf8_lossy(&data).to_string(),
            });
            st.in_data.fetch_sub(1, Ordering::SeqCst);
            b"250 2.0.0 OK queued\r\n"
        } else if upper == "RSET" {
            from.clear();
            to.clear();
            b"250 2.0.0 OK\r\n"
        } else if upper.starts_with("NOOP") {
            b"250 2.0.0 OK\r\n"
        } else if upper == "QUIT" {
            w.write_all(b"221 2.0.0 Bye\r\n").await?;
            return Ok(());
        } else {
            b"502 5.5.2 Command not implemented\r\n"
        };
        w.write_all(reply).await?;
    }
}

// ---------------------------------------------------------------------------
// TCP proxy
// ---------------------------------------------------------------------------

/// What a [`TcpProxy`] does with connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward to the target.
    Forward,
    /// Close live connections; close new ones at once (like a refused connection).
    Refuse,
    /// Close live connections; accept new ones and never answer (a network
    /// black hole: only timeouts get the client out).
    Blackhole,
    /// Live connections stay open but nothing passes any more (a partition:
    /// requests in flight never get an answer); new ones hang as in
    /// `Blackhole`. Frozen connections are closed when the mode changes again.
    Freeze,
}

/// A TCP forwarder on `127.0.0.1:<free port>` to a target, switchable off and
/// on to simulate an outage of PostgreSQL or Redis. Stops on drop.
pub struct TcpProxy {
    /// Listening address.
    pub addr: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    task: JoinHandle<()>,
}

impl TcpProxy {
    /// Forwards to `target` (`host:port`).
    pub async fn start(target: &str) -> Self {
        let target = target.to_string();
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = listener.local_addr().expect("addr");
        let (tx, _) = watch::channel(ProxyMode::Forward);
        let mode = tx.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let mut rx = tx.subscribe();
                let now = *rx.borrow_and_update();
                match now {
                    ProxyMode::Refuse => drop(client),
                    ProxyMode::Blackhole | ProxyMode::Freeze => {
                        tokio::spawn(async move {
                            // Hold the socket, read and discard, until the mode changes.
                            let mut buf = [0u8; 4096];
                            loop {
                                tokio::select! {
                                    r = tokio::io::AsyncReadExt::read(&mut client, &mut buf) => {
                                        if matches!(r, Ok(0) | Err(_)) { return; }
                                    }
                                    _ = rx.changed() => return,
                                }
                            }
                        });
                    }
                    ProxyMode::Forward => {
                        let target = target.clone();
                        tokio::spawn(async move {
                            let Ok(mut upstream) = TcpStream::connect(&target).await else {
                                return;
                            };
                            let _ = client.set_nodelay(true);
                            let _ = upstream.set_nodelay(true);
                            tokio::select! {
                                _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => return,
                                _ = rx.wait_for(|m| *m != ProxyMode::Forward) => {}
                            }
                            if *rx.borrow() == ProxyMode::Freeze {
                                // Keep both sockets open, pass nothing.
                                let _ = rx.wait_for(|m| *m != ProxyMode::Freeze).await;
                            }
                            drop((client, upstream));
                        });
                    }
                }
            }
        });
        TcpProxy { addr, mode, task }
    }

    /// Switches the mode; leaving `Forward` closes every live connection
    /// (except for `Freeze`, which holds them silent).
    pub fn set(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// Back to forwarding.
    pub fn on(&self) {
        self.set(ProxyMode::Forward);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.mode.send_replace(ProxyMode::Refuse);
        self.task.abort();
    }
}

/// `host:port` of a `redis://` or `postgres://` URL.
pub fn host_port(url: &str) -> String {
    let u = reqwest::Url::parse(url).expect("url");
    let port = u.port().unwrap_or(match u.scheme() {
        "redis" => 6379,
        _ => 5432,
    });
    format!("{}:{port}", u.host_str().expect("host"))
}

// ---------------------------------------------------------------------------
// S3 server (s3s-fs)
// ---------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------
// Session tokens (HS256, as the auth platform signs them)
// ---------------------------------------------------------------------------

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    i64::try_from(secs).expect("seconds fit i64")
}

/// Valid session claims for `sub` (any string, so malformed ones can be built
/// too): `aud` = `authenticated`, valid for an hour, `email` when given.
pub fn session_claims(sub: &str, email: Option<&str>) -> Value {
    let t = unix_now();
    let mut c = serde_json::json!({
        "sub": sub,
        "aud": "authenticated",
        "role": "authenticated",
        "iat": t,
        "exp": t + 3600,
    });
    if let Some(e) = email {
        c["email"] = serde_json::json!(e);
    }
    c
}

/// `claims` signed HS256 with `secret`.
pub fn hs256_token(secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .expect("sign token")
}

/// `token` with one character in the middle of its signature changed.
pub fn tamper_signature(token: &str) -> String {
    let dot = token.rfind('.').expect("three parts");
    let mut bytes = token.as_bytes().to_vec();
    let i = dot + 1 + (token.len() - dot - 1) / 2;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ascii")
}

impl Stack {
    /// The base environment with every logged-in route ready: HS256
    /// `jwt_secret`, server-side writes armed with `service_role_key`, auth,
    /// payments (provider_b) and admin configured.
    pub fn session_env(&self, jwt_secret: &str, service_role_key: &str) -> EnvMap {
        self.env()
            .with("NEXT_PUBLIC_BACKEND_URL", "http://127.0.0.1:9")
            .with("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY", "pk_test_dummy")
            .with("BACKEND_SERVICE_ROLE_KEY", service_role_key)
            .with("BACKEND_JWT_SECRET", jwt_secret)
            .with("PAYMENT_PROVIDER", "provider_b")
            .with("PROVIDER_B_CLIENT_ID", "client-test")
            .with("PROVIDER_B_SECRET_KEY", "secret-test")
    }
}

/// The last `n` bytes (about) of `s`, for failure messages.
pub fn tail(s: &str, n: usize) -> &str {
    let start = s.len().saturating_sub(n);
    let start = (start..s.len())
        .find(|i| s.is_char_boundary(*i))
        .unwrap_or(s.len());
    &s[start..]
}
