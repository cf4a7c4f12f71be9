//! Prometheus metrics shared by the api and the worker: the recorder
//! (`metrics` + `metrics-exporter-prometheus`), the series names, and the
//! helpers the job runner and the upstream clients record through.
//!
//! Nothing is recorded unless [`install`] ran, which the binaries do only
//! when `METRICS_TOKEN` is set: without a recorder every `metrics` macro is a
//! call into the facade's no-op recorder, and [`enabled`] lets hot paths skip
//! even reading the clock.
//!
//! Series (names and units by Prometheus' conventions; docs/operations.md lists them
//! with their labels):
//! * [`HTTP_REQUESTS`], [`HTTP_DURATION`], [`HTTP_IN_FLIGHT`], [`HTTP_SHED`],
//!   [`HTTP_BODIES_IN_TRANSIT`], [`HTTP_UPLOADS`], [`AI_OPEN_STREAMS`], [`RATE_LIMITED`] (api);
//! * [`QUEUE_WAITING`], [`QUEUE_SCHEDULED`], [`QUEUE_IN_FLIGHT`], [`QUEUE_DEAD`],
//!   [`QUEUE_OLDEST_AGE`] (api, read from the queue store on scrape);
//! * [`JOBS`], [`JOB_DURATION`] (workers);
//! * [`UPSTREAM_REQUESTS`], [`UPSTREAM_DURATION`] (whichever process calls);
//! * [`RENEWALS`], [`PAST_DUE`] (workers: the renewal loop);
//! * [`DB_POOL_CONNECTIONS`], [`DB_POOL_MAX`] (both, on scrape).

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        OnceLock,
    },
    time::{Duration, Instant},
};

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// `http_requests_total{route, method, status}`: answered requests. `route`
/// is the OpenAPI path template (`/api/payments/{orderId}`), or `unmatched`.
pub const HTTP_REQUESTS: &str = "http_requests_total";
/// `http_request_duration_seconds{route, method, status}`: time from the
/// router to the response head.
pub const HTTP_DURATION: &str = "http_request_duration_seconds";
/// `http_requests_in_flight`: requests being handled that count toward `HTTP_MAX_IN_FLIGHT`.
pub const HTTP_IN_FLIGHT: &str = "http_requests_in_flight";
/// `http_requests_shed_total{reason}`: requests refused with 503 `overloaded`
/// (`reason`: `in_flight`, `ai_streams`, `body_budget` or `uploads`).
pub const HTTP_SHED: &str = "http_requests_shed_total";
/// `http_request_body_bytes_in_transit`: bytes of request bodies received
/// and held while the rest is awaited, counted against `HTTP_BODY_BUDGET_BYTES`.
pub const HTTP_BODIES_IN_TRANSIT: &str = "http_request_body_bytes_in_transit";
/// `http_uploads_in_progress`: avatar uploads whose body is arriving (or
/// being finished), counted against `HTTP_MAX_UPLOADS`.
pub const HTTP_UPLOADS: &str = "http_uploads_in_progress";
/// `ai_open_streams`: AI chats and generations open in this process.
pub const AI_OPEN_STREAMS: &str = "ai_open_streams";
/// `rate_limit_refusals_total{limit}`: requests refused with 429, by limit name.
pub const RATE_LIMITED: &str = "rate_limit_refusals_total";
/// `queue_waiting{queue}`: jobs due and not yet taken by a worker.
pub const QUEUE_WAITING: &str = "queue_waiting";
/// `queue_scheduled{queue}`: jobs (retries) due later.
pub const QUEUE_SCHEDULED: &str = "queue_scheduled";
/// `queue_in_flight{queue}`: jobs taken by a worker and not yet acknowledged.
pub const QUEUE_IN_FLIGHT: &str = "queue_in_flight";
/// `queue_dead{queue}`: dead letters.
pub const QUEUE_DEAD: &str = "queue_dead";
/// `queue_oldest_waiting_age_seconds{queue}`: how long the oldest waiting job
/// has been waiting (0 when none waits).
pub const QUEUE_OLDEST_AGE: &str = "queue_oldest_waiting_age_seconds";
/// `jobs_total{job, outcome}`: job attempts by job type and outcome (`done`,
/// `retried`, `dead_lettered`).
pub const JOBS: &str = "jobs_total";
/// `job_duration_seconds{job, outcome}`: time one job attempt took.
pub const JOB_DURATION: &str = "job_duration_seconds";
/// `upstream_requests_total{upstream, outcome}`: calls to third parties
/// (`upstream`: `email`, `payment_provider`, `ai`, `oauth`; `outcome`: `ok`
/// or `error`).
pub const UPSTREAM_REQUESTS: &str = "upstream_requests_total";
/// `upstream_request_duration_seconds{upstream}`: time to the answer (for an
/// AI stream: to its head).
pub const UPSTREAM_DURATION: &str = "upstream_request_duration_seconds";
/// `billing_renewals_total{outcome}`: rows the renewal loop acted on, by
/// outcome (`created`, `unpriced`, `reminded`, `past_due`, `lapsed`, `paid`,
/// `duplicate`; [`entity::billing::renewal::Outcome`]).
pub const RENEWALS: &str = "billing_renewals_total";
/// `billing_subscriptions_past_due`: subscriptions in their grace
/// (`past_due`), as counted by the last scheduler tick.
pub const PAST_DUE: &str = "billing_subscriptions_past_due";
/// `db_pool_connections{state}`: database pool connections `in_use` and `idle`.
pub const DB_POOL_CONNECTIONS: &str = "db_pool_connections";
/// `db_pool_max_connections`: the pool's bound (`DB_MAX_CONNECTIONS`).
pub const DB_POOL_MAX: &str = "db_pool_max_connections";

