//! Billing mails as the model queues them: the receipt of a payment, the
//! notice of a refund or chargeback, the renewal reminders, the past-due and
//! the lapse mails.
//!
//! The one entry is [`queue`], called inside the transaction that makes the
//! change the mail is about (a settlement, a lapse, a reminder tick). It
//!
//! * looks up the user's address (a user without one gets no mail, and that
//!   is no error: [`Queued::NoEmail`]);
//! * claims the mail's idempotency key in `billing_mails` (primary key): a
//!   key queued before is not queued again ([`Queued::AlreadyQueued`]), so a
//!   repeated settlement, tick or job never mails twice;
//! * writes the `send_billing_mail` job into the job outbox
//!   ([`crate::base::outbox`]), due at once, in the same transaction: no mail
//!   without the change, no change without the mail. The worker's relay
//!   moves it to the email queue.
//!
//! The worker renders the job with the templates of
//! `config/templates/billing/` (one place for every billing mail) and marks
//! the key sent ([`mark_sent`]) once the transport accepted it; a job whose
//! key is already sent is dropped ([`was_sent`]), so a re-run job does not
//! mail again either.
//!
//! Variables: every value in [`BillingMail::vars`] is given to the kind's
//! templates as is; times are RFC 3339 UTC text (the templates write them in
//! `BILLING_TIME_ZONE` with the `datetime` filter), amounts whole units of
//! their currency. Each kind's variables are listed on [`BillingMailKind`].

use std::time::Duration;

use chrono::{DateTime, Utc};
use sea_orm::{ConnectionTrait, DbBackend, DbErr, EntityTrait, Statement};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use uuid::Uuid;

use crate::{
    base::{outbox, plans::FREE},
    billing::grant,
    entities::{payments, subscriptions, users},
};

/// The job type (`type` tag) of a billing mail on the email queue; the
/// worker's `Job::SendBillingMail` carries a [`BillingMailJob`] under it.
pub const JOB_TYPE: &str = "send_billing_mail";

/// Which billing mail; each has its templates
/// `config/templates/billing/<name>.{subject.txt,txt,html}` ([`Self::as_str`]).
///
/// Variables every template gets: `app_name` (`APP_NAME`), `app_url`
/// (`APP_URL`), `api_url` (`API_EXTERNAL_URL`), `time_zone`
/// (`BILLING_TIME_ZONE`), `email` (the recipient). Per kind, in
/// [`BillingMail::vars`]:
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BillingMailKind {
    /// A payment became `PAID` (`receipt`): `order_id`, `plan` (id),
    /// `amount`, `currency`, `provider`, `paid_at`,
    /// `period_start`, `period_end`, `from_plan` (the plan it replaced, or
    /// null), `carried_seconds`. Key [`receipt_key`].
    Receipt,
    /// A payment was refunded or charged back (`refund_notice`): `order_id`,
    /// `plan`, `amount`, `currency`, `provider`, `refunded_at`,
    /// `subscription_plan` (the plan in force after it) and
    /// `subscription_period_end` (null on FREE). Key [`refund_key`].
    RefundNotice,
    /// A renewal comes due (`renewal_reminder`): `plan`,
    /// `amount`, `currency`, `due_at` (the period end), `seconds_left` (the
    /// real time left until `due_at`), `pay_url` (the renewal's link).
    RenewalReminder,
    /// The period ended unpaid; the plan is kept during grace (`past_due`):
    /// `plan`, `amount`, `currency`, `period_end`, `grace_end`,
    /// `pay_url`.
    PastDue,
    /// The plan returned to FREE (`lapsed`): `plan` (the plan that ended),
    /// `period_end`, `lapsed_at`.
    Lapsed,
    /// The plan the next renewal would bill is gone from the catalogue, so
    /// no renewal can be offered (`renewal_unavailable`): `plan`,
    /// `period_end`.
    RenewalUnavailable,
    /// The catalogue raised the price of the plan in force
    /// (`price_change`, [`crate::billing::price`]): `plan`, `old_amount`
    /// (what it renews at until then), `amount` (the new price),
    /// `currency`, `noticed_at`, `applies_after` (renewals created from
    /// then bill the new price), `next_due_at` and `next_amount` (the
    /// period end the renewal offered with this mail renews, and what it
    /// bills: the old price unless no notice is required). Key
    /// `price_change:<user>:<plan>:<amount>:<noticed_at>`.
    PriceChange,
}

impl BillingMailKind {
    /// Every kind.
    pub const ALL: [BillingMailKind; 7] = [
        BillingMailKind::Receipt,
        BillingMailKind::RefundNotice,
        BillingMailKind::RenewalReminder,
        BillingMailKind::PastDue,
        BillingMailKind::Lapsed,
        BillingMailKind::RenewalUnavailable,
        BillingMailKind::PriceChange,
    ];

