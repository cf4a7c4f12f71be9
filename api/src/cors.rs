//! CORS for a frontend on another origin (`CORS_ALLOWED_ORIGINS`).
//!
//! Scope: `/api/*` (but never the payment providers' `/api/webhooks/*`),
//! `/auth/v1/*` and `/storage/v1/*`. `/auth/confirm` (the cookie session) and
//! `/metrics` stay same-site only.
//!
//! poem's [`Cors`] answers the requests whose `Origin` is listed: a
//! preflight (`OPTIONS` with `Access-Control-Request-Method`) gets 200 with
//! the allowed methods and request headers; any other request the normal
//! answer plus `Access-Control-Allow-Origin` and `Access-Control-Expose-Headers`.
//! Where poem's semantics do not fit, this wrapper decides instead:
//! - an empty list means no CORS at all (poem would allow every origin);
//! - an origin not listed (a same-origin `POST` carries `Origin` too) gets
//!   the normal answer without CORS headers (poem would answer 403), and a
//!   preflight from it goes on to the route (405, as without CORS);
//! - every answer in scope that carries `Origin` gets `Vary: Origin` (poem
//!   adds it only for origins matched by a pattern).
//!
//! Credentials (cookies) are not allowed across origins: a frontend on
//! another origin sends `Authorization: Bearer` (auth-js keeps its session
//! itself).

use std::{collections::HashSet, future::Future};

use futures::{future::Either, FutureExt as _};

use poem::{
    http::{header, HeaderValue, Method},
    middleware::{Cors, CorsEndpoint},
    Endpoint, EndpointExt as _, IntoResponse, Middleware, Request, Response, Result,
};

/// Methods a page may use.
pub const ALLOW_METHODS: [Method; 6] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::PATCH,
    Method::DELETE,
];

/// Request headers a page may send (besides the CORS-safelisted ones).
pub const ALLOW_HEADERS: [&str; 7] = [
    "authorization",
    "content-type",
    "idempotency-key",
    "apikey",
    "x-client-info",
    "x-supabase-api-version",
    "x-upsert",
];

/// Response headers a page may read.
pub const EXPOSE_HEADERS: [&str; 8] = [
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "retry-after",
    "x-request-id",
    "idempotent-replayed",
    "etag",
    "x-supabase-api-version",
];

/// How long a browser may cache a preflight, in seconds (2 hours, Chromium's cap).
pub const MAX_AGE_SECS: i32 = 7200;

/// Whether `path` is served with CORS.
pub fn in_scope(path: &str) -> bool {
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    (under("/api") && !under("/api/webhooks")) || under("/auth/v1") || under("/storage/v1")
}

/// The CORS layer (see the module documentation); `origins` as
/// [`entity::base::settings::parse_origins`] returns them.
pub struct CorsLayer {
    origins: HashSet<String>,
}

impl CorsLayer {
    /// CORS for exactly these origins; none = no CORS.
    pub fn new(origins: &[String]) -> Self {
        CorsLayer {
            origins: origins.iter().cloned().collect(),
        }
    }
}

impl<E: Endpoint> Middleware<E> for CorsLayer {
    type Output = CorsLayerEndpoint<E>;

    fn transform(&self, ep: E) -> Self::Output {
        let ep = std::sync::Arc::new(ep);
        let cors = Cors::new()
            .allow_origins(self.origins.iter().map(String::as_str))
            .allow_methods(ALLOW_METHODS)
            .allow_headers(ALLOW_HEADERS)
            .expose_headers(EXPOSE_HEADERS)
            .allow_credentials(false)
            .max_age(MAX_AGE_SECS);
        CorsLayerEndpoint {
            cors: (!self.origins.is_empty()).then(|| ep.clone().with(cors)),
            origins: self.origins.clone(),
            inner: ep,
        }
    }
}

/// Endpoint of [`CorsLayer`].
pub struct CorsLayerEndpoint<E> {
    inner: std::sync::Arc<E>,
    cors: Option<CorsEndpoint<std::sync::Arc<E>>>,
    origins: HashSet<String>,
}

fn add_vary_origin(resp: &mut Response) {
    let already = resp
        .headers()
        .get_all(header::VARY)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case("origin") || v.trim() == "*");
    if !already {
        resp.headers_mut()
            .append(header::VARY, HeaderValue::from_static("Origin"));
    }
}

/// The answer (an error as its response), with `Vary: Origin`.
fn with_vary_origin(result: Result<impl IntoResponse>) -> Result<Response> {
    let mut resp = result
        .map(IntoResponse::into_response)
        .unwrap_or_else(|e| e.into_response());
    add_vary_origin(&mut resp);
    Ok(resp)
}

impl<E: Endpoint> Endpoint for CorsLayerEndpoint<E> {
    type Output = Response;

    fn call(&self, req: Request) -> impl Future<Output = Result<Self::Output>> + Send {
        // (Combinators, not an `async fn`: see `crate::middleware`.)
        let direct = |req| {
            Either::Left(
                self.inner
                    .call(req)
                    .map(|r| r.map(IntoResponse::into_response)),
            )
        };
        let Some(cors) = &self.cors else {
            return direct(req);
        };
        if !in_scope(req.uri().path()) {
            return direct(req);
        }
        let Some(origin) = req.headers().get(header::ORIGIN) else {
            // Not a cross-origin request, but the answer would differ with `Origin`.
            return Either::Right(Either::Left(self.inner.call(req).map(with_vary_origin)));
        };
        let listed = origin.to_str().is_ok_and(|o| self.origins.contains(o));
        let preflight = req.method() == Method::OPTIONS
            && req
                .headers()
                .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD);
        let resp = if listed && (preflight || req.method() != Method::OPTIONS) {
            // A preflight asking for a method or headers not allowed gets
            // poem's 403: the browser refuses the request either way.
            Either::Left(cors.call(req).map(with_vary_origin))
        } else {
            Either::Right(self.inner.call(req).map(with_vary_origin))
        };
        Either::Right(Either::Right(resp))
    }
}

#[cfg(test)]
mod tests {
    use super::in_scope;

    #[test]
    fn scope() {
        for p in [
            "/api",
            "/api/me",
            "/api/openapi.json",
            "/auth/v1/signup",
            "/storage/v1/object/public/avatars/x/avatar",
        ] {
            assert!(in_scope(p), "{p}");
        }
        for p in [
            "/api/webhooks/provider-a",
            "/api/webhooks",
            "/auth/confirm",
            "/metrics",
            "/apix",
            "/auth/v10",
        ] {
            assert!(!in_scope(p), "{p}");
        }
    }
}
