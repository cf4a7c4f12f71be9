//! Session verification (`api::identity::session`): HS256 and JWKS (RS256 / ES256 / EdDSA)
//! tokens, every rejection reason, and the JWKS cache (refetch on unknown `kid`,
//! coalescing, rate limit, unreachable JWKS).
//!
//! Keys were generated once with `openssl genpkey` (RSA 2048, EC P-256, Ed25519);
//! the JWK members (`n`, `x`, `y`) were derived from them with `openssl`.

use std::time::{Duration, Instant};

use api::identity::session::{
    bearer_token, mint_hs256, AuthError, SessionVerifier, AUDIENCE, JWKS_PATH,
};
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{json, Value};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const SECRET: &str = "test-secret-with-at-least-32-characters!!";

const RSA_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEvAIBADANBgkqhkiG9w0BAQEFAASCBKYwggSiAgEAAoIBAQDOHe0GrBShrRvs
3A4MCq+VO9kauvMTE8/SpuCVmsc1HC0X7DEHT/84SiUi++ja2JcLJdZ7ZrxzXWhM
vSkFzNG1GosqdfjH92fzLZbjVgev9sunxTFEBV6/DSrogoUuXzTpUshq2g67CXhM
QPikCzHUSEAK+fzaM+OhlsDzY+lbZbXdBIbvFf6CiOwd/lNp/KGG2Z10TETsrEZ/
5Uv0VK1oevXqlBNTfYpSRQ5Bqlq1kqQ5ECOOkG/owMU3q5Mz4zOk3keoEp8jSQpU
E2pgOI6FSx8arAQNmGjCMdV6ClZ/OQWgtmzK9JrRdyp5avKVQCYUtnS6ZTfQhrR2
fPHaQRS/AgMBAAECggEAH/N39+X6qBoCGgRTXHQsRgl00lXISBz079YfkAFiFQO3
onLiIhyOrHv4ksToZ+2q8wxGrx1nZB4cL3J5O/rFR/oujYKjxze9EkTEaZw/QnyS
6FXDQ89DTIFu39kaamxRcu56vpmWg/w9UjDAz7POjHY2EJ2Hn+RASp8TF7JVYm3e
vZntMUDrEMCxIjINzVWd62hZ3VniwFS+KeMw5oevjBqixrxfCNjslzOW+tKkluDV
uVogPoCl+Oqw2tEXFq7SpFdIYDBk3LEKBw22o6ZJMXQRZd3eulJnTelvC34e/wal
aL9k7uPl0mqxwtD91GoRR3uMGeKg6I4F2HNa6A5itQKBgQDw301sjvCWqTYov+Jm
X1E6V9BLWm1EK3IrxI3MtIgf2waGiNL0H0piQHXb3piNbL4H553zw3AQmZgg5iWg
nJ5q76WGe0f4/AWZyMagdFhapiD1AlKCbTeSR+85VtLdRZBoc44lIaqpaJ5uBgVX
0N4W7+LIOxoDypPvlUuhmHOjFQKBgQDbD9VQNnS3JUZVpV3tGV3jlO8bYonZWc+O
HUbfAge1q5rbqR9Vdcbfx3OCnCVs+DESPo8c1Q2ngsh0eD84iUTK6bI2TNzvCxS4
MeaV4odkm9sj4p5pELdHjdEj6UNuQo8Fm4q9edF+x7ha8XtRceFTWybVE91wDyoZ
mV3Qbv5dgwKBgAI9APouRdwQjHlKdy8eWaHiKQRaPcOxZ6kydWLelpk9Ls1XPiaY
l9db4/x8EAzYYtet9lDKkyMEWl6L5POeIPa7bV1Xje6pYN/x9q6NBjkpbAr6z4t4
ulh4pKdywBjgSZw+3qZHrs9OMpKxKaGMRlQOPJxBuFcqrb8/Mum4gfKVAoGAVu75
oFN8DhJkzyhJFgazE9XO7fc07WSO0b8cmPOdS6NGWVXMcYXD3pqwZGzDDXORRcQ9
1xtVx9xG4LG3pSAUhNIpPxNRuiuTlWV4NJMpV+viE2Ojqd5QXb0R+kZf1CnlyDvp
2ze0w7NOngim/7NJ0GKkDntLrWTXOEF80XK6zzECgYApW8YQ8zfJSRFomKArZUM4
DVXEz9GtR0I3JsTyWcm1/bTMEGdq6gPK6nojgDg2OKM62/4UgJGIjVpFWhf+IdM0
kfLhJe1aSOPYYzHBeq7WY6F1UPuJ01vv2P8JVWAhFLd3EG8iaIX/ywCaLOCRzgK6
Iva9MgSd2TfYMXNBHDet/g==
-----END PRIVATE KEY-----
";

