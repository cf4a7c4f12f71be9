//! One generated history run for a new customer: its steps applied
//! through the model's entry points, and the checks of [`super::checks`]
//! after every step (the invariants are listed in [`super`]).

use super::*;

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
