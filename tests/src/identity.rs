//! The identity harness: a running provider ([`Idp`]: api + worker + SMTP
//! sink, and a pool on its database) spoken to as `@supabase/auth-js` speaks
//! to `/auth/v1`, and the words the identity tests share: the link's
//! `token_hash` and the code read from a mail ([`token_hash`], [`code`],
//! [`wrong`]), the platform's error shape ([`assert_error`]), PKCE
//! ([`challenge`], [`auth_code`]) and the claims of an access token
//! ([`session_id`], [`access`]).

use base64::Engine as _;
use sha2::Digest as _;

use super::*;

/// The password of the owner of a mailbox in the identity tests.
pub const PASSWORD: &str = "correct horse battery";
/// The password an attacker chooses.
pub const ATTACKER_PASSWORD: &str = "attacker's own password";
/// `APP_URL`: the frontend's origin, where links land.
pub const APP: &str = "https://app.example.com";

/// An IPv6 address in a /64 of its own (the provider limits per /64).
pub fn random_v6() -> String {
    let b = uuid::Uuid::new_v4().into_bytes();
    format!(
        "2001:db8:{:x}:{:x}::{:x}",
        u16::from_be_bytes([b[0], b[1]]),
        u16::from_be_bytes([b[2], b[3]]),
        u16::from_be_bytes([b[4], b[5]]).max(1)
    )
}

/// Where an [`Idp`]'s requests come from (`X-Forwarded-For`).
enum ClientIp {
    /// One client: every request from this address (per-IP limits count).
    One(String),
    /// A fresh IPv4 address per request.
    FreshV4,
    /// A fresh IPv6 /64 per request.
    FreshV6,
}

/// A running provider: api + worker + SMTP sink, and (on PostgreSQL) a pool
/// on its database.
pub struct Idp {
    /// The api process.
    pub api: Proc,
    /// The SMTP sink the provider's mails go to.
    pub sink: SmtpSink,
    from: ClientIp,
    pool: Option<PgPool>,
    env: Option<EnvMap>,
    _worker: Option<Proc>,
    stack: Option<Stack>,
    _dir: Option<TempDir>,
}

impl Idp {
    /// The provider on PostgreSQL + Redis with `extra` settings over the
    /// defaults (`APP_URL`, retries after 1 s, the per-IP limits out of the
    /// way). Requests come from a fresh IPv4 address each.
    pub async fn start(extra: &[(&str, &str)]) -> Idp {
        let owned: Vec<(&str, String)> = extra.iter().map(|(k, v)| (*k, v.to_string())).collect();
        Idp::start_with(&owned).await
    }

    /// [`Idp::start`] with settings computed at run time (a fake's address).
    pub async fn start_with(extra: &[(&str, String)]) -> Idp {
        let stack = Stack::new().await;
        let sink = SmtpSink::start().await;
        let mut env = stack
            .env()
            .with("SMTP_URL", sink.url())
            .with("APP_URL", APP)
            .with("JOB_RETRY_BASE_SECS", "1")
            .with("AUTH_RATE_LIMIT_PER_5MIN", "100000")
            .with("AUTH_RATE_LIMIT_REFRESH_PER_5MIN", "100000");
        for (k, v) in extra {
            env = env.with(k, v.as_str());
        }
        let api = stack.api(&env).await;
        let worker = stack.worker(&env).await;
        let pool = stack.db.pool().await;
        Idp {
            api,
            sink,
            from: ClientIp::FreshV4,
            pool: Some(pool),
            env: Some(env),
            _worker: Some(worker),
            stack: Some(stack),
            _dir: None,
        }
    }

