//! The model rules of `entity` on the schema the migrations make: first-sight
//! defaults, cancel/resume, profile save, role changes, and the avatar
//! generation that the upload and the cleanup share.
//!
//! Every scenario runs on SQLite (in memory, or a multi-connection file where
//! connections contend) and always again on a scratch PostgreSQL database
//! (`TEST_DATABASE_ADMIN_URL`, see `common`): a test fails with a message
//! when PostgreSQL is unreachable, it never skips. The tests live in the
//! `migration` crate because `migration` depends on `entity`.

use crate::common::{on_concurrent_backends, on_each_backend};
use chrono::{Duration as Days, Utc};
use entity::{
    accounts::avatar::{self, Cleanup},
    accounts::profile::{self, ProfileInput},
    accounts::roles::{self, RoleError},
    accounts::users::{ensure_user, Identity, UserContext},
    billing::subscription::{self, SubscriptionAction, SubscriptionError},
    entities::{
        audit_logs, profiles,
        subscriptions::{self, SubscriptionStatus},
        user_roles::{self, Role},
        users,
    },
};
use sea_orm::{
    sea_query::Expr, ColumnTrait, ConnectionTrait, DatabaseConnection, EntityTrait, PaginatorTrait,
    QueryFilter,
};
use serde_json::json;
use uuid::Uuid;

// ---------------------------------------------------------------- helpers

fn ident(email: Option<&str>) -> Identity {
    Identity {
        user_id: Uuid::new_v4(),
        email: email.map(str::to_string),
    }
}

fn no_admins() -> Vec<String> {
    Vec::new()
}

/// Rows of `uid` in users, profiles, subscriptions, user_roles.
async fn row_counts(db: &DatabaseConnection, uid: Uuid) -> [u64; 4] {
    [
        users::Entity::find()
            .filter(users::Column::Id.eq(uid))
            .count(db)
            .await
            .unwrap(),
        profiles::Entity::find()
            .filter(profiles::Column::UserId.eq(uid))
            .count(db)
            .await
            .unwrap(),
        subscriptions::Entity::find()
            .filter(subscriptions::Column::UserId.eq(uid))
            .count(db)
            .await
            .unwrap(),
        user_roles::Entity::find()
            .filter(user_roles::Column::UserId.eq(uid))
            .count(db)
            .await
            .unwrap(),
    ]
}

async fn make_paid(db: &DatabaseConnection, uid: Uuid, plan: &str) {
    let now = Utc::now();
    subscriptions::Entity::update_many()
        .col_expr(subscriptions::Column::Plan, Expr::value(plan))
        .col_expr(
            subscriptions::Column::CurrentPeriodStart,
            Expr::value(Some(now)),
        )
        .col_expr(
            subscriptions::Column::CurrentPeriodEnd,
            Expr::value(Some(now + Days::days(30))),
        )
        .filter(subscriptions::Column::UserId.eq(uid))
        .exec(db)
        .await
        .unwrap();
}

async fn set_status(db: &DatabaseConnection, uid: Uuid, status: SubscriptionStatus) {
    subscriptions::Entity::update_many()
        .col_expr(subscriptions::Column::Status, Expr::value(status))
        .filter(subscriptions::Column::UserId.eq(uid))
        .exec(db)
        .await
        .unwrap();
}

async fn sub_row(db: &DatabaseConnection, uid: Uuid) -> subscriptions::Model {
    subscriptions::Entity::find_by_id(uid)
        .one(db)
        .await
        .unwrap()
        .unwrap()
}

/// The `role.change` audit rows (an admin changing a role).
async fn audit_count(db: &DatabaseConnection) -> u64 {
    audit_logs::Entity::find()
        .filter(audit_logs::Column::Action.eq("role.change"))
        .count(db)
        .await
        .unwrap()
}

async fn role_of(db: &DatabaseConnection, uid: Uuid) -> Role {
    user_roles::Entity::find_by_id(uid)
        .one(db)
        .await
        .unwrap()
        .unwrap()
        .role
}

// ---------------------------------------------------------------- ensure_user

