//! Everything a handler needs, built once at start.

use std::{future::Future, net::IpAddr, sync::Arc};

use entity::{base::plans::Catalogue, Feature, Features, Settings};
use poem::{web::RemoteAddr, Request};
use sea_orm::DatabaseConnection;
use worker::Queues;

use crate::{
    problem::{ApiError, RateInfo},
    rate_limit::{Limit, RateLimiter},
};

/// Shared application state: one reference-counted [`Shared`], which it
/// dereferences to. Every request carries a clone in its extensions (for
/// `Data<&AppState>`), so a clone must cost one count, not a copy of every
/// client, pool handle and map below.
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    /// The state of a server built from `shared`.
    pub fn new(shared: Shared) -> Self {
        AppState(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.0
    }
}

/// What [`AppState`] holds.
pub struct Shared {
    /// Validated settings.
    pub settings: Arc<Settings>,
    /// Readiness of every feature, computed once from the settings.
    pub features: Arc<Features>,
    /// The plan catalogue.
    pub plans: Arc<Catalogue>,
    /// Database pool.
    pub db: DatabaseConnection,
    /// Job producer.
    pub queues: Queues,
    /// Rate limiter.
    pub limiter: RateLimiter,
    /// Session token verifier (HS256 secret and JWKS cache).
    pub sessions: crate::identity::session::SessionVerifier,
    /// The object store (avatars).
    pub storage: worker::storage::Storage,
    /// Health probe results shared by concurrent health requests.
    pub probes: Arc<crate::probes::ProbeCache>,
    /// HTTP client of the payment providers (checkout), bounded by
    /// `PROVIDER_CONNECT_TIMEOUT_MS` / `PROVIDER_TIMEOUT_MS`.
    pub providers: worker::providers::Providers,
    /// The AI providers' HTTP clients.
    pub ai: worker::ai::AiClients,
    /// The built-in identity provider; `None` unless `AUTH_PROVIDER=builtin`
    /// (the default without an external platform) and auth is on.
    pub idp: Option<Arc<crate::identity::Idp>>,
    /// The OAuth sign-in providers (GitHub, Google), bounded by `OAUTH_TIMEOUT_MS`.
    pub oauth: worker::oauth::OAuthClients,
    /// Accounts and plans in force, kept while PostgreSQL reports them
    /// unchanged ([`crate::identity::account_cache`]).
    pub accounts: Arc<crate::identity::account_cache::AccountCache>,
}

impl AppState {
    /// Bounds one database or queue call made while answering a request by
    /// `DEPENDENCY_TIMEOUT_MS`: the call's own result, or 503
    /// `database_unavailable` when it did not finish in time (the future is
    /// dropped, which cancels the call). Every route wraps each such call:
    /// `state.bounded(entity::x::do_it(&state.db, …)).await?`.
    pub async fn bounded<F: Future>(&self, call: F) -> Result<F::Output, ApiError> {
        tokio::time::timeout(self.settings.dependency_timeout, call)
            .await
            .map_err(|_| {
                tracing::error!("a database call exceeded DEPENDENCY_TIMEOUT_MS");
                ApiError::Unavailable {
                    code: "database_unavailable",
                    detail: "the database did not answer in time; try again shortly".into(),
                }
            })
    }

