//! Generated billing histories: a property test of the money invariant of
//! `README.md` ("The invariants", Money): every second of a paid period is
//! bought by money still paid, at the price it was sold at, or given by an
//! operator, and a refund takes back only what that money bought that is
//! still to come.
//!
//! One customer per case, on the schema the migrations make (SQLite in
//! memory, then a scratch PostgreSQL database). The steps are what the
//! providers and the calendar do to a subscription through the model's own
//! entry points: a checkout of BASIC, PRO or ULTIMATE at its catalogue price
//! settled `PAID` (`settlement::settle_status_check`, the path webhooks and
//! reconciliation share), a full refund of an earlier payment settled
//! `REFUNDED`, a partial refund or chargeback of one (`refunded_amount`
//! grows, the payment stays `PAID`), time passing (the application's clock,
//! `entity::base::db::now`, moves on; each history begins now or on a
//! calendar edge: a month's last day, a leap day, a year's end), a tick of the renewal loop
//! (its lapse, past-due and offer passes in a shuffled order,
//! `renewal::run_batch`), paying
//! the open renewal, paying a checkout of the latest renewal whatever it
//! became since (outdated renewal payments, priced as time on the plan in
//! force), `change` of the next renewal's plan, `cancel` / `resume`, and
//! an operator's grant of a plan until a date, and the catalogue cutting or
//! raising a plan's price. Between ticks an ended period stays `active`, as while the
//! loop is late or paused. Steps also come as renewal cycles (a phase
//! scheduled), as "the end passes, a tick", and as two steps racing on the
//! pool ([`races`]); the checks after every step hold for any order.
//!
//! After every step, with `R` the paid time still to come (the period end
//! less the database's now, on a paid plan) and `P` the price of the plan in
//! force:
//! * **no free time**: `R` is at most what the money still paid could buy
//!   of that plan: `R × P ≤ Σ(amount of PAID payments) × 31 days` (a partial
//!   refund takes no time, so its payment's whole amount counts);
//! * **a partial refund takes no time**: the payment stays `PAID` with the
//!   total gone back, the plan and its end are unchanged;
//! * **nothing paid, nothing running**: with no payment `PAID`, `R = 0`;
//! * **a refund takes only its own**: refunding a payment whose grant is
//!   over and carried nothing on leaves the plan and its end unchanged (but
//!   in a grace, below), and
//!   one whose grant carried nothing on takes at most what is still to come
//!   of that grant; in its grace, the whole refund of the payment whose
//!   grant ends the period ends the grace (FREE);
//! * **grace always warns**: a tick (its lapse, past-due and offer passes
//!   in any of their orders, as several workers' batches interleave) lapses
//!   a paid plan only after its past-due notice was recorded and its grace
//!   is over, or at the end of a subscription set to end;
//! * **no rise without notice**: a renewal a tick offers bills at most the
//!   catalogue price, and more than the customer last paid for the plan
//!   only under a price-change notice recorded at least
//!   `PRICE_CHANGE_NOTICE_DAYS` before, for at least that amount; one
//!   offered below the catalogue price leaves the customer told of the rise
//!   (`R × P` above counts each plan at the lowest price it was sold at);
//! * **a paid change waits for the period end**: a scheduled phase is
//!   backed by its payment, still `PAID` and not carried on, of another
//!   plan than the one in force; after a tick none is left whose period
//!   end has passed (the tick began it);
//! * **renewals keep the anchor**: a paid period ends on its stored
//!   anchor, and paying the renewal of the plan in force before its end
//!   moves the end exactly one anchored month on (31 January → 29 February
//!   → 31 March);
//! * **paying never loses time**: after a payment of plan `Q` settles, at
//!   least a short month (28 days) of `Q` runs, plus what ran before,
//!   converted at the prices (`R' × Q ≥ 28 days × Q + R × P × 28/31`, the
//!   second term less what partial refunds gave back: they lower the value
//!   carried),
//!   less at most a grace (three days) of a period that had ended (the
//!   grace days are billed; a payment never buys a period already over).
//!
//! Cases: `BILLING_CASES` (default 1000 per backend), split among
//! `BILLING_WORKERS` workers (default one per core), each on a database of
//! its own (PostgreSQL ones cloned from one migrated template) with seed
//! `BILLING_SEED` (default 44) plus its number; a failing case is shrunk to
//! its shortest history and printed with the settings that run its worker
//! alone. Run: `TEST_DATABASE_ADMIN_URL=postgres://postgres@127.0.0.1:5432/postgres
//! cargo nextest run -p migration -E 'test(/billing_histories/)'`.

