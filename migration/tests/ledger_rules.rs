//! The billing receipts on the schema the migrations make, on SQLite and
//! PostgreSQL: payments paid before the ledger's migration get their
//! receipts when it runs, numbered in the order they were paid (a payment
//! never paid gets none, a refunded one keeps its own with what went back).

use chrono::{Duration, Utc};
use entity::{
    accounts::users::{ensure_user, Identity},
    billing::payment::PaymentStatus,
    entities::{billing_receipts, payments},
};
use migration::{Migrator, MigratorTrait};
use sea_orm::{DatabaseConnection, EntityTrait, QueryOrder, Set};
use uuid::Uuid;

use crate::common::on_each_backend;

async fn payment(
    db: &DatabaseConnection,
    user: Uuid,
    amount: i64,
    status: PaymentStatus,
    paid_ago: Option<i64>,
    refunded: i64,
) -> Uuid {
    let now = Utc::now();
    let id = Uuid::new_v4();
    let row = payments::ActiveModel {
        id: Set(id),
        order_id: Set(entity::billing::payment::new_order_id("ORD", now)),
        user_id: Set(user),
        plan: Set("PRO".into()),
        amount: Set(amount),
        currency: Set("IDR".into()),
        provider: Set("provider_b".into()),
        status: Set(status),
        paid_at: Set(paid_ago.map(|d| now - Duration::days(d))),
        refunded_amount: Set(refunded),
        created_at: Set(now),
        updated_at: Set(now),
        ..Default::default()
    };
    // The schema before the ledger's migration: no column the entity added
    // since is written or read back.
    payments::Entity::insert(row)
        .exec_without_returning(db)
        .await
        .unwrap();
    id
}

#[tokio::test]
async fn payments_paid_before_the_ledger_get_receipts_in_the_order_paid() {
    on_each_backend(|db| async move {
        let id = Identity {
            user_id: Uuid::new_v4(),
            email: None,
        };
        ensure_user(&db, &id, &[]).await.unwrap();
        // The schema before the ledger's migration (and those after it).
        let names: Vec<String> = Migrator::migrations()
            .iter()
            .map(|m| m.name().to_string())
            .collect();
        let ledger = names
            .iter()
            .position(|n| n.contains("create_billing_ledger"))
            .expect("the ledger's migration");
        let since = u32::try_from(names.len() - ledger).unwrap();
        Migrator::down(&db, Some(since)).await.unwrap();
        let user = id.user_id;
        let later = payment(&db, user, 99_000, PaymentStatus::Paid, Some(1), 9_000).await;
        let earlier = payment(&db, user, 49_000, PaymentStatus::Refunded, Some(20), 0).await;
        let _never = payment(&db, user, 299_000, PaymentStatus::Expired, None, 0).await;
        Migrator::up(&db, None).await.unwrap();

        let receipts = billing_receipts::Entity::find()
            .order_by_asc(billing_receipts::Column::Number)
            .all(&db)
            .await
            .unwrap();
        let got: Vec<_> = receipts
            .iter()
            .map(|r| (r.payment_id, r.amount, r.refunded_amount))
            .collect();
        assert_eq!(got, [(earlier, 49_000, 49_000), (later, 99_000, 9_000)]);
        assert!(receipts[0].number < receipts[1].number);
    })
    .await;
}
