//! Environment of the binaries ([`EnvMap`]) and one test's world ([`Stack`]).

use super::*;

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
