//! Generated billing histories: a property test of the money invariant of
//! `README.md` ("The invariants", Money): every second of a paid period is
//! bought by money still paid, at the price it was sold at, and a refund
//! takes back only what that money bought that is still to come.
//!
//! One customer per case, on the schema the migrations make (SQLite in
//! memory, then a scratch PostgreSQL database). The steps are what the
//! providers and the calendar do to a subscription through the model's own
//! entry points: a checkout of BASIC, PRO or ULTIMATE at its catalogue price
//! settled `PAID` (`settlement::settle_status_check`, the path webhooks and
//! reconciliation share), a full refund of an earlier payment settled
//! `REFUNDED`, time passing (every stored time of the customer moved back,
//! as if the database's clock had moved on), a tick of the renewal loop
//! (its lapse, past-due and offer passes, `renewal::run_batch`), paying
//! the open renewal, paying a checkout of the latest renewal whatever it
//! became since (outdated renewal payments, priced as time on the plan in
//! force), `change` of the next renewal's plan, and `cancel` /
//! `resume`. Between ticks an ended period stays `active`, as while the
//! loop is late or paused.
//!
//! After every step, with `R` the paid time still to come (the period end
//! less the database's now, on a paid plan) and `P` the price of the plan in
//! force:
//! * **no free time**: `R` is at most what the money still paid could buy
//!   of that plan: `R × P ≤ Σ(amount − refunded of PAID payments) × 31 days`;
//! * **nothing paid, nothing running**: with no payment `PAID`, `R = 0`;
//! * **a refund takes only its own**: refunding a payment whose grant is
//!   over and carried nothing on leaves the plan and its end unchanged (but
//!   in a grace, below), and
//!   one whose grant carried nothing on takes at most what is still to come
//!   of that grant; in its grace, the whole refund of the payment whose
//!   grant ends the period ends the grace (FREE);
//! * **paying never loses time**: after a payment of plan `Q` settles, at
//!   least a short month (28 days) of `Q` runs, plus what ran before,
//!   converted at the prices (`R' × Q ≥ 28 days × Q + R × P × 28/31`),
//!   less at most a grace (three days) of a period that had ended (the
//!   grace days are billed; a payment never buys a period already over).
//!
//! Cases: `BILLING_CASES` (default 1000 per backend, under a minute), seed
//! `BILLING_SEED` (default 44); a failing case is shrunk to its shortest
//! history and printed. Run: `TEST_DATABASE_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo nextest run -p migration -E 'test(/billing_histories/)'`.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use chrono_tz::Asia::Jakarta;
use entity::{
    accounts::users::{ensure_user, Identity},
    base::plans::Catalogue,
    billing::{
        payment::PaymentStatus,
        renewal, settlement,
        subscription::{self, SubscriptionAction},
        Terms,
    },
    entities::{
        payments,
        renewals::{self, RenewalStatus},
        subscriptions,
    },
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngSeed, TestCaseError, TestRunner},
};
use sea_orm::{
    sea_query::Expr, ActiveModelTrait, ColumnTrait, DatabaseConnection, EntityTrait,
    IntoActiveModel, QueryFilter, QueryOrder, Set,
};
use uuid::Uuid;

use crate::common::{sqlite_memory, Scratch};

/// `BILLING_TIME_ZONE` and `RENEWAL_GRACE_SECS` (three days).
const TERMS: Terms = Terms {
    zone: Jakarta,
    grace: Duration::days(3),
};

/// The paid plans of `config/plans.toml` and their prices (IDR).
const PLANS: [(&str, i64); 3] = [("BASIC", 49_000), ("PRO", 99_000), ("ULTIMATE", 299_000)];

fn price(plan: &str) -> i64 {
    PLANS
        .iter()
        .find(|(p, _)| *p == plan)
        .map_or(0, |(_, price)| *price)
}

