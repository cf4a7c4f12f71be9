//! Sign-in with GitHub and Google: each provider's client settings.

use std::{fmt, time::Duration};

use super::{err, Reader, SettingsError, Source};

/// One OAuth provider's client registration and endpoints (`OAUTH_<P>_*`).
/// The provider is enabled when both its client id and secret are set.
#[derive(Clone, PartialEq, Eq)]
pub struct OAuthClientSettings {
    /// `OAUTH_<P>_CLIENT_ID`.
    pub client_id: String,
    /// `OAUTH_<P>_CLIENT_SECRET` (never printed).
    pub client_secret: String,
    /// The authorization endpoint the browser is sent to.
    pub auth_url: String,
    /// The token endpoint the code is exchanged at.
    pub token_url: String,
    /// GitHub: the REST API base (`/user`, `/user/emails` under it); Google:
    /// the OpenID Connect userinfo endpoint.
    pub profile_url: String,
}
impl fmt::Debug for OAuthClientSettings {
    /// The secret is never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthClientSettings")
            .field("client_id", &self.client_id)
            .field("client_secret", &"<redacted>")
            .field("auth_url", &self.auth_url)
            .field("token_url", &self.token_url)
            .field("profile_url", &self.profile_url)
            .finish()
    }
}
/// OAuth sign-in settings (`OAUTH_*`): the enabled providers and the callback
/// URL registered with them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OAuthSettings {
    /// GitHub: `OAUTH_GITHUB_CLIENT_ID` + `OAUTH_GITHUB_CLIENT_SECRET`;
    /// `OAUTH_GITHUB_BASE_URL` (default `https://github.com`: authorize at
    /// `/login/oauth/authorize`, token at `/login/oauth/access_token`),
    /// `OAUTH_GITHUB_API_URL` (default `https://api.github.com`).
    pub github: Option<OAuthClientSettings>,
    /// Google: `OAUTH_GOOGLE_CLIENT_ID` + `OAUTH_GOOGLE_CLIENT_SECRET`;
    /// `OAUTH_GOOGLE_AUTH_URL` (default
    /// `https://accounts.google.com/o/oauth2/v2/auth`), `OAUTH_GOOGLE_TOKEN_URL`
    /// (default `https://oauth2.googleapis.com/token`),
    /// `OAUTH_GOOGLE_USERINFO_URL` (default
    /// `https://openidconnect.googleapis.com/v1/userinfo`).
    pub google: Option<OAuthClientSettings>,
    /// `OAUTH_REDIRECT_URI`: the callback URL registered with the providers
    /// (default `{API_EXTERNAL_URL}/auth/v1/callback`: the API serves it).
    pub redirect_uri: String,
    /// `OAUTH_TIMEOUT_MS`: bound on one whole call to a provider (token
    /// exchange, profile), connect included (default 10000, 100–120000);
    /// connecting alone is bounded by the smaller of this and 3 s.
    pub timeout: Duration,
}
impl OAuthSettings {
    pub(super) fn read<S: Source + ?Sized>(
        r: &Reader<'_, S>,
        api_url: &str,
    ) -> Result<Self, SettingsError> {
        let web = ["https", "http"];
        let pair = |id_var: &'static str,
                    secret_var: &'static str|
         -> Result<Option<(String, String)>, SettingsError> {
            match (r.opt(id_var), r.opt(secret_var)) {
                (None, None) => Ok(None),
                (Some(_), None) => Err(err(secret_var, format!("must be set with {id_var}"))),
                (None, Some(_)) => Err(err(id_var, format!("must be set with {secret_var}"))),
                (Some(id), Some(secret)) => Ok(Some((id, secret))),
            }
        };
        let github = match pair("OAUTH_GITHUB_CLIENT_ID", "OAUTH_GITHUB_CLIENT_SECRET")? {
            None => None,
            Some((client_id, client_secret)) => {
                let base = r
                    .url("OAUTH_GITHUB_BASE_URL", &web)?
                    .unwrap_or_else(|| "https://github.com".into());
                Some(OAuthClientSettings {
                    client_id,
                    client_secret,
                    auth_url: format!("{base}/login/oauth/authorize"),
                    token_url: format!("{base}/login/oauth/access_token"),
                    profile_url: r
                        .url("OAUTH_GITHUB_API_URL", &web)?
                        .unwrap_or_else(|| "https://api.github.com".into()),
                })
            }
        };
        let google = match pair("OAUTH_GOOGLE_CLIENT_ID", "OAUTH_GOOGLE_CLIENT_SECRET")? {
            None => None,
            Some((client_id, client_secret)) => Some(OAuthClientSettings {
                client_id,
                client_secret,
                auth_url: r
                    .url("OAUTH_GOOGLE_AUTH_URL", &web)?
                    .unwrap_or_else(|| "https://accounts.google.com/o/oauth2/v2/auth".into()),
                token_url: r
                    .url("OAUTH_GOOGLE_TOKEN_URL", &web)?
                    .unwrap_or_else(|| "https://oauth2.googleapis.com/token".into()),
                profile_url: r
                    .url("OAUTH_GOOGLE_USERINFO_URL", &web)?
                    .unwrap_or_else(|| "https://openidconnect.googleapis.com/v1/userinfo".into()),
            }),
        };
        let redirect_uri = r
            .url("OAUTH_REDIRECT_URI", &web)?
            .unwrap_or_else(|| format!("{}/auth/v1/callback", api_url.trim_end_matches('/')));
        let timeout =
            Duration::from_millis(r.num_or("OAUTH_TIMEOUT_MS", 10_000u64, 100, 120_000)?);
        Ok(OAuthSettings {
            github,
            google,
            redirect_uri,
            timeout,
        })
    }
}
