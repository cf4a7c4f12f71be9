//! The price of record and price-change notices (docs/billing.md, "Prices"):
//! a catalogue rise reaches a subscriber only at the first renewal created
//! at least the notice period after a price-change mail to them; a cut
//! reaches the next renewal at once.

use chrono::Duration;
use entity::{
    accounts::users::{ensure_user, Identity},
    base::plans::Catalogue,
    billing::{
        payment::PaymentStatus,
        renewal,
        subscription::{self, SubscriptionAction},
    },
    entities::{
        payments,
        renewals::{self, RenewalStatus},
        subscriptions,
    },
};
use sea_orm::{
    ActiveModelTrait, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, QueryFilter,
    Set, Statement,
};
use uuid::Uuid;

use super::named::{on_both, period_end, run_pass, settle_as};
use super::world::*;

/// The catalogue with `plan` sold at `price`.
fn priced(plan: &str, price: i64) -> Catalogue {
    let mut c = catalogue().clone();
    c.plans
        .iter_mut()
        .find(|p| p.id == plan)
        .expect("a catalogue plan")
        .price = price;
    c
}

/// Moves time to six days before the period end and runs the create pass
/// with `catalogue` and a notice period of `notice`; answers the renewal it
/// offered.
pub(super) async fn offered(
    db: &DatabaseConnection,
    user: Uuid,
    catalogue: &Catalogue,
    notice: Duration,
) -> renewals::Model {
    let now = entity::base::db::now(db).await.unwrap();
    let left = period_end(db, user).await - now;
    time_passes(db, left - Duration::days(6)).await;
    let now = entity::base::db::now(db).await.unwrap();
    let policy = renewal::Policy {
        price_notice: notice,
        ..policy()
    };
    renewal::run_batch(db, renewal::Step::Create, &policy, catalogue, now, &[user])
        .await
        .unwrap();
    renewals::Entity::find()
        .filter(renewals::Column::UserId.eq(user))
        .filter(renewals::Column::Status.eq(RenewalStatus::Open))
        .one(db)
        .await
        .unwrap()
        .expect("a renewal offered")
}

/// Pays `r` through its pay link (a checkout of its plan at its stored
/// amount).
pub(super) async fn pay(db: &DatabaseConnection, r: &renewals::Model) {
    let order = checkout(db, r.user_id, &r.plan).await;
    let p = payments::Entity::find()
        .filter(payments::Column::OrderId.eq(&order))
        .one(db)
        .await
        .unwrap()
        .unwrap();
    let mut am: payments::ActiveModel = p.into();
    am.renewal_id = Set(Some(r.id));
    am.amount = Set(r.amount);
    am.update(db).await.unwrap();
    settle_as(db, &order, PaymentStatus::Paid).await;
}

/// How many price-change mails were queued for `user`.
async fn notices(db: &DatabaseConnection, user: Uuid) -> i64 {
    let backend = db.get_database_backend();
    let sql = match backend {
        sea_orm::DbBackend::Postgres => {
            "SELECT count(*) AS n FROM billing_mails WHERE user_id = $1 AND kind = 'price_change'"
        }
        _ => "SELECT count(*) AS n FROM billing_mails WHERE user_id = ? AND kind = 'price_change'",
    };
    db.query_one_raw(Statement::from_sql_and_values(backend, sql, [user.into()]))
        .await
        .unwrap()
        .expect("a count")
        .try_get("", "n")
        .unwrap()
}

pub(super) async fn subscriber(db: &DatabaseConnection) -> Uuid {
    let id = Identity {
        user_id: Uuid::new_v4(),
        email: Some(format!("{}@example.com", Uuid::new_v4().simple())),
    };
    ensure_user(db, &id, &[]).await.unwrap();
    id.user_id
}