/// One thing that happens to the customer.
#[derive(Debug, Clone)]
enum Step {
    /// A checkout of `PLANS[i]` is paid.
    Pay(usize),
    /// The `k`-th payment (mod how many there are) is refunded in full.
    Refund(usize),
    /// This many hours pass.
    Pass(i64),
    /// A tick of the renewal loop: its passes in a tick's order.
    Tick,
    /// The open renewal (if any) is paid through its pay link.
    PayRenewal,
    /// A checkout made through the latest renewal's pay link, whatever it
    /// became since (paid, voided, outdated), is paid now.
    PayStaleRenewal,
    /// `change`: the next renewal bills `PLANS[i]`.
    Change(usize),
    /// `cancel`, or `resume` when `false`.
    Cancel(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..PLANS.len()).prop_map(Step::Pay),
        2 => (0..8usize).prop_map(Step::Refund),
        3 => prop_oneof![1i64..48, 24i64..24 * 45].prop_map(Step::Pass),
        3 => Just(Step::Tick),
        2 => Just(Step::PayRenewal),
        1 => Just(Step::PayStaleRenewal),
        1 => (0..PLANS.len()).prop_map(Step::Change),
        1 => any::<bool>().prop_map(Step::Cancel),
    ]
}

/// The renewal loop's settings: the grace of [`TERMS`], reminders 7, 3
/// and 1 days before the end (a renewal is offered 7 days ahead).
fn policy() -> renewal::Policy {
    renewal::Policy {
        grace: TERMS.grace,
        reminder_days: vec![7, 3, 1],
        pay_secret: None,
        api_url: String::new(),
        paused: false,
    }
}

fn catalogue() -> &'static Catalogue {
    static PLANS_FILE: std::sync::OnceLock<Catalogue> = std::sync::OnceLock::new();
    PLANS_FILE.get_or_init(|| {
        Catalogue::load(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/plans.toml"),
        )
        .expect("config/plans.toml")
    })
}

