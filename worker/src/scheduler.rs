//! Scheduled jobs, run every `SCHEDULER_TICK_SECS` by one worker at a time:
//!
//! * the settlement sweep: webhook events recorded but still unsettled
//!   `SETTLEMENT_SWEEP_AFTER_SECS` after they arrived (their job was lost, or
//!   the enqueue failed and could not be undone) are queued again;
//! * reconciliation: payments still `PENDING` `PAYMENT_RECONCILE_AFTER_SECS`
//!   after creation, and not asked about within that time, get a
//!   `reconcile_payment` job that asks the provider's status API
//!   ([`entity::billing::reconcile::claim_due_payments`] stamps `reconciled_at` so no
//!   payment is queued twice in one round, even by two workers); payments
//!   past `PAYMENT_EXPIRE_AFTER_SECS` are left to payment expiry;
//! * the renewal loop ([`entity::billing::renewal`]): lapse (paid subscriptions past
//!   their grace, or cancelling and past their end, fall back to FREE with an
//!   audit row), grace (`past_due` at the period end), renewal records (with
//!   the reminder already due) and later reminders; each pass pages through
//!   what is due by keyset until nothing is left, claiming each page
//!   ([`entity::billing::renewal::scan::claim_page`]) and queueing it as a
//!   `renewal_batch` job, which any worker runs. A claimed row is not queued
//!   again for `RENEWAL_CLAIM_SECS`, so rows whose job still waits in the
//!   queue are not queued twice; claims past that lease are deleted;
//! * payment expiry: payments still `PENDING` `PAYMENT_EXPIRE_AFTER_SECS`
//!   after creation get a `reconcile_payment` job too (claimed the same way,
//!   [`entity::billing::reconcile::claim_expiring_payments`]): the provider is asked
//!   first, and the payment becomes `EXPIRED` only on an answer that it is
//!   not paid (while the provider cannot be reached it stays `PENDING`); a
//!   paid answer settles it as PAID.
//! * unconfirmed accounts: built-in accounts whose email is still unconfirmed
//!   `AUTH_UNCONFIRMED_TTL_SECS` after their last sign-up and confirmation
//!   mail are deleted ([`entity::identity::account::delete_unconfirmed`]);
//!   so are the per-address mail slots and code windows that no longer hold
//!   anything back ([`entity::identity::otp::delete_stale_address_rows`]),
//!   and OAuth authorizations past their lifetime
//!   ([`entity::identity::oauth::delete_expired_states`]).
//!
//! One run per tick across workers: on Redis a worker runs a tick only when it
//! sets the lock `<QUEUE_PREFIX>:scheduler:lock` (`SET NX PX`, expiring just
//! before the next tick, so the lock's clock is Redis's alone); on SQLite (one
//! process, the embedded default) every tick runs. Each task is idempotent,
//! so a rare second run (a lock that expired mid-run) changes nothing.

use std::time::Duration;

use entity::{
    billing::events, billing::reconcile, billing::renewal, billing::renewal::scan, Settings,
};
use tokio_util::sync::CancellationToken;

use crate::{
    jobs::{Job, ReconcilePayment, RenewalBatch, SettlePayment},
    queue::Queues,
};

/// Rows one task handles per tick at most (one page of the renewal loop).
pub const BATCH: u64 = 500;

/// What one tick did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TickReport {
    /// Unsettled events queued again.
    pub swept: usize,
    /// Pending payments queued for a status check with their provider.
    pub reconciling: usize,
    /// Pages of the renewal loop queued as `renewal_batch` jobs.
    pub renewal_batches: usize,
    /// Payments past their expiry queued for a last status check.
    pub payments_expired: usize,
    /// Unconfirmed built-in accounts deleted.
    pub unconfirmed_deleted: u64,
    /// Stale per-address mail slots and code windows deleted.
    pub address_rows_deleted: u64,
    /// Expired OAuth authorizations (`auth_oauth_states`) deleted.
    pub oauth_states_deleted: u64,
}

/// Runs the scheduled jobs until `shutdown`.
pub async fn run(
    db: sea_orm::DatabaseConnection,
    queues: Queues,
    settings: std::sync::Arc<Settings>,
    worker_id: String,
    shutdown: CancellationToken,
) {
    let tick = settings.scheduler_tick;
    let lock = settings.queue_name("scheduler:lock");
    // The lock lapses a little before the next tick, so the next tick's
    // winner is free to take it.
    let hold = tick.mul_f64(0.9);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(tick) => {}
        }
        match queues.take_tick_lock(&lock, &worker_id, hold).await {
            Ok(false) => continue,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(error = %e, "scheduler: could not take the tick lock");
                continue;
            }
        }
        match run_tick(&db, &queues, &settings).await {
            Ok(r) if r != TickReport::default() => tracing::info!(
                swept = r.swept,
                reconciling = r.reconciling,
                renewal_batches = r.renewal_batches,
                payments_expired = r.payments_expired,
                unconfirmed_deleted = r.unconfirmed_deleted,
                address_rows_deleted = r.address_rows_deleted,
                oauth_states_deleted = r.oauth_states_deleted,
                "scheduler tick"
            ),
            Ok(_) => tracing::debug!("scheduler tick: nothing to do"),
            Err(e) => tracing::warn!(error = %e, "scheduler tick failed; next tick retries"),
        }
    }
}

