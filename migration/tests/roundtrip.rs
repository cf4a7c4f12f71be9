//! Applies every migration, steps the last one down and up again, writes and
//! reads one row per table through the entities, checks the unique and
//! foreign-key rules, then rolls everything back (`down`).
//!
//! Runs on an in-memory SQLite database and on a scratch PostgreSQL database
//! made from `TEST_DATABASE_ADMIN_URL` (default
//! `postgres://postgres@127.0.0.1:5432/postgres`); the PostgreSQL test fails
//! with a message when PostgreSQL is unreachable.

use chrono::Utc;
use entity::entities::{
    ai_usage, audit_logs, payments, profiles, subscriptions, user_roles, users, waitlist,
    webhook_events,
};
use migration::{Migrator, MigratorTrait};
use sea_orm_migration::sea_orm::{
    ActiveModelTrait,
    ActiveValue::{NotSet, Set},
    ColumnTrait, ConnectionTrait, Database, DatabaseConnection, DbBackend, DbErr, EntityTrait,
    ModelTrait, PaginatorTrait, QueryFilter, SqlErr, Statement,
};
use sea_orm_migration::SchemaManager;
use serde_json::json;
use uuid::Uuid;

const TABLES: [&str; 9] = [
    "users",
    "profiles",
    "subscriptions",
    "user_roles",
    "payments",
    "webhook_events",
    "audit_logs",
    "waitlist",
    "ai_usage",
];

#[tokio::test]
async fn sqlite_roundtrip() -> Result<(), DbErr> {
    let db = Database::connect("sqlite::memory:").await?;
    roundtrip(&db).await
}

#[tokio::test]
async fn postgres_roundtrip() {
    let scratch = crate::common::Scratch::empty().await;
    let outcome = roundtrip(&scratch.db).await;
    scratch.remove().await;
    outcome.expect("PostgreSQL round trip");
}

fn assert_sql_err(result: Result<impl std::fmt::Debug, DbErr>, unique: bool) {
    let err = result.expect_err("the statement should have been rejected");
    match (err.sql_err(), unique) {
        (Some(SqlErr::UniqueConstraintViolation(_)), true) => {}
        (Some(SqlErr::ForeignKeyConstraintViolation(_)), false) => {}
        (other, _) => panic!("unexpected error {err:?} (classified as {other:?})"),
    }
}

/// How many row triggers whose name ends in `suffix` exist (0 on SQLite).
async fn triggers_named(db: &DatabaseConnection, suffix: &str) -> Result<i64, DbErr> {
    if db.get_database_backend() != DbBackend::Postgres {
        return Ok(0);
    }
    let row = db
        .query_one_raw(Statement::from_sql_and_values(
            DbBackend::Postgres,
            "SELECT count(*) AS n FROM pg_trigger WHERE right(tgname, length($1)) = $1 AND NOT tgisinternal",
            [suffix.into()],
        ))
        .await?
        .expect("a count");
    row.try_get::<i64>("", "n")
}