mod calendar;
mod checks;
mod named;
mod phases;
mod prices;
mod races;
mod world;

use chrono::Duration;
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::{
        payment::PaymentStatus,
        renewal, settlement,
        subscription::{self, SubscriptionAction},
    },
    entities::{
        renewals::{self, RenewalStatus},
        subscriptions,
    },
};
use proptest::{
    prelude::*,
    test_runner::{Config as ProptestConfig, RngSeed, TestCaseError, TestRunner},
};
use sea_orm::{ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter, QueryOrder};
use uuid::Uuid;

use crate::common::{sqlite_memory, Scratch};
use checks::*;
use entity::billing::ledger;
use world::*;

/// One thing that happens to the customer.
#[derive(Debug, Clone)]
pub(super) enum Step {
    /// A checkout of `PLANS[i]` is paid.
    Pay(usize),
    /// The `k`-th payment (mod how many there are) is refunded in full.
    Refund(usize),
    /// The `k`-th `PAID` payment is partly refunded or charged back: this
    /// many percent (1–99) of what is still paid of it goes back.
    PartialRefund(usize, i64),
    /// This many hours pass.
    Pass(i64),
    /// A tick of the renewal loop: its passes in a tick's order.
    /// A tick of the renewal loop: its lapse, past-due and offer passes,
    /// in the `k`-th of their six orders (0: the scheduler's own; the rule
    /// must not depend on it: several workers' batches interleave).
    Tick(usize),
    /// The open renewal (if any) is paid through its pay link.
    PayRenewal,
    /// A checkout made through the latest renewal's pay link, whatever it
    /// became since (paid, voided, outdated), is paid now.
    PayStaleRenewal,
    /// `change`: the next renewal bills `PLANS[i]`.
    Change(usize),
    /// `cancel`, or `resume` when `false`.
    Cancel(bool),
    /// An operator gives `PLANS[i]` until this many hours from now.
    Give(usize, i64),
    /// The catalogue sells every plan at this many percent of its price in
    /// `config/plans.toml` from now on (a cut or a rise).
    Reprice(i64),
    /// Time passes to this many hours before the period end (if a paid
    /// period runs): into the renewal's lead, or (negative) past the end.
    ToEnd(i64),
    /// Two of the steps above at once ([`races`]).
    Race(Box<Step>, Box<Step>),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (0..PLANS.len()).prop_map(Step::Pay),
        2 => (0..8usize).prop_map(Step::Refund),
        1 => (0..8usize, 1i64..100).prop_map(|(k, pct)| Step::PartialRefund(k, pct)),
        2 => prop_oneof![1i64..48, 24i64..24 * 45].prop_map(Step::Pass),
        4 => prop_oneof![3 => Just(0usize), 1 => 1usize..6].prop_map(Step::Tick),
        3 => Just(Step::PayRenewal),
        1 => Just(Step::PayStaleRenewal),
        2 => (0..PLANS.len()).prop_map(Step::Change),
        1 => any::<bool>().prop_map(Step::Cancel),
        1 => (0..PLANS.len(), 1i64..24 * 60).prop_map(|(i, h)| Step::Give(i, h)),
        1 => prop_oneof![Just(80i64), Just(100), Just(130), Just(160)].prop_map(Step::Reprice),
        4 => (-72i64..24 * 8).prop_map(Step::ToEnd),
    ]
}

