//! `GET /auth/confirm`: the interface's auth callback page route.
//!
//! A link from an auth email (`?token_hash=…&type=signup`) or the return of a
//! PKCE flow (`?code=…`) lands here. On success the session is set as an
//! HttpOnly cookie pair ([`ACCESS_COOKIE`], [`REFRESH_COOKIE`]) and the
//! browser is sent (303) to `next`, a path on `APP_URL`'s origin
//! ([`entity::identity::redirect::safe_next`]: anything else becomes `/`). Every
//! failure — auth switched off or not configured, a missing or unknown
//! parameter, a used or expired link, no PKCE verifier, the auth service
//! unreachable, too many attempts — is a 303 to
//! `{APP_URL}/auth/error?error=<message>&error_code=<code>`: a page route never
//! answers JSON.
//!
//! Two backends ([`Backend`]):
//! * the built-in provider (`state.idp`), called in process;
//! * an external auth platform (`NEXT_PUBLIC_BACKEND_URL` +
//!   `NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY`, built-in provider off):
//!   `POST {url}/auth/v1/verify` `{type, token_hash}` and
//!   `POST {url}/auth/v1/token?grant_type=pkce` `{auth_code, code_verifier}`
//!   with the `apikey` header; both answer the platform's session JSON
//!   (`access_token`, `refresh_token`, `expires_in`, …).
//!
//! PKCE: the code verifier never leaves the browser except in the cookie the
//! auth client library writes. `@supabase/ssr` (`createBrowserClient`) keeps
//! auth-js storage in cookies, so `signInWithOtp` / `signInWithOAuth` /
//! `resetPasswordForEmail` with `flowType: 'pkce'` store the verifier under
//! `<storageKey>-code-verifier` (storage key `sb-<first label of the auth
//! URL's host>-auth-token`), the value JSON-encoded (`"<verifier>"` or
//! `"<verifier>/PASSWORD_RECOVERY"`), `base64-`-prefixed base64url by default,
//! split into `.0`, `.1`, … chunks past 3,180 bytes. [`code_verifier`] reads
//! exactly that; on success the cookie is expired.
//!
//! Why this file is long: a sixth of it is the unit tests of those cookie
//! and verifier formats, which belong beside the code that reads them; the
//! route itself is one flow (two backends, one redirect shape).

use std::{
    sync::OnceLock,
    time::{Duration, Instant},
};

use base64::{
    alphabet,
    engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig},
    Engine as _,
};
use entity::{identity::redirect::safe_next, Feature};
use poem::{
    http::{header, HeaderValue, StatusCode},
    web::Data,
    IntoResponse, Request, Response,
};
use poem_openapi::{
    param::Query,
    registry::{MetaHeader, MetaResponse, MetaResponses, Registry},
    types::Type,
    ApiResponse, OpenApi,
};
use serde_json::{json, Value};

use crate::routes::ApiTags;
use crate::{rate_limit::Limit, state::AppState};

/// Cookie holding the session's access token (a JWT), HttpOnly.
pub const ACCESS_COOKIE: &str = "sb-access-token";
/// Cookie holding the session's refresh token, HttpOnly.
pub const REFRESH_COOKIE: &str = "sb-refresh-token";
/// `Max-Age` of the refresh-token cookie: 400 days (the longest a browser
/// keeps a cookie, and `@supabase/ssr`'s default). Refresh tokens do not
/// expire by time; a revoked session's token stops working at once.
pub const REFRESH_COOKIE_MAX_AGE_SECS: u64 = 400 * 24 * 3600;
/// The `type` values of an email link.
pub const CONFIRM_TYPES: &[&str] = &[
    "signup",
    "email",
    "magiclink",
    "recovery",
    "invite",
    "email_change",
];
/// Window of the per-IP limit on attempts that reach the auth backend
/// (`AUTH_RATE_LIMIT_PER_5MIN` attempts, as on `/auth/v1/verify`).
const CONFIRM_WINDOW: Duration = Duration::from_secs(300);
/// Longest `token_hash` / `code` / verifier accepted.
const MAX_PARAM_LEN: usize = 512;
/// Timeouts of a call to an external auth platform.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest session answer read from an external auth platform.
const MAX_ANSWER_BYTES: usize = 64 * 1024;
/// Longest error message put into the error redirect.
const MAX_MESSAGE_CHARS: usize = 200;

