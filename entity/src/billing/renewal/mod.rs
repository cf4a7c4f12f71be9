//! The renewal loop (checkouts are one-time payments, so a paid plan is
//! renewed by the customer paying again): renewal records, reminders, grace
//! and lapse. Rules in decisions.md, "Subscriptions"; docs/billing.md's "Renewal"
//! section has the timeline.
//!
//! The scheduler runs four passes, each a keyset-paged scan of what is due
//! ([`due_page`]) whose pages are queued as batch jobs ([`run_batch`]), so
//! any number of workers share a large batch:
//!
//! * [`Step::Create`]: a paid subscription that is `active` (or `past_due`,
//!   still in its grace), not cancelling, and whose `current_period_end` is
//!   within [`Policy::lead`] gets one open
//!   renewal (plan: `renewal_plan` when the customer changed it, else its
//!   plan; amount: [`crate::billing::price`]'s, kept after). The partial unique
//!   index `renewals_open_uidx` makes it one per user and period end under
//!   concurrent ticks and repeated jobs. A plan gone from the catalogue gets
//!   no renewal and counts as [`Outcome::Unpriced`].
//! * [`Step::Remind`]: an open renewal whose `next_reminder_at` passed gets
//!   the reminder of the latest offset due (earlier offsets not sent late).
//! * [`Step::PastDue`]: a paid `active` subscription past its period end
//!   (however long ago), not cancelling, becomes `past_due` (the plan stays
//!   in force): the transaction that records the past-due mail stores
//!   `past_due_at` and `grace_ends_at` = then + [`Policy::grace`].
//! * [`Step::Lapse`]: a `past_due` subscription whose grace has ended
//!   ([`grace_end`]; a cancelling one: at its end, without grace) returns to
//!   FREE, its open renewal is voided, an audit row is written. Grace always
//!   warns: nothing lapses without a recorded past-due notice but a
//!   cancelling subscription, which owes nothing.
//!
//! Before any pass acts on a subscription, a paid phase due to begin
//! (`change` paid early, [`crate::billing::phase`]) begins, in the page's
//! transaction; the lapse scan also finds such subscriptions while the
//! loop is paused.
//!
//! Every time is the database's ([`crate::base::db::now`]); each row is re-checked
//! under its lock, so a pass that runs twice changes nothing the second time.
//!
//! Long (about 800 lines with its tests) because the four passes share the
//! subscription's lock, the billing mails and the audit rows, each pass one
//! transaction per row; the pay link ([`pay`]), the scans ([`scan`]) and a
//! renewal's settlement ([`settle`]) are their own files.

pub use super::grace::grace_end;
use super::grace::later;

pub mod pause;
pub mod pay;
pub mod scan;
pub mod settle;

use chrono::{DateTime, Duration, Utc};
use sea_orm::{
    sea_query::{Expr, OnConflict},
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, IntoActiveModel,
    QueryFilter, QuerySelect, Set, TransactionSession, TransactionTrait, TryIntoModel,
};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

use crate::base::audit;
use crate::{
    base::db::begin_write,
    base::plans::{Catalogue, FREE},
    billing::mail::{BillingMail, BillingMailKind, Queued},
    entities::{
        audit_logs,
        renewals::{self, RenewalStatus},
        subscriptions::{self, SubscriptionStatus},
    },
    Settings,
};

/// Queues billing mail `kind` for `user_id` under idempotency `key` in the
/// caller's transaction ([`crate::billing::mail::queue`]).
async fn mail<C: ConnectionTrait>(
    db: &C,
    kind: BillingMailKind,
    user_id: Uuid,
    key: String,
    vars: serde_json::Value,
) -> Result<Queued, DbErr> {
    let serde_json::Value::Object(vars) = vars else {
        return Err(DbErr::Custom(
            "billing mail variables must be an object".into(),
        ));
    };
    crate::billing::mail::queue(
        db,
        BillingMail {
            kind,
            user_id,
            key,
            vars,
        },
    )
    .await
}

