//! Generated interleavings of the identity routes: a stateful property
//! test of the invariant of
//! `docs/identity.md` ("The invariant"): when the owner of a mailbox first
//! proves it, the account is theirs alone.
//!
//! Two actors, the owner and an attacker, over two fresh addresses per case:
//! one plain, one listed in `ADMIN_EMAILS`. The steps (`Step`) are sign-up
//! with a password (each actor has two passwords of its own), `/otp` (code
//! sign-up / magic link), `/resend`, `/recover`, `/verify` with the k-th mail
//! the owner's mailbox holds (by link `token_hash` or by code, resolved when
//! the step runs), password sign-in, refresh, logout (every scope),
//! `PUT /user` password / data / email, and GitHub sign-ins through a fake
//! GitHub (the owner's account verified or not, the attacker's never
//! verified). The attacker never reads the mailbox.
//!
//! The real api runs in process (`api::app::app` on `api::app::build_state`)
//! on a fresh PostgreSQL database (`TEST_DATABASE_ADMIN_URL`, migrated at
//! start); its queue is the embedded SQLite queue in a temporary `DATA_DIR`
//! and no worker runs, so the mailbox is the `send_auth_email` jobs queued
//! there (the code and `token_hash` exactly as the mail carries them).
//! Time: `AUTH_MAIL_INTERVAL_SECS=0` (no interval window blocks a mail, so
//! the held-back sign-up is not exercised); the per-IP limits are raised out
//! of the way. Passwords are hashed at a test-only argon2 cost (8 KiB, one
//! pass) that no setting can reach (the field is set after the settings are
//! read).
//!
//! After every step, by SQL only (no sign-in probes): for every account whose
//! address has been proven, unless the owner legitimately adopted the
//! attacker's sole sign-up (GoTrue's rule, never for an `ADMIN_EMAILS`
//! address), the password hash verifies none of the attacker's passwords,
//! no session the attacker holds is alive on it, its `user_metadata` carries
//! nothing the attacker wrote, and it has no identity of the attacker's; no
//! account whose address nobody proved has a live attacker session; and no
//! account with a live attacker session or an attacker's password is admin.
//!
//! Cases: `PROPTEST_CASES` (default 128, ~20 s here), seed `PROPTEST_RNG_SEED` (default
//! fixed, 43). Failing cases shrink and are kept in
//! `api/proptest-regressions/identity_interleavings.txt`.
//! Run: `TEST_DATABASE_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo test -p api --test suite identity_interleavings`.

use std::{
    collections::{HashMap, HashSet},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, OnceLock,
    },
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use poem::{
    endpoint::BoxEndpoint,
    http::{Method, StatusCode},
    Endpoint, EndpointExt, Request,
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, FileFailurePersistence, RngSeed, TestRunner},
};
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest};
use sea_orm::{ConnectionTrait, Database, DatabaseConnection, DbBackend, Statement};
use serde_json::{json, Value};
use uuid::Uuid;

/// What the run exercised (printed at the end).
static STEPS: AtomicU64 = AtomicU64::new(0);
static PROOFS: AtomicU64 = AtomicU64::new(0);
static ADMIN_PROOFS: AtomicU64 = AtomicU64::new(0);
static ADOPTIONS: AtomicU64 = AtomicU64::new(0);
static VERIFIED: AtomicU64 = AtomicU64::new(0);
static ATTACKER_SESSIONS: AtomicU64 = AtomicU64::new(0);
static OAUTH_STEPS: AtomicU64 = AtomicU64::new(0);
static OAUTH_SESSIONS: AtomicU64 = AtomicU64::new(0);

/// Addresses in `ADMIN_EMAILS` made ahead (cases past it use plain addresses only).
fn admin_slots() -> u64 {
    cases() as u64 * 8 + 4000
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
}

fn seed() -> u64 {
    std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(43)
}

fn admin_address(n: u64) -> String {
    format!("boss{n}@admins.test")
}

// ---------------------------------------------------------------- the api

