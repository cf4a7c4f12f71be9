//! Load shedding: past `HTTP_MAX_IN_FLIGHT` requests being handled by this
//! process, a request is answered 503 `overloaded` with `Retry-After` at
//! once, before any work (no database, no queue), instead of waiting behind
//! the others. A request counts from the moment its body is in memory (the
//! gate stands behind [`crate::middleware::BodyLimit`], which buffers JSON
//! bodies of at most 64 KiB) until its response head is ready; a streamed
//! response body does not hold the slot. So a client sending its body slowly
//! holds no slot: bodies in transit are bounded instead by their minimum
//! data rate ([`crate::middleware::BodyDeadline`]) and by a budget of the
//! bytes they have sent while the rest is awaited, all of them together
//! (`HTTP_BODY_BUDGET_BYTES`, [`Load::body_bytes`]).
//! Avatar uploads (`/storage`) stream their body through the handler: they
//! hold a slot while it arrives (at the minimum rate at least), and a
//! refused one gives it back before its rest is drained.
//!
//! Over HTTP/1 a shed request's answer also closes its connection
//! (`Connection: close`): a client told to come back later holds no socket,
//! buffers or task of an overloaded process meanwhile (~20 KiB each). Over
//! HTTP/2 the connection carries other streams and stays open.
//!
//! Never shed: `GET /api/health`, `GET /auth/v1/health` and `/metrics` (the
//! platform's probes and Prometheus must see an overloaded process), and the
//! AI routes (the chat stream and one-shot generation), which wait on the AI
//! provider for seconds while using little CPU: they have their own bound
//! instead, at most `AI_MAX_OPEN_STREAMS` at once per process, a slot taken
//! once the request body is in memory and held until the answer's last byte
//! is written or the client goes away.

use std::{
    future::Future,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

use futures::{
    future::{ready, Either},
    FutureExt as _, StreamExt as _,
};
use poem::{
    http::{header, HeaderValue, Method, StatusCode, Version},
    Body, Endpoint, IntoResponse, Middleware, Request, Response, Result,
};

use crate::problem::Problem;

/// `Retry-After` of a shed request, in seconds.
pub const RETRY_AFTER_SECS: u64 = 1;

/// The AI chat route, bounded by `AI_MAX_OPEN_STREAMS` instead.
pub const AI_CHAT: &str = "/api/ai/chat";
/// The AI generation route, bounded by `AI_MAX_OPEN_STREAMS` too.
pub const AI_GENERATE: &str = "/api/ai/generate";

/// Paths never shed.
pub const NEVER_SHED: [&str; 3] = ["/api/health", "/auth/v1/health", "/metrics"];

/// The counters of one api process (shared with `/metrics`).
#[derive(Debug, Default)]
pub struct Load {
    in_flight: AtomicUsize,
    streams: AtomicUsize,
    bodies: AtomicUsize,
    max_in_flight: usize,
    max_streams: usize,
    max_bodies: usize,
}

impl Load {
    /// Bounds: `max_in_flight` requests (0: none), `max_streams` open AI
    /// requests, `body_budget` bytes of request bodies in transit.
    pub fn new(max_in_flight: usize, max_streams: usize, body_budget: usize) -> Arc<Self> {
        Arc::new(Load {
            max_in_flight,
            max_streams,
            max_bodies: body_budget,
            ..Default::default()
        })
    }

    /// Bytes of request bodies held in the budget now: received and
    /// buffered while the rest of their body is awaited ([`Load::body_bytes`]).
    pub fn bodies_in_transit(&self) -> usize {
        self.bodies.load(Ordering::Relaxed)
    }

    /// A holder of body-budget bytes for one arriving body, holding none yet:
    /// it [`BodyBytes::grow`]s with the bytes received while the server
    /// waits for the rest (see [`crate::middleware::BodyLimit`]).
    pub fn body_bytes(self: &Arc<Self>) -> BodyBytes {
        BodyBytes {
            load: self.clone(),
            held: 0,
        }
    }

    /// Requests being handled now that count toward `HTTP_MAX_IN_FLIGHT`.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// AI chat streams open now.
    pub fn open_streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }
}

