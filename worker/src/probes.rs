//! Probes of the database and the queue store, shared by concurrent
//! readiness requests: the api's `GET /api/health` and the worker port's
//! `GET /readyz` both answer from one [`ProbeCache`] per process.

use std::time::{Duration, Instant};

use sea_orm::DatabaseConnection;

use crate::Queues;

/// Result of one dependency probe.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Probe {
    /// The dependency answered within the timeout (`DEPENDENCY_TIMEOUT_MS`).
    pub ok: bool,
    /// Round-trip time in milliseconds (two decimals).
    pub latency_ms: f64,
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// How long one pair of probe results answers readiness requests. Under a
/// load-balancer or monitoring storm this keeps the probes at ≤ 4 per second
/// per process while every answer is at most this old.
pub const PROBE_TTL: Duration = Duration::from_millis(250);

/// Last probe results, shared by concurrent requests (single flight: while
/// one request probes, the others wait for its result).
#[derive(Default)]
pub struct ProbeCache(tokio::sync::Mutex<Option<(Instant, Probe, Probe)>>);

impl ProbeCache {
    /// Probes the database (`SELECT 1`) and the queue (`PING`), each bounded
    /// by `timeout`, or answers the results of a probe younger than
    /// [`PROBE_TTL`]. Returns `(database, queue)`.
    pub async fn probe(
        &self,
        db: &DatabaseConnection,
        queues: &Queues,
        timeout: Duration,
    ) -> (Probe, Probe) {
        let mut cached = self.0.lock().await;
        if let Some((at, db, q)) = cached.as_ref() {
            if at.elapsed() < PROBE_TTL {
                return (*db, *q);
            }
        }
        let timed = |ok: bool, t: Instant| Probe {
            ok,
            latency_ms: ms(t),
        };
        let db_probe = async {
            let t = Instant::now();
            let ok = matches!(
                tokio::time::timeout(timeout, entity::base::db::ping(db)).await,
                Ok(Ok(()))
            );
            timed(ok, t)
        };
        let queue_probe = async {
            let t = Instant::now();
            // Bounded by the queue's own timeout (`DEPENDENCY_TIMEOUT_MS`).
            let ok = queues.ping().await.is_ok();
            timed(ok, t)
        };
        let (database, queue) = tokio::join!(db_probe, queue_probe);
        *cached = Some((Instant::now(), database, queue));
        (database, queue)
    }
}
