//! Session verification: `Authorization: Bearer <JWT>` → [`Claims`].
//!
//! As `decisions.md` ("Identity and sessions") says, a token is accepted when its
//! signature, `exp`, `nbf` and `aud` (`authenticated`) verify, and `iss` too when
//! `BACKEND_JWT_ISSUER` is set. `sub` must be a UUID (the user id).
//!
//! Keys are chosen **by the header's `alg`**, never by what the token would like:
//! - `HS256` → only `BACKEND_JWT_SECRET` (when set);
//! - `RS256`/`RS384`/`RS512`/`ES256`/`ES384`/`EdDSA` → only the public keys of the
//!   JWKS at `{NEXT_PUBLIC_BACKEND_URL}/auth/v1/.well-known/jwks.json`, matched by
//!   `kid` (or, without a `kid`, every key whose type and `alg` fit);
//! - anything else (`none`, `HS384`, `PS256`, …) → [`AuthError::UnsupportedAlgorithm`].
//!
//! The [`jsonwebtoken::Validation`] used for a token pins `algorithms` to the
//! header's one and the key's type must fit it, so an HS256 token can never be
//! checked against an RSA public key (algorithm confusion), and symmetric (`oct`)
//! keys published in a JWKS are ignored. The `jwk`/`jku` header fields are ignored.
//!
//! JWKS: fetched with one shared `reqwest::Client` (3 s timeout, 2 s connect
//! timeout), cached for 10 minutes. An unknown `kid` triggers one refetch;
//! concurrent misses wait on that same fetch, and refetches caused by unknown kids
//! happen at most once per 30 s, so a flood of random kids cannot hammer the
//! JWKS endpoint. A cache older than 10 minutes is refreshed on use; when that
//! refresh fails, the previous keys stay usable for one more hour. With no usable
//! keys and an unreachable JWKS the answer is [`AuthError::KeysUnavailable`] (503).
//!
//! Hot path: the HS256 [`DecodingKey`] and every per-algorithm [`Validation`] are
//! built once (HS256: ~5 µs per token in release). The JWKS path takes a read lock
//! just long enough to clone an `Arc`. RustCrypto's RSA-2048 and P-256 checks cost
//! ~0.35–0.45 ms each on the project machine, so a token that verified against the
//! current key set is remembered (bounded map keyed by the whole token, re-checking
//! `exp` on every hit; dropped with the key set on every JWKS fetch): a repeated
//! RS256/ES256 token then costs a hash lookup, like HS256.
//!
//! Why this file is long: the three kinds of session token (the built-in
//! provider's ES256, an external platform's JWKS-signed, HS256) are verified
//! by one function so that every logged-in route applies the same checks in
//! the same order; its key sets and caches stay beside it.