/// The public half of [`RSA_PRIVATE_PEM`] (what an attacker would use as an HMAC secret).
const RSA_PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAzh3tBqwUoa0b7NwODAqv
lTvZGrrzExPP0qbglZrHNRwtF+wxB0//OEolIvvo2tiXCyXWe2a8c11oTL0pBczR
tRqLKnX4x/dn8y2W41YHr/bLp8UxRAVevw0q6IKFLl806VLIatoOuwl4TED4pAsx
1EhACvn82jPjoZbA82PpW2W13QSG7xX+gojsHf5TafyhhtmddExE7KxGf+VL9FSt
aHr16pQTU32KUkUOQapatZKkORAjjpBv6MDFN6uTM+MzpN5HqBKfI0kKVBNqYDiO
hUsfGqwEDZhowjHVegpWfzkFoLZsyvSa0XcqeWrylUAmFLZ0umU30Ia0dnzx2kEU
vwIDAQAB
-----END PUBLIC KEY-----
";

const RSA_N: &str = "zh3tBqwUoa0b7NwODAqvlTvZGrrzExPP0qbglZrHNRwtF-wxB0__OEolIvvo2tiXCyXWe2a8c11oTL0pBczRtRqLKnX4x_dn8y2W41YHr_bLp8UxRAVevw0q6IKFLl806VLIatoOuwl4TED4pAsx1EhACvn82jPjoZbA82PpW2W13QSG7xX-gojsHf5TafyhhtmddExE7KxGf-VL9FStaHr16pQTU32KUkUOQapatZKkORAjjpBv6MDFN6uTM-MzpN5HqBKfI0kKVBNqYDiOhUsfGqwEDZhowjHVegpWfzkFoLZsyvSa0XcqeWrylUAmFLZ0umU30Ia0dnzx2kEUvw";
const RSA_E: &str = "AQAB";

const EC_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgknDYndBpxWONqTD8
NPT9Gzjc/iTeC6FOteYdlxAnCsyhRANCAAQbo2lO0AwFycRWCcuJr4OCTGofaEZc
eHt24j4awvQGo4qeBiA/zF6OyC1Z3X6GtuST/RE5C8T3X1Y/OmlJn5gh
-----END PRIVATE KEY-----
";
const EC_X: &str = "G6NpTtAMBcnEVgnLia-DgkxqH2hGXHh7duI-GsL0BqM";
const EC_Y: &str = "ip4GID_MXo7ILVndfoa25JP9ETkLxPdfVj86aUmfmCE";

const ED_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MC4CAQAwBQYDK2VwBCIEIL+b6SBCow261luJPETL8IPA22MRI9GNlHoazhIEyUb9
-----END PRIVATE KEY-----
";
const ED_X: &str = "jAInQ2xVAl5osP76n4uE_Is2rbrtyzdpMC8qBu_q3dE";

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn rsa_jwk(kid: &str) -> Value {
    json!({"kty": "RSA", "kid": kid, "use": "sig", "alg": "RS256", "n": RSA_N, "e": RSA_E})
}

fn ec_jwk(kid: &str) -> Value {
    json!({"kty": "EC", "kid": kid, "use": "sig", "alg": "ES256", "crv": "P-256", "x": EC_X, "y": EC_Y})
}

fn ed_jwk(kid: &str) -> Value {
    json!({"kty": "OKP", "kid": kid, "crv": "Ed25519", "x": ED_X})
}

fn jwks(keys: Vec<Value>) -> Value {
    json!({ "keys": keys })
}

/// Standard valid claims for `sub`.
fn claims(sub: Uuid) -> Value {
    json!({
        "sub": sub.to_string(),
        "email": "user@example.com",
        "aud": AUDIENCE,
        "role": "authenticated",
        "iat": now(),
        "exp": now() + 3600,
    })
}

