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

/// Slowloris on the worker's port: header bytes every 100 ms for 1.5 s,
/// then the rest at once. With `HTTP_HEADER_TIMEOUT_MS=300` the port closes
/// the connection before the request is whole and never answers it; with
/// the setting ignored (the port's own 2 s) or no deadline at all, the
/// request would be whole in time and answered 200.
#[tokio::test(flavor = "multi_thread")]
async fn the_worker_port_disconnects_a_client_trickling_its_headers() {
    let stack = Stack::new().await;
    let worker = stack
        .worker(
            &stack
                .env()
                .with("WORKER_HTTP_PORT", "0")
                .with("HTTP_HEADER_TIMEOUT_MS", "300"),
        )
        .await;
    let base = tests::worker_http(&worker).await;
    // The port answers a request sent at once.
    assert_eq!(tests::get(&format!("{base}/healthz")).await.status, 200);

    let mut s = TcpStream::connect(host_port(&base)).await.expect("connect");
    let request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    let (trickled, rest) = request.split_at(15);
    for b in trickled {
        if s.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = s.write_all(rest).await;
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut answer)).await;
    assert!(
        read.is_ok(),
        "a client trickling its headers to the worker port was never disconnected"
    );
    assert!(
        !answer.starts_with(b"HTTP/1.1 200"),
        "the trickled request was answered: {}",
        String::from_utf8_lossy(&answer)
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
    // (all open at once). Those over the share are closed at once: the test
    // waits until 12 have been closed before it sends any second half, so
    // that no answered (and so closed) connection frees a slot for one the
    // port has not accepted yet. Then each still open is sent the rest of
    // its headers: at most 8 are answered (fewer only if the port's 2 s
    // header timeout closed some first; with no share, all 20 would wait
    // for that timeout and none would be answered).
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
    let mut closed = [false; 20];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while closed.iter().filter(|c| **c).count() < 12 && tokio::time::Instant::now() < deadline {
        for (c, done) in conns.iter().zip(closed.iter_mut()) {
            // End of stream, a reset, or anything sent before the request
            // was whole: the port closed it.
            if !*done
                && !matches!(c.try_read(&mut [0u8; 64]), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
            {
                *done = true;
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let at_once = closed.iter().filter(|c| **c).count();
    assert!(
        at_once >= 12,
        "only {at_once} of 20 connections from one address were closed"
    );
    let mut answered = 0;
    for (c, _) in conns.iter_mut().zip(closed).filter(|(_, done)| !done) {
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
