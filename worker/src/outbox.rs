//! The job outbox's two ends ([`entity::base::outbox`] holds the table's rules):
//!
//! * [`keep`] / [`to_row`]: a job that follows a change already made and
//!   could not be queued goes into the database instead of being lost;
//! * [`run`]: the relay, a periodic task of every worker on the Redis
//!   backend, moves due rows to the queue in bounded batches
//!   ([`BATCH`] every [`RELAY_EVERY`], [`PUSH_CONCURRENCY`] pushes at a
//!   time), deleting a row only after its push succeeded (the pushed rows of
//!   a batch in one statement). Delivery is at least once (a push whose row could not be
//!   deleted is pushed again after the lease): the jobs kept here
//!   (`delete_avatar`, `record_ai_usage`) are idempotent. Every push of a row
//!   carries the row id as the job's idempotency key.
//!
//! On the embedded SQLite queue the api pushes its follow-ups directly (that
//! queue is a file on the same machine, with no network to blink), but the
//! relay runs there too: the model writes jobs into the outbox inside its
//! own transactions (the billing mails of [`entity::billing::mail`]).

use std::time::Duration;

use entity::base::outbox::{self, NewJob};
use sea_orm::{DatabaseConnection, DbErr};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::{jobs::Job, queue::Queues};

/// How often the relay looks for due rows.
pub const RELAY_EVERY: Duration = Duration::from_secs(1);
/// Longest pause between rounds after failures.
pub const MAX_PAUSE: Duration = Duration::from_secs(30);
/// Rows one claim takes at most; a full batch is followed by another at once.
pub const BATCH: u64 = 500;
/// Pushes of one batch in flight at once.
pub const PUSH_CONCURRENCY: usize = 16;
/// How long claimed rows stay hidden from other relays: time for a batch of
/// pushes and deletes.
pub const LEASE: Duration = Duration::from_secs(60);
/// A row whose push failed is due again this much later.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// A row whose job does not decode (written by another version) is looked at
/// again this much later; it stays, with its error, until a version that knows
/// it relays it or an operator deletes it.
pub const UNDECODABLE_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// The outbox row of `job`.
pub fn to_row(job: &Job) -> NewJob {
    NewJob {
        kind: job.kind().to_string(),
        job: serde_json::to_string(job).expect("a job serialises"),
    }
}

/// Keeps `job` in the outbox, due at once (the push failed already).
/// Returns the row id.
pub async fn keep(db: &DatabaseConnection, job: &Job) -> Result<Uuid, DbErr> {
    outbox::insert(db, &to_row(job), Duration::ZERO).await
}

/// Relays due rows every [`RELAY_EVERY`] until `shutdown`. After a failed round the pause doubles, up to
/// [`MAX_PAUSE`], so an outage is not logged every second.
pub async fn run(db: DatabaseConnection, queues: Queues, shutdown: CancellationToken) {
    let mut pause = RELAY_EVERY;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        loop {
            match relay_once(&db, &queues).await {
                Ok(n) if n as u64 == BATCH && !shutdown.is_cancelled() => continue,
                Ok(_) => {
                    pause = RELAY_EVERY;
                    break;
                }
                Err(e) => {
                    pause = (pause * 2).min(MAX_PAUSE);
                    tracing::warn!(error = %e, retry_in_ms = pause.as_millis() as u64, "job outbox: relay failed");
                    break;
                }
            }
        }
    }
}

/// Why a relay round stopped early.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    /// The database failed (claiming, deleting or releasing rows).
    #[error("database: {0}")]
    Db(#[from] DbErr),
    /// The queue refused a push; the row and the rest of the batch are due
    /// again after [`RETRY_AFTER`].
    #[error("queue: {0}")]
    Queue(#[from] crate::queue::QueueError),
}

/// One round: claims up to [`BATCH`] due rows and pushes them,
/// [`PUSH_CONCURRENCY`] at a time, then deletes the pushed rows in one
/// statement. After the first failed push no further push is started: that
/// row and the ones not tried are released for [`RETRY_AFTER`] and the
/// error returned (the rows pushed before it are deleted first). Returns
/// how many rows were claimed (moved or set aside as undecodable).
pub async fn relay_once(db: &DatabaseConnection, queues: &Queues) -> Result<usize, RelayError> {
    use futures::StreamExt as _;
    use std::sync::atomic::{AtomicBool, Ordering};

    let rows = outbox::claim(db, BATCH, LEASE).await?;
    let claimed = rows.len();
    let mut jobs = Vec::with_capacity(rows.len());
    for row in rows {
        match serde_json::from_str::<Job>(&row.job) {
            Ok(job) => jobs.push((row, job)),
            Err(e) => {
                tracing::error!(outbox_id = %row.id, kind = %row.kind, error = %e, "job outbox: a job does not decode; kept");
                outbox::retry_later(
                    db,
                    row.id,
                    UNDECODABLE_RETRY_AFTER,
                    &format!("does not decode: {e}"),
                )
                .await?;
            }
        }
    }
    let stop = AtomicBool::new(false);
    let stop = &stop;
    let results: Vec<_> = futures::stream::iter(jobs)
        .map(|(row, job): (outbox::Claimed, Job)| async move {
            if stop.load(Ordering::Relaxed) {
                return (row, None);
            }
            let pushed = queues.push_keyed(job, &row.id.to_string()).await;
            if pushed.is_err() {
                stop.store(true, Ordering::Relaxed);
            }
            (row, Some(pushed))
        })
        .buffer_unordered(PUSH_CONCURRENCY)
        .collect()
        .await;
    let mut pushed = Vec::with_capacity(results.len());
    let mut failed: Vec<outbox::Claimed> = Vec::new();
    let mut error = None;
    for (row, result) in results {
        match result {
            Some(Ok(task_id)) => {
                tracing::info!(outbox_id = %row.id, kind = %row.kind, task_id, attempts = row.attempts, "job outbox: job queued");
                pushed.push(row.id);
            }
            Some(Err(e)) => {
                error.get_or_insert(e);
                failed.push(row);
            }
            None => failed.push(row),
        }
    }
    outbox::delete_many(db, &pushed).await?;
    if let Some(e) = error {
        let message = e.to_string();
        for row in failed {
            outbox::retry_later(db, row.id, RETRY_AFTER, &message).await?;
        }
        return Err(e.into());
    }
    Ok(claimed)
}
