//! One file per resource. Handlers are thin: parse → one model or queue call → answer.

use poem_openapi::{Object, Tags};

pub mod accounts;
pub mod ai;
pub mod billing;
pub mod forms;
pub mod ops;
pub mod page;

use crate::problem::ApiError;

/// OpenAPI tags.
#[derive(Tags)]
pub enum ApiTags {
    /// No login needed: contact form, waitlist, health.
    Public,
    /// Logged-in user (Bearer session token).
    User,
    /// Admins only.
    Admin,
    /// File storage: signed uploads and public files (the `avatars` bucket).
    Storage,
    /// Payment-provider callbacks: signed by the provider, no session.
    Webhooks,
    /// AI chat and generation (logged-in user, per-plan limits).
    Ai,
    /// The built-in identity provider (`/auth/v1`, the hosted auth platform's protocol).
    Auth,
}

/// Maps a database error: unavailable ([`entity::base::db::is_unavailable`]: no
/// connection, a connection lost mid-statement, a server shutting down or
/// full) → 503 `database_unavailable`, anything else → 500 (cause logged, not
/// sent).
pub fn db_error(what: &str, e: sea_orm::DbErr) -> ApiError {
    if entity::base::db::is_unavailable(&e) {
        tracing::error!(error = %e, "{what}: database unavailable");
        return ApiError::Unavailable {
            code: "database_unavailable",
            detail: "the database is unreachable; try again shortly".into(),
        };
    }
    ApiError::internal(format!("{what}: {e}"))
}

/// `{ "success": true }`.
#[derive(Debug, Clone, Object)]
pub struct Success {
    /// Always `true`.
    pub success: bool,
}

impl Success {
    /// `{ "success": true }`
    pub fn yes() -> Self {
        Success { success: true }
    }
}

/// The rate-limit headers of a limited route's success answer.
#[macro_export]
macro_rules! limited_ok {
    ($(#[$meta:meta])* $name:ident, $payload:ty, $desc:literal) => {
        $(#[$meta])*
        #[derive(Debug, poem_openapi::ApiResponse)]
        pub enum $name {
            #[doc = $desc]
            #[oai(status = 200)]
            Ok(
                poem_openapi::payload::Json<$payload>,
                /// Requests allowed per window.
                #[oai(header = "X-RateLimit-Limit")]
                u64,
                /// Requests allowed right now.
                #[oai(header = "X-RateLimit-Remaining")]
                u64,
                /// Unix epoch seconds, rounded up, when the whole allowance is back; on a 429, when the next request is allowed.
                #[oai(header = "X-RateLimit-Reset")]
                u64,
            ),
            /// Rate limit exceeded: wait `Retry-After` seconds.
            #[oai(status = 429, content_type = "application/problem+json")]
            TooManyRequests(
                poem_openapi::payload::Json<$crate::problem::Problem>,
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

        impl $name {
            /// Maps the inner function's result: success and 429 are answers of
            /// this enum, every other error goes to the route's error enum.
            pub fn from_result<E: From<$crate::problem::ApiError>>(
                r: Result<($payload, $crate::problem::RateInfo), $crate::problem::ApiError>,
            ) -> Result<Self, E> {
                match r {
                    Ok((body, i)) => Ok($name::Ok(poem_openapi::payload::Json(body), i.limit, i.remaining, i.reset)),
                    Err(e @ $crate::problem::ApiError::RateLimited(i)) => Ok($name::TooManyRequests(
                        poem_openapi::payload::Json(e.problem()),
                        i.limit,
                        i.remaining,
                        i.reset,
                        i.retry_after,
                    )),
                    Err(e) => Err(e.into()),
                }
            }
        }
    };
}
