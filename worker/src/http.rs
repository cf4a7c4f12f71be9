//! The worker's own HTTP port (`WORKER_HTTP_PORT` on `HOST`; unset: none),
//! for the platform's probes and Prometheus:
//!
//! * `GET /healthz`: 200 `ok` while the process runs (liveness);
//! * `GET /readyz`: 200 `{"database":"ok","queue":"ok"}` when the database
//!   and the queue store answer within `DEPENDENCY_TIMEOUT_MS`, else 503 with
//!   the failing one named (readiness); the probes' results answer for
//!   [`crate::probes::PROBE_TTL`] (a probe storm costs the dependencies at
//!   most 4 probes a second);
//! * `GET /metrics`: the Prometheus text format, to `Authorization: Bearer
//!   $METRICS_TOKEN` (401 without it; 404 while `METRICS_TOKEN` is unset),
//!   the same rule as the api's `/metrics`.
//!
//! Served by the api's server loop ([`crate::server`]) with the api's idle
//! timeout (`HTTP_IDLE_TIMEOUT_SECS`), a header timeout of at most
//! [`HEADER_TIMEOUT`], at most [`MAX_CONNECTIONS`] connections and at most
//! [`MAX_PER_CLIENT`] of them per client address; each connection is
//! closed once its requests are answered. Keep the port on the
//! internal network: a client with many addresses can still hold every
//! connection for [`HEADER_TIMEOUT`] at a time.

use std::sync::Arc;

use entity::Settings;
use metrics_exporter_prometheus::PrometheusHandle;
use poem::{
    get, handler, http::StatusCode, web::Data, EndpointExt, IntoResponse, Request, Response, Route,
};
use sea_orm::DatabaseConnection;
use tokio_util::sync::CancellationToken;

use crate::{probes::ProbeCache, server::Limits, Queues};

/// Open connections the worker's port serves at once (probes and a
/// Prometheus scraper need a few); further ones wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 64;

/// Open connections one client address (IPv4 address, IPv6 /64) may hold on
/// the worker's port; more are closed at once, so one client cannot hold
/// every connection and starve the platform's probes.
pub const MAX_PER_CLIENT: usize = 8;

/// Time allowed for a request's headers on the worker's port (or
/// `HTTP_HEADER_TIMEOUT_MS` when shorter): probes and scrapers send theirs
/// at once, so a connection that trickles them gives its slot back soon.
pub const HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Clone)]
struct Probe {
    db: DatabaseConnection,
    queues: Queues,
    settings: Arc<Settings>,
    metrics: Option<PrometheusHandle>,
    cache: Arc<ProbeCache>,
}

#[handler]
fn healthz() -> &'static str {
    "ok"
}

#[handler]
async fn readyz(p: Data<&Probe>) -> Response {
    let (db, queue) = p
        .cache
        .probe(&p.db, &p.queues, p.settings.dependency_timeout)
        .await;
    let (db_ok, queue_ok) = (db.ok, queue.ok);
    let word = |ok: bool| if ok { "ok" } else { "unavailable" };
    let body = serde_json::json!({"database": word(db_ok), "queue": word(queue_ok)});
    let status = if db_ok && queue_ok {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    Response::builder()
        .status(status)
        .content_type("application/json")
        .body(body.to_string())
}

#[handler]
async fn metrics_page(req: &Request, p: Data<&Probe>) -> Response {
    let (Some(handle), Some(token)) = (&p.metrics, &p.settings.metrics_token) else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if !crate::metrics::bearer_matches(auth, token) {
        return Response::builder()
            .status(StatusCode::UNAUTHORIZED)
            .header("www-authenticate", "Bearer")
            .body("send Authorization: Bearer $METRICS_TOKEN");
    }
    crate::queue_stats::refresh(&p.db, &p.queues, &p.settings).await;
    Response::builder()
        .content_type("text/plain; version=0.0.4")
        .body(handle.render())
}

/// Binds `HOST:WORKER_HTTP_PORT` and serves the probes and `/metrics` until
/// `shutdown`. Logs `worker http listening on http://…` (and prints it on
/// stdout, for scripts that start the worker on port 0).
///
/// Errors: the port cannot be bound.
pub async fn serve(
    settings: Arc<Settings>,
    db: DatabaseConnection,
    queues: Queues,
    metrics: Option<PrometheusHandle>,
    shutdown: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let Some(port) = settings.worker_http_port else {
        return Ok(tokio::spawn(async {}));
    };
    let listener = crate::server::bind(&settings.host, port).await?;
    let a = listener.local_addr()?;
    tracing::info!(addr = %a, "worker http listening");
    println!("worker http listening on http://{a}");
    let from = Limits::from_settings(&settings);
    let limits = Limits {
        max_connections: MAX_CONNECTIONS,
        max_per_client: Some(MAX_PER_CLIENT),
        header_timeout: from.header_timeout.min(HEADER_TIMEOUT),
        close_after_answer: true,
        ..from
    };
    let app = Route::new()
        .at("/healthz", get(healthz))
        .at("/readyz", get(readyz))
        .at("/metrics", get(metrics_page))
        .data(Probe {
            db,
            queues,
            settings,
            metrics,
            cache: Default::default(),
        });
    Ok(tokio::spawn(async move {
        let grace = std::time::Duration::from_secs(5);
        if let Err(e) = crate::server::run(listener, app, limits, shutdown, grace).await {
            tracing::error!(error = %e, "worker http server failed");
        }
    }))
}
