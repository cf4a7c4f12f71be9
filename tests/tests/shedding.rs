//! Load shedding against the real api: with `HTTP_MAX_IN_FLIGHT=2` and two
//! requests held open in their route (avatar uploads whose bytes arrive
//! slowly: an upload streams through its route, so it holds its slot), a
//! third is answered 503 `overloaded` with `Retry-After` at once; health and
//! metrics still answer; the 503 carries the CORS headers a page on an
//! allowed origin needs to read it; once the held requests end, requests are
//! admitted again. (A JSON body arriving slowly holds no slot: its route
//! runs once it is in memory, `slow_bodies.rs`.)

use std::time::Duration;

use serde_json::json;
use tests::{post_json, random_ip, EnvMap, Proc, Reply, Stack};
use tokio::{io::AsyncWriteExt, net::TcpStream};
use uuid::Uuid;

const TOKEN: &str = "metrics-token-for-the-tests-0123456789abcdef";
const SECRET: &str = "shedding-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const ORIGIN: &str = "https://app.example.test";

/// Two slots, uploads that may arrive as slowly as they like, the metrics,
/// sessions (for the upload grants) and CORS for [`ORIGIN`].
fn shed_env(stack: &Stack) -> EnvMap {
    stack
        .session_env(SECRET, SERVICE_KEY)
        .with("HTTP_MAX_IN_FLIGHT", "2")
        .with("HTTP_BODY_MIN_RATE", "0")
        .with("METRICS_TOKEN", TOKEN)
        .with("CORS_ALLOWED_ORIGINS", ORIGIN)
}

/// `http_requests_in_flight` as `/metrics` shows it.
async fn in_flight(api: &Proc) -> Option<String> {
    let m = Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(TOKEN)).await;
    m.text
        .lines()
        .find(|l| l.starts_with("http_requests_in_flight "))
        .map(str::to_string)
}

/// Opens a connection and sends an avatar upload's head and the first
/// bytes of a PNG (granted first); the upload is then in its route, in
/// flight, until the connection goes away.
async fn held_upload(api: &Proc) -> TcpStream {
    let user = Uuid::new_v4();
    let claims = tests::session_claims(&user.to_string(), Some("held@example.com"));
    let session = tests::hs256_token(SECRET.as_bytes(), &claims);
    let grant = Reply::send(
        tests::client()
            .post(api.url("/api/profile/avatar"))
            .bearer_auth(session)
            .json(&json!({"fileSize": 4096, "fileType": "image/png"})),
    )
    .await;
    assert_eq!(grant.status, 200, "grant: {}", grant.text);
    let token = grant.json["token"].as_str().expect("token");
    let addr = tests::host_port(&api.base_url);
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "PUT /storage/v1/object/upload/sign/avatars/{user}/avatar?token={token} HTTP/1.1\r\n\
         host: {addr}\r\ncontent-type: image/png\r\ncontent-length: 4096\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01")
        .await
        .expect("the first bytes");
    s.flush().await.expect("flush");
    s
}

/// Holds two uploads and waits until `/metrics` counts both in flight
/// (connections are not taken in the order they were opened: probing
/// before both are in could take the second slot).
async fn hold_two(api: &Proc) -> (TcpStream, TcpStream) {
    let (a, b) = (held_upload(api).await, held_upload(api).await);
    let both = tests::wait_until(Duration::from_secs(20), || async {
        in_flight(api).await.as_deref() == Some("http_requests_in_flight 2")
    })
    .await;
    assert!(
        both,
        "the held uploads are not both in flight: {:?}; api stderr (tail):\n{}",
        in_flight(api).await,
        tests::tail(&api.stderr(), 2000)
    );
    (a, b)
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_bound_requests_get_503_at_once_and_health_still_answers() {
    let stack = Stack::new().await;
    let api = stack.api(&shed_env(&stack)).await;
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

    // The held uploads end (their clients go away); their slots come back.
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
    let api = stack.api(&shed_env(&stack)).await;
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
