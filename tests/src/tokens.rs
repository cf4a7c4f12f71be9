//! Session tokens (HS256, as the auth platform signs them).

use super::*;

/// Seconds since the Unix epoch.
pub fn unix_now() -> i64 {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs();
    i64::try_from(secs).expect("seconds fit i64")
}

/// Valid session claims for `sub` (any string, so malformed ones can be built
/// too): `aud` = `authenticated`, valid for an hour, `email` when given.
pub fn session_claims(sub: &str, email: Option<&str>) -> Value {
    let t = unix_now();
    let mut c = serde_json::json!({
        "sub": sub,
        "aud": "authenticated",
        "role": "authenticated",
        "iat": t,
        "exp": t + 3600,
    });
    if let Some(e) = email {
        c["email"] = serde_json::json!(e);
    }
    c
}

/// `claims` signed HS256 with `secret`.
pub fn hs256_token(secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        claims,
        &jsonwebtoken::EncodingKey::from_secret(secret),
    )
    .expect("sign token")
}

/// `token` with one character in the middle of its signature changed.
pub fn tamper_signature(token: &str) -> String {
    let dot = token.rfind('.').expect("three parts");
    let mut bytes = token.as_bytes().to_vec();
    let i = dot + 1 + (token.len() - dot - 1) / 2;
    bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
    String::from_utf8(bytes).expect("ascii")
}
