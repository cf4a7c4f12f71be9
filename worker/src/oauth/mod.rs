//! OAuth sign-in adapters (GitHub, Google): the authorization URL, the code
//! exchange and the profile, through the `oauth2` crate (RFC 6749 with PKCE,
//! RFC 7636) over the workspace's reqwest client.
//!
//! * The authorization URL carries `response_type=code`, the `client_id`, the
//!   registered `redirect_uri` (`OAUTH_REDIRECT_URI`), the scopes (GitHub
//!   `read:user user:email`, Google `openid email profile`, plus any the
//!   client asked for), an unguessable `state` (32 random bytes, base64url)
//!   and a PKCE S256 challenge whose verifier stays on the server.
//! * The code is exchanged at the token endpoint with
//!   `grant_type=authorization_code`, `code`, `redirect_uri`, `code_verifier`,
//!   `client_id` and `client_secret` in the form body (both providers document
//!   the body form), `Accept: application/json` (GitHub answers form-encoded
//!   otherwise).
//! * The profile: GitHub's REST API `GET /user` and `GET /user/emails` (the
//!   primary verified address) — [`github`]; Google's OpenID Connect userinfo
//!   endpoint — [`google`].
//!
//! Every call is bounded by `OAUTH_TIMEOUT_MS` (connect by at most 3 s),
//! redirects are never followed (no SSRF through a provider's answer) and an
//! answer is read up to 64 KiB.

use std::time::Duration;

use entity::{
    base::settings::{OAuthClientSettings, OAuthSettings},
    identity::oauth::OAuthProvider,
};
use oauth2::{
    basic::BasicClient, AuthType, AuthUrl, AuthorizationCode, ClientId, ClientSecret, CsrfToken,
    EndpointNotSet, EndpointSet, PkceCodeChallenge, PkceCodeVerifier, RedirectUrl,
    RequestTokenError, Scope, TokenResponse, TokenUrl,
};

pub mod github;
pub mod google;

/// Longest answer read from a provider.
const MAX_ANSWER: usize = 64 * 1024;

/// What a provider says about the user who signed in.
#[derive(Debug, Clone, PartialEq)]
pub struct OAuthProfile {
    /// The provider.
    pub provider: OAuthProvider,
    /// The provider's stable user id (GitHub's numeric `id`, Google's `sub`), as text.
    pub provider_id: String,
    /// The user's email address (GitHub: the primary one; Google: `email`).
    pub email: String,
    /// Whether the provider says the address is verified.
    pub email_verified: bool,
    /// The platform's `user_metadata` for an OAuth identity: `iss`, `sub`,
    /// `provider_id`, `email`, `email_verified`, `phone_verified`, `name`,
    /// `full_name`, `avatar_url`, `picture` (Google), `user_name` and
    /// `preferred_username` (GitHub's `login`).
    pub user_metadata: serde_json::Value,
}

/// The provider's tokens from the code exchange.
#[derive(Clone, PartialEq, Eq)]
pub struct ProviderTokens {
    /// The provider's access token (the platform's `provider_token`).
    pub access_token: String,
    /// The provider's refresh token, when it issued one (`provider_refresh_token`).
    pub refresh_token: Option<String>,
}

impl std::fmt::Debug for ProviderTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ProviderTokens(<redacted>)")
    }
}

/// A started authorization: where to send the browser, and what the callback needs.
#[derive(Debug, Clone)]
pub struct StartedAuthorization {
    /// The provider's authorization URL with every parameter.
    pub url: String,
    /// The `state` in that URL (store it hashed; compare on the callback).
    pub state: String,
    /// The upstream PKCE verifier (keep it on the server).
    pub pkce_verifier: String,
}

/// Why a sign-in with a provider failed.
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// The provider is not configured (`OAUTH_<P>_CLIENT_ID`/`_SECRET` unset).
    #[error("the {0} provider is not enabled")]
    Disabled(&'static str),
    /// A configured endpoint is not a valid URL.
    #[error("OAuth endpoint misconfigured: {0}")]
    Config(String),
    /// The provider refused the code (the OAuth `error`, e.g. `invalid_grant`,
    /// GitHub's `bad_verification_code`).
    #[error("the provider refused the code: {0}")]
    Refused(String),
    /// The provider could not be reached, timed out, or answered an HTTP error.
    #[error("the provider could not be reached: {0}")]
    Unavailable(String),
    /// The provider's answer is not its documented shape.
    #[error("the provider's answer is not the documented shape: {0}")]
    Undocumented(String),
    /// The provider gave no email address for the user.
    #[error("the provider gave no email address")]
    NoEmail,
}

