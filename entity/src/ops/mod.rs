//! Operations: the dead-letter queue's audited actions and the audit log's read.

pub mod audit_log;
pub mod dead_letters;