/// Why `/auth/confirm` sends the browser to the error page: a stable code
/// and a message for people.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmError {
    /// Stable snake_case reason (`auth_disabled`, `otp_expired`, …).
    pub code: String,
    /// What went wrong, for the error page.
    pub message: String,
}

impl ConfirmError {
    fn new(code: &str, message: impl Into<String>) -> Self {
        let message: String = message.into();
        ConfirmError {
            code: code.to_owned(),
            message: message.chars().take(MAX_MESSAGE_CHARS).collect(),
        }
    }
}

/// A session as the auth backend answered it (the platform's session JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The access token (JWT).
    pub access_token: String,
    /// The opaque refresh token.
    pub refresh_token: String,
    /// Seconds the access token stays valid.
    pub expires_in: u64,
}

impl Session {
    /// Reads `access_token`, `refresh_token` and `expires_in` (default 3600)
    /// from the platform's session JSON; `None` when a token is missing or
    /// not cookie-safe text.
    pub fn from_json(v: &Value) -> Option<Session> {
        let text = |k: &str| {
            v[k].as_str()
                .filter(|s| !s.is_empty() && s.len() <= 8 * 1024 && s.bytes().all(cookie_octet))
                .map(str::to_owned)
        };
        Some(Session {
            access_token: text("access_token")?,
            refresh_token: text("refresh_token")?,
            expires_in: v["expires_in"].as_u64().filter(|n| *n > 0).unwrap_or(3600),
        })
    }
}

/// RFC 6265 `cookie-octet`: what a cookie value may hold unquoted.
fn cookie_octet(b: u8) -> bool {
    matches!(b, 0x21 | 0x23..=0x2B | 0x2D..=0x3A | 0x3C..=0x5B | 0x5D..=0x7E)
}

/// Where `/auth/confirm` checks a link or a code.
pub enum Backend<'a> {
    /// The built-in identity provider.
    BuiltIn(&'a crate::identity::Idp),
    /// An external auth platform at `url` (no trailing slash) with its publishable key.
    External {
        /// `NEXT_PUBLIC_BACKEND_URL`.
        url: &'a str,
        /// `NEXT_PUBLIC_BACKEND_PUBLISHABLE_KEY`.
        key: &'a str,
    },
}

impl Backend<'_> {
    /// The backend of this deployment, or the error redirect's reason.
    fn of(state: &AppState) -> Result<Backend<'_>, ConfirmError> {
        let auth = state.features.get(Feature::Auth);
        if auth.disabled_by_flag {
            return Err(ConfirmError::new(
                "auth_disabled",
                "Sign-in is switched off on this site",
            ));
        }
        if let Some(idp) = state.idp.as_deref() {
            return Ok(Backend::BuiltIn(idp));
        }
        match (
            &state.settings.backend_url,
            &state.settings.backend_publishable_key,
        ) {
            (Some(url), Some(key)) if auth.ready() => Ok(Backend::External {
                url: url.trim_end_matches('/'),
                key,
            }),
            _ => Err(ConfirmError::new(
                "auth_not_configured",
                "Sign-in is not configured on this site",
            )),
        }
    }

    /// Checks an email link's `token_hash` of `kind`.
    async fn verify(&self, kind: &str, token_hash: &str) -> Result<Session, ConfirmError> {
        match self {
            Backend::BuiltIn(idp) => built_in(
                idp.verify_token_hash(kind, token_hash)
                    .await
                    .and_then(|v| match v {
                        crate::identity::Verified::Session(s) => Ok(*s),
                        // The first half of an email change signs no one in.
                        crate::identity::Verified::Message(m) => {
                            Err(crate::identity::AuthApiError::new(
                                400,
                                "email_change_confirmation_pending",
                                m,
                            ))
                        }
                    }),
            ),
            Backend::External { url, key } => {
                external(
                    &format!("{url}/auth/v1/verify"),
                    key,
                    &json!({ "type": kind, "token_hash": token_hash }),
                )
                .await
            }
        }
    }

    /// Exchanges a PKCE `code` with its verifier.
    async fn exchange(&self, code: &str, verifier: &str) -> Result<Session, ConfirmError> {
        match self {
            Backend::BuiltIn(idp) => built_in(idp.exchange_pkce(code, verifier).await),
            Backend::External { url, key } => {
                external(
                    &format!("{url}/auth/v1/token?grant_type=pkce"),
                    key,
                    &json!({ "auth_code": code, "code_verifier": verifier }),
                )
                .await
            }
        }
    }
}

