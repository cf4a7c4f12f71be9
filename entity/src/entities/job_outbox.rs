//! `job_outbox`: jobs that follow a change already made and wait in the
//! database until the worker has moved them to the queue
//! ([`crate::base::outbox`]).

use sea_orm::entity::prelude::*;

/// One job waiting to be queued.
#[derive(Clone, Debug, PartialEq, Eq, DeriveEntityModel)]
#[sea_orm(table_name = "job_outbox")]
pub struct Model {
    /// Row id; also the job's idempotency key on the queue.
    #[sea_orm(primary_key, auto_increment = false)]
    pub id: Uuid,
    /// The job's type (`delete_avatar`, `record_ai_usage`), for logs.
    #[sea_orm(column_type = "Text")]
    pub kind: String,
    /// The job, as the queue's JSON.
    #[sea_orm(column_type = "Text")]
    pub job: String,
    /// When the relay may take the row: epoch milliseconds by the database's
    /// clock. Pushed forward while a relay holds it (its lease) and after a
    /// failed push (the retry delay).
    pub available_at_ms: i64,
    /// Pushes tried by the relay.
    pub attempts: i32,
    /// The last failed push's error.
    #[sea_orm(column_type = "Text", nullable)]
    pub last_error: Option<String>,
    /// When the row was written (UTC).
    pub created_at: DateTimeUtc,
}

/// No relations: a job outlives nothing it names.
#[derive(Copy, Clone, Debug, EnumIter, DeriveRelation)]
pub enum Relation {}

impl ActiveModelBehavior for ActiveModel {}
