//! Clients of the payment providers' HTTP APIs (an I/O adapter, like the
//! mailer): checkout for `POST /api/payments` ([`checkout`]), the status
//! checks of reconciliation ([`status`]) and ending a voided renewal's
//! checkout ([`expire`]).
//!
//! Protocols (decisions.md, "Payments"):
//! * provider_a is the Snap / Core API protocol of Midtrans: `Authorization:
//!   Basic base64(server_key + ":")`.
//! * provider_b is the Checkout protocol of DOKU: headers `Client-Id`,
//!   `Request-Id`, `Request-Timestamp` (UTC, `YYYY-MM-DDTHH:MM:SSZ`) and
//!   `Signature` ([`entity::billing::payment::provider_b_signature`]).
//!
//! Every call is bounded: `PROVIDER_CONNECT_TIMEOUT_MS` to connect and
//! `PROVIDER_TIMEOUT_MS` for the whole exchange; redirects are not followed.
//! A call is retried once, and only when the connection could not be made
//! ([`send_once_more_on_connect_error`]): once a request may have reached the
//! provider, it may have created the transaction, so it is never sent again.

use std::time::Duration;

use base64::Engine as _;
use entity::{billing::payment::ProviderBRequest, Settings};

pub mod checkout;
pub mod expire;
pub mod status;

/// Why a provider call gave no usable answer.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    /// The provider's credentials are not configured (names the variable).
    #[error("{0} is not set")]
    NotConfigured(&'static str),
    /// No connection could be made (after the one retry).
    #[error("could not connect to the provider: {0}")]
    Connect(String),
    /// The provider did not answer within `PROVIDER_TIMEOUT_MS`.
    #[error("the provider did not answer in time")]
    Timeout,
    /// Another transport error while the request was under way.
    #[error("transport error talking to the provider: {0}")]
    Transport(String),
    /// The provider answered with an HTTP error status.
    #[error("the provider answered HTTP {status}")]
    Status {
        /// The HTTP status.
        status: u16,
        /// The start of the body, for the log.
        body: String,
    },
    /// The answer is not the documented shape (names what is wrong).
    #[error("the provider's answer is not the documented shape: {0}")]
    Undocumented(String),
}

impl ProviderError {
    /// Classifies a reqwest error.
    pub fn from_reqwest(e: &reqwest::Error) -> Self {
        if e.is_timeout() && !e.is_connect() {
            ProviderError::Timeout
        } else if e.is_connect() {
            ProviderError::Connect(e.to_string())
        } else {
            ProviderError::Transport(e.to_string())
        }
    }
}

/// The shared HTTP client and settings of both providers. Cheap to clone.
#[derive(Clone)]
pub struct Providers {
    http: reqwest::Client,
    settings: std::sync::Arc<Settings>,
}

impl Providers {
    /// A client with the settings' timeouts, no redirects, and a connection pool
    /// kept warm per provider host.
    pub fn new(settings: std::sync::Arc<Settings>) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.provider_connect_timeout)
            .timeout(settings.provider_timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_max_idle_per_host(64)
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("subscription-backend/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Providers { http, settings })
    }

    /// The HTTP client.
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The settings the client was built from.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// provider_a's `Authorization` value: `Basic base64(server_key + ":")`.
    pub fn provider_a_auth(&self) -> Result<String, ProviderError> {
        let key = self
            .settings
            .provider_a_server_key
            .as_deref()
            .ok_or(ProviderError::NotConfigured("PROVIDER_A_SERVER_KEY"))?;
        Ok(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{key}:"))
        ))
    }

    /// Sends `method` to provider_a's Core API at
    /// `{PROVIDER_A_API_BASE_URL}/v2/{order_id}/{action}` with its Basic auth
    /// (the status check, Expire Transaction); retried once only when no
    /// connection could be made.
    pub(crate) async fn provider_a_core(
        &self,
        method: reqwest::Method,
        order_id: &str,
        action: &str,
    ) -> Result<reqwest::Response, ProviderError> {
        let auth = self.provider_a_auth()?;
        let url = format!(
            "{}/v2/{order_id}/{action}",
            self.settings()
                .provider_a_api_base_url
                .trim_end_matches('/')
        );
        send_once_more_on_connect_error(|| {
            self.http()
                .request(method.clone(), &url)
                .header("Accept", "application/json")
                .header("Authorization", &auth)
        })
        .await
    }

    /// provider_b's request headers for a request to `target` (the path) with
    /// `body` (`None`: no `Digest` component): `Client-Id`, `Request-Id` (a new
    /// UUID), `Request-Timestamp` (now, UTC, whole seconds as the protocol
    /// writes it) and `Signature`.
    pub fn provider_b_headers(
        &self,
        target: &str,
        body: Option<&[u8]>,
    ) -> Result<ProviderBHeaders, ProviderError> {
        let client_id = self
            .settings
            .provider_b_client_id
            .as_deref()
            .ok_or(ProviderError::NotConfigured("PROVIDER_B_CLIENT_ID"))?;
        let secret = self
            .settings
            .provider_b_secret_key
            .as_deref()
            .ok_or(ProviderError::NotConfigured("PROVIDER_B_SECRET_KEY"))?;
        let request_id = uuid::Uuid::new_v4().to_string();
        let timestamp = chrono::Utc::now().format("%Y-%m-%dT%H:%M:%SZ").to_string();
        let signature = entity::billing::payment::provider_b_signature(
            secret,
            &ProviderBRequest {
                client_id,
                request_id: &request_id,
                timestamp: &timestamp,
                target,
                body,
            },
        );
        Ok(ProviderBHeaders {
            client_id: client_id.to_string(),
            request_id,
            timestamp,
            signature,
        })
    }
}