/// The built-in provider's answer as a [`Session`] or a [`ConfirmError`]
/// (its 5xx as "unavailable", never its internals).
fn built_in(
    r: Result<crate::identity::SessionGrant, crate::identity::AuthApiError>,
) -> Result<Session, ConfirmError> {
    match r {
        Ok(grant) => serde_json::to_value(&grant)
            .ok()
            .as_ref()
            .and_then(Session::from_json)
            .ok_or_else(|| {
                tracing::error!("the built-in provider's session is not cookie-safe");
                unavailable()
            }),
        Err(e) if e.status >= 500 => {
            tracing::warn!(error = %e, "built-in provider failed during /auth/confirm");
            Err(unavailable())
        }
        Err(e) => Err(ConfirmError::new(e.code, e.message)),
    }
}

/// The one HTTP client for external auth platforms: bounded connect and
/// total time, no redirects followed.
fn http() -> Result<&'static reqwest::Client, ConfirmError> {
    static CLIENT: OnceLock<Result<reqwest::Client, String>> = OnceLock::new();
    CLIENT
        .get_or_init(|| {
            reqwest::Client::builder()
                .connect_timeout(CONNECT_TIMEOUT)
                .timeout(CALL_TIMEOUT)
                .redirect(reqwest::redirect::Policy::none())
                .user_agent(concat!("subscription-backend/", env!("CARGO_PKG_VERSION")))
                .build()
                .map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| {
            tracing::error!(error = %e, "no HTTP client for the auth platform");
            unavailable()
        })
}

fn unavailable() -> ConfirmError {
    ConfirmError::new(
        "auth_unavailable",
        "The sign-in service is unavailable; try the link again in a moment",
    )
}

/// `POST url` with `body` to an external auth platform; its session JSON,
/// or its error (`{code, message}`, `{code, error_code, msg}` or
/// `{error, error_description}`) as a [`ConfirmError`].
async fn external(url: &str, key: &str, body: &Value) -> Result<Session, ConfirmError> {
    let resp = http()?
        .post(url)
        .header("apikey", key)
        .header("x-supabase-api-version", "2024-01-01")
        .header(reqwest::header::ACCEPT, "application/json")
        .json(body)
        .send()
        .await
        .map_err(|e| {
            tracing::warn!(%url, error = %e, "auth platform unreachable");
            unavailable()
        })?;
    let status = resp.status();
    let answer = read_json(resp).await;
    if status.is_success() {
        return answer.as_ref().and_then(Session::from_json).ok_or_else(|| {
            tracing::warn!(%url, %status, "auth platform answered no usable session");
            unavailable()
        });
    }
    if status.is_client_error() {
        let v = answer.unwrap_or(Value::Null);
        let code = ["error_code", "code", "error"]
            .iter()
            .find_map(|k| v[*k].as_str().filter(|s| is_code(s)))
            .unwrap_or("verification_failed");
        let message = ["msg", "message", "error_description"]
            .iter()
            .find_map(|k| v[*k].as_str().filter(|s| !s.trim().is_empty()))
            .unwrap_or("The link or code is invalid or has expired");
        tracing::info!(%url, %status, code, "auth platform refused the confirmation");
        return Err(ConfirmError::new(code, message));
    }
    tracing::warn!(%url, %status, "auth platform failed");
    Err(unavailable())
}