#[tokio::test]
async fn first_sight_creates_default_rows_once() {
    on_each_backend(|db| async move {
        let id = ident(Some("ann@example.com"));
        let ctx = ensure_user(&db, &id, &no_admins()).await.unwrap();
        assert_eq!(
            ctx,
            UserContext {
                user_id: id.user_id,
                email: Some("ann@example.com".into()),
                role: Role::Member
            }
        );
        assert_eq!(row_counts(&db, id.user_id).await, [1, 1, 1, 1]);

        let p = profiles::Entity::find_by_id(id.user_id)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.full_name, p.avatar_path, p.avatar_url),
            (None, None, None)
        );
        let s = sub_row(&db, id.user_id).await;
        assert_eq!(s.plan, "FREE");
        assert_eq!(s.status, SubscriptionStatus::Active);
        assert!(!s.cancel_at_period_end);
        assert_eq!(
            (s.current_period_start, s.current_period_end, s.canceled_at),
            (None, None, None)
        );

        // Second sight: same context, no new rows.
        let again = ensure_user(&db, &id, &no_admins()).await.unwrap();
        assert_eq!(again, ctx);
        assert_eq!(row_counts(&db, id.user_id).await, [1, 1, 1, 1]);

        // A new email in the token is stored; a token without email keeps it.
        let moved = Identity {
            user_id: id.user_id,
            email: Some("ann@new.example.com".into()),
        };
        ensure_user(&db, &moved, &no_admins()).await.unwrap();
        let no_email = Identity {
            user_id: id.user_id,
            email: None,
        };
        let ctx = ensure_user(&db, &no_email, &no_admins()).await.unwrap();
        assert_eq!(ctx.email.as_deref(), Some("ann@new.example.com"));
        let u = users::Entity::find_by_id(id.user_id)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(u.email.as_deref(), Some("ann@new.example.com"));

        // A user row without its other rows (created elsewhere) is completed.
        let half = ident(None);
        users::Entity::insert(users::ActiveModel {
            id: sea_orm::Set(half.user_id),
            email: sea_orm::Set(None),
            created_at: sea_orm::Set(Utc::now()),
        })
        .exec_without_returning(&db)
        .await
        .unwrap();
        let ctx = ensure_user(&db, &half, &no_admins()).await.unwrap();
        assert_eq!(ctx.role, Role::Member);
        assert_eq!(row_counts(&db, half.user_id).await, [1, 1, 1, 1]);
    })
    .await;
}

#[tokio::test]
async fn admin_emails_bootstrap_at_first_sight_only() {
    on_each_backend(|db| async move {
        let admins = vec!["boss@example.com".to_string()];
        let boss = ident(Some("Boss@Example.COM"));
        let ctx = ensure_user(&db, &boss, &admins).await.unwrap();
        assert_eq!(ctx.role, Role::Admin);
        assert!(ctx.is_admin());

        let other = ident(Some("other@example.com"));
        assert_eq!(
            ensure_user(&db, &other, &admins).await.unwrap().role,
            Role::Member
        );
        let anon = ident(None);
        assert_eq!(
            ensure_user(&db, &anon, &admins).await.unwrap().role,
            Role::Member
        );

        // Adding an existing member's email later does not promote them.
        let later = vec!["other@example.com".to_string()];
        assert_eq!(
            ensure_user(&db, &other, &later).await.unwrap().role,
            Role::Member
        );
    })
    .await;
}

#[tokio::test]
async fn concurrent_first_requests_make_one_row_each() {
    on_concurrent_backends(|db| async move {
        for round in 0..10 {
            let id = ident(Some(&format!("race{round}@example.com")));
            let admins = vec![format!("race{round}@example.com")];
            let (a, b, c, d) = tokio::join!(
                ensure_user(&db, &id, &admins),
                ensure_user(&db, &id, &admins),
                ensure_user(&db, &id, &admins),
                ensure_user(&db, &id, &admins),
            );
            for r in [a, b, c, d] {
                let ctx = r.expect("every racer succeeds");
                assert_eq!(ctx.user_id, id.user_id);
                assert_eq!(ctx.role, Role::Admin);
            }
            assert_eq!(row_counts(&db, id.user_id).await, [1, 1, 1, 1]);
        }
        assert_eq!(users::Entity::find().count(&db).await.unwrap(), 10);
        assert_eq!(user_roles::Entity::find().count(&db).await.unwrap(), 10);
    })
    .await;
}

// ---------------------------------------------------------------- subscription

