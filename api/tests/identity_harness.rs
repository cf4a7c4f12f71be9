//! The real api in process for the generated interleavings of the identity
//! routes (`identity_interleavings`, `identity_concurrent`): one api for the
//! whole test run (`api::app::app` on `api::app::build_state`) on a fresh
//! PostgreSQL database (`TEST_DATABASE_ADMIN_URL`, migrated at start); its
//! queue is the embedded SQLite queue in a temporary `DATA_DIR` and no worker
//! runs, so the mailbox is the `send_auth_email` jobs queued there (the code
//! and `token_hash` exactly as the mail carries them). Requests go through
//! the poem test client; GitHub is a fake at the HTTP level. Time:
//! `AUTH_MAIL_INTERVAL_SECS=0` and [`age`] moves the identity tables'
//! timestamps back. Passwords are hashed at a test-only argon2 cost (8 KiB,
//! one pass) that no setting can reach.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, OnceLock,
    },
    time::Duration,
};

use poem::{
    endpoint::BoxEndpoint,
    http::{Method, StatusCode},
    Endpoint, EndpointExt, Request,
};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use serde_json::{json, Value};
use uuid::Uuid;

/// Addresses in `ADMIN_EMAILS` made ahead (cases past it use plain addresses only).
pub(crate) fn admin_slots() -> u64 {
    cases() as u64 * 8 + 4000
}

pub(crate) fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

pub(crate) fn seed() -> u64 {
    std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(43)
}

pub(crate) fn admin_address(n: u64) -> String {
    format!("boss{n}@admins.test")
}

// ---------------------------------------------------------------- the api

/// The api in process, shared by every case of the test run.
pub(crate) struct Env {
    /// Two worker threads: the two requests of a concurrent step run in
    /// parallel.
    pub(crate) rt: tokio::runtime::Runtime,
    app: BoxEndpoint<'static, poem::Response>,
    pub(crate) db: DatabaseConnection,
    queue: DatabaseConnection,
    pub(crate) next_case: AtomicU64,
    /// The test database and the administrative URL that drops it.
    pub(crate) name: String,
    pub(crate) admin_url: String,
}

pub(crate) fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("runtime");
        let admin_url = std::env::var("TEST_DATABASE_ADMIN_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string());
        let name = format!("t_prop_{}", Uuid::new_v4().simple());
        let (app, db, queue) = rt.block_on(start(&admin_url, &name));
        Env {
            rt,
            app,
            db,
            queue,
            next_case: AtomicU64::new(0),
            name,
            admin_url,
        }
    })
}