fn sign(alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let key = match alg {
        Algorithm::HS256 => EncodingKey::from_secret(SECRET.as_bytes()),
        Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512 => {
            EncodingKey::from_rsa_pem(RSA_PRIVATE_PEM.as_bytes()).unwrap()
        }
        Algorithm::ES256 => EncodingKey::from_ec_pem(EC_PRIVATE_PEM.as_bytes()).unwrap(),
        Algorithm::EdDSA => EncodingKey::from_ed_pem(ED_PRIVATE_PEM.as_bytes()).unwrap(),
        other => panic!("no test key for {other:?}"),
    };
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &key).unwrap()
}

fn hs256(claims: &Value) -> String {
    sign(Algorithm::HS256, None, claims)
}

/// A token with an arbitrary header (for `alg: none` and friends).
fn raw_token(header: &Value, claims: &Value, signature: &str) -> String {
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(header.to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        signature
    )
}

fn hs_only() -> SessionVerifier {
    SessionVerifier::new(Some(SECRET.into()), None, None)
}

async fn jwks_server(keys: Vec<Value>) -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(jwks(keys)))
        .mount(&server)
        .await;
    server
}

fn jwks_url(server: &MockServer) -> String {
    format!("{}{JWKS_PATH}", server.uri())
}

async fn fetches(server: &MockServer) -> usize {
    server.received_requests().await.unwrap().len()
}

fn all_keys() -> Vec<Value> {
    vec![rsa_jwk("rsa-1"), ec_jwk("ec-1"), ed_jwk("ed-1")]
}

// ---------------------------------------------------------------------------
// Accepted tokens
// ---------------------------------------------------------------------------

#[tokio::test]
async fn valid_hs256_is_accepted() {
    let sub = Uuid::new_v4();
    let token = mint_hs256(SECRET, sub, Some("a@example.com"), Duration::from_secs(600));
    let c = hs_only().verify(&token).await.unwrap();
    assert_eq!(c.sub, sub);
    assert_eq!(c.email.as_deref(), Some("a@example.com"));
    assert_eq!(c.role.as_deref(), Some("authenticated"));
    assert!(c.exp > now() + 500);

    // Without email, and with the claims built by hand.
    let token = mint_hs256(SECRET, sub, None, Duration::from_secs(60));
    assert_eq!(hs_only().verify(&token).await.unwrap().email, None);
    assert_eq!(
        hs_only().verify(&hs256(&claims(sub))).await.unwrap().sub,
        sub
    );

    // An empty email (phone sign-ups) is no email.
    let mut c = claims(sub);
    c["email"] = json!("");
    assert_eq!(hs_only().verify(&hs256(&c)).await.unwrap().email, None);

    // `aud` as an array that contains `authenticated`.
    let mut c = claims(sub);
    c["aud"] = json!(["other", AUDIENCE]);
    assert!(hs_only().verify(&hs256(&c)).await.is_ok());
}

#[tokio::test]
async fn valid_rs256_es256_eddsa_from_jwks_are_accepted_and_keys_are_cached() {
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let sub = Uuid::new_v4();
    for (alg, kid) in [
        (Algorithm::RS256, "rsa-1"),
        (Algorithm::ES256, "ec-1"),
        (Algorithm::EdDSA, "ed-1"),
    ] {
        let token = sign(alg, Some(kid), &claims(sub));
        let c = v
            .verify(&token)
            .await
            .unwrap_or_else(|e| panic!("{alg:?}: {e:?}"));
        assert_eq!(c.sub, sub);
        assert_eq!(c.email.as_deref(), Some("user@example.com"));
    }
    // Without a kid: every key whose type fits is tried.
    assert!(v
        .verify(&sign(Algorithm::RS256, None, &claims(sub)))
        .await
        .is_ok());
    assert!(v
        .verify(&sign(Algorithm::ES256, None, &claims(sub)))
        .await
        .is_ok());
    // The JWKS was fetched once for all of that.
    assert_eq!(fetches(&server).await, 1);

    // HS256 and JWKS side by side in one verifier.
    let both = SessionVerifier::new(Some(SECRET.into()), Some(jwks_url(&server)), None);
    assert!(both.verify(&hs256(&claims(sub))).await.is_ok());
    assert!(both
        .verify(&sign(Algorithm::RS256, Some("rsa-1"), &claims(sub)))
        .await
        .is_ok());
}

