//! Operations: the dead-letter queue's audited actions.

pub mod dead_letters;