/// Whether the renewal loop waits: while payments are switched off
/// (`NEXT_PUBLIC_ENABLE_PAYMENTS`) or not ready (the provider's credentials
/// missing), no renewal can be paid, so none is offered, no reminder is sent,
/// no subscription goes `past_due` and none in its grace lapses; a
/// cancelling subscription, owing nothing, still lapses at its end.
/// Everything resumes where it stood once payments are back (reminders
/// already past are not sent late; a period that ended meanwhile is told
/// past due first, with its whole grace; a grace that was running is
/// extended by the pause's length, [`pause`]).
/// `GET /api/health` shows it as `renewals: "paused"`.
pub fn paused(features: &crate::Features) -> bool {
    !features.get(crate::Feature::Payments).ready()
}

/// The renewal settings in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long after its past-due notice a subscription keeps its plan
    /// (`RENEWAL_GRACE_SECS`).
    pub grace: Duration,
    /// Reminder offsets in days before the period end, largest first
    /// (`RENEWAL_REMINDER_DAYS`).
    pub reminder_days: Vec<u32>,
    /// The secret pay links are signed with (`BACKEND_SERVICE_ROLE_KEY`).
    pub pay_secret: Option<String>,
    /// `API_EXTERNAL_URL`, the base of pay links.
    pub api_url: String,
    /// The loop waits ([`paused`]): only cancelling subscriptions lapse.
    pub paused: bool,
    /// How long a price-change mail comes before the first renewal at the
    /// new price (`PRICE_CHANGE_NOTICE_DAYS`, [`crate::billing::price`]).
    pub price_notice: Duration,
    /// `BILLING_TIME_ZONE`: the months of a scheduled phase that begins
    /// ([`crate::billing::phase`]) are counted in it.
    pub zone: chrono_tz::Tz,
}

impl Policy {
    /// The policy of `settings`.
    pub fn from_settings(settings: &Settings) -> Self {
        Policy {
            grace: Duration::from_std(settings.renewal_grace).unwrap_or(Duration::MAX),
            reminder_days: settings.renewal_reminder_days.clone(),
            pay_secret: settings.backend_service_role_key.clone(),
            api_url: settings.api_external_url.trim_end_matches('/').to_string(),
            paused: paused(&crate::Features::compute(settings)),
            price_notice: Duration::from_std(settings.price_change_notice).unwrap_or(Duration::MAX),
            zone: settings.billing_time_zone,
        }
    }

    /// The pay link of renewal `id` (`None` without a signing secret).
    pub fn pay_url(&self, id: Uuid) -> Option<String> {
        let secret = self.pay_secret.as_deref()?;
        Some(format!(
            "{}/api/payments/pay/{}",
            self.api_url,
            crate::billing::renewal::pay::pay_token(secret, id)
        ))
    }

    /// How long before the period end the renewal is created: the largest
    /// reminder offset, at least one day.
    pub fn lead(&self) -> Duration {
        Duration::days(i64::from(self.reminder_days.first().copied().unwrap_or(1)))
    }

    /// When the first reminder of a renewal due at `period_end` is due
    /// (`None`: no reminders configured).
    pub fn first_reminder(&self, period_end: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.reminder_days
            .first()
            .map(|d| period_end - Duration::days(i64::from(*d)))
    }

    /// The offset (days) of the latest reminder due at `now` for a renewal
    /// due at `period_end`: the smallest offset whose time has come.
    pub fn latest_due(&self, period_end: DateTime<Utc>, now: DateTime<Utc>) -> Option<u32> {
        self.reminder_days
            .iter()
            .copied()
            .filter(|d| period_end - Duration::days(i64::from(*d)) <= now)
            .min()
    }

    /// The offset of the reminder to send at `now` for a renewal due at
    /// `period_end`: [`Self::latest_due`] while the period runs, `None` once
    /// it has ended (the past-due mail speaks then).
    pub fn reminder_due(&self, period_end: DateTime<Utc>, now: DateTime<Utc>) -> Option<u32> {
        (period_end > now)
            .then(|| self.latest_due(period_end, now))
            .flatten()
    }

