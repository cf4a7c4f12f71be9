//! Errors of `/auth/v1` in the platform's two formats, and the middleware
//! that picks the format per request (`X-Supabase-Api-Version`).

use entity::identity::IdentityError;
use poem::{
    http::{HeaderValue, StatusCode},
    Endpoint, IntoResponse, Middleware, Request, Response,
};
use poem_openapi::{
    registry::{MetaHeader, MetaMediaType, MetaResponse, MetaResponses, Registry},
    types::Type,
    ApiResponse, Object,
};

use super::API_VERSION_HEADER;

tokio::task_local! {
    /// Whether the current `/auth` request asked for the 2024-01-01 error format.
    static NEW_ERROR_FORMAT: bool;
}

/// An error of `/auth/v1`, rendered in the platform's format: with
/// `X-Supabase-Api-Version` ≥ `2024-01-01` on the request,
/// `{code: "<error_code>", message}` (and the header echoed); otherwise
/// `{code: <status>, error_code, msg}`. `weak_password: {reasons}` is added for
/// `weak_password`; 429 carries `Retry-After`.
#[derive(Debug, Clone)]
pub struct AuthApiError {
    /// HTTP status.
    pub status: u16,
    /// The platform's error code (`invalid_credentials`, …).
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// `weak_password` reasons.
    pub reasons: Option<Vec<String>>,
    /// Seconds for `Retry-After` (429).
    pub retry_after: Option<u64>,
}

impl std::fmt::Display for AuthApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.code, self.message)
    }
}

impl std::error::Error for AuthApiError {}

impl AuthApiError {
    /// An error with this status, code and message.
    pub fn new(status: u16, code: &'static str, message: impl Into<String>) -> Self {
        AuthApiError {
            status,
            code,
            message: message.into(),
            reasons: None,
            retry_after: None,
        }
    }

    /// 400 `validation_failed`.
    pub fn validation(message: impl Into<String>) -> Self {
        Self::new(400, "validation_failed", message)
    }

    /// 500 `unexpected_failure` (the cause is logged, not sent).
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        tracing::error!(error = %cause, "auth: unexpected failure");
        Self::new(
            500,
            "unexpected_failure",
            "Unexpected failure, please try again",
        )
    }

    /// 503 `database_unavailable`: a dependency did not answer in time.
    pub fn unavailable() -> Self {
        Self::new(
            503,
            "database_unavailable",
            "The service is temporarily unavailable; try again shortly",
        )
    }

    /// 429 `over_request_rate_limit` with `Retry-After`.
    pub fn rate_limited(retry_after: u64) -> Self {
        AuthApiError {
            retry_after: Some(retry_after.max(1)),
            ..Self::new(429, "over_request_rate_limit", "Request rate limit reached")
        }
    }

    /// 401 `no_authorization`.
    pub fn no_authorization() -> Self {
        Self::new(
            401,
            "no_authorization",
            "This endpoint requires a valid Bearer token",
        )
    }

    /// 403 `bad_jwt`.
    pub fn bad_jwt(why: &str) -> Self {
        Self::new(
            403,
            "bad_jwt",
            format!("invalid JWT: unable to parse or verify signature, {why}"),
        )
    }

    /// The body in the format the current request asked for.
    pub fn body(&self, new_format: bool) -> serde_json::Value {
        let mut body = if new_format {
            serde_json::json!({"code": self.code, "message": self.message})
        } else {
            serde_json::json!({"code": self.status, "error_code": self.code, "msg": self.message})
        };
        if let Some(r) = &self.reasons {
            body["weak_password"] = serde_json::json!({"reasons": r});
        }
        body
    }
}

