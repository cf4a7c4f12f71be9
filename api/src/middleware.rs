//! Request id, body size limit, body deadline, access log, the state in
//! every request's extensions and panics as 500s.
//!
//! The middlewares every request passes through answer with combinators over
//! the inner future (`map`, `Either`) or return it as it is, instead of being
//! `async fn`s: an `async fn` level keeps its own copy of the 472-byte
//! `Request` beside the inner future, and the chain's future, boxed and
//! copied for every request, grew to 13 KiB (4.3 KiB now, BENCHMARKS.md).

use std::{future::Future, panic::AssertUnwindSafe, time::Instant};

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
/// declared `Content-Length` and the bytes actually received (chunked bodies).
pub struct BodyLimit(pub usize);

impl<E: Endpoint> Middleware<E> for BodyLimit {
    type Output = BodyLimitEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        BodyLimitEndpoint {
            inner: ep,
            max: self.0,
        }
    }
}

/// See [`BodyLimit`].
pub struct BodyLimitEndpoint<E> {
    inner: E,
    max: usize,
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
            let mut stream = req.take_body().into_bytes_stream();
            let mut buf = Vec::new();
            while let Some(chunk) = stream.next().await {
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

/// Gives every request body a deadline: when it has not arrived in full
/// that long after the request's headers, reading it fails with
/// [`std::io::ErrorKind::TimedOut`] (`HTTP_BODY_TIMEOUT_SECS`; JSON routes
/// answer 408 `body_timeout`).
pub struct BodyDeadline(pub std::time::Duration);

impl<E: Endpoint> Middleware<E> for BodyDeadline {
    type Output = BodyDeadlineEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        BodyDeadlineEndpoint {
            inner: ep,
            limit: self.0,
        }
    }
}

/// See [`BodyDeadline`].
pub struct BodyDeadlineEndpoint<E> {
    inner: E,
    limit: std::time::Duration,
}

impl<E: Endpoint> Endpoint for BodyDeadlineEndpoint<E> {
    type Output = E::Output;

    fn call(&self, mut req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        let secs = self.limit.as_secs();
        let deadline = tokio::time::sleep(self.limit);
        let body = req.take_body().into_bytes_stream();
        let stream = futures::stream::unfold(
            (Box::pin(body), Box::pin(deadline), false),
            move |(mut body, mut deadline, done)| async move {
                if done {
                    return None;
                }
                tokio::select! {
                    chunk = body.next() => chunk.map(|c| (c, (body, deadline, false))),
                    _ = deadline.as_mut() => Some((
                        Err(std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            format!("the request body did not arrive within {secs} s"),
                        )),
                        (body, deadline, true),
                    )),
                }
            },
        );
        // Fused: readers (multer, the drain) may poll again after the end.
        req.set_body(Body::from_bytes_stream(stream.fuse()));
        self.inner.call(req)
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
            if !drained {
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
