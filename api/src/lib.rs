//! HTTP layer of the subscription backend: routes, rate limits, problem-details
//! errors, request ids. Handlers are thin; the work is in `entity` (the model)
//! and `worker` (the jobs).

pub mod app;
pub mod cors;
pub mod followup;
pub mod identity;
pub mod metrics;
pub mod middleware;
pub mod openapi;
pub mod pattern;
pub mod payload;
pub mod probes;
pub mod problem;
pub mod rate_limit;
pub mod routes;
pub mod shed;
pub mod spec;
pub mod sse;
pub mod state;