fn in_flight(l: &Load) -> &AtomicUsize {
    &l.in_flight
}

fn streams(l: &Load) -> &AtomicUsize {
    &l.streams
}

/// Bytes of the body budget held by one request body while it arrives;
/// given back on drop.
#[derive(Debug)]
pub struct BodyBytes {
    load: Arc<Load>,
    held: usize,
}

impl BodyBytes {
    /// Holds `more` bytes more; `false` (and nothing more held) when the
    /// budget cannot hold them.
    pub fn grow(&mut self, more: usize) -> bool {
        if more == 0 {
            return true;
        }
        let c = &self.load.bodies;
        let before = c.fetch_add(more, Ordering::AcqRel);
        if before.saturating_add(more) > self.load.max_bodies {
            c.fetch_sub(more, Ordering::AcqRel);
            return false;
        }
        self.held += more;
        true
    }

    /// Bytes held.
    pub fn held(&self) -> usize {
        self.held
    }
}

impl Drop for BodyBytes {
    fn drop(&mut self) {
        self.load.bodies.fetch_sub(self.held, Ordering::AcqRel);
    }
}

/// A taken slot; given back on drop.
struct Slot(Arc<Load>, fn(&Load) -> &AtomicUsize);

impl Slot {
    fn take(load: &Arc<Load>, counter: fn(&Load) -> &AtomicUsize, max: usize) -> Option<Slot> {
        let c = counter(load);
        if c.fetch_add(1, Ordering::AcqRel) >= max {
            c.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(Slot(load.clone(), counter))
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        (self.1)(&self.0).fetch_sub(1, Ordering::AcqRel);
    }
}

/// The 503 of a shed request: problem details `overloaded`, `Retry-After`.
pub fn overloaded(detail: &str) -> Response {
    let mut resp =
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "overloaded", detail, None).into_response();
    resp.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    resp
}

/// [`overloaded`], counted under `reason` (`http_requests_shed_total`),
/// closing an HTTP/1 connection (see the module documentation).
pub fn shed(req: &Request, reason: &'static str, detail: &str) -> Response {
    if worker::metrics::enabled() {
        metrics::counter!(worker::metrics::HTTP_SHED, "reason" => reason).increment(1);
    }
    let mut resp = overloaded(detail);
    if req.version() < Version::HTTP_2 {
        resp.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    resp
}

/// The shedding gate (see the module documentation).
pub struct Shed(pub Arc<Load>);

impl<E: Endpoint> Middleware<E> for Shed {
    type Output = ShedEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        ShedEndpoint {
            inner: ep,
            load: self.0.clone(),
        }
    }
}

/// See [`Shed`].
pub struct ShedEndpoint<E> {
    inner: E,
    load: Arc<Load>,
}

impl<E: Endpoint> Endpoint for ShedEndpoint<E> {
    type Output = Response;