fn cases() -> u32 {
    std::env::var("BILLING_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

/// Paid seconds still to come and the plan in force.
async fn running(db: &DatabaseConnection, user: Uuid) -> (String, i64) {
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let now = entity::base::db::now(db).await.unwrap();
    let left = match s.current_period_end {
        Some(end) if s.plan != "FREE" => (end - now).num_seconds().max(0),
        _ => 0,
    };
    (s.plan, left)
}

async fn payments_of(db: &DatabaseConnection, user: Uuid) -> Vec<payments::Model> {
    payments::Entity::find()
        .filter(payments::Column::UserId.eq(user))
        .order_by_asc(payments::Column::CreatedAt)
        .order_by_asc(payments::Column::OrderId)
        .all(db)
        .await
        .unwrap()
}

/// A checkout of `plan` at its price, `PENDING`, created now.
async fn checkout(db: &DatabaseConnection, user: Uuid, plan: &str) -> String {
    let now = Utc::now();
    let order_id = entity::billing::payment::new_order_id("ORD", now);
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set(plan.into()),
        amount: Set(price(plan)),
        currency: Set("IDR".into()),
        provider: Set("provider_b".into()),
        status: Set(PaymentStatus::Pending),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    }
    .insert(db)
    .await
    .expect("insert payment");
    order_id
}

fn earlier(t: Option<DateTime<Utc>>, by: Duration) -> Option<DateTime<Utc>> {
    t.map(|t| t - by)
}

/// Moves every stored time of `user` back by `by`: as if `by` had passed.
/// The billing anchor is dropped (a subscription without one is anchored on
/// its current end).
async fn time_passes(db: &DatabaseConnection, user: Uuid, by: Duration) {
    let s = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .expect("subscription");
    let mut am = s.clone().into_active_model();
    am.current_period_start = Set(earlier(s.current_period_start, by));
    am.current_period_end = Set(earlier(s.current_period_end, by));
    am.canceled_at = Set(earlier(s.canceled_at, by));
    am.past_due_at = Set(earlier(s.past_due_at, by));
    am.grace_ends_at = Set(earlier(s.grace_ends_at, by));
    am.billing_anchor_day = Set(None);
    am.billing_anchor_time = Set(None);
    am.update(db).await.unwrap();
    for r in renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .all(db)
        .await
        .unwrap()
    {
        let mut am = r.clone().into_active_model();
        am.period_end = Set(r.period_end - by);
        am.next_reminder_at = Set(earlier(r.next_reminder_at, by));
        am.created_at = Set(r.created_at - by);
        am.update(db).await.unwrap();
    }
    for p in payments_of(db, user).await {
        let mut am = p.clone().into_active_model();
        am.created_at = Set(p.created_at - by);
        am.updated_at = Set(p.updated_at - by);
        am.paid_at = Set(earlier(p.paid_at, by));
        am.reconciled_at = Set(earlier(p.reconciled_at, by));
        am.grant_start = Set(earlier(p.grant_start, by));
        am.grant_end = Set(earlier(p.grant_end, by));
        am.grant_from_end = Set(earlier(p.grant_from_end, by));
        am.update(db).await.unwrap();
    }
}

/// What went wrong, with the history so far.
fn broken(what: String, history: &[String]) -> TestCaseError {
    TestCaseError::fail(format!("{what}\nhistory:\n  {}", history.join("\n  ")))
}

/// Runs one history for a new customer, checking the invariants after
/// every step.
async fn history(db: &DatabaseConnection, steps: &[Step]) -> Result<(), TestCaseError> {
    const MONTH_MAX: i128 = 31 * 86_400;
    const MONTH_MIN: i128 = 28 * 86_400;
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    let user = id.user_id;
    let mut log = Vec::new();
    for step in steps {
        let (plan_before, left_before) = running(db, user).await;
        let paid = payments_of(db, user).await;
        match step {
            Step::Pay(i) => {
                let plan = PLANS[*i].0;
                let order = checkout(db, user, plan).await;
                let outcome =
                    settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
                        .await
                        .unwrap();
                log.push(format!("pay {plan}: {outcome:?}"));
                let (plan_after, left_after) = running(db, user).await;
                if plan_after != plan {
                    return Err(broken(format!("paid {plan}, {plan_after} runs"), &log));
                }
                // A period that ended (untold: the loop does not run) is paid
                // from its old end for at most a grace after it: those days
                // are billed, never more.
                let billed_past = if plan_before != "FREE" && left_before == 0 {
                    i128::from(TERMS.grace.num_seconds())
                } else {
                    0
                };
                let want = (MONTH_MIN - billed_past) * i128::from(price(plan))
                    + i128::from(left_before) * i128::from(price(&plan_before)) * 28 / 31;
                let got = i128::from(left_after) * i128::from(price(plan));
                // One second per conversion of rounding.
                if got + 2 * i128::from(price(plan)) < want {
                    return Err(broken(
                        format!(
                            "paying lost time: {left_before} s of {plan_before} became {left_after} s of {plan}"
                        ),
                        &log,
                    ));
                }
            }
            Step::Refund(k) => {
                let settled: Vec<_> = paid
                    .iter()
                    .filter(|p| p.status == PaymentStatus::Paid)
                    .collect();
                if settled.is_empty() {
                    continue;
                }
                let p = settled[k % settled.len()];
                let before = subscriptions::Entity::find_by_id(user)
                    .one(db)
                    .await
                    .unwrap()
                    .expect("subscription");
                let now = entity::base::db::now(db).await.unwrap();
                // In its grace, the refund of the payment that bought the
                // period's end ends the grace.
                let ends_grace = before.status == subscriptions::SubscriptionStatus::PastDue
                    && before.current_period_end.is_some_and(|e| e <= now)
                    && p.grant_end.is_some()
                    && p.grant_end == before.current_period_end;
                let over_and_kept = p.grant_end.is_some_and(|e| e <= now)
                    && p.carried_into.is_none()
                    && p.carried_seconds.unwrap_or(0) == 0;
                // What is still to come of its grant, when nothing of it was
                // carried on: all a refund may take.
                let still_to_come = match (p.grant_start, p.grant_end, p.carried_into) {
                    (Some(s), Some(e), None) if p.grant_plan.as_deref() == Some(&plan_before) => {
                        Some((e - s.max(now)).num_seconds().max(0))
                    }
                    _ => None,
                };
                let outcome = settlement::settle_status_check(
                    db,
                    &p.order_id,
                    PaymentStatus::Refunded,
                    TERMS,
                    None,
                )
                .await
                .unwrap();
                log.push(format!(
                    "refund {} {} (grant {:?}..{:?}, carried {:?} into {:?}): {outcome:?}",
                    p.plan,
                    p.order_id,
                    p.grant_start,
                    p.grant_end,
                    p.carried_seconds,
                    p.carried_into
                ));
                let (plan_after, left_after) = running(db, user).await;
                if ends_grace && plan_after != "FREE" {
                    return Err(broken(
                        format!(
                            "refunding the payment of a period in grace left {plan_after} in force"
                        ),
                        &log,
                    ));
                }
                if let Some(own) = still_to_come.filter(|_| plan_after == plan_before) {
                    if left_before - left_after > own + 1 {
                        return Err(broken(
                            format!(
                                "a refund took {} s of {plan_before}, its grant had {own} s to come",
                                left_before - left_after
                            ),
                            &log,
                        ));
                    }
                }
                if over_and_kept
                    && !ends_grace
                    && (plan_after != plan_before || left_after < left_before - 1)
                {
                    return Err(broken(
                        format!(
                            "refunding a finished grant took {left_before} s of {plan_before} to {left_after} s of {plan_after}"
                        ),
                        &log,
                    ));
                }
            }
            Step::Pass(hours) => {
                time_passes(db, user, Duration::hours(*hours)).await;
                log.push(format!("{hours} h pass"));
            }
            Step::Tick => {
                let now = entity::base::db::now(db).await.unwrap();
                let mut outcomes = Vec::new();
                for pass in [
                    renewal::Step::Lapse,
                    renewal::Step::PastDue,
                    renewal::Step::Create,
                ] {
                    let report = renewal::run_batch(db, pass, &policy(), catalogue(), now, &[user])
                        .await
                        .unwrap();
                    outcomes.extend(report.outcomes);
                }
                log.push(format!("tick: {outcomes:?}"));
            }
            Step::PayRenewal | Step::PayStaleRenewal => {
                let mut find = renewals::Entity::find().filter(renewals::Column::UserId.eq(user));
                if matches!(step, Step::PayRenewal) {
                    find = find.filter(renewals::Column::Status.eq(RenewalStatus::Open));
                }
                let open = find
                    .order_by_desc(renewals::Column::CreatedAt)
                    .one(db)
                    .await
                    .unwrap();
                let Some(r) = open else { continue };
                let order = checkout(db, user, &r.plan).await;
                payments::Entity::update_many()
                    .col_expr(payments::Column::RenewalId, Expr::value(Some(r.id)))
                    .col_expr(payments::Column::Amount, Expr::value(r.amount))
                    .filter(payments::Column::OrderId.eq(&order))
                    .exec(db)
                    .await
                    .unwrap();
                let outcome =
                    settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
                        .await
                        .unwrap();
                log.push(format!(
                    "pay the renewal of {} ending {}: {outcome:?}",
                    r.plan, r.period_end
                ));
                let (plan_after, left_after) = running(db, user).await;
                if left_after == 0 {
                    return Err(broken(
                        format!("a renewal's payment bought nothing still to come ({plan_after})"),
                        &log,
                    ));
                }
            }
            Step::Change(i) => {
                let plan = PLANS[*i].0;
                let outcome =
                    subscription::choose_renewal_plan(db, user, plan, &policy(), catalogue()).await;
                log.push(format!(
                    "change to {plan}: {}",
                    if outcome.is_ok() { "ok" } else { "refused" }
                ));
            }
            Step::Cancel(cancel) => {
                let action = if *cancel {
                    SubscriptionAction::Cancel
                } else {
                    SubscriptionAction::Resume
                };
                let outcome = subscription::change(db, user, action).await;
                log.push(format!(
                    "{action:?}: {}",
                    if outcome.is_ok() { "ok" } else { "refused" }
                ));
            }
        }
        // After every step.
        let (plan, left) = running(db, user).await;
        let still_paid: i128 = payments_of(db, user)
            .await
            .iter()
            .filter(|p| p.status == PaymentStatus::Paid)
            .map(|p| i128::from(p.amount - p.refunded_amount))
            .sum();
        log.push(format!(
            "  → {plan}, {left} s left, {still_paid} still paid"
        ));
        if still_paid == 0 && left > 0 {
            return Err(broken(
                format!("nothing is paid, yet {left} s of {plan} run"),
                &log,
            ));
        }
        let p = i128::from(price(&plan));
        if p > 0 && i128::from(left) * p > still_paid * MONTH_MAX + p {
            return Err(broken(
                format!("free time: {left} s of {plan} for {still_paid} still paid"),
                &log,
            ));
        }
    }
    Ok(())
}

fn run_on(rt: &tokio::runtime::Runtime, db: Arc<DatabaseConnection>, backend: &str) {
    let config = ProptestConfig {
        cases: cases(),
        rng_seed: RngSeed::Fixed(
            std::env::var("BILLING_SEED")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(44),
        ),
        max_shrink_iters: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(step(), 1..14), |steps| {
        rt.block_on(history(&db, &steps))
    });
    if let Err(e) = result {
        panic!("{backend}: {e}");
    }
}

#[test]
fn generated_billing_histories_keep_the_money_invariant() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sqlite = Arc::new(rt.block_on(sqlite_memory()));
    run_on(&rt, sqlite, "SQLite");
    let scratch = rt.block_on(Scratch::create());
    let pg = Arc::new(scratch.db.clone());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_on(&rt, pg, "PostgreSQL")
    }));
    rt.block_on(scratch.remove());
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}

