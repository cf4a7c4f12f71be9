//! Named histories: cases a red team or the generator found, kept as plain
//! tests on SQLite and PostgreSQL.

use chrono::Duration;
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::{payment::PaymentStatus, renewal, settlement},
    entities::{payments, renewals, subscriptions},
};
use sea_orm::{sea_query::Expr, ColumnTrait, DatabaseConnection, EntityTrait, QueryFilter};
use uuid::Uuid;

use super::world::*;
use crate::common::{sqlite_memory, Scratch};

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
    time_passes(db, Duration::days(25)).await;
    run_pass(db, user, renewal::Step::Create).await;
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

/// A named history the generator found: a partial refund of a plan change
/// lowered the value of the time carried into it as well as its own month
/// (BASIC, then PRO carrying it, a third of PRO refunded, then BASIC again:
/// 16,170 of the carried BASIC value was lost). A partial refund lowers a
/// grant's value by what went back, never the value carried into it.
#[test]
fn a_partial_refund_of_a_plan_change_keeps_the_value_carried_into_it() {
    use super::Step::{PartialRefund, Pay};
    let steps = [Pay(0), Pay(1), PartialRefund(1, 33), Pay(0)];
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let db = sqlite_memory().await;
        super::history(&db, None, &steps).await.expect("SQLite");
        let scratch = Scratch::create().await;
        let outcome = super::history(&scratch.db, None, &steps).await;
        scratch.remove().await;
        outcome.expect("PostgreSQL");
    });
}

/// Runs `scenario` on SQLite, then on scratch PostgreSQL.
pub(super) fn on_both<F, Fut>(scenario: F)
where
    F: Fn(DatabaseConnection) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        scenario(sqlite_memory().await).await;
        let scratch = Scratch::create().await;
        let outcome = tokio::spawn(scenario(scratch.db.clone())).await;
        scratch.remove().await;
        if let Err(e) = outcome {
            std::panic::resume_unwind(e.into_panic());
        }
    });
}

pub(super) async fn customer(db: &DatabaseConnection) -> Uuid {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: None,
    };
    ensure_user(db, &id, &[]).await.unwrap();
    id.user_id
}

pub(super) async fn settle_as(db: &DatabaseConnection, order: &str, status: PaymentStatus) {
    settlement::settle_status_check(db, order, status, TERMS, None)
        .await
        .unwrap();
}

pub(super) async fn paid(db: &DatabaseConnection, user: Uuid, plan: &str) -> payments::Model {
    let order = checkout(db, user, plan).await;
    settle_as(db, &order, PaymentStatus::Paid).await;
    payments_of(db, user)
        .await
        .into_iter()
        .find(|p| p.order_id == order)
        .expect("the payment")
}

pub(super) async fn period_end(
    db: &DatabaseConnection,
    user: Uuid,
) -> chrono::DateTime<chrono::Utc> {
    subscriptions::Entity::find_by_id(user)
        .one(db)
        .await
        .unwrap()
        .unwrap()
        .current_period_end
        .expect("a period")
}

/// Runs one pass of the renewal loop for `user` at the database's now, and
/// answers that now.
pub(super) async fn run_pass(
    db: &DatabaseConnection,
    user: Uuid,
    pass: renewal::Step,
) -> chrono::DateTime<chrono::Utc> {
    let now = entity::base::db::now(db).await.unwrap();
    renewal::run_batch(db, pass, &policy(), catalogue(), now, &[user])
        .await
        .unwrap();
    now
}

/// Settles `order` as `status` and answers how many seconds the period end
/// of `user` moved (negative: it moved back).
pub(super) async fn moved_by(
    db: &DatabaseConnection,
    user: Uuid,
    order: &str,
    status: PaymentStatus,
) -> i64 {
    let before = period_end(db, user).await;
    settle_as(db, order, status).await;
    (period_end(db, user).await - before).num_seconds()
}

/// What `value` (IDR) buys of a grant sold for `amount` over its own month
/// from `from`, in seconds.
fn worth(value: i64, amount: i64, from: chrono::DateTime<chrono::Utc>) -> i64 {
    let month = (month_after(from) - from).num_seconds();
    value * month / amount
}

fn month_after(t: chrono::DateTime<chrono::Utc>) -> chrono::DateTime<chrono::Utc> {
    entity::billing::anchor::month_after(t, TERMS.zone)
}