/// PRO at 99,000, then the catalogue raises it to 129,000. With a 40-day
/// notice: the renewal offered at the rise bills 99,000 and comes with the
/// one price-change mail; the next, about a month after the mail, still
/// 99,000; the one after, two months after it, 129,000. A cut to 89,000
/// then reaches the next renewal at once.
#[test]
fn a_price_rise_reaches_the_first_renewal_offered_a_notice_period_after_its_mail() {
    on_both(|db| async move {
        let notice = Duration::days(40);
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let raised = priced("PRO", 129_000);

        let first = offered(&db, user, &raised, notice).await;
        assert_eq!(first.amount, 99_000, "the renewal at the rise");
        assert_eq!(notices(&db, user).await, 1, "the price-change mail");
        let s = subscription(&db, user).await;
        assert_eq!(
            (s.price_notice_plan.as_deref(), s.price_notice_amount),
            (Some("PRO"), Some(129_000))
        );
        pay(&db, &first).await;

        let second = offered(&db, user, &raised, notice).await;
        assert_eq!(second.amount, 99_000, "a month after the mail");
        assert_eq!(notices(&db, user).await, 1, "told once");
        pay(&db, &second).await;

        let third = offered(&db, user, &raised, notice).await;
        assert_eq!(third.amount, 129_000, "two months after the mail");
        pay(&db, &third).await;
        let s = subscription(&db, user).await;
        assert_eq!(s.price_notice_amount, None, "the notice is spent");

        let cut = offered(&db, user, &priced("PRO", 89_000), notice).await;
        assert_eq!(cut.amount, 89_000, "a cut at once");
        assert_eq!(notices(&db, user).await, 1, "a cut needs no notice");
    });
}

/// A plan chosen by `change` before the price it was chosen at was stored
/// (no `renewal_plan_price`) renews at the catalogue price; no notice is
/// given for it.
#[test]
fn a_changed_plan_renews_at_the_catalogue_price() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        subscriptions::Entity::update_many()
            .col_expr(
                subscriptions::Column::RenewalPlan,
                sea_orm::sea_query::Expr::value(Some("BASIC")),
            )
            .filter(subscriptions::Column::UserId.eq(user))
            .exec(&db)
            .await
            .unwrap();
        let r = offered(&db, user, &priced("BASIC", 59_000), Duration::days(30)).await;
        assert_eq!((r.plan.as_str(), r.amount), ("BASIC", 59_000));
        assert_eq!(notices(&db, user).await, 0);
    });
}

/// `change` to `plan` (the api's call) while `catalogue` sells the plans.
async fn choose(db: &DatabaseConnection, user: Uuid, plan: &str, catalogue: &Catalogue) {
    entity::billing::subscription::choose_renewal_plan(
        db,
        user,
        plan,
        &policy(),
        catalogue,
        Default::default(),
    )
    .await
    .unwrap();
}

/// Red team (release binaries of bde5aac): a BASIC customer chose PRO with
/// `change` while it sold at 99,000; PRO then rose to 129,000, and the
/// renewal was offered at 129,000 with no notice. The price a plan is
/// chosen at is its price of record until it is paid: that renewal bills
/// 99,000 and comes with the mail for 129,000, and once PRO runs the
/// renewal offered a notice period after the mail bills 129,000.
#[test]
fn a_rise_after_a_change_waits_for_its_notice() {
    on_both(|db| async move {
        let notice = Duration::days(20);
        let user = subscriber(&db).await;
        settle_as(
            &db,
            &checkout(&db, user, "BASIC").await,
            PaymentStatus::Paid,
        )
        .await;
        choose(&db, user, "PRO", catalogue()).await;
        let raised = priced("PRO", 129_000);
        let first = offered(&db, user, &raised, notice).await;
        assert_eq!((first.plan.as_str(), first.amount), ("PRO", 99_000));
        assert_eq!(notices(&db, user).await, 1, "the rise is told");
        let s = subscription(&db, user).await;
        assert_eq!(
            (s.price_notice_plan.as_deref(), s.price_notice_amount),
            (Some("PRO"), Some(129_000))
        );
        // Paid early, PRO waits as a phase and begins at the old end.
        pay(&db, &first).await;
        time_passes(&db, Duration::days(7)).await;
        run_pass(&db, user, renewal::Step::PastDue).await;
        assert_eq!(subscription(&db, user).await.plan, "PRO");
        let next = offered(&db, user, &raised, notice).await;
        assert_eq!((next.plan.as_str(), next.amount), ("PRO", 129_000));
        assert_eq!(notices(&db, user).await, 1);
    });
}