/// Counts one row the renewal loop acted on ([`RENEWALS`]).
pub fn renewal(outcome: entity::billing::renewal::Outcome) {
    metrics::counter!(RENEWALS, "outcome" => outcome.as_str()).increment(1);
}

/// Counts what a settlement did to a renewal ([`RENEWALS`]: `paid`,
/// `duplicate`), if anything.
pub fn settled(outcome: &entity::billing::settlement::Settled) {
    if let entity::billing::settlement::Settled::Moved {
        renewal: Some(o), ..
    } = outcome
    {
        renewal(*o);
    }
}

/// Sets the [`PAST_DUE`] gauge.
pub fn past_due(count: u64) {
    metrics::gauge!(PAST_DUE).set(count as f64);
}

/// Histogram buckets of every `_seconds` series, in seconds.
pub const BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

static ENABLED: AtomicBool = AtomicBool::new(false);
static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// The installed recorder's handle (renders the text format), if any.
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE.get()
}

/// Whether a recorder is installed (`METRICS_TOKEN` set).
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Installs the process-wide Prometheus recorder (once; later calls return
/// the same handle) and, on the current Tokio runtime, its upkeep task.
///
/// Errors: another recorder was installed by other code.
pub fn install() -> Result<PrometheusHandle, String> {
    if let Some(h) = HANDLE.get() {
        return Ok(h.clone());
    }
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .map_err(|e| e.to_string())?
        .install_recorder()
        .map_err(|e| e.to_string())?;
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    let _ = HANDLE.set(handle.clone());
    ENABLED.store(true, Ordering::Relaxed);
    Ok(handle)
}

/// Whether `header` (an `Authorization` value) is `Bearer <token>`, compared
/// in constant time.
pub fn bearer_matches(header: Option<&str>, token: &str) -> bool {
    let Some(given) = header.and_then(|h| {
        h.strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
    }) else {
        return false;
    };
    let (a, b) = (given.trim().as_bytes(), token.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The outcome of one job attempt, as [`record_job`] labels it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobOutcome {
    /// It succeeded.
    Done,
    /// It failed and a retry was scheduled (or left to the queue).
    Retried,
    /// It failed for good: it is now a dead letter.
    DeadLettered,
}

impl JobOutcome {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            JobOutcome::Done => "done",
            JobOutcome::Retried => "retried",
            JobOutcome::DeadLettered => "dead_lettered",
        }
    }
}

/// Counts one job attempt of type `job` and its duration.
pub fn record_job(job: &'static str, outcome: JobOutcome, took: Duration) {
    if !enabled() {
        return;
    }
    let outcome = outcome.as_str();
    metrics::counter!(JOBS, "job" => job, "outcome" => outcome).increment(1);
    metrics::histogram!(JOB_DURATION, "job" => job, "outcome" => outcome)
        .record(took.as_secs_f64());
}

/// Times one call to a third party: `let t = Upstream::start("email"); …;
/// t.finish(result.is_ok());`.
#[derive(Debug)]
pub struct Upstream {
    name: &'static str,
    started: Option<Instant>,
}

impl Upstream {
    /// Starts timing a call to `name` (`email`, `payment_provider`, `ai`, `oauth`).
    #[inline]
    pub fn start(name: &'static str) -> Self {
        Upstream {
            name,
            started: enabled().then(Instant::now),
        }
    }

    /// Records the call as `ok` or `error`, with its duration.
    pub fn finish(self, ok: bool) {
        let Some(started) = self.started else { return };
        let outcome = if ok { "ok" } else { "error" };
        metrics::counter!(UPSTREAM_REQUESTS, "upstream" => self.name, "outcome" => outcome)
            .increment(1);
        metrics::histogram!(UPSTREAM_DURATION, "upstream" => self.name)
            .record(started.elapsed().as_secs_f64());
    }

    /// Records the outcome of `result` and passes it on.
    pub fn observe<T, E>(self, result: Result<T, E>) -> Result<T, E> {
        self.finish(result.is_ok());
        result
    }
}

/// Sets the database pool gauges from `db`'s sqlx pool (PostgreSQL or
/// SQLite): connections in use (open minus idle) and idle, and the bound.
pub fn record_db_pool(db: &sea_orm::DatabaseConnection, max: u32) {
    if !enabled() {
        return;
    }
    use sea_orm::DatabaseConnectionType as Kind;
    let (size, idle) = match &db.inner {
        Kind::SqlxPostgresPoolConnection(_) => {
            let p = db.get_postgres_connection_pool();
            (p.size(), p.num_idle())
        }
        Kind::SqlxSqlitePoolConnection(_) => {
            let p = db.get_sqlite_connection_pool();
            (p.size(), p.num_idle())
        }
        _ => return,
    };
    let idle = idle as f64;
    metrics::gauge!(DB_POOL_CONNECTIONS, "state" => "in_use").set(f64::from(size) - idle);
    metrics::gauge!(DB_POOL_CONNECTIONS, "state" => "idle").set(idle);
    metrics::gauge!(DB_POOL_MAX).set(f64::from(max));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_is_compared_whole() {
        assert!(bearer_matches(Some("Bearer s3cret"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cre"), "s3cret"));
        assert!(!bearer_matches(Some("Bearer s3cretX"), "s3cret"));
        assert!(!bearer_matches(Some("s3cret"), "s3cret"));
        assert!(!bearer_matches(None, "s3cret"));
    }
}
