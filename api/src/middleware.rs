//! Request id, body size limit, body deadline, access log, the state in
//! every request's extensions and panics as 500s.
//!
//! The middlewares every request passes through answer with combinators over
//! the inner future (`map`, `Either`) or return it as it is, instead of being
//! `async fn`s: an `async fn` level keeps its own copy of the 472-byte
//! `Request` beside the inner future, and the chain's future, boxed and
//! copied for every request, grew to 13 KiB (4.3 KiB now, BENCHMARKS.md).

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::{Duration, Instant},
};

use futures::{FutureExt as _, StreamExt as _};
use poem::{
    http::{header, HeaderValue},
    Body, Endpoint, IntoResponse, Middleware, Request, Response, Result,
};
use tracing::Instrument;

use crate::problem::Problem;

/// The server's id of the current request (a ULID the server generates, sent
/// back as `x-request-id`), in request extensions.
#[derive(Debug, Clone)]
pub struct RequestId(pub String);

/// The `x-request-id` the client sent, when it is 1–128 visible ASCII
/// characters, in request extensions. Logged and audited beside the server's
/// own [`RequestId`], never in its place.
#[derive(Debug, Clone)]
pub struct ClientRequestId(pub String);

impl RequestId {
    /// The server's and the client's ids of `req`.
    pub fn of(req: &Request) -> (Option<String>, Option<String>) {
        (
            req.extensions().get::<RequestId>().map(|r| r.0.clone()),
            req.extensions()
                .get::<ClientRequestId>()
                .map(|r| r.0.clone()),
        )
    }
}

/// Header carrying the request id in both directions.
pub const REQUEST_ID: &str = "x-request-id";

/// Assigns every request the server's own id (a new ULID), keeps the
/// client's `x-request-id` beside it when sane ([`ClientRequestId`]), opens a
/// tracing span with both, logs one line per request and returns the server's
/// id as `x-request-id` on every response.
pub struct Observe;

impl<E: Endpoint> Middleware<E> for Observe {
    type Output = ObserveEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        ObserveEndpoint(ep)
    }
}

/// See [`Observe`].
pub struct ObserveEndpoint<E>(E);

impl<E: Endpoint> Endpoint for ObserveEndpoint<E> {
    type Output = Response;

    fn call(&self, mut req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        let id = ulid::Ulid::new().to_string();
        let client = req
            .headers()
            .get(REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .filter(|v| !v.is_empty() && v.len() <= 128 && v.bytes().all(|b| b.is_ascii_graphic()))
            .map(str::to_string);
        req.extensions_mut().insert(RequestId(id.clone()));
        if let Some(c) = &client {
            req.extensions_mut().insert(ClientRequestId(c.clone()));
        }
        // Fields are formatted only when the span is enabled (not at the
        // default `RUST_LOG=warn`).
        let span = tracing::info_span!(
            "request",
            request_id = %id,
            client_request_id = client.as_deref().unwrap_or(""),
            method = %req.method(),
            path = %req.uri().path()
        );
        let started = Instant::now();
        let inner = self.0.call(req).instrument(span.clone());
        inner.map(move |result| {
            let mut resp = crate::problem::answer(result);
            if let Ok(v) = HeaderValue::from_str(&id) {
                resp.headers_mut().insert(REQUEST_ID, v);
            }
            let status = resp.status().as_u16();
            let elapsed_us = started.elapsed().as_micros() as u64;
            span.in_scope(|| {
                if status >= 500 {
                    tracing::warn!(status, elapsed_us, "request finished");
                } else {
                    tracing::debug!(status, elapsed_us, "request finished");
                }
            });
            Ok(resp)
        })
    }
}

/// Refuses bodies above `max` bytes with 413 problem details, checking both the
/// declared `Content-Length` and the bytes actually received (chunked bodies),
/// and buffers the body before the route (and the shedding gate behind it)
/// runs.
///
/// The process's body budget (`HTTP_BODY_BUDGET_BYTES`,
/// [`crate::shed::Load::body_bytes`]) guards the memory of bodies still
/// arriving: whenever the server has to wait for more of a body, the bytes
/// it has received and buffered so far are held in the budget until the body
/// is complete; a body whose bytes the budget cannot hold is answered 503
/// `overloaded`. A declared `Content-Length` reserves nothing (a promise
/// costs no memory), and a body that arrives whole without a wait (a small
/// JSON request, read with its headers) never touches the budget, so clients
/// trickling bodies cannot starve small requests: they hold what they have
/// actually sent, at most `HTTP_BODY_TIMEOUT_SECS` each (as nginx buffers a
/// body in `client_body_buffer_size` per connection and Kestrel in a
/// per-connection pipe, not against a promise).
pub struct BodyLimit {
    /// Largest body accepted, in bytes.
    pub max: usize,
    /// The process's counters (the body budget).
    pub load: Arc<crate::shed::Load>,
}

impl<E: Endpoint> Middleware<E> for BodyLimit {
    type Output = BodyLimitEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        BodyLimitEndpoint {
            inner: ep,
            max: self.max,
            load: self.load.clone(),
        }
    }
}