    /// When the reminder after the one of offset `sent` is due (`None`: it
    /// was the last).
    pub fn after(&self, period_end: DateTime<Utc>, sent: u32) -> Option<DateTime<Utc>> {
        self.reminder_days
            .iter()
            .copied()
            .filter(|d| *d < sent)
            .max()
            .map(|d| period_end - Duration::days(i64::from(d)))
    }
}

/// One pass of the renewal loop (what a batch job runs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Step {
    /// Create the open renewal of subscriptions coming due.
    Create,
    /// Send the reminders due.
    Remind,
    /// Start the grace of subscriptions whose period ended unpaid.
    PastDue,
    /// Return to FREE what is past its grace (or cancelling and past its end).
    Lapse,
}

impl Step {
    /// Every pass, in the order a tick runs them.
    pub const ALL: [Step; 4] = [Step::Lapse, Step::PastDue, Step::Create, Step::Remind];

    /// The pass's name (as in the job's JSON and `renewal_claims.step`).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Create => "create",
            Step::Remind => "remind",
            Step::PastDue => "past_due",
            Step::Lapse => "lapse",
        }
    }
}

/// What happened to one row, as counted in `billing_renewals_total{outcome}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// An open renewal was created (`created`).
    Created,
    /// The renewal's plan is gone from the catalogue (`unpriced`).
    Unpriced,
    /// A reminder was queued (`reminded`).
    Reminded,
    /// The period ended unpaid; grace began (`past_due`).
    PastDue,
    /// The subscription returned to FREE (`lapsed`).
    Lapsed,
    /// A renewal was paid (`paid`).
    Paid,
    /// A second payment of an already paid renewal (`duplicate`).
    Duplicate,
}

impl Outcome {
    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Unpriced => "unpriced",
            Outcome::Reminded => "reminded",
            Outcome::PastDue => "past_due",
            Outcome::Lapsed => "lapsed",
            Outcome::Paid => "paid",
            Outcome::Duplicate => "duplicate",
        }
    }
}

/// What one batch did: one entry per row that changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// The outcomes, one per row acted on (rows no longer due are skipped).
    pub outcomes: Vec<Outcome>,
}

impl BatchReport {
    /// How many rows had `outcome`.
    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.iter().filter(|o| **o == outcome).count()
    }
}

/// Runs `step` at `now` on `ids` (user ids; renewal ids for
/// [`Step::Remind`]) in one transaction (one commit per page, not per row),
/// each row re-checked under its lock; rows no longer due are skipped.
/// `catalogue` prices new renewals. On an error nothing of the page is kept
/// and the job's retry runs it again.
pub async fn run_batch<C>(
    db: &C,
    step: Step,
    policy: &Policy,
    catalogue: &Catalogue,
    now: DateTime<Utc>,
    ids: &[Uuid],
) -> Result<BatchReport, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let mut report = BatchReport::default();
    let txn = begin_write(db).await?;
    for &id in ids {
        // A phase due begins first, in the page's transaction (kept when
        // the pass itself finds nothing to do), so no pass tells a period
        // past due, lapses it or offers its renewal when a paid phase
        // follows it ([`crate::billing::phase`]).
        if step != Step::Remind {
            if let Some(sub) = locked_subscription(&txn, id).await? {
                crate::billing::phase::switch_due(&txn, sub, now, policy.zone).await?;
            }
        }
        match step {
            Step::Create => report
                .outcomes
                .extend(offer(&txn, policy, catalogue, now, id).await?),
            Step::Remind => report
                .outcomes
                .extend(remind_one(&txn, policy, now, id).await?),
            Step::PastDue => report
                .outcomes
                .extend(past_due_one(&txn, policy, catalogue, now, id).await?),
            Step::Lapse => report
                .outcomes
                .extend(lapse_one(&txn, policy, now, id).await?),
        }
    }
    txn.commit().await?;
    Ok(report)
}

