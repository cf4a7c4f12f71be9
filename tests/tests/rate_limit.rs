//! 5 requests per hour per client IP on contact and waitlist (GCRA in Redis,
//! shared by every api process), with the `X-RateLimit-*` headers and
//! `Retry-After` on 429.

use std::time::{SystemTime, UNIX_EPOCH};

use futures::future::join_all;
use sea_orm::sqlx;
use serde_json::{json, Value};
use tests::{post_json, random_ip, EnvMap, Reply, Stack};

/// A random 16-bit number (for IPv6 test addresses).
fn r16() -> u16 {
    let b = uuid::Uuid::new_v4().into_bytes();
    u16::from_be_bytes([b[0], b[1]])
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The default limit (5): the base env's generous limit removed.
fn limited_env(stack: &Stack) -> EnvMap {
    stack
        .env()
        .without("RATE_LIMIT_PUBLIC_PER_HOUR")
        .with("SMTP_URL", "smtp://127.0.0.1:9")
}

async fn waitlist_rows(stack: &Stack) -> i64 {
    let pool = stack.db.pool().await;
    let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM waitlist")
        .fetch_one(&pool)
        .await
        .expect("count");
    pool.close().await;
    n
}

fn check_allowed(r: &Reply, remaining: u64) {
    assert_eq!(r.status, 200, "body: {}", r.text);
    assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), remaining);
    let reset = r.header_u64("x-ratelimit-reset");
    let t = now();
    assert!(
        reset >= t && reset <= t + 3600 + 5,
        "X-RateLimit-Reset {reset} is not epoch seconds within the hour (now {t})"
    );
}

fn check_limited(r: &Reply) {
    r.assert_problem(429, Some("rate_limited"), None);
    assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 0);
    let reset = r.header_u64("x-ratelimit-reset");
    let retry = r.header_u64("retry-after");
    let t = now();
    assert!(
        reset >= t && reset <= t + 3600 + 5,
        "X-RateLimit-Reset {reset} (now {t})"
    );
    assert!((1..=3600).contains(&retry), "Retry-After {retry}");
    assert!(
        (reset as i64 - (t + retry) as i64).abs() <= 3,
        "Retry-After {retry} disagrees with X-RateLimit-Reset {reset} (now {t})"
    );
}

