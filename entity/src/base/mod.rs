//! The ground floor: what every domain uses and no domain owns. The database
//! (connections, transactions, the clock), settings, secrets, feature
//! readiness, validation, the plan catalogue and the plan in force, the job
//! outbox, outgoing mail, pages of lists, audit actions. Nothing here imports a
//! domain.

pub mod audit;
pub mod db;
pub mod features;
pub mod mail;
pub mod outbox;
pub mod page;
pub mod plans;
pub mod secrets;
pub mod settings;
pub mod validate;