impl From<IdentityError> for AuthApiError {
    fn from(e: IdentityError) -> Self {
        match e {
            IdentityError::Db(ref db) => {
                if entity::base::db::is_unavailable(db) {
                    tracing::error!(error = %db, "auth: database unavailable");
                    return Self::unavailable();
                }
                Self::internal(db)
            }
            IdentityError::WeakPassword { ref reasons, .. } => AuthApiError {
                reasons: Some(reasons.iter().map(|r| r.to_string()).collect()),
                ..Self::new(e.status(), e.code(), e.to_string())
            },
            IdentityError::OverEmailSendRateLimit(wait)
            | IdentityError::OverRequestRateLimit(wait) => AuthApiError {
                retry_after: Some(wait.max(1) as u64),
                ..Self::new(e.status(), e.code(), e.to_string())
            },
            _ => Self::new(e.status(), e.code(), e.to_string()),
        }
    }
}

impl From<sea_orm::DbErr> for AuthApiError {
    fn from(e: sea_orm::DbErr) -> Self {
        IdentityError::Db(e).into()
    }
}

impl IntoResponse for AuthApiError {
    fn into_response(self) -> Response {
        let new_format = NEW_ERROR_FORMAT.try_with(|v| *v).unwrap_or(false);
        let mut resp = Response::builder()
            .status(StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .content_type("application/json")
            .body(self.body(new_format).to_string());
        if let Some(s) = self.retry_after {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from(s));
        }
        resp
    }
}

impl From<AuthApiError> for poem::Error {
    fn from(e: AuthApiError) -> Self {
        poem::Error::from_response(e.into_response())
    }
}

/// The documented error body (both formats in one schema).
#[derive(Debug, Clone, Object)]
pub struct AuthErrorBody {
    /// 2024-01-01 format: the error code (string); legacy format: the HTTP status (integer).
    pub code: serde_json::Value,
    /// 2024-01-01 format: the message.
    pub message: Option<String>,
    /// Legacy format: the error code.
    pub error_code: Option<String>,
    /// Legacy format: the message.
    pub msg: Option<String>,
    /// `weak_password` only: why (`length`, `characters`).
    pub weak_password: Option<WeakPasswordBody>,
}

/// `weak_password` details.
#[derive(Debug, Clone, Object)]
pub struct WeakPasswordBody {
    /// `length`, `characters`, `pwned`.
    pub reasons: Vec<String>,
}

const ERROR_STATUSES: &[(u16, &str)] = &[
    (400, "`validation_failed`, `invalid_credentials`, `email_not_confirmed`, `bad_code_verifier`, `refresh_token_not_found`, `refresh_token_already_used`, `session_expired`, `reauthentication_needed`."),
    (401, "`no_authorization`: no bearer token."),
    (403, "`bad_jwt`, `session_not_found`, `otp_expired` (unknown, used or expired token)."),
    (404, "`flow_state_not_found`, `user_not_found`."),
    (422, "`user_already_exists`, `email_exists`, `weak_password` (with `weak_password.reasons`), `same_password`, `flow_state_expired`, `otp_disabled`, `reauthentication_not_valid`."),
    (429, "`over_request_rate_limit` (per-IP limit) or `over_email_send_rate_limit` (one mail of a kind per user per `AUTH_MAIL_INTERVAL_SECS`, default 60 s); `Retry-After` in seconds."),
    (500, "`unexpected_failure`."),
    (503, "`database_unavailable`: a dependency did not answer in time."),
];

impl ApiResponse for AuthApiError {
    const BAD_REQUEST_HANDLER: bool = true;

    fn meta() -> MetaResponses {
        MetaResponses {
            responses: ERROR_STATUSES
                .iter()
                .map(|(status, description)| MetaResponse {
                    description,
                    status: Some(*status),
                    status_range: None,
                    content: vec![MetaMediaType {
                        content_type: "application/json",
                        schema: AuthErrorBody::schema_ref(),
                    }],
                    headers: version_header()
                        .into_iter()
                        .chain((*status == 429).then(|| MetaHeader {
                            name: "Retry-After".into(),
                            description: Some("Seconds to wait.".into()),
                            required: true,
                            deprecated: false,
                            schema: u64::schema_ref(),
                        }))
                        .collect(),
                })
                .collect(),
        }
    }