use std::{
    fmt,
    sync::{Arc, PoisonError, RwLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use jsonwebtoken::{
    errors::ErrorKind,
    jwk::{AlgorithmParameters, EllipticCurve, Jwk, KeyOperations, PublicKeyUse, RSAKeyParameters},
    Algorithm, DecodingKey, EncodingKey, Header, Validation,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::identity::verified::VerifiedTokens;

/// The audience every session token must carry.
pub const AUDIENCE: &str = "authenticated";
/// Path of the JWKS under `NEXT_PUBLIC_BACKEND_URL`.
pub const JWKS_PATH: &str = "/auth/v1/.well-known/jwks.json";

/// Clock skew tolerated on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;
/// Tokens longer than this are rejected before any parsing.
const MAX_TOKEN_LEN: usize = 8 * 1024;
/// A JWKS body larger than this is refused.
const MAX_JWKS_BYTES: usize = 256 * 1024;
/// Keys without a `kid` tried at most (bounds the work per token).
const MAX_CANDIDATES: usize = 8;
/// Asymmetric tokens remembered as verified, per key set (cleared when full).
const VERIFIED_CACHE_MAX: usize = 4096;
/// RSA moduli shorter than 2048 bits are ignored.
const MIN_RSA_MODULUS_BYTES: usize = 256;

/// How long a fetched JWKS is used before it is refreshed.
const JWKS_MAX_AGE: Duration = Duration::from_secs(10 * 60);
/// How long past [`JWKS_MAX_AGE`] the old keys still serve when refreshing fails.
const JWKS_STALE_GRACE: Duration = Duration::from_secs(60 * 60);
/// At most one refetch caused by an unknown `kid` per this interval.
const REFETCH_MIN_INTERVAL: Duration = Duration::from_secs(30);
/// After a failed fetch, requests within this interval do not try again.
const FAILURE_BACKOFF: Duration = Duration::from_secs(5);
/// Whole-request timeout of a JWKS fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// Connect timeout of a JWKS fetch.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The verified claims of a session token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claims {
    /// The user id.
    pub sub: Uuid,
    /// The user's email, when the token carries a non-empty one.
    #[serde(default)]
    pub email: Option<String>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: i64,
    /// The auth platform's role claim (`authenticated`, …); not the app role.
    #[serde(default)]
    pub role: Option<String>,
    /// Issued-at, seconds since the Unix epoch, when present.
    #[serde(default)]
    pub iat: Option<i64>,
    /// Set by [`SessionVerifier::verify`]: the token was signed by a key of
    /// the auth platform's JWKS (an external issuer), not with
    /// `BACKEND_JWT_SECRET`. Its `email` then counts as confirmed only when
    /// `AUTH_TRUST_EMAIL_CLAIM=true`.
    #[serde(skip)]
    pub external: bool,
    /// The session the token belongs to, set only for the built-in
    /// provider's tokens (their `session_id` claim, see
    /// `crate::identity::Idp::verify_session_token`): every logged-in route
    /// checks that it still exists. Never read from another issuer's token.
    #[serde(skip)]
    pub session_id: Option<Uuid>,
}

/// Why a request is not logged in (or cannot be checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// No `Authorization: Bearer …` credential.
    #[error("missing bearer token")]
    Missing,
    /// The token is not a well-formed JWT or its claims have the wrong shape
    /// (including a `sub` that is not a UUID).
    #[error("malformed token")]
    Malformed,
    /// The signature does not verify.
    #[error("invalid token signature")]
    BadSignature,
    /// `exp` is in the past.
    #[error("token expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token not yet valid")]
    NotYetValid,
    /// `aud` is missing or is not `authenticated`.
    #[error("token audience is not accepted")]
    WrongAudience,
    /// `iss` is missing or is not the configured issuer.
    #[error("token issuer is not accepted")]
    WrongIssuer,
    /// The header's `alg` is not one this service accepts (or has no key for).
    #[error("token algorithm is not accepted")]
    UnsupportedAlgorithm,
    /// No key fits the token's `kid` / `alg`.
    #[error("token signing key is unknown")]
    UnknownKey,
    /// The JWKS could not be fetched and no usable keys are cached (503).
    #[error("session keys are unavailable")]
    KeysUnavailable,
    /// Neither `BACKEND_JWT_SECRET` nor `NEXT_PUBLIC_BACKEND_URL` is set (503).
    #[error("session verification is not configured")]
    NotConfigured,
}

impl AuthError {
    /// Stable snake_case reason, for problem details and logs.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Malformed => "malformed",
            Self::BadSignature => "bad_signature",
            Self::Expired => "expired",
            Self::NotYetValid => "not_yet_valid",
            Self::WrongAudience => "wrong_audience",
            Self::WrongIssuer => "wrong_issuer",
            Self::UnsupportedAlgorithm => "unsupported_algorithm",
            Self::UnknownKey => "unknown_key",
            Self::KeysUnavailable => "keys_unavailable",
            Self::NotConfigured => "not_configured",
        }
    }

    /// HTTP status: 401, except 503 for [`Self::KeysUnavailable`] and [`Self::NotConfigured`].
    pub fn status(&self) -> u16 {
        match self {
            Self::KeysUnavailable | Self::NotConfigured => 503,
            _ => 401,
        }
    }
}