/// A snake_case error code of at most 64 characters.
fn is_code(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// The body as JSON, read up to [`MAX_ANSWER_BYTES`]; `None` when larger,
/// unreadable or not JSON.
async fn read_json(mut resp: reqwest::Response) -> Option<Value> {
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_ANSWER_BYTES as u64)
    {
        return None;
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.ok()? {
        if body.len() + chunk.len() > MAX_ANSWER_BYTES {
            return None;
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).ok()
}

// ---------------------------------------------------------------------------
// The PKCE verifier cookie
// ---------------------------------------------------------------------------

/// The cookies of a request as (name, value) pairs, every `Cookie` header.
pub fn request_cookies(req: &Request) -> Vec<(String, String)> {
    req.headers()
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| {
            let (name, value) = pair.split_once('=')?;
            let name = name.trim();
            (!name.is_empty()).then(|| (name.to_owned(), value.trim().trim_matches('"').to_owned()))
        })
        .collect()
}

/// The auth client's storage key for an auth server at `base_url`:
/// `sb-<first label of its host>-auth-token` (supabase-js's default).
pub fn storage_key(base_url: &str) -> Option<String> {
    let url = url::Url::parse(base_url).ok()?;
    let host = url.host_str()?;
    let first = host.split('.').next().filter(|s| !s.is_empty())?;
    Some(format!("sb-{first}-auth-token"))
}

/// The PKCE code verifier the browser's auth client stored in a cookie, and
/// the cookie names it was read from (to expire them).
///
/// Looks for `<storage key>-code-verifier` (or its chunks `.0`, `.1`, …),
/// trying the `preferred` storage keys first, then any `sb-…` key when
/// exactly one such verifier cookie is present. The value is
/// percent-decoded, `base64-` + base64url decoded when so prefixed,
/// JSON-decoded when it is a JSON string, and cut at `/` (auth-js appends
/// `/PASSWORD_RECOVERY`). `None` when absent, ambiguous or not a valid
/// RFC 7636 verifier (43–128 of `A-Z a-z 0-9 - . _ ~`).
pub fn code_verifier(
    cookies: &[(String, String)],
    preferred: &[String],
) -> Option<(String, Vec<String>)> {
    const SUFFIX: &str = "-code-verifier";
    let base_of = |name: &str| -> Option<String> {
        let base = match name.rsplit_once('.') {
            Some((b, n)) if !n.is_empty() && n.bytes().all(|c| c.is_ascii_digit()) => b,
            _ => name,
        };
        (base.starts_with("sb-") && base.ends_with(SUFFIX)).then(|| base.to_owned())
    };
    let mut bases: Vec<String> = cookies.iter().filter_map(|(n, _)| base_of(n)).collect();
    bases.sort();
    bases.dedup();
    let chosen = preferred
        .iter()
        .map(|k| format!("{k}{SUFFIX}"))
        .find(|k| bases.contains(k))
        .or_else(|| (bases.len() == 1).then(|| bases[0].clone()))?;

    let get = |name: &str| {
        cookies
            .iter()
            .find(|(n, v)| n == name && !v.is_empty())
            .map(|(_, v)| v.as_str())
    };
    let mut used = Vec::new();
    let raw = if let Some(v) = get(&chosen) {
        used.push(chosen.clone());
        v.to_owned()
    } else {
        let mut joined = String::new();
        for i in 0..16 {
            let name = format!("{chosen}.{i}");
            let Some(v) = get(&name) else { break };
            joined.push_str(v);
            used.push(name);
        }
        joined
    };
    let verifier = decode_verifier(&raw)?;
    Some((verifier, used))
}

fn decode_verifier(raw: &str) -> Option<String> {
    let text = percent_decode(raw)?;
    let text = match text.strip_prefix("base64-") {
        Some(b64) => {
            let engine = GeneralPurpose::new(
                &alphabet::URL_SAFE,
                GeneralPurposeConfig::new()
                    .with_decode_padding_mode(DecodePaddingMode::Indifferent),
            );
            String::from_utf8(engine.decode(b64.trim()).ok()?).ok()?
        }
        None => text,
    };
    let text = match serde_json::from_str::<Value>(&text) {
        Ok(Value::String(s)) => s,
        _ => text,
    };
    let verifier = text.split('/').next().unwrap_or_default().trim();
    let valid = (43..=128).contains(&verifier.len())
        && verifier
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~'));
    valid.then(|| verifier.to_owned())
}

/// Decodes `%XX` escapes; `None` when an escape is broken or the result is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

// ---------------------------------------------------------------------------
// The answer: always a 303
// ---------------------------------------------------------------------------

/// The answer of `/auth/confirm`: 303 to `location`, with `Set-Cookie`
/// headers (the session pair on success, an expired verifier cookie), and
/// `Cache-Control: no-store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfirmRedirect {
    /// Absolute URL the browser goes to.
    pub location: String,
    /// One `Set-Cookie` value each.
    pub cookies: Vec<String>,
}

