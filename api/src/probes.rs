//! The shapes `GET /api/health` reports its probes in; the probing and its
//! cache are the worker crate's ([`worker::probes::ProbeCache`], shared with
//! the worker's `/readyz`).

use poem_openapi::Object;

pub use worker::probes::ProbeCache;

/// Result of one dependency probe.
#[derive(Debug, Clone, Object)]
pub struct Probe {
    /// The dependency answered within `DEPENDENCY_TIMEOUT_MS`.
    pub ok: bool,
    /// Round-trip time in milliseconds.
    pub latency_ms: f64,
}

impl From<worker::probes::Probe> for Probe {
    fn from(p: worker::probes::Probe) -> Self {
        Probe {
            ok: p.ok,
            latency_ms: p.latency_ms,
        }
    }
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

impl QueueProbe {
    /// `p`, a probe of the `backend` queue store.
    pub fn of(p: worker::probes::Probe, backend: &str) -> Self {
        QueueProbe {
            ok: p.ok,
            latency_ms: p.latency_ms,
            backend: backend.to_string(),
        }
    }
}