/// Reads `Authorization: Bearer <token>` (scheme case-insensitive).
///
/// No header, or another scheme (`Basic …`) → [`AuthError::Missing`]; a header
/// that is not ASCII, a bare `Bearer`, or a value without a scheme → [`AuthError::Malformed`].
pub fn bearer_token(req: &poem::Request) -> Result<&str, AuthError> {
    let value = req
        .headers()
        .get(poem::http::header::AUTHORIZATION)
        .ok_or(AuthError::Missing)?;
    parse_authorization(value.to_str().map_err(|_| AuthError::Malformed)?)
}

fn parse_authorization(value: &str) -> Result<&str, AuthError> {
    let value = value.trim();
    match value.split_once([' ', '\t']) {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("bearer") => {
            let token = rest.trim();
            if token.is_empty() || token.contains([' ', '\t']) {
                Err(AuthError::Malformed)
            } else {
                Ok(token)
            }
        }
        Some(_) => Err(AuthError::Missing),
        None if value.is_empty() => Err(AuthError::Missing),
        None => Err(AuthError::Malformed),
    }
}

/// Mints an HS256 session token (for `api token` and tests): claims `sub`,
/// `email` (when given), `aud` and `role` = `authenticated`, `iat` = now, `exp` = now + `ttl`.
pub fn mint_hs256(secret: &str, sub: Uuid, email: Option<&str>, ttl: Duration) -> String {
    #[derive(Serialize)]
    struct Mint<'a> {
        sub: Uuid,
        #[serde(skip_serializing_if = "Option::is_none")]
        email: Option<&'a str>,
        aud: &'static str,
        role: &'static str,
        iat: i64,
        exp: i64,
    }
    let now = unix_now();
    let ttl = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX / 2);
    let claims = Mint {
        sub,
        email,
        aud: AUDIENCE,
        role: AUDIENCE,
        iat: now,
        exp: now.saturating_add(ttl),
    };
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("HS256 signing of serialisable claims cannot fail")
}

fn unix_now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// Verifies session tokens. Cheap to clone (one `Arc`); share one per process
/// so every request uses the same JWKS cache.
#[derive(Clone)]
pub struct SessionVerifier {
    inner: Arc<Inner>,
}

struct Inner {
    /// The HS256 key built once from `BACKEND_JWT_SECRET`.
    hs256: Option<DecodingKey>,
    jwks: Option<Jwks>,
    /// One prepared validation per accepted algorithm (only those with keys).
    validations: Vec<(Algorithm, Validation)>,
}

impl fmt::Debug for SessionVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SessionVerifier")
            .field("hs256", &self.inner.hs256.is_some())
            .field("jwks_url", &self.jwks_url())
            .finish_non_exhaustive()
    }
}

/// The asymmetric algorithms accepted from the JWKS.
const JWKS_ALGORITHMS: [Algorithm; 6] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