/// See [`BodyLimit`].
pub struct BodyLimitEndpoint<E> {
    inner: E,
    max: usize,
    load: Arc<crate::shed::Load>,
}

fn too_large(max: usize) -> Response {
    Problem::new(
        poem::http::StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        format!("the request body exceeds {max} bytes"),
        None,
    )
    .into_response()
}

const OVER_BUDGET: &str = "the server is receiving as many request bodies as it can hold \
     (HTTP_BODY_BUDGET_BYTES); retry shortly";

impl<E: Endpoint> Endpoint for BodyLimitEndpoint<E> {
    type Output = Response;

    async fn call(&self, mut req: Request) -> Result<Self::Output> {
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        if declared.is_some_and(|n| n > self.max as u64) {
            return Ok(too_large(self.max));
        }
        if req.method() != poem::http::Method::GET && req.method() != poem::http::Method::HEAD {
            // Read the whole body (at most `max` bytes) before the route runs,
            // so a slow or broken body is answered here.
            let mut held = self.load.body_bytes();
            let mut stream = req.take_body().into_bytes_stream();
            let mut buf = Vec::new();
            loop {
                let next = match stream.next().now_or_never() {
                    Some(next) => next,
                    None => {
                        // The rest is still on its way: what has arrived is
                        // held in the budget while the server waits.
                        if !held.grow(buf.len() - held.held()) {
                            return Ok(crate::shed::shed(&req, "body_budget", OVER_BUDGET));
                        }
                        stream.next().await
                    }
                };
                let Some(chunk) = next else { break };
                let chunk = match chunk {
                    Ok(c) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {
                        return Ok(body_timeout(&e));
                    }
                    Err(e) => {
                        return Ok(Problem::new(
                            poem::http::StatusCode::BAD_REQUEST,
                            "invalid_body",
                            format!("the request body could not be read: {e}"),
                            None,
                        )
                        .into_response())
                    }
                };
                if buf.len() + chunk.len() > self.max {
                    return Ok(too_large(self.max));
                }
                buf.extend_from_slice(&chunk);
            }
            // In memory now: no longer in transit.
            drop(held);
            req.set_body(Body::from(buf));
        }
        Ok(self.inner.call(req).await?.into_response())
    }
}

fn body_timeout(e: &std::io::Error) -> Response {
    let mut resp = Problem::new(
        poem::http::StatusCode::REQUEST_TIMEOUT,
        "body_timeout",
        e.to_string(),
        None,
    )
    .into_response();
    resp.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    resp
}

/// How fast a request body must arrive ([`BodyDeadline`]).
#[derive(Debug, Clone, Copy)]
pub struct BodyPace {
    /// The whole body within this time of the request's headers
    /// (`HTTP_BODY_TIMEOUT_SECS`).
    pub limit: Duration,
    /// Bytes per second the body must average since the headers once
    /// `grace` has passed (`HTTP_BODY_MIN_RATE`; 0: no minimum).
    pub min_rate: u64,
    /// How long the body may arrive slower (`HTTP_BODY_RATE_GRACE_SECS`).
    pub grace: Duration,
}

impl BodyPace {
    /// From the `HTTP_BODY_*` settings.
    pub fn from_settings(s: &entity::Settings) -> Self {
        BodyPace {
            limit: s.http_body_timeout,
            min_rate: s.http_body_min_rate,
            grace: s.http_body_rate_grace,
        }
    }
}

/// Gives every request body a deadline and a minimum data rate: when it has
/// not arrived in full `limit` after the request's headers, or has averaged
/// fewer than `min_rate` bytes per second since them once `grace` has
/// passed, reading it fails with [`std::io::ErrorKind::TimedOut`] (JSON
/// routes answer 408 `body_timeout` and close the connection). The rate is
/// what Kestrel's `MinRequestBodyDataRate` checks (240 B/s after 5 s there):
/// a client trickling its body holds a connection, a task and its buffered
/// bytes for seconds, not for the whole deadline. An empty body (a `GET`)
/// passes as it is.
///
/// A signed upload (`PUT` under [`crate::shed::UPLOADS`]) has its own pace
/// (`uploads`): it must average `UPLOAD_MIN_RATE` once the grace has passed,
/// and its deadline is the grace plus its size (the declared
/// `Content-Length`, else the largest upload) over that rate.
pub struct BodyDeadline {
    /// Every other request body's pace.
    pub pace: BodyPace,
    /// A signed upload's: `limit` is the grace plus the largest upload's
    /// bytes over `min_rate`.
    pub uploads: BodyPace,
}