#[tokio::test]
async fn refresh_keys_warms_the_cache() {
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    assert_eq!(v.refresh_keys().await, Ok(3));
    assert!(v
        .verify(&sign(
            Algorithm::ES256,
            Some("ec-1"),
            &claims(Uuid::new_v4())
        ))
        .await
        .is_ok());
    assert_eq!(fetches(&server).await, 1);
    assert_eq!(hs_only().refresh_keys().await, Ok(0));
}

// ---------------------------------------------------------------------------
// Rejections
// ---------------------------------------------------------------------------

#[tokio::test]
async fn alg_none_is_rejected() {
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(Some(SECRET.into()), Some(jwks_url(&server)), None);
    let c = claims(Uuid::new_v4());
    let valid_sig = hs256(&c).rsplit('.').next().unwrap().to_string();
    for alg in [
        "none", "None", "NONE", "nOnE", "HS384", "HS512", "PS256", "ES512", "RSA-OAEP", "",
    ] {
        for sig in ["", valid_sig.as_str()] {
            let token = raw_token(&json!({"alg": alg, "typ": "JWT"}), &c, sig);
            assert_eq!(
                v.verify(&token).await,
                Err(AuthError::UnsupportedAlgorithm),
                "{alg}"
            );
        }
    }
    // No alg at all, or a non-string alg.
    let token = raw_token(&json!({"typ": "JWT"}), &c, &valid_sig);
    assert_eq!(v.verify(&token).await, Err(AuthError::Malformed));
    let token = raw_token(&json!({"alg": 1}), &c, &valid_sig);
    assert_eq!(v.verify(&token).await, Err(AuthError::Malformed));
    // Nothing asked the JWKS.
    assert_eq!(fetches(&server).await, 0);
}

#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_rejected() {
    // The JWKS also publishes the PEM as a symmetric `oct` key: it must be ignored too.
    let oct = json!({"kty": "oct", "kid": "oct-1", "k": URL_SAFE_NO_PAD.encode(RSA_PUBLIC_PEM)});
    let server = jwks_server(vec![rsa_jwk("rsa-1"), oct]).await;
    let c = claims(Uuid::new_v4());
    let forged = |kid: Option<&str>| {
        let mut header = Header::new(Algorithm::HS256);
        header.kid = kid.map(str::to_string);
        jsonwebtoken::encode(
            &header,
            &c,
            &EncodingKey::from_secret(RSA_PUBLIC_PEM.as_bytes()),
        )
        .unwrap()
    };

    // JWKS only: HS256 has no key at all.
    let jwks_only = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    for kid in [None, Some("rsa-1"), Some("oct-1")] {
        assert_eq!(
            jwks_only.verify(&forged(kid)).await,
            Err(AuthError::UnsupportedAlgorithm)
        );
    }
    // Secret + JWKS: HS256 is checked against the secret only.
    let both = SessionVerifier::new(Some(SECRET.into()), Some(jwks_url(&server)), None);
    for kid in [None, Some("rsa-1"), Some("oct-1")] {
        assert_eq!(
            both.verify(&forged(kid)).await,
            Err(AuthError::BadSignature)
        );
    }
    assert_eq!(fetches(&server).await, 0, "HS256 never consults the JWKS");

    // An RS256 token whose kid names a key of another type is not checked with it.
    let ec_server = jwks_server(vec![ec_jwk("ec-1")]).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&ec_server)), None);
    let token = sign(Algorithm::RS256, Some("ec-1"), &c);
    assert_eq!(v.verify(&token).await, Err(AuthError::UnknownKey));
    // An ES256 header on a key whose JWK says RS256.
    let token = raw_token(&json!({"alg": "ES256", "kid": "rsa-1"}), &c, "AAAA");
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    assert_eq!(v.verify(&token).await, Err(AuthError::UnknownKey));
}