/// Locks the subscription of `user_id` (`FOR UPDATE` on PostgreSQL).
async fn locked_subscription<T: ConnectionTrait>(
    txn: &T,
    user_id: Uuid,
) -> Result<Option<subscriptions::Model>, DbErr> {
    let mut find = subscriptions::Entity::find_by_id(user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    find.one(txn).await
}

/// Offers `user_id` its open renewal when one is due ([`Step::Create`]'s
/// rule: a paid, `active` or in-grace, non-cancelling subscription whose
/// period end is within [`Policy::lead`]), under the subscription's lock,
/// with the reminder already due (the latest offset whose time has come,
/// before the period end) queued in the same transaction, so the customer
/// hears of it as soon as it exists. Answers what happened: nothing when
/// none is due or one is open already; [`Outcome::Created`] (and
/// [`Outcome::Reminded`]); [`Outcome::Unpriced`] the first time the plan
/// is found gone from the catalogue in a period. Also called when the
/// customer changes the plan the next renewal bills or resumes, so the new
/// offer shows at once (a reminder of an offset already sent for the period
/// is not sent again: the mail's key names the period and offset).
pub async fn offer<C: ConnectionTrait + TransactionTrait>(
    db: &C,
    policy: &Policy,
    catalogue: &Catalogue,
    now: DateTime<Utc>,
    user_id: Uuid,
) -> Result<Vec<Outcome>, DbErr> {
    let txn = begin_write(db).await?;
    let Some(sub) = locked_subscription(&txn, user_id).await? else {
        return Ok(vec![]);
    };
    let Some(end) = sub.current_period_end else {
        return Ok(vec![]);
    };
    // Active and coming due, or already in its grace (a subscription that
    // came into range after its end, or whose renewal was voided and then
    // resumed): the customer can still pay until the grace ends.
    if sub.plan == FREE
        || !matches!(
            sub.status,
            SubscriptionStatus::Active | SubscriptionStatus::PastDue
        )
        || sub.cancel_at_period_end
        // A paid phase follows this period: its renewal was paid.
        || sub.scheduled_plan.is_some()
        || end > now + policy.lead()
        || grace_end(&sub, policy.grace).is_some_and(|g| g <= now)
    {
        return Ok(vec![]);
    }
    let plan_id = sub.renewal_plan.as_deref().unwrap_or(&sub.plan);
    let Some(plan) = catalogue.get(plan_id).filter(|p| p.price > 0) else {
        tracing::warn!(%user_id, plan = plan_id, "renewal: the plan is not in the catalogue");
        // Told (and counted) once per period: the mail's key.
        let queued = mail(
            &txn,
            BillingMailKind::RenewalUnavailable,
            user_id,
            format!("renewal_unavailable:{user_id}:{}", end.timestamp()),
            serde_json::json!({ "plan": plan_id, "period_end": end }),
        )
        .await?;
        txn.commit().await?;
        return Ok(if queued == Queued::AlreadyQueued {
            vec![]
        } else {
            vec![Outcome::Unpriced]
        });
    };
    // What it bills: the price of record, unless a cut or a rise told in
    // time applies ([`crate::billing::price`]).
    let record = crate::billing::price::record_for(&txn, &sub, &plan.id).await?;
    let priced = crate::billing::price::renewal_price(
        &plan.id,
        record,
        crate::billing::price::Notice::of(&sub),
        plan.price,
        now,
        policy.price_notice,
    );
    // The reminder due now, if any, and when the next one is due.
    let remind_now = policy.reminder_due(end, now);
    let next_reminder_at = match remind_now {
        Some(d) => policy.after(end, d),
        None if end > now => policy.first_reminder(end),
        None => None,
    };
    let row = renewals::ActiveModel {
        id: Set(Uuid::now_v7()),
        user_id: Set(user_id),
        period_end: Set(end),
        plan: Set(plan.id.clone()),
        amount: Set(priced.amount),
        currency: Set(catalogue.currency.clone()),
        status: Set(RenewalStatus::Open),
        next_reminder_at: Set(next_reminder_at),
        created_at: Set(now),
        updated_at: Set(now),
    };
    let renewal = row.clone().try_into_model()?;
    // Another worker (or an earlier run of this job) may have created it:
    // the partial unique index makes that insert a no-op (`ON CONFLICT DO
    // NOTHING`, so the transaction around it stays usable).
    let inserted = renewals::Entity::insert(row)
        .on_conflict(OnConflict::new().do_nothing().to_owned())
        .exec_without_returning(&txn)
        .await?;
    if inserted == 0 {
        return Ok(vec![]);
    }
    if priced.withdraw {
        let mut am = sub.clone().into_active_model();
        crate::billing::price::clear_notice(&mut am);
        am.updated_at = Set(now);
        am.update(&txn).await?;
    }
    if let Some(amount) = priced.announce {
        announce_price(
            &txn,
            policy,
            &catalogue.currency,
            sub,
            record,
            amount,
            &renewal,
            now,
        )
        .await?;
    }
    let mut outcomes = vec![Outcome::Created];
    if let Some(d) = remind_now {
        if remind(&txn, policy, &renewal, d, now).await? == Queued::Queued {
            outcomes.push(Outcome::Reminded);
        }
    }
    txn.commit().await?;
    Ok(outcomes)
}

/// Records the notice of a price rise to `amount` on `sub` (locked) and
/// queues its `price_change` mail, in the transaction that offers
/// `renewal` ([`crate::billing::price`]). A user without an address gets
/// no mail; the notice is recorded all the same (the reminders and the
/// account page show the price).
#[allow(clippy::too_many_arguments)]
async fn announce_price<C: ConnectionTrait>(
    txn: &C,
    policy: &Policy,
    currency: &str,
    sub: subscriptions::Model,
    record: Option<i64>,
    amount: i64,
    renewal: &renewals::Model,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    let user_id = sub.user_id;
    let plan = renewal.plan.clone();
    let mut am = sub.into_active_model();
    am.price_notice_plan = Set(Some(plan.clone()));
    am.price_notice_amount = Set(Some(amount));
    am.price_notice_at = Set(Some(now));
    am.updated_at = Set(now);
    am.update(txn).await?;
    mail(
        txn,
        BillingMailKind::PriceChange,
        user_id,
        format!(
            "price_change:{user_id}:{plan}:{amount}:{}",
            now.timestamp_micros()
        ),
        json!({
            "plan": plan,
            "old_amount": record,
            "amount": amount,
            "currency": currency,
            "noticed_at": now,
            "applies_after": now + policy.price_notice,
            "next_due_at": renewal.period_end,
            "next_amount": renewal.amount,
        }),
    )
    .await?;
    Ok(())
}

/// Queues the reminder of offset `days` for `renewal` at `now`: the pay
/// link, the amount and the real time left. Its key names the user, the
/// period end and the offset, so it goes once per offset and period, even
/// across a replaced renewal (a plan change, a resume).
async fn remind<C: ConnectionTrait>(
    txn: &C,
    policy: &Policy,
    renewal: &renewals::Model,
    days: u32,
    now: DateTime<Utc>,
) -> Result<Queued, DbErr> {
    // The plan in force, named beside the one the renewal bills when a
    // `change` made them differ.
    let current_plan = subscriptions::Entity::find_by_id(renewal.user_id)
        .one(txn)
        .await?
        .map(|s| s.plan);
    let vars = json!({
        "current_plan": current_plan.unwrap_or_else(|| renewal.plan.clone()),
        "plan": renewal.plan,
        "amount": renewal.amount,
        "currency": renewal.currency,
        "due_at": renewal.period_end,
        "seconds_left": (renewal.period_end - now).num_seconds(),
        "pay_url": policy.pay_url(renewal.id),
    });
    mail(
        txn,
        BillingMailKind::RenewalReminder,
        renewal.user_id,
        format!(
            "reminder:{}:{}:{days}",
            renewal.user_id,
            renewal.period_end.timestamp()
        ),
        vars,
    )
    .await
}

async fn remind_one<C>(
    db: &C,
    policy: &Policy,
    now: DateTime<Utc>,
    renewal_id: Uuid,
) -> Result<Option<Outcome>, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut find = renewals::Entity::find_by_id(renewal_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        find = find.lock_exclusive();
    }
    let Some(r) = find.one(&txn).await? else {
        return Ok(None);
    };
    let due = r.status == RenewalStatus::Open && r.next_reminder_at.is_some_and(|at| at <= now);
    if !due {
        return Ok(None);
    }
    // A renewal the subscription no longer runs (its period end or plan
    // moved by a settlement that raced the offer) asks for nothing: void.
    let sub = subscriptions::Entity::find_by_id(r.user_id)
        .one(&txn)
        .await?;
    if crate::billing::renewal::settle::fit(Some(&r), sub.as_ref())
        != crate::billing::renewal::settle::Fit::Renews
    {
        tracing::info!(renewal_id = %r.id, user_id = %r.user_id, "renewal: no longer renews the subscription; voided instead of reminded");
        void(&txn, &[renewal_id], now).await?;
        txn.commit().await?;
        return Ok(None);
    }
    let sent = policy.reminder_due(r.period_end, now);
    let next = sent.and_then(|d| policy.after(r.period_end, d));
    let outcome = match sent {
        Some(d) => {
            (remind(&txn, policy, &r, d, now).await? == Queued::Queued).then_some(Outcome::Reminded)
        }
        None => None,
    };
    let mut am = r.into_active_model();
    am.next_reminder_at = Set(next);
    am.updated_at = Set(now);
    am.update(&txn).await?;
    txn.commit().await?;
    Ok(outcome)
}

