//! RFC 9457 problem details: the one error shape HTTP clients see.
//!
//! Body (`content-type: application/problem+json`):
//! `{ "type", "title", "status", "detail", "code", "error", "field"? }` where
//! `code` is a stable snake_case reason and `error` repeats `detail` for
//! clients written against a plain `{ "error": "…" }` body.
//!
//! [`ApiError`] is the internal error type of the handlers. Its public part is
//! what [`ApiError::problem`] renders; internal causes (SQL, upstream bodies)
//! are logged with the request id and never sent (the 5xx detail is generic).

use poem::{http::StatusCode, IntoResponse, Response};
use poem_openapi::{payload::Json, Object};

use entity::base::validate::FieldError;

/// Problem details (RFC 9457) plus `code`, `error` and, for validation errors, `field`.
#[derive(Debug, Clone, Object)]
#[oai(example)]
pub struct Problem {
    /// A URI reference naming the problem type (`about:blank` or
    /// `https://httpproblems.com/http-status/<status>` style; here `/problems/<code>`).
    #[oai(rename = "type")]
    pub type_: String,
    /// Short summary of the status (e.g. `Bad Request`).
    pub title: String,
    /// The HTTP status code.
    pub status: u16,
    /// What went wrong, for humans.
    pub detail: String,
    /// Stable snake_case reason: `invalid_email`, `required`, `too_long`,
    /// `invalid_body`, `rate_limited`, `feature_disabled`, `not_configured`,
    /// `already_registered`, `payload_too_large`, `queue_unavailable`,
    /// `database_unavailable`, `internal_error`, …
    pub code: String,
    /// Same text as `detail` (for clients that read `{ "error": "…" }`).
    pub error: String,
    /// The request field at fault, when one is.
    #[oai(skip_serializing_if_is_none)]
    pub field: Option<String>,
}

impl poem_openapi::types::Example for Problem {
    fn example() -> Self {
        Problem::new(
            StatusCode::BAD_REQUEST,
            "invalid_email",
            "email is not a valid email address",
            Some("email"),
        )
    }
}

impl Problem {
    /// Builds a problem.
    pub fn new(
        status: StatusCode,
        code: &str,
        detail: impl Into<String>,
        field: Option<&str>,
    ) -> Self {
        let detail = detail.into();
        Problem {
            type_: format!("/problems/{code}"),
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            status: status.as_u16(),
            error: detail.clone(),
            detail,
            code: code.to_string(),
            field: field.map(str::to_string),
        }
    }

    /// A ready HTTP response (used outside poem-openapi handlers: middleware,
    /// parse errors, unknown routes).
    pub fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = serde_json::json!({
            "type": self.type_, "title": self.title, "status": self.status,
            "detail": self.detail, "code": self.code, "error": self.error,
        });
        let mut body = body;
        if let Some(f) = self.field {
            body["field"] = serde_json::Value::String(f);
        }
        Response::builder()
            .status(status)
            .content_type("application/problem+json")
            .body(body.to_string())
    }
}

/// Rate-limit state reported in `X-RateLimit-*` headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateInfo {
    /// `X-RateLimit-Limit`: requests allowed per window.
    pub limit: u64,
    /// `X-RateLimit-Remaining`: requests allowed right now.
    pub remaining: u64,
    /// `X-RateLimit-Reset`: Unix epoch seconds, rounded up, when the whole
    /// allowance is back; on a 429, when the next request is allowed.
    pub reset: u64,
    /// `Retry-After` seconds (on 429).
    pub retry_after: u64,
}