#[tokio::test]
async fn cancel_and_resume_follow_the_rules() {
    on_each_backend(|db| async move {
        let id = ident(Some("sub@example.com"));
        ensure_user(&db, &id, &no_admins()).await.unwrap();
        let uid = id.user_id;

        // FREE: both actions refused.
        for action in [SubscriptionAction::Cancel, SubscriptionAction::Resume] {
            let e = subscription::change(&db, uid, action, Default::default())
                .await
                .unwrap_err();
            assert!(matches!(e, SubscriptionError::FreePlan), "{e:?}");
        }

        make_paid(&db, uid, "PRO").await;
        let end = sub_row(&db, uid).await.current_period_end;

        // Resume while not cancelling: idempotent success.
        let v = subscription::change(&db, uid, SubscriptionAction::Resume, Default::default())
            .await
            .unwrap();
        assert_eq!((v.status, v.cancel_at_period_end), ("active", false));

        let v = subscription::change(&db, uid, SubscriptionAction::Cancel, Default::default())
            .await
            .unwrap();
        assert_eq!(v.plan, "PRO");
        assert_eq!(v.status, "cancel_at_period_end");
        assert!(v.cancel_at_period_end);
        assert_eq!(v.current_period_end, end);
        let row = sub_row(&db, uid).await;
        assert!(row.cancel_at_period_end);
        let canceled_at = row.canceled_at.expect("canceled_at set");
        assert_eq!(row.status, SubscriptionStatus::Active);

        // Cancel again: same state, canceled_at untouched.
        let v = subscription::change(&db, uid, SubscriptionAction::Cancel, Default::default())
            .await
            .unwrap();
        assert_eq!(v.status, "cancel_at_period_end");
        assert_eq!(sub_row(&db, uid).await.canceled_at, Some(canceled_at));

        let v = subscription::change(&db, uid, SubscriptionAction::Resume, Default::default())
            .await
            .unwrap();
        assert_eq!((v.status, v.cancel_at_period_end), ("active", false));
        let row = sub_row(&db, uid).await;
        assert!(!row.cancel_at_period_end);
        assert_eq!(row.canceled_at, None);

        // In its renewal grace (`past_due`) it still moves: cancel, resume.
        set_status(&db, uid, SubscriptionStatus::PastDue).await;
        let v = subscription::change(&db, uid, SubscriptionAction::Cancel, Default::default())
            .await
            .unwrap();
        assert_eq!(
            (v.status, v.cancel_at_period_end),
            ("cancel_at_period_end", true)
        );
        let v = subscription::change(&db, uid, SubscriptionAction::Resume, Default::default())
            .await
            .unwrap();
        assert_eq!((v.status, v.cancel_at_period_end), ("past_due", false));

        // Ended (`canceled`): refused, nothing written.
        let status = SubscriptionStatus::Canceled;
        set_status(&db, uid, status).await;
        for action in [SubscriptionAction::Cancel, SubscriptionAction::Resume] {
            let e = subscription::change(&db, uid, action, Default::default())
                .await
                .unwrap_err();
            assert!(
                matches!(e, SubscriptionError::NotActive(s) if s == status),
                "{e:?}"
            );
        }
        assert!(!sub_row(&db, uid).await.cancel_at_period_end);

        // No row at all.
        let e = subscription::change(
            &db,
            Uuid::new_v4(),
            SubscriptionAction::Cancel,
            Default::default(),
        )
        .await
        .unwrap_err();
        assert!(matches!(e, SubscriptionError::NotFound), "{e:?}");
    })
    .await;
}

#[tokio::test]
async fn concurrent_cancel_and_resume_stay_consistent() {
    on_concurrent_backends(|db| async move {
        let id = ident(None);
        ensure_user(&db, &id, &no_admins()).await.unwrap();
        make_paid(&db, id.user_id, "BASIC").await;
        for _ in 0..10 {
            let (a, b, c, d) = tokio::join!(
                subscription::change(
                    &db,
                    id.user_id,
                    SubscriptionAction::Cancel,
                    Default::default()
                ),
                subscription::change(
                    &db,
                    id.user_id,
                    SubscriptionAction::Resume,
                    Default::default()
                ),
                subscription::change(
                    &db,
                    id.user_id,
                    SubscriptionAction::Cancel,
                    Default::default()
                ),
                subscription::change(
                    &db,
                    id.user_id,
                    SubscriptionAction::Resume,
                    Default::default()
                ),
            );
            for (i, r) in [a, b, c, d].into_iter().enumerate() {
                let v = r.expect("every request succeeds");
                // Each answers the state its own action left.
                assert_eq!(v.cancel_at_period_end, i % 2 == 0);
            }
            let row = sub_row(&db, id.user_id).await;
            assert_eq!(row.cancel_at_period_end, row.canceled_at.is_some());
        }
    })
    .await;
}

