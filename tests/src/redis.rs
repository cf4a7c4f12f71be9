//! Redis: a key prefix per test ([`RedisNs`]).

use super::*;

/// The Redis URL of the tests (`TEST_REDIS_URL`).
pub fn redis_url() -> String {
    std::env::var("TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".to_string())
}

/// A unique queue prefix `t<random>` on the test Redis; every `<prefix>:*`
/// key is deleted on drop.
pub struct RedisNs {
    /// Redis URL.
    pub url: String,
    /// The `QUEUE_PREFIX`.
    pub prefix: String,
    client: ::redis::Client,
}

impl RedisNs {
    /// A fresh namespace.
    pub fn new() -> Self {
        let url = redis_url();
        let client = ::redis::Client::open(url.as_str()).expect("TEST_REDIS_URL");
        RedisNs {
            url,
            prefix: format!("t{}", rand_hex(12)),
            client,
        }
    }

    /// `<prefix>:<suffix>`.
    pub fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.prefix)
    }

    /// The Redis URL with host and port replaced by `addr` (a [`TcpProxy`]).
    pub fn url_via(&self, addr: SocketAddr) -> String {
        let mut url = reqwest::Url::parse(&self.url).expect("url");
        url.set_host(Some(&addr.ip().to_string())).expect("host");
        url.set_port(Some(addr.port())).expect("port");
        url.to_string()
    }

    /// An async connection.
    pub async fn conn(&self) -> ::redis::aio::MultiplexedConnection {
        self.client
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot reach Redis at {}: {e}", self.url))
    }

    /// Every key matching `<prefix>:<pattern>` (SCAN).
    pub async fn keys(&self, pattern: &str) -> Vec<String> {
        let mut c = self.conn().await;
        let mut cursor: u64 = 0;
        let mut out = Vec::new();
        loop {
            let (next, keys): (u64, Vec<String>) = ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(self.key(pattern))
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut c)
                .await
                .expect("SCAN");
            out.extend(keys);
            cursor = next;
            if cursor == 0 {
                return out;
            }
        }
    }

    /// Sum of `MEMORY USAGE` over every `<prefix>:*` key, and the key count.
    pub async fn memory(&self) -> (u64, usize) {
        let keys = self.keys("*").await;
        let mut c = self.conn().await;
        let mut total = 0u64;
        for chunk in keys.chunks(1000) {
            let mut pipe = ::redis::pipe();
            for k in chunk {
                pipe.cmd("MEMORY").arg("USAGE").arg(k).arg("SAMPLES").arg(0);
            }
            let sizes: Vec<Option<u64>> = pipe.query_async(&mut c).await.expect("MEMORY USAGE");
            total += sizes.into_iter().flatten().sum::<u64>();
        }
        (total, keys.len())
    }

    /// A Redis command's integer result on a key of the namespace, e.g.
    /// `count("LLEN", "email:active")`.
    pub async fn count(&self, cmd: &str, suffix: &str) -> u64 {
        let mut c = self.conn().await;
        ::redis::cmd(cmd)
            .arg(self.key(suffix))
            .query_async(&mut c)
            .await
            .unwrap_or_else(|e| panic!("{cmd} {}: {e}", self.key(suffix)))
    }
}

impl Default for RedisNs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for RedisNs {
    fn drop(&mut self) {
        let Ok(mut c) = self.client.get_connection() else {
            return;
        };
        let pattern = format!("{}:*", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let Ok((next, keys)) = ::redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query::<(u64, Vec<String>)>(&mut c)
            else {
                return;
            };
            if !keys.is_empty() {
                let _ = ::redis::cmd("UNLINK").arg(&keys).query::<u64>(&mut c);
            }
            cursor = next;
            if cursor == 0 {
                return;
            }
        }
    }
}