impl ConfirmRedirect {
    /// 303 to `{app_url}/auth/error?error=<message>&error_code=<code>`, no cookies.
    pub fn error(app_url: &str, e: &ConfirmError) -> Self {
        ConfirmRedirect {
            location: error_url(app_url, e),
            cookies: Vec::new(),
        }
    }
}

/// `{app_url}/auth/error?error=<message>&error_code=<code>` (form-encoded).
pub fn error_url(app_url: &str, e: &ConfirmError) -> String {
    let base = app_url.trim_end_matches('/');
    match url::Url::parse(&format!("{base}/auth/error")) {
        Ok(mut u) => {
            u.query_pairs_mut()
                .append_pair("error", &e.message)
                .append_pair("error_code", &e.code);
            u.into()
        }
        Err(_) => format!("{base}/auth/error"),
    }
}

/// One `Set-Cookie` value: `Path=/`, `HttpOnly`, `SameSite=Lax`, `Secure`
/// when `secure`.
pub fn set_cookie(name: &str, value: &str, max_age: u64, http_only: bool, secure: bool) -> String {
    let mut c = format!("{name}={value}; Path=/; Max-Age={max_age}; SameSite=Lax");
    if http_only {
        c.push_str("; HttpOnly");
    }
    if secure {
        c.push_str("; Secure");
    }
    c
}

/// The session cookie pair for `s`.
pub fn session_cookies(s: &Session, secure: bool) -> [String; 2] {
    [
        set_cookie(ACCESS_COOKIE, &s.access_token, s.expires_in, true, secure),
        set_cookie(
            REFRESH_COOKIE,
            &s.refresh_token,
            REFRESH_COOKIE_MAX_AGE_SECS,
            true,
            secure,
        ),
    ]
}

impl IntoResponse for ConfirmRedirect {
    fn into_response(self) -> Response {
        let mut resp = Response::builder()
            .status(StatusCode::SEE_OTHER)
            .header(header::CACHE_CONTROL, "no-store")
            .header(header::REFERRER_POLICY, "no-referrer")
            .finish();
        if let Ok(v) = HeaderValue::from_str(&self.location) {
            resp.headers_mut().insert(header::LOCATION, v);
        }
        for c in &self.cookies {
            if let Ok(v) = HeaderValue::from_str(c) {
                resp.headers_mut().append(header::SET_COOKIE, v);
            }
        }
        resp
    }
}

