//! The HTTP server loop of the api and of the worker's port: accepts
//! connections and serves each with hyper (HTTP/1.1, and HTTP/2 in clear,
//! "h2c" with prior knowledge), bounding what a client can hold (RFC 9112
//! §9.8 and RFC 9113 §6.5.2 leave these to the server):
//!
//! * at most `max_connections` open connections (`HTTP_MAX_CONNECTIONS` on
//!   the api): beyond that `accept` waits (new clients queue in the kernel's
//!   listen backlog);
//! * HTTP/1: a request head larger than [`H1_MAX_BUF`] is answered 431;
//! * a request's headers must arrive within `HTTP_HEADER_TIMEOUT_MS`. HTTP/1:
//!   hyper's `header_read_timeout` (the clock also runs while a keep-alive
//!   connection waits for its next request, so an idle HTTP/1 connection is
//!   closed after the shorter of this and the idle timeout). Both protocols:
//!   a connection that has not delivered its first request's headers within
//!   this time of being accepted is closed (an HTTP/2 client trickling its
//!   preface or its first `HEADERS`);
//! * HTTP/2: at most [`H2_MAX_STREAMS`] concurrent streams per connection,
//!   flow-control windows of [`H2_STREAM_WINDOW`] per stream and
//!   [`H2_CONNECTION_WINDOW`] per connection (what a client may send before
//!   the server reads it), header lists of at most [`H2_MAX_HEADER_LIST`];
//! * a connection is closed after `HTTP_IDLE_TIMEOUT_SECS` with no request
//!   open (from a request's headers until its answer's last byte is written
//!   or the client resets it), whatever control frames it sends meanwhile:
//!   an HTTP/2 client that keeps PINGing (or sending `SETTINGS`,
//!   `WINDOW_UPDATE`) with no stream open is sent a `GOAWAY` and closed
//!   (RFC 9113 §6.8, graceful), so such connections cannot fill
//!   `max_connections`; so is one whose open requests all have their answer
//!   ready but hyper could not send any of it for that long (an HTTP/2
//!   client keeping its flow-control window shut while it PINGs); a
//!   connection that moves no byte for that long is closed too, even with a
//!   request open;
//! * `max_per_client` (the worker's port, and the api's when it trusts no
//!   proxy, `HTTP_MAX_CONNECTIONS_PER_CLIENT`; behind a proxy every client
//!   shares its address): a client address (an IPv4 address, an IPv6 /64)
//!   holding that many open connections has further ones closed at once, so
//!   one client cannot take every connection; and the last tenth of
//!   `max_connections` ([`light_reserve`]) goes only to clients holding
//!   fewer than [`LIGHT_CLIENT`] connections, so a few clients at their
//!   share (20 addresses × 512 once filled 10,000) cannot take every
//!   connection either: a new client still gets in;
//! * `close_after_answer` (the worker's port): a connection is closed once
//!   its requests are answered (HTTP/1 without keep-alive; HTTP/2 is sent a
//!   `GOAWAY` when its last open stream ends), so clients opening
//!   connections and leaving them idle hold no slot;
//! * the body deadline and minimum data rate are per request, in the api's
//!   middleware (`HTTP_BODY_TIMEOUT_SECS`, `HTTP_BODY_MIN_RATE`).
//!
//! On shutdown: stop accepting, ask every connection to finish its requests
//! in flight, wait for them up to the grace period.

