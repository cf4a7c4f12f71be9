//! Probes of the database and the queue for `GET /api/health`, shared by
//! concurrent health requests. Depends on neither the routes nor the state.

use std::time::{Duration, Instant};

use poem_openapi::Object;
use sea_orm::DatabaseConnection;
use worker::Queues;

/// Result of one dependency probe.
#[derive(Debug, Clone, Object)]
pub struct Probe {
    /// The dependency answered within `DEPENDENCY_TIMEOUT_MS`.
    pub ok: bool,
    /// Round-trip time in milliseconds.
    pub latency_ms: f64,
}

/// Queue probe.
#[derive(Debug, Clone, Object)]
pub struct QueueProbe {
    /// The queue store answered within `DEPENDENCY_TIMEOUT_MS`.
    pub ok: bool,
    /// Round-trip time in milliseconds.
    pub latency_ms: f64,
    /// `redis` or `sqlite`.
    pub backend: String,
}

fn ms(since: Instant) -> f64 {
    (since.elapsed().as_secs_f64() * 1000.0 * 100.0).round() / 100.0
}

/// How long one pair of probe results answers health requests. Under a
/// load-balancer or monitoring storm this keeps the probes at ≤ 4 per second
/// per process while every answer is at most this old.
pub const PROBE_TTL: Duration = Duration::from_millis(250);

/// Last probe results, shared by concurrent health requests (single flight:
/// while one request probes, the others wait for its result).
#[derive(Default)]
pub struct ProbeCache(tokio::sync::Mutex<Option<(Instant, Probe, QueueProbe)>>);

impl ProbeCache {
    /// Probes the database (`SELECT 1`) and the queue (`PING`), each bounded
    /// by `timeout`, or answers the results of a probe younger than
    /// [`PROBE_TTL`].
    pub async fn probe(
        &self,
        db: &DatabaseConnection,
        queues: &Queues,
        timeout: Duration,
    ) -> (Probe, QueueProbe) {
        let mut cached = self.0.lock().await;
        if let Some((at, db, q)) = cached.as_ref() {
            if at.elapsed() < PROBE_TTL {
                return (db.clone(), q.clone());
            }
        }
        let db_probe = async {
            let t = Instant::now();
            let ok = matches!(
                tokio::time::timeout(timeout, entity::db::ping(db)).await,
                Ok(Ok(()))
            );
            Probe {
                ok,
                latency_ms: ms(t),
            }
        };
        let queue_probe = async {
            let t = Instant::now();
            let ok = queues.ping().await.is_ok();
            QueueProbe {
                ok,
                latency_ms: ms(t),
                backend: queues.kind().to_string(),
            }
        };
        let (database, queue) = tokio::join!(db_probe, queue_probe);
        *cached = Some((Instant::now(), database.clone(), queue.clone()));
        (database, queue)
    }
}