/// The handlers' error type.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400: a field is invalid.
    #[error("{0}")]
    Field(#[from] FieldError),
    /// 400: the body as a whole is unusable.
    #[error("{0}")]
    BadRequest(String),
    /// 400 with a code: a request that is well-formed but not allowed (`self_demotion`).
    #[error("{1}")]
    Invalid(&'static str, String),
    /// 401 with a code (`missing_token`, `invalid_token`, `token_expired`, …).
    #[error("{1}")]
    Unauthorized(&'static str, String),
    /// 403 with a code: logged in (or holding a token), but not allowed.
    #[error("{1}")]
    Forbidden(&'static str, String),
    /// 404 with a code.
    #[error("{1}")]
    NotFound(&'static str, String),
    /// 409 with a code.
    #[error("{1}")]
    Conflict(&'static str, String),
    /// 422 with a code: well-formed, but conflicts with an earlier request
    /// (`idempotency_key_reused`).
    #[error("{1}")]
    Unprocessable(&'static str, String),
    /// 502 with a code: an upstream (payment provider) failed or answered
    /// something undocumented (`provider_error`); its body is logged, not sent.
    #[error("{1}")]
    BadGateway(&'static str, String),
    /// 413: the body is larger than allowed.
    #[error("{0}")]
    TooLarge(String),
    /// 408 `body_timeout`: the request body arrived too slowly.
    #[error("{0}")]
    BodyTimeout(String),
    /// 429 with the limit state.
    #[error("rate limit exceeded")]
    RateLimited(RateInfo),
    /// 503: the feature is switched off or lacks configuration.
    #[error("{detail}")]
    Unavailable {
        /// `feature_disabled` or `not_configured`, `queue_unavailable`, `database_unavailable`.
        code: &'static str,
        /// Public explanation.
        detail: String,
    },
    /// 500: internal failure; the cause is logged, not sent.
    #[error("internal error: {0}")]
    Internal(String),
}

impl ApiError {
    /// Internal failure with a cause for the log.
    pub fn internal(cause: impl std::fmt::Display) -> Self {
        ApiError::Internal(cause.to_string())
    }

    /// The HTTP status.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Field(_) | ApiError::BadRequest(_) | ApiError::Invalid(..) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthorized(..) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(..) => StatusCode::FORBIDDEN,
            ApiError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::NotFound(..) => StatusCode::NOT_FOUND,
            ApiError::Conflict(..) => StatusCode::CONFLICT,
            ApiError::Unprocessable(..) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::BadGateway(..) => StatusCode::BAD_GATEWAY,
            ApiError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The public problem for this error (logs internal causes).
    pub fn problem(&self) -> Problem {
        let status = self.status();
        match self {
            ApiError::Field(f) => Problem::new(status, f.code, f.message.clone(), Some(f.field)),
            ApiError::BadRequest(m) => Problem::new(status, "invalid_body", m.clone(), None),
            ApiError::Unauthorized(code, m)
            | ApiError::NotFound(code, m)
            | ApiError::Conflict(code, m)
            | ApiError::Unprocessable(code, m)
            | ApiError::BadGateway(code, m)
            | ApiError::Invalid(code, m)
            | ApiError::Forbidden(code, m) => Problem::new(status, code, m.clone(), None),
            ApiError::TooLarge(m) => Problem::new(status, "payload_too_large", m.clone(), None),
            ApiError::BodyTimeout(m) => Problem::new(status, "body_timeout", m.clone(), None),
            ApiError::RateLimited(r) => Problem::new(
                status,
                "rate_limited",
                format!(
                    "rate limit exceeded: {} requests allowed; retry in {} s",
                    r.limit, r.retry_after
                ),
                None,
            ),
            ApiError::Unavailable { code, detail } => {
                Problem::new(status, code, detail.clone(), None)
            }
            ApiError::Internal(cause) => {
                tracing::error!(error = %cause, "internal error");
                Problem::new(
                    status,
                    "internal_error",
                    "the server could not complete the request",
                    None,
                )
            }
        }
    }
}

/// Declares a route's error response enum: one variant per listed status,
/// each `application/problem+json`, and the conversion from [`ApiError`]
/// (a status a route does not list becomes its 500).
#[macro_export]
macro_rules! problem_responses {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $status:literal : $desc:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, poem_openapi::ApiResponse)]
        pub enum $name {
            $(
                #[doc = $desc]
                #[oai(status = $status, content_type = "application/problem+json")]
                $variant(poem_openapi::payload::Json<$crate::problem::Problem>),
            )+
        }

        impl From<$crate::problem::ApiError> for $name {
            fn from(e: $crate::problem::ApiError) -> Self {
                let p = e.problem();
                match p.status {
                    $( $status => $name::$variant(poem_openapi::payload::Json(p)), )+
                    _ => {
                        let p = $crate::problem::ApiError::internal(format!("unmapped status {}", p.status)).problem();
                        $name::InternalServerError(poem_openapi::payload::Json(p))
                    }
                }
            }
        }
    };
}

/// The 429 answer with its headers; routes that are rate limited list it.
#[derive(Debug, poem_openapi::ApiResponse)]
pub enum TooManyRequests {
    /// Rate limit exceeded: wait `Retry-After` seconds.
    #[oai(status = 429, content_type = "application/problem+json")]
    TooManyRequests(
        Json<Problem>,
        /// Requests allowed per window.
        #[oai(header = "X-RateLimit-Limit")]
        u64,
        /// Requests allowed right now (0).
        #[oai(header = "X-RateLimit-Remaining")]
        u64,
        /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
        #[oai(header = "X-RateLimit-Reset")]
        u64,
        /// Seconds to wait before retrying.
        #[oai(header = "Retry-After")]
        u64,
    ),
}

/// An endpoint's result as the response sent: an error that carries its
/// response gives that, any other becomes problem details
/// ([`from_poem_error`]), keeping the operation id (for the metrics' route
/// label).
pub fn answer(result: poem::Result<impl IntoResponse>) -> Response {
    match result {
        Ok(r) => r.into_response(),
        Err(e) if e.is_from_response() => e.into_response(),
        Err(e) => {
            let op = e.data::<poem_openapi::OperationId>().copied();
            let mut r = from_poem_error(e);
            if let Some(op) = op {
                r.set_data(op);
            }
            r
        }
    }
}

/// Converts any error poem or poem-openapi raises outside our handlers (body
/// parse errors, wrong content type, unknown route, body too large, panics)
/// into problem details, naming the field when the parser says which.
pub fn from_poem_error(err: poem::Error) -> Response {
    let status = err.status();
    let raw = err.to_string();
    let (code, detail, field) = match status {
        StatusCode::BAD_REQUEST => classify_parse_error(&raw),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            format!("the body must be JSON (content-type: application/json): {raw}"),
            None,
        ),
        StatusCode::NOT_FOUND => ("not_found", "no such route".to_string(), None),
        StatusCode::UNAUTHORIZED => (
            "missing_token",
            "log in first: send Authorization: Bearer <session token>".to_string(),
            None,
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "method not allowed on this route".to_string(),
            None,
        ),
        StatusCode::PAYLOAD_TOO_LARGE => ("payload_too_large", raw, None),
        s if s.is_server_error() => {
            tracing::error!(error = %raw, status = s.as_u16(), "unhandled server error");
            (
                "internal_error",
                "the server could not complete the request".to_string(),
                None,
            )
        }
        _ => ("bad_request", raw, None),
    };
    // A missing or wrong content type is reported by poem-openapi as 400/415:
    // clients see 415 only when they sent some other type.
    let status = if code == "unsupported_media_type" {
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    } else {
        status
    };
    let status = if status.is_server_error() || status.is_client_error() {
        status
    } else {
        StatusCode::BAD_REQUEST
    };
    Problem::new(status, code, detail, field.as_deref()).into_response()
}

/// Finds the offending field in a poem-openapi / serde parse message.
fn classify_parse_error(raw: &str) -> (&'static str, String, Option<String>) {
    // A header or query parameter poem-openapi refused (its validators).
    if let Some(p) = backticked_after(raw, "failed to parse parameter ") {
        return ("invalid_parameter", format!("{p} is not valid"), Some(p));
    }
    let field = backticked_after(raw, "missing field ")
        .map(|f| ("required", f))
        .or_else(|| backticked_after(raw, "unknown field ").map(|f| ("unknown_field", f)))
        .or_else(|| quoted_field(raw).map(|f| ("invalid_type", f)));
    match field {
        Some((code, f)) => {
            let detail = match code {
                "required" => format!("{f} is required"),
                "unknown_field" => format!("{f} is not a known field"),
                _ => format!("{f} has the wrong type or format"),
            };
            (code, detail, Some(f))
        }
        None => {
            let detail = if raw.contains("content type") || raw.contains("Content-Type") {
                "the body must be JSON (content-type: application/json)".to_string()
            } else {
                "the request body is not valid JSON of the expected shape".to_string()
            };
            ("invalid_body", detail, None)
        }
    }
}

fn backticked_after(raw: &str, marker: &str) -> Option<String> {
    let rest = &raw[raw.find(marker)? + marker.len()..];
    let rest = rest.strip_prefix('`')?;
    Some(rest[..rest.find('`')?].to_string())
}

/// poem-openapi reports a bad field value as `failed to parse "field": …` or
/// `… (occurred while parsing "Type" field "field")`; take the field's name.
fn quoted_field(raw: &str) -> Option<String> {
    let i = raw.find("field \"")? + "field \"".len();
    let rest = &raw[i..];
    Some(rest[..rest.find('"')?].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_missing_and_unknown_fields() {
        let (c, _, f) = classify_parse_error("parse request payload error: failed to parse \"ContactRequest\": missing field `email`");
        assert_eq!((c, f.as_deref()), ("required", Some("email")));
        let (c, _, f) = classify_parse_error(
            "failed to parse \"X\": unknown field `admin`, expected one of `a`",
        );
        assert_eq!((c, f.as_deref()), ("unknown_field", Some("admin")));
        let (c, _, f) = classify_parse_error("garbage");
        assert_eq!((c, f), ("invalid_body", None));
    }
}
