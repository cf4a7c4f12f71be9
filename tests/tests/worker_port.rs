//! The worker's own HTTP port (`WORKER_HTTP_PORT`): `/readyz` answers 503
//! naming the dependency that is down (PostgreSQL or Redis, reached through
//! a [`TcpProxy`] switched off) and 200 again once it is back; the port has
//! the api's connection protections (a client trickling its request headers
//! is disconnected after `HTTP_HEADER_TIMEOUT_MS`; a connection is closed once
//! its requests are answered, an h2c one sending PINGs too); one client address
//! holds at most 8 of its connections.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{host_port, EnvMap, ProxyMode, Reply, Stack, TcpProxy};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// `/readyz` until it answers `status` with `body`; the last answer.
async fn readyz_until(base: &str, status: u16, body: &Value) -> Reply {
    let url = format!("{base}/readyz");
    tests::poll_until(
        Duration::from_secs(30),
        || {
            let url = url.clone();
            async move { tests::get(&url).await }
        },
        |r| r.status == status && r.json == *body,
    )
    .await
}

/// A worker with its port, reaching the dependency `via` a proxy, goes
/// unready while the proxy refuses and ready again after.
async fn unready_while_down(stack: &Stack, env: EnvMap, proxy: &TcpProxy, down: Value) {
    let worker = stack
        .worker(
            &env.with("WORKER_HTTP_PORT", "0")
                .with("DEPENDENCY_TIMEOUT_MS", "1000"),
        )
        .await;
    let base = tests::worker_http(&worker).await;
    let ok = json!({"database": "ok", "queue": "ok"});
    let r = readyz_until(&base, 200, &ok).await;
    assert_eq!((r.status.as_u16(), &r.json), (200, &ok), "{}", r.text);

    proxy.set(ProxyMode::Refuse);
    let r = readyz_until(&base, 503, &down).await;
    assert_eq!(
        (r.status.as_u16(), &r.json),
        (503, &down),
        "{}; worker stderr (tail):\n{}",
        r.text,
        tests::tail(&worker.stderr(), 2000)
    );
    // Liveness is not readiness.
    assert_eq!(tests::get(&format!("{base}/healthz")).await.status, 200);

    proxy.on();
    let r = readyz_until(&base, 200, &ok).await;
    assert_eq!((r.status.as_u16(), &r.json), (200, &ok), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_while_postgres_is_down() {
    let stack = Stack::new().await;
    let proxy = TcpProxy::start(&host_port(&stack.db.url)).await;
    let env = stack
        .env()
        .with("DATABASE_URL", stack.db.url_via(proxy.addr));
    let down = json!({"database": "unavailable", "queue": "ok"});
    unready_while_down(&stack, env, &proxy, down).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn readyz_is_503_while_redis_is_down() {
    let stack = Stack::new().await;
    let proxy = TcpProxy::start(&host_port(&stack.redis.url)).await;
    let env = stack
        .env()
        .with("REDIS_URL", stack.redis.url_via(proxy.addr));
    let down = json!({"database": "ok", "queue": "unavailable"});
    unready_while_down(&stack, env, &proxy, down).await;
}

/// Slowloris on the worker's port: one header byte every 300 ms. With a 1 s
/// header deadline the connection is closed long before the request is
/// complete (the port had no deadline before).
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_port_disconnects_a_client_trickling_its_headers() {
    let stack = Stack::new().await;
    let worker = stack
        .worker(
            &stack
                .env()
                .with("WORKER_HTTP_PORT", "0")
                .with("HTTP_HEADER_TIMEOUT_MS", "1000"),
        )
        .await;
    let base = tests::worker_http(&worker).await;
    let mut s = TcpStream::connect(host_port(&base)).await.expect("connect");
    let connected = std::time::Instant::now();
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut closed_after = None;
    for (i, b) in request.iter().enumerate() {
        if s.write_all(&[*b]).await.is_err() {
            closed_after = Some(i);
            break;
        }
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_millis(300), s.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed_after = Some(i + 1);
                break;
            }
            Ok(Ok(_)) => {
                closed_after = Some(i + 1);
                break;
            }
            Err(_) => {}
        }
    }
    match closed_after {
        Some(n) => assert!(
            n < request.len(),
            "the connection closed only after the whole request ({n} bytes)"
        ),
        None => panic!("a client trickling its headers to the worker port was never disconnected"),
    }
    // The port's header timeout (the setting's 1 s; the port never waits
    // more than 2 s) decided it, long before the trickle's ~24 s would
    // have ended (4 s of slack for a loaded machine).
    let took = connected.elapsed();
    assert!(
        took < Duration::from_secs(6),
        "closed after {took:?}: no header timeout applied"
    );
}

/// An h2c connection to the worker's port that only sends PINGs after its
/// request is closed (GOAWAY): the port closes each connection once its
/// requests are answered (at the latest `HTTP_IDLE_TIMEOUT_SECS` later, as
/// on the api).
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_port_closes_an_h2c_connection_sending_only_pings() {
    let stack = Stack::new().await;
    let worker = stack
        .worker(
            &stack
                .env()
                .with("WORKER_HTTP_PORT", "0")
                .with("HTTP_IDLE_TIMEOUT_SECS", "2"),
        )
        .await;
    let base = tests::worker_http(&worker).await;
    let c = tests::h2c_pings_after_requests(
        &host_port(&base),
        &[("/healthz", Vec::new())],
        Duration::ZERO,
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(c.statuses, [200]);
    let closed_after = c
        .closed_after
        .unwrap_or_else(|| panic!("an h2c connection sending PINGs was never closed: {c:?}"));
    assert!(closed_after < Duration::from_secs(8), "{closed_after:?}");
    assert!(c.graceful, "closed without a GOAWAY: {c:?}");
}

/// One client address cannot hold the worker's connections: past 8 open
/// ones, its further connections are closed at once, and a probe from
/// another address is answered while the 8 still wait for their headers.
#[tokio::test(flavor = "multi_thread")]
async fn one_client_holds_at_most_eight_connections_of_the_worker_port() {
    let stack = Stack::new().await;
    let worker = stack
        .worker(&stack.env().with("WORKER_HTTP_PORT", "0"))
        .await;
    let base = tests::worker_http(&worker).await;
    let addr: std::net::SocketAddr = base.trim_start_matches("http://").parse().unwrap();
    // 20 connections from 127.0.0.2, each sending half a request's headers
    // (all open at once), then the rest. Those over the share were closed
    // at once and answer nothing; at most 8 are answered (fewer only if the
    // port's 2 s header timeout closed some before their second half came:
    // no deadline of the test's own decides the count).
    // Connected together, so that all 20 are open within the port's 2 s
    // header timeout even on a loaded machine.
    let mut conns = futures::future::join_all((0..20).map(|_| async {
        let s = tokio::net::TcpSocket::new_v4().unwrap();
        s.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        let mut c = s.connect(addr).await.unwrap();
        let _ = c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await;
        c
    }))
    .await;
    let mut answered = 0;
    for c in &mut conns {
        let _ = c.write_all(b"\r\n").await;
        let mut answer = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(10), c.read_to_end(&mut answer)).await;
        if answer.starts_with(b"HTTP/1.1 ") {
            answered += 1;
        }
    }
    assert!(
        (1..=8).contains(&answered),
        "20 connections from one address, at most 8 kept: {answered} answered"
    );
    // A probe from another address is answered.
    let r = tests::get(&format!("{base}/healthz")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    drop(conns);
}
