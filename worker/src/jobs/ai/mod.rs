//! AI jobs: the usage record of one AI request.

pub mod usage;