impl BodyDeadline {
    /// From the `HTTP_BODY_*` settings and `UPLOAD_MIN_RATE`; `max_upload`
    /// is the largest upload body in bytes.
    pub fn from_settings(s: &entity::Settings, max_upload: u64) -> Self {
        let rate = s.upload_min_rate.max(1);
        BodyDeadline {
            pace: BodyPace::from_settings(s),
            uploads: BodyPace {
                limit: s.http_body_rate_grace + Duration::from_secs(max_upload.div_ceil(rate)),
                min_rate: rate,
                grace: s.http_body_rate_grace,
            },
        }
    }
}

impl<E: Endpoint> Middleware<E> for BodyDeadline {
    type Output = BodyDeadlineEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        BodyDeadlineEndpoint {
            inner: ep,
            pace: self.pace,
            uploads: self.uploads,
        }
    }
}

/// See [`BodyDeadline`].
pub struct BodyDeadlineEndpoint<E> {
    inner: E,
    pace: BodyPace,
    uploads: BodyPace,
}

impl<E: Endpoint> Endpoint for BodyDeadlineEndpoint<E> {
    type Output = E::Output;

    fn call(&self, mut req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        let body = req.take_body();
        if body.is_empty() {
            req.set_body(body);
        } else {
            let upload = req.method() == poem::http::Method::PUT
                && req.uri().path().starts_with(crate::shed::UPLOADS);
            let pace = if upload {
                // The deadline of its size over the floor rate.
                let declared = req
                    .headers()
                    .get(header::CONTENT_LENGTH)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.parse::<u64>().ok());
                let mut pace = self.uploads;
                if let Some(n) = declared {
                    let secs = n.div_ceil(pace.min_rate.max(1));
                    pace.limit = pace.limit.min(pace.grace + Duration::from_secs(secs));
                }
                pace
            } else {
                self.pace
            };
            req.set_body(Body::from_bytes_stream(PacedBody::new(
                body.into_bytes_stream(),
                pace,
            )));
        }
        self.inner.call(req)
    }
}

/// A request body read under a [`BodyPace`].
struct PacedBody<S> {
    body: S,
    pace: BodyPace,
    started: tokio::time::Instant,
    /// Wakes at the next deadline or rate check.
    timer: Pin<Box<tokio::time::Sleep>>,
    received: u64,
    /// The end, a timeout included, was returned: `None` from now on
    /// (readers such as multer and the drain may poll again).
    done: bool,
}

impl<S> PacedBody<S> {
    fn new(body: S, pace: BodyPace) -> Self {
        let started = tokio::time::Instant::now();
        let mut paced = PacedBody {
            body,
            pace,
            started,
            timer: Box::pin(tokio::time::sleep_until(started)),
            received: 0,
            done: false,
        };
        let first = paced.next_check();
        paced.timer.as_mut().reset(first);
        paced
    }

    /// The next instant the body could fail: its deadline, or the time at
    /// which what has arrived falls below the minimum average rate (never
    /// before the grace period ends).
    fn next_check(&self) -> tokio::time::Instant {
        let deadline = self.started + self.pace.limit;
        if self.pace.min_rate == 0 {
            return deadline;
        }
        let covered = Duration::from_secs_f64(self.received as f64 / self.pace.min_rate as f64);
        let at = self.started + covered.max(self.pace.grace) + Duration::from_millis(10);
        at.min(deadline)
    }

    /// Why the body fails at `now`, if it does.
    fn failure(&self, now: tokio::time::Instant) -> Option<String> {
        let elapsed = now - self.started;
        if elapsed >= self.pace.limit {
            return Some(format!(
                "the request body did not arrive within {} s",
                self.pace.limit.as_secs()
            ));
        }
        let owed = self.pace.min_rate as f64 * elapsed.as_secs_f64();
        (self.pace.min_rate > 0 && elapsed >= self.pace.grace && (self.received as f64) < owed)
            .then(|| {
                format!(
                    "the request body arrived slower than {} bytes per second",
                    self.pace.min_rate
                )
            })
    }
}