    fn call(&self, req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        // (Combinators, not an `async fn`: see `crate::middleware`.)
        let refuse =
            |req: &Request, reason, detail| Either::Left(ready(Ok(shed(req, reason, detail))));
        // `slot` is held until the answer is ready, or with `for_body` until
        // the body's end.
        let admit = |req, slot: Option<Slot>, for_body: bool| {
            Either::Right(self.inner.call(req).map(move |r| {
                let mut resp = r?.into_response();
                if let Some(slot) = slot.filter(|_| for_body) {
                    // The slot lives as long as the body: the stream's end, or
                    // the client going away (hyper drops the body), gives it back.
                    let body = resp.take_body().into_bytes_stream();
                    let held = body.map(move |chunk| {
                        let _ = &slot;
                        chunk
                    });
                    resp.set_body(Body::from_bytes_stream(held));
                }
                Ok(resp)
            }))
        };
        let path = req.uri().path();
        if NEVER_SHED.contains(&path) {
            return admit(req, None, false);
        }
        if (path == AI_CHAT || path == AI_GENERATE) && req.method() == Method::POST {
            return match Slot::take(&self.load, streams, self.load.max_streams) {
                Some(slot) => admit(req, Some(slot), true),
                None => refuse(
                    &req,
                    "ai_streams",
                    "too many AI requests are open on this server (AI_MAX_OPEN_STREAMS); retry shortly",
                ),
            };
        }
        if self.load.max_in_flight == 0 {
            return admit(req, None, false);
        }
        match Slot::take(&self.load, in_flight, self.load.max_in_flight) {
            Some(slot) => admit(req, Some(slot), false),
            None => refuse(
                &req,
                "in_flight",
                "the server is handling as many requests as it can (HTTP_MAX_IN_FLIGHT); retry shortly",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use poem::{endpoint::make, EndpointExt};

    #[tokio::test]
    async fn sheds_past_the_bound_and_gives_slots_back() {
        let load = Load::new(2, 1, 1 << 20);
        let gate = tokio::sync::Semaphore::new(0);
        let gate = Arc::new(gate);
        let g = gate.clone();
        let ep = make(move |_req| {
            let g = g.clone();
            async move {
                g.acquire().await.expect("open").forget();
                "done"
            }
        })
        .with(Shed(load.clone()));
        let ep = Arc::new(ep);
        let call = |path: &'static str| {
            let ep = ep.clone();
            tokio::spawn(async move {
                ep.call(Request::builder().uri_str(path).finish())
                    .await
                    .expect("answer")
            })
        };
        let (a, b) = (call("/api/waitlist"), call("/api/contact"));
        while load.in_flight() < 2 {
            tokio::task::yield_now().await;
        }
        let third = call("/api/contact").await.expect("task");
        assert_eq!(third.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(third.headers()[header::RETRY_AFTER], "1");
        assert_eq!(
            third.headers()[header::CONNECTION],
            "close",
            "a refused HTTP/1 client holds no connection"
        );
        // Health is never shed (it waits for the gate like any request).
        let health = call("/api/health");
        gate.add_permits(3);
        for r in [a, b, health] {
            assert_eq!(r.await.expect("task").status(), StatusCode::OK);
        }
        assert_eq!(load.in_flight(), 0, "every slot was given back");
    }

    #[test]
    fn the_body_budget_is_held_and_given_back() {
        let load = Load::new(1, 1, 100);
        let mut a = load.body_bytes();
        assert_eq!(load.bodies_in_transit(), 0, "a new holder holds nothing");
        assert!(a.grow(60), "60 of 100 fit");
        assert!(!load.body_bytes().grow(50), "60 + 50 exceed 100");
        assert_eq!(load.bodies_in_transit(), 60, "a refusal holds nothing");
        assert!(a.grow(40));
        assert_eq!(load.bodies_in_transit(), 100);
        assert!(!a.grow(1), "the budget is full");
        assert_eq!(a.held(), 100);
        drop(a);
        assert_eq!(load.bodies_in_transit(), 0, "given back on drop");
    }

    #[tokio::test]
    async fn an_ai_stream_holds_its_slot_until_its_body_is_gone() {
        let load = Load::new(1, 1, 1 << 20);
        let ep = make(|_req| async {
            Body::from_bytes_stream(futures::stream::pending::<std::io::Result<bytes::Bytes>>())
        })
        .with(Shed(load.clone()));
        let chat = || {
            Request::builder()
                .method(Method::POST)
                .uri_str(AI_CHAT)
                .finish()
        };
        let open = ep.call(chat()).await.expect("answer");
        assert_eq!(open.status(), StatusCode::OK);
        assert_eq!(load.open_streams(), 1);
        assert_eq!(
            load.in_flight(),
            0,
            "streams do not count toward HTTP_MAX_IN_FLIGHT"
        );
        let second = ep.call(chat()).await.expect("answer");
        assert_eq!(second.status(), StatusCode::SERVICE_UNAVAILABLE);
        drop(open);
        assert_eq!(load.open_streams(), 0, "the client went away");
        assert_eq!(
            ep.call(chat()).await.expect("answer").status(),
            StatusCode::OK
        );
    }
}