    /// The kind's name: its template base name and `billing_mails.kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            BillingMailKind::Receipt => "receipt",
            BillingMailKind::RefundNotice => "refund_notice",
            BillingMailKind::RenewalReminder => "renewal_reminder",
            BillingMailKind::PastDue => "past_due",
            BillingMailKind::Lapsed => "lapsed",
            BillingMailKind::RenewalUnavailable => "renewal_unavailable",
            BillingMailKind::PriceChange => "price_change",
        }
    }
}

/// A billing mail to queue.
#[derive(Debug, Clone, PartialEq)]
pub struct BillingMail {
    /// Which mail.
    pub kind: BillingMailKind,
    /// The recipient (their current address is looked up).
    pub user_id: Uuid,
    /// Idempotency key, derived from what the mail is about
    /// (`receipt:<order id>`, `reminder:<renewal id>:<days>`); at most one
    /// mail is ever queued per key.
    pub key: String,
    /// The kind's template variables (see [`BillingMailKind`]).
    pub vars: Map<String, Value>,
}

/// The `send_billing_mail` job: what the worker renders and sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BillingMailJob {
    /// Which mail.
    pub kind: BillingMailKind,
    /// Idempotency key (also the email transport's idempotency key).
    pub key: String,
    /// The recipient's user id.
    pub user_id: Uuid,
    /// The address it goes to (the user's when queued).
    pub to: String,
    /// Template variables.
    pub vars: Map<String, Value>,
}

/// What [`queue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queued {
    /// The job is in the outbox (committed with the caller's transaction).
    Queued,
    /// A mail with this key was queued before: nothing written.
    AlreadyQueued,
    /// The user has no email address (or no longer exists): no mail.
    NoEmail,
}

/// Idempotency key of the receipt of order `order_id`.
pub fn receipt_key(order_id: &str) -> String {
    format!("receipt:{order_id}")
}

/// Idempotency key of the refund (or chargeback) notice of order `order_id`.
pub fn refund_key(order_id: &str) -> String {
    format!("refund:{order_id}")
}

/// `$n` on PostgreSQL, `?` on SQLite.
fn sql(backend: DbBackend, s: &str) -> String {
    match backend {
        DbBackend::Sqlite => (1..=9).fold(s.to_string(), |s, n| s.replace(&format!("${n}"), "?")),
        _ => s.to_string(),
    }
}

/// Queues `mail` (see the module docs) on `db`, which should be the
/// transaction making the change the mail is about.
pub async fn queue<C: ConnectionTrait>(db: &C, mail: BillingMail) -> Result<Queued, DbErr> {
    let to = users::Entity::find_by_id(mail.user_id)
        .one(db)
        .await?
        .and_then(|u| u.email)
        .filter(|e| !e.trim().is_empty());
    let Some(to) = to else {
        return Ok(Queued::NoEmail);
    };
    let backend = db.get_database_backend();
    let claimed = db
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql(
                backend,
                "INSERT INTO billing_mails (\"key\", kind, user_id) VALUES ($1, $2, $3) \
                 ON CONFLICT (\"key\") DO NOTHING",
            ),
            [
                mail.key.clone().into(),
                mail.kind.as_str().into(),
                mail.user_id.into(),
            ],
        ))
        .await?
        .rows_affected();
    if claimed == 0 {
        return Ok(Queued::AlreadyQueued);
    }
    let job = BillingMailJob {
        kind: mail.kind,
        key: mail.key,
        user_id: mail.user_id,
        to,
        vars: mail.vars,
    };
    outbox::insert(db, &outbox_row(&job), Duration::ZERO).await?;
    Ok(Queued::Queued)
}

/// The job outbox row of `job`: the worker's tagged job JSON
/// (`{"type": "send_billing_mail", ...}`).
pub fn outbox_row(job: &BillingMailJob) -> outbox::NewJob {
    outbox::NewJob::tagged(JOB_TYPE, job)
}

/// Whether the mail with idempotency key `key` was sent already.
pub async fn was_sent<C: ConnectionTrait>(db: &C, key: &str) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            sql(
                backend,
                "SELECT count(*) AS n FROM billing_mails WHERE \"key\" = $1 AND sent_at IS NOT NULL",
            ),
            [key.into()],
        ))
        .await?;
    Ok(match row {
        Some(r) => r.try_get::<i64>("", "n")? > 0,
        None => false,
    })
}