impl<S> futures::Stream for PacedBody<S>
where
    S: futures::Stream<Item = std::io::Result<bytes::Bytes>> + Unpin,
{
    type Item = std::io::Result<bytes::Bytes>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        match this.body.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(chunk))) => {
                this.received += chunk.len() as u64;
                return Poll::Ready(Some(Ok(chunk)));
            }
            Poll::Ready(None) => {
                this.done = true;
                return Poll::Ready(None);
            }
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
            Poll::Pending => {}
        }
        // Waiting for data: check the pace whenever the timer fires.
        while this.timer.as_mut().poll(cx).is_ready() {
            if let Some(why) = this.failure(tokio::time::Instant::now()) {
                this.done = true;
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    why,
                ))));
            }
            let next = this.next_check();
            this.timer.as_mut().reset(next);
        }
        Poll::Pending
    }
}

/// Reads and discards what is left of a request body after a refusal, up to
/// `max_bytes` within `max_time`, before the answer goes out.
///
/// A route that refuses an upload early (bad token, declared size too large,
/// wrong magic bytes) answers before reading the body. Closing an HTTP/1.1
/// connection with unread data makes the kernel reset it, and a client still
/// sending gets a connection error instead of the 4xx. Draining a bounded
/// amount lets every upload within the hard limit see its answer; a body
/// beyond the limit still gets the answer with `Connection: close`.
pub struct DrainBody {
    /// Most bytes read and discarded after a refusal.
    pub max_bytes: u64,
    /// Longest time spent discarding.
    pub max_time: std::time::Duration,
}

impl<E: Endpoint> Middleware<E> for DrainBody {
    type Output = DrainBodyEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        DrainBodyEndpoint {
            inner: ep,
            max_bytes: self.max_bytes,
            max_time: self.max_time,
        }
    }
}

/// See [`DrainBody`].
pub struct DrainBodyEndpoint<E> {
    inner: E,
    max_bytes: u64,
    max_time: std::time::Duration,
}

type SharedBody = std::sync::Arc<
    std::sync::Mutex<futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>>,
>;

/// The request body as handed to the route: it reads from the shared stream,
/// so what the route leaves unread is still there for the drain.
struct SharedBodyStream(SharedBody);

impl futures::Stream for SharedBodyStream {
    type Item = std::io::Result<bytes::Bytes>;
    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        let mut inner = self.0.lock().expect("body stream lock poisoned");
        inner.poll_next_unpin(cx)
    }
}

impl<E: Endpoint> Endpoint for DrainBodyEndpoint<E> {
    type Output = Response;

    async fn call(&self, mut req: Request) -> Result<Self::Output> {
        let shared: SharedBody = std::sync::Arc::new(std::sync::Mutex::new(
            req.take_body().into_bytes_stream().boxed(),
        ));
        req.set_body(Body::from_bytes_stream(SharedBodyStream(shared.clone())));
        let mut resp = crate::problem::answer(self.inner.call(req).await);
        if !resp.status().is_success() {
            let mut rest = SharedBodyStream(shared);
            let mut read: u64 = 0;
            let drained = tokio::time::timeout(self.max_time, async {
                while let Some(chunk) = rest.next().await {
                    let Ok(chunk) = chunk else { return false };
                    read += chunk.len() as u64;
                    if read > self.max_bytes {
                        return false;
                    }
                }
                true
            })
            .await
            .unwrap_or(false);
            if !drained || resp.status() == poem::http::StatusCode::REQUEST_TIMEOUT {
                resp.headers_mut()
                    .insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
        }
        Ok(resp)
    }
}

/// Puts a clone of `T` in every request's extensions, for `Data<&T>`
/// extractors (poem's `EndpointExt::data` without an `async fn` level: see
/// the module documentation).
pub struct Provide<T>(pub T);

impl<E: Endpoint, T: Clone + Send + Sync + 'static> Middleware<E> for Provide<T> {
    type Output = ProvideEndpoint<E, T>;
    fn transform(&self, ep: E) -> Self::Output {
        ProvideEndpoint {
            inner: ep,
            value: self.0.clone(),
        }
    }
}

/// See [`Provide`].
pub struct ProvideEndpoint<E, T> {
    inner: E,
    value: T,
}

impl<E: Endpoint, T: Clone + Send + Sync + 'static> Endpoint for ProvideEndpoint<E, T> {
    type Output = E::Output;

    fn call(&self, mut req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        req.extensions_mut().insert(self.value.clone());
        self.inner.call(req)
    }
}