/// A transport failure of the HTTP client handed to `oauth2`.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The request could not be built or sent, or timed out.
    #[error("{0}")]
    Transport(String),
    /// The answer exceeds 64 KiB.
    #[error("the answer exceeds 64 KiB")]
    TooLarge,
}

/// The enabled providers and the shared HTTP client. Cheap to clone.
#[derive(Clone)]
pub struct OAuthClients {
    http: reqwest::Client,
    settings: OAuthSettings,
}

impl OAuthClients {
    /// A client bounded by `OAUTH_TIMEOUT_MS`, without redirects.
    ///
    /// # Errors
    /// The HTTP client could not be built.
    pub fn new(settings: &OAuthSettings) -> anyhow::Result<Self> {
        let http = reqwest::Client::builder()
            .connect_timeout(settings.timeout.min(Duration::from_secs(3)))
            .timeout(settings.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .pool_idle_timeout(Duration::from_secs(60))
            .user_agent(concat!("subscription-backend/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(OAuthClients {
            http,
            settings: settings.clone(),
        })
    }

    /// The settings of `provider` when it is enabled.
    pub fn provider(&self, provider: OAuthProvider) -> Option<&OAuthClientSettings> {
        match provider {
            OAuthProvider::Github => self.settings.github.as_ref(),
            OAuthProvider::Google => self.settings.google.as_ref(),
        }
    }

    /// Whether `provider` is enabled (its client id and secret are set).
    pub fn enabled(&self, provider: OAuthProvider) -> bool {
        self.provider(provider).is_some()
    }

    /// The callback URL registered with the providers.
    pub fn redirect_uri(&self) -> &str {
        &self.settings.redirect_uri
    }

    fn client(
        &self,
        provider: OAuthProvider,
    ) -> Result<
        BasicClient<EndpointSet, EndpointNotSet, EndpointNotSet, EndpointNotSet, EndpointSet>,
        OAuthError,
    > {
        let p = self
            .provider(provider)
            .ok_or(OAuthError::Disabled(provider.as_str()))?;
        let config = |e: oauth2::url::ParseError| OAuthError::Config(e.to_string());
        Ok(BasicClient::new(ClientId::new(p.client_id.clone()))
            .set_client_secret(ClientSecret::new(p.client_secret.clone()))
            .set_auth_uri(AuthUrl::new(p.auth_url.clone()).map_err(config)?)
            .set_token_uri(TokenUrl::new(p.token_url.clone()).map_err(config)?)
            .set_redirect_uri(RedirectUrl::new(self.settings.redirect_uri.clone()).map_err(config)?)
            .set_auth_type(AuthType::RequestBody))
    }

    /// Starts an authorization with `provider` asking for `scopes`: a fresh
    /// `state` and PKCE S256 pair, and the URL to send the browser to.
    ///
    /// # Errors
    /// [`OAuthError::Disabled`] when the provider is not configured,
    /// [`OAuthError::Config`] when an endpoint is not a URL.
    pub fn authorize(
        &self,
        provider: OAuthProvider,
        scopes: &[String],
    ) -> Result<StartedAuthorization, OAuthError> {
        let client = self.client(provider)?;
        let (challenge, verifier) = PkceCodeChallenge::new_random_sha256();
        let (url, state) = client
            .authorize_url(|| CsrfToken::new_random_len(32))
            .add_scopes(scopes.iter().cloned().map(Scope::new))
            .set_pkce_challenge(challenge)
            .url();
        Ok(StartedAuthorization {
            url: url.to_string(),
            state: state.secret().clone(),
            pkce_verifier: verifier.secret().clone(),
        })
    }

    /// Exchanges `code` (with the upstream `pkce_verifier`) at the token endpoint.
    ///
    /// # Errors
    /// [`OAuthError::Refused`] when the provider refuses the code,
    /// [`OAuthError::Unavailable`] on transport errors and HTTP errors without
    /// an OAuth error body, [`OAuthError::Undocumented`] for other answers.
    pub async fn exchange(
        &self,
        provider: OAuthProvider,
        code: &str,
        pkce_verifier: &str,
    ) -> Result<ProviderTokens, OAuthError> {
        let client = self.client(provider)?;
        let shared = self.http.clone();
        let http = move |req: oauth2::HttpRequest| {
            let shared = shared.clone();
            async move { send(&shared, req).await }
        };
        let answer = client
            .exchange_code(AuthorizationCode::new(code.to_owned()))
            .set_pkce_verifier(PkceCodeVerifier::new(pkce_verifier.to_owned()))
            .request_async(&http)
            .await;
        match answer {
            Ok(token) => Ok(ProviderTokens {
                access_token: token.access_token().secret().clone(),
                refresh_token: token.refresh_token().map(|t| t.secret().clone()),
            }),
            Err(RequestTokenError::ServerResponse(e)) => {
                Err(OAuthError::Refused(e.error().as_ref().to_owned()))
            }
            Err(RequestTokenError::Request(e)) => Err(OAuthError::Unavailable(e.to_string())),
            Err(RequestTokenError::Parse(e, body)) => {
                // GitHub answers a refused code with HTTP 200 and
                // `{"error": "bad_verification_code", …}`.
                let value: serde_json::Value =
                    serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
                match value.get("error").and_then(|v| v.as_str()) {
                    Some(error) => Err(OAuthError::Refused(error.to_owned())),
                    None => Err(OAuthError::Undocumented(e.to_string())),
                }
            }
            Err(RequestTokenError::Other(e)) => Err(OAuthError::Unavailable(e)),
        }
    }

    /// The signed-in user's profile, read with the provider's access token.
    ///
    /// # Errors
    /// [`OAuthError::Unavailable`], [`OAuthError::Undocumented`],
    /// [`OAuthError::NoEmail`].
    pub async fn profile(
        &self,
        provider: OAuthProvider,
        tokens: &ProviderTokens,
    ) -> Result<OAuthProfile, OAuthError> {
        let p = self
            .provider(provider)
            .ok_or(OAuthError::Disabled(provider.as_str()))?;
        match provider {
            OAuthProvider::Github => {
                github::profile(&self.http, &p.profile_url, &tokens.access_token).await
            }
            OAuthProvider::Google => {
                google::profile(&self.http, &p.profile_url, &tokens.access_token).await
            }
        }
    }

    /// [`Self::exchange`] then [`Self::profile`] (a boxed `Send` future, so
    /// route handlers can await it).
    ///
    /// # Errors
    /// As theirs.
    pub fn sign_in<'a>(
        &'a self,
        provider: OAuthProvider,
        code: &'a str,
        pkce_verifier: &'a str,
    ) -> futures::future::BoxFuture<'a, Result<(ProviderTokens, OAuthProfile), OAuthError>> {
        Box::pin(async move {
            let upstream = crate::metrics::Upstream::start("oauth");
            let tokens = upstream.observe(self.exchange(provider, code, pkce_verifier).await)?;
            let upstream = crate::metrics::Upstream::start("oauth");
            let profile = upstream.observe(self.profile(provider, &tokens).await)?;
            Ok((tokens, profile))
        })
    }
}