#[tokio::test]
async fn expired_and_not_yet_valid() {
    let v = hs_only();
    let sub = Uuid::new_v4();

    let mut c = claims(sub);
    c["exp"] = json!(now() - 120);
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::Expired));
    // Within the 30 s leeway.
    c["exp"] = json!(now() - 10);
    assert!(v.verify(&hs256(&c)).await.is_ok());
    // No exp at all.
    let mut c = claims(sub);
    c.as_object_mut().unwrap().remove("exp");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::Malformed));

    let mut c = claims(sub);
    c["nbf"] = json!(now() + 120);
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::NotYetValid));
    c["nbf"] = json!(now() + 10);
    assert!(v.verify(&hs256(&c)).await.is_ok());
    c["nbf"] = json!(now() - 10);
    assert!(v.verify(&hs256(&c)).await.is_ok());

    // Same answers on the JWKS path.
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let mut c = claims(sub);
    c["exp"] = json!(now() - 120);
    assert_eq!(
        v.verify(&sign(Algorithm::RS256, Some("rsa-1"), &c)).await,
        Err(AuthError::Expired)
    );
    let mut c = claims(sub);
    c["nbf"] = json!(now() + 120);
    assert_eq!(
        v.verify(&sign(Algorithm::ES256, Some("ec-1"), &c)).await,
        Err(AuthError::NotYetValid)
    );
}

#[tokio::test]
async fn wrong_or_missing_audience() {
    let v = hs_only();
    let mut c = claims(Uuid::new_v4());
    c["aud"] = json!("anon");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::WrongAudience));
    c["aud"] = json!(["anon", "other"]);
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::WrongAudience));
    c.as_object_mut().unwrap().remove("aud");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::WrongAudience));
}

#[tokio::test]
async fn issuer_is_checked_when_configured() {
    let iss = "https://project.example.com/auth/v1";
    let v = SessionVerifier::new(Some(SECRET.into()), None, Some(iss.into()));
    let mut c = claims(Uuid::new_v4());
    c["iss"] = json!(iss);
    assert!(v.verify(&hs256(&c)).await.is_ok());
    c["iss"] = json!("https://evil.example.com/auth/v1");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::WrongIssuer));
    c.as_object_mut().unwrap().remove("iss");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::WrongIssuer));
    // Not configured: any (or no) issuer is fine.
    assert!(hs_only().verify(&hs256(&c)).await.is_ok());
}

#[tokio::test]
async fn bad_signatures() {
    let v = hs_only();
    let c = claims(Uuid::new_v4());
    let other = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &c,
        &EncodingKey::from_secret(b"another-secret-another-secret-xx"),
    )
    .unwrap();
    assert_eq!(v.verify(&other).await, Err(AuthError::BadSignature));

    // A valid token whose payload was swapped for another user's.
    let token = hs256(&c);
    let parts: Vec<&str> = token.split('.').collect();
    let mut c2 = c.clone();
    c2["sub"] = json!(Uuid::new_v4().to_string());
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(c2.to_string()),
        parts[2]
    );
    assert_eq!(v.verify(&tampered).await, Err(AuthError::BadSignature));
    // A zeroed signature of the right length, and a truncated one.
    let zeroed = format!(
        "{}.{}.{}",
        parts[0],
        parts[1],
        URL_SAFE_NO_PAD.encode([0u8; 32])
    );
    assert_eq!(v.verify(&zeroed).await, Err(AuthError::BadSignature));
    let truncated = &token[..token.len() - 4];
    assert!(matches!(
        v.verify(truncated).await,
        Err(AuthError::BadSignature | AuthError::Malformed)
    ));
    // A bad signature wins over an expired token (the claims are not trusted).
    let mut c3 = c.clone();
    c3["exp"] = json!(now() - 1000);
    let expired_forged = jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        &c3,
        &EncodingKey::from_secret(b"another-secret-another-secret-xx"),
    )
    .unwrap();
    assert_eq!(
        v.verify(&expired_forged).await,
        Err(AuthError::BadSignature)
    );

    // RS256 / ES256 / EdDSA with a tampered payload.
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    for (alg, kid) in [
        (Algorithm::RS256, Some("rsa-1")),
        (Algorithm::ES256, Some("ec-1")),
        (Algorithm::EdDSA, Some("ed-1")),
        (Algorithm::RS256, None),
    ] {
        let token = sign(alg, kid, &c);
        let parts: Vec<&str> = token.split('.').collect();
        let tampered = format!(
            "{}.{}.{}",
            parts[0],
            URL_SAFE_NO_PAD.encode(c2.to_string()),
            parts[2]
        );
        assert_eq!(
            v.verify(&tampered).await,
            Err(AuthError::BadSignature),
            "{alg:?} {kid:?}"
        );
    }
}