async fn sixth_request_is_limited(route: &str, body: impl Fn(usize) -> Value) {
    let stack = Stack::new().await;
    let api = stack.api(&limited_env(&stack)).await;
    let url = api.url(route);
    let ip = "203.0.113.7";
    for i in 0..5 {
        let r = post_json(&url, ip, &body(i)).await;
        check_allowed(&r, 4 - i as u64);
    }
    let r = post_json(&url, ip, &body(5)).await;
    check_limited(&r);
    // Still limited on a 7th.
    check_limited(&post_json(&url, ip, &body(6)).await);
    // Another IP is unaffected.
    let r = post_json(&url, "198.51.100.23", &body(7)).await;
    check_allowed(&r, 4);
    if route == "/api/waitlist" {
        assert_eq!(
            waitlist_rows(&stack).await,
            6,
            "limited requests must not be stored"
        );
    } else {
        let queued = stack.redis.count("ZCARD", "email:scheduled").await
            + stack.redis.count("LLEN", "email:active").await;
        assert_eq!(queued, 6, "limited requests must not queue email jobs");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn waitlist_sixth_request_in_an_hour_is_429() {
    sixth_request_is_limited(
        "/api/waitlist",
        |i| json!({"email": format!("rl{i}@example.com")}),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_sixth_request_in_an_hour_is_429() {
    sixth_request_is_limited("/api/contact", |i| {
        json!({"name": format!("Sender {i}"), "email": format!("s{i}@example.com"), "message": "hi"})
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_requests_from_one_ip_let_exactly_five_through() {
    let stack = Stack::new().await;
    let api = stack.api(&limited_env(&stack)).await;
    let url = api.url("/api/waitlist");
    let ip = random_ip();
    let replies = join_all((0..20).map(|i| {
        let (url, ip) = (url.clone(), ip.clone());
        async move {
            post_json(
                &url,
                &ip,
                &json!({"email": format!("burst{i}@example.com")}),
            )
            .await
        }
    }))
    .await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let limited = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!(
        (ok, limited),
        (5, 15),
        "statuses: {:?}",
        replies
            .iter()
            .map(|r| r.status.as_u16())
            .collect::<Vec<_>>()
    );
    for r in replies.iter().filter(|r| r.status == 429) {
        check_limited(r);
    }
    let mut remaining: Vec<u64> = replies
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.header_u64("x-ratelimit-remaining"))
        .collect();
    remaining.sort_unstable();
    assert_eq!(
        remaining,
        vec![0, 1, 2, 3, 4],
        "each admitted request sees its own count"
    );
    assert_eq!(waitlist_rows(&stack).await, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn twenty_concurrent_contact_requests_queue_exactly_five_jobs() {
    let stack = Stack::new().await;
    let api = stack.api(&limited_env(&stack)).await;
    let url = api.url("/api/contact");
    let ip = random_ip();
    let replies = join_all((0..20).map(|i| {
        let (url, ip) = (url.clone(), ip.clone());
        async move {
            post_json(
                &url,
                &ip,
                &json!({"name": "Burst", "email": format!("b{i}@example.com"), "message": "m"}),
            )
            .await
        }
    }))
    .await;
    let ok = replies.iter().filter(|r| r.status == 200).count();
    let limited = replies.iter().filter(|r| r.status == 429).count();
    assert_eq!((ok, limited), (5, 15));
    let queued = stack.redis.count("ZCARD", "email:scheduled").await
        + stack.redis.count("LLEN", "email:active").await;
    assert_eq!(queued, 5);
}

#[tokio::test(flavor = "multi_thread")]
async fn forwarded_for_is_ignored_unless_trust_proxy() {
    let stack = Stack::new().await;
    let api = stack.api(&limited_env(&stack).without("TRUST_PROXY")).await;
    let url = api.url("/api/waitlist");
    for i in 0..5 {
        let r = post_json(
            &url,
            &random_ip(),
            &json!({"email": format!("spoof{i}@example.com")}),
        )
        .await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
    }
    // A new X-Forwarded-For value does not buy a new allowance: the socket peer counts.
    let r = post_json(&url, &random_ip(), &json!({"email": "spoof5@example.com"})).await;
    check_limited(&r);
}

/// Behind `TRUST_PROXY_HOPS=N` proxies the client is the Nth address from
/// the right of `X-Forwarded-For`: whatever a client writes to the left of it
/// does not buy a new allowance (the first entry used to decide).
#[tokio::test(flavor = "multi_thread")]
async fn client_ip_is_the_nth_forwarded_entry_from_the_right() {
    let stack = Stack::new().await;
    let api = stack
        .api(&limited_env(&stack).with("TRUST_PROXY_HOPS", "2"))
        .await;
    let url = api.url("/api/waitlist");
    // `<spoofed>, <client as seen by the outer proxy>, <outer proxy>`.
    let client = random_ip();
    for i in 0..5 {
        let xff = format!("{}, {client}, 10.9.9.9", random_ip());
        let r = post_json(&url, &xff, &json!({"email": format!("hop{i}@example.com")})).await;
        check_allowed(&r, 4 - i);
    }
    let xff = format!("{}, {client}, 10.9.9.9", random_ip());
    check_limited(&post_json(&url, &xff, &json!({"email": "hop5@example.com"})).await);
    // Another client behind the same proxies has its own allowance.
    let xff = format!("{client}, {}, 10.9.9.9", random_ip());
    let r = post_json(&url, &xff, &json!({"email": "hop6@example.com"})).await;
    check_allowed(&r, 4);
}

/// IPv6 clients share one allowance per /64 (each address of a /64 used to
/// be its own bucket); an IPv4-mapped address counts as its IPv4 address.
#[tokio::test(flavor = "multi_thread")]
async fn ipv6_clients_are_limited_per_64_and_mapped_ipv4_is_ipv4() {
    let stack = Stack::new().await;
    let api = stack.api(&limited_env(&stack)).await;
    let url = api.url("/api/waitlist");
    let net = format!("2001:db8:{:x}:{:x}", r16(), r16());
    for i in 0..5u64 {
        let ip = format!("{net}:{:x}::{:x}", r16(), i + 1);
        let r = post_json(&url, &ip, &json!({"email": format!("v6-{i}@example.com")})).await;
        check_allowed(&r, 4 - i);
    }
    let ip = format!("{net}:ffff::1");
    check_limited(&post_json(&url, &ip, &json!({"email": "v6-5@example.com"})).await);

    let v4 = random_ip();
    for i in 0..5u64 {
        let ip = if i % 2 == 0 {
            v4.clone()
        } else {
            format!("::ffff:{v4}")
        };
        let r = post_json(&url, &ip, &json!({"email": format!("v4-{i}@example.com")})).await;
        check_allowed(&r, 4 - i);
    }
    check_limited(
        &post_json(
            &url,
            &format!("::ffff:{v4}"),
            &json!({"email": "v4-5@example.com"}),
        )
        .await,
    );
}

/// While Redis does not answer, the limit still holds (each api process
/// counts on its own): the waitlist, which needs only the database, is not
/// unlimited during a Redis outage.
#[tokio::test(flavor = "multi_thread")]
async fn limit_holds_in_process_while_redis_is_down() {
    let stack = Stack::new().await;
    let proxy = tests::TcpProxy::start(&tests::host_port(&stack.redis.url)).await;
    let env = limited_env(&stack)
        .with("REDIS_URL", stack.redis.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "300");
    let api = stack.api(&env).await;
    let url = api.url("/api/waitlist");
    proxy.set(tests::ProxyMode::Refuse);
    let ip = random_ip();
    for i in 0..5 {
        let r = post_json(&url, &ip, &json!({"email": format!("down{i}@example.com")})).await;
        assert_eq!(r.status, 200, "request {i}: {}", r.text);
        assert_eq!(r.header_u64("x-ratelimit-limit"), 5);
    }
    check_limited(&post_json(&url, &ip, &json!({"email": "down5@example.com"})).await);
    assert_eq!(waitlist_rows(&stack).await, 5);
    proxy.on();
}