/// The api in process, shared by every case of the test run.
struct Env {
    rt: tokio::runtime::Runtime,
    app: BoxEndpoint<'static, poem::Response>,
    db: DatabaseConnection,
    queue: DatabaseConnection,
    next_case: AtomicU64,
    /// The test database and the administrative URL that drops it.
    name: String,
    admin_url: String,
}

fn env() -> &'static Env {
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
struct Answer {
    status: StatusCode,
    body: Value,
}

async fn call(method: Method, uri: &str, bearer: Option<&str>, body: Option<Value>) -> Answer {
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
async fn open_link(url: &str) -> Answer {
    let path = &url[url.find("/auth/v1/").expect("a verify link")..];
    let req = Request::builder()
        .method(Method::GET)
        .uri_str(path)
        .finish();
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

// ---------------------------------------------------------------- GitHub

/// The GitHub account id of `actor` in case `n` (unique per case: an
/// identity links by provider and id across the whole database).
fn github_id(actor: Actor, n: u64) -> u64 {
    1_000_000 + 2 * n + u64::from(actor == Actor::Attacker)
}

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
async fn github_sign_in(id: u64, email: &str, verified: bool) -> Answer {
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

// ---------------------------------------------------------------- steps

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Actor {
    Owner,
    Attacker,
}

#[derive(Debug, Clone)]
enum Step {
    /// `POST /signup` with the actor's `pw`-th password and data naming it.
    SignUp { actor: Actor, addr: u8, pw: u8 },
    /// `POST /otp` (`create_user: true`): a code sign-up or a magic link.
    Otp { actor: Actor, addr: u8 },
    /// `POST /resend {type: signup}`.
    Resend { actor: Actor, addr: u8 },
    /// `POST /recover`.
    Recover { actor: Actor, addr: u8 },
    /// The owner uses the k-th mail to `addr`: `via` 0 types its code, 1
    /// posts its `token_hash`, 2 opens its link (`GET /verify`).
    Verify { addr: u8, k: u8, via: u8 },
    /// `POST /token?grant_type=password` with the actor's `pw`-th password.
    SignIn { actor: Actor, addr: u8, pw: u8 },
    /// `POST /token?grant_type=refresh_token` with the s-th session's token.
    Refresh { actor: Actor, s: u8 },
    /// `POST /logout?scope=…` with the s-th session.
    Logout { actor: Actor, s: u8, scope: u8 },
    /// `PUT /user {password}` with a new password of the actor's.
    UpdatePassword { actor: Actor, s: u8, pw: u8 },
    /// `PUT /user {data}` naming the actor.
    UpdateData { actor: Actor, s: u8 },
    /// `PUT /user {email}`.
    UpdateEmail { actor: Actor, s: u8, addr: u8 },
    /// A GitHub sign-in (implicit flow) through the fake GitHub whose
    /// account (one per actor) reports the address as its primary one:
    /// verified for the owner when `verified`, never verified for the
    /// attacker (no provider verifies an address for someone who does not
    /// own it).
    OAuth {
        actor: Actor,
        addr: u8,
        verified: bool,
    },
    /// Time passes: every timestamp of the identity tables moves back by
    /// `secs` (61 s, an hour and a second: the mailed tokens' lifetime, 25 h:
    /// past the reauthentication age).
    Wait { secs: u32 },
}

fn actor() -> impl Strategy<Value = Actor> {
    prop_oneof![Just(Actor::Owner), Just(Actor::Attacker)]
}

fn step() -> BoxedStrategy<Step> {
    let addr = 0u8..2;
    prop_oneof![
        4 => (actor(), addr.clone(), 0u8..2).prop_map(|(actor, addr, pw)| Step::SignUp { actor, addr, pw }),
        2 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Otp { actor, addr }),
        2 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Resend { actor, addr }),
        1 => (actor(), addr.clone()).prop_map(|(actor, addr)| Step::Recover { actor, addr }),
        5 => (addr.clone(), any::<u8>(), 0u8..3).prop_map(|(addr, k, via)| Step::Verify { addr, k, via }),
        3 => (actor(), addr.clone(), 0u8..3).prop_map(|(actor, addr, pw)| Step::SignIn { actor, addr, pw }),
        1 => (actor(), any::<u8>()).prop_map(|(actor, s)| Step::Refresh { actor, s }),
        1 => (actor(), any::<u8>(), 0u8..3).prop_map(|(actor, s, scope)| Step::Logout { actor, s, scope }),
        2 => (actor(), any::<u8>(), 0u8..2).prop_map(|(actor, s, pw)| Step::UpdatePassword { actor, s, pw }),
        1 => (actor(), any::<u8>()).prop_map(|(actor, s)| Step::UpdateData { actor, s }),
        1 => (actor(), any::<u8>(), addr.clone()).prop_map(|(actor, s, addr)| Step::UpdateEmail { actor, s, addr }),
        2 => (actor(), addr, any::<bool>()).prop_map(|(actor, addr, v)| Step::OAuth {
            actor,
            addr,
            verified: v && actor == Actor::Owner,
        }),
        1 => prop_oneof![Just(61u32), Just(3601), Just(90_000)].prop_map(|secs| Step::Wait { secs }),
    ]
    .boxed()
}

/// The reference machine holds nothing: every step is resolved against the
/// real system when it runs (which mail, which session).
struct Steps;

impl ReferenceStateMachine for Steps {
    type State = ();
    type Transition = Step;

    fn init_state() -> BoxedStrategy<()> {
        Just(()).boxed()
    }

    fn transitions(_: &()) -> BoxedStrategy<Step> {
        step()
    }

    fn apply(state: (), _: &Step) -> Self::State {
        state
    }
}

// ---------------------------------------------------------------- one case

/// A mail as the worker would send it.
#[derive(Debug, Clone)]
struct Mail {
    kind: String,
    to: String,
    token: String,
    token_hash: String,
    /// The link (`{API_EXTERNAL_URL}/auth/v1/verify?token=…&type=…`).
    url: String,
}

#[derive(Debug, Clone)]
struct Session {
    access: String,
    refresh: String,
    id: Uuid,
}

/// A request that touched a pending account (sign-up, code sign-up, or the
/// unverified OAuth sign-in that made it).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Touch {
    SignUp(Actor, String),
    Otp(Actor),
    /// An unverified OAuth sign-in that made the pending account.
    OAuth(Actor),
}