use std::{
    convert::Infallible,
    net::SocketAddr,
    pin::Pin,
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        Arc,
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::FutureExt as _;
use hyper_util::{
    rt::{TokioExecutor, TokioIo, TokioTimer},
    server::conn::auto,
};
use poem::{
    web::{LocalAddr, RemoteAddr},
    Addr, Endpoint, Response,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_util::{sync::CancellationToken, task::TaskTracker};

use crate::listener::CappedIo;

/// Concurrent HTTP/2 streams one connection may open (hyper's default is
/// 200): the rest wait for one to end, on the client's side.
pub const H2_MAX_STREAMS: u32 = 16;

/// HTTP/2 initial flow-control window of a stream, in bytes (64 KiB, the
/// `/api` body limit; hyper's default is 1 MiB).
pub const H2_STREAM_WINDOW: u32 = 64 * 1024;

/// HTTP/2 flow-control window of a whole connection, in bytes (256 KiB;
/// hyper's default is 1 MiB).
pub const H2_CONNECTION_WINDOW: u32 = 256 * 1024;

/// Largest HTTP/2 header list accepted, in bytes (decoded, as RFC 9113
/// §6.5.2 counts it).
pub const H2_MAX_HEADER_LIST: u32 = 64 * 1024;

/// Largest HTTP/1 read buffer, in bytes (64 KiB, as [`H2_MAX_HEADER_LIST`];
/// hyper's default is ~400 KiB): a request head that does not fit is
/// answered 431, so ten thousand connections trickling their heads cannot
/// hold 4 GB of buffers.
pub const H1_MAX_BUF: usize = 64 * 1024;

/// How long an idle connection asked to close (`GOAWAY`) may take to finish
/// closing before it is dropped.
pub const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// A client holding fewer connections than this is light: the last
/// connections of the pool ([`light_reserve`]) are kept for such clients
/// (a browser holds a few per origin).
pub const LIGHT_CLIENT: usize = 8;

/// The connections of `max_connections` kept for light clients
/// ([`LIGHT_CLIENT`]) when a per-client bound applies: a tenth.
pub fn light_reserve(max_connections: usize) -> usize {
    max_connections / 10
}

/// Connection limits (from the `HTTP_*` settings).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time allowed for a request's headers.
    pub header_timeout: Duration,
    /// A connection with no request open, or no traffic, for this long is
    /// closed.
    pub idle_timeout: Duration,
    /// Open connections at most.
    pub max_connections: usize,
    /// Open connections one client address (IPv4 address, IPv6 /64) may
    /// hold; `None`: no such bound.
    pub max_per_client: Option<usize>,
    /// Largest single socket read ([`crate::listener::READ_CAP`]).
    pub read_cap: usize,
    /// Close each connection once its requests are answered (the worker's
    /// port: a probe or scraper connects per request, so an idle connection
    /// holds a slot for nothing); HTTP/1 answers without keep-alive, an
    /// HTTP/2 connection is sent a `GOAWAY` when its last open stream ends.
    pub close_after_answer: bool,
}

impl Limits {
    /// The api's: from the settings (`HTTP_HEADER_TIMEOUT_MS`,
    /// `HTTP_IDLE_TIMEOUT_SECS`, `HTTP_MAX_CONNECTIONS`, and, when no proxy
    /// is trusted (`TRUST_PROXY_HOPS=0`: the socket peer is the client),
    /// `HTTP_MAX_CONNECTIONS_PER_CLIENT`; behind proxies every client shares
    /// their addresses, so there is no per-client bound).
    pub fn from_settings(s: &entity::Settings) -> Self {
        Limits {
            header_timeout: s.http_header_timeout,
            idle_timeout: s.http_idle_timeout,
            max_connections: s.http_max_connections.max(1),
            max_per_client: (s.trust_proxy_hops == 0 && s.http_max_connections_per_client > 0)
                .then_some(s.http_max_connections_per_client),
            read_cap: crate::listener::READ_CAP,
            close_after_answer: false,
        }
    }
}

/// Connections the kernel may hold completed but not yet accepted
/// (`listen(2)`'s backlog; Linux caps it at `net.core.somaxconn`). Tokio's
/// `TcpListener::bind` asks for 128: a burst of a few hundred clients
/// connecting at once (500 chats opened together, BENCHMARKS.md) then
/// overflows the queue and the kernel drops their SYNs, which the clients
/// resend only after 1 s.
pub const LISTEN_BACKLOG: u32 = 1024;

/// Listens on `host:port` (a name is resolved; the first address that binds
/// is used) with [`LISTEN_BACKLOG`] and `SO_REUSEADDR`, as
/// `TcpListener::bind` does otherwise.
///
/// Errors: the name does not resolve, or no address can be bound.
pub async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    let mut last = None;
    for addr in tokio::net::lookup_host((host, port)).await? {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
        };
        let bound = socket.and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(addr)?;
            s.listen(LISTEN_BACKLOG)
        });
        match bound {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{host} resolves to no address"),
        )
    }))
}

type HyperBody = http_body_util::combinators::BoxBody<bytes::Bytes, std::io::Error>;