    fn register(registry: &mut Registry) {
        AuthErrorBody::register(registry);
    }

    fn from_parse_request_error(err: poem::Error) -> Self {
        AuthApiError::validation(err.to_string())
    }
}

fn version_header() -> Option<MetaHeader> {
    Some(MetaHeader {
        name: "X-Supabase-Api-Version".into(),
        description: Some(
            "Echo of the request's `X-Supabase-Api-Version` when it is a date ≥ 2024-01-01 (then the body is `{code, message}`)."
                .into(),
        ),
        required: false,
        deprecated: false,
        schema: String::schema_ref(),
    })
}

/// Parses `X-Supabase-Api-Version`: `YYYY-MM-DD`, true when ≥ 2024-01-01.
pub fn is_new_format(value: &str) -> bool {
    let v = value.trim();
    chrono::NaiveDate::parse_from_str(v, "%Y-%m-%d").is_ok_and(|d| {
        v.len() == 10 && d >= chrono::NaiveDate::from_ymd_opt(2024, 1, 1).expect("valid date")
    })
}

/// Middleware of the `/auth` mount: reads `X-Supabase-Api-Version`, makes
/// [`AuthApiError`] render the matching format, and echoes the header.
pub struct AuthVersion;

impl<E: Endpoint> Middleware<E> for AuthVersion {
    type Output = AuthVersionEndpoint<E>;
    fn transform(&self, ep: E) -> Self::Output {
        AuthVersionEndpoint(ep)
    }
}

/// See [`AuthVersion`].
pub struct AuthVersionEndpoint<E>(E);

impl<E: Endpoint> Endpoint for AuthVersionEndpoint<E> {
    type Output = Response;

    async fn call(&self, req: Request) -> poem::Result<Response> {
        let version = req
            .headers()
            .get(API_VERSION_HEADER)
            .and_then(|v| v.to_str().ok())
            .filter(|v| is_new_format(v))
            .map(str::to_string);
        let new_format = version.is_some();
        let result = NEW_ERROR_FORMAT
            .scope(new_format, async {
                self.0.call(req).await.map(IntoResponse::into_response)
            })
            .await;
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                // Errors raised outside the handlers (404, 405, 413, …): JSON in
                // the platform's format too.
                let status = e.status();
                if e.is_from_response() {
                    e.into_response()
                } else {
                    let code = match status.as_u16() {
                        404 => "not_found",
                        405 => "method_not_allowed",
                        413 => "request_too_large",
                        415 => "validation_failed",
                        _ => "unexpected_failure",
                    };
                    let err = AuthApiError::new(status.as_u16(), code, e.to_string());
                    NEW_ERROR_FORMAT.sync_scope(new_format, || err.into_response())
                }
            }
        };
        if let Some(v) = version.and_then(|v| HeaderValue::from_str(&v).ok()) {
            resp.headers_mut().insert(API_VERSION_HEADER, v);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_version_dates() {
        assert!(is_new_format("2024-01-01"));
        assert!(is_new_format("2025-06-30"));
        assert!(!is_new_format("2023-12-31"));
        assert!(!is_new_format("2024-1-1"));
        assert!(!is_new_format("latest"));
    }

    #[test]
    fn both_error_formats() {
        let e = AuthApiError::from(IdentityError::WeakPassword {
            min: 8,
            reasons: vec!["length"],
        });
        assert_eq!(e.status, 422);
        let new = e.body(true);
        assert_eq!(new["code"], "weak_password");
        assert!(new["message"].is_string());
        assert_eq!(new["weak_password"]["reasons"][0], "length");
        let old = e.body(false);
        assert_eq!(old["code"], 422);
        assert_eq!(old["error_code"], "weak_password");
        assert!(old["msg"].is_string());
    }
}