/// One tick of every scheduled task.
pub async fn run_tick(
    db: &sea_orm::DatabaseConnection,
    queues: &Queues,
    settings: &Settings,
) -> anyhow::Result<TickReport> {
    // Every cut-off by the database's clock, the one that stamped the rows.
    let now = entity::base::db::now(db).await?;
    let mut report = TickReport::default();
    let age = |d: Duration| chrono::Duration::from_std(d).unwrap_or(chrono::Duration::MAX);

    for event_id in
        events::unsettled_events(db, now - age(settings.settlement_sweep_after), BATCH).await?
    {
        let job = Job::SettlePayment(SettlePayment {
            event_id,
            request_id: None,
        });
        queues.push(job).await?;
        report.swept += 1;
    }
    let claimed = reconcile::claim_due_payments(
        db,
        now,
        age(settings.payment_reconcile_after),
        age(settings.payment_expire_after),
        BATCH,
    )
    .await?;
    report.reconciling += queue_checks(db, queues, now, &claimed).await?;
    report.renewal_batches = queue_renewals(db, queues, settings, now).await?;
    let expiring = reconcile::claim_expiring_payments(
        db,
        now,
        age(settings.payment_reconcile_after),
        age(settings.payment_expire_after),
        BATCH,
    )
    .await?;
    report.payments_expired += queue_checks(db, queues, now, &expiring).await?;
    report.unconfirmed_deleted = entity::identity::account::delete_unconfirmed(
        db,
        now - age(settings.auth_unconfirmed_ttl),
        BATCH,
    )
    .await?;
    report.address_rows_deleted = entity::identity::otp::delete_stale_address_rows(db).await?;
    report.oauth_states_deleted = entity::identity::oauth::delete_expired_states(db).await?;
    Ok(report)
}

/// Pages through every pass of the renewal loop due at `now`, claiming and
/// queueing each page of rows not already claimed as a `renewal_batch` job;
/// answers how many were queued. A page whose push fails is given back
/// (due again at the next tick) and the error returned. Also sets the
/// `past_due` gauge and deletes claims past their lease.
async fn queue_renewals(
    db: &sea_orm::DatabaseConnection,
    queues: &Queues,
    settings: &Settings,
    now: chrono::DateTime<chrono::Utc>,
) -> anyhow::Result<usize> {
    crate::metrics::past_due(renewal::past_due_count(db).await?);
    let lease = chrono::Duration::from_std(settings.renewal_claim).unwrap_or(chrono::Duration::MAX);
    scan::delete_stale_claims(db, now - lease).await?;
    let policy = renewal::Policy::from_settings(settings);
    // A pause must not eat a grace: its end extends the running ones.
    match renewal::pause::note(db, policy.paused, now).await? {
        renewal::pause::Noted::Closed { lasted, extended } => tracing::info!(
            lasted_ms = lasted.num_milliseconds(),
            extended,
            "renewal loop resumed: running graces extended by the pause"
        ),
        renewal::pause::Noted::Opened => tracing::info!("renewal loop pause recorded"),
        renewal::pause::Noted::Unchanged => {}
    }
    // Paused: only cancelling subscriptions lapse (at their end, owing
    // nothing); no offer, reminder, past-due notice or lapse after grace.
    let steps: &[renewal::Step] = if policy.paused {
        tracing::info!("renewal loop paused: payments are switched off or not ready");
        &[renewal::Step::Lapse]
    } else {
        &renewal::Step::ALL
    };
    let mut queued = 0;
    for &step in steps {
        let mut after = None;
        loop {
            let page = scan::claim_page(db, step, &policy, now, lease, after, BATCH).await?;
            let Some(last) = page.last().copied() else {
                break;
            };
            let ids: Vec<_> = page.iter().map(|(_, id)| *id).collect();
            let job = Job::RenewalBatch(RenewalBatch {
                step,
                ids: ids.clone(),
            });
            if let Err(e) = queues.push(job).await {
                if let Err(e) = scan::release_claims(db, step, &ids).await {
                    tracing::warn!(step = step.as_str(), error = %e, "scheduler: could not give back a renewal page's claims");
                }
                return Err(e.into());
            }
            queued += 1;
            if (page.len() as u64) < BATCH {
                break;
            }
            after = Some(last);
        }
    }
    Ok(queued)
}

/// Queues a `reconcile_payment` job for each order `claimed` at `now`;
/// answers how many were queued. When a push fails, the claims not queued are
/// given back (due again at the next tick) and the error is returned.
async fn queue_checks(
    db: &sea_orm::DatabaseConnection,
    queues: &Queues,
    now: chrono::DateTime<chrono::Utc>,
    claimed: &[String],
) -> anyhow::Result<usize> {
    for (i, order_id) in claimed.iter().enumerate() {
        let job = Job::ReconcilePayment(ReconcilePayment {
            order_id: order_id.clone(),
        });
        if let Err(e) = queues.push(job).await {
            for order_id in &claimed[i..] {
                if let Err(e) = reconcile::release_claim(db, order_id, now).await {
                    tracing::warn!(order_id, error = %e, "scheduler: could not release a reconciliation claim");
                }
            }
            return Err(e.into());
        }
    }
    Ok(claimed.len())
}