    /// The embedded default: no `DATABASE_URL`, no `REDIS_URL`,
    /// `api --with-worker` on SQLite. [`Idp::sql`] and the other reads of
    /// the database panic here.
    pub async fn embedded() -> Idp {
        let dir = TempDir::new();
        let sink = SmtpSink::start().await;
        let env = EnvMap::default()
            .with("PORT", "0")
            .with("PLANS_FILE", plans_file().display().to_string())
            .with("SMTP_URL", sink.url())
            .with("EMAIL_FROM", EMAIL_FROM)
            .with("APP_URL", APP);
        let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
        Idp {
            api,
            sink,
            from: ClientIp::FreshV4,
            pool: None,
            env: None,
            _worker: None,
            stack: None,
            _dir: Some(dir),
        }
    }

    /// Every request from one client address from now on (see [`Idp::ip`]).
    pub fn from_one_ip(mut self) -> Idp {
        self.from = ClientIp::One(random_ip());
        self
    }

    /// Every request from a fresh IPv6 /64 from now on.
    pub fn from_fresh_v6(mut self) -> Idp {
        self.from = ClientIp::FreshV6;
        self
    }

    /// The address the next request comes from.
    pub fn ip(&self) -> String {
        match &self.from {
            ClientIp::One(ip) => ip.clone(),
            ClientIp::FreshV4 => random_ip(),
            ClientIp::FreshV6 => random_v6(),
        }
    }

    /// Another api process on the same database, Redis prefix and keys.
    pub async fn another_api(&self) -> Proc {
        let stack = self.stack.as_ref().expect("a PostgreSQL stack");
        stack.api(self.env.as_ref().expect("settings")).await
    }

    /// The address of `/auth/v1{path}`.
    pub fn url(&self, path: &str) -> String {
        self.api.url(&format!("/auth/v1{path}"))
    }

    /// `POST /auth/v1{path}` as auth-js sends it (API version header, JSON
    /// with a charset).
    pub async fn post(&self, path: &str, body: &Value) -> Reply {
        Reply::send(
            no_redirects()
                .post(self.url(path))
                .header("x-forwarded-for", self.ip())
                .header("x-supabase-api-version", "2024-01-01")
                .header("content-type", "application/json;charset=UTF-8")
                .body(body.to_string()),
        )
        .await
    }

    /// `POST /auth/v1{path}` as older clients send it: no API version.
    pub async fn post_legacy(&self, path: &str, body: &Value) -> Reply {
        Reply::send(
            no_redirects()
                .post(self.url(path))
                .header("x-forwarded-for", self.ip())
                .json(body),
        )
        .await
    }

    /// `GET /auth/v1{path}` with `token` as the bearer.
    pub async fn get_auth(&self, path: &str, token: &str) -> Reply {
        Reply::send(
            no_redirects()
                .get(self.url(path))
                .header("x-supabase-api-version", "2024-01-01")
                .bearer_auth(token),
        )
        .await
    }

    /// `PUT /auth/v1{path}` with `token` as the bearer.
    pub async fn put_auth(&self, path: &str, token: &str, body: &Value) -> Reply {
        Reply::send(
            no_redirects()
                .put(self.url(path))
                .header("x-supabase-api-version", "2024-01-01")
                .bearer_auth(token)
                .json(body),
        )
        .await
    }

    /// `PUT /auth/v1/user` from the client address `ip`.
    pub async fn put_user(&self, token: &str, body: &Value, ip: &str) -> Reply {
        Reply::send(
            no_redirects()
                .put(self.url("/user"))
                .header("x-forwarded-for", ip)
                .header("x-supabase-api-version", "2024-01-01")
                .bearer_auth(token)
                .json(body),
        )
        .await
    }

    /// Waits for `n` mails; all of them as (to, [`Mail::searchable`] text).
    pub async fn mails(&self, n: usize) -> Vec<(String, String)> {
        self.sink
            .wait_for(n, Duration::from_secs(30))
            .await
            .iter()
            .map(|m| (m.envelope_to.join(","), m.searchable()))
            .collect()
    }

    /// Mail number `n` (1-based), waited for.
    pub async fn mail(&self, n: usize) -> (String, String) {
        self.mails(n).await.swap_remove(n - 1)
    }

