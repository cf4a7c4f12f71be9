//! The model of the subscription backend: SeaORM entities, the rules that move
//! records between states, the plan catalogue, settings and feature readiness.
//!
//! This crate knows nothing about HTTP or the job queue; everything here is
//! testable with a database connection alone.

pub mod accounts;
pub mod ai;
pub mod base;
pub mod billing;
pub mod entities;
pub mod forms;
pub mod identity;
pub mod ops;

pub use base::features::{Feature, FeatureStatus, Features};
pub use base::settings::Settings;