impl SessionVerifier {
    /// A verifier with an optional HS256 secret, an optional JWKS URL and an
    /// optional required issuer. Empty strings count as unset.
    pub fn new(secret: Option<String>, jwks_url: Option<String>, issuer: Option<String>) -> Self {
        let non_empty = |v: Option<String>| v.filter(|s| !s.trim().is_empty());
        let secret = non_empty(secret);
        let jwks_url = non_empty(jwks_url).map(|u| u.trim().to_string());
        let issuer = non_empty(issuer).map(|i| i.trim().to_string());

        let validation_for = |alg: Algorithm| {
            let mut v = Validation::new(alg);
            v.leeway = LEEWAY_SECS;
            v.validate_exp = true;
            v.validate_nbf = true;
            v.validate_aud = true;
            v.set_audience(&[AUDIENCE]);
            let mut required = vec!["exp", "aud", "sub"];
            if let Some(iss) = &issuer {
                v.set_issuer(&[iss.as_str()]);
                required.push("iss");
            }
            v.set_required_spec_claims(&required);
            (alg, v)
        };

        let mut validations = Vec::new();
        if secret.is_some() {
            validations.push(validation_for(Algorithm::HS256));
        }
        if jwks_url.is_some() {
            validations.extend(JWKS_ALGORITHMS.into_iter().map(validation_for));
        }

        SessionVerifier {
            inner: Arc::new(Inner {
                hs256: secret.map(|s| DecodingKey::from_secret(s.as_bytes())),
                jwks: jwks_url.map(Jwks::new),
                validations,
            }),
        }
    }

    /// From the settings: `BACKEND_JWT_SECRET`, `BACKEND_JWT_ISSUER`, and the JWKS
    /// at `{NEXT_PUBLIC_BACKEND_URL}/auth/v1/.well-known/jwks.json`.
    pub fn from_settings(settings: &entity::Settings) -> Self {
        Self::new(
            settings.backend_jwt_secret.clone(),
            settings
                .backend_url
                .as_deref()
                .map(|u| format!("{}{JWKS_PATH}", u.trim_end_matches('/'))),
            settings.backend_jwt_issuer.clone(),
        )
    }

    /// True when at least one kind of key (HS256 secret or JWKS) is configured.
    pub fn is_configured(&self) -> bool {
        self.inner.hs256.is_some() || self.inner.jwks.is_some()
    }

    /// The JWKS URL, when asymmetric keys are configured.
    pub fn jwks_url(&self) -> Option<&str> {
        self.inner.jwks.as_ref().map(|j| j.url.as_str())
    }

    /// Fetches the JWKS now (e.g. at start, so the first request does not wait)
    /// and answers how many usable keys it holds. Without a JWKS URL: `Ok(0)`.
    pub async fn refresh_keys(&self) -> Result<usize, AuthError> {
        match &self.inner.jwks {
            None => Ok(0),
            Some(jwks) => {
                let _guard = jwks.fetch_lock.lock().await;
                jwks.fetch_and_store(false).await;
                let state = jwks.snapshot();
                if state.last_failure.is_some() {
                    Err(AuthError::KeysUnavailable)
                } else {
                    Ok(state.keys.keys.len())
                }
            }
        }
    }

    /// Verifies `token` and returns its claims.
    pub async fn verify(&self, token: &str) -> Result<Claims, AuthError> {
        let inner = &*self.inner;
        if !self.is_configured() {
            return Err(AuthError::NotConfigured);
        }
        let token = token.trim();
        if token.is_empty() {
            return Err(AuthError::Missing);
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(AuthError::Malformed);
        }
        let (alg, kid) = parse_header(token)?;
        let validation = inner
            .validations
            .iter()
            .find(|(a, _)| *a == alg)
            .map(|(_, v)| v)
            .ok_or(AuthError::UnsupportedAlgorithm)?;
        if alg == Algorithm::HS256 {
            // Only the configured secret; never a key from the JWKS.
            let key = inner
                .hs256
                .as_ref()
                .ok_or(AuthError::UnsupportedAlgorithm)?;
            return decode_with(token, key, validation);
        }
        let jwks = inner.jwks.as_ref().ok_or(AuthError::UnsupportedAlgorithm)?;
        let mut claims = jwks.verify(token, alg, kid.as_deref(), validation).await?;
        claims.external = true;
        Ok(claims)
    }
}

