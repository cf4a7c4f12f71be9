//! Replicas on one fresh, empty PostgreSQL database: api processes started
//! together with `MIGRATE_ON_START`, and `migration up` run several times at
//! once (a release phase racing its apis), all apply the migrations or wait
//! for the one that does, and none fails on a half-created schema. The
//! migration lock (a PostgreSQL advisory lock) is released afterwards.

use migration::MigratorTrait;
use sea_orm::sqlx::{self, PgPool};
use tests::{bin, get, EnvMap, Proc, Stack};

fn configured(env: EnvMap) -> EnvMap {
    env.with_other_features_configured()
        .with("SMTP_URL", "smtp://127.0.0.1:9")
        .with("MIGRATE_ON_START", "true")
}

/// Every migration is recorded once, and no advisory lock is left on the database.
async fn assert_migrated_and_unlocked(pool: &PgPool) {
    let applied: Vec<String> =
        sqlx::query_scalar("SELECT version FROM seaql_migrations ORDER BY version")
            .fetch_all(pool)
            .await
            .expect("seaql_migrations");
    let expected: Vec<String> = migration::Migrator::migrations()
        .iter()
        .map(|m| m.name().to_string())
        .collect();
    assert_eq!(applied, expected, "every migration applied, once");
    let held: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .fetch_one(pool)
    .await
    .expect("pg_locks");
    assert_eq!(held, 0, "the migration lock is released");
}

#[tokio::test(flavor = "multi_thread")]
async fn three_apis_started_together_on_an_empty_database_all_come_up() {
    let stack = Stack::new().await;
    let env = configured(stack.env());
    // Proc::api panics with the api's stderr if it exits before listening.
    let (a, b, c) = tokio::join!(stack.api(&env), stack.api(&env), stack.api(&env));
    for api in [&a, &b, &c] {
        let h = get(&api.url("/api/health")).await;
        assert_eq!(h.status, 200, "{}\nstderr:\n{}", h.text, api.stderr());
        assert_eq!(h.json["database"]["ok"], true, "{}", h.text);
    }
    assert_migrated_and_unlocked(&stack.db.pool().await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_migration_up_commands_all_succeed() {
    let stack = Stack::new().await;
    let env = EnvMap::default().with("DATABASE_URL", &stack.db.url);
    let mut runs: Vec<Proc> = (0..3)
        .map(|_| Proc::spawn("migration", &["up"], &env, stack.dir.path()))
        .collect();
    for p in &mut runs {
        let status = p
            .wait_exit(std::time::Duration::from_secs(60))
            .await
            .unwrap_or_else(|| panic!("{} up did not finish in 60 s", bin("migration").display()));
        // Let the reader threads drain the pipes.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert!(
            status.success(),
            "migration up failed ({status}); stdout:\n{}\nstderr:\n{}",
            p.stdout(),
            p.stderr()
        );
    }
    assert_migrated_and_unlocked(&stack.db.pool().await).await;
}