/// The `oauth2` crate's async HTTP client over our reqwest client: the request
/// as built by `oauth2`, the answer read up to 64 KiB.
async fn send(
    http: &reqwest::Client,
    req: oauth2::HttpRequest,
) -> Result<oauth2::HttpResponse, HttpError> {
    let req = reqwest::Request::try_from(req).map_err(|e| HttpError::Transport(e.to_string()))?;
    let mut resp = http
        .execute(req)
        .await
        .map_err(|e| HttpError::Transport(e.to_string()))?;
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = read_bounded(&mut resp).await?;
    let mut out = oauth2::http::Response::new(body);
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    Ok(out)
}

async fn read_bounded(resp: &mut reqwest::Response) -> Result<Vec<u8>, HttpError> {
    let mut body = Vec::new();
    while let Some(chunk) = resp
        .chunk()
        .await
        .map_err(|e| HttpError::Transport(e.to_string()))?
    {
        body.extend_from_slice(&chunk);
        if body.len() > MAX_ANSWER {
            return Err(HttpError::TooLarge);
        }
    }
    Ok(body)
}

/// `GET url` with the provider's access token; the JSON answer (HTTP errors
/// are [`OAuthError::Unavailable`], non-JSON [`OAuthError::Undocumented`]).
pub(crate) async fn get_json(
    req: reqwest::RequestBuilder,
    access_token: &str,
) -> Result<serde_json::Value, OAuthError> {
    let mut resp = req
        .bearer_auth(access_token)
        .send()
        .await
        .map_err(|e| OAuthError::Unavailable(e.to_string()))?;
    let status = resp.status();
    let body = read_bounded(&mut resp)
        .await
        .map_err(|e| OAuthError::Unavailable(e.to_string()))?;
    if !status.is_success() {
        return Err(OAuthError::Unavailable(format!("HTTP {}", status.as_u16())));
    }
    serde_json::from_slice(&body).map_err(|e| OAuthError::Undocumented(format!("not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use wiremock::{
        matchers::{body_string_contains, header, method, path},
        Mock, MockServer, ResponseTemplate,
    };

    fn settings(server: &MockServer) -> OAuthSettings {
        let client = |id: &str| OAuthClientSettings {
            client_id: id.into(),
            client_secret: format!("{id}-secret"),
            auth_url: format!("{}/login/oauth/authorize", server.uri()),
            token_url: format!("{}/login/oauth/access_token", server.uri()),
            profile_url: server.uri(),
        };
        let mut google = client("google-id");
        google.token_url = format!("{}/token", server.uri());
        google.profile_url = format!("{}/v1/userinfo", server.uri());
        OAuthSettings {
            github: Some(client("gh-id")),
            google: Some(google),
            redirect_uri: "https://app.example.test/auth/v1/callback".into(),
            timeout: Duration::from_millis(500),
        }
    }

    #[tokio::test]
    async fn the_authorize_url_carries_state_pkce_and_scopes() {
        let server = MockServer::start().await;
        let clients = OAuthClients::new(&settings(&server)).unwrap();
        let scopes = entity::identity::oauth::scopes(OAuthProvider::Github, None).unwrap();
        let started = clients.authorize(OAuthProvider::Github, &scopes).unwrap();
        let url = url::Url::parse(&started.url).unwrap();
        assert_eq!(url.path(), "/login/oauth/authorize");
        let q: std::collections::HashMap<_, _> = url.query_pairs().into_owned().collect();
        assert_eq!(q["response_type"], "code");
        assert_eq!(q["client_id"], "gh-id");
        assert_eq!(
            q["redirect_uri"],
            "https://app.example.test/auth/v1/callback"
        );
        assert_eq!(q["scope"], "read:user user:email");
        assert_eq!(q["state"], started.state);
        assert!(started.state.len() >= 43, "32 random bytes, base64url");
        assert_eq!(q["code_challenge_method"], "S256");
        let expected = PkceCodeChallenge::from_code_verifier_sha256(&PkceCodeVerifier::new(
            started.pkce_verifier.clone(),
        ));
        assert_eq!(&q["code_challenge"], expected.as_str());
        assert!(!q.contains_key("client_secret"));
        let again = clients.authorize(OAuthProvider::Github, &scopes).unwrap();
        assert_ne!(again.state, started.state);
        assert_ne!(again.pkce_verifier, started.pkce_verifier);
    }

    #[tokio::test]
    async fn github_exchange_sends_secret_and_verifier_then_reads_the_profile() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/login/oauth/access_token"))
            .and(header("accept", "application/json"))
            .and(body_string_contains("grant_type=authorization_code"))
            .and(body_string_contains("code=the-code"))
            .and(body_string_contains("code_verifier=the-verifier"))
            .and(body_string_contains("client_id=gh-id"))
            .and(body_string_contains("client_secret=gh-id-secret"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "access_token": "gho_16C7e42F292c6912E7710c838347Ae178B4a",
                "scope": "read:user,user:email",
                "token_type": "bearer"
            })))
            .expect(1)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/user"))
            .and(header(
                "authorization",
                "Bearer gho_16C7e42F292c6912E7710c838347Ae178B4a",
            ))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "login": "octocat", "id": 583231, "name": "The Octocat",
                "avatar_url": "https://avatars.githubusercontent.com/u/583231?v=4",
                "email": null
            })))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/user/emails"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!([
                {"email": "octocat@github.com", "verified": true, "primary": true, "visibility": "public"}
            ])))
            .mount(&server)
            .await;
        let clients = OAuthClients::new(&settings(&server)).unwrap();
        let (tokens, profile) = clients
            .sign_in(OAuthProvider::Github, "the-code", "the-verifier")
            .await
            .unwrap();
        assert_eq!(
            tokens.access_token,
            "gho_16C7e42F292c6912E7710c838347Ae178B4a"
        );
        assert_eq!(profile.provider_id, "583231");
        assert_eq!(profile.email, "octocat@github.com");
        assert!(profile.email_verified);
    }

    #[tokio::test]
    async fn github_refusing_with_http_200_is_a_refusal() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/login/oauth/access_token"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "error": "bad_verification_code",
                "error_description": "The code passed is incorrect or expired.",
                "error_uri": "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#bad-verification-code"
            })))
            .mount(&server)
            .await;
        let clients = OAuthClients::new(&settings(&server)).unwrap();
        let e = clients
            .exchange(OAuthProvider::Github, "stale", "v")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, OAuthError::Refused(c) if c == "bad_verification_code"),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn google_exchange_and_userinfo() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .and(body_string_contains("code_verifier=vv"))
            .and(body_string_contains("client_secret=google-id-secret"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "access_token": "ya29.a0AfH6SM", "expires_in": 3599,
                "scope": "openid https://www.googleapis.com/auth/userinfo.email https://www.googleapis.com/auth/userinfo.profile",
                "token_type": "Bearer", "id_token": "eyJhbGciOi.x.y",
                "refresh_token": "1//0g-refresh"
            })))
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/v1/userinfo"))
            .and(header("authorization", "Bearer ya29.a0AfH6SM"))
            .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
                "sub": "110169484474386276334", "name": "Jane Doe",
                "picture": "https://lh3.googleusercontent.com/a/x.jpg",
                "email": "jane@example.com", "email_verified": true
            })))
            .mount(&server)
            .await;
        let clients = OAuthClients::new(&settings(&server)).unwrap();
        let (tokens, profile) = clients
            .sign_in(OAuthProvider::Google, "gc", "vv")
            .await
            .unwrap();
        assert_eq!(tokens.refresh_token.as_deref(), Some("1//0g-refresh"));
        assert_eq!(profile.provider_id, "110169484474386276334");
        assert_eq!(profile.email, "jane@example.com");
    }

    #[tokio::test]
    async fn invalid_grant_slow_and_failing_providers() {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/token"))
            .respond_with(ResponseTemplate::new(400).set_body_json(
                serde_json::json!({"error": "invalid_grant", "error_description": "Bad Request"}),
            ))
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/login/oauth/access_token"))
            .respond_with(
                ResponseTemplate::new(200)
                    .set_delay(Duration::from_secs(3))
                    .set_body_json(
                        serde_json::json!({"access_token": "x", "token_type": "bearer"}),
                    ),
            )
            .mount(&server)
            .await;
        let clients = OAuthClients::new(&settings(&server)).unwrap();
        let e = clients
            .exchange(OAuthProvider::Google, "c", "v")
            .await
            .unwrap_err();
        assert!(
            matches!(&e, OAuthError::Refused(c) if c == "invalid_grant"),
            "{e:?}"
        );
        let started = std::time::Instant::now();
        let e = clients
            .exchange(OAuthProvider::Github, "c", "v")
            .await
            .unwrap_err();
        assert!(matches!(e, OAuthError::Unavailable(_)), "{e:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "bounded by OAUTH_TIMEOUT_MS"
        );
        let tokens = ProviderTokens {
            access_token: "t".into(),
            refresh_token: None,
        };
        // No /v1/userinfo mock: wiremock answers 404.
        let e = clients
            .profile(OAuthProvider::Google, &tokens)
            .await
            .unwrap_err();
        assert!(matches!(e, OAuthError::Unavailable(_)), "{e:?}");
    }

    #[tokio::test]
    async fn a_disabled_provider_is_refused() {
        let server = MockServer::start().await;
        let mut s = settings(&server);
        s.google = None;
        let clients = OAuthClients::new(&s).unwrap();
        assert!(!clients.enabled(OAuthProvider::Google));
        assert!(matches!(
            clients.authorize(OAuthProvider::Google, &[]),
            Err(OAuthError::Disabled("google"))
        ));
    }
}
