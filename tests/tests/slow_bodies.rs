//! Slow request bodies take no request slot: `HTTP_MAX_IN_FLIGHT` clients
//! trickling their bodies over HTTP/1.1, and one HTTP/2 (h2c) connection
//! opening many streams that trickle theirs, leave the api answering
//! everyone else; the slow ones are answered 408 `body_timeout` once they
//! fall below `HTTP_BODY_MIN_RATE` after its grace period, long before
//! `HTTP_BODY_TIMEOUT_SECS`. An HTTP/2 connection gets at most 16 streams at
//! once. Bodies in transit are bounded by `HTTP_BODY_BUDGET_BYTES`.

use std::time::{Duration, Instant};

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

/// An HTTP/1.1 `POST path` declaring [`DECLARED`] body bytes and sending
/// one every 500 ms. Returns what the server answered (empty: nothing) and
/// when, once it closes the connection.
async fn slow_h1(addr: String, path: &'static str) -> (String, Duration) {
    let started = Instant::now();
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {}\r\ncontent-length: {DECLARED}\r\n\r\n",
        random_ip()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let mut answer = Vec::new();
    loop {
        if s.write_all(b" ").await.is_err() && !answer.is_empty() {
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
/// bytes and sending one every 500 ms until the answer comes. Returns its
/// status and when it came.
async fn slow_h2(
    client: h2::client::SendRequest<Bytes>,
    addr: String,
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
    tokio::pin!(answer);
    loop {
        tokio::select! {
            r = &mut answer => {
                return r
                    .map(|r| (r.status().as_u16(), started.elapsed()))
                    .map_err(|e| e.to_string());
            }
            _ = tokio::time::sleep(Duration::from_millis(500)) => {
                let _ = body.send_data(Bytes::from_static(b" "), false);
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
    // path that does not exist.
    let h1: Vec<_> = (0..MAX_IN_FLIGHT)
        .map(|i| {
            let path = if i % 2 == 0 {
                "/api/waitlist"
            } else {
                "/api/no-such-route"
            };
            tokio::spawn(slow_h1(addr.clone(), path))
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
        .map(|_| tokio::spawn(slow_h2(client.clone(), addr.clone())))
        .collect();

    // Wait until the api holds every slow request: counted in flight (as
    // before, where a slow body held its slot) or as bodies in transit.
    let held = (MAX_IN_FLIGHT + 16) * DECLARED;
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

/// With `HTTP_BODY_BUDGET_BYTES` full of bodies arriving, another body is
/// refused 503 `overloaded` at once; once they are gone it is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn bodies_beyond_the_budget_in_transit_are_shed() {
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with("HTTP_BODY_BUDGET_BYTES", "65536")
        .with("METRICS_TOKEN", TOKEN);
    let api = stack.api(&env).await;
    let addr = tests::host_port(&api.base_url);

    // A body declaring 60,000 bytes holds them while it arrives.
    let mut s = TcpStream::connect(&addr).await.expect("connect");
    let head = format!(
        "POST /api/waitlist HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {}\r\ncontent-length: 60000\r\n\r\n{{",
        random_ip()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let holding = tests::wait_until(Duration::from_secs(10), || async {
        sample(&api, "http_request_body_bytes_in_transit").await == Some(60000.0)
    })
    .await;
    assert!(holding, "the arriving body is not counted");

    // 10,000 more do not fit.
    let big = json!({"email": "budget@example.com", "name": "x".repeat(9_950)});
    let r = post_json(&api.url("/api/waitlist"), &random_ip(), &big).await;
    r.assert_problem(503, Some("overloaded"), None);
    assert_eq!(r.header("retry-after"), Some("1"), "{:?}", r.headers);

    // The held body goes away: the budget is free again.
    drop(s);
    let admitted = tests::wait_until(Duration::from_secs(10), || async {
        let r = post_json(&api.url("/api/waitlist"), &random_ip(), &big).await;
        r.status != 503
    })
    .await;
    assert!(admitted, "bodies stay refused after the held one left");
}
