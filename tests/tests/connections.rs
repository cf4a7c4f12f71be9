//! Connection deadlines of the api: a client that trickles its
//! request headers is disconnected after `HTTP_HEADER_TIMEOUT_MS`, one that
//! trickles its body gets 408 after `HTTP_BODY_TIMEOUT_SECS`, a process
//! holds at most `HTTP_MAX_CONNECTIONS` connections, and an HTTP/2
//! connection with no stream open is closed after `HTTP_IDLE_TIMEOUT_SECS`
//! however many PINGs it sends.

use std::time::{Duration, Instant};

use tests::Stack;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

fn addr_of(url: &str) -> String {
    tests::host_port(url)
}

/// Sends `bytes` one per second; returns how many were written before the
/// server closed the connection (`None`: all were written and it is still open).
async fn trickle(stream: &mut TcpStream, bytes: &[u8]) -> Option<usize> {
    for (i, b) in bytes.iter().enumerate() {
        if stream.write_all(&[*b]).await.is_err() {
            return Some(i);
        }
        // Closed by the server? A read returns 0 (or an error) without waiting.
        let mut buf = [0u8; 512];
        match tokio::time::timeout(Duration::from_secs(1), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(i + 1),
            Ok(Ok(_)) => {
                // An answer (a 408 or similar) before the headers were complete;
                // the connection must close after it.
                return Some(i + 1);
            }
            Err(_) => {}
        }
    }
    None
}

/// Slowloris: one header byte per second. With a 2 s header deadline the
/// server closes the connection long before the 40-byte request line and
/// headers are complete (before the fix it waited forever).
#[tokio::test(flavor = "multi_thread")]
async fn slowloris_is_disconnected_after_the_header_timeout() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("HTTP_HEADER_TIMEOUT_MS", "2000"))
        .await;
    let mut stream = TcpStream::connect(addr_of(&api.url("/")))
        .await
        .expect("connect");
    let request =
        b"GET /api/health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let sent = trickle(&mut stream, request).await;
    match sent {
        Some(n) => assert!(
            n < request.len(),
            "the connection closed only after the whole request ({n} bytes)"
        ),
        None => panic!("a client trickling its headers was never disconnected"),
    }
}

/// A body that does not arrive in full within `HTTP_BODY_TIMEOUT_SECS` is
/// answered 408 `body_timeout` and the connection is closed.
#[tokio::test(flavor = "multi_thread")]
async fn slow_body_gets_408() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("HTTP_BODY_TIMEOUT_SECS", "1"))
        .await;
    let mut stream = TcpStream::connect(addr_of(&api.url("/")))
        .await
        .expect("connect");
    let head = "POST /api/waitlist HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\nX-Forwarded-For: 10.1.2.3\r\n\r\n{\"email\":";
    stream.write_all(head.as_bytes()).await.expect("write");
    // The rest of the body never comes; the answer must.
    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    assert!(read.is_ok(), "no answer and no close within 20 s: {text}");
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(text.contains("body_timeout"), "{text}");
}

