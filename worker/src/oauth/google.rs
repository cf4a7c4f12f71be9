//! Google's profile: the OpenID Connect userinfo endpoint
//! (`GET https://openidconnect.googleapis.com/v1/userinfo` with the access
//! token; scopes `openid email profile`), answering the standard claims
//! `sub`, `email`, `email_verified`, `name`, `given_name`, `family_name`,
//! `picture`, `locale`.

use serde::Deserialize;
use serde_json::json;

use super::{get_json, OAuthError, OAuthProfile};
use entity::identity::oauth::OAuthProvider;

/// The `iss` Google identities carry in `user_metadata`.
pub const ISSUER: &str = "https://accounts.google.com";

/// The userinfo claims we read.
#[derive(Debug, Deserialize)]
pub struct GoogleUserinfo {
    /// The stable account id.
    pub sub: String,
    /// The address, with scope `email`.
    #[serde(default)]
    pub email: Option<String>,
    /// `true`/`false` (some answers send the strings `"true"`/`"false"`).
    #[serde(default)]
    pub email_verified: Option<serde_json::Value>,
    /// Full name, with scope `profile`.
    #[serde(default)]
    pub name: Option<String>,
    /// Picture URL, with scope `profile`.
    #[serde(default)]
    pub picture: Option<String>,
}

/// The profile from the documented userinfo answer.
///
/// # Errors
/// [`OAuthError::NoEmail`] without `email`.
pub fn to_profile(info: &GoogleUserinfo) -> Result<OAuthProfile, OAuthError> {
    let email = info
        .email
        .clone()
        .filter(|e| !e.is_empty())
        .ok_or(OAuthError::NoEmail)?;
    let email_verified = match &info.email_verified {
        Some(serde_json::Value::Bool(b)) => *b,
        Some(serde_json::Value::String(s)) => s.eq_ignore_ascii_case("true"),
        _ => false,
    };
    Ok(OAuthProfile {
        provider: OAuthProvider::Google,
        provider_id: info.sub.clone(),
        email: email.clone(),
        email_verified,
        user_metadata: json!({
            "iss": ISSUER,
            "sub": info.sub,
            "provider_id": info.sub,
            "email": email,
            "email_verified": email_verified,
            "phone_verified": false,
            "name": info.name,
            "full_name": info.name,
            "avatar_url": info.picture,
            "picture": info.picture,
        }),
    })
}

/// Reads the userinfo endpoint at `url`.
///
/// # Errors
/// [`OAuthError::Unavailable`], [`OAuthError::Undocumented`],
/// [`OAuthError::NoEmail`].
pub async fn profile(
    http: &reqwest::Client,
    url: &str,
    access_token: &str,
) -> Result<OAuthProfile, OAuthError> {
    let value = get_json(
        http.get(url).header("Accept", "application/json"),
        access_token,
    )
    .await?;
    let info: GoogleUserinfo = serde_json::from_value(value)
        .map_err(|e| OAuthError::Undocumented(format!("userinfo: {e}")))?;
    to_profile(&info)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_userinfo_makes_a_profile() {
        let info: GoogleUserinfo = serde_json::from_value(json!({
            "sub": "110169484474386276334",
            "name": "Jane Doe", "given_name": "Jane", "family_name": "Doe",
            "picture": "https://lh3.googleusercontent.com/a/photo.jpg",
            "email": "jane@example.com", "email_verified": true, "locale": "en"
        }))
        .unwrap();
        let p = to_profile(&info).unwrap();
        assert_eq!(p.provider_id, "110169484474386276334");
        assert!(p.email_verified);
        assert_eq!(
            p.user_metadata["avatar_url"],
            "https://lh3.googleusercontent.com/a/photo.jpg"
        );
        assert_eq!(p.user_metadata["full_name"], "Jane Doe");
    }

    #[test]
    fn string_verified_flags_and_missing_email() {
        let info: GoogleUserinfo = serde_json::from_value(
            json!({"sub": "1", "email": "a@example.com", "email_verified": "false"}),
        )
        .unwrap();
        assert!(!to_profile(&info).unwrap().email_verified);
        let info: GoogleUserinfo = serde_json::from_value(json!({"sub": "1"})).unwrap();
        assert!(matches!(to_profile(&info), Err(OAuthError::NoEmail)));
    }
}