/// The accepted `alg` values (by exact name) and the header's `kid`.
fn parse_header(token: &str) -> Result<(Algorithm, Option<String>), AuthError> {
    #[derive(Deserialize)]
    struct RawHeader {
        alg: Option<String>,
        kid: Option<String>,
    }
    let mut parts = token.split('.');
    let (Some(header), Some(_payload), Some(_signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed);
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(header)
        .map_err(|_| AuthError::Malformed)?;
    let raw: RawHeader = serde_json::from_slice(&bytes).map_err(|_| AuthError::Malformed)?;
    let alg = match raw.alg.as_deref().ok_or(AuthError::Malformed)? {
        "HS256" => Algorithm::HS256,
        "RS256" => Algorithm::RS256,
        "RS384" => Algorithm::RS384,
        "RS512" => Algorithm::RS512,
        "ES256" => Algorithm::ES256,
        "ES384" => Algorithm::ES384,
        "EdDSA" => Algorithm::EdDSA,
        _ => return Err(AuthError::UnsupportedAlgorithm),
    };
    Ok((alg, raw.kid))
}

/// Signature + claims check with one key; the validation pins the algorithm.
fn decode_with(
    token: &str,
    key: &DecodingKey,
    validation: &Validation,
) -> Result<Claims, AuthError> {
    let mut claims = jsonwebtoken::decode::<Claims>(token, key, validation)
        .map_err(|e| map_jwt_error(e.kind()))?
        .claims;
    if claims.email.as_deref().is_some_and(|e| e.trim().is_empty()) {
        claims.email = None;
    }
    Ok(claims)
}

fn map_jwt_error(kind: &ErrorKind) -> AuthError {
    match kind {
        ErrorKind::InvalidSignature => AuthError::BadSignature,
        ErrorKind::ExpiredSignature => AuthError::Expired,
        ErrorKind::ImmatureSignature => AuthError::NotYetValid,
        ErrorKind::InvalidAudience => AuthError::WrongAudience,
        ErrorKind::InvalidIssuer => AuthError::WrongIssuer,
        ErrorKind::MissingRequiredClaim(c) if c == "aud" => AuthError::WrongAudience,
        ErrorKind::MissingRequiredClaim(c) if c == "iss" => AuthError::WrongIssuer,
        ErrorKind::InvalidAlgorithm
        | ErrorKind::UnsupportedAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::MissingAlgorithm => AuthError::UnsupportedAlgorithm,
        ErrorKind::InvalidKeyFormat
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey => AuthError::UnknownKey,
        _ => AuthError::Malformed,
    }
}

// ---------------------------------------------------------------------------
// JWKS
// ---------------------------------------------------------------------------

/// The key type an algorithm needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyKind {
    Rsa,
    P256,
    P384,
    Ed25519,
}

fn kind_for(alg: Algorithm) -> Option<KeyKind> {
    match alg {
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 => Some(KeyKind::Rsa),
        Algorithm::ES256 => Some(KeyKind::P256),
        Algorithm::ES384 => Some(KeyKind::P384),
        Algorithm::EdDSA => Some(KeyKind::Ed25519),
        _ => None,
    }
}

/// One usable public key of the JWKS.
struct JwkKey {
    kid: Option<String>,
    /// The key's declared `alg`, when it has one.
    alg: Option<Algorithm>,
    kind: KeyKind,
    key: DecodingKey,
}

