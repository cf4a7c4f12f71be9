//! An HTTP/2 client in clear (h2c, prior knowledge) that keeps a connection
//! busy with control frames only ([`h2c_pings_after_requests`]).

use super::*;

/// What became of an h2c connection that sent only PINGs once its
/// requests were answered.
#[derive(Debug)]
pub struct PingedConnection {
    /// Statuses of the requests made first, in order.
    pub statuses: Vec<u16>,
    /// PINGs the server answered after the requests.
    pub pongs: usize,
    /// Time from the last answer to the requests until the server closed
    /// the connection; `None`: still open when the test gave up.
    pub closed_after: Option<Duration>,
    /// The connection ended cleanly (the server's GOAWAY, then the close),
    /// not by a reset or an abrupt end of the stream of frames.
    pub graceful: bool,
}

/// Opens an h2c connection to `addr` (`host:port`), makes the `requests` on
/// it one after the other (`(path, body)`: a `POST` whose body is sent as
/// `body.len()` pieces one `pace` apart, or a `GET` when `body` is empty),
/// then sends only PINGs, one every 500 ms, while the connection lasts, at
/// most `give_up` after the last answer. The request handle stays alive
/// throughout, so the client never ends the connection itself.
pub async fn h2c_pings_after_requests(
    addr: &str,
    requests: &[(&str, Vec<bytes::Bytes>)],
    pace: Duration,
    give_up: Duration,
) -> PingedConnection {
    let tcp = TcpStream::connect(addr).await.expect("connect h2c");
    let (client, mut connection) = h2::client::handshake(tcp).await.expect("h2c handshake");
    let mut pings = connection.ping_pong().expect("user PINGs");
    let mut connection = tokio::spawn(connection);
    let mut statuses = Vec::new();
    for (path, pieces) in requests {
        let mut ready = client.clone().ready().await.expect("h2c ready");
        let method = if pieces.is_empty() { "GET" } else { "POST" };
        let len: usize = pieces.iter().map(|p| p.len()).sum();
        let mut req = ::http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header("x-forwarded-for", random_ip());
        if !pieces.is_empty() {
            req = req
                .header("content-type", "application/json")
                .header("content-length", len.to_string());
        }
        let (answer, mut body) = ready
            .send_request(req.body(()).expect("request"), pieces.is_empty())
            .expect("h2c request");
        for (i, piece) in pieces.iter().enumerate() {
            if i > 0 {
                tokio::time::sleep(pace).await;
            }
            body.send_data(piece.clone(), i + 1 == pieces.len())
                .expect("send a piece of the body");
        }
        let answer = answer.await.expect("an h2c answer");
        statuses.push(answer.status().as_u16());
        let mut answer = answer.into_body();
        while let Some(chunk) = answer.data().await {
            let chunk = chunk.expect("the answer's body");
            let _ = answer.flow_control().release_capacity(chunk.len());
        }
    }
    let answered = Instant::now();
    let mut pongs = 0;
    let ended = loop {
        if answered.elapsed() > give_up {
            break None;
        }
        tokio::select! {
            ended = &mut connection => break Some(ended.expect("the connection task")),
            pong = tokio::time::timeout(Duration::from_secs(2), pings.ping(h2::Ping::opaque())) => {
                if let Ok(Ok(_)) = pong {
                    pongs += 1;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    };
    let closed_after = ended.as_ref().map(|_| answered.elapsed());
    connection.abort();
    // After the end, a new stream is refused with what ended the connection:
    // the server's GOAWAY (NO_ERROR), or an I/O error when it just closed.
    let go_away = match client.ready().await {
        Err(e) => e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR),
        Ok(_) => false,
    };
    PingedConnection {
        statuses,
        pongs,
        closed_after,
        graceful: matches!(ended, Some(Ok(()))) && go_away,
    }
}