#[tokio::test]
async fn garbage_is_malformed_never_a_panic() {
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(Some(SECRET.into()), Some(jwks_url(&server)), None);
    let sig = "c2ln";
    let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256","typ":"JWT"}"#);
    let long = "a".repeat(20_000);
    let cases: Vec<String> = vec![
        "garbage".into(),
        "a.b".into(),
        "a.b.c".into(),
        "a.b.c.d".into(),
        "..".into(),
        "...".into(),
        "ü.ö.ä".into(),
        format!("{header}.."),
        format!("{header}.%%%.{sig}"),
        format!("{header}.{}.{sig}", URL_SAFE_NO_PAD.encode("not json")),
        format!(
            "{}.{}.{sig}",
            URL_SAFE_NO_PAD.encode("not json"),
            URL_SAFE_NO_PAD.encode("{}")
        ),
        format!("{long}.{long}.{long}"),
    ];
    for token in &cases {
        let r = v.verify(token).await;
        assert!(
            matches!(r, Err(AuthError::Malformed | AuthError::BadSignature)),
            "{token:.40}: {r:?}"
        );
    }
    assert_eq!(v.verify("").await, Err(AuthError::Missing));
    assert_eq!(v.verify("   ").await, Err(AuthError::Missing));

    // Well signed, but `sub` is not a UUID / claims have the wrong types.
    for (k, bad) in [
        ("sub", json!("user-42")),
        ("sub", json!(42)),
        ("exp", json!("tomorrow")),
        ("email", json!(7)),
    ] {
        let mut c = claims(Uuid::new_v4());
        c[k] = bad;
        assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::Malformed), "{k}");
    }
    let mut c = claims(Uuid::new_v4());
    c.as_object_mut().unwrap().remove("sub");
    assert_eq!(v.verify(&hs256(&c)).await, Err(AuthError::Malformed));

    // Random bytes in every position.
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..300 {
        let mut s = String::new();
        for _ in 0..(seed % 120) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            s.push(b"aZ09-_.=+/ \"{}"[(seed % 14) as usize] as char);
        }
        let r = v.verify(&s).await;
        assert!(r.is_err());
        assert!(r.unwrap_err().status() == 401, "{s}");
    }
}

#[test]
fn bearer_header_parsing() {
    let req = |value: Option<&str>| {
        let mut b = poem::Request::builder();
        if let Some(v) = value {
            b = b.header("Authorization", v);
        }
        b.finish()
    };
    assert_eq!(bearer_token(&req(None)), Err(AuthError::Missing));
    assert_eq!(
        bearer_token(&req(Some("Basic dXNlcjpwdw=="))),
        Err(AuthError::Missing)
    );
    assert_eq!(
        bearer_token(&req(Some("Bearer"))),
        Err(AuthError::Malformed)
    );
    assert_eq!(
        bearer_token(&req(Some("Bearer  "))),
        Err(AuthError::Malformed)
    );
    assert_eq!(
        bearer_token(&req(Some("eyJ.abc.def"))),
        Err(AuthError::Malformed)
    );
    assert_eq!(
        bearer_token(&req(Some("Bearer abc.def.ghi"))),
        Ok("abc.def.ghi")
    );
    assert_eq!(
        bearer_token(&req(Some("bearer abc.def.ghi"))),
        Ok("abc.def.ghi")
    );
    assert_eq!(
        bearer_token(&req(Some("BEARER   abc.def.ghi  "))),
        Ok("abc.def.ghi")
    );
}

#[tokio::test]
async fn missing_configuration_and_error_mapping() {
    let v = SessionVerifier::new(None, Some(String::new()), Some("  ".into()));
    assert!(!v.is_configured());
    let token = mint_hs256(SECRET, Uuid::new_v4(), None, Duration::from_secs(60));
    assert_eq!(v.verify(&token).await, Err(AuthError::NotConfigured));
    assert_eq!(AuthError::NotConfigured.status(), 503);
    assert_eq!(AuthError::KeysUnavailable.status(), 503);
    for e in [
        AuthError::Missing,
        AuthError::Malformed,
        AuthError::BadSignature,
        AuthError::Expired,
        AuthError::NotYetValid,
        AuthError::WrongAudience,
        AuthError::WrongIssuer,
        AuthError::UnsupportedAlgorithm,
        AuthError::UnknownKey,
    ] {
        assert_eq!(e.status(), 401, "{e:?}");
        assert!(e.code().chars().all(|c| c.is_ascii_lowercase() || c == '_'));
        assert!(!e.to_string().is_empty());
    }

    // Asymmetric token while only HS256 is configured.
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims(Uuid::new_v4()));
    assert_eq!(
        hs_only().verify(&token).await,
        Err(AuthError::UnsupportedAlgorithm)
    );
}