/// Records that the mail with key `key` was accepted by the transport, by
/// the database's clock. Returns whether this call recorded it (false: sent
/// before, or no such key).
pub async fn mark_sent<C: ConnectionTrait>(db: &C, key: &str) -> Result<bool, DbErr> {
    let backend = db.get_database_backend();
    let now = crate::base::db::now_sql(backend);
    let done = db
        .execute_raw(Statement::from_sql_and_values(
            backend,
            sql(
                backend,
                &format!(
                    "UPDATE billing_mails SET sent_at = {now} WHERE \"key\" = $1 AND sent_at IS NULL"
                ),
            ),
            [key.into()],
        ))
        .await?;
    Ok(done.rows_affected() > 0)
}

/// Queues the receipt of `pay`, which became `PAID` at `paid_at` and
/// granted `g`, in the settlement's transaction.
pub async fn queue_receipt<T: ConnectionTrait>(
    txn: &T,
    pay: &payments::Model,
    paid_at: DateTime<Utc>,
    g: &grant::Grant,
) -> Result<(), DbErr> {
    let receipt = super::ledger::receipt_number(txn, pay.id).await?;
    let vars = json!({
        "receipt_number": receipt,
        "carried_value": g.carried_value,
        "order_id": pay.order_id,
        "plan": pay.plan,
        "amount": pay.amount,
        "currency": pay.currency,
        "provider": pay.provider,
        "paid_at": paid_at,
        "period_start": g.start,
        "period_end": g.end,
        "from_plan": g.from_plan,
        "carried_seconds": g.carried_seconds,
        "granted_plan": g.plan,
    });
    queue(
        txn,
        BillingMail {
            kind: BillingMailKind::Receipt,
            user_id: pay.user_id,
            key: receipt_key(&pay.order_id),
            vars: as_map(vars),
        },
    )
    .await?;
    Ok(())
}

/// Queues the refund notice of `pay`, refunded (or charged back) at `now`;
/// `subscription` is what the take-back left (`{plan, period_end}`; `None`:
/// the subscription did not change, read as it is).
pub async fn queue_refund_notice<T: ConnectionTrait>(
    txn: &T,
    pay: &payments::Model,
    now: DateTime<Utc>,
    subscription: Option<&serde_json::Value>,
) -> Result<(), DbErr> {
    let row = subscriptions::Entity::find_by_id(pay.user_id)
        .one(txn)
        .await?;
    let (plan, end) = match (subscription, &row) {
        (Some(v), _) => (
            v["plan"].as_str().unwrap_or(FREE).to_string(),
            v["period_end"]
                .as_str()
                .and_then(|e| e.parse::<DateTime<Utc>>().ok()),
        ),
        (None, Some(s)) => (s.plan.clone(), s.current_period_end),
        (None, None) => (FREE.to_string(), None),
    };
    // A period already over is not stated as running: the plan is in its
    // grace (past due) until the scheduler moves it, unless it was
    // cancelled (it lapses, no renewal is owed).
    let cancelling = row.as_ref().is_some_and(|s| s.cancel_at_period_end);
    let over = end.is_some_and(|e| e <= now);
    let past_due = plan != FREE && over && !cancelling;
    let vars = json!({
        "order_id": pay.order_id,
        "plan": pay.plan,
        "amount": pay.amount,
        "currency": pay.currency,
        "provider": pay.provider,
        "refunded_at": now,
        "subscription_plan": plan,
        "subscription_period_end": end.filter(|_| !over),
        "taken_back": subscription.is_some(),
        "past_due_since": end.filter(|_| past_due),
    });
    queue(
        txn,
        BillingMail {
            kind: BillingMailKind::RefundNotice,
            user_id: pay.user_id,
            key: refund_key(&pay.order_id),
            vars: as_map(vars),
        },
    )
    .await?;
    Ok(())
}

fn as_map(v: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m,
        _ => serde_json::Map::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_outbox_row_is_the_tagged_job() {
        let job = BillingMailJob {
            kind: BillingMailKind::Receipt,
            key: receipt_key("ORD-1-ABCDEFGH"),
            user_id: Uuid::nil(),
            to: "ann@example.com".into(),
            vars: Map::new(),
        };
        let row = outbox_row(&job);
        assert_eq!(row.kind, JOB_TYPE);
        let v: Value = serde_json::from_str(&row.job).unwrap();
        assert_eq!(v["type"], JOB_TYPE);
        assert_eq!(v["kind"], "receipt");
        assert_eq!(v["key"], "receipt:ORD-1-ABCDEFGH");
        let back: BillingMailJob = serde_json::from_value(v).unwrap();
        assert_eq!(back, job);
    }

    #[test]
    fn kinds_have_distinct_names() {
        let names: std::collections::HashSet<_> =
            BillingMailKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(names.len(), BillingMailKind::ALL.len());
    }
}