impl ApiResponse for ConfirmRedirect {
    fn meta() -> MetaResponses {
        let header = |name: &str, description: &str, required: bool| MetaHeader {
            name: name.to_owned(),
            description: Some(description.to_owned()),
            required,
            deprecated: false,
            schema: String::schema_ref(),
        };
        MetaResponses {
            responses: vec![MetaResponse {
                description: "Always a redirect. Success: to `next` on `APP_URL`'s origin, with the \
                    session set as two cookies. Failure (auth switched off or not configured, a missing \
                    or unknown parameter, a used or expired link, no PKCE verifier cookie, the auth \
                    service unreachable, more than `AUTH_RATE_LIMIT_PER_5MIN` (default 30) attempts per 5 minutes from one IP): to \
                    `{APP_URL}/auth/error?error=<message>&error_code=<code>`, no session cookie.",
                status: Some(303),
                status_range: None,
                content: vec![],
                headers: vec![
                    header(
                        "Location",
                        "`next` resolved on `APP_URL`'s origin (`/` when absent or on another origin), \
                         or the error page `{APP_URL}/auth/error?error=…&error_code=…`.",
                        true,
                    ),
                    header(
                        "Set-Cookie",
                        "On success, two headers: `sb-access-token=<JWT>` (`Max-Age` = the token's \
                         `expires_in`) and `sb-refresh-token=<token>` (`Max-Age` = 400 days), both \
                         `Path=/; HttpOnly; SameSite=Lax`, plus `Secure` when `APP_URL` is https. After \
                         a PKCE exchange, also the verifier cookie expired (`Max-Age=0`).",
                        false,
                    ),
                    header("Cache-Control", "`no-store`.", true),
                ],
            }],
        }
    }

    fn register(_registry: &mut Registry) {}
}

// ---------------------------------------------------------------------------
// The route
// ---------------------------------------------------------------------------

/// The auth callback page route.
pub struct ConfirmApi;

#[OpenApi]
impl ConfirmApi {
    /// Confirm an email link or a PKCE code and start the browser session
    ///
    /// The auth callback page route (not under `/api`). With `token_hash` and
    /// `type` it verifies an email link (sign-up confirmation, magic link,
    /// recovery, invite, email change); with `code` it completes a PKCE flow,
    /// taking the code verifier from the cookie the auth client library
    /// (`@supabase/ssr`) wrote: `sb-<ref>-auth-token-code-verifier` (see the
    /// docs/identity.md, "`/auth/confirm` and the session cookie"). The check goes to the built-in identity provider, or, when
    /// only an external auth platform is configured, to its
    /// `/auth/v1/verify` and `/auth/v1/token?grant_type=pkce`. On success the
    /// session is set as the HttpOnly cookies `sb-access-token` and
    /// `sb-refresh-token`, which every logged-in route accepts in place of
    /// `Authorization: Bearer` (`CookieAuth`). Always answers 303, never a
    /// body.
    #[oai(
        path = "/auth/confirm",
        method = "get",
        operation_id = "authConfirm",
        tag = "ApiTags::Public"
    )]
    async fn confirm(
        &self,
        state: Data<&AppState>,
        req: &Request,
        /// The token hash of the email link (`{{ .TokenHash }}`); with `type`.
        token_hash: Query<Option<String>>,
        /// The link's kind: `signup`, `email`, `magiclink`, `recovery`,
        /// `invite` or `email_change`; with `token_hash`.
        #[oai(name = "type")]
        kind: Query<Option<String>>,
        /// A PKCE authorization code (instead of `token_hash` and `type`).
        code: Query<Option<String>>,
        /// Where to go after success: a path on `APP_URL`'s origin (default
        /// `/`); another origin, `//host`, `/\host` or `javascript:` gives `/`.
        next: Query<Option<String>>,
    ) -> ConfirmRedirect {
        let settings = &state.settings;
        let params = Params {
            token_hash: non_empty(token_hash.0),
            kind: non_empty(kind.0),
            code: non_empty(code.0),
        };
        match confirm_inner(&state, req, &params).await {
            Ok((session, expire)) => {
                let secure = settings.app_url.starts_with("https://");
                let mut cookies = session_cookies(&session, secure).to_vec();
                cookies.extend(expire.iter().map(|n| set_cookie(n, "", 0, false, secure)));
                ConfirmRedirect {
                    location: safe_next(&settings.app_url, next.0.as_deref()),
                    cookies,
                }
            }
            Err(e) => ConfirmRedirect::error(&settings.app_url, &e),
        }
    }
}

fn non_empty(v: Option<String>) -> Option<String> {
    v.map(|s| s.trim().to_owned()).filter(|s| !s.is_empty())
}