// ---------------------------------------------------------------- profile

#[tokio::test]
async fn profile_save_reports_the_unreferenced_avatar() {
    on_each_backend(|db| async move {
        let id = ident(None);
        ensure_user(&db, &id, &no_admins()).await.unwrap();
        let uid = id.user_id;
        let path = format!("{uid}/avatar");
        let url = format!("http://127.0.0.1:8080/storage/v1/object/public/avatars/{path}");

        let input = ProfileInput::new(uid, Some(" Ann "), Some(&path), Some(&url)).unwrap();
        let saved = profile::save(&db, uid, input).await.unwrap();
        assert_eq!(saved.profile.full_name.as_deref(), Some("Ann"));
        assert_eq!(saved.profile.avatar_path.as_deref(), Some(path.as_str()));
        assert_eq!(saved.profile.avatar_url.as_deref(), Some(url.as_str()));
        assert_eq!(saved.replaced_object, None);

        // Same path again (a new upload overwrote the object in place): nothing to clean.
        let input = ProfileInput::new(uid, Some("Ann B"), Some(&path), Some(&url)).unwrap();
        let saved = profile::save(&db, uid, input).await.unwrap();
        assert_eq!(saved.replaced_object, None);
        assert_eq!(saved.profile.full_name.as_deref(), Some("Ann B"));

        // Absent fields are kept.
        let input = ProfileInput::new(uid, Some("Ann C"), None, None).unwrap();
        let saved = profile::save(&db, uid, input).await.unwrap();
        assert_eq!(saved.profile.avatar_path.as_deref(), Some(path.as_str()));
        assert_eq!(saved.replaced_object, None);

        // Removal: the old object is reported.
        let input = ProfileInput::new(uid, Some("Ann C"), Some(""), Some("")).unwrap();
        let saved = profile::save(&db, uid, input).await.unwrap();
        assert_eq!(saved.profile.avatar_path, None);
        assert_eq!(saved.profile.avatar_url, None);
        assert_eq!(saved.replaced_object.as_deref(), Some(path.as_str()));
        let stored = profiles::Entity::find_by_id(uid)
            .one(&db)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(stored, saved.profile);

        // A legacy key of this user replaced by the canonical one is reported;
        // a stored key outside the user's prefix never is.
        for (old, expected) in [
            (format!("{uid}/old.png"), Some(format!("{uid}/old.png"))),
            (format!("{}/avatar", Uuid::new_v4()), None),
        ] {
            profiles::Entity::update_many()
                .col_expr(profiles::Column::AvatarPath, Expr::value(Some(old)))
                .filter(profiles::Column::UserId.eq(uid))
                .exec(&db)
                .await
                .unwrap();
            let input = ProfileInput::new(uid, None, Some(&path), None).unwrap();
            let saved = profile::save(&db, uid, input).await.unwrap();
            assert_eq!(saved.replaced_object, expected);
            assert_eq!(saved.profile.avatar_path.as_deref(), Some(path.as_str()));
        }

        // Input validated for someone else is refused.
        let input = ProfileInput::new(uid, Some("x"), None, None).unwrap();
        assert!(profile::save(&db, Uuid::new_v4(), input).await.is_err());
    })
    .await;
}

// ---------------------------------------------------------------- avatar generation

/// The cleanup's decision for `path`, unreferenced at `generation`, taken as
/// the job takes it (profile row locked), then the transaction committed.
async fn cleanup_of(db: &DatabaseConnection, uid: Uuid, path: &str, generation: i64) -> Cleanup {
    let (txn, profile) = avatar::begin_cleanup(db, uid).await.unwrap();
    let current = profile
        .as_ref()
        .map(|p| (p.avatar_path.as_deref(), p.avatar_generation));
    let decision = avatar::cleanup_decision(path, generation, current);
    txn.commit().await.unwrap();
    decision
}

