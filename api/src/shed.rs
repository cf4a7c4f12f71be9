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
//! Avatar uploads (`PUT /storage/v1/object/upload/…`) stream their body
//! through the handler: they hold a slot while the route checks the grant
//! (before a byte of the body is read), give it back before they await the
//! body ([`UploadAdmission::begin`]), and count in a pool of their own
//! instead while it arrives: at most `HTTP_MAX_UPLOADS` per process and
//! `HTTP_MAX_UPLOADS_PER_USER` per user (the grant's subject). Finishing a
//! received upload (the database transaction, the object put in place)
//! counts in flight again, without being refused.
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

/// The path prefix of the signed uploads (`PUT`), admitted by
/// [`UploadAdmission`].
pub const UPLOADS: &str = "/storage/v1/object/upload/";

/// The counters of one api process (shared with `/metrics`).
#[derive(Debug, Default)]
pub struct Load {
    in_flight: AtomicUsize,
    streams: AtomicUsize,
    bodies: AtomicUsize,
    uploads: AtomicUsize,
    uploads_by_user: std::sync::Mutex<std::collections::HashMap<uuid::Uuid, usize>>,
    max_in_flight: usize,
    max_streams: usize,
    max_bodies: usize,
    max_uploads: usize,
    max_uploads_per_user: usize,
    /// An AI answer whose reader asks for nothing for this long is
    /// cancelled (`AI_STREAM_STALL_SECS`; `None`: never).
    ai_stall: Option<std::time::Duration>,
}

impl Load {
    /// Bounds: `max_in_flight` requests (0: none), `max_streams` open AI
    /// requests, `body_budget` bytes of request bodies in transit.
    pub fn new(max_in_flight: usize, max_streams: usize, body_budget: usize) -> Arc<Self> {
        Arc::new(Load {
            max_in_flight,
            max_streams,
            max_bodies: body_budget,
            max_uploads: usize::MAX,
            max_uploads_per_user: usize::MAX,
            ..Default::default()
        })
    }

    /// The bounds of the settings: `HTTP_MAX_IN_FLIGHT`,
    /// `AI_MAX_OPEN_STREAMS`, `HTTP_BODY_BUDGET_BYTES`, the upload pool
    /// (`HTTP_MAX_UPLOADS`, `HTTP_MAX_UPLOADS_PER_USER`) and the stalled AI
    /// reader's deadline (`AI_STREAM_STALL_SECS`).
    pub fn from_settings(s: &entity::Settings) -> Arc<Self> {
        Arc::new(Load {
            max_in_flight: s.http_max_in_flight,
            max_streams: s.ai_max_open_streams,
            max_bodies: s.http_body_budget,
            max_uploads: s.http_max_uploads,
            max_uploads_per_user: s.http_max_uploads_per_user,
            ai_stall: Some(s.ai_stream_stall),
            ..Default::default()
        })
    }

    /// Uploads whose body is arriving (or being finished) now.
    pub fn uploads(&self) -> usize {
        self.uploads.load(Ordering::Relaxed)
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

/// Why an upload was not admitted to the upload pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadRefused {
    /// The user has `HTTP_MAX_UPLOADS_PER_USER` uploads arriving already.
    PerUser(usize),
    /// The process has `HTTP_MAX_UPLOADS` uploads arriving already.
    Pool,
}

/// One upload counted in the pool (and for its user) until dropped.
#[derive(Debug)]
pub struct UploadSlot {
    load: Arc<Load>,
    user: uuid::Uuid,
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        self.load.uploads.fetch_sub(1, Ordering::AcqRel);
        let mut by_user = self
            .load
            .uploads_by_user
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = by_user.get_mut(&self.user) {
            *n -= 1;
            if *n == 0 {
                by_user.remove(&self.user);
            }
        }
    }
}