/// Serves `ep` on `listener` until `shutdown`, then lets connections finish
/// their requests for up to `grace`.
pub async fn run<E>(
    listener: TcpListener,
    ep: E,
    limits: Limits,
    shutdown: CancellationToken,
    grace: Duration,
) -> std::io::Result<()>
where
    E: Endpoint<Output = Response> + 'static,
{
    let ep = Arc::new(ep);
    let local = listener.local_addr()?;
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let clients = Arc::new(ClientCounts::default());
    let tracker = TaskTracker::new();
    loop {
        let permit = tokio::select! {
            _ = shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => p.expect("the semaphore is never closed"),
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => break,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off a little.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let client = match limits.max_per_client {
            Some(max) => match clients.enter(
                peer,
                max,
                permits.available_permits() < light_reserve(limits.max_connections),
            ) {
                Some(c) => Some(c),
                None => {
                    // Closed at once: this client holds its share.
                    drop(stream);
                    continue;
                }
            },
            None => None,
        };
        let _ = stream.set_nodelay(true);
        let (ep, shutdown) = (ep.clone(), shutdown.clone());
        tracker.spawn(async move {
            serve_connection(stream, local, peer, ep, limits, shutdown).await;
            drop(client);
            drop(permit);
        });
    }
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        tracing::warn!("connections still open after the grace period; closing them");
    }
    Ok(())
}

/// Open connections per client address ([`Limits::max_per_client`]).
#[derive(Default)]
struct ClientCounts(std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>);

/// One connection counted for its client until dropped.
struct ClientSlot {
    counts: Arc<ClientCounts>,
    key: std::net::IpAddr,
}

/// The client a connection or request from `ip` is counted as: an IPv4
/// address (also IPv4-mapped IPv6) as itself, an IPv6 address as its /64
/// network (its host bits zero), since one subscriber holds a whole /64.
/// The api's rate-limit buckets and the worker port's per-client connection
/// bound both use it.
pub fn client_network(ip: std::net::IpAddr) -> std::net::IpAddr {
    match ip {
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => std::net::IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                std::net::IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl ClientCounts {
    /// Counts a connection of `peer` unless its client holds `max` already,
    /// or, when the pool is down to its light reserve (`scarce`), holds
    /// [`LIGHT_CLIENT`] already.
    fn enter(self: &Arc<Self>, peer: SocketAddr, max: usize, scarce: bool) -> Option<ClientSlot> {
        let key = client_network(peer.ip());
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(key).or_insert(0);
        if *n >= max || (scarce && *n >= LIGHT_CLIENT) {
            if *n == 0 {
                map.remove(&key);
            }
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            counts: self.clone(),
            key,
        })
    }
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut map = self.counts.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.key);
            }
        }
    }
}

/// The requests of one connection, for its idle timeout: how many are open
/// and when the last one ended.
struct Requests {
    /// When the connection was accepted.
    started: Instant,
    /// Requests open now (HTTP/2: streams being served).
    open: AtomicUsize,
    /// Open requests whose answer's head is not ready yet (being handled,
    /// their body arriving; bounded by the body pace and the routes' own
    /// timeouts).
    handling: AtomicUsize,
    /// Milliseconds since `started` when the last request ended (0: none yet).
    last_ended: AtomicU64,
    /// Milliseconds since `started` when an answer's body was last asked
    /// for a frame (or an answer's head became ready). hyper asks only when
    /// it can send: over HTTP/2, while the client's flow-control window is
    /// open.
    last_answered: AtomicU64,
    /// A request's headers have arrived.
    seen: AtomicBool,
    /// Told when a request ends.
    ended: tokio::sync::Notify,
}

impl Requests {
    /// Counts a request open until the returned guard is dropped.
    fn open(self: &Arc<Self>) -> OpenRequest {
        self.seen.store(true, Ordering::Relaxed);
        self.open.fetch_add(1, Ordering::AcqRel);
        self.handling.fetch_add(1, Ordering::AcqRel);
        OpenRequest {
            requests: self.clone(),
            handling: true,
        }
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }
}

/// One open request of a connection ([`Requests::open`]); it ends when this
/// is dropped: with its answer's body, or with the service future when the
/// client resets the stream before the answer.
struct OpenRequest {
    requests: Arc<Requests>,
    /// Counted in [`Requests::handling`].
    handling: bool,
}

impl OpenRequest {
    /// The answer's head is ready: handled, now being sent.
    fn answered(mut self) -> Self {
        let r = &self.requests;
        r.last_answered.store(r.now_ms(), Ordering::Relaxed);
        r.handling.fetch_sub(1, Ordering::AcqRel);
        self.handling = false;
        self
    }
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        let r = &self.requests;
        r.last_ended.store(r.now_ms(), Ordering::Relaxed);
        if self.handling {
            r.handling.fetch_sub(1, Ordering::AcqRel);
        }
        r.open.fetch_sub(1, Ordering::AcqRel);
        r.ended.notify_one();
    }
}

/// An answer's body that keeps its request open until hyper drops it (the
/// last byte written, or the stream reset).
struct AnswerBody {
    body: HyperBody,
    open: OpenRequest,
}