async fn past_due_one<C>(
    db: &C,
    policy: &Policy,
    catalogue: &Catalogue,
    now: DateTime<Utc>,
    user_id: Uuid,
) -> Result<Option<Outcome>, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let Some(sub) = locked_subscription(&txn, user_id).await? else {
        return Ok(None);
    };
    let Some(end) = sub.current_period_end else {
        return Ok(None);
    };
    // However long ago the period ended (the loop paused meanwhile), the
    // customer is told first and gets the whole grace from now.
    let due = sub.plan != FREE
        && sub.status == SubscriptionStatus::Active
        && !sub.cancel_at_period_end
        && end < now
        && !policy.paused;
    if !due {
        return Ok(None);
    }
    let grace_end = later(now, policy.grace);
    let plan = sub.plan.clone();
    // A subscription already past its end when first seen (or whose offer
    // was voided) gets its renewal now, so the mail can carry its link.
    let renewal = match open_of(&txn, &sub).await? {
        Some(r) => Some(r),
        None => {
            offer(&txn, policy, catalogue, now, user_id).await?;
            open_of(&txn, &sub).await?
        }
    };
    let vars = json!({
        "plan": plan,
        "amount": renewal.as_ref().map(|r| r.amount),
        "currency": renewal.as_ref().map(|r| r.currency.clone()),
        "period_end": end,
        "grace_end": grace_end,
        "pay_url": renewal.as_ref().and_then(|r| policy.pay_url(r.id)),
    });
    mail(
        &txn,
        BillingMailKind::PastDue,
        user_id,
        format!("past_due:{user_id}:{}", end.timestamp()),
        vars,
    )
    .await?;
    let before = crate::billing::ledger::State::of(Some(&sub));
    let mut am = sub.into_active_model();
    am.status = Set(SubscriptionStatus::PastDue);
    am.past_due_at = Set(Some(now));
    am.grace_ends_at = Set(Some(grace_end));
    am.updated_at = Set(now);
    am.update(&txn).await?;
    crate::billing::ledger::note(
        &txn,
        user_id,
        &before,
        crate::billing::ledger::Cause::of(crate::billing::ledger::Kind::PastDue),
        now,
    )
    .await?;
    audit(
        &txn,
        audit::ACTION_PAST_DUE,
        user_id,
        json!({ "plan": plan, "status": "active", "period_end": end }),
        json!({ "plan": plan, "status": "past_due", "grace_end": grace_end }),
        now,
    )
    .await?;
    txn.commit().await?;
    Ok(Some(Outcome::PastDue))
}