async fn start(
    admin_url: &str,
    name: &str,
) -> (
    BoxEndpoint<'static, poem::Response>,
    DatabaseConnection,
    DatabaseConnection,
) {
    let admin = Database::connect(admin_url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {admin_url}: {e}"));
    admin
        .execute_unprepared(&format!("CREATE DATABASE \"{name}\""))
        .await
        .expect("CREATE DATABASE");
    admin.close().await.ok();
    let mut url = url::Url::parse(admin_url).expect("TEST_DATABASE_ADMIN_URL is a URL");
    url.set_path(&format!("/{name}"));
    let data_dir: PathBuf = std::env::temp_dir().join(format!("prop-{name}"));
    let github = fake_github().await;
    std::fs::create_dir_all(&data_dir).expect("DATA_DIR");

    let admins = (0..admin_slots())
        .map(admin_address)
        .collect::<Vec<_>>()
        .join(",");
    let vars: HashMap<&str, String> = [
        ("DATABASE_URL", url.to_string()),
        ("DATA_DIR", data_dir.display().to_string()),
        ("MIGRATE_ON_START", "true".into()),
        ("APP_URL", "http://localhost:3000".into()),
        ("API_EXTERNAL_URL", "http://localhost:8080".into()),
        (
            "BACKEND_SERVICE_ROLE_KEY",
            "service-role-key-of-the-property-test-0123456789".into(),
        ),
        ("AUTH_PROVIDER", "builtin".into()),
        ("ADMIN_EMAILS", admins),
        ("AUTH_MAIL_INTERVAL_SECS", "0".into()),
        // A loaded machine (CI's two cores, the suite beside it) must not
        // turn a slow database call into a 503: any 5xx fails a case.
        ("DEPENDENCY_TIMEOUT_MS", "30000".into()),
        ("AUTH_RATE_LIMIT_PER_5MIN", "100000000".into()),
        ("AUTH_RATE_LIMIT_REFRESH_PER_5MIN", "100000000".into()),
        ("AUTH_CODE_FAILURES_PER_HOUR", "1000".into()),
        ("AUTH_CONFIRMATION_MAILS_PER_DAY", "1000".into()),
        ("EMAIL_FROM", "noreply@example.com".into()),
        ("OAUTH_GITHUB_CLIENT_ID", "Iv1.property-test".into()),
        (
            "OAUTH_GITHUB_CLIENT_SECRET",
            "property-test-github-secret-0123456789".into(),
        ),
        ("OAUTH_GITHUB_BASE_URL", github.to_string()),
        ("OAUTH_GITHUB_API_URL", github.to_string()),
    ]
    .into_iter()
    .collect();
    let source: HashMap<String, String> =
        vars.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    let mut settings = entity::Settings::from_source(&source).expect("settings");
    // A cost below every row HashCost::new accepts: test only.
    settings.auth_password_hash_cost = entity::identity::password::HashCost {
        memory_kib: 8,
        iterations: 1,
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    // Never cancelled: the api lives as long as the test process.
    let shutdown: &'static _ = Box::leak(Box::new(shutdown));
    let state = api::app::build_state(Arc::new(settings), shutdown)
        .await
        .expect("build_state");
    let db = state.db.clone();
    let queue = Database::connect(format!(
        "sqlite://{}?mode=ro",
        data_dir.join("queue.db").display()
    ))
    .await
    .expect("queue.db");
    (api::app::app(state).boxed(), db, queue)
}

/// One answer: status and JSON body (`Null` when empty or not JSON).
pub(crate) struct Answer {
    pub(crate) status: StatusCode,
    pub(crate) body: Value,
}

tokio::task_local! {
    /// The release of a concurrent step's side (`identity_concurrent`): its
    /// request waits for the other side's before it is sent.
    pub(crate) static RELEASE: Release;
}

/// Both sides of a concurrent step are released together: each side passes
/// once, right before its request is sent (or when it ends without one),
/// and goes on when the other side passed too; the `lag` side then waits
/// that long more (spinning on the scheduler, finer than tokio's timer).
#[derive(Clone)]
pub(crate) struct Release {
    pub(crate) together: Arc<tokio::sync::Barrier>,
    pub(crate) passed: Arc<AtomicBool>,
    pub(crate) lag: Duration,
}

impl Release {
    /// Passes (the first call only): whether this call passed.
    pub(crate) async fn pass(&self) -> bool {
        if self.passed.swap(true, Ordering::SeqCst) {
            return false;
        }
        // A side that panicked before passing does not hold the other forever.
        let _ = tokio::time::timeout(Duration::from_secs(30), self.together.wait()).await;
        if !self.lag.is_zero() {
            let until = std::time::Instant::now() + self.lag;
            while std::time::Instant::now() < until {
                tokio::task::yield_now().await;
            }
        }
        true
    }
}

/// Before a request that may touch an account is sent: within a concurrent
/// step, waits for the other side ([`Release`]).
async fn released() {
    if let Ok(r) = RELEASE.try_with(Release::clone) {
        r.pass().await;
    }
}

pub(crate) async fn call(
    method: Method,
    uri: &str,
    bearer: Option<&str>,
    body: Option<Value>,
) -> Answer {
    let mut b = Request::builder().method(method).uri_str(uri);
    if let Some(t) = bearer {
        b = b.header("authorization", format!("Bearer {t}"));
    }
    let req = match body {
        Some(v) => b
            .header("content-type", "application/json")
            .body(v.to_string()),
        None => b.finish(),
    };
    released().await;
    let resp = env().app.get_response(req).await;
    let status = resp.status();
    let text = resp.into_body().into_string().await.unwrap_or_default();
    assert!(!status.is_server_error(), "{uri} answered {status}: {text}");
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
    }
}

/// Opens a mailed link in process: `GET /auth/v1/verify?…`, a 303 whose
/// `Location` fragment carries the session (`#access_token=…`) or an error.
/// Answers 200 with the session's JSON when it signed in, else the status
/// the fragment's `error_code` stands for (403 for a used or expired link).
pub(crate) async fn open_link(url: &str) -> Answer {
    let path = &url[url.find("/auth/v1/").expect("a verify link")..];
    let req = Request::builder()
        .method(Method::GET)
        .uri_str(path)
        .finish();
    released().await;
    let resp = env().app.get_response(req).await;
    let status = resp.status();
    assert!(!status.is_server_error(), "{path} answered {status}");
    let location = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let fragment = location.split_once('#').map(|x| x.1).unwrap_or_default();
    let pairs: HashMap<String, String> = url::form_urlencoded::parse(fragment.as_bytes())
        .into_owned()
        .collect();
    match (pairs.get("access_token"), pairs.get("refresh_token")) {
        (Some(a), Some(r)) => Answer {
            status: StatusCode::OK,
            body: json!({"access_token": a, "refresh_token": r}),
        },
        _ if pairs.is_empty() && status == StatusCode::SEE_OTHER => Answer {
            // An email-change half (or another answer without a session).
            status: StatusCode::OK,
            body: Value::Null,
        },
        _ => Answer {
            status: StatusCode::FORBIDDEN,
            body: json!(pairs),
        },
    }
}

// ---------------------------------------------------------------- the mailbox

/// A mail as the worker would send it.
#[derive(Debug, Clone)]
pub(crate) struct Mail {
    pub(crate) kind: String,
    pub(crate) to: String,
    pub(crate) token: String,
    pub(crate) token_hash: String,
    /// The link (`{API_EXTERNAL_URL}/auth/v1/verify?token=…&type=…`).
    pub(crate) url: String,
}

/// The mails to `addrs` queued after the queue's row `last_rowid` (moved
/// past the rows read).
pub(crate) async fn mails_since(last_rowid: &mut i64, addrs: &[String; 2]) -> Vec<Mail> {
    let rows = env()
        .queue
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Sqlite,
            "SELECT rowid AS r, CAST(job AS TEXT) AS j FROM Jobs WHERE rowid > ? ORDER BY rowid",
            [(*last_rowid).into()],
        ))
        .await
        .expect("read the queue");
    let mut mails = Vec::new();
    for row in rows {
        *last_rowid = row.try_get::<i64>("", "r").expect("rowid");
        let job: Value =
            serde_json::from_str(&row.try_get::<String>("", "j").expect("job")).expect("JSON");
        if job["type"] != "send_auth_email" {
            continue;
        }
        let to = job["to"].as_str().unwrap_or_default().to_ascii_lowercase();
        if !addrs.contains(&to) {
            continue;
        }
        mails.push(Mail {
            kind: job["kind"].as_str().unwrap_or_default().to_string(),
            to,
            token: job["token"].as_str().unwrap_or_default().to_string(),
            token_hash: job["token_hash"].as_str().unwrap_or_default().to_string(),
            url: job["confirmation_url"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        });
    }
    mails
}