/// The query of `/auth/confirm`, trimmed, empty values as absent.
struct Params {
    token_hash: Option<String>,
    kind: Option<String>,
    code: Option<String>,
}

/// Checks the request and asks the backend: the session, and the verifier
/// cookie names to expire.
async fn confirm_inner(
    state: &AppState,
    req: &Request,
    p: &Params,
) -> Result<(Session, Vec<String>), ConfirmError> {
    let backend = Backend::of(state)?;
    let too_long = |v: &Option<String>| v.as_ref().is_some_and(|s| s.len() > MAX_PARAM_LEN);
    if too_long(&p.token_hash) || too_long(&p.code) {
        return Err(ConfirmError::new(
            "validation_failed",
            "The link is malformed",
        ));
    }
    match (&p.token_hash, &p.kind, &p.code) {
        (Some(token_hash), Some(kind), _) => {
            if !CONFIRM_TYPES.contains(&kind.as_str()) {
                return Err(ConfirmError::new(
                    "validation_failed",
                    format!(
                        "Unsupported link type: type must be one of {}",
                        CONFIRM_TYPES.join(", ")
                    ),
                ));
            }
            limit(state, req).await?;
            Ok((backend.verify(kind, token_hash).await?, Vec::new()))
        }
        (Some(_), None, _) => Err(ConfirmError::new(
            "validation_failed",
            "The link is missing its type parameter",
        )),
        (None, _, Some(code)) => {
            let mut keys: Vec<String> = Vec::new();
            if let Some(u) = &state.settings.backend_url {
                keys.extend(storage_key(u));
            }
            keys.extend(storage_key(&state.settings.api_external_url));
            keys.extend(storage_key(&state.settings.app_url));
            let Some((verifier, used)) = code_verifier(&request_cookies(req), &keys) else {
                return Err(ConfirmError::new(
                    "code_verifier_missing",
                    "This sign-in link must be opened in the browser where sign-in was started",
                ));
            };
            limit(state, req).await?;
            Ok((backend.exchange(code, &verifier).await?, used))
        }
        (None, _, None) => Err(ConfirmError::new(
            "validation_failed",
            "The link is missing its token_hash and type, or code, parameter",
        )),
    }
}