async fn lapse_one<C>(
    db: &C,
    policy: &Policy,
    now: DateTime<Utc>,
    user_id: Uuid,
) -> Result<Option<Outcome>, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let Some(sub) = locked_subscription(&txn, user_id).await? else {
        return Ok(None);
    };
    let Some(end) = sub.current_period_end else {
        return Ok(None);
    };
    // A cancelling subscription at its end (owing nothing, also while the
    // loop is paused); any other only once its grace, which starts with the
    // past-due notice, has ended.
    let due = sub.plan != FREE
        && ((sub.cancel_at_period_end && end < now)
            || (!policy.paused && grace_end(&sub, policy.grace).is_some_and(|g| g <= now)));
    if !due {
        return Ok(None);
    }
    let old = json!({
        "plan": sub.plan,
        "status": sub.status.as_str(),
        "period_end": sub.current_period_end,
    });
    let before = crate::billing::ledger::State::of(Some(&sub));
    let mut am = sub.into_active_model();
    am.plan = Set(FREE.to_string());
    am.status = Set(SubscriptionStatus::Active);
    am.cancel_at_period_end = Set(false);
    am.current_period_start = Set(None);
    am.current_period_end = Set(None);
    am.billing_anchor_day = Set(None);
    am.billing_anchor_time = Set(None);
    am.past_due_at = Set(None);
    am.grace_ends_at = Set(None);
    am.renewal_plan = Set(None);
    crate::billing::price::clear_notice(&mut am);
    am.updated_at = Set(now);
    am.update(&txn).await?;
    crate::billing::ledger::note(
        &txn,
        user_id,
        &before,
        crate::billing::ledger::Cause::of(crate::billing::ledger::Kind::Lapse),
        now,
    )
    .await?;
    void_open(&txn, user_id, now).await?;
    let mailed = mail(
        &txn,
        BillingMailKind::Lapsed,
        user_id,
        format!("lapsed:{user_id}:{}", end.timestamp()),
        json!({ "plan": old["plan"], "period_end": end, "lapsed_at": now }),
    )
    .await?;
    if mailed == Queued::NoEmail {
        audit(
            &txn,
            audit::ACTION_NO_EMAIL,
            user_id,
            old.clone(),
            json!({ "plan": FREE, "reason": "no email address: no reminder or lapse mail was sent" }),
            now,
        )
        .await?;
    }
    audit(
        &txn,
        audit::ACTION_SUBSCRIPTION_EXPIRE,
        user_id,
        old,
        json!({ "plan": FREE, "status": "active" }),
        now,
    )
    .await?;
    txn.commit().await?;
    Ok(Some(Outcome::Lapsed))
}

