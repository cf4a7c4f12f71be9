//! Environment → typed, validated settings.
//!
//! Every variable the service reads is listed here (and in docs/configuration.md). A value
//! that is present but malformed is an error naming the variable, so the process
//! stops at start instead of misbehaving later. A *missing* optional credential is
//! not an error: it makes a feature "not ready" (see [`crate::base::features`]).
//!
//! Why this file is long: [`Settings`] is one flat struct read in one pass
//! ([`Settings::from_source`]), so that every variable is read once and the
//! rules that tie variables together (a credential and its URL, TLS and its
//! CA, a default taken from another variable) stand side by side. Reading
//! ([`source`]), the checks of single values ([`checks`]), OAuth ([`oauth`])
//! and the mail transport ([`mail`]) are files of their own.

use std::{fmt, path::PathBuf, time::Duration};
mod checks;
mod mail;
mod oauth;
mod source;
#[cfg(test)]
mod tests;

pub use checks::is_mailbox_spec;
use checks::{
    absolute, check_redis_tls, check_smtp_credentials, is_https_or_loopback, read_app_name,
    read_time_zone,
};
pub use mail::{EmailTransport, OUTBOX_DEFAULT_FROM};
pub use oauth::{OAuthClientSettings, OAuthSettings};
use source::{err, Reader};
pub use source::{parse_bool, parse_origins, parse_reminder_days, Env, Source};

