//! Billing fixtures written straight into a test's PostgreSQL database (the
//! schema the api's migrations made): a user on FREE, a payment, an event.

use chrono::{DateTime, Utc};
use entity::entities::{
    payments::{self, PaymentStatus},
    subscriptions::{self, SubscriptionStatus},
    users, webhook_events,
};
use sea_orm::{ActiveModelTrait, Database, DatabaseConnection, Set};
use uuid::Uuid;

use crate::Stack;

/// A SeaORM connection to the stack's database (after the api migrated it).
pub async fn connect_db(stack: &Stack) -> DatabaseConnection {
    Database::connect(&stack.db.url)
        .await
        .unwrap_or_else(|e| panic!("connect {}: {e}", stack.db.url))
}

/// A new user with the FREE subscription first sight gives; answers its id.
pub async fn free_user(db: &DatabaseConnection) -> Uuid {
    let user = Uuid::new_v4();
    let now = Utc::now();
    users::ActiveModel {
        id: Set(user),
        email: Set(Some(format!("{user}@example.com"))),
        created_at: Set(now),
    }
    .insert(db)
    .await
    .expect("insert user");
    subscriptions::ActiveModel {
        user_id: Set(user),
        plan: Set("FREE".into()),
        status: Set(SubscriptionStatus::Active),
        cancel_at_period_end: Set(false),
        current_period_start: Set(None),
        current_period_end: Set(None),
        canceled_at: Set(None),
        created_at: Set(now),
        updated_at: Set(now),
    }
    .insert(db)
    .await
    .expect("insert subscription");
    user
}

/// A PENDING payment of PRO (99,000 IDR) for `user` with `provider`,
/// created at `created_at`; answers its order id.
pub async fn pending_payment_at(
    db: &DatabaseConnection,
    user: Uuid,
    provider: &str,
    created_at: DateTime<Utc>,
) -> String {
    let order_id = entity::payment::new_order_id("ORD", created_at);
    payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set(order_id.clone()),
        user_id: Set(user),
        plan: Set("PRO".into()),
        amount: Set(99_000),
        currency: Set("IDR".into()),
        provider: Set(provider.into()),
        status: Set(PaymentStatus::Pending),
        checkout_token: Set(None),
        payment_url: Set(None),
        provider_reference: Set(None),
        paid_at: Set(None),
        idempotency_key: Set(None),
        reconciled_at: Set(None),
        created_at: Set(created_at),
        updated_at: Set(created_at),
    }
    .insert(db)
    .await
    .expect("insert payment");
    order_id
}

/// A user on FREE with a PENDING payment of PRO created now.
pub async fn pending_payment(db: &DatabaseConnection, provider: &str) -> (Uuid, String) {
    let user = free_user(db).await;
    let order = pending_payment_at(db, user, provider, Utc::now()).await;
    (user, order)
}

/// A webhook event recorded at `received_at` and never settled (its job
/// lost), reporting `status` for `order_id`.
pub async fn unsettled_event(
    db: &DatabaseConnection,
    provider: &str,
    order_id: &str,
    status: &str,
    received_at: DateTime<Utc>,
) -> Uuid {
    let id = Uuid::new_v4();
    webhook_events::ActiveModel {
        id: Set(id),
        provider: Set(provider.into()),
        dedupe_key: Set(format!("{order_id}:{status}:{id}")),
        order_id: Set(order_id.into()),
        provider_status: Set(status.into()),
        payload: Set(serde_json::json!({})),
        received_at: Set(received_at),
        settled_at: Set(None),
        settlement_error: Set(None),
    }
    .insert(db)
    .await
    .expect("insert event");
    id
}
