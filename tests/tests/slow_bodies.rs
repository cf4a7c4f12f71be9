//! Slow request bodies take no request slot: `HTTP_MAX_IN_FLIGHT` clients
//! trickling their bodies over HTTP/1.1, and one HTTP/2 (h2c) connection
//! opening many streams that trickle theirs, leave the api answering
//! everyone else; the slow ones are answered 408 `body_timeout` once they
//! fall below `HTTP_BODY_MIN_RATE` after its grace period, long before
//! `HTTP_BODY_TIMEOUT_SECS`. An HTTP/2 connection gets at most 16 streams at
//! once. Bodies in transit are bounded by `HTTP_BODY_BUDGET_BYTES`, which
//! holds the bytes they have sent, not the lengths they declare.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use bytes::Bytes;
use serde_json::json;
use tests::{post_json, random_ip, Reply, Stack};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

const TOKEN: &str = "metrics-token-for-the-tests-0123456789abcdef";

/// Bytes each slow client declares and never finishes sending.
const DECLARED: usize = 64;

/// Bytes each slow client sends at once, before it trickles the rest.
const FIRST: usize = 2;

/// Streams the h2c connection opens (more than the server's cap of 16).
const H2_STREAMS: usize = 24;

/// The `/metrics` sample `name` (no labels) of `api`, if present.
async fn sample(api: &tests::Proc, name: &str) -> Option<f64> {
    let m = Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(TOKEN)).await;
    m.text.lines().find_map(|l| {
        l.strip_prefix(name)
            .and_then(|rest| rest.strip_prefix(' '))
            .and_then(|v| v.trim().parse().ok())
    })
}