/// Red team (release binaries of bde5aac), the same rule after a renewal is
/// offered again: PRO chosen at 99,000 was offered at once at 99,000 (the
/// reminder said so); PRO rose; `cancel` then `resume` offered it again at
/// 129,000 untold. And after a run of PRO at 99,000 and a checkout of BASIC,
/// PRO chosen again and risen was offered at 129,000. Both bill the price
/// chosen at, with the notice of the rise.
#[test]
fn a_renewal_of_a_chosen_plan_offered_again_keeps_the_price_chosen_at() {
    on_both(|db| async move {
        let notice = Duration::days(30);
        let raised = priced("PRO", 129_000);
        let user = subscriber(&db).await;
        settle_as(
            &db,
            &checkout(&db, user, "BASIC").await,
            PaymentStatus::Paid,
        )
        .await;
        choose(&db, user, "PRO", catalogue()).await;
        let first = offered(&db, user, catalogue(), notice).await;
        assert_eq!((first.plan.as_str(), first.amount), ("PRO", 99_000));
        for action in [SubscriptionAction::Cancel, SubscriptionAction::Resume] {
            subscription::change(&db, user, action, Default::default())
                .await
                .unwrap();
        }
        let again = offered(&db, user, &raised, notice).await;
        assert_eq!((again.plan.as_str(), again.amount), ("PRO", 99_000));
        assert_eq!(notices(&db, user).await, 1);

        let other = subscriber(&db).await;
        settle_as(&db, &checkout(&db, other, "PRO").await, PaymentStatus::Paid).await;
        time_passes(&db, Duration::days(3)).await;
        settle_as(
            &db,
            &checkout(&db, other, "BASIC").await,
            PaymentStatus::Paid,
        )
        .await;
        choose(&db, other, "PRO", catalogue()).await;
        let r = offered(&db, other, &raised, notice).await;
        assert_eq!((r.plan.as_str(), r.amount), ("PRO", 99_000));
        assert_eq!(notices(&db, other).await, 1);
    });
}

/// A long generated run found: a notice of BASIC at 63,700 was held while
/// PRO ran; BASIC was cut to 39,200 and chosen by `change` at that price,
/// then rose to 78,400, and its renewal billed 63,700 on the notice told
/// before the cut. A choice withdraws a notice of its plan told before it:
/// the renewal bills the price chosen at, and the rise is announced anew.
#[test]
fn a_choice_withdraws_an_older_notice_of_its_plan() {
    on_both(|db| async move {
        let notice = Duration::days(30);
        let user = subscriber(&db).await;
        settle_as(
            &db,
            &checkout(&db, user, "BASIC").await,
            PaymentStatus::Paid,
        )
        .await;
        let first = offered(&db, user, &priced("BASIC", 63_700), notice).await;
        assert_eq!((first.amount, notices(&db, user).await), (49_000, 1));
        pay(&db, &first).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let s = subscription(&db, user).await;
        assert_eq!(
            (s.plan.as_str(), s.price_notice_amount),
            ("PRO", Some(63_700)),
            "kept while another plan runs"
        );
        choose(&db, user, "BASIC", &priced("BASIC", 39_200)).await;
        let r = offered(&db, user, &priced("BASIC", 78_400), notice).await;
        assert_eq!((r.plan.as_str(), r.amount), ("BASIC", 39_200));
        assert_eq!(notices(&db, user).await, 2, "the rise told anew");
    });
}

/// A notice is withdrawn when the catalogue falls back to the price of
/// record: the rise that comes again later is announced anew, and the
/// renewal offered with that new mail still bills the old price.
#[test]
fn a_rise_withdrawn_and_raised_again_is_announced_again() {
    on_both(|db| async move {
        let notice = Duration::days(30);
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let raised = priced("PRO", 129_000);
        let first = offered(&db, user, &raised, notice).await;
        assert_eq!((first.amount, notices(&db, user).await), (99_000, 1));
        pay(&db, &first).await;
        let back = offered(&db, user, catalogue(), notice).await;
        assert_eq!(back.amount, 99_000);
        let s = subscription(&db, user).await;
        assert_eq!(s.price_notice_amount, None, "withdrawn");
        pay(&db, &back).await;
        let again = offered(&db, user, &raised, notice).await;
        assert_eq!(again.amount, 99_000, "a new notice, not the withdrawn one");
        assert_eq!(notices(&db, user).await, 2);
    });
}

