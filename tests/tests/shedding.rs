//! Load shedding against the real api: with `HTTP_MAX_IN_FLIGHT=2` and two
//! requests held open (their bodies arrive slowly), a third is answered 503
//! `overloaded` with `Retry-After` at once; health and metrics still answer;
//! once the held requests end, requests are admitted again.

use std::time::Duration;

use serde_json::json;
use tests::{post_json, random_ip, Reply, Stack};
use tokio::{io::AsyncWriteExt, net::TcpStream};

const TOKEN: &str = "metrics-token-for-the-tests-0123456789abcdef";

/// Opens a connection and sends a waitlist request's head and half its
/// body; the request is then in flight until the rest arrives.
async fn held_request(addr: &str) -> (TcpStream, Vec<u8>) {
    let body = br#"{"email":"held@example.com","name":"Held"}"#.to_vec();
    let mut s = TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST /api/waitlist HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         x-forwarded-for: {}\r\ncontent-length: {}\r\n\r\n",
        random_ip(),
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("head");
    let half = body.len() / 2;
    s.write_all(&body[..half]).await.expect("half the body");
    s.flush().await.expect("flush");
    (s, body[half..].to_vec())
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_bound_requests_get_503_at_once_and_health_still_answers() {
    let stack = Stack::new().await;
    let env = stack
        .env()
        .with("HTTP_MAX_IN_FLIGHT", "2")
        .with("METRICS_TOKEN", TOKEN);
    let api = stack.api(&env).await;
    let addr = api.base_url.trim_start_matches("http://").to_string();
    let waitlist = api.url("/api/waitlist");
    let body = |n: u32| json!({"email": format!("w{n}@example.com"), "name": "Wait"});

    // Under the bound: admitted.
    assert_eq!(
        post_json(&waitlist, &random_ip(), &body(1)).await.status,
        200
    );

    let (mut a, rest_a) = held_request(&addr).await;
    let (mut b, rest_b) = held_request(&addr).await;
    // Both held requests are in flight once a third is refused.
    let r = tests::poll_until(
        Duration::from_secs(10),
        || {
            let (ip, json) = (random_ip(), body(2));
            let url = waitlist.clone();
            async move { post_json(&url, &ip, &json).await }
        },
        |r| r.status == 503,
    )
    .await;
    if r.status != 503 {
        let m = Reply::send(tests::client().get(api.url("/metrics")).bearer_auth(TOKEN)).await;
        let in_flight = m
            .text
            .lines()
            .find(|l| l.starts_with("http_requests_in_flight"));
        panic!(
            "no request was shed with two held open; the last answered {} {}, {in_flight:?}",
            r.status, r.text
        );
    }
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

    // The held requests finish; their slots come back.
    a.write_all(&rest_a).await.expect("rest of a");
    b.write_all(&rest_b).await.expect("rest of b");
    let admitted = tests::wait_until(Duration::from_secs(10), || async {
        post_json(&waitlist, &random_ip(), &body(4)).await.status != 503
    })
    .await;
    assert!(admitted, "requests stay shed after the held ones ended");
    drop((a, b));
}