/// The headers provider_b requires on a request.
#[derive(Debug, Clone)]
pub struct ProviderBHeaders {
    /// `Client-Id`.
    pub client_id: String,
    /// `Request-Id` (a new UUID per request).
    pub request_id: String,
    /// `Request-Timestamp` (`YYYY-MM-DDTHH:MM:SSZ`, UTC).
    pub timestamp: String,
    /// `Signature` (`HMACSHA256=…`).
    pub signature: String,
}

impl ProviderBHeaders {
    /// Adds the four headers to `req`.
    pub fn apply(&self, req: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        req.header("Client-Id", &self.client_id)
            .header("Request-Id", &self.request_id)
            .header("Request-Timestamp", &self.timestamp)
            .header("Signature", &self.signature)
    }
}

/// Sends the request `build` makes; when no connection could be made, builds
/// and sends it once more (nothing reached the provider, so nothing can be
/// created twice). Any other failure (a timeout after connecting included) is
/// returned at once.
pub async fn send_once_more_on_connect_error(
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ProviderError> {
    let upstream = crate::metrics::Upstream::start("payment_provider");
    let answer = send_retrying_connect(build).await;
    upstream.finish(matches!(&answer, Ok(r) if r.status().is_success()));
    answer
}

async fn send_retrying_connect(
    build: impl Fn() -> reqwest::RequestBuilder,
) -> Result<reqwest::Response, ProviderError> {
    match build().send().await {
        Ok(r) => Ok(r),
        Err(e) if e.is_connect() => {
            tracing::warn!(error = %e, "payment provider: connection failed; retrying once");
            build()
                .send()
                .await
                .map_err(|e| ProviderError::from_reqwest(&e))
        }
        Err(e) => Err(ProviderError::from_reqwest(&e)),
    }
}

/// provider_a's Core API answers some errors inside an HTTP 200, as a
/// `status_code` of 4xx or 5xx: that status, with its `status_message`
/// (at most 512 characters); `None` for any other code.
pub fn provider_a_error_in_body(status_code: &str, v: &serde_json::Value) -> Option<ProviderError> {
    let status @ 400..=599 = status_code.parse::<u16>().ok()? else {
        return None;
    };
    Some(ProviderError::Status {
        status,
        body: v
            .get("status_message")
            .and_then(serde_json::Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(512)
            .collect(),
    })
}

/// Reads a JSON answer of at most 64 KiB: HTTP error statuses become
/// [`ProviderError::Status`], a body that is not JSON
/// [`ProviderError::Undocumented`].
pub async fn json_answer(
    resp: reqwest::Response,
) -> Result<(u16, serde_json::Value), ProviderError> {
    const MAX: usize = 64 * 1024;
    let status = resp.status().as_u16();
    let mut resp = resp;
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| ProviderError::from_reqwest(&e))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX {
            return Err(ProviderError::Undocumented(
                "the answer exceeds 64 KiB".into(),
            ));
        }
    }
    if !(200..300).contains(&status) {
        return Err(ProviderError::Status {
            status,
            body: String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned(),
        });
    }
    let value = serde_json::from_slice(&body)
        .map_err(|e| ProviderError::Undocumented(format!("not JSON: {e}")))?;
    Ok((status, value))
}