/// Answers a request whose handler panicked with 500 problem details
/// (`internal_error`, logged as "handler panicked") instead of dropping the
/// connection; other requests on the server go on.
pub struct CatchPanics;

impl<E: Endpoint> Middleware<E> for CatchPanics {
    type Output = CatchPanicsEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        CatchPanicsEndpoint(ep)
    }
}

/// See [`CatchPanics`].
pub struct CatchPanicsEndpoint<E>(E);

impl<E: Endpoint> Endpoint for CatchPanicsEndpoint<E> {
    type Output = Response;

    fn call(&self, req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        AssertUnwindSafe(self.0.call(req))
            .catch_unwind()
            .map(|outcome| match outcome {
                Ok(result) => result.map(IntoResponse::into_response),
                Err(_) => {
                    tracing::error!("handler panicked");
                    Ok(crate::problem::ApiError::internal("handler panicked")
                        .problem()
                        .into_response())
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use poem::{endpoint::make, http::StatusCode, EndpointExt as _};

    use super::*;

    type Chunks = futures::channel::mpsc::UnboundedSender<std::io::Result<bytes::Bytes>>;

    fn paced(
        min_rate: u64,
        grace_ms: u64,
        limit_ms: u64,
    ) -> (
        Chunks,
        impl futures::Stream<Item = std::io::Result<bytes::Bytes>>,
    ) {
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let pace = BodyPace {
            limit: Duration::from_millis(limit_ms),
            min_rate,
            grace: Duration::from_millis(grace_ms),
        };
        (tx, PacedBody::new(rx, pace))
    }

    #[tokio::test]
    async fn a_body_below_the_minimum_rate_fails_once_the_grace_is_over() {
        // 100 bytes at 1000 B/s cover 100 ms: the body fails at the end of
        // the 300 ms grace, long before its 60 s deadline.
        let (tx, body) = paced(1000, 300, 60_000);
        let mut body = std::pin::pin!(body);
        tx.unbounded_send(Ok(bytes::Bytes::from(vec![b' '; 100])))
            .expect("send");
        assert_eq!(body.next().await.expect("a chunk").expect("ok").len(), 100);
        let started = Instant::now();
        let err = body.next().await.expect("an error").expect_err("too slow");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("1000 bytes per second"), "{err}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{:?}",
            started.elapsed()
        );
        assert!(body.next().await.is_none(), "ended after the timeout");
        drop(tx);
    }

    #[tokio::test]
    async fn a_body_at_the_minimum_rate_arrives_and_a_late_one_hits_the_deadline() {
        // 1000 bytes at once cover a second at 1000 B/s: past the 100 ms
        // grace the body is still on pace for that second.
        let (tx, body) = paced(1000, 100, 60_000);
        let mut body = std::pin::pin!(body);
        tx.unbounded_send(Ok(bytes::Bytes::from(vec![b' '; 1000])))
            .expect("send");
        assert!(body.next().await.expect("a chunk").is_ok());
        let waiting = tokio::time::timeout(Duration::from_millis(400), body.next()).await;
        assert!(waiting.is_err(), "failed while on pace: {waiting:?}");
        tx.unbounded_send(Ok(bytes::Bytes::from_static(b"{}")))
            .expect("send");
        drop(tx);
        assert!(body.next().await.expect("a chunk").is_ok());
        assert!(body.next().await.is_none(), "the end");

        // No minimum: only the deadline.
        let (tx, body) = paced(0, 100, 300);
        let mut body = std::pin::pin!(body);
        let err = body.next().await.expect("an error").expect_err("late");
        assert!(err.to_string().contains("did not arrive within"), "{err}");
        drop(tx);
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_500_problem_and_the_next_request_is_served() {
        let ep = make(|req: Request| async move {
            if req.uri().path() == "/boom" {
                panic!("handler bug");
            }
            "fine"
        })
        .with(CatchPanics);
        let resp = ep
            .call(Request::builder().uri_str("/boom").finish())
            .await
            .expect("an answer, not an error");
        assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(
            resp.headers()
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        let body = resp.into_body().into_string().await.expect("body");
        assert!(body.contains("\"status\":500"), "{body}");
        let resp = ep
            .call(Request::builder().uri_str("/ok").finish())
            .await
            .expect("served");
        assert_eq!(resp.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn provide_puts_the_value_in_every_request() {
        let ep = make(|req: Request| async move {
            req.extensions()
                .get::<u32>()
                .map_or("missing".to_string(), u32::to_string)
        })
        .with(Provide(7_u32));
        assert_eq!(ep.call(Request::default()).await.expect("served"), "7");
    }
}
