//! Operations: health and readiness, the dead-letter queue.

pub mod dead_letters;
pub mod health;
