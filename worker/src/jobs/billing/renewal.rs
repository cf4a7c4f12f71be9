//! `renewal_batch`: one page of one pass of the renewal loop
//! ([`entity::billing::renewal`]), queued by the scheduler ([`crate::scheduler`]) so
//! that every worker takes a share of a large batch. Each row is re-checked
//! under its lock by the database's clock, so a repeated or concurrent batch
//! changes nothing twice. A batch run while the renewal loop is paused
//! (payments switched off) changes nothing and gives its claims back, but a
//! lapse page, which then lapses only cancelling subscriptions.
//! Outcomes are counted in `billing_renewals_total{outcome}`.

use std::sync::OnceLock;

use entity::{base::plans::Catalogue, billing::renewal};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::jobs::context::{JobContext, JobError};

/// Payload of the `renewal_batch` job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RenewalBatch {
    /// Which pass.
    pub step: renewal::Step,
    /// User ids ([`renewal::Step::Remind`]: renewal ids), at most one page.
    pub ids: Vec<Uuid>,
}

/// The plan catalogue (`PLANS_FILE`, else the built-in one), loaded once.
fn catalogue(ctx: &JobContext) -> Result<&'static Catalogue, JobError> {
    static CATALOGUE: OnceLock<Catalogue> = OnceLock::new();
    if let Some(c) = CATALOGUE.get() {
        return Ok(c);
    }
    let loaded = Catalogue::load_or_built_in(ctx.providers.settings().plans_file.as_deref())
        .map_err(|e| JobError::Permanent(format!("the plan catalogue: {e}")))?;
    Ok(CATALOGUE.get_or_init(|| loaded))
}

/// Runs the batch; database failures are retried.
pub async fn handle(
    job: RenewalBatch,
    _task_id: &str,
    _attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    // Payments switched off since the page was queued (or on this worker):
    // the loop waits, so the page changes nothing and its claims are given
    // back for the scheduler to queue again once payments are on. A lapse
    // page runs: paused, it lapses only cancelling subscriptions.
    let policy = &ctx.renewal_policy;
    if policy.paused && job.step != renewal::Step::Lapse {
        renewal::scan::release_claims(&ctx.db, job.step, &job.ids)
            .await
            .map_err(|e| JobError::Retry(format!("releasing the claims: {e}")))?;
        tracing::info!(step = ?job.step, rows = job.ids.len(), "renewal batch skipped: the renewal loop is paused");
        return Ok(());
    }
    let catalogue = catalogue(ctx)?;
    let now = entity::base::db::now(&ctx.db)
        .await
        .map_err(|e| JobError::Retry(format!("reading the database clock: {e}")))?;
    let report = renewal::run_batch(&ctx.db, job.step, policy, catalogue, now, &job.ids)
        .await
        .map_err(|e| JobError::Retry(format!("renewal batch {:?}: {e}", job.step)))?;
    for outcome in &report.outcomes {
        crate::metrics::renewal(*outcome);
    }
    if !report.outcomes.is_empty() {
        tracing::info!(step = ?job.step, rows = job.ids.len(), changed = report.outcomes.len(), "renewal batch");
    }
    Ok(())
}