#[test]
fn from_settings_builds_the_jwks_url() {
    use std::collections::HashMap;
    let map: HashMap<&str, &str> = [
        ("NEXT_PUBLIC_BACKEND_URL", "https://project.example.com/"),
        ("BACKEND_JWT_SECRET", SECRET),
    ]
    .into();
    let settings = entity::Settings::from_source(&map).unwrap();
    let v = SessionVerifier::from_settings(&settings);
    assert!(v.is_configured());
    assert_eq!(
        v.jwks_url(),
        Some("https://project.example.com/auth/v1/.well-known/jwks.json")
    );
    let map: HashMap<&str, &str> = HashMap::new();
    let v = SessionVerifier::from_settings(&entity::Settings::from_source(&map).unwrap());
    assert!(!v.is_configured());
    assert_eq!(v.jwks_url(), None);
}

// ---------------------------------------------------------------------------
// JWKS cache behaviour
// ---------------------------------------------------------------------------

#[tokio::test]
async fn unknown_kid_refetches_once_then_accepts() {
    let server = jwks_server(vec![rsa_jwk("rsa-1")]).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let c = claims(Uuid::new_v4());
    assert!(v
        .verify(&sign(Algorithm::RS256, Some("rsa-1"), &c))
        .await
        .is_ok());
    assert_eq!(fetches(&server).await, 1);

    // The platform rotates: the JWKS now also has rsa-2 and an EC key.
    server.reset().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(jwks(vec![
            rsa_jwk("rsa-1"),
            rsa_jwk("rsa-2"),
            ec_jwk("ec-1"),
        ])))
        .mount(&server)
        .await;
    assert!(v
        .verify(&sign(Algorithm::RS256, Some("rsa-2"), &c))
        .await
        .is_ok());
    assert_eq!(fetches(&server).await, 1, "exactly one refetch");
    // The new set is cached: the EC key needs no fetch.
    assert!(v
        .verify(&sign(Algorithm::ES256, Some("ec-1"), &c))
        .await
        .is_ok());
    // A still-unknown kid right after: rejected without another fetch (30 s limit).
    assert_eq!(
        v.verify(&sign(Algorithm::RS256, Some("rsa-3"), &c)).await,
        Err(AuthError::UnknownKey)
    );
    assert_eq!(fetches(&server).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_requests_share_one_fetch() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(jwks(all_keys()))
                .set_delay(Duration::from_millis(300)),
        )
        .mount(&server)
        .await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims(Uuid::new_v4()));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (v, token) = (v.clone(), token.clone());
            tokio::spawn(async move { v.verify(&token).await })
        })
        .collect();
    for t in tasks {
        assert!(t.await.unwrap().is_ok());
    }
    assert_eq!(fetches(&server).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_flood_of_random_kids_causes_at_most_one_refetch() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(jwks(all_keys()))
                .set_delay(Duration::from_millis(100)),
        )
        .mount(&server)
        .await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let c = claims(Uuid::new_v4());
    assert_eq!(v.refresh_keys().await, Ok(3));
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let v = v.clone();
            let token = sign(Algorithm::RS256, Some(&format!("random-{i}")), &c);
            tokio::spawn(async move { v.verify(&token).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Err(AuthError::UnknownKey));
    }
    // The warm-up fetch plus at most one refetch.
    assert!(
        fetches(&server).await <= 2,
        "{} fetches",
        fetches(&server).await
    );
    // Known keys still verify from the cache.
    assert!(v
        .verify(&sign(Algorithm::RS256, Some("rsa-1"), &c))
        .await
        .is_ok());
}

