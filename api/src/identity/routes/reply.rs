//! [`AuthResult`]: a route's answer or its [`AuthApiError`], with the
//! rate-limit headers on success and request-parse errors turned into
//! 400 `validation_failed` in the platform's format.

use poem::{http::HeaderValue, IntoResponse, Response};
use poem_openapi::{
    registry::{MetaHeader, MetaResponses, Registry},
    types::Type,
    ApiResponse,
};

use crate::{identity::AuthApiError, problem::RateInfo};

/// The answer of an `/auth/v1` route.
pub enum AuthResult<T> {
    /// Success, with the rate-limit headers of a limited route.
    Ok(T, Option<RateInfo>),
    /// The platform's error.
    Err(AuthApiError),
}

impl<T> From<Result<(T, Option<RateInfo>), AuthApiError>> for AuthResult<T> {
    fn from(r: Result<(T, Option<RateInfo>), AuthApiError>) -> Self {
        match r {
            Ok((t, rate)) => AuthResult::Ok(t, rate),
            Err(e) => AuthResult::Err(e),
        }
    }
}

fn rate_headers() -> Vec<MetaHeader> {
    [
        (
            "X-RateLimit-Limit",
            "Requests allowed per window (limited routes).",
        ),
        (
            "X-RateLimit-Remaining",
            "Requests allowed right now (limited routes).",
        ),
        (
            "X-RateLimit-Reset",
            "Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed (limited routes).",
        ),
    ]
    .into_iter()
    .map(|(name, d)| MetaHeader {
        name: name.into(),
        description: Some(d.into()),
        required: false,
        deprecated: false,
        schema: u64::schema_ref(),
    })
    .collect()
}

impl<T: ApiResponse> ApiResponse for AuthResult<T> {
    const BAD_REQUEST_HANDLER: bool = true;

    fn meta() -> MetaResponses {
        let mut meta = T::meta();
        for r in &mut meta.responses {
            r.headers.extend(rate_headers());
        }
        meta.responses.extend(AuthApiError::meta().responses);
        meta
    }

    fn register(registry: &mut Registry) {
        T::register(registry);
        AuthApiError::register(registry);
    }

    fn from_parse_request_error(err: poem::Error) -> Self {
        AuthResult::Err(AuthApiError::validation(err.to_string()))
    }
}

impl<T: IntoResponse> IntoResponse for AuthResult<T> {
    fn into_response(self) -> Response {
        match self {
            AuthResult::Ok(t, rate) => {
                let mut resp = t.into_response();
                if let Some(i) = rate {
                    let h = resp.headers_mut();
                    h.insert("x-ratelimit-limit", HeaderValue::from(i.limit));
                    h.insert("x-ratelimit-remaining", HeaderValue::from(i.remaining));
                    h.insert("x-ratelimit-reset", HeaderValue::from(i.reset));
                }
                resp
            }
            AuthResult::Err(e) => e.into_response(),
        }
    }
}