/// A setting that is present but cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid value for {var}: {message}")]
pub struct SettingsError {
    /// The environment variable at fault, e.g. `PORT`.
    pub var: &'static str,
    /// What is wrong with its value.
    pub message: String,
}
/// Output format of the structured logs (`LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// One JSON object per line (the default; what log shippers read).
    Json,
    /// Human-readable, coloured lines for a terminal.
    Pretty,
}
/// The payment provider selected by `PAYMENT_PROVIDER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PaymentProvider {
    /// Client-token checkout (`provider_a`).
    ProviderA,
    /// Redirect checkout (`provider_b`, the default).
    ProviderB,
}
impl PaymentProvider {
    /// The wire name: `provider_a` or `provider_b`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ProviderA => "provider_a",
            Self::ProviderB => "provider_b",
        }
    }
}
/// The six feature toggles (`NEXT_PUBLIC_ENABLE_*`). `true` means enabled.
///
/// Unset, `true`, `1`, `yes`, `on` (any case) enable; `false`, `0`, `no`, `off`
/// disable; anything else is a [`SettingsError`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Toggles {
    /// `NEXT_PUBLIC_ENABLE_AUTH`
    pub auth: bool,
    /// `NEXT_PUBLIC_ENABLE_WAITLIST`
    pub waitlist: bool,
    /// `NEXT_PUBLIC_ENABLE_CONTACT`
    pub contact: bool,
    /// `NEXT_PUBLIC_ENABLE_PAYMENTS`
    pub payments: bool,
    /// `NEXT_PUBLIC_ENABLE_ADMIN`
    pub admin: bool,
    /// `NEXT_PUBLIC_ENABLE_AI`
    pub ai: bool,
}
/// Default of `HTTP_MAX_IN_FLIGHT`, sized from the waitlist figures of
/// BENCHMARKS.md by Little's law (metrics and load shedding): enough requests
/// in flight to keep both cores of the reference host busy, few enough that
/// an admitted request does not wait behind hundreds of others.
pub const HTTP_MAX_IN_FLIGHT_DEFAULT: usize = 64;
/// Everything the api and worker processes are configured with.
#[derive(Clone)]
pub struct Settings {
    /// `HOST`: interface to bind (default `127.0.0.1`).
    pub host: String,
    /// `PORT`: TCP port (default `8080`; `0` picks a free one and logs it).
    pub port: u16,
    /// `DATABASE_URL`: `postgres://…` or `sqlite:…`; unset = SQLite file `<DATA_DIR>/app.db`.
    pub database_url: String,
    /// True when `DATABASE_URL` was unset and the embedded SQLite file is used.
    pub database_embedded: bool,
    /// `REDIS_URL`: job queue and rate-limit counters; unset = queue in SQLite, limits in process.
    pub redis_url: Option<String>,
    /// `REDIS_CA_FILE`: PEM file of the certificate authority (one or more
    /// certificates) that signed a `rediss://` server's certificate, for a
    /// managed Redis with a private CA; it replaces the public web roots.
    /// Unset: `rediss://` servers are checked against the public web roots.
    pub redis_ca_file: Option<PathBuf>,
    /// `DATA_DIR`: where the embedded SQLite files live (default `data`).
    pub data_dir: PathBuf,
    /// `MIGRATE_ON_START`: apply pending migrations when the api starts (default `true`).
    pub migrate_on_start: bool,
    /// `APP_URL` (or `NEXT_PUBLIC_APP_URL`): the page's origin, no trailing slash:
    /// redirects after sign-in and confirmation, the billing return page, the
    /// default `redirect_to` of mail links. The API's own public base is
    /// `API_EXTERNAL_URL` (default this).
    pub app_url: String,
    /// `TRUST_PROXY`: `true` is `TRUST_PROXY_HOPS=1` (default `false`).
    pub trust_proxy: bool,
    /// `TRUST_PROXY_HOPS`: how many proxies in front of the api append to
    /// `X-Forwarded-For`; the client IP is the Nth address from the right
    /// (default 0: the socket peer; `TRUST_PROXY=true` means 1).
    pub trust_proxy_hops: usize,
    /// `HTTP_HEADER_TIMEOUT_MS`: a connection must deliver a request's
    /// headers within this time (default 10000).
    pub http_header_timeout: Duration,
    /// `HTTP_IDLE_TIMEOUT_SECS`: a connection with no request open (an
    /// HTTP/2 one however many control frames it sends), or moving no byte,
    /// for this long is closed (default 60).
    pub http_idle_timeout: Duration,
    /// `HTTP_BODY_TIMEOUT_SECS`: a request body must arrive in full within
    /// this time (default 30).
    pub http_body_timeout: Duration,
    /// `HTTP_BODY_MIN_RATE`: bytes per second a request body must average,
    /// counted from its headers, once [`Settings::http_body_rate_grace`] has
    /// passed; slower is answered 408 `body_timeout` and the connection
    /// closed (default 1024; `0`: no minimum).
    pub http_body_min_rate: u64,
    /// `HTTP_BODY_RATE_GRACE_SECS`: how long a request body may arrive
    /// slower than `HTTP_BODY_MIN_RATE` (default 2).
    pub http_body_rate_grace: Duration,
    /// `HTTP_BODY_BUDGET_BYTES`: bytes of request bodies one api process
    /// holds while it waits for the rest of them, all requests together (a
    /// body counts the bytes received so far, not its declared length; one
    /// that arrives whole without a wait counts nothing); a body whose bytes
    /// would exceed it is answered 503 `overloaded` (default 33554432, 32 MiB).
    pub http_body_budget: usize,
    /// `HTTP_MAX_CONNECTIONS`: open client connections per process; further
    /// connections wait in the listen backlog (default 10000).
    pub http_max_connections: usize,
    /// `HTTP_MAX_IN_FLIGHT`: requests one api process handles at once; past
    /// it a request is answered 503 `overloaded` with `Retry-After` at once
    /// (health, metrics and the AI routes excepted; `0`: no limit; default
    /// [`HTTP_MAX_IN_FLIGHT_DEFAULT`]).
    pub http_max_in_flight: usize,
    /// `AI_MAX_OPEN_STREAMS`: AI requests (chat streams, generations) one
    /// api process keeps open at once; past it a new one is answered 503
    /// `overloaded` (default 1000).
    pub ai_max_open_streams: usize,
    /// `AI_STREAM_STALL_SECS`: an AI answer (chat stream, generation) whose
    /// reader asks for nothing for this long (a shut HTTP/2 window, a full
    /// socket) is cancelled, charged as an abort, and its
    /// `AI_MAX_OPEN_STREAMS` slot given back (default 30, 1–3600).
    pub ai_stream_stall: Duration,
    /// `HTTP_MAX_UPLOADS`: avatar uploads one api process receives at once,
    /// a pool of their own (they hold no `HTTP_MAX_IN_FLIGHT` slot while
    /// their bytes arrive); past it an upload is answered 503 `overloaded`
    /// (default 256).
    pub http_max_uploads: usize,
    /// `HTTP_MAX_UPLOADS_PER_USER`: uploads one user (the grant's subject)
    /// may have arriving at once on one api process; past it 429
    /// `too_many_uploads` (default 2).
    pub http_max_uploads_per_user: usize,
    /// `UPLOAD_MIN_RATE`: bytes per second an upload must average once
    /// `HTTP_BODY_RATE_GRACE_SECS` has passed; its deadline is the grace plus
    /// its size over this rate, replacing `HTTP_BODY_TIMEOUT_SECS` (default
    /// 8192; above 1024).
    pub upload_min_rate: u64,
    /// `HTTP_MAX_CONNECTIONS_PER_CLIENT`: open connections one client (an
    /// IPv4 address, an IPv6 /64) may hold on the api when no proxy is
    /// trusted (`TRUST_PROXY_HOPS=0`); further ones are closed at once.
    /// Sized for carrier-grade NAT (default 512; `0`: no bound).
    pub http_max_connections_per_client: usize,
    /// `METRICS_TOKEN`: bearer token of `GET /metrics` (api and worker);
    /// unset: no `/metrics` (404) and nothing recorded.
    pub metrics_token: Option<String>,
    /// `WORKER_HTTP_PORT`: the worker's own HTTP port (`/metrics`, `/healthz`,
    /// `/readyz`) on `HOST`; unset: no server.
    pub worker_http_port: Option<u16>,
    /// `STORAGE_URL`: object store for avatars (default `file://<DATA_DIR>/storage`).
    pub storage_url: String,
    /// `WORKER_CONCURRENCY`: jobs processed at once per queue (default 16, 1–1024).
    pub worker_concurrency: usize,
    /// `WORKER_QUEUES`: comma list of queues this worker serves (default: all).
    pub worker_queues: Option<Vec<String>>,
    /// `QUEUE_PREFIX`: namespace prepended to every queue name and rate-limit key (default empty).
    pub queue_prefix: String,
    /// `JOB_RETENTION_SECS`: how long finished jobs are kept before the vacuum removes them (default 3600).
    pub job_retention: Duration,
    /// `VACUUM_INTERVAL_SECS`: how often the worker vacuums finished jobs (default 60).
    pub vacuum_interval: Duration,
    /// `JOB_RETRY_BASE_SECS`: delay before the first retry of a job that failed transiently;
    /// doubles per attempt (default 10, 1–3600).
    pub job_retry_base: Duration,
    /// `JOB_RETRY_MAX_DELAY_SECS`: cap on one retry delay (default 3600, 1–86400).
    pub job_retry_max_delay: Duration,
    /// `JOB_RETRY_HORIZON_SECS`: once the retry delays of a job add up to this, its next
    /// transient failure dead-letters it (default 86400 = 1 day, 0–2592000; 0 = never retry).
    pub job_retry_horizon: Duration,
    /// `DEAD_LETTER_RETENTION_SECS`: dead letters older than this are purged by the
    /// maintenance loop (default 1209600 = 14 days, 1–31536000).
    pub dead_letter_retention: Duration,
    /// `WORKER_HEARTBEAT_MS`: worker heartbeat (Redis and SQLite queues); a worker silent for 4 beats is presumed
    /// dead and its jobs in flight go back to the queue (default 5000, 100–60000).
    pub worker_heartbeat: Duration,
    /// `JOB_TIMEOUT_SECS`: bound on one job attempt; an attempt still running
    /// after it is abandoned and counts as a transient failure, retried by the
    /// retry schedule (default 300, 1–86400).
    pub job_timeout: Duration,
    /// `WORKER_SHUTDOWN_TIMEOUT_SECS`: after SIGTERM/SIGINT, how long a worker
    /// lets its jobs in flight finish before it abandons them, returns them to
    /// the queue and exits (default 25, 0–3600).
    pub worker_shutdown_timeout: Duration,
    /// `WORKER_TEST_PANIC_MARKER` (tests only, never set in production): a
    /// `send_email` job whose subject contains this text panics in the worker,
    /// so tests can show that a panicking handler is dead-lettered.
    pub worker_test_panic_marker: Option<String>,
    /// `SCHEDULER_TICK_SECS`: how often the scheduled jobs run (sweep, expiries); one
    /// worker per tick (default 60, 1–86400).
    pub scheduler_tick: Duration,
    /// `SETTLEMENT_SWEEP_AFTER_SECS`: a recorded webhook event still unsettled this long
    /// after it arrived is queued for settlement again (default 120, 1–86400).
    pub settlement_sweep_after: Duration,
    /// `PAYMENT_EXPIRE_AFTER_SECS`: a payment still `PENDING` this long after it was
    /// created becomes `EXPIRED` (default 86400, 60–2592000).
    pub payment_expire_after: Duration,
    /// `PAYMENT_RECONCILE_AFTER_SECS`: a payment still `PENDING` this long after it was
    /// created (or after the last status check) is checked with the provider's status
    /// API (default 900, 1–2592000).
    pub payment_reconcile_after: Duration,
    /// `RENEWAL_GRACE_SECS`: how long a paid subscription whose period ended
    /// unpaid stays `past_due` on its plan before it returns to FREE
    /// (default 259200 = 3 days, 0–2592000; `0` lapses at the period end).
    pub renewal_grace: Duration,
    /// `RENEWAL_CLAIM_SECS`: how long a row queued for a pass of the renewal
    /// loop is not queued again while its batch job waits (default 900,
    /// 1–86400): longer than the queue's backlog may last, short enough
    /// that a lost job's rows come back soon.
    pub renewal_claim: Duration,
    /// `RENEWAL_REMINDER_DAYS`: days before the period end a renewal reminder
    /// goes out, largest first (default `7,3,1`; each 1–365; empty: none).
    pub renewal_reminder_days: Vec<u32>,
    /// `PRICE_CHANGE_NOTICE_DAYS`: a catalogue price rise reaches a
    /// subscriber only at the first renewal created at least this long after
    /// the price-change mail to them (default 30 days, 0–365).
    pub price_change_notice: Duration,
    /// `PROVIDER_CONNECT_TIMEOUT_MS`: bound on connecting to a payment provider
    /// (default 3000, 50–60000).
    pub provider_connect_timeout: Duration,
    /// `PROVIDER_TIMEOUT_MS`: bound on one whole call to a payment provider, connect
    /// included (default 10000, 100–120000).
    pub provider_timeout: Duration,
    /// OAuth sign-in providers (`OAUTH_*`, see [`OAuthSettings`]).
    pub oauth: OAuthSettings,
    /// `DEPENDENCY_TIMEOUT_MS`: bound on one database or queue call made while answering a request (default 2000).
    pub dependency_timeout: Duration,
    /// `DB_MAX_CONNECTIONS`: size of the database pool per process (default 20).
    pub db_max_connections: u32,
    /// `LOG_FORMAT`: `json` (default) or `pretty`.
    pub log_format: LogFormat,
    /// `PLANS_FILE`: a plan catalogue replacing the one compiled into the
    /// binaries (`config/plans.toml` of the source tree); `None` = the built-in one.
    pub plans_file: Option<PathBuf>,
    /// `RATE_LIMIT_PUBLIC_PER_HOUR`: requests per hour per IP on contact and waitlist (default 5).
    pub rate_limit_public_per_hour: u32,
    /// The six feature toggles.
    pub toggles: Toggles,
    /// `NEXT_PUBLIC_BACKEND_URL`: base URL of the auth platform (JWKS lives under it).
    pub backend_url: Option<String>,
    /// `NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY`: public key of the auth platform.
    pub backend_publishable_key: Option<String>,
    /// `BACKEND_SERVICE_ROLE_KEY`: server-side secret; arms server-side writes and signs uploads.
    /// In the embedded mode (no `DATABASE_URL`) an unset key is generated once into
    /// `<DATA_DIR>/service_role_key` by [`Settings::from_env`] (see [`crate::base::secrets`]).
    pub backend_service_role_key: Option<String>,
    /// Where `backend_service_role_key` came from (health's `checks.backend_service_role_source`).
    pub backend_service_role_key_source: crate::base::secrets::KeySource,
    /// `CORS_ALLOWED_ORIGINS`: comma list of exact origins (`https://app.example.com`,
    /// scheme + host + optional port, no path) a page may call `/api`, `/auth/v1` and
    /// `/storage/v1` from; empty (unset) = no CORS headers at all.
    pub cors_allowed_origins: Vec<String>,
    /// `BACKEND_JWT_SECRET`: HS256 secret of session tokens.
    pub backend_jwt_secret: Option<String>,
    /// `BACKEND_JWT_ISSUER`: expected `iss` of session tokens, checked when set.
    pub backend_jwt_issuer: Option<String>,
    /// `ADMIN_EMAILS`: comma list of emails granted `admin` on first sight
    /// (ASCII-lowercased), when the session's email is confirmed.
    pub admin_emails: Vec<String>,
    /// `ADMIN_USER_IDS`: comma list of user ids (UUIDs) granted `admin` on first sight.
    pub admin_user_ids: Vec<uuid::Uuid>,
    /// `AUTH_TRUST_EMAIL_CLAIM`: the issuer of session tokens other than the
    /// built-in provider's (JWKS-signed and HS256 tokens of
    /// `BACKEND_JWT_SECRET` alike) issues them for confirmed emails only, so
    /// their `email` may grant `ADMIN_EMAILS` (default `false`).
    pub auth_trust_email_claim: bool,
    /// `EMAIL_PROVIDER_API_KEY`: key of the HTTP email API.
    pub email_provider_api_key: Option<String>,
    /// `EMAIL_PROVIDER_BASE_URL`: base URL of the HTTP email API (`POST {base}/emails`).
    pub email_provider_base_url: Option<String>,
    /// `SMTP_URL`: e.g. `smtp://user:pass@host:587` or `smtps://…`; `?tls=none` is not needed for `smtp://` on localhost.
    pub smtp_url: Option<String>,
    /// `EMAIL_FROM`: sender address of every mail.
    pub email_from: Option<String>,
    /// `CONTACT_EMAIL`: inbox for contact messages (default `EMAIL_FROM`).
    pub contact_email: Option<String>,
    /// `EMAIL_TIMEOUT_SECS`: bound on one email send attempt (default 10).
    pub email_timeout: Duration,
    /// `PAYMENT_PROVIDER`: `provider_a` or `provider_b` (default).
    pub payment_provider: PaymentProvider,
    /// `PROVIDER_A_SERVER_KEY`
    pub provider_a_server_key: Option<String>,
    /// `PROVIDER_A_BASE_URL`: the Snap host checkout goes to (default the sandbox,
    /// `https://app.sandbox.midtrans.com`).
    pub provider_a_base_url: String,
    /// `PROVIDER_A_API_BASE_URL`: the Core API host status checks go to (default the
    /// sandbox, `https://api.sandbox.midtrans.com`).
    pub provider_a_api_base_url: String,
    /// `PROVIDER_B_CLIENT_ID`
    pub provider_b_client_id: Option<String>,
    /// `PROVIDER_B_SECRET_KEY`
    pub provider_b_secret_key: Option<String>,
    /// `PROVIDER_B_BASE_URL`
    pub provider_b_base_url: String,
    /// `ORDER_ID_PREFIX` (default `ORD`).
    pub order_id_prefix: String,
    /// `AI_DEFAULT_PROVIDER`: `openai` (default), `anthropic` or `openai_compatible`.
    pub ai_default_provider: String,
    /// `OPENAI_API_KEY`
    pub openai_api_key: Option<String>,
    /// `ANTHROPIC_API_KEY`
    pub anthropic_api_key: Option<String>,
    /// `OPENAI_COMPATIBLE_BASE_URL`
    pub openai_compatible_base_url: Option<String>,
    /// `OPENAI_BASE_URL`: Chat Completions base, `POST {base}/chat/completions`
    /// (default `https://api.openai.com/v1`).
    pub openai_base_url: String,
    /// `OPENAI_MODEL` (default `gpt-4o-mini`).
    pub openai_model: String,
    /// `ANTHROPIC_BASE_URL`: Messages API host, `POST {base}/v1/messages`
    /// (default `https://api.anthropic.com`).
    pub anthropic_base_url: String,
    /// `ANTHROPIC_MODEL` (default `claude-haiku-4-5`).
    pub anthropic_model: String,
    /// `OPENAI_COMPATIBLE_API_KEY`: optional Bearer key of the compatible server.
    pub openai_compatible_api_key: Option<String>,
    /// `OPENAI_COMPATIBLE_MODEL` (default `default`).
    pub openai_compatible_model: String,
    /// `AI_MAX_INPUT_BYTES`: total UTF-8 bytes of all message texts (or prompt
    /// + system) one AI request may carry (default 65536, 1–10485760); over → 413.
    pub ai_max_input_bytes: usize,
    /// `AI_CONNECT_TIMEOUT_MS`: bound on connecting to the AI provider
    /// (default 5000, 100–60000).
    pub ai_connect_timeout: Duration,
    /// `AI_IDLE_TIMEOUT_MS`: longest wait for the provider's answer headers and
    /// between two chunks of its stream (default 60000, 100–600000).
    pub ai_idle_timeout: Duration,
    /// `AUTH_PROVIDER`: `builtin` (the built-in identity provider under
    /// `/auth/v1`) or `external` (tokens of an external auth platform). Default:
    /// `external` when any of `NEXT_PUBLIC_BACKEND_URL`,
    /// `NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY`, `BACKEND_JWT_SECRET` is set, else `builtin`.
    pub auth_provider: AuthProvider,
    /// `AUTH_AUTOCONFIRM`: sign-ups are confirmed at once, without a mail (default `false`).
    pub auth_autoconfirm: bool,
    /// `AUTH_PASSWORD_MIN_LENGTH`: shortest password accepted (default 8, 6–128).
    pub auth_password_min_length: usize,
    /// `AUTH_ARGON2_MEMORY_KIB` (default 7168) and `AUTH_ARGON2_ITERATIONS`
    /// (default 5): the argon2id cost of new password hashes (one lane). A cost
    /// below every row of OWASP's argon2id table is refused (memory under 7168
    /// KiB, or memory × iterations under 35,840); existing hashes keep
    /// verifying with the cost stored in them.
    pub auth_password_hash_cost: crate::identity::password::HashCost,
    /// `AUTH_OTP_EXPIRY_SECS`: lifetime of mailed codes and links (default 3600, 1–86400).
    pub auth_otp_expiry: Duration,
    /// `AUTH_ACCESS_TOKEN_TTL_SECS`: lifetime of access tokens (default 3600, 120–604800).
    pub auth_access_token_ttl: Duration,
    /// `AUTH_REFRESH_REUSE_INTERVAL_SECS`: how long a rotated refresh token still
    /// yields the active one (default 10, 0–3600).
    pub auth_refresh_reuse_interval: Duration,
    /// `AUTH_SESSIONS_TIMEBOX_SECS`: a session can be refreshed only this long
    /// after its sign-in (default 0: no limit; 0–315360000).
    pub auth_sessions_timebox: Option<Duration>,
    /// `AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS`: a session not refreshed this
    /// long cannot be refreshed any more (default 0: no limit; 0–315360000).
    pub auth_sessions_inactivity_timeout: Option<Duration>,
    /// `AUTH_UNCONFIRMED_TTL_SECS`: an account whose email is still
    /// unconfirmed this long after its last sign-up and confirmation mail is
    /// deleted by the scheduler (default 86400, 60–31536000).
    pub auth_unconfirmed_ttl: Duration,
    /// `AUTH_REDIRECT_ALLOW_LIST`: comma list of URL globs `redirect_to` may
    /// point at besides `APP_URL`'s origin.
    pub auth_redirect_allow_list: crate::identity::redirect::AllowList,
    /// `AUTH_JWT_PRIVATE_KEY`: PKCS#8 PEM of the P-256 key that signs access
    /// tokens; unset = generated once into `<DATA_DIR>/auth_jwt_key.pem`.
    pub auth_jwt_private_key: Option<String>,
    /// `AUTH_JWT_PREVIOUS_KEYS`: PEM blocks (public or private) of earlier
    /// signing keys, still published in the JWKS and accepted (rotation).
    pub auth_jwt_previous_keys: Option<String>,
    /// `AUTH_TEMPLATES_DIR`: directory whose `<kind>.txt` / `<kind>.html`
    /// replace the built-in mail templates.
    pub auth_templates_dir: Option<PathBuf>,
    /// `API_EXTERNAL_URL`: public base URL of this API (mail links go to
    /// `{API_EXTERNAL_URL}/auth/v1/verify`; the tokens' `iss` is
    /// `{API_EXTERNAL_URL}/auth/v1`; avatar upload URLs and the OAuth callback
    /// are under it). Default `APP_URL` (one origin for page and API).
    pub api_external_url: String,
    /// `APP_NAME`: the product's name in billing mails (default `App`;
    /// 1–100 characters, no line breaks).
    pub app_name: String,
    /// `BILLING_TIME_ZONE`: the IANA time zone billing mails write their
    /// times in, named in the text (default `Asia/Jakarta`); JSON answers
    /// stay UTC.
    pub billing_time_zone: chrono_tz::Tz,
    /// `AUTH_RATE_LIMIT_PER_5MIN`: per-IP requests per 5 minutes on sign-up,
    /// password and PKCE sign-in, OTP, recover, resend and verify, each route
    /// counted apart (default 30).
    pub auth_rate_limit_per_5min: u32,
    /// `AUTH_RATE_LIMIT_REFRESH_PER_5MIN`: per-IP refreshes per 5 minutes (default 150).
    pub auth_rate_limit_refresh_per_5min: u32,
    /// `AUTH_MAIL_INTERVAL_SECS`: seconds between two mails of one kind to one
    /// recipient address (default 60, 0–86400; 0 turns the rule off, leaving
    /// the per-IP limits).
    pub auth_mail_interval_secs: i64,
    /// `AUTH_CODE_FAILURES_PER_HOUR`: `{email, token}` code checks one address
    /// may fail per hour, known address or not (default 10, 1–1000); past it
    /// code checks for that address answer 429 until the hour is over or a
    /// link of that address is used. Links are never refused by it.
    pub auth_code_failures_per_hour: u32,
    /// `AUTH_CONFIRMATION_MAILS_PER_DAY`: confirmation mails (sign-up, resend,
    /// code sign-up) to one address per 24 h (default 10, 1–1000).
    pub auth_confirmation_mails_per_day: u32,
}
/// Who issues sessions (`AUTH_PROVIDER`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthProvider {
    /// The built-in identity provider (`/auth/v1`).
    Builtin,
    /// An external auth platform (`NEXT_PUBLIC_BACKEND_URL`, `BACKEND_JWT_SECRET`).
    External,
}
impl AuthProvider {
    /// `builtin` or `external`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Builtin => "builtin",
            Self::External => "external",
        }
    }
}
impl fmt::Debug for Settings {
    /// Secrets are never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Settings")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("database_embedded", &self.database_embedded)
            .field("redis", &self.redis_url.is_some())
            .field("queue_prefix", &self.queue_prefix)
            .field("toggles", &self.toggles)
            .field("payment_provider", &self.payment_provider)
            .finish_non_exhaustive()
    }
}
impl Settings {
    /// Loads `.env` (when present, without overriding the environment) and reads the environment.
    ///
    /// In the embedded mode (no `DATABASE_URL`) an unset `BACKEND_SERVICE_ROLE_KEY`
    /// is read from, or generated once into, `<DATA_DIR>/service_role_key`
    /// (mode 0600); production (`DATABASE_URL` set) still needs it set.
    pub fn from_env() -> Result<Self, SettingsError> {
        let _ = dotenvy::dotenv();
        let mut s = Self::from_source(&Env)?;
        if s.backend_service_role_key.is_none() && s.database_embedded {
            let key = crate::base::secrets::load_or_generate(
                &s.data_dir.join(crate::base::secrets::SERVICE_ROLE_KEY_FILE),
            )
            .map_err(|e| err("BACKEND_SERVICE_ROLE_KEY", e))?;
            s.backend_service_role_key = Some(key);
            s.backend_service_role_key_source = crate::base::secrets::KeySource::Generated;
        }
        Ok(s)
    }