/// Runs one history for a new customer, checking the invariants after
/// every step.
pub(super) async fn history(
    db: &DatabaseConnection,
    start: Option<chrono::DateTime<chrono::Utc>>,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    const MONTH_MAX: i128 = 31 * 86_400;
    const MONTH_MIN: i128 = 28 * 86_400;
    begin_at(db, start).await;
    // With an address, so the billing mails the customer is told by are
    // rows the checks read ([`checks::price_mails`]).
    let user_id = Uuid::new_v4();
    let id = Identity {
        user_id,
        email: Some(format!("{}@example.com", user_id.simple())),
    };
    ensure_user(db, &id, &[]).await.unwrap();
    let user = id.user_id;
    let mut log = vec![format!(
        "begins {}",
        start.map_or("now".to_string(), |t| t.to_rfc3339())
    )];
    // What an operator gave that may still be in the period: its plan and
    // at most this many seconds (an upper bound: it is the period's tail,
    // or its middle once the plan was paid again after it).
    let mut given: Option<(String, i64)> = None;
    // The catalogue in force, and the lowest price each plan was sold at
    // in this history (what its time is worth at least).
    let mut cat = catalogue().clone();
    // Whether a phase waited after some step.
    let mut phased = false;
    // The model's own reading of the run (since the plan in force last
    // began after FREE) and the price-change notice the customer holds.
    let mut run = Run::default();
    let mut floor: std::collections::HashMap<String, i64> =
        PLANS.iter().map(|(p, a)| (p.to_string(), *a)).collect();
    for step in steps {
        let (plan_before, left_before) = running(db, user).await;
        // A phase whose start has come: a settlement or grant begins it
        // before deciding, so the checks that reason from the plan before
        // the step (a refund takes only its own, a partial refund takes
        // nothing) hold against the phase, not the plan it ends; the
        // invariants after every step still apply.
        let (phase_waits, phase_due) = {
            let s = subscription(db, user).await;
            let now = entity::base::db::now(db).await.unwrap();
            (
                s.scheduled_plan.is_some(),
                s.scheduled_plan.is_some() && s.current_period_end.is_some_and(|e| e <= now),
            )
        };
        let paid = payments_of(db, user).await;
        let state_before = ledger::State::read(db, user).await.unwrap();
        let rows_before = ledger_rows(db, user).await.len();
        // Seconds of the time to come that no money bought.
        let given_before = match &given {
            Some((plan, secs)) if *plan == plan_before => (*secs).min(left_before),
            _ => 0,
        };
        // A renewal paid on time: the end and anchor it renews.
        let mut renewed = None;
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
                // Partial refunds lowered the value the time before carries
                // (by at most what went back); that time is worth at least
                // the lowest price its plan was sold at (a cut renewal).
                let partly_back: i128 = paid
                    .iter()
                    .filter(|p| p.status == PaymentStatus::Paid)
                    .map(|p| i128::from(p.refunded_amount))
                    .sum();
                // What an operator gave carries nothing into another plan;
                // while a phase waits, any payment is a plan change
                // (docs/billing.md, "Plan changes").
                let carried_left = if plan == plan_before && !phase_waits {
                    left_before
                } else {
                    left_before - given_before
                };
                let want = (MONTH_MIN - billed_past) * i128::from(price(plan))
                    + (i128::from(carried_left)
                        * i128::from(floor.get(&plan_before).copied().unwrap_or(0))
                        * 28
                        / 31
                        - partly_back * MONTH_MIN)
                        .max(0);
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
                if let Some(own) = still_to_come.filter(|_| plan_after == plan_before && !phase_due)
                {
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
                    && !phase_due
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
            Step::PartialRefund(k, pct) => {
                let settled: Vec<_> = paid
                    .iter()
                    .filter(|p| p.status == PaymentStatus::Paid && p.refunded_amount < p.amount - 1)
                    .collect();
                if settled.is_empty() {
                    continue;
                }
                let p = settled[k % settled.len()];
                // The provider states the total gone back so far; it only grows
                // and stays below the amount (the whole of it is a refund).
                let back = (p.refunded_amount
                    + ((p.amount - p.refunded_amount) * pct / 100).max(1))
                .min(p.amount - 1);
                entity::billing::ledger::record_partial_refund(db, &p.order_id, back)
                    .await
                    .unwrap();
                let outcome = settlement::settle_status_check(
                    db,
                    &p.order_id,
                    PaymentStatus::Paid,
                    TERMS,
                    None,
                )
                .await
                .unwrap();
                log.push(format!(
                    "partial refund of {} {}: {back} of {} back so far: {outcome:?}",
                    p.plan, p.order_id, p.amount
                ));
                let after = payments_of(db, user).await;
                let now_p = after.iter().find(|q| q.id == p.id).expect("the payment");
                if now_p.status != PaymentStatus::Paid || now_p.refunded_amount != back {
                    return Err(broken(
                        format!(
                            "a partial refund left the payment {:?} with {} back",
                            now_p.status, now_p.refunded_amount
                        ),
                        &log,
                    ));
                }
                // It takes no time.
                let (plan_after, left_after) = running(db, user).await;
                if !phase_due && (plan_after != plan_before || left_after < left_before - 1) {
                    return Err(broken(
                        format!(
                            "a partial refund took {left_before} s of {plan_before} to {left_after} s of {plan_after}"
                        ),
                        &log,
                    ));
                }
            }
            Step::Pass(hours) => {
                time_passes(db, Duration::hours(*hours)).await;
                log.push(format!("{hours} h pass"));
            }
            Step::Tick(order) => {
                use renewal::Step::{Create, Lapse, PastDue};
                const ORDERS: [[renewal::Step; 3]; 6] = [
                    [Lapse, PastDue, Create],
                    [Lapse, Create, PastDue],
                    [PastDue, Lapse, Create],
                    [PastDue, Create, Lapse],
                    [Create, Lapse, PastDue],
                    [Create, PastDue, Lapse],
                ];
                let before = subscriptions::Entity::find_by_id(user)
                    .one(db)
                    .await
                    .unwrap()
                    .expect("subscription");
                let now = entity::base::db::now(db).await.unwrap();
                let mut outcomes = Vec::new();
                for pass in ORDERS[order % ORDERS.len()] {
                    let report = renewal::run_batch(db, pass, &policy(), &cat, now, &[user])
                        .await
                        .unwrap();
                    outcomes.extend(report.outcomes);
                }
                log.push(format!("tick {order}: {outcomes:?}"));
                check_renewal_prices(db, user, &before, &paid, &cat, now, &mut run)
                    .await
                    .map_err(|e| broken(e, &log))?;
                // Grace always warns: a paid plan lapses only after its
                // past-due notice was recorded and its grace is over, or at
                // the end of a subscription set to end (owing nothing).
                let (plan_after, _) = running(db, user).await;
                let told = before.status == subscriptions::SubscriptionStatus::PastDue
                    && before.past_due_at.is_some()
                    && before.grace_ends_at.is_some_and(|g| g <= now);
                if plan_before != "FREE"
                    && plan_after == "FREE"
                    && !before.cancel_at_period_end
                    && !told
                {
                    return Err(broken(
                        format!(
                            "{plan_before} lapsed untold (status {:?}, past due {:?}, grace ends {:?})",
                            before.status, before.past_due_at, before.grace_ends_at
                        ),
                        &log,
                    ));
                }
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
                let sub = subscription(db, user).await;
                let now = entity::base::db::now(db).await.unwrap();
                // The renewal of the plan in force for the period's end,
                // paid before that end, no phase waiting: one anchored month.
                if r.status == RenewalStatus::Open
                    && r.plan == sub.plan
                    && sub.current_period_end == Some(r.period_end)
                    && r.period_end > now
                    && sub.scheduled_plan.is_none()
                {
                    renewed = Some((r.period_end, entity::billing::anchor::of_subscription(&sub)));
                }
                let order = renewal_checkout(db, user, &r).await;
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
                let before = subscription(db, user).await;
                let now = entity::base::db::now(db).await.unwrap();
                let outcome = subscription::choose_renewal_plan(
                    db,
                    user,
                    plan,
                    &policy(),
                    &cat,
                    Default::default(),
                )
                .await;
                log.push(format!(
                    "change to {plan}: {}",
                    if outcome.is_ok() { "ok" } else { "refused" }
                ));
                // Chosen now, at the catalogue's price now.
                let chosen = subscription(db, user).await.renewal_plan;
                if chosen != before.renewal_plan && chosen.as_deref() == Some(plan) {
                    let price = cat.get(plan).map_or(0, |p| p.price);
                    run.chose(plan, price);
                }
                // The renewal it offered at once, if one is due, is priced
                // for the plan chosen.
                let chose = subscriptions::Model {
                    renewal_plan: chosen,
                    ..before
                };
                check_renewal_prices(db, user, &chose, &paid, &cat, now, &mut run)
                    .await
                    .map_err(|e| broken(e, &log))?;
            }
            Step::Reprice(pct) => {
                for (plan, base) in PLANS {
                    let price = base * pct / 100;
                    cat.plans
                        .iter_mut()
                        .find(|p| p.id == plan)
                        .expect("a catalogue plan")
                        .price = price;
                    let low = floor.entry(plan.to_string()).or_insert(price);
                    *low = (*low).min(price);
                }
                log.push(format!("the catalogue sells at {pct} %"));
            }
            Step::ToEnd(hours) => {
                let end = subscriptions::Entity::find_by_id(user)
                    .one(db)
                    .await
                    .unwrap()
                    .and_then(|s| s.current_period_end);
                let now = entity::base::db::now(db).await.unwrap();
                let by = end.map_or(Duration::zero(), |e| e - now - Duration::hours(*hours));
                if by > Duration::zero() {
                    time_passes(db, by).await;
                }
                log.push(format!("time passes to {hours} h before the end ({by})"));
            }
            Step::Give(i, hours) => {
                let plan = PLANS[*i].0;
                let now = entity::base::db::now(db).await.unwrap();
                let grant = entity::billing::operator::OperatorGrant {
                    user_id: user,
                    plan: plan.into(),
                    until: now + Duration::hours(*hours),
                    reason: "generated".into(),
                };
                let outcome = entity::billing::operator::give(
                    db,
                    Uuid::new_v4(),
                    &grant,
                    TERMS.zone,
                    None,
                    None,
                )
                .await;
                log.push(format!("give {plan} for {hours} h: {outcome:?}"));
                let (plan_after, left_after) = running(db, user).await;
                match outcome {
                    Ok(_) if plan_before != plan && left_before > 0 && !phase_due => {
                        return Err(broken(
                            format!(
                                "a grant of {plan} replaced {left_before} s of paid {plan_before}"
                            ),
                            &log,
                        ));
                    }
                    Ok(g) => {
                        if plan_after != plan || left_after < hours * 3600 - 2 {
                            return Err(broken(
                                format!(
                                    "gave {plan} for {hours} h, {left_after} s of {plan_after} run"
                                ),
                                &log,
                            ));
                        }
                        // (A phase due began first: the grant extends it
                        // when of its plan.)
                        if !phase_due && g.extended != (plan_before == plan && left_before > 0) {
                            return Err(broken(format!("extended: {}", g.extended), &log));
                        }
                        let before = given
                            .as_ref()
                            .filter(|(p, _)| p == plan)
                            .map_or(0, |(_, s)| *s);
                        given = Some((plan.to_string(), before + g.seconds + 1));
                    }
                    Err(entity::billing::operator::GrantError::OtherPlanRunning { .. })
                        if plan_before != plan && left_before > 0 => {}
                    Err(entity::billing::operator::GrantError::NotLater(_))
                        if plan_before == plan && left_before >= hours * 3600 - 1 => {}
                    // The phase began first: the grant is judged against it.
                    Err(
                        entity::billing::operator::GrantError::NotLater(_)
                        | entity::billing::operator::GrantError::OtherPlanRunning { .. },
                    ) if phase_due => {}
                    Err(e) => return Err(broken(format!("refused: {e}"), &log)),
                }
                if plan_after != plan
                    && !phase_due
                    && (plan_after != plan_before || left_after + 1 < left_before)
                {
                    return Err(broken(
                        format!("a refused grant moved {left_before} s of {plan_before} to {left_after} s of {plan_after}"),
                        &log,
                    ));
                }
            }
            Step::Race(a, b) => {
                let (line, grants) = races::race(db, user, a, b, &cat).await;
                log.push(line);
                for (plan, secs) in grants {
                    let before = given
                        .as_ref()
                        .filter(|(p, _)| *p == plan)
                        .map_or(0, |(_, s)| *s);
                    given = Some((plan, before + secs));
                }
            }
            Step::Cancel(cancel) => {
                let action = if *cancel {
                    SubscriptionAction::Cancel
                } else {
                    SubscriptionAction::Resume
                };
                let outcome = subscription::change(db, user, action, Default::default()).await;
                log.push(format!(
                    "{action:?}: {}",
                    if outcome.is_ok() { "ok" } else { "refused" }
                ));
            }
        }
        // After every step.
        let (plan, left) = running(db, user).await;
        if !matches!(step, Step::Pass(_) | Step::ToEnd(_)) {
            check_ledger(db, user, &state_before, rows_before)
                .await
                .map_err(|e| broken(e, &log))?;
        }
        check_receipts(db, user)
            .await
            .map_err(|e| broken(e, &log))?;
        check_phase(db, user, matches!(step, Step::Tick(_)))
            .await
            .map_err(|e| broken(e, &log))?;
        check_anchor(db, user, renewed)
            .await
            .map_err(|e| broken(e, &log))?;
        // Partial refunds take no time (decisions: Stripe leaves the
        // subscription alone), so the money behind the time is every `PAID`
        // payment's whole amount.
        let still_paid: i128 = payments_of(db, user)
            .await
            .iter()
            .filter(|p| p.status == PaymentStatus::Paid)
            .map(|p| i128::from(p.amount))
            .sum();
        let notice = subscription(db, user)
            .await
            .price_notice_amount
            .map_or(String::new(), |a| format!(", notice of {a} held"));
        log.push(format!(
            "  → {plan}, {left} s left, {still_paid} still paid{notice}"
        ));
        // Given time is spent once nothing runs; it counts only while its
        // plan is in force (a refund of a plan change restores it with the
        // plan it replaced).
        if left == 0 {
            given = None;
        }
        let given_now = match &given {
            Some((p, secs)) if *p == plan => (*secs).min(left),
            _ => 0,
        };
        if still_paid == 0 && left > given_now {
            return Err(broken(
                format!("nothing is paid, yet {left} s of {plan} run"),
                &log,
            ));
        }
        let p = i128::from(floor.get(&plan).copied().unwrap_or(0));
        if p > 0 && i128::from(left - given_now) * p > still_paid * MONTH_MAX + p {
            return Err(broken(
                format!("free time: {left} s of {plan} for {still_paid} still paid"),
                &log,
            ));
        }
        phased |= subscription(db, user).await.scheduled_plan.is_some();
        // A step may end the run and begin another (two racing steps: a
        // refund to FREE beside a payment; one refund: taken back to FREE,
        // then a phase due begins): the ledger, checked complete above,
        // says whether the plan passed through FREE.
        let passed_free = ledger_rows(db, user).await[rows_before..]
            .iter()
            .any(|r| r.plan_to == "FREE");
        run.after_step(
            db,
            user,
            &plan,
            &paid,
            matches!(step, Step::Race(..)),
            passed_free,
        )
        .await;
    }
    let switched = ledger_rows(db, user)
        .await
        .iter()
        .any(|r| r.kind == "switch");
    for (seen, yes) in SEEN.iter().zip([phased || switched, switched]) {
        if yes {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    Ok(())
}

/// A step, or a renewal cycle with a plan change: a checkout of one plan,
/// `change` to another, time to `h` hours before the period end (into the
/// renewal's lead), a tick (which offers the renewal of the chosen plan),
/// and that renewal paid early: a scheduled phase (alone, those steps line
/// up in about 2 % of histories); or the period's end passing by `h` hours
/// and a tick.
fn chunk() -> impl Strategy<Value = Vec<Step>> {
    let n = PLANS.len();
    prop_oneof![
        8 => step().prop_map(|s| vec![s]),
        2 => (0..n, 1..n, 24i64..24 * 7).prop_map(move |(i, other, h)| vec![
            Step::Pay((i + other) % n),
            Step::Change(i),
            Step::ToEnd(h),
            Step::Tick(0),
            Step::PayRenewal
        ]),
        2 => (0i64..72, 0usize..6).prop_map(|(h, k)| vec![Step::ToEnd(-h), Step::Tick(k)]),
        // An operator's grant in the grace, resumed, then the catalogue
        // moves and the renewal is offered.
        1 => (1i64..48, 0..n, 24i64 * 8..24 * 40, prop_oneof![Just(80i64), Just(130)]).prop_map(
            |(h, i, hours, pct)| vec![
                Step::ToEnd(-h),
                Step::Tick(0),
                Step::Give(i, hours),
                Step::Cancel(false),
                Step::Reprice(pct),
                Step::ToEnd(24 * 6),
                Step::Tick(0)
            ]
        ),
        // A rise announced, its renewal paid, a second rise before the
        // next renewal (the first notice has run its course by then or not).
        1 => (0..n, 24i64..24 * 7, 0i64..24 * 10, prop_oneof![Just(100i64), Just(160)]).prop_map(
            |(i, h, late, pct)| vec![
                Step::Pay(i),
                Step::Reprice(130),
                Step::ToEnd(h),
                Step::Tick(0),
                Step::PayRenewal,
                Step::Reprice(pct),
                Step::ToEnd(h),
                Step::Pass(late),
                Step::Tick(0),
                Step::PayRenewal,
                Step::ToEnd(h),
                Step::Tick(0)
            ]
        ),
        // A rise announced, the run ended by a refund, a new run bought
        // at the old price, its renewal offered (a notice is the run's).
        1 => (0..n, 24i64..24 * 7, 0..4usize, 1i64..24 * 40).prop_map(|(i, h, k, gap)| vec![
            Step::Pay(i),
            Step::Reprice(130),
            Step::ToEnd(h),
            Step::Tick(0),
            Step::Refund(k),
            Step::Pass(gap),
            Step::Pay(i),
            Step::ToEnd(h),
            Step::Tick(0)
        ]),
        // A plan chosen, a price move, its renewal offered, and offered
        // again after `cancel` and `resume`.
        1 => (0..n, 1..n, 24i64..24 * 7, prop_oneof![Just(80i64), Just(130), Just(160)]).prop_map(
            move |(i, other, h, pct)| vec![
                Step::Pay(i),
                Step::Change((i + other) % n),
                Step::Reprice(pct),
                Step::ToEnd(h),
                Step::Tick(0),
                Step::Cancel(true),
                Step::Cancel(false),
                Step::Tick(0)
            ]
        ),
        1 => (racer(), racer()).prop_map(|(a, b)| vec![Step::Race(Box::new(a), Box::new(b))]),
    ]
}

/// A step that can run beside another ([`races`]).
fn racer() -> impl Strategy<Value = Step> {
    prop_oneof![
        2 => (0..PLANS.len()).prop_map(Step::Pay),
        2 => (0..8usize).prop_map(Step::Refund),
        1 => (0..8usize, 1i64..100).prop_map(|(k, pct)| Step::PartialRefund(k, pct)),
        3 => (0..6usize).prop_map(Step::Tick),
        3 => Just(Step::PayRenewal),
        1 => Just(Step::PayStaleRenewal),
        1 => (0..PLANS.len()).prop_map(Step::Change),
        1 => any::<bool>().prop_map(Step::Cancel),
        1 => (0..PLANS.len(), 1i64..24 * 60).prop_map(|(i, h)| Step::Give(i, h)),
    ]
}

/// Histories run, and of them those in which a phase was scheduled (a
/// `schedule` ledger row or a waiting phase) and those in which one began
/// (a `switch` row).
static SEEN: [std::sync::atomic::AtomicUsize; 2] = [
    std::sync::atomic::AtomicUsize::new(0),
    std::sync::atomic::AtomicUsize::new(0),
];

/// The proptest seed of worker `w`: `BILLING_SEED` (default 44) plus `w`.
fn seed(w: usize) -> u64 {
    std::env::var("BILLING_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(44u64)
        + w as u64
}

/// How many histories run at once on each backend, each worker on a
/// database of its own: `BILLING_WORKERS`, by default one per core.
fn workers() -> usize {
    std::env::var("BILLING_WORKERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1)
}

/// Runs `cases` histories on `db` with a proptest runner of its own seeded
/// `seed`; the failing history, shrunk, is the error.
fn run_on(
    rt: &tokio::runtime::Runtime,
    db: &DatabaseConnection,
    seed: u64,
    cases: u32,
) -> Result<(), String> {
    let config = ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        max_shrink_iters: 512,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let histories = (
        starts(),
        prop::collection::vec(chunk(), 1..12)
            .prop_map(|chunks| chunks.into_iter().flatten().collect::<Vec<_>>()),
    );
    runner
        .run(&histories, |(start, steps)| {
            rt.block_on(history(db, start, &steps))
        })
        .map_err(|e| e.to_string())
}

/// Runs `BILLING_CASES` histories on `backend`, split among one worker per
/// database in `dbs`, at once; panics with every worker's failing history
/// and how to run that worker alone.
fn run_all(rt: &tokio::runtime::Runtime, dbs: &[DatabaseConnection], backend: &str) {
    for seen in &SEEN {
        seen.store(0, std::sync::atomic::Ordering::Relaxed);
    }
    let per = cases().div_ceil(dbs.len() as u32);
    let failures: Vec<String> = std::thread::scope(|scope| {
        let running: Vec<_> = dbs
            .iter()
            .enumerate()
            .map(|(w, db)| (w, scope.spawn(move || run_on(rt, db, seed(w), per))))
            .collect();
        running
            .into_iter()
            .filter_map(|(w, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!(
                    "worker {w} (alone: BILLING_WORKERS=1 BILLING_SEED={} BILLING_CASES={per}): {e}",
                    seed(w)
                )),
                Err(panic) => Some(format!("worker {w} panicked: {panic:?}")),
            })
            .collect()
    });
    if !failures.is_empty() {
        panic!("{backend}: {}", failures.join("\n\n"));
    }
    eprintln!(
        "{backend}: {} histories on {} workers; a phase scheduled in {}, begun in {}",
        per * dbs.len() as u32,
        dbs.len(),
        SEEN[0].load(std::sync::atomic::Ordering::Relaxed),
        SEEN[1].load(std::sync::atomic::Ordering::Relaxed)
    );
}

#[test]
fn generated_billing_histories_keep_the_money_invariant() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let n = workers();
    let sqlite: Vec<_> = (0..n).map(|_| rt.block_on(sqlite_memory())).collect();
    run_all(&rt, &sqlite, "SQLite");
    let scratches = rt.block_on(Scratch::clones(n));
    let pg: Vec<_> = scratches.iter().map(|s| s.db.clone()).collect();
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_all(&rt, &pg, "PostgreSQL")
    }));
    for scratch in scratches {
        rt.block_on(scratch.remove());
    }
    if let Err(e) = outcome {
        std::panic::resume_unwind(e);
    }
}