/// One completed upload: bump the generation under the lock, commit.
async fn uploaded(db: &DatabaseConnection, uid: Uuid) -> i64 {
    let (txn, generation) = avatar::begin_upload(db, uid).await.unwrap();
    txn.commit().await.unwrap();
    generation
}

#[tokio::test]
async fn avatar_cleanup_decides_by_generation_in_both_orders() {
    on_each_backend(|db| async move {
        let id = ident(None);
        ensure_user(&db, &id, &no_admins()).await.unwrap();
        let uid = id.user_id;
        let path = avatar::path_of(uid);
        let save = |p: &'static str| {
            let db = db.clone();
            let path = path.clone();
            async move {
                let value = if p.is_empty() { "" } else { path.as_str() };
                let input = ProfileInput::new(uid, None, Some(value), None).unwrap();
                profile::save(&db, uid, input).await.unwrap()
            }
        };

        // Upload → save → remove → job: the object goes.
        assert_eq!(uploaded(&db, uid).await, 1);
        save("set").await;
        let removed = save("").await;
        assert_eq!(removed.replaced_object.as_deref(), Some(path.as_str()));
        assert_eq!(removed.profile.avatar_generation, 1);
        let generation = removed.profile.avatar_generation;
        assert_eq!(
            cleanup_of(&db, uid, &path, generation).await,
            Cleanup::Delete
        );

        // Upload → save → remove → upload again → job: the new upload stays,
        // saved or not.
        assert_eq!(uploaded(&db, uid).await, 2);
        save("set").await;
        let removed = save("").await;
        let generation = removed.profile.avatar_generation;
        assert_eq!(generation, 2);
        assert_eq!(uploaded(&db, uid).await, 3);
        assert_eq!(
            cleanup_of(&db, uid, &path, generation).await,
            Cleanup::KeepRewritten
        );
        save("set").await;
        assert_eq!(
            cleanup_of(&db, uid, &path, generation).await,
            Cleanup::KeepReferenced
        );

        // A profile row that is missing is created by the upload.
        let late = ident(None);
        ensure_user(&db, &late, &no_admins()).await.unwrap();
        profiles::Entity::delete_by_id(late.user_id)
            .exec(&db)
            .await
            .unwrap();
        assert_eq!(uploaded(&db, late.user_id).await, 1);
        // Gone with its user: delete.
        users::Entity::delete_by_id(late.user_id)
            .exec(&db)
            .await
            .unwrap();
        assert_eq!(
            cleanup_of(&db, late.user_id, &avatar::path_of(late.user_id), 1).await,
            Cleanup::Delete
        );
    })
    .await;
}

