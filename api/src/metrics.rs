//! The api's Prometheus metrics: the HTTP middleware ([`HttpMetrics`]) and
//! `GET /metrics` ([`endpoint`]). The recorder, the series names and the
//! job, upstream and pool helpers are shared with the worker
//! ([`worker::metrics`]).
//!
//! `GET /metrics` answers the Prometheus text format to `Authorization:
//! Bearer $METRICS_TOKEN`; without the token 401, and while `METRICS_TOKEN` is
//! unset 404 (no recorder is installed, so nothing is recorded either). Each
//! scrape also sets the gauges read at that moment: requests in flight, open
//! AI streams, the database pool, and the queue depths read from the queue
//! store (shared by every api process, so a query over replicas takes `max`;
//! cached [`worker::queue_stats::QUEUE_STATS_TTL`]).

use std::{
    collections::HashMap,
    future::Future,
    sync::{Arc, LazyLock},
    time::Instant,
};

use futures::{future::Either, FutureExt as _};
use poem::{
    http::{header, HeaderValue, Method, StatusCode},
    Endpoint, IntoResponse, Middleware, Request, Response, Result,
};
use poem_openapi::OperationId;
use worker::metrics as m;

use crate::{problem::Problem, shed::Load, state::AppState};

/// The `route` label of a request no route template matches.
pub const UNMATCHED: &str = "unmatched";

/// Routes served outside the OpenAPI operations, labelled by their own path.
const STATIC_ROUTES: [&str; 4] = ["/metrics", "/api/openapi.json", "/api/docs", "/api/swagger"];

/// The OpenAPI document's path templates: by operation id, and all of them
/// split in segments (for answers given before routing, e.g. shed requests).
struct Templates {
    by_operation: HashMap<String, &'static str>,
    all: Vec<(Vec<&'static str>, &'static str)>,
}

static TEMPLATES: LazyLock<Templates> = LazyLock::new(|| {
    let doc: serde_json::Value =
        serde_json::from_str(crate::spec::document()).expect("the document is JSON");
    let mut by_operation = HashMap::new();
    let mut all = Vec::new();
    if let Some(paths) = doc["paths"].as_object() {
        for (path, ops) in paths {
            let path: &'static str = Box::leak(path.clone().into_boxed_str());
            all.push((path.split('/').collect(), path));
            for op in ops.as_object().into_iter().flat_map(|o| o.values()) {
                if let Some(id) = op["operationId"].as_str() {
                    by_operation.insert(id.to_string(), path);
                }
            }
        }
    }
    Templates { by_operation, all }
});

/// The `route` label: the operation's path template, else the template or
/// static route the path matches, else [`UNMATCHED`]. A bounded set.
pub fn route_label(operation: Option<&OperationId>, path: &str) -> &'static str {
    let t = &*TEMPLATES;
    if let Some(r) = operation.and_then(|o| t.by_operation.get(o.0)) {
        return r;
    }
    if let Some(r) = STATIC_ROUTES
        .iter()
        .copied()
        .find(|r| path == *r || path.strip_prefix(*r).is_some_and(|p| p.starts_with('/')))
    {
        return r;
    }
    let parts: Vec<&str> = path.split('/').collect();
    t.all
        .iter()
        .find(|(segments, _)| {
            segments.len() == parts.len()
                && segments.iter().zip(&parts).all(|(s, p)| {
                    s == p || (s.starts_with('{') && s.ends_with('}') && !p.is_empty())
                })
        })
        .map_or(UNMATCHED, |(_, r)| *r)
}

fn method_label(m: &Method) -> &'static str {
    match *m {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

static STATUS_LABELS: LazyLock<Vec<String>> =
    LazyLock::new(|| (0..600).map(|s| s.to_string()).collect());

fn status_label(s: StatusCode) -> &'static str {
    STATUS_LABELS
        .get(usize::from(s.as_u16()))
        .map_or("other", String::as_str)
}