/// Red team: the renewal at the new price paid, then refunded: the next
/// renewal went back to the old price with a fresh notice (repeatable). A
/// refund does not undo the price agreed to.
#[test]
fn a_refund_of_the_new_price_does_not_bring_the_old_one_back() {
    on_both(|db| async move {
        let notice = Duration::days(20);
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let raised = priced("PRO", 129_000);
        let first = offered(&db, user, &raised, notice).await;
        pay(&db, &first).await;
        let second = offered(&db, user, &raised, notice).await;
        assert_eq!(second.amount, 129_000);
        pay(&db, &second).await;
        let p = payments::Entity::find()
            .filter(payments::Column::RenewalId.eq(second.id))
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        settle_as(&db, &p.order_id, PaymentStatus::Refunded).await;
        let third = offered(&db, user, &raised, notice).await;
        assert_eq!(third.amount, 129_000, "the price agreed to stays");
        assert_eq!(notices(&db, user).await, 1);
    });
}

/// Red team: PRO bought at 99,000 lapsed long ago; after the rise an
/// operator gives PRO: its renewal was offered at the stale 99,000. A run
/// of the plan that lapsed before does not price it: the catalogue does.
#[test]
fn an_operator_grant_renews_at_the_catalogue_price_not_a_lapsed_one() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let end = period_end(&db, user).await;
        let now = entity::base::db::now(&db).await.unwrap();
        time_passes(&db, end - now + Duration::days(40)).await;
        subscriptions::Entity::update_many()
            .col_expr(
                subscriptions::Column::Plan,
                sea_orm::sea_query::Expr::value("FREE"),
            )
            .col_expr(
                subscriptions::Column::CurrentPeriodStart,
                sea_orm::sea_query::Expr::value(None::<chrono::DateTime<chrono::Utc>>),
            )
            .col_expr(
                subscriptions::Column::CurrentPeriodEnd,
                sea_orm::sea_query::Expr::value(None::<chrono::DateTime<chrono::Utc>>),
            )
            .filter(subscriptions::Column::UserId.eq(user))
            .exec(&db)
            .await
            .unwrap();
        let now = entity::base::db::now(&db).await.unwrap();
        given_and_resumed(&db, user, "PRO", now + Duration::days(5), "comp").await;
        let r = offered(&db, user, &priced("PRO", 129_000), Duration::days(30)).await;
        assert_eq!(r.amount, 129_000);
        assert_eq!(notices(&db, user).await, 0);
    });
}

/// Red team (suspected): a checkout of the plan at the old price, opened
/// before the rise and paid after the renewal at the new price, would have
/// become the latest price paid. The price of record is the one agreed to
/// last: the amount stored when a checkout or renewal was created.
#[test]
fn an_old_checkout_paid_late_does_not_lower_the_price_of_record() {
    on_both(|db| async move {
        let notice = Duration::days(20);
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let raised = priced("PRO", 129_000);
        let first = offered(&db, user, &raised, notice).await;
        // A checkout at 99,000, opened now and left pending.
        let old = checkout(&db, user, "PRO").await;
        pay(&db, &first).await;
        let second = offered(&db, user, &raised, notice).await;
        assert_eq!(second.amount, 129_000);
        pay(&db, &second).await;
        settle_as(&db, &old, PaymentStatus::Paid).await;
        let third = offered(&db, user, &raised, notice).await;
        assert_eq!(third.amount, 129_000, "the price agreed to last");
    });
}