// ---------------------------------------------------------------- GitHub

/// A fake GitHub, at the HTTP level with its documented answers, that
/// needs no state: the authorization code is `{id}~{verified}~{email}`,
/// the token endpoint answers it as the access token, and `GET /user` and
/// `GET /user/emails` read the account from the bearer token.
struct FakeGithub;

impl wiremock::Respond for FakeGithub {
    fn respond(&self, req: &wiremock::Request) -> wiremock::ResponseTemplate {
        let ok = |v: Value| wiremock::ResponseTemplate::new(200).set_body_json(v);
        if req.url.path() == "/login/oauth/access_token" {
            let code = url::form_urlencoded::parse(&req.body)
                .find(|(k, _)| k == "code")
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default();
            return ok(
                json!({"access_token": code, "scope": "read:user,user:email", "token_type": "bearer"}),
            );
        }
        let token = req
            .headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split_whitespace().last())
            .unwrap_or_default()
            .to_string();
        let mut parts = token.splitn(3, '~');
        let (id, verified, email) = (
            parts
                .next()
                .and_then(|i| i.parse::<u64>().ok())
                .unwrap_or(0),
            parts.next() == Some("true"),
            parts.next().unwrap_or_default().to_string(),
        );
        match req.url.path() {
            "/user" => ok(json!({
                "login": format!("gh{id}"), "id": id, "node_id": format!("U_{id}"),
                "avatar_url": format!("https://avatars.githubusercontent.com/u/{id}?v=4"),
                "type": "User", "site_admin": false, "name": null, "email": null
            })),
            "/user/emails" => ok(json!([
                {"email": email, "verified": verified, "primary": true, "visibility": "public"}
            ])),
            _ => wiremock::ResponseTemplate::new(404),
        }
    }
}