/// With `HTTP_MAX_CONNECTIONS=2`, a third connection is not served while two
/// are open, and is served once one of them closes.
#[tokio::test(flavor = "multi_thread")]
async fn connections_beyond_the_cap_wait() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("HTTP_MAX_CONNECTIONS", "2"))
        .await;
    let addr = addr_of(&api.url("/"));
    let first = TcpStream::connect(&addr).await.expect("connect 1");
    let second = TcpStream::connect(&addr).await.expect("connect 2");
    // Both are accepted (their requests would be served); give the server a
    // request on each so they are surely counted.
    let mut held = Vec::new();
    for mut s in [first, second] {
        s.write_all(b"GET /api/health HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .expect("write");
        let mut buf = [0u8; 9];
        s.read_exact(&mut buf)
            .await
            .expect("an answer on a held connection");
        assert_eq!(
            &buf,
            b"HTTP/1.1 " as &[u8],
            "{}",
            String::from_utf8_lossy(&buf)
        );
        held.push(s);
    }
    let mut third = TcpStream::connect(&addr).await.expect("connect 3");
    third
        .write_all(b"GET /api/health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut buf = [0u8; 9];
    let waited = tokio::time::timeout(Duration::from_secs(2), third.read_exact(&mut buf)).await;
    assert!(
        waited.is_err(),
        "a third connection was served beyond the cap"
    );
    drop(held.pop());
    tokio::time::timeout(Duration::from_secs(20), third.read_exact(&mut buf))
        .await
        .expect("the waiting connection was served once a slot freed")
        .expect("read");
    assert_eq!(&buf, b"HTTP/1.1 " as &[u8]);
}

/// An HTTP/2 (h2c) connection that only sends PINGs once its streams are
/// done is closed, gracefully (GOAWAY), `HTTP_IDLE_TIMEOUT_SECS` after its
/// last stream ended: control frames do not keep it, so such connections
/// cannot fill `HTTP_MAX_CONNECTIONS`. A stream still open (a body arriving
/// for longer than the idle timeout) keeps the connection.
#[tokio::test(flavor = "multi_thread")]
async fn h2c_connections_sending_only_pings_are_closed_when_idle() {
    let stack = Stack::new().await;
    let api = stack
        .api(
            &stack
                .env()
                .with("HTTP_IDLE_TIMEOUT_SECS", "2")
                .with("HTTP_BODY_MIN_RATE", "0"),
        )
        .await;
    // A body arriving over 4 s (twice the idle timeout), then a GET.
    let body = br#"{"email": "pinged@example.com", "name": "Pinged"}"#;
    let pieces: Vec<bytes::Bytes> = body
        .chunks(body.len().div_ceil(9))
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let requests = [("/api/waitlist", pieces), ("/api/plans", Vec::new())];
    let c = tests::h2c_pings_after_requests(
        &addr_of(&api.url("/")),
        &requests,
        Duration::from_millis(500),
        Duration::from_secs(20),
    )
    .await;
    assert_eq!(
        c.statuses,
        [200, 200],
        "a stream open past the idle timeout is served"
    );
    assert!(c.pongs >= 2, "the PINGs were not answered: {c:?}");
    let closed_after = c
        .closed_after
        .unwrap_or_else(|| panic!("an h2c connection sending PINGs was never closed: {c:?}"));
    assert!(
        closed_after < Duration::from_secs(8),
        "closed {closed_after:?} after its last stream, past the 2 s idle timeout"
    );
    assert!(c.graceful, "closed without a GOAWAY: {c:?}");
}

/// An h2c connection whose only answer the client never lets flow (its
/// stream window stays 0, so the server cannot send a byte of the body)
/// while it keeps sending PINGs is closed after `HTTP_IDLE_TIMEOUT_SECS`,
/// as one with no stream open is.
#[tokio::test(flavor = "multi_thread")]
async fn h2c_connections_holding_answers_behind_a_shut_window_are_closed_when_idle() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("HTTP_IDLE_TIMEOUT_SECS", "2"))
        .await;
    let addr = addr_of(&api.url("/"));
    let tcp = TcpStream::connect(&addr).await.expect("connect h2c");
    let (client, mut connection) = h2::client::Builder::new()
        .initial_window_size(0)
        .handshake::<_, bytes::Bytes>(tcp)
        .await
        .expect("h2c handshake");
    let mut pings = connection.ping_pong().expect("user PINGs");
    let mut connection = tokio::spawn(connection);
    let req = http::Request::builder()
        .uri(format!("http://{addr}/api/openapi.json"))
        .body(())
        .expect("request");
    let (answer, _) = client
        .clone()
        .ready()
        .await
        .expect("h2c ready")
        .send_request(req, true)
        .expect("h2c request");
    // The head comes (HEADERS are not flow-controlled); the body never can.
    let answer = answer.await.expect("an answer's head");
    assert_eq!(answer.status(), 200);
    let held = Instant::now();
    let mut pongs = 0;
    let closed = loop {
        if held.elapsed() > Duration::from_secs(20) {
            break None;
        }
        tokio::select! {
            _ = &mut connection => break Some(held.elapsed()),
            pong = tokio::time::timeout(Duration::from_secs(2), pings.ping(h2::Ping::opaque())) => {
                if let Ok(Ok(_)) = pong {
                    pongs += 1;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    connection.abort();
    assert!(pongs >= 2, "the PINGs were not answered ({pongs})");
    let closed = closed.expect("a connection holding a shut window and PINGing was never closed");
    assert!(closed < Duration::from_secs(8), "closed after {closed:?}");
    drop(answer);
}