struct Case {
    n: u64,
    /// `[plain, admin]` (the admin one plain too past [`admin_slots`]).
    addrs: [String; 2],
    admin: [bool; 2],
    /// The owner's mailbox: every mail queued to the case's addresses.
    mails: Vec<Mail>,
    /// The queue's rows read so far.
    last_rowid: i64,
    sessions: HashMap<Actor, Vec<Session>>,
    /// Every password the attacker chose.
    attacker_passwords: HashSet<String>,
    /// Requests that touched each address's pending account, in order.
    touches: [Vec<Touch>; 2],
    /// Accounts seen proven: whether the owner legitimately adopted the
    /// attacker's sole sign-up there (then the attacker is not checked on it).
    proven: HashMap<Uuid, bool>,
    /// The kind of the mail the last successful verify consumed, and to which address.
    last_consumed: Option<(String, usize)>,
    log: Vec<String>,
}

fn password(actor: Actor, n: u64, pw: u8) -> String {
    match actor {
        Actor::Owner => format!("owner-{n}-pass-{pw}"),
        Actor::Attacker => format!("attacker-{n}-pass-{pw}"),
    }
}

fn new_password(actor: Actor, n: u64, pw: u8) -> String {
    match actor {
        Actor::Owner => format!("owner-{n}-new-{pw}"),
        Actor::Attacker => format!("attacker-{n}-new-{pw}"),
    }
}

fn tag(actor: Actor) -> &'static str {
    match actor {
        Actor::Owner => "owner",
        Actor::Attacker => "attacker",
    }
}

fn verify_type(kind: &str) -> Option<&'static str> {
    match kind {
        "confirmation" => Some("signup"),
        "magiclink" => Some("magiclink"),
        "recovery" | "password_notice" => Some("recovery"),
        "email_change" => Some("email_change"),
        _ => None,
    }
}