impl hyper::body::Body for AnswerBody {
    type Data = bytes::Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let r = &self.open.requests;
        r.last_answered.store(r.now_ms(), Ordering::Relaxed);
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

async fn serve_connection<E>(
    stream: tokio::net::TcpStream,
    local: SocketAddr,
    peer: SocketAddr,
    ep: Arc<E>,
    limits: Limits,
    shutdown: CancellationToken,
) where
    E: Endpoint<Output = Response> + 'static,
{
    let started = Instant::now();
    let activity = Arc::new(AtomicU64::new(0));
    let io = CappedIo::new(stream, limits.read_cap).with_activity(started, activity.clone());
    let requests = Arc::new(Requests {
        started,
        open: AtomicUsize::new(0),
        handling: AtomicUsize::new(0),
        last_ended: AtomicU64::new(0),
        last_answered: AtomicU64::new(0),
        seen: AtomicBool::new(false),
        ended: tokio::sync::Notify::new(),
    });
    let tracked = requests.clone();
    let service = hyper::service::service_fn(move |req| {
        let ep = ep.clone();
        let open = tracked.open();
        async move {
            let req: poem::Request = (
                req,
                LocalAddr(Addr::SocketAddr(local)),
                RemoteAddr(Addr::SocketAddr(peer)),
                poem::http::uri::Scheme::HTTP,
            )
                .into();
            // Boxed: hyper keeps room for this future for the connection's
            // whole life; the endpoint's own (the middleware chain) then
            // takes memory only while a request is being handled.
            // `E::call`, not `Arc`'s (an `async fn` level of its own).
            let answer =
                E::call(&ep, req).map(|result| result.unwrap_or_else(|e| e.into_response()));
            let resp: hyper::Response<HyperBody> = Box::pin(answer).await.into();
            let open = open.answered();
            Ok::<_, Infallible>(resp.map(|body| AnswerBody { body, open }))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(H1_MAX_BUF)
        .keep_alive(!limits.close_after_answer);
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(H2_MAX_STREAMS)
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW)
        .max_header_list_size(H2_MAX_HEADER_LIST);
    let conn = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
    tokio::pin!(conn);
    // Idle: no byte moved for the idle timeout; or no request open for it;
    // or only answers open that hyper could not send any of for it (the
    // client's flow-control windows stay shut). The bytes of PINGs and other
    // control frames count in neither of the last two.
    let idle = async {
        let since = |ms: &AtomicU64| {
            started
                .elapsed()
                .saturating_sub(Duration::from_millis(ms.load(Ordering::Relaxed)))
        };
        loop {
            let mut left = limits.idle_timeout.saturating_sub(since(&activity));
            if requests.open.load(Ordering::Acquire) == 0 {
                left = left.min(
                    limits
                        .idle_timeout
                        .saturating_sub(since(&requests.last_ended)),
                );
            } else if requests.handling.load(Ordering::Acquire) == 0 {
                let stalled = since(&requests.last_answered);
                left = left.min(limits.idle_timeout.saturating_sub(stalled));
            }
            if limits.close_after_answer
                && requests.seen.load(Ordering::Acquire)
                && requests.open.load(Ordering::Acquire) == 0
            {
                // Answered: closed at once (HTTP/2: GOAWAY).
                return;
            }
            if left.is_zero() {
                return;
            }
            tokio::select! {
                _ = tokio::time::sleep(left) => {}
                _ = requests.ended.notified() => {}
            }
        }
    };
    // The first request's headers, over either protocol (see the module
    // documentation); later HTTP/2 streams are bounded by the idle timeout,
    // the header list size and the stream cap.
    let first_request = async {
        tokio::time::sleep(limits.header_timeout).await;
        if requests.seen.load(Ordering::Relaxed) {
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!(error = %e, %peer, "connection ended with an error");
            }
        }
        _ = idle => {
            tracing::debug!(%peer, "closing an idle connection");
            // HTTP/2: GOAWAY; HTTP/1: closed between requests.
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await;
        }
        _ = first_request => {
            tracing::debug!(%peer, "closing a connection that sent no request headers in time");
        }
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_addresses_and_names_and_refuses_a_port_in_use() {
        let l = bind("127.0.0.1", 0).await.expect("bind 127.0.0.1");
        assert!(l.local_addr().unwrap().port() > 0);
        let l = bind("localhost", 0).await.expect("bind localhost");
        assert!(l.local_addr().unwrap().ip().is_loopback());
        // A port already listened on cannot be bound again.
        let port = l.local_addr().unwrap().port();
        let taken = bind(&l.local_addr().unwrap().ip().to_string(), port).await;
        assert!(taken.is_err(), "bound a port in use");
    }
}