/// Voids every open renewal of `user_id` (a cancel, a lapse, a settlement
/// that moved the plan or period end) and asks, through the job outbox in
/// the same transaction, that their checkouts still `PENDING` be ended at
/// the provider ([`crate::billing::renewal::pay::expire_checkouts`]); gives back the
/// subscription's claim of the create pass, so the next offer is not held
/// back by it; answers how many renewals were voided.
pub async fn void_open<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let open: Vec<Uuid> = renewals::Entity::find()
        .select_only()
        .column(renewals::Column::Id)
        .filter(renewals::Column::UserId.eq(user_id))
        .filter(renewals::Column::Status.eq(RenewalStatus::Open))
        .into_tuple()
        .all(db)
        .await?;
    if open.is_empty() {
        return Ok(0);
    }
    let voided = void(db, &open, now).await?;
    // The claim that queued its offer no longer hides the subscription: a
    // new offer (after `resume`, or for a new period end already due) comes
    // at the next tick, not a lease later.
    crate::billing::renewal::scan::release_claims(db, Step::Create, &[user_id]).await?;
    Ok(voided)
}

/// Voids the renewals `ids` still open and asks, through the job outbox in
/// the caller's transaction, that their checkouts still `PENDING` be ended
/// at the provider ([`crate::billing::renewal::pay::expire_checkouts`]); answers how
/// many were voided.
async fn void<C: ConnectionTrait>(db: &C, ids: &[Uuid], now: DateTime<Utc>) -> Result<u64, DbErr> {
    let voided = renewals::Entity::update_many()
        .col_expr(
            renewals::Column::Status,
            Expr::value(RenewalStatus::Void.as_str()),
        )
        .col_expr(
            renewals::Column::NextReminderAt,
            Expr::value(None::<DateTime<Utc>>),
        )
        .col_expr(renewals::Column::UpdatedAt, Expr::value(now))
        .filter(renewals::Column::Id.is_in(ids.iter().copied()))
        .filter(renewals::Column::Status.eq(RenewalStatus::Open))
        .exec(db)
        .await?
        .rows_affected;
    crate::billing::renewal::pay::expire_checkouts(db, ids).await?;
    Ok(voided)
}

