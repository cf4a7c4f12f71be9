//! Load shedding against the real api: with `HTTP_MAX_IN_FLIGHT=2` and two
//! requests held open in their route (checkouts waiting on a payment
//! provider that accepts and never answers: the server works for them, so
//! they hold their slots), a third is answered 503 `overloaded` with
//! `Retry-After` at once; health and metrics still answer; the 503 carries
//! the CORS headers a page on an allowed origin needs to read it; once the
//! held requests end, requests are admitted again. (A body arriving slowly
//! holds no slot, JSON or upload: `slow_bodies.rs`, `availability.rs`.)

use std::{net::SocketAddr, time::Duration};

use serde_json::json;
use tests::{post_json, random_ip, EnvMap, Proc, Reply, Stack};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use uuid::Uuid;

const TOKEN: &str = "metrics-token-for-the-tests-0123456789abcdef";
const SECRET: &str = "shedding-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const ORIGIN: &str = "https://app.example.test";

/// Two slots, a payment provider at `provider` that may take a minute, the
/// metrics, sessions (for the checkouts) and CORS for [`ORIGIN`].
fn shed_env(stack: &Stack, provider: SocketAddr) -> EnvMap {
    stack
        .session_env(SECRET, SERVICE_KEY)
        .with("HTTP_MAX_IN_FLIGHT", "2")
        .with("PROVIDER_B_BASE_URL", format!("http://{provider}"))
        .with("PROVIDER_TIMEOUT_MS", "60000")
        .with("METRICS_TOKEN", TOKEN)
        .with("CORS_ALLOWED_ORIGINS", ORIGIN)
}

/// A payment provider that accepts connections and never answers; dropping
/// it closes them (the checkouts waiting on it then end).
struct SilentProvider {
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
}

impl SilentProvider {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        SilentProvider { addr, task }
    }
}

impl Drop for SilentProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `http_requests_in_flight` as `/metrics` shows it.
async fn in_flight(api: &Proc) -> Option<String> {
    let m = Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(TOKEN)).await;
    m.text
        .lines()
        .find(|l| l.starts_with("http_requests_in_flight "))
        .map(str::to_string)
}

/// Opens a connection and starts a checkout of a new user (the provider
/// never answers): it is then in its route, in flight, until the provider
/// goes away.
async fn held_checkout(api: &Proc) -> TcpStream {
    let user = Uuid::new_v4();
    let claims = tests::session_claims(&user.to_string(), Some("held@example.com"));
    let session = tests::hs256_token(SECRET.as_bytes(), &claims);
    let addr = tests::host_port(&api.base_url);
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let body = json!({"plan": "PRO"}).to_string();
    let head = format!(
        "POST /api/payments HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {session}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("request");
    s.flush().await.expect("flush");
    s
}

/// Holds two checkouts and waits until `/metrics` counts both in flight
/// (connections are not taken in the order they were opened: probing
/// before both are in could take the second slot).
async fn hold_two(api: &Proc) -> (TcpStream, TcpStream) {
    let (a, b) = (held_checkout(api).await, held_checkout(api).await);
    let both = tests::wait_until(Duration::from_secs(20), || async {
        in_flight(api).await.as_deref() == Some("http_requests_in_flight 2")
    })
    .await;
    assert!(
        both,
        "the held checkouts are not both in flight: {:?}; api stderr (tail):\n{}",
        in_flight(api).await,
        tests::tail(&api.stderr(), 2000)
    );
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_bound_requests_get_503_at_once_and_health_still_answers() {
    let stack = Stack::new().await;
    let provider = SilentProvider::start().await;
    let api = stack.api(&shed_env(&stack, provider.addr)).await;
    let waitlist = api.url("/api/waitlist");
    let body = |n: u32| json!({"email": format!("w{n}@example.com"), "name": "Wait"});

    // Under the bound: admitted.
    assert_eq!(
        post_json(&waitlist, &random_ip(), &body(1)).await.status,
        200
    );

    let (a, b) = hold_two(&api).await;
    let r = post_json(&waitlist, &random_ip(), &body(2)).await;
    r.assert_problem(503, Some("overloaded"), None);
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
    // A refused HTTP/1 client holds no connection of the overloaded process.
    assert_eq!(r.header("connection"), Some("close"), "{:?}", r.headers);

    // Refused at once, every time, while the two are held.
    for _ in 0..5 {
        let r = post_json(&waitlist, &random_ip(), &body(3)).await;
        r.assert_problem(503, Some("overloaded"), None);
        assert!(r.elapsed < Duration::from_secs(1), "{:?}", r.elapsed);
    }

    // Never shed: the health check and the metrics.
    // (Its own answer: this stack leaves some features unconfigured, which
    // health reports as 503 `degraded`, never as `overloaded`.)
    let health = tests::get(&api.url("/api/health")).await;
    assert_eq!(health.json["database"]["ok"], true, "{}", health.text);
    assert!(health.json.get("code").is_none(), "{}", health.text);
    let m = Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(TOKEN)).await;
    assert_eq!(m.status, 200, "{}", m.text);
    assert!(
        m.text
            .contains("http_requests_shed_total{reason=\"in_flight\"}"),
        "{}",
        m.text
    );
    assert!(m.text.contains("http_requests_in_flight 2"), "{}", m.text);

    // The held checkouts end (their provider goes away); their slots come
    // back.
    drop(provider);
    drop((a, b));
    let admitted = tests::wait_until(Duration::from_secs(10), || async {
        post_json(&waitlist, &random_ip(), &body(4)).await.status != 503
    })
    .await;
    assert!(admitted, "requests stay shed after the held ones ended");
}

/// A shed 503 carries the CORS headers for an allowed origin, so a page on
/// that origin can read the refusal and its `Retry-After` (without them the
/// browser hides the answer as a network error).
#[tokio::test(flavor = "multi_thread")]
async fn a_shed_503_carries_the_cors_headers_of_an_allowed_origin() {
    let stack = Stack::new().await;
    let provider = SilentProvider::start().await;
    let api = stack.api(&shed_env(&stack, provider.addr)).await;
    let (_a, _b) = hold_two(&api).await;
    let r = Reply::send(
        tests::client()
            .post(api.url("/api/waitlist"))
            .header("origin", ORIGIN)
            .header("x-forwarded-for", random_ip())
            .json(&json!({"email": "cors@example.com", "name": "Cors"})),
    )
    .await;
    r.assert_problem(503, Some("overloaded"), None);
    assert_eq!(
        r.header("access-control-allow-origin"),
        Some(ORIGIN),
        "{:?}",
        r.headers
    );
    let exposed = r
        .header("access-control-expose-headers")
        .unwrap_or_default()
        .to_ascii_lowercase();
    assert!(
        exposed.split(',').any(|h| h.trim() == "retry-after"),
        "Retry-After is not exposed to the page: {:?}",
        r.headers
    );
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);
}
