//! `GET /api/health`: feature readiness plus real probes of the database and the queue.

use entity::Feature;
use poem::web::Data;
use poem_openapi::{payload::Json, ApiResponse, Object, OpenApi};

use crate::routes::ApiTags;
use crate::{
    probes::{Probe, QueueProbe},
    state::AppState,
};

/// Readiness of one feature.
#[derive(Debug, Clone, Object)]
pub struct FeatureHealth {
    /// Toggle on and every required setting present.
    pub enabled: bool,
    /// Switched off on purpose by its `NEXT_PUBLIC_ENABLE_*` toggle.
    pub disabled_by_flag: bool,
    /// Environment variables the feature needs and lacks.
    pub missing_env: Vec<String>,
    /// One sentence for humans.
    pub message: String,
}

/// Every feature, keyed as the interface names them.
#[derive(Debug, Clone, Object)]
pub struct FeatureMap {
    /// Sessions and avatar upload.
    pub auth: FeatureHealth,
    /// `POST /api/waitlist`.
    pub waitlist: FeatureHealth,
    /// `POST /api/contact`.
    pub contact: FeatureHealth,
    /// Subscription management.
    pub billing: FeatureHealth,
    /// Checkout and provider webhooks.
    pub payments: FeatureHealth,
    /// Role changes.
    pub admin: FeatureHealth,
    /// AI chat and generation.
    pub ai: FeatureHealth,
}

/// Configuration presence checks.
#[derive(Debug, Clone, Object)]
pub struct Checks {
    /// `NEXT_PUBLIC_BACKEND_URL` and `NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY` set.
    pub backend_public: bool,
    /// `BACKEND_SERVICE_ROLE_KEY` set.
    pub backend_service_role: bool,
    /// An email transport (HTTP email API or SMTP) configured.
    pub email_provider: bool,
}

/// The health report.
#[derive(Debug, Clone, Object)]
pub struct Health {
    /// `ok` when every enabled feature is ready and the database and queue answer, else `degraded`.
    pub status: String,
    /// When the report was made (RFC 3339, UTC).
    pub timestamp: String,
    /// The configured payment provider: `provider_a` or `provider_b`.
    pub payment_provider: String,
    /// Who issues sessions (`AUTH_PROVIDER`): `builtin` (this API's `/auth/v1`) or `external`.
    pub auth_provider: String,
    /// Configuration presence checks.
    pub checks: Checks,
    /// The transport contact mail goes through.
    pub email_transport: EmailTransportName,
    /// Where the server-side secret (`BACKEND_SERVICE_ROLE_KEY`) came from:
    /// `env` (set), `generated` (embedded default: generated once into
    /// `$DATA_DIR/service_role_key`) or `none` (unset; production must set it).
    pub backend_service_role_source: String,
    /// Database probe (`SELECT 1`).
    pub database: Probe,
    /// Queue probe (`PING` / `SELECT 1`).
    pub queue: QueueProbe,
    /// The renewal loop (renewal offers, reminders, grace and lapse):
    /// `running`, or `paused` while payments are switched off or not ready
    /// (no renewal could be paid: nothing is offered, told past due or
    /// lapsed after its grace meanwhile, only a cancelling subscription
    /// lapses at its end; a running grace is extended by the pause).
    pub renewals: String,
    /// Readiness per feature.
    pub features: FeatureMap,
}

/// Which transport delivers mail: `api` (HTTP email API), `smtp`, `outbox`
/// (embedded default with nothing configured: one `.eml` file per message in
/// `$DATA_DIR/outbox`) or `none` (production without a transport).
#[derive(Debug, Clone, Copy, poem_openapi::Enum)]
#[oai(rename_all = "lowercase")]
pub enum EmailTransportName {
    /// HTTP email API.
    Api,
    /// SMTP.
    Smtp,
    /// Outbox directory.
    Outbox,
    /// No transport.
    None,
}

/// Health answers.
#[derive(Debug, ApiResponse)]
pub enum HealthResponse {
    /// Healthy: every enabled feature ready, database and queue answering.
    #[oai(status = 200)]
    Ok(Json<Health>),
    /// Degraded: an enabled feature lacks configuration, or the database or queue failed its probe.
    #[oai(status = 503)]
    Degraded(Json<Health>),
}

/// Health.
pub struct HealthApi;

#[OpenApi(prefix_path = "/api")]
impl HealthApi {
    /// Report readiness
    ///
    /// Probes the database and the queue for real (bounded by
    /// `DEPENDENCY_TIMEOUT_MS`; concurrent requests share one probe, and a
    /// probe result serves for at most 250 ms) and reports each feature's toggle and missing
    /// configuration. 200 when healthy, 503 otherwise; the body is the same shape.
    #[oai(
        path = "/health",
        method = "get",
        operation_id = "getHealth",
        tag = "ApiTags::Public"
    )]
    async fn health(&self, state: Data<&AppState>) -> HealthResponse {
        let report = health_inner(&state).await;
        if report.status == "ok" {
            HealthResponse::Ok(Json(report))
        } else {
            HealthResponse::Degraded(Json(report))
        }
    }
}

async fn health_inner(state: &AppState) -> Health {
    let (database, queue) = state
        .probes
        .probe(&state.db, &state.queues, state.settings.dependency_timeout)
        .await;
    let f = &state.features;
    let fh = |feature: Feature| {
        let s = f.get(feature);
        FeatureHealth {
            enabled: s.enabled,
            disabled_by_flag: s.disabled_by_flag,
            missing_env: s.missing_env.iter().map(|v| v.to_string()).collect(),
            message: s.message.clone(),
        }
    };
    let healthy = database.ok && queue.ok && f.all_enabled_ready();
    Health {
        status: if healthy { "ok" } else { "degraded" }.into(),
        timestamp: chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        payment_provider: state.settings.payment_provider.as_str().into(),
        auth_provider: state.settings.auth_provider.as_str().into(),
        checks: Checks {
            backend_public: f.backend_public,
            backend_service_role: f.backend_service_role,
            email_provider: f.email_provider,
        },
        backend_service_role_source: state
            .settings
            .backend_service_role_key_source
            .as_str()
            .into(),
        email_transport: match state.settings.email_transport() {
            entity::base::settings::EmailTransport::Api => EmailTransportName::Api,
            entity::base::settings::EmailTransport::Smtp => EmailTransportName::Smtp,
            entity::base::settings::EmailTransport::Outbox => EmailTransportName::Outbox,
            entity::base::settings::EmailTransport::None => EmailTransportName::None,
        },
        database: database.into(),
        queue: QueueProbe::of(queue, state.queues.kind()),
        renewals: if entity::billing::renewal::paused(f) {
            "paused"
        } else {
            "running"
        }
        .into(),
        features: FeatureMap {
            auth: fh(Feature::Auth),
            waitlist: fh(Feature::Waitlist),
            contact: fh(Feature::Contact),
            billing: fh(Feature::Billing),
            payments: fh(Feature::Payments),
            admin: fh(Feature::Admin),
            ai: fh(Feature::Ai),
        },
    }
}