    /// [`AppState::bounded`] for a plain database call: a timeout or an
    /// unreachable database is 503 `database_unavailable`, any other
    /// database error 500 (`what` goes to the log).
    pub async fn bounded_db<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, sea_orm::DbErr>>,
    ) -> Result<T, ApiError> {
        self.bounded(call)
            .await?
            .map_err(|e| crate::routes::db_error(what, e))
    }

    /// 503 unless `feature` is toggled on and configured.
    pub fn require(&self, feature: Feature) -> Result<(), ApiError> {
        let st = self.features.get(feature);
        if st.ready() {
            return Ok(());
        }
        Err(ApiError::Unavailable {
            code: if st.disabled_by_flag {
                "feature_disabled"
            } else {
                "not_configured"
            },
            detail: format!("{} is unavailable: {}", feature.key(), st.message),
        })
    }

    /// Counts this request against the public per-IP limit `name`
    /// (`RATE_LIMIT_PUBLIC_PER_HOUR` per hour); 429 when over. The shared
    /// store is given until `deadline`.
    pub async fn limit_public(
        &self,
        name: &'static str,
        ip: &str,
        deadline: std::time::Instant,
    ) -> Result<RateInfo, ApiError> {
        let limit = Limit {
            name,
            max: self.settings.rate_limit_public_per_hour,
            window: std::time::Duration::from_secs(3600),
        };
        let decision = self.limiter.check(limit, ip, deadline).await;
        if decision.allowed {
            Ok(decision.info)
        } else {
            Err(ApiError::RateLimited(decision.info))
        }
    }

    /// Counts this request against the per-user limit `name`: `max` requests
    /// per `window` for the subject `user_id` (a logged-in route's limit, e.g.
    /// checkout's 5 per 15 minutes); 429 when over. The shared store is given
    /// until `deadline`.
    pub async fn limit_user(
        &self,
        name: &'static str,
        user_id: uuid::Uuid,
        max: u32,
        window: std::time::Duration,
        deadline: std::time::Instant,
    ) -> Result<RateInfo, ApiError> {
        let limit = Limit { name, max, window };
        let decision = self
            .limiter
            .check(limit, &user_id.to_string(), deadline)
            .await;
        if decision.allowed {
            Ok(decision.info)
        } else {
            Err(ApiError::RateLimited(decision.info))
        }
    }

    /// 503 unless server-side writes are armed (`BACKEND_SERVICE_ROLE_KEY`).
    pub fn require_server_writes(&self) -> Result<(), ApiError> {
        if self.features.backend_service_role {
            Ok(())
        } else {
            Err(ApiError::Unavailable {
                code: "not_configured",
                detail: "server-side writes are not configured: set BACKEND_SERVICE_ROLE_KEY"
                    .into(),
            })
        }
    }

    /// The key that signs and checks avatar upload tokens
    /// (`BACKEND_SERVICE_ROLE_KEY`); 503 `not_configured` without it.
    pub fn upload_signing_key(&self) -> Result<&str, ApiError> {
        self.require_server_writes()?;
        self.settings
            .backend_service_role_key
            .as_deref()
            .ok_or_else(|| ApiError::internal("server-side writes ready without a key"))
    }

    /// The client's rate-limit subject: its IP as [`client_ip`] finds it,
    /// IPv4-mapped IPv6 as IPv4, and IPv6 as its /64 network
    /// (`2001:db8:1:2::/64`: one subscriber's block).
    pub fn client_ip(&self, req: &Request) -> String {
        let peer = match req.remote_addr() {
            RemoteAddr(poem::Addr::SocketAddr(a)) => Some(a.ip()),
            _ => None,
        };
        let forwarded = req
            .headers()
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect::<Vec<_>>()
            .join(",");
        match client_ip(peer, &forwarded, self.settings.trust_proxy_hops) {
            Some(ip) => bucket(ip),
            None => req.remote_addr().to_string(),
        }
    }
}

/// The client IP behind `hops` trusted proxies: each proxy appends the
/// address it received the request from to `X-Forwarded-For`, so the client
/// is the `hops`-th address from the right (whatever a client writes itself
/// stays to the left). With `hops` = 0, fewer entries than `hops`, or an
/// entry there that is not an IP, the socket `peer`.
pub fn client_ip(peer: Option<IpAddr>, forwarded_for: &str, hops: usize) -> Option<IpAddr> {
    if hops > 0 {
        let entries: Vec<&str> = forwarded_for
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .collect();
        if let Some(ip) = entries
            .len()
            .checked_sub(hops)
            .and_then(|i| entries[i].parse::<IpAddr>().ok())
        {
            return Some(ip);
        }
    }
    peer
}

/// The rate-limit bucket of `ip`: IPv4 (also IPv4-mapped IPv6) as itself,
/// IPv6 as its /64 network.
pub fn bucket(ip: IpAddr) -> String {
    match worker::server::client_network(ip) {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(net) => format!("{net}/64"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn client_ip_counts_hops_from_the_right() {
        let peer = Some(ip("10.0.0.9"));
        let xff = "6.6.6.6, 1.2.3.4, 10.0.0.2";
        assert_eq!(client_ip(peer, xff, 0), peer);
        assert_eq!(client_ip(peer, xff, 1), Some(ip("10.0.0.2")));
        assert_eq!(client_ip(peer, xff, 2), Some(ip("1.2.3.4")));
        assert_eq!(client_ip(peer, xff, 3), Some(ip("6.6.6.6")));
        // Fewer entries than hops, or junk at that place: the socket peer.
        assert_eq!(client_ip(peer, xff, 4), peer);
        assert_eq!(client_ip(peer, "", 1), peer);
        assert_eq!(client_ip(peer, "1.2.3.4, nonsense", 1), peer);
    }

    #[test]
    fn buckets_ipv6_by_64_and_unmaps_ipv4() {
        assert_eq!(bucket(ip("2001:db8:1:2:aaaa::1")), "2001:db8:1:2::/64");
        assert_eq!(
            bucket(ip("2001:db8:1:2:aaaa::1")),
            bucket(ip("2001:db8:1:2:bbbb::7"))
        );
        assert_ne!(bucket(ip("2001:db8:1:2::1")), bucket(ip("2001:db8:1:3::1")));
        assert_eq!(bucket(ip("::ffff:1.2.3.4")), "1.2.3.4");
        assert_eq!(bucket(ip("1.2.3.4")), "1.2.3.4");
    }
}