/// Counts an attempt of this client IP; the error redirect's reason when over.
async fn limit(state: &AppState, req: &Request) -> Result<(), ConfirmError> {
    let deadline = Instant::now() + state.settings.dependency_timeout;
    let limit = Limit {
        name: "auth_confirm",
        max: state.settings.auth_rate_limit_per_5min,
        window: CONFIRM_WINDOW,
    };
    let decision = state
        .limiter
        .check(limit, &state.client_ip(req), deadline)
        .await;
    if decision.allowed {
        Ok(())
    } else {
        Err(ConfirmError::new(
            "over_request_rate_limit",
            format!(
                "Too many attempts; try again in {} seconds",
                decision.info.retry_after
            ),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const V: &str = "Abcdefghijklmnopqrstuvwxyz0123456789-._~ABCDEFGHIJKLMN";

    fn jar(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    fn b64(s: &str) -> String {
        format!(
            "base64-{}",
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s)
        )
    }

    #[test]
    fn storage_key_is_the_first_host_label() {
        assert_eq!(
            storage_key("https://abcd.supabase.co").as_deref(),
            Some("sb-abcd-auth-token")
        );
        assert_eq!(
            storage_key("http://localhost:8080").as_deref(),
            Some("sb-localhost-auth-token")
        );
        assert_eq!(storage_key("not a url"), None);
    }

    #[test]
    fn verifier_cookie_in_every_encoding() {
        let keys = vec!["sb-abcd-auth-token".to_string()];
        let name = "sb-abcd-auth-token-code-verifier";
        // @supabase/ssr default: base64url of the JSON string.
        let json = format!("\"{V}\"");
        let got = code_verifier(&jar(&[(name, &b64(&json))]), &keys).unwrap();
        assert_eq!(got, (V.to_string(), vec![name.to_string()]));
        // Recovery flows append /PASSWORD_RECOVERY.
        let rec = format!("\"{V}/PASSWORD_RECOVERY\"");
        assert_eq!(
            code_verifier(&jar(&[(name, &b64(&rec))]), &keys).unwrap().0,
            V
        );
        // Raw encoding: the JSON string percent-encoded.
        let raw = format!("%22{V}%22");
        assert_eq!(code_verifier(&jar(&[(name, &raw)]), &keys).unwrap().0, V);
        // Chunks .0 .1.
        let enc = b64(&json);
        let (a, b) = enc.split_at(20);
        let got = code_verifier(
            &jar(&[
                (&format!("{name}.1"), b),
                (&format!("{name}.0"), a),
                ("other", "x"),
            ]),
            &keys,
        )
        .unwrap();
        assert_eq!(got.0, V);
        assert_eq!(got.1, vec![format!("{name}.0"), format!("{name}.1")]);
        // Another storage key, alone: still found.
        let other = "sb-127-auth-token-code-verifier";
        assert_eq!(
            code_verifier(&jar(&[(other, &b64(&json))]), &keys)
                .unwrap()
                .0,
            V
        );
    }

    #[test]
    fn verifier_absent_ambiguous_or_invalid() {
        let keys = vec!["sb-abcd-auth-token".to_string()];
        assert_eq!(
            code_verifier(&jar(&[("sb-access-token", "x")]), &keys),
            None
        );
        let json = format!("\"{V}\"");
        // Two unknown keys: ambiguous.
        assert_eq!(
            code_verifier(
                &jar(&[
                    ("sb-x-auth-token-code-verifier", &b64(&json)),
                    ("sb-y-auth-token-code-verifier", &b64(&json))
                ]),
                &keys
            ),
            None
        );
        // The preferred key wins over another.
        let pref = code_verifier(
            &jar(&[
                ("sb-x-auth-token-code-verifier", "%22short%22"),
                ("sb-abcd-auth-token-code-verifier", &b64(&json)),
            ]),
            &keys,
        );
        assert_eq!(pref.unwrap().0, V);
        for bad in [
            "\"short\"",
            "\"<script>aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
            "%zz",
            "base64-***",
        ] {
            assert_eq!(
                code_verifier(&jar(&[("sb-abcd-auth-token-code-verifier", bad)]), &keys),
                None,
                "{bad}"
            );
        }
    }

    #[test]
    fn session_json_to_cookies() {
        let s = Session::from_json(&json!({
            "access_token": "a.b.c", "token_type": "bearer", "expires_in": 1800,
            "expires_at": 1, "refresh_token": "r1", "user": {}
        }))
        .unwrap();
        assert_eq!(s.expires_in, 1800);
        let [a, r] = session_cookies(&s, true);
        assert_eq!(
            a,
            "sb-access-token=a.b.c; Path=/; Max-Age=1800; SameSite=Lax; HttpOnly; Secure"
        );
        assert_eq!(
            r,
            "sb-refresh-token=r1; Path=/; Max-Age=34560000; SameSite=Lax; HttpOnly; Secure"
        );
        let [a, _] = session_cookies(&s, false);
        assert!(!a.contains("Secure"));
        assert!(Session::from_json(&json!({"access_token": "a"})).is_none());
        assert!(
            Session::from_json(&json!({"access_token": "a;b", "refresh_token": "r"})).is_none()
        );
    }

    #[test]
    fn error_url_is_on_the_app_and_encoded() {
        let e = ConfirmError::new("otp_expired", "Email link is invalid or has expired & more");
        assert_eq!(
            error_url("https://app.example.com", &e),
            "https://app.example.com/auth/error?error=Email+link+is+invalid+or+has+expired+%26+more&error_code=otp_expired"
        );
        let long = ConfirmError::new("x", "é".repeat(500));
        assert_eq!(long.message.chars().count(), MAX_MESSAGE_CHARS);
    }

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("a%20b").as_deref(), Some("a b"));
        assert_eq!(percent_decode("plain").as_deref(), Some("plain"));
        assert_eq!(percent_decode("bad%2"), None);
        assert_eq!(percent_decode("%ff"), None);
    }
}
