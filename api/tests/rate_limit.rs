//! The shared rate limiter (`api::rate_limit`) against a real Redis
//! (`TEST_REDIS_URL`, default `redis://127.0.0.1:6379`; unreachable → the
//! test fails): GCRA's burst and even refill, the headers' values, exact
//! admission under concurrency, and one Redis clock for every process.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use api::rate_limit::{Limit, RateLimiter};
use futures::future::join_all;
use redis::aio::ConnectionManager;

async fn limiter() -> (RateLimiter, String) {
    let url =
        std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let client = redis::Client::open(url.as_str()).expect("TEST_REDIS_URL");
    let conn = tokio::time::timeout(Duration::from_secs(5), ConnectionManager::new(client))
        .await
        .expect("Redis answers within 5 s")
        .expect("Redis reachable (TEST_REDIS_URL)");
    let prefix = format!("test-rl-{}", uuid::Uuid::new_v4().simple());
    (RateLimiter::new(Some(conn), &prefix), prefix)
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(5)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// 3 per 3 s: a burst of 3, then one more each second (not 3 more when a
/// window turns over).
#[tokio::test]
async fn a_burst_of_max_then_one_per_window_over_max() {
    let (rl, _) = limiter().await;
    let limit = Limit {
        name: "burst",
        max: 3,
        window: Duration::from_secs(3),
    };
    for expect in [2, 1, 0] {
        let d = rl.check(limit, "alice", deadline()).await;
        assert!(d.allowed);
        assert_eq!(d.info.limit, 3);
        assert_eq!(d.info.remaining, expect);
        let t = now();
        // The whole burst is back within the window.
        assert!(
            d.info.reset >= t && d.info.reset <= t + 4,
            "reset {} now {t}",
            d.info.reset
        );
    }
    let d = rl.check(limit, "alice", deadline()).await;
    assert!(!d.allowed, "the 4th within the burst is refused");
    assert_eq!(d.info.remaining, 0);
    assert_eq!(d.info.retry_after, 1, "one request refills per second");
    let t = now();
    assert!(
        d.info.reset >= t && d.info.reset <= t + 2,
        "on a 429 the reset is the retry time: {} now {t}",
        d.info.reset
    );
    // A refused request does not push the next allowance back.
    assert!(!rl.check(limit, "alice", deadline()).await.allowed);

    // Another subject has its own allowance.
    assert!(rl.check(limit, "bob", deadline()).await.allowed);

    // One period later exactly one more request passes.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let d = rl.check(limit, "alice", deadline()).await;
    assert!(d.allowed, "refilled after one period");
    assert_eq!(d.info.remaining, 0);
    assert!(!rl.check(limit, "alice", deadline()).await.allowed);
}

/// 40 concurrent requests against a limit of 7 admit exactly 7, each seeing
/// its own remaining count.
#[tokio::test]
async fn concurrent_requests_admit_exactly_max() {
    let (rl, _) = limiter().await;
    let limit = Limit {
        name: "concurrent",
        max: 7,
        window: Duration::from_secs(3600),
    };
    let ds = join_all((0..40).map(|_| rl.check(limit, "carol", deadline()))).await;
    let mut remaining: Vec<u64> = ds
        .iter()
        .filter(|d| d.allowed)
        .map(|d| d.info.remaining)
        .collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..7).collect::<Vec<_>>());
    for d in ds.iter().filter(|d| !d.allowed) {
        assert!((1..=3600 / 7 + 2).contains(&d.info.retry_after), "{d:?}");
    }
}

/// Two api processes (two limiters on one prefix) share one allowance: the
/// state is in Redis and Redis's clock decides, so the hosts' clocks do not
/// matter.
#[tokio::test]
async fn two_processes_share_one_allowance() {
    let (a, prefix) = limiter().await;
    let url =
        std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string());
    let b = RateLimiter::new(
        Some(
            ConnectionManager::new(redis::Client::open(url.as_str()).unwrap())
                .await
                .unwrap(),
        ),
        &prefix,
    );
    let limit = Limit {
        name: "shared",
        max: 4,
        window: Duration::from_secs(600),
    };
    let mut allowed = 0;
    for i in 0..8 {
        let rl = if i % 2 == 0 { &a } else { &b };
        if rl.check(limit, "dave", deadline()).await.allowed {
            allowed += 1;
        }
    }
    assert_eq!(allowed, 4);
}