/// An HTTP/1.1 `POST path` declaring [`DECLARED`] body bytes, sending
/// [`FIRST`] of them, then (once `trickle` is set) one every 500 ms.
/// Returns what the server answered (empty: nothing) and when, once it
/// closes the connection.
async fn slow_h1(addr: String, path: &'static str, trickle: Arc<AtomicBool>) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {}\r\ncontent-length: {DECLARED}\r\n\r\n",
        random_ip()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(&[b' '; FIRST]).await.expect("first bytes");
    let mut answer = Vec::new();
    loop {
        if trickle.load(Ordering::Relaxed) && s.write_all(b" ").await.is_err() && !answer.is_empty()
        {
            break;
        }
        let mut buf = [0u8; 2048];
        match tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    }
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

/// One stream of `client`: `POST /api/waitlist` declaring [`DECLARED`] body
/// bytes, sending [`FIRST`] of them, then (once `trickle` is set) one every
/// 500 ms until the answer comes. Returns its status and when it came.
async fn slow_h2(
    client: h2::client::SendRequest<Bytes>,
    addr: String,
    trickle: Arc<AtomicBool>,
) -> Result<(u16, Duration), String> {
    let started = Instant::now();
    // Waits while the connection has as many streams open as the server allows.
    let mut client = client.ready().await.map_err(|e| e.to_string())?;
    let req = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/api/waitlist"))
        .header("content-type", "application/json")
        .header("content-length", DECLARED.to_string())
        .header("x-forwarded-for", random_ip())
        .body(())
        .expect("request");
    let (answer, mut body) = client.send_request(req, false).map_err(|e| e.to_string())?;
    let _ = body.send_data(Bytes::from_static(&[b' '; FIRST]), false);
    tokio::pin!(answer);
    loop {
        tokio::select! {
            r = &mut answer => {
                return r
                    .map(|r| (r.status().as_u16(), started.elapsed()))
                    .map_err(|e| e.to_string());
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                if trickle.load(Ordering::Relaxed) {
                    let _ = body.send_data(Bytes::from_static(b" "), false);
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_bodies_over_http1_and_h2c_take_no_slot_and_get_408() {
    const MAX_IN_FLIGHT: usize = 4;
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with("HTTP_MAX_IN_FLIGHT", MAX_IN_FLIGHT.to_string())
        // The 408s must come from the minimum rate, not from this deadline;
        // the grace leaves time to see all slow requests held at once.
        .with("HTTP_BODY_TIMEOUT_SECS", "60")
        .with("HTTP_BODY_RATE_GRACE_SECS", "5")
        .with("METRICS_TOKEN", TOKEN);
    let api = stack.api(&env).await;
    let addr = tests::host_port(&api.base_url);

    // HTTP_MAX_IN_FLIGHT clients trickling their bodies, half of them to a
    // path that does not exist. They trickle once the normal requests are
    // done (until then each holds its first bytes).
    let trickle = Arc::new(AtomicBool::new(false));
    let h1: Vec<_> = (0..MAX_IN_FLIGHT)
        .map(|i| {
            let path = if i % 2 == 0 {
                "/api/waitlist"
            } else {
                "/api/no-such-route"
            };
            tokio::spawn(slow_h1(addr.clone(), path, trickle.clone()))
        })
        .collect();

    // One h2c connection opening many slow streams. A first request learns
    // the server's settings (its stream cap) before the slow ones open.
    let tcp = TcpStream::connect(&addr).await.expect("connect h2c");
    let (client, connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    tokio::spawn(connection);
    let health = http::Request::builder()
        .uri(format!("http://{addr}/api/health"))
        .body(())
        .expect("request");
    let (first, _) = client
        .clone()
        .ready()
        .await
        .expect("h2c ready")
        .send_request(health, true)
        .expect("h2c request");
    first.await.expect("an h2c answer");
    let max_streams = client.current_max_send_streams();
    let h2: Vec<_> = (0..H2_STREAMS)
        .map(|_| tokio::spawn(slow_h2(client.clone(), addr.clone(), trickle.clone())))
        .collect();

    // Wait until the api holds every slow request: counted in flight (as
    // before, where a slow body held its slot) or as bodies in transit
    // (each has sent its first bytes and no more yet).
    let held = (MAX_IN_FLIGHT + 16) * FIRST;
    let holding = tests::wait_until(Duration::from_secs(20), || async {
        sample(&api, "http_requests_in_flight").await >= Some(MAX_IN_FLIGHT as f64)
            || sample(&api, "http_request_body_bytes_in_transit").await >= Some(held as f64)
    })
    .await;
    assert!(holding, "the api never held the slow requests");

    // Everyone else is served.
    for n in 0..8 {
        let r = post_json(
            &api.url("/api/waitlist"),
            &random_ip(),
            &json!({"email": format!("normal{n}@example.com"), "name": "Normal"}),
        )
        .await;
        assert_eq!(
            r.status, 200,
            "a normal request beside slow bodies: {}",
            r.text
        );
    }
    let spec = tests::get(&api.url("/api/openapi.json")).await;
    assert_eq!(spec.status, 200);
    trickle.store(true, Ordering::Relaxed);

    // The slow ones get 408 for their rate, well before the 60 s deadline.
    for task in h1 {
        let (answer, after) = tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .expect("a slow HTTP/1.1 body was never answered")
            .expect("task");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout"), "{answer}");
        assert!(after < Duration::from_secs(20), "answered after {after:?}");
    }
    for task in h2 {
        let (status, after) = tokio::time::timeout(Duration::from_secs(40), task)
            .await
            .expect("a slow h2c stream was never answered")
            .expect("task")
            .expect("an h2c answer");
        assert_eq!(status, 408, "a slow h2c stream");
        assert!(after < Duration::from_secs(30), "answered after {after:?}");
    }
    assert_eq!(max_streams, 16, "concurrent streams per HTTP/2 connection");

    // Nothing is left held.
    let released = tests::wait_until(Duration::from_secs(10), || async {
        sample(&api, "http_request_body_bytes_in_transit").await == Some(0.0)
    })
    .await;
    assert!(released, "bytes in transit were not given back");
}

/// An HTTP/1.1 `POST path` declaring `declared` body bytes, of which the
/// `sent` first are written; the connection stays open.
async fn partial_body(addr: &str, path: &str, declared: usize, sent: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {}\r\ncontent-length: {declared}\r\n\r\n",
        random_ip()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    s.write_all(sent).await.expect("body");
    s
}

/// The answer the server sent on `s`: its head and its `content-length`
/// bytes of body, or what came before it closed the connection or 10 s
/// passed.
async fn answer_of(s: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let whole = |a: &[u8]| {
        let text = String::from_utf8_lossy(a).to_ascii_lowercase();
        let Some(head_end) = text.find("\r\n\r\n") else {
            return false;
        };
        let len = text[..head_end]
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        a.len() >= head_end + 4 + len
    };
    let _ = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        while let Ok(n) = s.read(&mut buf).await {
            if n == 0 {
                break;
            }
            answer.extend_from_slice(&buf[..n]);
            if whole(&answer) {
                break;
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// The body budget (`HTTP_BODY_BUDGET_BYTES`) holds the bytes a body has
/// sent while the server waits for the rest, not the length it declares:
/// clients declaring a whole budget's worth and trickling a few bytes (the
/// red team's attack on `/api/contact` and `/auth/v1/signup`) leave the api
/// serving every other POST. With the budget full of bytes actually
/// received, a body the server must wait for is refused 503 `overloaded` at
/// once, while a small one that arrives whole is still served; once the
/// bytes are gone the same body is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn the_body_budget_holds_bytes_received_not_declared() {
    const BUDGET: usize = 65536;
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with("HTTP_BODY_BUDGET_BYTES", BUDGET.to_string())
        // Only the budget is under test: the slow bodies keep their pace.
        .with("HTTP_BODY_RATE_GRACE_SECS", "120")
        .with("HTTP_BODY_TIMEOUT_SECS", "120")
        .with("METRICS_TOKEN", TOKEN);
    let api = stack.api(&env).await;
    let addr = tests::host_port(&api.base_url);
    let in_transit = |want: usize| {
        let api = &api;
        async move {
            let held = tests::wait_until(Duration::from_secs(10), || async {
                sample(api, "http_request_body_bytes_in_transit").await == Some(want as f64)
            })
            .await;
            let now = sample(api, "http_request_body_bytes_in_transit").await;
            assert!(held, "bytes in transit: {now:?}, expected {want}");
        }
    };

    // Eight bodies each declare the whole budget and send 100 bytes.
    let mut slow = Vec::new();
    for i in 0..8 {
        let path = ["/api/contact", "/auth/v1/signup"][i % 2];
        slow.push(partial_body(&addr, path, BUDGET, &[b' '; 100]).await);
    }
    in_transit(800).await;

    // Every other POST is served, on /api and on /auth/v1.
    for n in 0..4 {
        let r = post_json(
            &api.url("/api/waitlist"),
            &random_ip(),
            &json!({"email": format!("normal{n}@example.com"), "name": "Normal"}),
        )
        .await;
        assert_eq!(r.status, 200, "a POST beside declared bodies: {}", r.text);
    }
    let r = post_json(
        &api.url("/auth/v1/token?grant_type=password"),
        &random_ip(),
        &json!({"email": "nobody@example.com", "password": "not-the-password"}),
    )
    .await;
    assert_ne!(
        r.status, 503,
        "a sign-in beside declared bodies: {}",
        r.text
    );

    // One body has sent 64,000 bytes: the budget is nearly full of bytes
    // received (64,800 of 65,536).
    let filler = partial_body(&addr, "/api/contact", BUDGET, &vec![b' '; 64_000]).await;
    in_transit(64_800).await;

    // A small body is still served.
    let r = post_json(
        &api.url("/api/waitlist"),
        &random_ip(),
        &json!({"email": "small@example.com", "name": "Small"}),
    )
    .await;
    assert_eq!(
        r.status, 200,
        "a small POST beside a full budget: {}",
        r.text
    );

    // A 10,000-byte body whose second half the server must wait for does
    // not fit: refused at once.
    let mut split = format!("{:5000}", "").into_bytes();
    split.extend_from_slice(br#"{"email": "split@example.com", "name": "Split"}"#);
    split.resize(10_000, b' ');
    let mut waiting = partial_body(&addr, "/api/waitlist", split.len(), &split[..5000]).await;
    let answer = answer_of(&mut waiting).await;
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("overloaded"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("retry-after: 1"),
        "{answer}"
    );

    // The filler goes away: the same body, its halves apart, is accepted.
    drop(filler);
    in_transit(800).await;
    let mut two = partial_body(&addr, "/api/waitlist", split.len(), &split[..5000]).await;
    let mut buf = [0u8; 64];
    let early = tokio::time::timeout(Duration::from_millis(300), two.read(&mut buf)).await;
    assert!(early.is_err(), "answered before the second half: {early:?}");
    two.write_all(&split[5000..]).await.expect("second half");
    let answer = answer_of(&mut two).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    drop(slow);
}