#[tokio::test]
async fn jwks_server_down_gives_keys_unavailable_quickly() {
    // Nothing listens on the port: refused at once.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let v = SessionVerifier::new(
        Some(SECRET.into()),
        Some(format!("http://127.0.0.1:{port}{JWKS_PATH}")),
        None,
    );
    let token = sign(Algorithm::RS256, Some("rsa-1"), &claims(Uuid::new_v4()));
    let t0 = Instant::now();
    assert_eq!(v.verify(&token).await, Err(AuthError::KeysUnavailable));
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(v.refresh_keys().await, Err(AuthError::KeysUnavailable));
    // HS256 tokens are not affected.
    assert!(v.verify(&hs256(&claims(Uuid::new_v4()))).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hanging_jwks_server_times_out_within_about_3_seconds() {
    let server = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(jwks(all_keys()))
                .set_delay(Duration::from_secs(30)),
        )
        .mount(&server)
        .await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let token = sign(Algorithm::ES256, Some("ec-1"), &claims(Uuid::new_v4()));
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let (v, token) = (v.clone(), token.clone());
            tokio::spawn(async move { v.verify(&token).await })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap(), Err(AuthError::KeysUnavailable));
    }
    let took = t0.elapsed();
    assert!(took < Duration::from_millis(3_800), "{took:?}");
    // Waiters shared the one failed fetch, and the next request does not wait again.
    assert_eq!(fetches(&server).await, 1);
    let t1 = Instant::now();
    assert_eq!(v.verify(&token).await, Err(AuthError::KeysUnavailable));
    assert!(
        t1.elapsed() < Duration::from_millis(200),
        "{:?}",
        t1.elapsed()
    );
}

#[tokio::test]
async fn jwks_http_error_or_bad_body_gives_keys_unavailable() {
    for response in [
        ResponseTemplate::new(500),
        ResponseTemplate::new(404),
        ResponseTemplate::new(200).set_body_string("<html>"),
    ] {
        let server = MockServer::start().await;
        Mock::given(method("GET"))
            .and(path(JWKS_PATH))
            .respond_with(response)
            .mount(&server)
            .await;
        let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
        let token = sign(Algorithm::RS256, Some("rsa-1"), &claims(Uuid::new_v4()));
        assert_eq!(v.verify(&token).await, Err(AuthError::KeysUnavailable));
    }
}

// ---------------------------------------------------------------------------
// Hot path
// ---------------------------------------------------------------------------

/// A repeated token is answered again with the same claims, from the keys
/// fetched once. How fast that is, is a benchmark, not a test:
/// `bash bench/run.sh verify` (see BENCHMARKS.md).
#[tokio::test]
async fn repeated_tokens_verify_again_from_one_key_fetch() {
    let server = jwks_server(all_keys()).await;
    let v = SessionVerifier::new(Some(SECRET.into()), Some(jwks_url(&server)), None);
    let c = claims(Uuid::new_v4());
    for (name, token) in [
        ("HS256", hs256(&c)),
        ("RS256", sign(Algorithm::RS256, Some("rsa-1"), &c)),
        ("ES256", sign(Algorithm::ES256, Some("ec-1"), &c)),
        ("EdDSA", sign(Algorithm::EdDSA, Some("ed-1"), &c)),
    ] {
        let first = v.verify(&token).await.unwrap();
        for _ in 0..100 {
            assert_eq!(v.verify(&token).await.unwrap(), first, "{name}");
        }
    }
    assert_eq!(fetches(&server).await, 1);
}

#[tokio::test]
async fn remembered_tokens_die_with_their_key_set() {
    let server = jwks_server(vec![rsa_jwk("rsa-1")]).await;
    let v = SessionVerifier::new(None, Some(jwks_url(&server)), None);
    let c = claims(Uuid::new_v4());
    let old = sign(Algorithm::RS256, Some("rsa-1"), &c);
    assert!(v.verify(&old).await.is_ok());
    assert!(v.verify(&old).await.is_ok());

    // rsa-1 is withdrawn; a token for the new key triggers the refetch.
    server.reset().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(jwks(vec![rsa_jwk("rsa-2")])))
        .mount(&server)
        .await;
    assert!(v
        .verify(&sign(Algorithm::RS256, Some("rsa-2"), &c))
        .await
        .is_ok());
    assert_eq!(v.verify(&old).await, Err(AuthError::UnknownKey));

    // A remembered token does not make a tampered twin pass.
    let fresh = sign(Algorithm::RS256, Some("rsa-2"), &c);
    assert!(v.verify(&fresh).await.is_ok());
    let parts: Vec<&str> = fresh.split('.').collect();
    let mut c2 = c.clone();
    c2["sub"] = json!(Uuid::new_v4().to_string());
    let tampered = format!(
        "{}.{}.{}",
        parts[0],
        URL_SAFE_NO_PAD.encode(c2.to_string()),
        parts[2]
    );
    assert_eq!(v.verify(&tampered).await, Err(AuthError::BadSignature));
}