    /// The text of the last of the first `n` mails that went to `to`.
    pub async fn last_mail_to(&self, n: usize, to: &str) -> String {
        self.mails(n)
            .await
            .into_iter()
            .rev()
            .find(|(t, _)| t.contains(to))
            .unwrap_or_else(|| panic!("a mail to {to} among the first {n}"))
            .1
    }

    /// `POST /signup` with an address and a password only.
    pub async fn signup(&self, email: &str, password: &str) -> Reply {
        self.post("/signup", &json!({"email": email, "password": password}))
            .await
    }

    /// `POST /signup` with the whole body auth-js sends: [`PASSWORD`],
    /// `data: {name: "Ann"}`, `gotrue_meta_security` and null PKCE fields.
    pub async fn signup_as_auth_js(&self, email: &str) -> Reply {
        self.post(
            "/signup",
            &json!({"email": email, "password": PASSWORD, "data": {"name": "Ann"},
                    "gotrue_meta_security": {}, "code_challenge": null,
                    "code_challenge_method": null}),
        )
        .await
    }

    /// `POST /signup` in the PKCE flow, challenged by `verifier`.
    pub async fn signup_pkce(&self, email: &str, password: &str, verifier: &str) -> Reply {
        self.post(
            "/signup",
            &json!({"email": email, "password": password,
                    "code_challenge": challenge(verifier), "code_challenge_method": "s256"}),
        )
        .await
    }

    /// `POST /token?grant_type=password`.
    pub async fn sign_in(&self, email: &str, password: &str) -> Reply {
        self.post(
            "/token?grant_type=password",
            &json!({"email": email, "password": password}),
        )
        .await
    }

    /// `POST /token?grant_type=refresh_token`.
    pub async fn refresh(&self, refresh_token: &Value) -> Reply {
        self.post(
            "/token?grant_type=refresh_token",
            &json!({"refresh_token": refresh_token}),
        )
        .await
    }

    /// `POST /token?grant_type=pkce`.
    pub async fn exchange(&self, auth_code: &str, verifier: &str) -> Reply {
        self.post(
            "/token?grant_type=pkce",
            &json!({"auth_code": auth_code, "code_verifier": verifier}),
        )
        .await
    }

    /// `POST /verify {type, token_hash}` with the link's hash in `text`.
    pub async fn verify_hash(&self, kind: &str, text: &str) -> Reply {
        self.post(
            "/verify",
            &json!({"type": kind, "token_hash": token_hash(text)}),
        )
        .await
    }

    /// `POST /verify {type, email, token}`: a typed code.
    pub async fn verify_code(&self, kind: &str, email: &str, code: &str) -> Reply {
        self.post(
            "/verify",
            &json!({"type": kind, "email": email, "token": code}),
        )
        .await
    }

    /// Follows a mail's link (`GET /verify`, back to `{APP}/welcome`): the
    /// `Location` of its 303.
    pub async fn follow_link(&self, text: &str, kind: &str) -> String {
        let r = Reply::send(no_redirects().get(format!(
            "{}?token={}&type={kind}&redirect_to=https%3A%2F%2Fapp.example.com%2Fwelcome",
            self.url("/verify"),
            token_hash(text)
        )))
        .await;
        assert_eq!(r.status, 303, "{}", r.text);
        r.header("location").unwrap().to_string()
    }

    /// Sign-up with [`PASSWORD`] + confirmation by the link in mail number
    /// `mail_no`: the session.
    pub async fn confirmed_user(&self, email: &str, mail_no: usize) -> Value {
        let r = self.signup(email, PASSWORD).await;
        assert_eq!(r.status, 200, "{}", r.text);
        let (_, text) = self.mail(mail_no).await;
        let r = self.verify_hash("signup", &text).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.json
    }

    /// A pool on the provider's database (PostgreSQL only).
    pub fn pool(&self) -> &PgPool {
        self.pool.as_ref().expect("a PostgreSQL stack")
    }