/// On PostgreSQL the cleanup waits for an upload that holds the profile row
/// lock and then sees its generation: it can never decide between the
/// generation bump and the object being put in place.
#[tokio::test]
async fn avatar_cleanup_waits_for_an_upload_in_progress_on_postgres() {
    crate::common::on_postgres(|db| async move {
        let id = ident(None);
        ensure_user(&db, &id, &no_admins()).await.unwrap();
        let uid = id.user_id;
        let path = avatar::path_of(uid);
        let input = ProfileInput::new(uid, None, Some(""), None).unwrap();
        let removed = profile::save(&db, uid, input).await.unwrap();
        let generation = removed.profile.avatar_generation;

        let (upload, bumped) = avatar::begin_upload(&db, uid).await.unwrap();
        assert_eq!(bumped, generation + 1);
        let cleanup = tokio::spawn({
            let db = db.clone();
            let path = path.clone();
            async move { cleanup_of(&db, uid, &path, generation).await }
        });
        // Wait (a condition, not a sleep) until the cleanup is blocked on the lock.
        let mut blocked = false;
        for _ in 0..500 {
            let row = db
                .query_one_raw(sea_orm::Statement::from_string(
                    sea_orm::DbBackend::Postgres,
                    "SELECT count(*) AS n FROM pg_stat_activity \
                     WHERE datname = current_database() AND wait_event_type = 'Lock'",
                ))
                .await
                .unwrap()
                .unwrap();
            if row.try_get::<i64>("", "n").unwrap() > 0 {
                blocked = true;
                break;
            }
            assert!(
                !cleanup.is_finished(),
                "the cleanup did not wait for the lock"
            );
            tokio::task::yield_now().await;
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert!(blocked, "the cleanup never waited on the profile row lock");
        upload.commit().await.unwrap();
        assert_eq!(cleanup.await.unwrap(), Cleanup::KeepRewritten);
    })
    .await;
}

// ---------------------------------------------------------------- roles

#[tokio::test]
async fn role_changes_are_authorised_and_audited() {
    on_each_backend(|db| async move {
        let admins = vec!["root@example.com".to_string()];
        let admin = ensure_user(&db, &ident(Some("root@example.com")), &admins)
            .await
            .unwrap();
        let member = ensure_user(&db, &ident(Some("m@example.com")), &admins)
            .await
            .unwrap();
        let target = ensure_user(&db, &ident(Some("t@example.com")), &admins)
            .await
            .unwrap();

        // A member cannot change anyone, themselves included.
        for (who, role) in [(target.user_id, Role::Admin), (member.user_id, Role::Admin)] {
            let e = roles::set_role(&db, &member, who, role, None, None)
                .await
                .unwrap_err();
            assert!(matches!(e, RoleError::Forbidden), "{e:?}");
        }
        assert_eq!(role_of(&db, member.user_id).await, Role::Member);

        // Self-demotion.
        let e = roles::set_role(&db, &admin, admin.user_id, Role::Member, None, None)
            .await
            .unwrap_err();
        assert!(matches!(e, RoleError::SelfDemotion), "{e:?}");
        assert_eq!(role_of(&db, admin.user_id).await, Role::Admin);

        // Unknown target.
        let e = roles::set_role(&db, &admin, Uuid::new_v4(), Role::Admin, None, None)
            .await
            .unwrap_err();
        assert!(matches!(e, RoleError::UnknownUser), "{e:?}");
        assert_eq!(audit_count(&db).await, 0);
        // The admin's grant by email was audited once, as `role.grant`.
        let grants = audit_logs::Entity::find()
            .filter(audit_logs::Column::Action.eq("role.grant"))
            .all(&db)
            .await
            .unwrap();
        assert_eq!(grants.len(), 1);
        assert_eq!(grants[0].target_id, admin.user_id.to_string());

        // Success: role changed and exactly one audit row.
        let before = Utc::now() - Days::seconds(5);
        let change = roles::set_role(
            &db,
            &admin,
            target.user_id,
            Role::Admin,
            Some("req-1".into()),
            Some("client-1".into()),
        )
        .await
        .unwrap();
        assert!(change.changed);
        assert_eq!(change.old_role, Some(Role::Member));
        assert_eq!(change.role, Role::Admin);
        assert_eq!(role_of(&db, target.user_id).await, Role::Admin);
        let rows = audit_logs::Entity::find()
            .filter(audit_logs::Column::Action.eq("role.change"))
            .all(&db)
            .await
            .unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        assert_eq!(row.actor_id, Some(admin.user_id));
        assert_eq!(row.action, "role.change");
        assert_eq!(row.target_type, "user");
        assert_eq!(row.target_id, target.user_id.to_string());
        assert_eq!(row.old_value, Some(json!({"role": "member"})));
        assert_eq!(row.new_value, Some(json!({"role": "admin"})));
        assert_eq!(row.request_id.as_deref(), Some("req-1"));
        assert_eq!(row.client_request_id.as_deref(), Some("client-1"));
        assert!(row.created_at > before);

        // Same role again: success, nothing written.
        let same = roles::set_role(&db, &admin, target.user_id, Role::Admin, None, None)
            .await
            .unwrap();
        assert!(!same.changed);
        assert_eq!(audit_count(&db).await, 1);
        // An admin re-affirming their own admin role is not a demotion.
        let own = roles::set_role(&db, &admin, admin.user_id, Role::Admin, None, None)
            .await
            .unwrap();
        assert!(!own.changed);

        // Demote back: a second audit row.
        roles::set_role(&db, &admin, target.user_id, Role::Member, None, None)
            .await
            .unwrap();
        assert_eq!(role_of(&db, target.user_id).await, Role::Member);
        assert_eq!(audit_count(&db).await, 2);

        // A stale context claiming admin is checked against the database.
        let stale = UserContext {
            role: Role::Admin,
            ..target.clone()
        };
        let e = roles::set_role(&db, &stale, member.user_id, Role::Admin, None, None)
            .await
            .unwrap_err();
        assert!(matches!(e, RoleError::Forbidden), "{e:?}");
        assert_eq!(audit_count(&db).await, 2);
    })
    .await;
}