/// A finishing upload counted in flight (never refused); given back on drop.
pub struct Finishing(#[allow(dead_code)] Slot);

/// An upload request's admission, in its request extensions: the in-flight
/// slot taken by the gate while the route checks the grant, and the switch
/// to the upload pool before the body is awaited.
pub struct UploadAdmission {
    load: Arc<Load>,
    slot: std::sync::Mutex<Option<Slot>>,
}

impl UploadAdmission {
    /// Gives the in-flight slot back (the server now waits for the client)
    /// and counts the upload of `user` in the upload pool instead; refused
    /// (the slot still given back) past either bound.
    pub fn begin(&self, user: uuid::Uuid) -> Result<UploadSlot, UploadRefused> {
        drop(self.slot.lock().unwrap_or_else(|e| e.into_inner()).take());
        let load = &self.load;
        let mut by_user = load
            .uploads_by_user
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mine = by_user.get(&user).copied().unwrap_or(0);
        if mine >= load.max_uploads_per_user {
            return Err(UploadRefused::PerUser(load.max_uploads_per_user));
        }
        if load.uploads.fetch_add(1, Ordering::AcqRel) >= load.max_uploads {
            load.uploads.fetch_sub(1, Ordering::AcqRel);
            return Err(UploadRefused::Pool);
        }
        *by_user.entry(user).or_insert(0) += 1;
        Ok(UploadSlot {
            load: load.clone(),
            user,
        })
    }

    /// The body has arrived: the server works again (the transaction, the
    /// object put in place), counted in flight without a refusal (the work
    /// of a received upload is not thrown away).
    pub fn finishing(&self) -> Finishing {
        self.load.in_flight.fetch_add(1, Ordering::AcqRel);
        Finishing(Slot(self.load.clone(), in_flight))
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
        // An upload's own refusals (its pool, its user's bound) carry
        // `Retry-After` like a shed request's (`retry`).
        let stall = self.load.ai_stall;
        let admit = |req, slot: Option<Slot>, for_body: bool, retry: bool| {
            Either::Right(self.inner.call(req).map(move |r| {
                // A route's error answer comes as an error: made the response
                // here when its headers may change.
                let mut resp = if retry {
                    crate::problem::answer(r)
                } else {
                    r?.into_response()
                };
                let status = resp.status();
                if retry
                    && (status == StatusCode::TOO_MANY_REQUESTS
                        || status == StatusCode::SERVICE_UNAVAILABLE)
                {
                    resp.headers_mut()
                        .entry(header::RETRY_AFTER)
                        .or_insert(HeaderValue::from(RETRY_AFTER_SECS));
                }
                if let Some(slot) = slot.filter(|_| for_body) {
                    // The slot lives as long as the body: the stream's end, or
                    // the client going away (hyper drops the body), gives it
                    // back; so does a reader that stalls (`stall`).
                    let body = resp.take_body().into_bytes_stream().boxed();
                    match stall {
                        Some(stall) => resp
                            .set_body(Body::from_bytes_stream(Watched::start(body, slot, stall))),
                        None => {
                            let held = body.map(move |chunk| {
                                let _ = &slot;
                                chunk
                            });
                            resp.set_body(Body::from_bytes_stream(held));
                        }
                    }
                }
                Ok(resp)
            }))
        };
        let path = req.uri().path();
        if NEVER_SHED.contains(&path) {
            return admit(req, None, false, false);
        }
        if (path == AI_CHAT || path == AI_GENERATE) && req.method() == Method::POST {
            return match Slot::take(&self.load, streams, self.load.max_streams) {
                Some(slot) => admit(req, Some(slot), true, false),
                None => refuse(
                    &req,
                    "ai_streams",
                    "too many AI requests are open on this server (AI_MAX_OPEN_STREAMS); retry shortly",
                ),
            };
        }
        let upload = req.method() == Method::PUT && path.starts_with(UPLOADS);
        let max = match self.load.max_in_flight {
            0 if !upload => return admit(req, None, false, false),
            0 => usize::MAX,
            n => n,
        };
        match Slot::take(&self.load, in_flight, max) {
            Some(slot) if upload => {
                // The route gives the slot back before it awaits the body.
                let mut req = req;
                req.extensions_mut().insert(Arc::new(UploadAdmission {
                    load: self.load.clone(),
                    slot: std::sync::Mutex::new(Some(slot)),
                }));
                admit(req, None, false, true)
            }
            Some(slot) => admit(req, Some(slot), false, false),
            None => refuse(
                &req,
                "in_flight",
                "the server is handling as many requests as it can (HTTP_MAX_IN_FLIGHT); retry shortly",
            ),
        }
    }
}

type Chunks = futures::stream::BoxStream<'static, std::io::Result<bytes::Bytes>>;

/// What a watched AI answer holds.
enum Watch {
    /// Streaming: the answer's stream (dropping it charges the usage as an
    /// abort) and its `AI_MAX_OPEN_STREAMS` slot.
    Live(Chunks, #[allow(dead_code)] Slot),
    /// Ended normally.
    Ended,
    /// Cancelled: its reader stalled.
    Cancelled,
}

/// The state a watched AI answer shares with its watchdog.
struct Watching {
    watch: std::sync::Mutex<Watch>,
    started: std::time::Instant,
    /// Milliseconds since `started` (at least 1) when the body last handed a
    /// chunk over (or its head was ready) and was not asked for the next
    /// one since; 0 while it is being asked (waiting for the provider).
    handed: std::sync::atomic::AtomicU64,
}

impl Watching {
    fn now_ms(&self) -> u64 {
        (self.started.elapsed().as_millis() as u64).max(1)
    }
}

/// An AI answer's body whose reader may stall. hyper asks a body for its
/// next chunk only when it can send it (HTTP/2: the client's flow-control
/// window is open; HTTP/1: the socket takes more), so an answer not asked
/// for `stall` after it handed a chunk over (or after its head was ready)
/// has a reader that stopped reading: its stream is dropped (the provider's
/// request ends and the usage is charged as an abort) and its slot given
/// back, instead of holding them until the connection's idle timeout. Its
/// reader, should it ever ask again, gets an error (the answer is cut off,
/// never ended as if complete). Waiting for the provider is not a stall: the
/// body is being asked then.
struct Watched(Arc<Watching>);

impl Watched {
    fn start(body: Chunks, slot: Slot, stall: std::time::Duration) -> Self {
        let shared = Arc::new(Watching {
            watch: std::sync::Mutex::new(Watch::Live(body, slot)),
            started: std::time::Instant::now(),
            handed: std::sync::atomic::AtomicU64::new(1),
        });
        let weak = Arc::downgrade(&shared);
        let stall_ms = stall.as_millis() as u64;
        let tick = (stall / 4).max(std::time::Duration::from_millis(50));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(tick).await;
                let Some(w) = weak.upgrade() else { return };
                let handed = w.handed.load(Ordering::Acquire);
                if handed == 0 || w.now_ms().saturating_sub(handed) < stall_ms {
                    continue;
                }
                let mut watch = w.watch.lock().unwrap_or_else(|e| e.into_inner());
                if !matches!(*watch, Watch::Live(..)) {
                    return;
                }
                // Dropped outside the lock: the usage guard queues its record.
                let live = std::mem::replace(&mut *watch, Watch::Cancelled);
                drop(watch);
                tracing::info!("an AI answer's reader stalled (AI_STREAM_STALL_SECS); cancelled");
                drop(live);
                return;
            }
        });
        Watched(shared)
    }
}

