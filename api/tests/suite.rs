//! The api's own tests as one test binary: each module is a file beside
//! this one (one link of the dependency tree instead of one per file).

mod identity_concurrent;
mod identity_harness;
mod identity_interleavings;
mod identity_invariant;
mod openapi_drift;
mod rate_limit;
mod session;