/// Red team: PRO twice, nine tenths of the second refunded in part, then
/// BASIC carrying both; the whole refund of the second PRO payment took 62.6
/// days of BASIC where that payment had carried 9,900 (6.3 days): the first
/// payment's carried month was lost. A refund follows what its payment
/// carried, its amount less partial refunds.
#[test]
fn a_refund_after_a_partial_refund_takes_back_only_what_the_payment_carried() {
    on_both(|db| async move {
        let user = customer(&db).await;
        paid(&db, user, "PRO").await;
        let second = paid(&db, user, "PRO").await;
        entity::billing::ledger::record_partial_refund(&db, &second.order_id, 89_100)
            .await
            .unwrap();
        let basic = paid(&db, user, "BASIC").await;
        let taken = -moved_by(&db, user, &second.order_id, PaymentStatus::Refunded).await;
        let want = worth(9_900, 49_000, basic.grant_start.unwrap());
        assert!(
            (want - 2..=want + 2).contains(&taken),
            "took {taken} s of BASIC; the payment carried {want} s"
        );
    });
}

/// Red team: ULTIMATE, then BASIC carrying 189 days of it; 186 days later
/// PRO carries the 3 days left and BASIC's own month, wholly unused. The
/// refund of BASIC took 2.4 days of PRO where BASIC's 49,000 had bought
/// 15.3: its money was spread over the whole period, carried days
/// included, while the carry priced the carried days first. Within a grant
/// the carried time runs first; a refund follows the money the same way.
#[test]
fn a_refund_follows_its_money_as_the_carry_priced_it_carried_time_first() {
    on_both(|db| async move {
        let user = customer(&db).await;
        paid(&db, user, "ULTIMATE").await;
        let basic = paid(&db, user, "BASIC").await;
        let carried = basic.carried_seconds.unwrap();
        time_passes(&db, Duration::seconds(carried - 3 * 86_400)).await;
        let pro = paid(&db, user, "PRO").await;
        let taken = -moved_by(&db, user, &basic.order_id, PaymentStatus::Refunded).await;
        let want = worth(49_000, 99_000, pro.grant_start.unwrap());
        assert!(
            (want - 2..=want + 2).contains(&taken),
            "took {taken} s of PRO; BASIC's own month, wholly unused, carried {want} s"
        );
    });
}

/// Red team: PRO refunded at once (its grant cut to the seconds that ran),
/// BASIC, a renewal offered and its checkout opened, the period past due,
/// an operator's PRO until a date (the renewal voided), then the checkout
/// paid: an outdated renewal payment, time on PRO, priced from the refunded
/// PRO grant; it bought 1 second, its own month read as what ran before the
/// refund. A refunded grant is priced at the month it was sold as.
#[test]
fn an_outdated_renewal_priced_from_a_refunded_grant_buys_its_share_of_a_month() {
    on_both(|db| async move {
        let user = customer(&db).await;
        let pro = paid(&db, user, "PRO").await;
        settle_as(&db, &pro.order_id, PaymentStatus::Refunded).await;
        paid(&db, user, "BASIC").await;
        time_passes(&db, Duration::days(25)).await;
        run_pass(&db, user, renewal::Step::Create).await;
        let offered = renewals::Entity::find()
            .filter(renewals::Column::UserId.eq(user))
            .one(&db)
            .await
            .unwrap()
            .expect("a renewal offered");
        let stale = checkout(&db, user, "BASIC").await;
        payments::Entity::update_many()
            .col_expr(payments::Column::RenewalId, Expr::value(Some(offered.id)))
            .filter(payments::Column::OrderId.eq(&stale))
            .exec(&db)
            .await
            .unwrap();
        time_passes(&db, Duration::days(7)).await;
        let now = run_pass(&db, user, renewal::Step::PastDue).await;
        let grant = entity::billing::operator::OperatorGrant {
            user_id: user,
            plan: "PRO".into(),
            until: now + Duration::days(30),
            reason: "red team".into(),
        };
        entity::billing::operator::give(&db, Uuid::new_v4(), &grant, TERMS.zone, None, None)
            .await
            .unwrap();
        let added = moved_by(&db, user, &stale, PaymentStatus::Paid).await;
        let pro = payments_of(&db, user)
            .await
            .into_iter()
            .find(|p| p.id == pro.id)
            .unwrap();
        let want = worth(49_000, 99_000, pro.grant_start.unwrap());
        assert!(
            (want - 2..=want + 2).contains(&added),
            "49,000 bought {added} s of PRO; at PRO's price {want} s"
        );
    });
}