/// Red team (release binaries): PRO at 99,000 ran out unpaid and was told
/// past due; in its grace an operator gave PRO 20 more days; then PRO rose
/// to 129,000. The renewal billed 129,000 with no notice: the grant began
/// a new period at its own time, so the customer's 99,000 no longer
/// reached it. A grant of the plan in force in its grace continues the run
/// from the old end: the renewal bills 99,000 and announces 129,000.
#[test]
fn an_operator_grant_in_the_grace_keeps_the_price_of_record() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let end = period_end(&db, user).await;
        let now = entity::base::db::now(&db).await.unwrap();
        time_passes(&db, end - now + Duration::hours(1)).await;
        let now = entity::base::db::now(&db).await.unwrap();
        renewal::run_batch(
            &db,
            renewal::Step::PastDue,
            &policy(),
            catalogue(),
            now,
            &[user],
        )
        .await
        .unwrap();
        assert!(subscription(&db, user).await.past_due_at.is_some());
        given_and_resumed(&db, user, "PRO", end + Duration::days(20), "goodwill").await;
        let r = offered(&db, user, &priced("PRO", 129_000), Duration::days(30)).await;
        assert_eq!(r.amount, 99_000, "the price agreed to");
        let s = subscription(&db, user).await;
        assert_eq!(
            (s.price_notice_plan.as_deref(), s.price_notice_amount),
            (Some("PRO"), Some(129_000)),
            "the rise is announced"
        );
    });
}

/// Red team (release binaries): a rise to 129,000 was announced and ran its
/// notice period; before the renewal it priced, PRO rose again to 139,000.
/// That renewal fell back to 99,000 and the announced 129,000 was never
/// billed (each rise inside the notice period kept the old price). It
/// bills 129,000, and 139,000 is announced at the next renewal.
#[test]
fn a_second_rise_keeps_the_first_notice_that_has_run_its_course() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let first = offered(&db, user, &priced("PRO", 129_000), Duration::days(30)).await;
        assert_eq!(first.amount, 99_000);
        pay(&db, &first).await;
        let second = offered(&db, user, &priced("PRO", 139_000), Duration::days(30)).await;
        assert_eq!(second.amount, 129_000, "announced in time");
        pay(&db, &second).await;
        let third = offered(&db, user, &priced("PRO", 139_000), Duration::days(30)).await;
        assert_eq!(third.amount, 129_000, "139,000 is announced now");
        let s = subscription(&db, user).await;
        assert_eq!(s.price_notice_amount, Some(139_000));
        pay(&db, &third).await;
        let fourth = offered(&db, user, &priced("PRO", 139_000), Duration::days(30)).await;
        assert_eq!(fourth.amount, 139_000);
    });
}

/// Red team (release binaries): a notice of 129,000 was recorded; a whole
/// refund then made the customer FREE; the catalogue fell back to 99,000
/// and PRO was bought again at it; PRO rose to 129,000 again. The next
/// renewal billed 129,000 on the old notice, sent before the refund and
/// the new purchase. A refund that ends the run clears the notice, as a
/// lapse does: the new rise is announced anew.
#[test]
fn a_refund_to_free_clears_the_price_notice() {
    on_both(|db| async move {
        let user = subscriber(&db).await;
        let order = checkout(&db, user, "PRO").await;
        settle_as(&db, &order, PaymentStatus::Paid).await;
        let first = offered(&db, user, &priced("PRO", 129_000), Duration::days(30)).await;
        assert_eq!(first.amount, 99_000);
        assert_eq!(
            subscription(&db, user).await.price_notice_amount,
            Some(129_000)
        );
        settle_as(&db, &order, PaymentStatus::Refunded).await;
        let s = subscription(&db, user).await;
        assert_eq!((s.plan.as_str(), s.price_notice_amount), ("FREE", None));
        // 31 days on, PRO bought again at 99,000.
        time_passes(&db, Duration::days(31)).await;
        settle_as(&db, &checkout(&db, user, "PRO").await, PaymentStatus::Paid).await;
        let again = offered(&db, user, &priced("PRO", 129_000), Duration::days(30)).await;
        assert_eq!(again.amount, 99_000, "the new rise is announced first");
        assert_eq!(notices(&db, user).await, 2, "a second price_change mail");
    });
}