/// Starts the fake GitHub for the whole test process; its base URL.
async fn fake_github() -> String {
    let server = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(FakeGithub)
        .mount(&server)
        .await;
    let uri = server.uri();
    // Lives as long as the test process, as the api does.
    std::mem::forget(server);
    uri
}

/// A GitHub sign-in of account `id` whose primary address is `email`
/// (`verified` or not): `/authorize`, then the callback with the code the
/// fake reads. Answers as [`open_link`]: 200 with the session when the
/// fragment carries one, else 403.
pub(crate) async fn github_sign_in(id: u64, email: &str, verified: bool) -> Answer {
    let req = Request::builder()
        .method(Method::GET)
        .uri_str("/auth/v1/authorize?provider=github")
        .finish();
    let resp = env().app.get_response(req).await;
    assert_eq!(resp.status(), StatusCode::FOUND, "authorize");
    let to = resp
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let state = url::Url::parse(&to)
        .expect("the provider's URL")
        .query_pairs()
        .find(|(k, _)| k == "state")
        .map(|(_, v)| v.into_owned())
        .expect("a state");
    let code = format!("{id}~{verified}~{email}");
    let query: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("code", &code)
        .append_pair("state", &state)
        .finish();
    open_link(&format!("http://localhost:8080/auth/v1/callback?{query}")).await
}

// ---------------------------------------------------------------- SQL

/// The rows `sql` answers on the api's database.
pub(crate) async fn rows(sql: &str, values: Vec<sea_orm::Value>) -> Vec<sea_orm::QueryResult> {
    env()
        .db
        .query_all_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            sql,
            values,
        ))
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Moves every timestamp column of the identity tables (`auth_*`, as
/// `information_schema` lists them, so a new column cannot be missed) back by
/// `secs`: the rows of the case's accounts in tables with a `user_id`, every
/// row of the others (per-address windows and slots: earlier cases are over).
pub(crate) async fn age(secs: u32, addrs: &[String; 2]) {
    static COLUMNS: OnceLock<Vec<(String, Vec<String>)>> = OnceLock::new();
    static WITH_USER: OnceLock<HashSet<String>> = OnceLock::new();
    if WITH_USER.get().is_none() {
        let with_user = rows(
            "SELECT table_name::text AS t FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name LIKE 'auth\\_%' AND column_name = 'user_id'",
            vec![],
        )
        .await
        .iter()
        .map(|r| r.try_get::<String>("", "t").expect("table"))
        .collect();
        let _ = WITH_USER.set(with_user);
    }
    if COLUMNS.get().is_none() {
        let found = rows(
            "SELECT table_name::text AS t, column_name::text AS c FROM information_schema.columns \
             WHERE table_schema = 'public' AND table_name LIKE 'auth\\_%' \
             AND data_type LIKE 'timestamp%' ORDER BY table_name, column_name",
            vec![],
        )
        .await;
        let mut by_table: Vec<(String, Vec<String>)> = Vec::new();
        for r in found {
            let t: String = r.try_get("", "t").expect("table");
            let c: String = r.try_get("", "c").expect("column");
            match by_table.last_mut() {
                Some((last, cols)) if *last == t => cols.push(c),
                _ => by_table.push((t, vec![c])),
            }
        }
        assert!(
            by_table.iter().any(|(t, _)| t == "auth_accounts"),
            "no timestamp column found in the identity tables"
        );
        let _ = COLUMNS.set(by_table);
    }
    for (table, cols) in COLUMNS.get().expect("set") {
        let set = cols
            .iter()
            .map(|c| format!("\"{c}\" = \"{c}\" - interval '{secs} seconds'"))
            .collect::<Vec<_>>()
            .join(", ");
        let filter = if WITH_USER.get().expect("set").contains(table) {
            " WHERE user_id IN (SELECT user_id FROM auth_accounts WHERE email_norm IN ($1, $2))"
        } else {
            ""
        };
        let sql = format!("UPDATE \"{table}\" SET {set}{filter}");
        let values: Vec<sea_orm::Value> = if filter.is_empty() {
            vec![]
        } else {
            vec![addrs[0].clone().into(), addrs[1].clone().into()]
        };
        env()
            .db
            .execute_raw(Statement::from_sql_and_values(
                DbBackend::Postgres,
                &sql,
                values,
            ))
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }
}
