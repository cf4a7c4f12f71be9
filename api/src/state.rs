//! Everything a handler needs, built once at start.

use std::{net::IpAddr, sync::Arc};

use entity::{plans::Catalogue, Feature, Features, Settings};
use poem::{web::RemoteAddr, Request};
use sea_orm::DatabaseConnection;
use worker::Queues;

use crate::{
    problem::{ApiError, RateInfo},
    rate_limit::{Limit, RateLimiter},
};

/// Shared application state (cheap to clone).
#[derive(Clone)]
pub struct AppState {
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
    pub sessions: crate::session::SessionVerifier,
    /// The object store (avatars).
    pub storage: worker::storage::Storage,
    /// Health probe results shared by concurrent health requests.
    pub probes: Arc<crate::routes::health::ProbeCache>,
}

impl AppState {
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

    /// The client's IP: the socket peer, or the first `X-Forwarded-For` hop
    /// when `TRUST_PROXY=true` and the header holds a valid IP.
    pub fn client_ip(&self, req: &Request) -> String {
        if self.settings.trust_proxy {
            if let Some(ip) = req
                .headers()
                .get("x-forwarded-for")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.split(',').next())
                .and_then(|v| v.trim().parse::<IpAddr>().ok())
            {
                return ip.to_string();
            }
        }
        match req.remote_addr() {
            RemoteAddr(poem::Addr::SocketAddr(a)) => a.ip().to_string(),
            other => other.to_string(),
        }
    }
}