impl futures::Stream for Watched {
    type Item = std::io::Result<bytes::Bytes>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        use std::task::Poll;
        let w = &self.0;
        let mut watch = w.watch.lock().unwrap_or_else(|e| e.into_inner());
        let body = match &mut *watch {
            Watch::Live(body, _) => body,
            Watch::Ended => return Poll::Ready(None),
            Watch::Cancelled => {
                *watch = Watch::Ended;
                return Poll::Ready(Some(Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "the reader stalled: the answer was cancelled",
                ))));
            }
        };
        w.handed.store(0, Ordering::Release);
        match body.poll_next_unpin(cx) {
            Poll::Ready(Some(chunk)) => {
                w.handed.store(w.now_ms(), Ordering::Release);
                Poll::Ready(Some(chunk))
            }
            Poll::Ready(None) => {
                let ended = std::mem::replace(&mut *watch, Watch::Ended);
                drop(watch);
                drop(ended);
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
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
    async fn an_ai_answer_whose_reader_stalls_is_cancelled_and_its_slot_given_back() {
        let load = Load::new(1, 1, 1 << 20);
        let stall = std::time::Duration::from_millis(200);
        let (tx, rx) = futures::channel::mpsc::unbounded::<std::io::Result<bytes::Bytes>>();
        let dropped = Arc::new(std::sync::atomic::AtomicBool::new(false));
        struct Flag(Arc<std::sync::atomic::AtomicBool>);
        impl Drop for Flag {
            fn drop(&mut self) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let flag = Flag(dropped.clone());
        let upstream = rx
            .map(move |c| {
                let _ = &flag;
                c
            })
            .boxed();
        let slot = Slot::take(&load, streams, 1).expect("a slot");
        let mut body = Watched::start(upstream, slot, stall);
        // Asked and waiting for the provider: not a stall.
        tx.unbounded_send(Ok(bytes::Bytes::from_static(b"a")))
            .expect("send");
        assert!(body.next().await.expect("a chunk").is_ok());
        let waiting = tokio::time::timeout(stall * 3, body.next()).await;
        assert!(
            waiting.is_err(),
            "waiting for the provider ended the answer"
        );
        assert_eq!(load.open_streams(), 1);
        // A chunk handed over and the next never asked for: cancelled.
        tx.unbounded_send(Ok(bytes::Bytes::from_static(b"b")))
            .expect("send");
        assert!(body.next().await.expect("a chunk").is_ok());
        tokio::time::sleep(stall * 3).await;
        assert_eq!(load.open_streams(), 0, "the slot was given back");
        assert!(dropped.load(Ordering::SeqCst), "the upstream was dropped");
        let cut = body.next().await.expect("an error");
        assert_eq!(
            cut.expect_err("cut off").kind(),
            std::io::ErrorKind::TimedOut
        );
        assert!(body.next().await.is_none());
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