impl JwkKey {
    fn from_jwk(jwk: &Jwk) -> Option<Self> {
        if jwk
            .common
            .public_key_use
            .as_ref()
            .is_some_and(|u| *u != PublicKeyUse::Signature)
        {
            return None;
        }
        if jwk
            .common
            .key_operations
            .as_ref()
            .is_some_and(|ops| !ops.contains(&KeyOperations::Verify))
        {
            return None;
        }
        let kind = match &jwk.algorithm {
            AlgorithmParameters::RSA(params) if rsa_modulus_ok(params) => KeyKind::Rsa,
            AlgorithmParameters::EllipticCurve(p) => match p.curve {
                EllipticCurve::P256 => KeyKind::P256,
                EllipticCurve::P384 => KeyKind::P384,
                _ => return None,
            },
            AlgorithmParameters::OctetKeyPair(p) if p.curve == EllipticCurve::Ed25519 => {
                KeyKind::Ed25519
            }
            // Symmetric (`oct`) keys, short RSA keys and unknown kinds are never used.
            _ => return None,
        };
        let alg = match jwk.common.key_algorithm {
            None => None,
            Some(declared) => {
                let alg = Algorithm::try_from(declared).ok()?;
                if kind_for(alg) != Some(kind) {
                    return None;
                }
                Some(alg)
            }
        };
        let key = DecodingKey::from_jwk(jwk).ok()?;
        Some(JwkKey {
            kid: jwk.common.key_id.clone(),
            alg,
            kind,
            key,
        })
    }

    fn fits(&self, alg: Algorithm, kid: Option<&str>) -> bool {
        kind_for(alg) == Some(self.kind)
            && self.alg.is_none_or(|a| a == alg)
            && kid.is_none_or(|k| self.kid.as_deref() == Some(k))
    }
}

fn rsa_modulus_ok(params: &RSAKeyParameters) -> bool {
    URL_SAFE_NO_PAD.decode(&params.n).is_ok_and(|n| {
        let significant = n.iter().skip_while(|b| **b == 0).count();
        significant >= MIN_RSA_MODULUS_BYTES
    })
}

struct KeySet {
    keys: Vec<JwkKey>,
    /// Tokens that already verified with these keys, with their claims
    /// (`nbf` was passed then; a hit re-checks `exp`). It lives and dies with
    /// this key set: a JWKS fetch starts an empty one, so a removed key stops
    /// counting.
    verified: VerifiedTokens<Claims>,
}

impl Default for KeySet {
    fn default() -> Self {
        KeySet::new(Vec::new())
    }
}

impl KeySet {
    fn new(keys: Vec<JwkKey>) -> Self {
        KeySet {
            keys,
            verified: VerifiedTokens::new(VERIFIED_CACHE_MAX),
        }
    }

    /// The claims of a token verified before, re-checking its expiry.
    fn cached(&self, token: &str) -> Option<Result<Claims, AuthError>> {
        let claims = self.verified.get(token)?;
        if claims.exp.saturating_add(LEEWAY_SECS as i64) < unix_now() {
            return Some(Err(AuthError::Expired));
        }
        Some(Ok(claims))
    }

    fn remember(&self, token: &str, claims: &Claims) {
        self.verified.insert(token, claims);
    }

    fn candidates<'a>(
        &'a self,
        alg: Algorithm,
        kid: Option<&'a str>,
    ) -> impl Iterator<Item = &'a JwkKey> + 'a {
        self.keys
            .iter()
            .filter(move |k| k.fits(alg, kid))
            .take(MAX_CANDIDATES)
    }

    fn has(&self, alg: Algorithm, kid: Option<&str>) -> bool {
        self.candidates(alg, kid).next().is_some()
    }
}

#[derive(Clone, Default)]
struct JwksState {
    keys: Arc<KeySet>,
    /// Last successful fetch.
    fetched_at: Option<Instant>,
    /// Fetch attempts so far (success or failure); lets waiters see that a
    /// fetch happened while they waited.
    attempts: u64,
    /// Time of the last failed fetch, cleared by a success.
    last_failure: Option<Instant>,
    /// Last fetch caused by an unknown `kid` on a fresh cache.
    last_miss_refetch: Option<Instant>,
}

impl JwksState {
    fn fresh(&self, now: Instant) -> bool {
        self.fetched_at
            .is_some_and(|t| now.saturating_duration_since(t) < JWKS_MAX_AGE)
    }

    /// Fresh, or stale but within the grace period.
    fn usable(&self, now: Instant) -> bool {
        self.fetched_at
            .is_some_and(|t| now.saturating_duration_since(t) < JWKS_MAX_AGE + JWKS_STALE_GRACE)
    }