/// The open renewal of `sub` (the one for its current period end), if any.
pub async fn open_of<C: ConnectionTrait>(
    db: &C,
    sub: &subscriptions::Model,
) -> Result<Option<renewals::Model>, DbErr> {
    let Some(end) = sub.current_period_end else {
        return Ok(None);
    };
    renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(sub.user_id))
        .filter(renewals::Column::PeriodEnd.eq(end))
        .filter(renewals::Column::Status.eq(RenewalStatus::Open))
        .one(db)
        .await
}

/// How many subscriptions are `past_due` now (the `past_due` gauge).
pub async fn past_due_count<C: ConnectionTrait>(db: &C) -> Result<u64, DbErr> {
    use sea_orm::PaginatorTrait;
    subscriptions::Entity::find()
        .filter(subscriptions::Column::Status.eq(SubscriptionStatus::PastDue))
        .count(db)
        .await
}

async fn audit<C: ConnectionTrait>(
    db: &C,
    action: &str,
    user_id: Uuid,
    old: serde_json::Value,
    new: serde_json::Value,
    now: DateTime<Utc>,
) -> Result<(), DbErr> {
    audit_logs::ActiveModel {
        id: Set(Uuid::now_v7()),
        actor_id: Set(None),
        action: Set(action.to_string()),
        target_type: Set(audit::TARGET_TYPE_SUBSCRIPTION.to_string()),
        target_id: Set(user_id.to_string()),
        old_value: Set(Some(old)),
        new_value: Set(Some(new)),
        request_id: Set(None),
        client_request_id: Set(None),
        created_at: Set(now),
    }
    .insert(db)
    .await
    .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn reminders_latest_due_only_then_the_next() {
        let p = Policy {
            grace: Duration::days(3),
            paused: false,
            reminder_days: vec![7, 3, 1],
            pay_secret: None,
            api_url: String::new(),
            price_notice: Duration::days(30),
            zone: chrono_tz::Asia::Jakarta,
        };
        let end = at("2026-12-20T10:00:00Z");
        assert_eq!(p.lead(), Duration::days(7));
        assert_eq!(p.first_reminder(end), Some(at("2026-12-13T10:00:00Z")));
        assert_eq!(p.latest_due(end, at("2026-12-13T09:59:59Z")), None);
        assert_eq!(p.latest_due(end, at("2026-12-13T10:00:00Z")), Some(7));
        // Came into range two days before the end: only the 3-day one.
        assert_eq!(p.latest_due(end, at("2026-12-18T10:00:00Z")), Some(3));
        assert_eq!(p.after(end, 3), Some(at("2026-12-19T10:00:00Z")));
        assert_eq!(p.after(end, 1), None);
        let none = Policy {
            grace: Duration::zero(),
            paused: false,
            reminder_days: vec![],
            pay_secret: None,
            api_url: String::new(),
            price_notice: Duration::days(30),
            zone: chrono_tz::Asia::Jakarta,
        };
        assert_eq!(none.first_reminder(end), None);
        assert_eq!(none.lead(), Duration::days(1));
    }
}