fn session_of(body: &Value) -> Option<Session> {
    let access = body.get("access_token")?.as_str()?.to_string();
    let refresh = body.get("refresh_token")?.as_str()?.to_string();
    let payload = access.split('.').nth(1)?;
    let claims: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()?;
    let id = claims.get("session_id")?.as_str()?.parse().ok()?;
    Some(Session {
        access,
        refresh,
        id,
    })
}

async fn rows(sql: &str, values: Vec<sea_orm::Value>) -> Vec<sea_orm::QueryResult> {
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
async fn age(secs: u32, addrs: &[String; 2]) {
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

impl Case {
    fn new() -> Self {
        let n = env().next_case.fetch_add(1, Ordering::Relaxed);
        let run = std::process::id();
        let plain = format!("v{run}x{n}@example.com");
        let (admin_addr, admin) = if n < admin_slots() {
            (admin_address(n), true)
        } else {
            (format!("w{run}x{n}@example.com"), false)
        };
        Case {
            n,
            addrs: [plain, admin_addr],
            admin: [false, admin],
            mails: Vec::new(),
            last_rowid: 0,
            sessions: HashMap::new(),
            attacker_passwords: HashSet::new(),
            touches: [Vec::new(), Vec::new()],
            proven: HashMap::new(),
            last_consumed: None,
            log: Vec::new(),
        }
    }

    /// Reads the mails queued since the last read.
    async fn read_mailbox(&mut self) {
        let rows = env()
            .queue
            .query_all_raw(Statement::from_sql_and_values(
                DbBackend::Sqlite,
                "SELECT rowid AS r, CAST(job AS TEXT) AS j FROM Jobs WHERE rowid > ? ORDER BY rowid",
                [self.last_rowid.into()],
            ))
            .await
            .expect("read the queue");
        for row in rows {
            self.last_rowid = row.try_get::<i64>("", "r").expect("rowid");
            let job: Value =
                serde_json::from_str(&row.try_get::<String>("", "j").expect("job")).expect("JSON");
            if job["type"] != "send_auth_email" {
                continue;
            }
            let to = job["to"].as_str().unwrap_or_default().to_ascii_lowercase();
            if !self.addrs.contains(&to) {
                continue;
            }
            self.mails.push(Mail {
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
    }

    /// Whether `addr` has an account.
    async fn exists(&self, addr: usize) -> bool {
        !rows(
            "SELECT 1 FROM auth_accounts WHERE email_norm = $1",
            vec![self.addrs[addr].clone().into()],
        )
        .await
        .is_empty()
    }

    /// Whether `addr` has a confirmed account.
    async fn confirmed(&self, addr: usize) -> bool {
        !rows(
            "SELECT 1 FROM auth_accounts WHERE email_norm = $1 AND email_confirmed_at IS NOT NULL",
            vec![self.addrs[addr].clone().into()],
        )
        .await
        .is_empty()
    }

    fn session(&self, actor: Actor, s: u8) -> Option<Session> {
        let list = self.sessions.get(&actor)?;
        (!list.is_empty()).then(|| list[s as usize % list.len()].clone())
    }

    fn keep(&mut self, actor: Actor, a: &Answer) {
        if a.status == StatusCode::OK {
            if let Some(s) = session_of(&a.body) {
                if actor == Actor::Attacker {
                    ATTACKER_SESSIONS.fetch_add(1, Ordering::Relaxed);
                }
                self.sessions.entry(actor).or_default().push(s);
            }
        }
    }

    async fn run(&mut self, step: &Step) {
        let n = self.n;
        self.last_consumed = None;
        let note = match step.clone() {
            Step::SignUp { actor, addr, pw } => {
                let addr = addr as usize;
                let p = password(actor, n, pw);
                if actor == Actor::Attacker {
                    self.attacker_passwords.insert(p.clone());
                }
                if !self.confirmed(addr).await {
                    self.touches[addr].push(Touch::SignUp(actor, p.clone()));
                }
                let a = call(
                    Method::POST,
                    "/auth/v1/signup",
                    None,
                    Some(json!({"email": self.addrs[addr], "password": p, "data": {"by": tag(actor)}})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Otp { actor, addr } => {
                let addr = addr as usize;
                if !self.confirmed(addr).await {
                    self.touches[addr].push(Touch::Otp(actor));
                }
                let a = call(
                    Method::POST,
                    "/auth/v1/otp",
                    None,
                    Some(json!({"email": self.addrs[addr], "create_user": true, "data": {"by": tag(actor)}})),
                )
                .await;
                a.status
            }
            Step::Resend { actor, addr } => {
                // Both actors send the same request (one client address).
                let _ = actor;
                call(
                    Method::POST,
                    "/auth/v1/resend",
                    None,
                    Some(json!({"type": "signup", "email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::Recover { actor, addr } => {
                let _ = actor;
                call(
                    Method::POST,
                    "/auth/v1/recover",
                    None,
                    Some(json!({"email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::Verify { addr, k, via } => {
                let addr_i = addr as usize;
                let to = self.addrs[addr_i].clone();
                let mine: Vec<Mail> = self
                    .mails
                    .iter()
                    .filter(|m| m.to == to && verify_type(&m.kind).is_some())
                    .cloned()
                    .collect();
                if mine.is_empty() {
                    self.log.push(format!("{step:?} -> no mail"));
                    return;
                }
                let m = &mine[k as usize % mine.len()];
                let ty = verify_type(&m.kind).expect("filtered");
                let a = match via {
                    0 => {
                        let body = json!({"type": ty, "email": to, "token": m.token});
                        call(Method::POST, "/auth/v1/verify", None, Some(body)).await
                    }
                    1 => {
                        let body = json!({"type": ty, "token_hash": m.token_hash});
                        call(Method::POST, "/auth/v1/verify", None, Some(body)).await
                    }
                    _ => open_link(&m.url).await,
                };
                if a.status == StatusCode::OK {
                    VERIFIED.fetch_add(1, Ordering::Relaxed);
                    self.last_consumed = Some((m.kind.clone(), addr_i));
                }
                self.keep(Actor::Owner, &a);
                self.log
                    .push(format!("{step:?} -> mail {} ({})", m.kind, a.status));
                return;
            }
            Step::SignIn { actor, addr, pw } => {
                let p = if pw == 2 {
                    new_password(actor, n, 0)
                } else {
                    password(actor, n, pw)
                };
                let a = call(
                    Method::POST,
                    "/auth/v1/token?grant_type=password",
                    None,
                    Some(json!({"email": self.addrs[addr as usize], "password": p})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Refresh { actor, s } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let a = call(
                    Method::POST,
                    "/auth/v1/token?grant_type=refresh_token",
                    None,
                    Some(json!({"refresh_token": sess.refresh})),
                )
                .await;
                self.keep(actor, &a);
                a.status
            }
            Step::Logout { actor, s, scope } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let scope = ["global", "local", "others"][scope as usize % 3];
                call(
                    Method::POST,
                    &format!("/auth/v1/logout?scope={scope}"),
                    Some(&sess.access),
                    None,
                )
                .await
                .status
            }
            Step::UpdatePassword { actor, s, pw } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                let p = new_password(actor, n, pw);
                if actor == Actor::Attacker {
                    self.attacker_passwords.insert(p.clone());
                }
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"password": p})),
                )
                .await
                .status
            }
            Step::UpdateData { actor, s } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"data": {"by": tag(actor)}})),
                )
                .await
                .status
            }
            Step::UpdateEmail { actor, s, addr } => {
                let Some(sess) = self.session(actor, s) else {
                    self.log.push(format!("{step:?} -> no session"));
                    return;
                };
                call(
                    Method::PUT,
                    "/auth/v1/user",
                    Some(&sess.access),
                    Some(json!({"email": self.addrs[addr as usize]})),
                )
                .await
                .status
            }
            Step::OAuth {
                actor,
                addr,
                verified,
            } => {
                let addr = addr as usize;
                let existed = self.exists(addr).await;
                let a = github_sign_in(github_id(actor, n), &self.addrs[addr], verified).await;
                OAUTH_STEPS.fetch_add(1, Ordering::Relaxed);
                if a.status == StatusCode::OK {
                    OAUTH_SESSIONS.fetch_add(1, Ordering::Relaxed);
                }
                if !existed && !verified && self.exists(addr).await {
                    self.touches[addr].push(Touch::OAuth(actor));
                }
                self.keep(actor, &a);
                a.status
            }
            Step::Wait { secs } => {
                age(secs, &self.addrs).await;
                StatusCode::OK
            }
        };
        self.log.push(format!("{step:?} -> {note}"));
    }

    /// Whether the owner's consuming the last mail adopts the attacker's
    /// credentials at `addr` (GoTrue's rule, as docs/identity.md states it):
    /// every request that touched the pending account was the attacker's one
    /// sign-up (the same password each time), the consumed mail was a
    /// confirmation, and the address is not an admin one.
    fn adoption(&self, addr: usize) -> bool {
        let Some((kind, at)) = &self.last_consumed else {
            return false;
        };
        if self.admin[addr] || *at != addr || kind != "confirmation" {
            return false;
        }
        let t = &self.touches[addr];
        match t.first() {
            Some(first @ Touch::SignUp(Actor::Attacker, _)) => t.iter().all(|x| x == first),
            Some(Touch::Otp(Actor::Attacker)) | Some(Touch::OAuth(Actor::Attacker)) => t.len() == 1,
            _ => false,
        }
    }

    /// The invariant, by SQL.
    async fn check(&mut self) {
        self.read_mailbox().await;
        let attacker_sessions: Vec<Uuid> = self
            .sessions
            .get(&Actor::Attacker)
            .map(|l| l.iter().map(|s| s.id).collect())
            .unwrap_or_default();
        for addr in 0..2 {
            let accounts = rows(
                "SELECT a.user_id, a.password_hash, a.user_metadata::text AS meta, \
                 a.email_confirmed_at IS NOT NULL AS confirmed, \
                 COALESCE(r.role, '') AS role \
                 FROM auth_accounts a LEFT JOIN user_roles r ON r.user_id = a.user_id \
                 WHERE a.email_norm = $1",
                vec![self.addrs[addr].clone().into()],
            )
            .await;
            for acc in accounts {
                let uid: Uuid = acc.try_get("", "user_id").expect("user_id");
                let hash: Option<String> = acc.try_get("", "password_hash").expect("hash");
                let meta: String = acc.try_get("", "meta").unwrap_or_default();
                let confirmed: bool = acc.try_get("", "confirmed").expect("confirmed");
                let role: String = acc.try_get("", "role").unwrap_or_default();
                let attacker_password = hash.as_deref().and_then(|h| {
                    self.attacker_passwords
                        .iter()
                        .find(|p| entity::identity::password::verify(p, h))
                        .cloned()
                });
                let live: Vec<Uuid> = rows(
                    "SELECT id FROM auth_sessions WHERE user_id = $1",
                    vec![uid.into()],
                )
                .await
                .iter()
                .map(|r| r.try_get::<Uuid>("", "id").expect("id"))
                .filter(|id| attacker_sessions.contains(id))
                .collect();
                if role == "admin" {
                    assert!(
                        attacker_password.is_none() && live.is_empty(),
                        "an admin account ({}) holds an attacker's credential: password {attacker_password:?}, \
                         live attacker sessions {live:?}\nsteps:\n{}",
                        self.addrs[addr],
                        self.log.join("\n")
                    );
                }
                if !confirmed {
                    // No sign-in has a session on an address nobody proved.
                    assert!(
                        live.is_empty(),
                        "the attacker holds a session ({live:?}) on the unproven account of {}\nsteps:\n{}",
                        self.addrs[addr],
                        self.log.join("\n")
                    );
                    continue;
                }
                let adopted = match self.proven.get(&uid) {
                    Some(a) => *a,
                    None => {
                        let a = self.adoption(addr);
                        PROOFS.fetch_add(1, Ordering::Relaxed);
                        if self.admin[addr] {
                            ADMIN_PROOFS.fetch_add(1, Ordering::Relaxed);
                        }
                        if a {
                            ADOPTIONS.fetch_add(1, Ordering::Relaxed);
                        }
                        self.log.push(format!(
                            "first proof of {} (adopted: {a})",
                            self.addrs[addr]
                        ));
                        self.proven.insert(uid, a);
                        a
                    }
                };
                if adopted {
                    continue;
                }
                // The owner's own GitHub identity may stay; the attacker's not.
                let identities = rows(
                    "SELECT provider FROM auth_identities WHERE user_id = $1 AND provider <> 'email' \
                     AND provider_id <> $2",
                    vec![uid.into(), github_id(Actor::Owner, self.n).to_string().into()],
                )
                .await;
                let attacker_meta = meta.contains("attacker");
                assert!(
                    attacker_password.is_none()
                        && live.is_empty()
                        && !attacker_meta
                        && identities.is_empty(),
                    "the proven account of {} keeps an attacker's credential: password {attacker_password:?}, \
                     live attacker sessions {live:?}, metadata {meta}, attacker identities {}\nsteps:\n{}",
                    self.addrs[addr],
                    identities.len(),
                    self.log.join("\n")
                );
            }
        }
    }
}

// ---------------------------------------------------------------- the test

struct Interleavings;

impl StateMachineTest for Interleavings {
    type SystemUnderTest = Case;
    type Reference = Steps;

    fn init_test(_: &()) -> Case {
        Case::new()
    }

    fn teardown(case: Case, _: ()) {
        if std::env::var_os("IDENTITY_PROP_LOG").is_some() {
            eprintln!("case {}:\n{}\n", case.n, case.log.join("\n"));
        }
    }

    fn apply(mut case: Case, _: &(), step: Step) -> Case {
        STEPS.fetch_add(1, Ordering::Relaxed);
        env().rt.block_on(async {
            case.read_mailbox().await;
            case.run(&step).await;
            case.check().await;
        });
        case
    }
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        rng_seed: RngSeed::Fixed(seed()),
        max_shrink_iters: 2048,
        // Relative to the package (cargo runs tests in `api/`).
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(
            "proptest-regressions/identity_interleavings.txt",
        ))),
        ..ProptestConfig::default()
    }
}

/// The invariant over generated interleavings of both actors' steps. A
/// failing case is shrunk and kept in
/// `api/proptest-regressions/identity_interleavings.txt` (replayed first on
/// every later run).
#[test]
fn identity_interleavings() {
    let mut config = config();
    config.source_file = Some(file!());
    let mut runner = TestRunner::new(config.clone());
    let started = std::time::Instant::now();
    let result = runner.run(&Steps::sequential_strategy(1..24), |(init, steps, seen)| {
        Interleavings::test_sequential(config.clone(), init, steps, seen);
        Ok(())
    });
    eprintln!(
        "identity_interleavings: {} cases, seed {}, {:.1?}: {} steps, {} verifies accepted, \
         {} first proofs ({} of an ADMIN_EMAILS address, {} adopting the attacker's sole sign-up), \
         {} sessions obtained by the attacker, {} GitHub sign-ins ({} with a session)",
        cases(),
        seed(),
        started.elapsed(),
        STEPS.load(Ordering::Relaxed),
        VERIFIED.load(Ordering::Relaxed),
        PROOFS.load(Ordering::Relaxed),
        ADMIN_PROOFS.load(Ordering::Relaxed),
        ADOPTIONS.load(Ordering::Relaxed),
        ATTACKER_SESSIONS.load(Ordering::Relaxed),
        OAUTH_STEPS.load(Ordering::Relaxed),
        OAUTH_SESSIONS.load(Ordering::Relaxed),
    );
    let env = env();
    env.rt.block_on(async {
        if let Ok(admin) = Database::connect(&env.admin_url).await {
            let _ = admin
                .execute_unprepared(&format!(
                    "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
                    env.name
                ))
                .await;
        }
    });
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("prop-{}", env.name)));
    if let Err(e) = result {
        panic!("{e}");
    }
}
