//! PostgreSQL: a fresh database per test ([`TestDb`]).

use super::*;

/// The administrative PostgreSQL URL (`TEST_DATABASE_ADMIN_URL`).
pub fn admin_database_url() -> String {
    std::env::var("TEST_DATABASE_ADMIN_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_string())
}

/// A fresh PostgreSQL database `t_<random>`, dropped (`WITH (FORCE)`) on drop.
pub struct TestDb {
    /// Database name.
    pub name: String,
    /// URL of the database.
    pub url: String,
    admin_url: String,
}

impl TestDb {
    /// Creates the database.
    pub async fn create() -> Self {
        let admin_url = admin_database_url();
        let name = format!("t_{}", rand_hex(20));
        let admin = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&admin_url)
            .await
            .unwrap_or_else(|e| panic!("cannot reach PostgreSQL at {admin_url}: {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
            .execute(&admin)
            .await
            .unwrap_or_else(|e| panic!("CREATE DATABASE {name}: {e}"));
        admin.close().await;
        let mut url = reqwest::Url::parse(&admin_url).expect("TEST_DATABASE_ADMIN_URL is a URL");
        url.set_path(&format!("/{name}"));
        TestDb {
            name,
            url: url.to_string(),
            admin_url,
        }
    }

    /// The database URL with host and port replaced by `addr` (a [`TcpProxy`]).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = reqwest::Url::parse(&self.url).expect("url");
        url.set_host(Some(&addr.ip().to_string())).expect("host");
        url.set_port(Some(addr.port())).expect("port");
        url.to_string()
    }

    /// A small pool on the database, for assertions.
    pub async fn pool(&self) -> PgPool {
        PgPoolOptions::new()
            .max_connections(2)
            .acquire_timeout(Duration::from_secs(10))
            .connect(&self.url)
            .await
            .unwrap_or_else(|e| panic!("connect {}: {e}", self.name))
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let admin_url = self.admin_url.clone();
        let name = self.name.clone();
        block_on_thread(async move {
            if let Ok(admin) = PgPoolOptions::new()
                .max_connections(1)
                .connect(&admin_url)
                .await
            {
                let _ = sqlx::query(sqlx::AssertSqlSafe(format!(
                    "DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"
                )))
                .execute(&admin)
                .await;
                admin.close().await;
            }
        });
    }
}

/// The database's time (`clock_timestamp()`): what the product decides by.
pub async fn db_now(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .expect("the database's time")
}