    /// Reads and validates every setting from `src`.
    pub fn from_source<S: Source + ?Sized>(src: &S) -> Result<Self, SettingsError> {
        let r = Reader(src);
        let data_dir = PathBuf::from(r.opt("DATA_DIR").unwrap_or_else(|| "data".into()));
        let (database_url, database_embedded) =
            match r.url("DATABASE_URL", &["postgres", "postgresql", "sqlite"])? {
                Some(url) => (url, false),
                None => (
                    format!("sqlite://{}?mode=rwc", data_dir.join("app.db").display()),
                    true,
                ),
            };
        let redis_url = r.url("REDIS_URL", &["redis", "rediss", "redis+unix", "unix"])?;
        let redis_ca_file = check_redis_tls(redis_url.as_deref(), r.opt("REDIS_CA_FILE"))?;
        let port = r.num_or::<u16>("PORT", 8080, 0, u16::MAX)?;
        let app_url = match r.url("APP_URL", &["http", "https"])? {
            Some(u) => u,
            None => match r.url("NEXT_PUBLIC_APP_URL", &["http", "https"])? {
                Some(u) => u,
                None => format!("http://localhost:{port}"),
            },
        };
        let api_external_url = r
            .url("API_EXTERNAL_URL", &["http", "https"])?
            .unwrap_or_else(|| app_url.clone())
            .trim_end_matches('/')
            .to_string();
        let oauth = OAuthSettings::read(&r, &api_external_url)?;
        let log_format = match r.opt("LOG_FORMAT").map(|v| v.to_ascii_lowercase()) {
            None => LogFormat::Json,
            Some(v) if v == "json" => LogFormat::Json,
            Some(v) if v == "pretty" => LogFormat::Pretty,
            Some(v) => {
                return Err(err(
                    "LOG_FORMAT",
                    format!("expected json or pretty, got {v:?}"),
                ))
            }
        };
        let payment_provider = match r.opt("PAYMENT_PROVIDER").map(|v| v.to_ascii_lowercase()) {
            None => PaymentProvider::ProviderB,
            Some(v) if v == "provider_a" => PaymentProvider::ProviderA,
            Some(v) if v == "provider_b" => PaymentProvider::ProviderB,
            Some(v) => {
                return Err(err(
                    "PAYMENT_PROVIDER",
                    format!("expected provider_a or provider_b, got {v:?}"),
                ))
            }
        };
        let ai_default_provider = match r.opt("AI_DEFAULT_PROVIDER").map(|v| v.to_ascii_lowercase())
        {
            None => "openai".to_string(),
            Some(v) if ["openai", "anthropic", "openai_compatible"].contains(&v.as_str()) => v,
            Some(v) => {
                return Err(err(
                    "AI_DEFAULT_PROVIDER",
                    format!("expected openai, anthropic or openai_compatible, got {v:?}"),
                ))
            }
        };
        let queue_prefix = r.opt("QUEUE_PREFIX").unwrap_or_default();
        if !queue_prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
        {
            return Err(err(
                "QUEUE_PREFIX",
                "only letters, digits, '-', '_', ':' and '.' are allowed",
            ));
        }
        let worker_queues = r.opt("WORKER_QUEUES").map(|v| {
            v.split(',')
                .map(|q| q.trim().to_string())
                .filter(|q| !q.is_empty())
                .collect::<Vec<_>>()
        });
        let order_id_prefix = r.opt("ORDER_ID_PREFIX").unwrap_or_else(|| "ORD".into());
        if order_id_prefix.is_empty()
            || order_id_prefix.len() > 20
            || !order_id_prefix.chars().all(|c| c.is_ascii_alphanumeric())
        {
            return Err(err("ORDER_ID_PREFIX", "1 to 20 letters or digits"));
        }
        let trust_proxy = r.bool_or("TRUST_PROXY", false)?;
        let trust_proxy_hops = r.num_or("TRUST_PROXY_HOPS", usize::from(trust_proxy), 0, 16)?;
        let admin_user_ids = match r.opt("ADMIN_USER_IDS") {
            None => Vec::new(),
            Some(v) => v
                .split(',')
                .map(str::trim)
                .filter(|id| !id.is_empty())
                .map(|id| {
                    uuid::Uuid::parse_str(id)
                        .map_err(|_| err("ADMIN_USER_IDS", format!("{id:?} is not a UUID")))
                })
                .collect::<Result<_, _>>()?,
        };
        let backend_url = r.url("NEXT_PUBLIC_BACKEND_URL", &["http", "https"])?;
        if let Some(u) = &backend_url {
            if !is_https_or_loopback(u) {
                return Err(err(
                    "NEXT_PUBLIC_BACKEND_URL",
                    "the session keys (JWKS) are fetched from it: use https, or http only to a loopback host",
                ));
            }
        }
        let backend_jwt_secret = r.secret("BACKEND_JWT_SECRET")?;
        let backend_service_role_key = r.secret("BACKEND_SERVICE_ROLE_KEY")?;
        let storage_url = match r.url("STORAGE_URL", &["file", "s3"])? {
            Some(u) => u,
            None => format!("file://{}", absolute(&data_dir.join("storage")).display()),
        };

        let auth_provider = match r.opt("AUTH_PROVIDER").map(|v| v.to_ascii_lowercase()) {
            Some(v) if v == "builtin" => AuthProvider::Builtin,
            Some(v) if v == "external" => AuthProvider::External,
            Some(v) => {
                return Err(err(
                    "AUTH_PROVIDER",
                    format!("expected builtin or external, got {v:?}"),
                ))
            }
            None if backend_url.is_some()
                || backend_jwt_secret.is_some()
                || r.opt("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY").is_some() =>
            {
                AuthProvider::External
            }
            None => AuthProvider::Builtin,
        };
        let auth_redirect_allow_list = crate::identity::redirect::AllowList::parse(
            &r.opt("AUTH_REDIRECT_ALLOW_LIST").unwrap_or_default(),
        )
        .map_err(|e| err("AUTH_REDIRECT_ALLOW_LIST", e))?;
        let mut settings = Settings {
            host: r.opt("HOST").unwrap_or_else(|| "127.0.0.1".into()),
            port,
            database_url,
            database_embedded,
            redis_url,
            redis_ca_file,
            data_dir,
            migrate_on_start: r.bool_or("MIGRATE_ON_START", true)?,
            app_url,
            trust_proxy,
            trust_proxy_hops,
            http_header_timeout: Duration::from_millis(r.num_or(
                "HTTP_HEADER_TIMEOUT_MS",
                10_000u64,
                100,
                600_000,
            )?),
            http_idle_timeout: Duration::from_secs(r.num_or(
                "HTTP_IDLE_TIMEOUT_SECS",
                60u64,
                1,
                3600,
            )?),
            http_body_timeout: Duration::from_secs(r.num_or(
                "HTTP_BODY_TIMEOUT_SECS",
                30u64,
                1,
                3600,
            )?),
            http_body_min_rate: r.num_or("HTTP_BODY_MIN_RATE", 1024u64, 0, 1 << 30)?,
            http_body_rate_grace: Duration::from_secs(r.num_or(
                "HTTP_BODY_RATE_GRACE_SECS",
                2u64,
                1,
                3600,
            )?),
            http_body_budget: r.num_or(
                "HTTP_BODY_BUDGET_BYTES",
                32usize << 20,
                64 * 1024,
                1 << 40,
            )?,
            http_max_connections: r.num_or("HTTP_MAX_CONNECTIONS", 10_000usize, 1, 1_000_000)?,
            http_max_in_flight: r.num_or(
                "HTTP_MAX_IN_FLIGHT",
                HTTP_MAX_IN_FLIGHT_DEFAULT,
                0,
                1_000_000,
            )?,
            ai_max_open_streams: r.num_or("AI_MAX_OPEN_STREAMS", 1000usize, 1, 1_000_000)?,
            ai_stream_stall: Duration::from_secs(r.num_or(
                "AI_STREAM_STALL_SECS",
                30u64,
                1,
                3600,
            )?),
            http_max_uploads: r.num_or("HTTP_MAX_UPLOADS", 256usize, 1, 1_000_000)?,
            http_max_uploads_per_user: r.num_or("HTTP_MAX_UPLOADS_PER_USER", 2usize, 1, 1000)?,
            upload_min_rate: r.num_or("UPLOAD_MIN_RATE", 8192u64, 1025, 1 << 30)?,
            http_max_connections_per_client: r.num_or(
                "HTTP_MAX_CONNECTIONS_PER_CLIENT",
                512usize,
                0,
                1_000_000,
            )?,
            metrics_token: r.secret("METRICS_TOKEN")?,
            worker_http_port: r
                .opt("WORKER_HTTP_PORT")
                .map(|_| r.num_or("WORKER_HTTP_PORT", 0u16, 0, u16::MAX))
                .transpose()?,
            storage_url,
            worker_concurrency: r.num_or("WORKER_CONCURRENCY", 16usize, 1, 1024)?,
            worker_queues,
            queue_prefix,
            job_retention: Duration::from_secs(r.num_or(
                "JOB_RETENTION_SECS",
                3600u64,
                0,
                30 * 86_400,
            )?),
            vacuum_interval: Duration::from_secs(r.num_or(
                "VACUUM_INTERVAL_SECS",
                60u64,
                1,
                86_400,
            )?),
            job_retry_base: Duration::from_secs(r.num_or("JOB_RETRY_BASE_SECS", 10u64, 1, 3600)?),
            job_retry_max_delay: Duration::from_secs(r.num_or(
                "JOB_RETRY_MAX_DELAY_SECS",
                3600u64,
                1,
                86_400,
            )?),
            job_retry_horizon: Duration::from_secs(r.num_or(
                "JOB_RETRY_HORIZON_SECS",
                86_400u64,
                0,
                30 * 86_400,
            )?),
            dead_letter_retention: Duration::from_secs(r.num_or(
                "DEAD_LETTER_RETENTION_SECS",
                14 * 86_400u64,
                1,
                365 * 86_400,
            )?),
            worker_heartbeat: Duration::from_millis(r.num_or(
                "WORKER_HEARTBEAT_MS",
                5000u64,
                100,
                60_000,
            )?),
            job_timeout: Duration::from_secs(r.num_or("JOB_TIMEOUT_SECS", 300u64, 1, 86_400)?),
            worker_shutdown_timeout: Duration::from_secs(r.num_or(
                "WORKER_SHUTDOWN_TIMEOUT_SECS",
                25u64,
                0,
                3600,
            )?),
            worker_test_panic_marker: r.opt("WORKER_TEST_PANIC_MARKER").filter(|m| !m.is_empty()),
            scheduler_tick: Duration::from_secs(r.num_or(
                "SCHEDULER_TICK_SECS",
                60u64,
                1,
                86_400,
            )?),
            settlement_sweep_after: Duration::from_secs(r.num_or(
                "SETTLEMENT_SWEEP_AFTER_SECS",
                120u64,
                1,
                86_400,
            )?),
            payment_expire_after: Duration::from_secs(r.num_or(
                "PAYMENT_EXPIRE_AFTER_SECS",
                86_400u64,
                60,
                30 * 86_400,
            )?),
            payment_reconcile_after: Duration::from_secs(r.num_or(
                "PAYMENT_RECONCILE_AFTER_SECS",
                900u64,
                1,
                30 * 86_400,
            )?),
            renewal_grace: Duration::from_secs(r.num_or(
                "RENEWAL_GRACE_SECS",
                3 * 86_400u64,
                0,
                30 * 86_400,
            )?),
            renewal_claim: Duration::from_secs(r.num_or(
                "RENEWAL_CLAIM_SECS",
                900u64,
                1,
                86_400,
            )?),
            price_change_notice: Duration::from_secs(
                86_400 * r.num_or::<u64>("PRICE_CHANGE_NOTICE_DAYS", 30u64, 0, 365)?,
            ),
            renewal_reminder_days: parse_reminder_days(
                "RENEWAL_REMINDER_DAYS",
                r.opt("RENEWAL_REMINDER_DAYS").as_deref().unwrap_or("7,3,1"),
            )?,
            provider_connect_timeout: Duration::from_millis(r.num_or(
                "PROVIDER_CONNECT_TIMEOUT_MS",
                3000u64,
                50,
                60_000,
            )?),
            provider_timeout: Duration::from_millis(r.num_or(
                "PROVIDER_TIMEOUT_MS",
                10_000u64,
                100,
                120_000,
            )?),
            oauth,
            dependency_timeout: Duration::from_millis(r.num_or(
                "DEPENDENCY_TIMEOUT_MS",
                2000u64,
                50,
                60_000,
            )?),
            db_max_connections: r.num_or("DB_MAX_CONNECTIONS", 20u32, 1, 1000)?,
            log_format,
            plans_file: r.opt("PLANS_FILE").map(PathBuf::from),
            rate_limit_public_per_hour: r.num_or(
                "RATE_LIMIT_PUBLIC_PER_HOUR",
                5u32,
                1,
                100_000_000,
            )?,
            toggles: Toggles {
                auth: r.bool_or("NEXT_PUBLIC_ENABLE_AUTH", true)?,
                waitlist: r.bool_or("NEXT_PUBLIC_ENABLE_WAITLIST", true)?,
                contact: r.bool_or("NEXT_PUBLIC_ENABLE_CONTACT", true)?,
                payments: r.bool_or("NEXT_PUBLIC_ENABLE_PAYMENTS", true)?,
                admin: r.bool_or("NEXT_PUBLIC_ENABLE_ADMIN", true)?,
                ai: r.bool_or("NEXT_PUBLIC_ENABLE_AI", true)?,
            },
            backend_url,
            backend_publishable_key: r.opt("NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY"),
            backend_service_role_key_source: if backend_service_role_key.is_some() {
                crate::base::secrets::KeySource::Env
            } else {
                crate::base::secrets::KeySource::None
            },
            backend_service_role_key,
            cors_allowed_origins: parse_origins(
                "CORS_ALLOWED_ORIGINS",
                &r.opt("CORS_ALLOWED_ORIGINS").unwrap_or_default(),
            )?,
            backend_jwt_secret,
            backend_jwt_issuer: r.opt("BACKEND_JWT_ISSUER"),
            admin_emails: r
                .opt("ADMIN_EMAILS")
                .map(|v| {
                    v.split(',')
                        .map(|e| e.trim().to_ascii_lowercase())
                        .filter(|e| !e.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
            admin_user_ids,
            auth_trust_email_claim: r.bool_or("AUTH_TRUST_EMAIL_CLAIM", false)?,
            email_provider_api_key: r.opt("EMAIL_PROVIDER_API_KEY"),
            email_provider_base_url: r.url("EMAIL_PROVIDER_BASE_URL", &["http", "https"])?,
            smtp_url: match r.url("SMTP_URL", &["smtp", "smtps"])? {
                Some(u) => {
                    check_smtp_credentials(&u)?;
                    Some(u)
                }
                None => None,
            },
            email_from: r.email("EMAIL_FROM")?,
            contact_email: r.email("CONTACT_EMAIL")?,
            email_timeout: Duration::from_secs(r.num_or("EMAIL_TIMEOUT_SECS", 10u64, 1, 300)?),
            payment_provider,
            provider_a_server_key: r.opt("PROVIDER_A_SERVER_KEY"),
            provider_a_base_url: r
                .url("PROVIDER_A_BASE_URL", &["http", "https"])?
                .unwrap_or_else(|| "https://app.sandbox.midtrans.com".into()),
            provider_a_api_base_url: r
                .url("PROVIDER_A_API_BASE_URL", &["http", "https"])?
                .unwrap_or_else(|| "https://api.sandbox.midtrans.com".into()),
            provider_b_client_id: r.opt("PROVIDER_B_CLIENT_ID"),
            provider_b_secret_key: r.opt("PROVIDER_B_SECRET_KEY"),
            provider_b_base_url: r
                .url("PROVIDER_B_BASE_URL", &["http", "https"])?
                .unwrap_or_else(|| "https://api-sandbox.doku.com".into()),
            order_id_prefix,
            ai_default_provider,
            openai_api_key: r.opt("OPENAI_API_KEY"),
            anthropic_api_key: r.opt("ANTHROPIC_API_KEY"),
            openai_compatible_base_url: r.url("OPENAI_COMPATIBLE_BASE_URL", &["http", "https"])?,
            openai_base_url: r
                .url("OPENAI_BASE_URL", &["http", "https"])?
                .unwrap_or_else(|| "https://api.openai.com/v1".into()),
            openai_model: r
                .opt("OPENAI_MODEL")
                .unwrap_or_else(|| "gpt-4o-mini".into()),
            anthropic_base_url: r
                .url("ANTHROPIC_BASE_URL", &["http", "https"])?
                .unwrap_or_else(|| "https://api.anthropic.com".into()),
            anthropic_model: r
                .opt("ANTHROPIC_MODEL")
                .unwrap_or_else(|| "claude-haiku-4-5".into()),
            openai_compatible_api_key: r.opt("OPENAI_COMPATIBLE_API_KEY"),
            openai_compatible_model: r
                .opt("OPENAI_COMPATIBLE_MODEL")
                .unwrap_or_else(|| "default".into()),
            ai_max_input_bytes: r.num_or("AI_MAX_INPUT_BYTES", 65_536usize, 1, 10_485_760)?,
            ai_connect_timeout: Duration::from_millis(r.num_or(
                "AI_CONNECT_TIMEOUT_MS",
                5_000u64,
                100,
                60_000,
            )?),
            ai_idle_timeout: Duration::from_millis(r.num_or(
                "AI_IDLE_TIMEOUT_MS",
                60_000u64,
                100,
                600_000,
            )?),
            auth_provider,
            auth_autoconfirm: r.bool_or("AUTH_AUTOCONFIRM", false)?,
            auth_password_min_length: r.num_or("AUTH_PASSWORD_MIN_LENGTH", 8usize, 6, 128)?,
            auth_password_hash_cost: crate::identity::password::HashCost::new(
                r.num_or("AUTH_ARGON2_MEMORY_KIB", 7168u32, 7168, 4_194_304)?,
                r.num_or("AUTH_ARGON2_ITERATIONS", 5u32, 1, 64)?,
            )
            .map_err(|e| err("AUTH_ARGON2_ITERATIONS", e))?,
            auth_otp_expiry: Duration::from_secs(r.num_or(
                "AUTH_OTP_EXPIRY_SECS",
                3600u64,
                1,
                86_400,
            )?),
            auth_access_token_ttl: Duration::from_secs(r.num_or(
                "AUTH_ACCESS_TOKEN_TTL_SECS",
                3600u64,
                120,
                604_800,
            )?),
            auth_refresh_reuse_interval: Duration::from_secs(r.num_or(
                "AUTH_REFRESH_REUSE_INTERVAL_SECS",
                10u64,
                0,
                3600,
            )?),
            auth_sessions_timebox: Some(r.num_or(
                "AUTH_SESSIONS_TIMEBOX_SECS",
                0u64,
                0,
                315_360_000,
            )?)
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
            auth_sessions_inactivity_timeout: Some(r.num_or(
                "AUTH_SESSIONS_INACTIVITY_TIMEOUT_SECS",
                0u64,
                0,
                315_360_000,
            )?)
            .filter(|s| *s > 0)
            .map(Duration::from_secs),
            auth_unconfirmed_ttl: Duration::from_secs(r.num_or(
                "AUTH_UNCONFIRMED_TTL_SECS",
                86_400u64,
                60,
                31_536_000,
            )?),
            auth_redirect_allow_list,
            auth_jwt_private_key: r.opt("AUTH_JWT_PRIVATE_KEY"),
            auth_jwt_previous_keys: r.opt("AUTH_JWT_PREVIOUS_KEYS"),
            auth_templates_dir: r.opt("AUTH_TEMPLATES_DIR").map(PathBuf::from),
            api_external_url,
            app_name: read_app_name(&r)?,
            billing_time_zone: read_time_zone(&r, "BILLING_TIME_ZONE", chrono_tz::Asia::Jakarta)?,
            auth_rate_limit_per_5min: r.num_or(
                "AUTH_RATE_LIMIT_PER_5MIN",
                30u32,
                1,
                100_000_000,
            )?,
            auth_rate_limit_refresh_per_5min: r.num_or(
                "AUTH_RATE_LIMIT_REFRESH_PER_5MIN",
                150u32,
                1,
                100_000_000,
            )?,
            auth_mail_interval_secs: r.num_or(
                "AUTH_MAIL_INTERVAL_SECS",
                DEFAULT_MAIL_INTERVAL_SECS,
                0,
                86_400,
            )?,
            auth_code_failures_per_hour: r.num_or(
                "AUTH_CODE_FAILURES_PER_HOUR",
                DEFAULT_CODE_FAILURES_PER_HOUR,
                1,
                1000,
            )?,
            auth_confirmation_mails_per_day: r.num_or(
                "AUTH_CONFIRMATION_MAILS_PER_DAY",
                DEFAULT_CONFIRMATION_MAILS_PER_DAY,
                1,
                1000,
            )?,
        };
        if settings.email_from.is_none() && settings.email_transport() == EmailTransport::Outbox {
            settings.email_from = Some(OUTBOX_DEFAULT_FROM.to_string());
        }
        Ok(settings)
    }

    /// The transport mail goes through: the HTTP API when its key is set (it
    /// also needs `EMAIL_PROVIDER_BASE_URL`; without it, SMTP if set, else
    /// none), SMTP when `SMTP_URL` is set, the outbox directory when nothing is
    /// configured in the embedded mode (no `DATABASE_URL`, no `REDIS_URL`),
    /// else none.
    pub fn email_transport(&self) -> EmailTransport {
        if self.email_provider_api_key.is_some() && self.email_provider_base_url.is_some() {
            EmailTransport::Api
        } else if self.smtp_url.is_some() {
            EmailTransport::Smtp
        } else if self.email_provider_api_key.is_some() {
            EmailTransport::None
        } else if self.database_embedded && self.redis_url.is_none() {
            EmailTransport::Outbox
        } else {
            EmailTransport::None
        }
    }

    /// `$DATA_DIR/outbox`: where the outbox transport writes `.eml` files.
    pub fn outbox_dir(&self) -> PathBuf {
        self.data_dir.join("outbox")
    }

    /// The queue name with this deployment's `QUEUE_PREFIX`.
    pub fn queue_name(&self, base: &str) -> String {
        if self.queue_prefix.is_empty() {
            base.to_string()
        } else {
            format!("{}:{base}", self.queue_prefix)
        }
    }

    /// Where contact messages go: `CONTACT_EMAIL`, else `EMAIL_FROM`.
    pub fn contact_inbox(&self) -> Option<&str> {
        self.contact_email.as_deref().or(self.email_from.as_deref())
    }
}
/// Default seconds between two mails of one kind to one user
/// (`AUTH_MAIL_INTERVAL_SECS`).
pub const DEFAULT_MAIL_INTERVAL_SECS: i64 = 60;
/// Default `AUTH_CODE_FAILURES_PER_HOUR`.
pub const DEFAULT_CODE_FAILURES_PER_HOUR: u32 = 10;
/// Default `AUTH_CONFIRMATION_MAILS_PER_DAY`.
pub const DEFAULT_CONFIRMATION_MAILS_PER_DAY: u32 = 10;