    /// Runs `statement` with `$1` bound to `bind`: the rows it changed. How a
    /// test moves a row past an interval on the database's clock instead of
    /// sleeping through it.
    pub async fn sql(&self, statement: &str, bind: &str) -> u64 {
        sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .bind(bind)
            .execute(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"))
            .rows_affected()
    }

    /// Runs `statement`, which takes no argument.
    pub async fn execute(&self, statement: &str) {
        sqlx::query(sqlx::AssertSqlSafe(statement.to_string()))
            .execute(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{statement}: {e}"));
    }

    /// The one number `query` (with `$1` bound to `bind`) selects.
    pub async fn count(&self, query: &str, bind: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(query.to_string()))
            .bind(bind)
            .fetch_one(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"))
    }

    /// The text `query` (with `$1` bound to `bind`) selects: `None` for no
    /// row or a NULL.
    pub async fn text(&self, query: &str, bind: &str) -> Option<String> {
        sqlx::query_scalar::<_, Option<String>>(sqlx::AssertSqlSafe(query.to_string()))
            .bind(bind)
            .fetch_optional(self.pool())
            .await
            .unwrap_or_else(|e| panic!("{query}: {e}"))
            .flatten()
    }

    /// The role of `user` (`user_roles.role`).
    pub async fn role_of(&self, user: &str) -> String {
        self.text("SELECT role FROM user_roles WHERE user_id::text = $1", user)
            .await
            .expect("role row")
    }

    /// How many `role.grant` audit rows name `user`.
    pub async fn grants_audited(&self, user: &str) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM audit_logs WHERE action = 'role.grant' AND target_id = $1",
            user,
        )
        .await
    }

    /// The confirmation tokens mailed to `address` whose code still counts.
    pub async fn live_codes(&self, address: &str) -> i64 {
        self.count(
            "SELECT COUNT(*) FROM auth_one_time_tokens WHERE relates_to = $1 AND failed_attempts < 5",
            address,
        )
        .await
    }
}

/// The `token=` of the link in a mail's text.
pub fn token_hash(text: &str) -> String {
    let i = text.find("token=").expect("a link with token= in the mail");
    let rest = &text[i + 6..];
    let end = rest.find(['&', '"', '\r', '\n', ' ']).unwrap_or(rest.len());
    rest[..end].to_string()
}

/// The 6-digit code in a mail's text (after `code: `).
pub fn code(text: &str) -> String {
    let i = text.find("code: ").expect("a code in the mail");
    text[i + 6..i + 12].to_string()
}

/// A 6-digit code that is not `c` (`k` in 1..1,000,000).
pub fn wrong(c: &str, k: u32) -> String {
    let n: u32 = c.parse().expect("6 digits");
    format!("{:06}", (n + k) % 1_000_000)
}

/// The platform's error shape for a request that named API version
/// 2024-01-01: `status`, `{code, message}`, the version echoed.
pub fn assert_error(r: &Reply, status: u16, code: &str) {
    assert_eq!(r.status, status, "{}", r.text);
    assert_eq!(r.json["code"], code, "{}", r.text);
    assert!(r.json["message"].is_string(), "{}", r.text);
    assert_eq!(r.header("x-supabase-api-version"), Some("2024-01-01"));
}

/// The PKCE S256 challenge of `verifier` (RFC 7636 §4.2).
pub fn challenge(verifier: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(sha2::Sha256::digest(verifier.as_bytes()))
}

/// The `code` of a PKCE redirect to `{APP}/welcome`.
pub fn auth_code(location: &str) -> String {
    assert!(
        location.starts_with("https://app.example.com/welcome?code="),
        "{location}"
    );
    location.split("code=").nth(1).unwrap().to_string()
}

/// A session's access token.
pub fn access(s: &Value) -> &str {
    s["access_token"].as_str().expect("access_token")
}

/// The `session_id` claim of a session's access token.
pub fn session_id(s: &Value) -> String {
    let payload = access(s).split('.').nth(1).expect("a JWT");
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .expect("base64url"),
    )
    .expect("JSON claims");
    claims["session_id"]
        .as_str()
        .expect("session_id")
        .to_string()
}