/// Counts every answer in `http_requests_total{route, method, status}` and
/// times it in `http_request_duration_seconds{route, method, status}`; does nothing
/// (not even read the clock) without a recorder.
pub struct HttpMetrics;

impl<E: Endpoint> Middleware<E> for HttpMetrics {
    type Output = HttpMetricsEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        HttpMetricsEndpoint(ep)
    }
}

/// See [`HttpMetrics`].
pub struct HttpMetricsEndpoint<E>(E);

impl<E: Endpoint> Endpoint for HttpMetricsEndpoint<E> {
    type Output = Response;

    fn call(&self, req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        // (A combinator, not an `async fn`: see `crate::middleware`.)
        if !m::enabled() {
            return Either::Left(self.0.call(req).map(|r| r.map(IntoResponse::into_response)));
        }
        let started = Instant::now();
        let method = method_label(req.method());
        let path = req.uri().path().to_string();
        Either::Right(
            self.0
                .call(req)
                .map(move |result| Ok(counted(result, started, method, &path))),
        )
    }
}

/// The answer of a request to `path` started at `started`, counted in the
/// request metrics. Errors become their answer here (as the outer middleware
/// would), so the status counted is the status sent.
fn counted(
    result: Result<impl IntoResponse>,
    started: Instant,
    method: &'static str,
    path: &str,
) -> Response {
    let resp = crate::problem::answer(result);
    let route = route_label(resp.data::<OperationId>(), path);
    let status = status_label(resp.status());
    metrics::counter!(m::HTTP_REQUESTS, "route" => route, "method" => method, "status" => status)
        .increment(1);
    metrics::histogram!(m::HTTP_DURATION, "route" => route, "method" => method, "status" => status)
        .record(started.elapsed().as_secs_f64());
    resp
}

/// Installs the recorder when `METRICS_TOKEN` is set (see [`worker::metrics::install`]).
///
/// Errors: a recorder was already installed by other code.
pub fn install(settings: &entity::Settings) -> anyhow::Result<()> {
    if settings.metrics_token.is_some() {
        m::install().map_err(anyhow::Error::msg)?;
    }
    Ok(())
}

/// `GET /metrics` (see the module documentation).
pub fn endpoint(load: Arc<Load>) -> impl Endpoint<Output = Response> {
    poem::endpoint::make(move |req: Request| {
        let load = load.clone();
        async move { scrape(&req, &load).await }
    })
}

async fn scrape(req: &Request, load: &Load) -> Response {
    let state = req.data::<AppState>();
    let (Some(state), Some(handle)) = (state, m::handle()) else {
        return Problem::new(StatusCode::NOT_FOUND, "not_found", "no such route", None)
            .into_response();
    };
    let Some(token) = state.settings.metrics_token.as_deref() else {
        return Problem::new(StatusCode::NOT_FOUND, "not_found", "no such route", None)
            .into_response();
    };
    let auth = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    if !m::bearer_matches(auth, token) {
        let mut resp = Problem::new(
            StatusCode::UNAUTHORIZED,
            if auth.is_some() {
                "invalid_token"
            } else {
                "missing_token"
            },
            "send Authorization: Bearer <METRICS_TOKEN>",
            None,
        )
        .into_response();
        resp.headers_mut()
            .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        return resp;
    }
    metrics::gauge!(m::HTTP_IN_FLIGHT).set(load.in_flight() as f64);
    metrics::gauge!(m::AI_OPEN_STREAMS).set(load.open_streams() as f64);
    metrics::gauge!(m::HTTP_BODIES_IN_TRANSIT).set(load.bodies_in_transit() as f64);
    metrics::gauge!(m::HTTP_UPLOADS).set(load.uploads() as f64);
    worker::queue_stats::refresh(&state.db, &state.queues, &state.settings).await;
    Response::builder()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(handle.render())
}