async fn roundtrip(db: &DatabaseConnection) -> Result<(), DbErr> {
    let manager = SchemaManager::new(db);

    Migrator::up(db, None).await?;
    assert!(Migrator::get_pending_migrations(db).await?.is_empty());
    assert_eq!(
        Migrator::get_applied_migrations(db).await?.len(),
        Migrator::migrations().len()
    );
    for table in TABLES {
        assert!(manager.has_table(table).await?, "{table} missing after up");
    }

    // The price a plan was chosen at first, then the application's clock
    // (its table, and `app_now()` on PostgreSQL), then the scheduled
    // phases, then the price-change notices.
    assert!(
        manager
            .has_column("subscriptions", "renewal_plan_price")
            .await?,
        "renewal_plan_price after up"
    );
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager
            .has_column("subscriptions", "renewal_plan_price")
            .await?,
        "renewal_plan_price after down"
    );
    assert!(manager.has_table("app_clock").await?, "app_clock after up");
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("app_clock").await?,
        "app_clock after down"
    );
    let phase_columns = ["scheduled_plan", "scheduled_payment_id"];
    for column in phase_columns {
        assert!(
            manager.has_column("subscriptions", column).await?,
            "{column}"
        );
    }
    Migrator::down(db, Some(1)).await?;
    for column in phase_columns {
        assert!(
            !manager.has_column("subscriptions", column).await?,
            "{column} after down"
        );
    }

    let price_columns = [
        "price_notice_plan",
        "price_notice_amount",
        "price_notice_at",
    ];
    for column in price_columns {
        assert!(
            manager.has_column("subscriptions", column).await?,
            "{column}"
        );
    }
    Migrator::down(db, Some(1)).await?;
    for column in price_columns {
        assert!(
            !manager.has_column("subscriptions", column).await?,
            "{column} after down"
        );
    }

    // Then the billing ledger and receipts: the ledger refuses updates
    // and deletes.
    for table in ["billing_ledger", "billing_receipts"] {
        assert!(manager.has_table(table).await?, "{table} after up");
    }
    assert!(manager.has_column("payments", "carried_out_value").await?);
    entity::entities::billing_ledger::ActiveModel {
        id: Set(Uuid::now_v7()),
        user_id: Set(Uuid::new_v4()),
        kind: Set("operator".into()),
        payment_id: Set(None),
        renewal_id: Set(None),
        actor_id: Set(None),
        plan_from: Set("FREE".into()),
        plan_to: Set("PRO".into()),
        end_from: Set(None),
        end_to: Set(None),
        grace_from: Set(None),
        grace_to: Set(None),
        seconds: Set(0),
        value: Set(0),
        created_at: Set(Utc::now()),
    }
    .insert(db)
    .await?;
    for change in [
        "UPDATE billing_ledger SET value = 1",
        "DELETE FROM billing_ledger",
    ] {
        assert!(
            db.execute_unprepared(change).await.is_err(),
            "{change} on the append-only ledger"
        );
    }
    Migrator::down(db, Some(1)).await?;
    for table in ["billing_ledger", "billing_receipts"] {
        assert!(!manager.has_table(table).await?, "{table} after down");
    }
    assert!(!manager.has_column("payments", "carried_out_value").await?);

    // Then the renewal loop's pauses.
    assert!(manager.has_table("renewal_pauses").await?);
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("renewal_pauses").await?,
        "renewal_pauses after down"
    );

    // Then the email change's verified half.
    assert!(
        manager
            .has_column("auth_accounts", "email_change_verified")
            .await?
    );
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager
            .has_column("auth_accounts", "email_change_verified")
            .await?,
        "email_change_verified after down"
    );

    // Then the grace's times, then the billing anchor's columns.
    for column in ["past_due_at", "grace_ends_at"] {
        assert!(manager.has_column("subscriptions", column).await?);
    }
    Migrator::down(db, Some(1)).await?;
    for column in ["past_due_at", "grace_ends_at"] {
        assert!(
            !manager.has_column("subscriptions", column).await?,
            "{column} after down"
        );
    }
    for column in ["billing_anchor_day", "billing_anchor_time"] {
        assert!(manager.has_column("subscriptions", column).await?);
    }
    Migrator::down(db, Some(1)).await?;
    for column in ["billing_anchor_day", "billing_anchor_time"] {
        assert!(
            !manager.has_column("subscriptions", column).await?,
            "{column} after down"
        );
    }

    // Then the renewal loop's claims, then the renewals: their table,
    // `payments.renewal_id` and `subscriptions.renewal_plan` go with one
    // step down.
    assert!(manager.has_table("renewal_claims").await?);
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("renewal_claims").await?,
        "renewal_claims after down"
    );
    assert!(manager.has_table("renewals").await?);
    assert!(manager.has_column("payments", "renewal_id").await?);
    assert!(manager.has_column("subscriptions", "renewal_plan").await?);
    Migrator::down(db, Some(1)).await?;
    assert!(!manager.has_table("renewals").await?, "renewals after down");
    assert!(!manager.has_column("payments", "renewal_id").await?);
    assert!(!manager.has_column("subscriptions", "renewal_plan").await?);

    // Then the billing migrations, newest first: the payments' stored
    // grants, then the billing mails' keys.
    let grant_columns = [
        "grant_plan",
        "grant_start",
        "grant_end",
        "grant_from_plan",
        "grant_from_end",
        "carried_seconds",
        "carried_value",
        "carried_into",
        "refunded_amount",
    ];
    for column in grant_columns {
        assert!(
            manager.has_column("payments", column).await?,
            "payments.{column}"
        );
    }
    Migrator::down(db, Some(1)).await?;
    for column in grant_columns {
        assert!(
            !manager.has_column("payments", column).await?,
            "payments.{column} after down"
        );
    }
    assert!(manager.has_table("billing_mails").await?);
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("billing_mails").await?,
        "billing_mails after down"
    );
    // The price a plan was chosen at, the application's clock, the
    // scheduled phases, the price-change notices, the billing ledger, the
    // renewal pauses, the email change's verified half, the grace's times,
    // the billing anchor, renewal_claims, renewals, grants, billing mails.
    const BILLING_STEPS: usize = 13;

    // The newest migrations, newest first: the identity provider's
    // per-address rules, the account cache's triggers (PostgreSQL only), the
    // AI quota counters, then the identity provider's trust columns, then the
    // job outbox.
    let on_pg = db.get_database_backend() == DbBackend::Postgres;
    let address_tables = ["auth_mail_slots", "auth_code_attempts"];
    let signup_columns = [
        ("auth_accounts", "signup_id"),
        ("auth_one_time_tokens", "signup_id"),
        ("auth_flow_states", "password_hash"),
    ];
    for table in address_tables {
        assert!(manager.has_table(table).await?, "{table} after up");
    }
    for (table, column) in signup_columns {
        assert!(manager.has_column(table, column).await?, "{table}.{column}");
    }
    Migrator::down(db, Some(1)).await?;
    for table in address_tables {
        assert!(!manager.has_table(table).await?, "{table} after down");
    }
    for (table, column) in signup_columns {
        assert!(
            !manager.has_column(table, column).await?,
            "{table}.{column} after down"
        );
    }
    let cache_triggers = || triggers_named(db, "_notify_user_changed");
    assert_eq!(cache_triggers().await?, if on_pg { 5 } else { 0 });
    Migrator::down(db, Some(1)).await?;
    assert_eq!(cache_triggers().await?, 0, "notify triggers after down");
    assert!(manager.has_table("ai_quota_counters").await?);
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("ai_quota_counters").await?,
        "ai_quota_counters after down"
    );
    let trust_columns = [
        ("auth_one_time_tokens", "failed_attempts"),
        ("auth_accounts", "reauthentication_sent_at"),
    ];
    for (table, column) in trust_columns {
        assert!(manager.has_column(table, column).await?, "{table}.{column}");
    }
    Migrator::down(db, Some(1)).await?;
    for (table, column) in trust_columns {
        assert!(
            !manager.has_column(table, column).await?,
            "{table}.{column} after down"
        );
    }
    assert!(
        manager.has_table("job_outbox").await?,
        "job_outbox after up"
    );
    Migrator::down(db, Some(1)).await?;
    assert!(
        !manager.has_table("job_outbox").await?,
        "job_outbox after down"
    );
    assert_eq!(
        Migrator::get_pending_migrations(db).await?.len(),
        BILLING_STEPS + 5
    );
    const OUTBOX_STEPS: usize = BILLING_STEPS + 5;

    // Then, on PostgreSQL, one account-change trigger on each of users,
    // user_roles and subscriptions; on SQLite, nothing.
    let triggers = || triggers_named(db, "_notify_account_changed");
    assert_eq!(triggers().await?, if on_pg { 3 } else { 0 });
    Migrator::down(db, Some(1)).await?;
    assert_eq!(triggers().await?, 0, "account-change triggers after down");
    assert_eq!(
        Migrator::get_pending_migrations(db).await?.len(),
        OUTBOX_STEPS + 1
    );
    const TRIGGER_STEPS: usize = OUTBOX_STEPS + 1;

    // The identity migrations step down next; each names the tables it
    // creates.
    let created: [&[&str]; 2] = [
        &["auth_oauth_states"],
        &[
            "auth_accounts",
            "auth_identities",
            "auth_sessions",
            "auth_refresh_tokens",
            "auth_one_time_tokens",
            "auth_flow_states",
        ],
    ];
    for (steps, tables) in created.iter().enumerate() {
        for table in tables.iter() {
            assert!(manager.has_table(table).await?, "{table} missing after up");
        }
        Migrator::down(db, Some(1)).await?;
        for table in tables.iter() {
            assert!(!manager.has_table(table).await?, "{table} after down");
        }
        assert_eq!(
            Migrator::get_pending_migrations(db).await?.len(),
            TRIGGER_STEPS + steps + 1
        );
    }

    // Then the column migrations, newest first; each names the columns it
    // adds.
    let added: [&[(&str, &str)]; 4] = [
        &[("ai_usage", "aborted"), ("ai_usage", "estimated")],
        &[
            ("payments", "idempotency_key"),
            ("payments", "reconciled_at"),
        ],
        &[("audit_logs", "client_request_id")],
        &[("profiles", "avatar_generation")],
    ];
    for (steps, columns) in added.iter().enumerate() {
        for (table, column) in columns.iter() {
            assert!(manager.has_column(table, column).await?, "{table}.{column}");
        }
        Migrator::down(db, Some(1)).await?;
        for (table, column) in columns.iter() {
            assert!(
                !manager.has_column(table, column).await?,
                "{table}.{column} after down"
            );
        }
        assert_eq!(
            Migrator::get_pending_migrations(db).await?.len(),
            TRIGGER_STEPS + created.len() + steps + 1
        );
    }
    Migrator::up(db, None).await?;
    // Back up: the three account-change triggers and the renewals' one.
    assert_eq!(
        triggers().await?,
        if on_pg { 4 } else { 0 },
        "triggers after up"
    );
    for table in created
        .iter()
        .flat_map(|t| t.iter())
        .chain(&["job_outbox", "ai_quota_counters"])
        .chain(&address_tables)
    {
        assert!(manager.has_table(table).await?, "{table} after up");
    }
    for (table, column) in added
        .iter()
        .flat_map(|c| c.iter())
        .chain(&trust_columns)
        .chain(&signup_columns)
    {
        assert!(
            manager.has_column(table, column).await?,
            "{table}.{column} after up"
        );
    }

    // users: created_at filled by ActiveModelBehavior...
    let user = users::ActiveModel {
        id: Set(Uuid::new_v4()),
        email: Set(Some("someone@example.com".into())),
        created_at: NotSet,
    }
    .insert(db)
    .await?;
    assert_eq!(
        users::Entity::find_by_id(user.id).one(db).await?,
        Some(user.clone())
    );
    // ...or by the database default when the hook does not run (bulk insert).
    let other_id = Uuid::new_v4();
    users::Entity::insert(users::ActiveModel {
        id: Set(other_id),
        email: Set(None),
        created_at: NotSet,
    })
    .exec_without_returning(db)
    .await?;
    let other = users::Entity::find_by_id(other_id)
        .one(db)
        .await?
        .expect("other user");
    let age = Utc::now() - other.created_at;
    assert!(
        age.num_seconds().abs() < 60,
        "database default for created_at is off: {}",
        other.created_at
    );

    let profile = profiles::ActiveModel {
        user_id: Set(user.id),
        full_name: Set(Some("Some One".into())),
        avatar_path: Set(Some(format!("{}/avatar", user.id))),
        avatar_url: Set(None),
        ..Default::default()
    }
    .insert(db)
    .await?;
    assert_eq!(profile.created_at, profile.updated_at);
    assert_eq!(
        profile.avatar_generation, 0,
        "avatar_generation defaults to 0"
    );

    let subscription = subscriptions::ActiveModel {
        user_id: Set(user.id),
        plan: Set("PRO".into()),
        status: Set(subscriptions::SubscriptionStatus::Active),
        cancel_at_period_end: Set(false),
        current_period_start: Set(Some(Utc::now())),
        current_period_end: Set(Some(Utc::now() + chrono::Duration::days(30))),
        canceled_at: Set(None),
        billing_anchor_day: Set(Some(31)),
        billing_anchor_time: Set(chrono::NaiveTime::from_hms_micro_opt(23, 59, 58, 123_456)),
        ..Default::default()
    }
    .insert(db)
    .await?;
    // The billing anchor's day and local time (microseconds) read back as
    // written, on both backends.
    let read = subscriptions::Entity::find_by_id(user.id)
        .one(db)
        .await?
        .expect("the subscription");
    assert_eq!(read.billing_anchor_day, Some(31));
    assert_eq!(
        read.billing_anchor_time,
        chrono::NaiveTime::from_hms_micro_opt(23, 59, 58, 123_456)
    );

    let role = user_roles::ActiveModel {
        user_id: Set(user.id),
        role: Set(user_roles::Role::Admin),
        ..Default::default()
    }
    .insert(db)
    .await?;

    let payment = payments::ActiveModel {
        id: Set(Uuid::new_v4()),
        order_id: Set("SUB-1795000000000-AB12CD34".into()),
        user_id: Set(user.id),
        plan: Set("PRO".into()),
        amount: Set(149_000),
        currency: Set(payments::CURRENCY_IDR.into()),
        provider: Set(payments::PROVIDER_A.into()),
        status: Set(payments::PaymentStatus::Pending),
        checkout_token: Set(Some("tok_123".into())),
        payment_url: Set(Some("https://pay.example/tok_123".into())),
        provider_reference: Set(None),
        paid_at: Set(None),
        ..Default::default()
    }
    .insert(db)
    .await?;

    let event = webhook_events::ActiveModel {
        id: Set(Uuid::new_v4()),
        provider: Set(payments::PROVIDER_A.into()),
        dedupe_key: Set(format!("provider_a:{}:settlement", payment.order_id)),
        order_id: Set(payment.order_id.clone()),
        provider_status: Set("settlement".into()),
        payload: Set(json!({"order_id": payment.order_id, "gross_amount": "149000.00"})),
        received_at: NotSet,
        settled_at: Set(None),
        settlement_error: Set(None),
    }
    .insert(db)
    .await?;

    let audit = audit_logs::ActiveModel {
        id: Set(Uuid::new_v4()),
        actor_id: Set(Some(user.id)),
        action: Set(entity::base::audit::ACTION_ROLE_CHANGE.into()),
        target_type: Set("user".into()),
        target_id: Set(user.id.to_string()),
        old_value: Set(Some(json!({"role": "member"}))),
        new_value: Set(Some(json!({"role": "admin"}))),
        request_id: Set(Some("req-1".into())),
        client_request_id: Set(Some("client-1".into())),
        created_at: NotSet,
    }
    .insert(db)
    .await?;

    let signup = waitlist::ActiveModel {
        id: Set(Uuid::new_v4()),
        email: Set("early@example.com".into()),
        name: Set("Early Bird".into()),
        created_at: NotSet,
    }
    .insert(db)
    .await?;

    let usage = ai_usage::ActiveModel {
        id: Set(Uuid::new_v4()),
        user_id: Set(user.id),
        provider: Set("openai".into()),
        model: Set("gpt-4o-mini".into()),
        route: Set(ai_usage::ROUTE_CHAT.into()),
        input_tokens: Set(120),
        output_tokens: Set(480),
        aborted: Set(false),
        estimated: Set(false),
        created_at: NotSet,
    }
    .insert(db)
    .await?;

    // Everything reads back as written (uuid, enums, json, timestamps).
    assert_eq!(
        profiles::Entity::find_by_id(user.id).one(db).await?,
        Some(profile)
    );
    assert_eq!(
        subscriptions::Entity::find_by_id(user.id).one(db).await?,
        Some(subscription.clone())
    );
    assert_eq!(
        user_roles::Entity::find_by_id(user.id).one(db).await?,
        Some(role)
    );
    assert_eq!(
        payments::Entity::find_by_id(payment.id).one(db).await?,
        Some(payment.clone())
    );
    assert_eq!(
        webhook_events::Entity::find_by_id(event.id).one(db).await?,
        Some(event.clone())
    );
    assert_eq!(
        audit_logs::Entity::find_by_id(audit.id).one(db).await?,
        Some(audit)
    );
    assert_eq!(
        waitlist::Entity::find_by_id(signup.id).one(db).await?,
        Some(signup)
    );
    assert_eq!(
        ai_usage::Entity::find_by_id(usage.id).one(db).await?,
        Some(usage)
    );
    assert_eq!(
        payments::Entity::find()
            .filter(payments::Column::Status.eq(payments::PaymentStatus::Pending))
            .count(db)
            .await?,
        1
    );

    // Relations.
    assert!(user.find_related(profiles::Entity).one(db).await?.is_some());
    assert!(user
        .find_related(subscriptions::Entity)
        .one(db)
        .await?
        .is_some());
    assert!(user
        .find_related(user_roles::Entity)
        .one(db)
        .await?
        .is_some());
    assert_eq!(user.find_related(payments::Entity).count(db).await?, 1);
    assert_eq!(user.find_related(ai_usage::Entity).count(db).await?, 1);

    // Unique keys: the same (normalized) waitlist e-mail, the same webhook.
    assert_sql_err(
        waitlist::ActiveModel {
            id: Set(Uuid::new_v4()),
            email: Set("early@example.com".into()),
            name: Set("Again".into()),
            created_at: NotSet,
        }
        .insert(db)
        .await,
        true,
    );
    assert_sql_err(
        webhook_events::ActiveModel {
            id: Set(Uuid::new_v4()),
            dedupe_key: Set(event.dedupe_key.clone()),
            ..event.clone().into()
        }
        .insert(db)
        .await,
        true,
    );

    // updated_at moves on update.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let mut canceled: subscriptions::ActiveModel = subscription.clone().into();
    canceled.status = Set(subscriptions::SubscriptionStatus::Canceled);
    canceled.canceled_at = Set(Some(Utc::now()));
    let canceled = canceled.update(db).await?;
    assert_eq!(canceled.status, subscriptions::SubscriptionStatus::Canceled);
    assert!(canceled.updated_at > subscription.updated_at);

    // Foreign keys: no payment for an unknown user; a user with payments
    // cannot be deleted; deleting a user cascades to its per-user rows.
    assert_sql_err(
        payments::ActiveModel {
            id: Set(Uuid::new_v4()),
            order_id: Set("SUB-1795000000001-ZZZZZZZZ".into()),
            user_id: Set(Uuid::new_v4()),
            ..payment.clone().into()
        }
        .insert(db)
        .await,
        false,
    );
    assert_sql_err(user.clone().delete(db).await, false);
    payment.delete(db).await?;
    user.clone().delete(db).await?;
    assert_eq!(profiles::Entity::find().count(db).await?, 0);
    assert_eq!(subscriptions::Entity::find().count(db).await?, 0);
    assert_eq!(user_roles::Entity::find().count(db).await?, 0);
    assert_eq!(ai_usage::Entity::find().count(db).await?, 0);
    assert_eq!(audit_logs::Entity::find().count(db).await?, 1);

    // Roll everything back.
    Migrator::down(db, None).await?;
    for table in TABLES {
        assert!(!manager.has_table(table).await?, "{table} left after down");
    }
    assert_eq!(Migrator::get_applied_migrations(db).await?.len(), 0);
    Ok(())
}
