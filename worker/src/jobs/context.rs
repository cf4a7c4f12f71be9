//! What a job handler gets to work with ([`JobContext`]) and how an attempt
//! that did not succeed ended ([`JobError`]).

use std::sync::Arc;

use apalis::prelude::{AbortError, BoxDynError};

use crate::{mailer::Mailer, providers::Providers, storage::Storage};

/// What handlers get to work with.
#[derive(Clone)]
pub struct JobContext {
    /// The database.
    pub db: sea_orm::DatabaseConnection,
    /// The email transport (absent when none is configured).
    pub mailer: Option<Arc<Mailer>>,
    /// The object store (`STORAGE_URL`).
    pub storage: Storage,
    /// The payment providers' HTTP client (status checks of reconciliation).
    pub providers: Providers,
    /// The billing mails' templates, loaded at start.
    pub billing: Arc<crate::mailer::billing::BillingTemplates>,
    /// The billing terms (`BILLING_TIME_ZONE`, `RENEWAL_GRACE_SECS`) grants
    /// are computed under.
    pub billing_terms: entity::billing::Terms,
    /// The renewal settings in force (computed once: the settings do not
    /// change while the process runs).
    pub renewal_policy: Arc<entity::billing::renewal::Policy>,
}

/// How a job attempt ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobError {
    /// Worth another attempt (network, 5xx, timeouts): retried with backoff
    /// until the retry horizon (see [`crate::retry`]).
    Retry(String),
    /// Will never succeed (bad payload, 4xx rejection): goes to the dead-letter queue now.
    Permanent(String),
}

impl JobError {
    /// The error apalis understands: [`AbortError`] (no retry, dead-letter) for
    /// permanent failures, a plain error (retry with backoff) otherwise.
    pub fn into_apalis(self) -> BoxDynError {
        match self {
            JobError::Retry(m) => {
                Box::<dyn std::error::Error + Send + Sync>::from(format!("transient: {m}"))
            }
            JobError::Permanent(m) => Box::new(AbortError::new(format!("permanent: {m}"))),
        }
    }
}
