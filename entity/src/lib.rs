//! The model of the subscription backend: SeaORM entities, the rules that move
//! records between states, the plan catalogue, settings and feature readiness.
//!
//! This crate knows nothing about HTTP or the job queue; everything here is
//! testable with a database connection alone.

pub mod ai;
pub mod ai_quota;
pub mod avatar;
pub mod billing_mail;
pub mod checkout;
pub mod contact;
pub mod db;
pub mod dead_letters;
pub mod entities;
pub mod features;
pub mod grant;
pub mod identity;
pub mod mail;
pub mod oauth;
pub mod outbox;
pub mod page;
pub mod payment;
pub mod plans;
pub mod profile;
pub mod reads;
pub mod reconcile;
pub mod redirect;
pub mod renewal;
pub mod renewal_pay;
pub mod renewal_scan;
pub mod renewal_settle;
pub mod roles;
pub mod secret_file;
pub mod settings;
pub mod settlement;
pub mod subscription;
pub mod users;
pub mod validate;
pub mod waitlist;
pub mod webhook;

pub use features::{Feature, FeatureStatus, Features};
pub use settings::Settings;