/// A named history from a red team against the release binaries: an
/// outdated BASIC renewal payment was priced from a refunded ULTIMATE plan
/// change whose carried time had been given back (its grant still spanned
/// the carried days, so ULTIMATE looked 36 % cheaper): 49,000 bought 6.9
/// days of ULTIMATE where its price buys 5.1. It must buy at most
/// 49,000 / 299,000 of an ULTIMATE month.
#[test]
fn an_outdated_renewal_is_priced_at_the_month_its_plan_was_sold_at() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = sqlite_memory().await;
        run_priced(&db).await;
        let scratch = Scratch::create().await;
        let outcome = tokio::spawn({
            let db = scratch.db.clone();
            async move { run_priced(&db).await }
        })
        .await;
        scratch.remove().await;
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}

async fn run_priced(db: &DatabaseConnection) {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    let user = id.user_id;
    let settle = |order: String| async move {
        settlement::settle_status_check(db, &order, PaymentStatus::Paid, TERMS, None)
            .await
            .unwrap()
    };
    settle(checkout(db, user, "BASIC").await).await;
    time_passes(db, user, Duration::days(25)).await;
    let now = entity::base::db::now(db).await.unwrap();
    renewal::run_batch(
        db,
        renewal::Step::Create,
        &policy(),
        catalogue(),
        now,
        &[user],
    )
    .await
    .unwrap();
    let offered = renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .one(db)
        .await
        .unwrap()
        .expect("a renewal offered");
    // A checkout through its pay link, left pending.
    let stale = checkout(db, user, "BASIC").await;
    payments::Entity::update_many()
        .col_expr(payments::Column::RenewalId, Expr::value(Some(offered.id)))
        .filter(payments::Column::OrderId.eq(&stale))
        .exec(db)
        .await
        .unwrap();
    settle(checkout(db, user, "PRO").await).await;
    let u1 = checkout(db, user, "ULTIMATE").await;
    settle(u1.clone()).await;
    settlement::settle_status_check(db, &u1, PaymentStatus::Refunded, TERMS, None)
        .await
        .unwrap();
    settle(checkout(db, user, "ULTIMATE").await).await;
    let before = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(before.plan, "ULTIMATE");
    settle(stale).await;
    let after = subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap();
    let added =
        (after.current_period_end.unwrap() - before.current_period_end.unwrap()).num_seconds();
    let most = 49_000 * 31 * 86_400 / 299_000 + 1;
    assert!(
        (1..=most).contains(&added),
        "49,000 bought {added} s of ULTIMATE; at its price at most {most} s"
    );
}