    fn refetch_allowed(&self, now: Instant) -> bool {
        self.last_miss_refetch
            .is_none_or(|t| now.saturating_duration_since(t) >= REFETCH_MIN_INTERVAL)
    }

    fn in_failure_backoff(&self, now: Instant) -> bool {
        self.last_failure
            .is_some_and(|t| now.saturating_duration_since(t) < FAILURE_BACKOFF)
    }
}

struct Jwks {
    url: String,
    client: Option<reqwest::Client>,
    state: RwLock<JwksState>,
    /// Held while fetching: concurrent misses queue here and reuse the result.
    fetch_lock: tokio::sync::Mutex<()>,
}

impl Jwks {
    fn new(url: String) -> Self {
        // No redirects: whoever could redirect the fetch would serve the keys.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .build()
            .map_err(|e| tracing::error!(error = %e, "cannot build the JWKS HTTP client"))
            .ok();
        Jwks {
            url,
            client,
            state: RwLock::new(JwksState::default()),
            fetch_lock: tokio::sync::Mutex::new(()),
        }
    }

    fn snapshot(&self) -> JwksState {
        self.state
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    async fn verify(
        &self,
        token: &str,
        alg: Algorithm,
        kid: Option<&str>,
        validation: &Validation,
    ) -> Result<Claims, AuthError> {
        let keys = self.keys_for(alg, kid).await?;
        if let Some(hit) = keys.cached(token) {
            return hit;
        }
        let mut last = AuthError::UnknownKey;
        for key in keys.candidates(alg, kid) {
            match decode_with(token, &key.key, validation) {
                Ok(claims) => {
                    keys.remember(token, &claims);
                    return Ok(claims);
                }
                // Without a `kid` several keys may fit: try the next one.
                Err(e @ (AuthError::BadSignature | AuthError::UnknownKey)) => last = e,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }

    /// A key set that holds at least one candidate for (`alg`, `kid`).
    async fn keys_for(&self, alg: Algorithm, kid: Option<&str>) -> Result<Arc<KeySet>, AuthError> {
        let seen = self.snapshot();
        let now = Instant::now();
        let fresh = seen.fresh(now);
        let has = seen.keys.has(alg, kid);
        if fresh && has {
            return Ok(seen.keys);
        }
        if fresh && !seen.refetch_allowed(now) {
            // A flood of unknown kids: answer without touching the network.
            return Err(AuthError::UnknownKey);
        }
        if has && seen.usable(now) {
            // Stale but usable: refresh when nobody else is, otherwise serve the old keys.
            if let Ok(_guard) = self.fetch_lock.try_lock() {
                if !self.snapshot().in_failure_backoff(Instant::now()) {
                    self.fetch_and_store(false).await;
                }
            }
            let cur = self.snapshot();
            return if cur.keys.has(alg, kid) && cur.usable(Instant::now()) {
                Ok(cur.keys)
            } else {
                Err(AuthError::UnknownKey)
            };
        }

        let _guard = self.fetch_lock.lock().await;
        let cur = self.snapshot();
        let now = Instant::now();
        let should_fetch = if cur.attempts != seen.attempts {
            // Someone fetched while we waited: use that result, never fetch again.
            false
        } else if cur.fresh(now) {
            cur.refetch_allowed(now)
        } else {
            !cur.in_failure_backoff(now)
        };
        if should_fetch {
            self.fetch_and_store(cur.fresh(now)).await;
        }
        let cur = self.snapshot();
        let now = Instant::now();
        if !cur.usable(now) {
            return Err(AuthError::KeysUnavailable);
        }
        if cur.keys.has(alg, kid) {
            Ok(cur.keys)
        } else {
            Err(AuthError::UnknownKey)
        }
    }

    /// Fetches the JWKS and records the outcome. Call with `fetch_lock` held.
    async fn fetch_and_store(&self, miss_refetch: bool) {
        let result = self.fetch().await;
        let now = Instant::now();
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        state.attempts += 1;
        if miss_refetch {
            state.last_miss_refetch = Some(now);
        }
        match result {
            Ok(keys) => {
                tracing::debug!(url = %self.url, keys = keys.keys.len(), "JWKS fetched");
                state.keys = Arc::new(keys);
                state.fetched_at = Some(now);
                state.last_failure = None;
            }
            Err(error) => {
                tracing::warn!(url = %self.url, %error, "JWKS fetch failed");
                state.last_failure = Some(now);
            }
        }
    }

    async fn fetch(&self) -> Result<KeySet, String> {
        let client = self.client.as_ref().ok_or("no HTTP client")?;
        let mut resp = client
            .get(&self.url)
            .header(reqwest::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        if resp
            .content_length()
            .is_some_and(|n| n > MAX_JWKS_BYTES as u64)
        {
            return Err("JWKS too large".into());
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
            if body.len() + chunk.len() > MAX_JWKS_BYTES {
                return Err("JWKS too large".into());
            }
            body.extend_from_slice(&chunk);
        }
        parse_jwks(&body)
    }
}

/// Parses a JWKS document, keeping the keys that can verify session tokens and
/// skipping (not failing on) the others.
fn parse_jwks(body: &[u8]) -> Result<KeySet, String> {
    #[derive(Deserialize)]
    struct RawSet {
        keys: Vec<serde_json::Value>,
    }
    let raw: RawSet = serde_json::from_slice(body).map_err(|e| format!("invalid JWKS: {e}"))?;
    let keys = raw
        .keys
        .into_iter()
        .filter_map(|v| serde_json::from_value::<Jwk>(v).ok())
        .filter_map(|jwk| JwkKey::from_jwk(&jwk))
        .collect();
    Ok(KeySet::new(keys))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorization_parsing() {
        assert_eq!(parse_authorization("Bearer abc"), Ok("abc"));
        assert_eq!(parse_authorization("bearer   abc "), Ok("abc"));
        assert_eq!(parse_authorization("BEARER\tabc"), Ok("abc"));
        assert_eq!(parse_authorization("Bearer "), Err(AuthError::Malformed));
        assert_eq!(parse_authorization("Bearer"), Err(AuthError::Malformed));
        assert_eq!(parse_authorization("Bearer a b"), Err(AuthError::Malformed));
        assert_eq!(parse_authorization("abc"), Err(AuthError::Malformed));
        assert_eq!(
            parse_authorization("Basic dXNlcg=="),
            Err(AuthError::Missing)
        );
        assert_eq!(parse_authorization(""), Err(AuthError::Missing));
    }

    #[test]
    fn codes_and_statuses() {
        assert_eq!(AuthError::NotYetValid.code(), "not_yet_valid");
        assert_eq!(AuthError::KeysUnavailable.status(), 503);
        assert_eq!(AuthError::NotConfigured.status(), 503);
        assert_eq!(AuthError::BadSignature.status(), 401);
    }

    #[test]
    fn jwks_skips_symmetric_and_unusable_keys() {
        let set = parse_jwks(
            br#"{"keys":[
                {"kty":"oct","k":"c2VjcmV0","kid":"h"},
                {"kty":"EC","crv":"P-521","x":"AA","y":"AA","kid":"p521"},
                {"kty":"RSA","n":"AQAB","e":"AQAB","kid":"short"},
                {"kty":"weird","kid":"w"},
                {"kty":"OKP","crv":"Ed25519","x":"jAInQ2xVAl5osP76n4uE_Is2rbrtyzdpMC8qBu_q3dE","kid":"ed","use":"enc"}
            ]}"#,
        )
        .unwrap();
        assert!(set.keys.is_empty());
        assert!(parse_jwks(b"not json").is_err());
    }
}