/// Red team: BASIC carrying PRO's month, then a partial refund of BASIC
/// stated as 48,999.01, recorded rounded up as the whole 49,000 (it stays
/// `PAID`): its own month is worth nothing, and the next plan change
/// carried nothing at all, the 99,000 of PRO time carried into it
/// included. The carried seconds keep the rate they were sold at.
#[test]
fn a_grant_whose_own_month_was_refunded_in_part_still_carries_its_carried_time() {
    on_both(|db| async move {
        let user = customer(&db).await;
        paid(&db, user, "PRO").await;
        let basic = paid(&db, user, "BASIC").await;
        let carried_in = basic.carried_value.unwrap();
        entity::billing::ledger::record_partial_refund(&db, &basic.order_id, 49_000)
            .await
            .unwrap();
        let ultimate = paid(&db, user, "ULTIMATE").await;
        let want = worth(carried_in, 299_000, ultimate.grant_start.unwrap());
        let got = ultimate.carried_seconds.unwrap();
        assert!(
            (want - 60..=want + 60).contains(&got),
            "ULTIMATE carried {got} s; the PRO value carried into BASIC buys {want} s"
        );
    });
}

/// The generator (seed 9): PRO, then BASIC carrying its month, then one
/// percent of PRO refunded in part (after the carry), then PRO refunded
/// whole: 54,113 s of BASIC were left that no money paid for. The carry
/// valued the whole PRO month; a partial refund after it takes no time, and
/// the whole refund takes back what was carried, as stored on the source.
#[test]
fn a_partial_refund_after_the_carry_leaves_no_free_time_at_the_whole_refund() {
    use super::Step::{PartialRefund, Pay, Refund};
    on_both(|db| async move {
        let steps = [Pay(1), Pay(0), PartialRefund(0, 1), Refund(0)];
        super::history(&db, None, &steps)
            .await
            .expect("the history keeps the invariant");
    });
}

/// The generator, once its price check read the run from its own model:
/// BASIC bought, then PRO through a paid `change`, past due; in PRO's grace
/// an operator gives BASIC; the catalogue rises 30 %. BASIC's renewal
/// billed the new price with no mail: the grant began a new period, so the
/// BASIC the customer had paid for in the same run no longer counted. The
/// price of record reads the run (since the subscription last left FREE,
/// from the billing ledger): the renewal bills 49,000 and announces the
/// rise.
#[test]
fn a_grant_of_a_plan_bought_earlier_in_the_run_renews_at_its_price() {
    use super::Step::*;
    on_both(|db| async move {
        let steps = [
            Pay(0),
            Change(1),
            ToEnd(24),
            Tick(0),
            PayRenewal,
            ToEnd(0),
            Tick(0),
            ToEnd(-1),
            Tick(0),
            Give(0, 192),
            Cancel(false),
            Reprice(130),
            ToEnd(144),
            Tick(0),
        ];
        super::history(&db, None, &steps)
            .await
            .expect("the history keeps the invariant");
    });
}

/// The generator (seed 500, 10,000 histories): an operator's PRO, its
/// renewal offered at a cut price, a checkout of PRO paid, then its whole
/// refund racing the renewal's payment. The refund takes its month back as
/// the renewal adds one: the plan and end are as before, and the ledger
/// holds both rows. The check had wanted no row when nothing changed; rows
/// that lead back to where they began are the truth of a race.
#[test]
fn a_refund_racing_a_renewal_payment_leaves_both_rows_in_the_ledger() {
    use super::Step::*;
    on_both(|db| async move {
        let steps = [
            ToEnd(-1),
            Tick(0),
            Give(1, 192),
            Cancel(false),
            Reprice(80),
            ToEnd(144),
            Tick(0),
            Pay(1),
            Race(Box::new(Refund(0)), Box::new(PayStaleRenewal)),
        ];
        super::history(&db, None, &steps)
            .await
            .expect("the history keeps the invariant");
    });
}

/// The generator (seed 600): BASIC twice, then ULTIMATE carrying it, then
/// `change` back to BASIC and its renewal paid early (a phase of BASIC
/// after ULTIMATE); the ULTIMATE checkout refunded whole gives BASIC back,
/// and the phase of BASIC was left waiting on BASIC. A phase of the plan
/// that comes back is no change: its month runs on from the restored end
/// at once, and the renewal after it is offered as any other.
#[test]
fn a_phase_of_the_plan_a_refund_gives_back_runs_on_from_its_end() {
    use super::Step::*;
    on_both(|db| async move {
        let steps = [
            Pay(0),
            Change(1),
            Reprice(80),
            ToEnd(28),
            Tick(0),
            Cancel(true),
            Cancel(false),
            Tick(0),
            Pay(0),
            Pay(2),
            Change(0),
            ToEnd(99),
            Tick(0),
            PayRenewal,
            Refund(6),
            ToEnd(-1),
            Tick(0),
            ToEnd(24),
            Tick(0),
            PayRenewal,
        ];
        super::history(&db, None, &steps)
            .await
            .expect("the history keeps the invariant");
    });
}
