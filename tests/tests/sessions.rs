//! Logged-in routes against the real `api`, PostgreSQL and Redis: session
//! tokens (HS256, and RS256/ES256 from a JWKS served by a fake auth platform),
//! first-sight provisioning under concurrent first requests, subscription
//! cancel/resume, profile save, admin role changes with their audit row, the
//! `ADMIN_EMAILS` bootstrap and the 503 readiness gates.

use std::{path::Path, process::Command, time::Duration};

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use futures::future::join_all;
use jsonwebtoken::{
    jwk::{Jwk, PublicKeyUse},
    Algorithm, EncodingKey, Header,
};
use sea_orm::sqlx::{self, PgPool};
use serde_json::{json, Value};
use tests::{
    client, session_claims as claims, tamper_signature, unix_now as now, EnvMap, Proc, Reply, Stack,
};
use uuid::Uuid;
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const SECRET: &str = "sessions-test-secret-0123456789abcdef0123456789";
const JWKS_PATH: &str = "/auth/v1/.well-known/jwks.json";
const PROFILE: &str = "/api/profile";
const SUBSCRIPTION: &str = "/api/subscription";
const ROLE: &str = "/api/admin/users/role";

// ---------------------------------------------------------------------------
// Environment, tokens, requests
// ---------------------------------------------------------------------------

fn sign(alg: Algorithm, key: &EncodingKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, key).expect("sign token")
}

fn session_env(stack: &Stack) -> EnvMap {
    stack.session_env(SECRET, "service-role-test-key-0123456789abcdef")
}

fn hs256_with(secret: &[u8], claims: &Value) -> String {
    sign(
        Algorithm::HS256,
        &EncodingKey::from_secret(secret),
        None,
        claims,
    )
}

fn hs256(claims: &Value) -> String {
    hs256_with(SECRET.as_bytes(), claims)
}

/// A valid HS256 session token of `user`.
fn token(user: Uuid, email: &str) -> String {
    hs256(&claims(&user.to_string(), Some(email)))
}

fn b64(v: &Value) -> String {
    URL_SAFE_NO_PAD.encode(v.to_string())
}

/// `POST route` with a JSON body and an optional raw `Authorization` value.
async fn post(api: &Proc, route: &str, authorization: Option<&str>, body: &Value) -> Reply {
    let mut req = client().post(api.url(route)).json(body);
    if let Some(a) = authorization {
        req = req.header("authorization", a);
    }
    Reply::send(req).await
}

/// `POST route` as the holder of `token`.
async fn post_as(api: &Proc, route: &str, token: &str, body: &Value) -> Reply {
    post(api, route, Some(&format!("Bearer {token}")), body).await
}

/// `POST route` as the holder of `token`, with a raw JSON text body.
async fn post_raw_as(api: &Proc, route: &str, token: &str, raw: &str) -> Reply {
    Reply::send(
        client()
            .post(api.url(route))
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(raw.to_string()),
    )
    .await
}

/// `api token --sub <user> --email <email>` with `env`; its stdout, trimmed.
async fn mint_with_command(stack: &Stack, env: &EnvMap, user: Uuid, email: &str) -> String {
    let sub = user.to_string();
    let mut p = Proc::spawn(
        "api",
        &["token", "--sub", &sub, "--email", email],
        env,
        stack.dir.path(),
    );
    let status = p
        .wait_exit(Duration::from_secs(30))
        .await
        .unwrap_or_else(|| panic!("`api token` did not finish; stderr:\n{}", p.stderr()));
    // Let the reader threads drain the pipes.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(
        status.success(),
        "`api token` failed ({status}); stderr:\n{}",
        p.stderr()
    );
    let out = p.stdout().trim().to_string();
    assert_eq!(
        out.split('.').count(),
        3,
        "`api token` printed no JWT: {out:?}"
    );
    out
}

// ---------------------------------------------------------------------------
// PostgreSQL reads
// ---------------------------------------------------------------------------

/// Rows of `user` in users, profiles, subscriptions, user_roles.
async fn row_counts(pool: &PgPool, user: Uuid) -> [i64; 4] {
    let (a, b, c, d): (i64, i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM users WHERE id::text = $1), \
                (SELECT count(*) FROM profiles WHERE user_id::text = $1), \
                (SELECT count(*) FROM subscriptions WHERE user_id::text = $1), \
                (SELECT count(*) FROM user_roles WHERE user_id::text = $1)",
    )
    .bind(user.to_string())
    .fetch_one(pool)
    .await
    .expect("count the user's rows");
    [a, b, c, d]
}

async fn count_users(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(pool)
        .await
        .expect("count users")
}

async fn role_of(pool: &PgPool, user: Uuid) -> Option<String> {
    sqlx::query_scalar("SELECT role FROM user_roles WHERE user_id::text = $1")
        .bind(user.to_string())
        .fetch_optional(pool)
        .await
        .expect("SELECT user_roles")
}

/// The subscription row of `user` as it is stored.
#[derive(Debug, PartialEq, Eq)]
struct SubRow {
    plan: String,
    status: String,
    cancel_at_period_end: bool,
    canceled_at_set: bool,
}

async fn subscription_of(pool: &PgPool, user: Uuid) -> SubRow {
    let (plan, status, cancel_at_period_end, canceled_at_set): (String, String, bool, bool) =
        sqlx::query_as(
            "SELECT plan, status, cancel_at_period_end, canceled_at IS NOT NULL \
             FROM subscriptions WHERE user_id::text = $1",
        )
        .bind(user.to_string())
        .fetch_one(pool)
        .await
        .expect("SELECT subscriptions");
    SubRow {
        plan,
        status,
        cancel_at_period_end,
        canceled_at_set,
    }
}

/// One `audit_logs` row.
#[derive(Debug)]
struct Audit {
    actor_id: Option<String>,
    action: String,
    target_type: String,
    target_id: String,
    old_value: Value,
    new_value: Value,
    request_id: Option<String>,
    client_request_id: Option<String>,
}

type AuditTuple = (
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The `role.change` audit rows (an admin's changes; the `role.grant` rows of
/// `ADMIN_EMAILS` / `ADMIN_USER_IDS` are counted apart).
async fn audit_rows(pool: &PgPool) -> Vec<Audit> {
    let rows: Vec<AuditTuple> = sqlx::query_as(
        "SELECT actor_id::text, action, target_type, target_id, old_value::text, \
                new_value::text, request_id, client_request_id \
         FROM audit_logs WHERE action = 'role.change' ORDER BY created_at, id",
    )
    .fetch_all(pool)
    .await
    .expect("SELECT audit_logs");
    let parse = |v: Option<String>| {
        v.map(|s| serde_json::from_str(&s).expect("audit value is JSON"))
            .unwrap_or(Value::Null)
    };
    rows.into_iter()
        .map(
            |(
                actor_id,
                action,
                target_type,
                target_id,
                old,
                new,
                request_id,
                client_request_id,
            )| Audit {
                actor_id,
                action,
                target_type,
                target_id,
                old_value: parse(old),
                new_value: parse(new),
                request_id,
                client_request_id,
            },
        )
        .collect()
}

// ---------------------------------------------------------------------------
// Asymmetric keys for the fake JWKS
// ---------------------------------------------------------------------------

/// Used only when the `openssl` CLI is not available.
const FALLBACK_RSA_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQDAjvLnWDrDMYmg
tRVb6s0PzC21jlgGzIpLDSGrb0anE6VUwdESiNXv1efmiFOKvzTYl6tppg3y6RzA
68cAN1rdXkQFZwJCHm4frk417A7fsZjnnClz8JkiQBOMaYlA0sxvU0AeA2Fz5u7Q
+uHWhFn0jhKEYEVd5dbh020ZVyd0d9cJ4bUWIMV9VvSRH2QK5RT0lQYQeP0GhEyb
hzjOrcKnqjmk1R4v+rlhKa5cmY9PgS/+bKU0SL6p+26k3W77wDYVyMl+aKsPZa11
pOwsVD3GxUpBPxd/KZJmmuHc2zWDdKLR6pcvXm0sXt2OSsb3yfLUY0Glo64jdyr3
8Uyl2fibAgMBAAECggEAPT4563KYXfSnfUGa5X0sc1XRQ+ld/euYIH6wssHVitYo
w2hRgr+aq4kxFJVPXNWrjSfQEO4LibKyvnk+9calU7rjj4RPp4/eHp1lqqjFokfu
BdwZIxLm4YnXrdTzHnbtJosn3WPd3usYEcd5hKzbn3iAUzH7Xf339iM0k9awac4V
+S/CitfDB2JP2pLPl6fmJ1E2Yho2IVI+Es82uWCRdh8w8C3Hm8hl9Jo+9hViKqcZ
HS98zTakR5HsdPAVB4FjRIHTFvzZJuxrANoWM8+hURowbPuKK3yFoQTxFrysopUj
h1MS4k1+fpCg8V+oBxt3nYMba2IMz49UWRDEUmS4IQKBgQDzNZLVBRhUC2Q99eR8
f6EP5GnAyuFMRubGoWAaaW+MOJOMzcKjMjlEVgHJ6ZNRamgPciObnqXY26ASlxEJ
xZNyB+1WOAKOBPaZW70+7ATdEh2WDKl9FlNeOjCVMky0TME2gWEp1iEn4X1WlgEe
O5k+HHHoTu0rW8+L9YgdtNjZFQKBgQDKr3ESJNoX8kzSQQAfRc58c3ZQxqQ3BJW4
OJPEu1JrBAh9Md/VUPn7GTQhXNCXmZ+wPZOi/8HUSi24bSWielVPgIGBBUHnva2x
C745rnqlCDnWaGnkA3R6D+PczvAgo7EKAY7aZK5mZzzowb/j5iaZ+0MiPKhcJXw+
RhgO0qGW7wKBgGyUr4AxLSJgj5lmDWNT68lXlatAKIPQZ7moVGqWRfnZTG6hclM/
2fdbWqMVh/LiSaETuTgCBVMjAn0qOq4dKm3PgjNrACD9sEbZgUz1PFqietkBwC2b
aQ75dbU2Zq5cUiqOap2t/tF6R2X/xHIF862aL3SiwBoKfEelD+cLVYDdAoGBAKxi
GJ3g3+i7+GBeTjdKzLqGDRvYRnRQnvHmlK8ezpMcBAhOsdugmmvYXMD/Sp2VV/6x
8G4Sbg0a5dXUZszQlNwgJITSLuJlLWPF5Az0+3R/EYnslhsKYTcrapYzHoH0Fq+2
8YOHW9jWdzRTDNxMs4oE7G0i/+IXM5tXTEDXHf3bAoGAJScD43ThPzOUBLggwQvM
ev4gnRNyD5h8vz8YCHHHp79Bp9k5G2WgjTOxIok/GUEDPsPFYadWvRv/bZO5Egrd
47KuoNTlqyEMc+7vNZXeP35PxXzoKsaRhZ3LStavAa7nS8PeJVzoyXKZxtMzHrE3
7nhQdmJrtGmj6yFthKLSevU=
-----END PRIVATE KEY-----
";

/// The public half of [`FALLBACK_RSA_PEM`].
const FALLBACK_RSA_PUBLIC_PEM: &str = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEAwI7y51g6wzGJoLUVW+rN
D8wttY5YBsyKSw0hq29GpxOlVMHREojV79Xn5ohTir802JeraaYN8ukcwOvHADda
3V5EBWcCQh5uH65ONewO37GY55wpc/CZIkATjGmJQNLMb1NAHgNhc+bu0Prh1oRZ
9I4ShGBFXeXW4dNtGVcndHfXCeG1FiDFfVb0kR9kCuUU9JUGEHj9BoRMm4c4zq3C
p6o5pNUeL/q5YSmuXJmPT4Ev/mylNEi+qftupN1u+8A2FcjJfmirD2WtdaTsLFQ9
xsVKQT8XfymSZprh3Ns1g3Si0eqXL15tLF7djkrG98ny1GNBpaOuI3cq9/FMpdn4
mwIDAQAB
-----END PUBLIC KEY-----
";

/// Used only when the `openssl` CLI is not available (P-256, PKCS#8).
const FALLBACK_EC_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgDKlw8I1hMBTAI7ez
HBXCzC1LlaoTbb19aoaexYFoNKmhRANCAAS63Za1wkzWK/HBbHvhZr24U/GQq3De
kkoUQ8aLaSSwnXLrMxLC7Lb+9RkSlRjN/FmGztrGDrRlnCiDjcGZyNt9
-----END PRIVATE KEY-----
";

/// An RSA-2048 and a P-256 signing key, and the RSA public key as PEM.
struct Keys {
    rsa: EncodingKey,
    rsa_public_pem: Vec<u8>,
    ec: EncodingKey,
}

impl Keys {
    /// Fresh keys made with the `openssl` CLI in `dir`, else the embedded ones.
    fn load(dir: &Path) -> Keys {
        Self::generate(dir).unwrap_or_else(|| {
            tests::report("sessions: openssl unavailable, using the embedded test keys");
            Self::from_pems(
                FALLBACK_RSA_PEM.as_bytes(),
                FALLBACK_RSA_PUBLIC_PEM.as_bytes().to_vec(),
                FALLBACK_EC_PEM.as_bytes(),
            )
            .expect("embedded test keys")
        })
    }

    fn generate(dir: &Path) -> Option<Keys> {
        std::fs::create_dir_all(dir).ok()?;
        let run = |args: &[&str]| {
            Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|_| ())
        };
        run(&[
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
            "rsa.pem",
        ])?;
        run(&["pkey", "-in", "rsa.pem", "-pubout", "-out", "rsa.pub.pem"])?;
        run(&[
            "genpkey",
            "-algorithm",
            "EC",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-out",
            "ec.pem",
        ])?;
        let read = |name: &str| std::fs::read(dir.join(name)).ok();
        Self::from_pems(&read("rsa.pem")?, read("rsa.pub.pem")?, &read("ec.pem")?)
    }

    fn from_pems(rsa: &[u8], rsa_public_pem: Vec<u8>, ec: &[u8]) -> Option<Keys> {
        Some(Keys {
            rsa: EncodingKey::from_rsa_pem(rsa).ok()?,
            rsa_public_pem,
            ec: EncodingKey::from_ec_pem(ec).ok()?,
        })
    }

    /// The public JWK of `key` (`use: sig`, `alg`, `kid`).
    fn jwk(key: &EncodingKey, alg: Algorithm, kid: &str) -> Value {
        let mut jwk = Jwk::from_encoding_key(key, alg).expect("public JWK");
        jwk.common.key_id = Some(kid.to_string());
        jwk.common.public_key_use = Some(PublicKeyUse::Signature);
        serde_json::to_value(jwk).expect("JWK as JSON")
    }
}

// ---------------------------------------------------------------------------
// 1. Tokens
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn session_tokens_are_accepted_or_refused_with_401() {
    let stack = Stack::new().await;
    let keys = Keys::load(&stack.dir.path().join("keys"));
    let fake = MockServer::start().await;
    let jwks = json!({"keys": [
        Keys::jwk(&keys.rsa, Algorithm::RS256, "rsa-1"),
        Keys::jwk(&keys.ec, Algorithm::ES256, "ec-1"),
    ]});
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(ResponseTemplate::new(200).set_body_json(jwks))
        .mount(&fake)
        .await;
    let env = session_env(&stack).with("NEXT_PUBLIC_BACKEND_URL", fake.uri());
    let api = stack.api(&env).await;
    let pool = stack.db.pool().await;

    // --- Accepted ---------------------------------------------------------
    let mut accepted: Vec<(&str, Uuid, String)> = Vec::new();
    let u = Uuid::new_v4();
    accepted.push((
        "HS256",
        u,
        hs256(&claims(&u.to_string(), Some("hs@example.com"))),
    ));
    let u = Uuid::new_v4();
    accepted.push((
        "RS256 from the JWKS (kid)",
        u,
        sign(
            Algorithm::RS256,
            &keys.rsa,
            Some("rsa-1"),
            &claims(&u.to_string(), Some("rs@example.com")),
        ),
    ));
    let u = Uuid::new_v4();
    accepted.push((
        "ES256 from the JWKS (kid)",
        u,
        sign(
            Algorithm::ES256,
            &keys.ec,
            Some("ec-1"),
            &claims(&u.to_string(), Some("es@example.com")),
        ),
    ));
    let u = Uuid::new_v4();
    accepted.push((
        "`api token` command",
        u,
        mint_with_command(&stack, &env, u, "cli@example.com").await,
    ));

    let mut failures = Vec::new();
    for (name, user, tok) in &accepted {
        let full_name = format!("User {name}");
        let r = post_as(&api, PROFILE, tok, &json!({"full_name": full_name})).await;
        if r.status != 200 {
            failures.push(format!("{name}: expected 200, got {} {}", r.status, r.text));
            continue;
        }
        if r.json["success"] != true || r.json["profile"]["full_name"] != full_name.as_str() {
            failures.push(format!("{name}: unexpected body {}", r.text));
        }
        let counts = row_counts(&pool, *user).await;
        if counts != [1, 1, 1, 1] {
            failures.push(format!(
                "{name}: rows users/profiles/subscriptions/user_roles = {counts:?}"
            ));
        }
    }
    // The same RS256 token again (served from the verified cache) still works.
    let r = post_as(&api, PROFILE, &accepted[1].2, &json!({})).await;
    if r.status != 200 {
        failures.push(format!("RS256 repeated: {} {}", r.status, r.text));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // --- Refused ----------------------------------------------------------
    let sub = Uuid::new_v4().to_string();
    let good = claims(&sub, Some("victim@example.com"));
    let valid_hs = hs256(&good);
    let t = now();
    let with = |patch: Value| {
        let mut c = good.clone();
        for (k, v) in patch.as_object().expect("object") {
            if v.is_null() {
                c.as_object_mut().expect("object").remove(k);
            } else {
                c[k] = v.clone();
            }
        }
        c
    };
    let none_header = |alg: &str| b64(&json!({"alg": alg, "typ": "JWT"}));
    let hs_sig = valid_hs.rsplit('.').next().expect("signature").to_string();
    let tampered_payload = {
        let mut parts: Vec<String> = valid_hs.split('.').map(str::to_string).collect();
        parts[1] = b64(&claims(
            &Uuid::new_v4().to_string(),
            Some("victim@example.com"),
        ));
        parts.join(".")
    };

    // (case, Authorization header value, expected code when stable)
    let bearer = |t: String| Some(format!("Bearer {t}"));
    let cases: Vec<(&str, Option<String>, Option<&str>)> = vec![
        ("missing Authorization header", None, Some("missing_token")),
        ("Basic scheme", Some("Basic dXNlcjpwYXNz".into()), None),
        ("bare Bearer", Some("Bearer".into()), None),
        ("garbage", bearer("garbage".into()), Some("malformed")),
        (
            "three garbage parts",
            bearer("a.b.c".into()),
            Some("malformed"),
        ),
        (
            "header not JSON",
            bearer(format!(
                "{}.{}.sig",
                URL_SAFE_NO_PAD.encode("hello"),
                b64(&good)
            )),
            Some("malformed"),
        ),
        (
            "oversized token",
            bearer(format!("eyJ{}", "A".repeat(9000))),
            Some("malformed"),
        ),
        (
            "alg none, empty signature",
            bearer(format!("{}.{}.", none_header("none"), b64(&good))),
            Some("unsupported_algorithm"),
        ),
        (
            "alg none, HS256 signature kept",
            bearer(format!("{}.{}.{hs_sig}", none_header("none"), b64(&good))),
            Some("unsupported_algorithm"),
        ),
        (
            "alg None",
            bearer(format!("{}.{}.", none_header("None"), b64(&good))),
            Some("unsupported_algorithm"),
        ),
        (
            "alg NONE",
            bearer(format!("{}.{}.", none_header("NONE"), b64(&good))),
            Some("unsupported_algorithm"),
        ),
        (
            "HS512 with the secret",
            bearer(sign(
                Algorithm::HS512,
                &EncodingKey::from_secret(SECRET.as_bytes()),
                None,
                &good,
            )),
            Some("unsupported_algorithm"),
        ),
        (
            "HS256 signed with the RSA public key PEM (kid of the RSA key)",
            bearer(sign(
                Algorithm::HS256,
                &EncodingKey::from_secret(&keys.rsa_public_pem),
                Some("rsa-1"),
                &good,
            )),
            Some("bad_signature"),
        ),
        (
            "HS256 signed with the RSA public key PEM (no kid)",
            bearer(hs256_with(&keys.rsa_public_pem, &good)),
            Some("bad_signature"),
        ),
        (
            "HS256 expired",
            bearer(hs256(&with(json!({"iat": t - 7200, "exp": t - 3600})))),
            Some("expired"),
        ),
        (
            "HS256 not yet valid (nbf in an hour)",
            bearer(hs256(&with(json!({"nbf": t + 3600})))),
            Some("not_yet_valid"),
        ),
        (
            "HS256 wrong aud",
            bearer(hs256(&with(json!({"aud": "anon"})))),
            Some("wrong_audience"),
        ),
        (
            "HS256 without aud",
            bearer(hs256(&with(json!({"aud": null})))),
            Some("wrong_audience"),
        ),
        (
            "HS256 with another secret",
            bearer(hs256_with(b"not-the-secret-0123456789abcdef", &good)),
            Some("bad_signature"),
        ),
        (
            "HS256 signature tampered",
            bearer(tamper_signature(&valid_hs)),
            Some("bad_signature"),
        ),
        (
            "HS256 payload swapped, signature kept",
            bearer(tampered_payload),
            Some("bad_signature"),
        ),
        (
            "HS256 sub not a UUID",
            bearer(hs256(&with(json!({"sub": "admin"})))),
            Some("malformed"),
        ),
        (
            "HS256 without exp",
            bearer(hs256(&with(json!({"exp": null})))),
            None,
        ),
        (
            "RS256 expired",
            bearer(sign(
                Algorithm::RS256,
                &keys.rsa,
                Some("rsa-1"),
                &with(json!({"iat": t - 7200, "exp": t - 3600})),
            )),
            Some("expired"),
        ),
        (
            "RS256 signature tampered",
            bearer(tamper_signature(&sign(
                Algorithm::RS256,
                &keys.rsa,
                Some("rsa-1"),
                &good,
            ))),
            Some("bad_signature"),
        ),
        (
            "ES256 wrong aud",
            bearer(sign(
                Algorithm::ES256,
                &keys.ec,
                Some("ec-1"),
                &with(json!({"aud": "anon"})),
            )),
            Some("wrong_audience"),
        ),
        (
            "ES256 not yet valid",
            bearer(sign(
                Algorithm::ES256,
                &keys.ec,
                Some("ec-1"),
                &with(json!({"nbf": t + 3600})),
            )),
            Some("not_yet_valid"),
        ),
        (
            "ES256 signature tampered",
            bearer(tamper_signature(&sign(
                Algorithm::ES256,
                &keys.ec,
                Some("ec-1"),
                &good,
            ))),
            Some("bad_signature"),
        ),
        (
            "ES256 signed key labelled as the RSA kid",
            bearer(sign(Algorithm::ES256, &keys.ec, Some("rsa-1"), &good)),
            None,
        ),
        (
            "RS256 with an unknown kid",
            bearer(sign(Algorithm::RS256, &keys.rsa, Some("nope"), &good)),
            Some("unknown_key"),
        ),
    ];

    let users_before = count_users(&pool).await;
    let mut failures = Vec::new();
    for route in [PROFILE, SUBSCRIPTION, ROLE] {
        let body = match route {
            PROFILE => json!({"full_name": "Mallory"}),
            SUBSCRIPTION => json!({"action": "cancel"}),
            _ => json!({"user_id": sub, "role": "admin"}),
        };
        for (name, auth, code) in &cases {
            let r = post(&api, route, auth.as_deref(), &body).await;
            if let Err(e) = r.check_problem(Some(401), *code, None) {
                failures.push(format!("{route} / {name}: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} refused token case(s) misbehaved:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert_eq!(
        count_users(&pool).await,
        users_before,
        "a refused token created a user"
    );
    pool.close().await;
}

// ---------------------------------------------------------------------------
// 2. Concurrent first requests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_first_requests_create_one_row_per_table() {
    let stack = Stack::new().await;
    let api = stack.api(&session_env(&stack)).await;
    let pool = stack.db.pool().await;
    let mut failures = Vec::new();

    // Two concurrent POST /api/profile of a new user, several times.
    for round in 0..5 {
        let user = Uuid::new_v4();
        let tok = token(user, &format!("race{round}@example.com"));
        let (body_a, body_b) = (json!({"full_name": "A"}), json!({"full_name": "B"}));
        let (a, b) = tokio::join!(
            post_as(&api, PROFILE, &tok, &body_a),
            post_as(&api, PROFILE, &tok, &body_b),
        );
        for r in [&a, &b] {
            if r.status != 200 {
                failures.push(format!("round {round}: {} {}", r.status, r.text));
            }
        }
        let counts = row_counts(&pool, user).await;
        if counts != [1, 1, 1, 1] {
            failures.push(format!(
                "round {round}: rows users/profiles/subscriptions/user_roles = {counts:?}"
            ));
        }
    }

    // Two different routes racing on the first sight of one user.
    let user = Uuid::new_v4();
    let tok = token(user, "mixed@example.com");
    let (body_p, body_s) = (json!({"full_name": "Mixed"}), json!({"action": "cancel"}));
    let (p, s) = tokio::join!(
        post_as(&api, PROFILE, &tok, &body_p),
        post_as(&api, SUBSCRIPTION, &tok, &body_s),
    );
    if p.status != 200 {
        failures.push(format!("mixed: profile {} {}", p.status, p.text));
    }
    if let Err(e) = s.check_problem(Some(409), Some("free_plan"), None) {
        failures.push(format!("mixed: subscription on FREE: {e}"));
    }
    let counts = row_counts(&pool, user).await;
    if counts != [1, 1, 1, 1] {
        failures.push(format!("mixed: rows = {counts:?}"));
    }

    // Ten at once.
    let user = Uuid::new_v4();
    let tok = token(user, "ten@example.com");
    let replies = join_all((0..10).map(|i| {
        let body = json!({"full_name": format!("N{i}")});
        let api = &api;
        let tok = &tok;
        async move { post_as(api, PROFILE, tok, &body).await }
    }))
    .await;
    let statuses: Vec<u16> = replies.iter().map(|r| r.status.as_u16()).collect();
    if statuses.iter().any(|s| *s != 200) {
        failures.push(format!("ten: statuses {statuses:?}"));
    }
    let counts = row_counts(&pool, user).await;
    if counts != [1, 1, 1, 1] {
        failures.push(format!("ten: rows = {counts:?}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // The defaults: FREE, active, member.
    assert_eq!(
        subscription_of(&pool, user).await,
        SubRow {
            plan: "FREE".into(),
            status: "active".into(),
            cancel_at_period_end: false,
            canceled_at_set: false,
        }
    );
    assert_eq!(role_of(&pool, user).await.as_deref(), Some("member"));
    pool.close().await;
}

// ---------------------------------------------------------------------------
// 3. Subscription cancel / resume
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn subscription_cancel_and_resume() {
    let stack = Stack::new().await;
    let api = stack.api(&session_env(&stack)).await;
    let pool = stack.db.pool().await;
    let user = Uuid::new_v4();
    let tok = token(user, "payer@example.com");

    // FREE: nothing to cancel or resume.
    for action in ["cancel", "resume"] {
        post_as(&api, SUBSCRIPTION, &tok, &json!({"action": action}))
            .await
            .assert_problem(409, Some("free_plan"), None);
    }
    assert_eq!(
        subscription_of(&pool, user).await,
        SubRow {
            plan: "FREE".into(),
            status: "active".into(),
            cancel_at_period_end: false,
            canceled_at_set: false,
        },
        "a refused change leaves the FREE row as it was"
    );

    // Bad actions → 400 naming `action`.
    let mut failures = Vec::new();
    for bad in [
        json!({"action": "pause"}),
        json!({"action": ""}),
        json!({"action": "CANCEL"}),
        json!({"action": " cancel"}),
        json!({"action": null}),
        json!({"action": 1}),
        json!({}),
    ] {
        let r = post_as(&api, SUBSCRIPTION, &tok, &bad).await;
        if let Err(e) = r.check_problem(Some(400), None, Some("action")) {
            failures.push(format!("{bad}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Make it a paid plan (no payment route yet).
    sqlx::query(
        "UPDATE subscriptions SET plan = 'PRO', status = 'active', \
         current_period_start = now(), current_period_end = now() + interval '30 days' \
         WHERE user_id::text = $1",
    )
    .bind(user.to_string())
    .execute(&pool)
    .await
    .expect("UPDATE subscriptions to PRO");

    // Bad action on a paid plan changes nothing.
    post_as(&api, SUBSCRIPTION, &tok, &json!({"action": "stop"}))
        .await
        .assert_problem(400, None, Some("action"));
    assert!(!subscription_of(&pool, user).await.cancel_at_period_end);

    let cancelling = SubRow {
        plan: "PRO".into(),
        status: "active".into(),
        cancel_at_period_end: true,
        canceled_at_set: true,
    };
    let active = SubRow {
        plan: "PRO".into(),
        status: "active".into(),
        cancel_at_period_end: false,
        canceled_at_set: false,
    };
    for round in 0..2 {
        // Cancel, twice (the repeat is harmless).
        for _ in 0..2 {
            let r = post_as(&api, SUBSCRIPTION, &tok, &json!({"action": "cancel"})).await;
            assert_eq!(r.status, 200, "round {round} cancel: {}", r.text);
            assert_eq!(
                r.json,
                json!({"success": true, "status": "cancel_at_period_end", "renewal_plan": null}),
                "round {round} cancel"
            );
            assert_eq!(subscription_of(&pool, user).await, cancelling);
        }
        // Resume, twice.
        for _ in 0..2 {
            let r = post_as(&api, SUBSCRIPTION, &tok, &json!({"action": "resume"})).await;
            assert_eq!(r.status, 200, "round {round} resume: {}", r.text);
            assert_eq!(
                r.json,
                json!({"success": true, "status": "active", "renewal_plan": null}),
                "round {round} resume"
            );
            assert_eq!(subscription_of(&pool, user).await, active);
        }
    }
    // Each move the user made is audited once, the repeats not at all,
    // with the user as the actor and the server's request id.
    let trail: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT action, actor_id::text, request_id FROM audit_logs \
         WHERE target_id = $1 AND action LIKE 'subscription.%' ORDER BY created_at, id",
    )
    .bind(user.to_string())
    .fetch_all(&pool)
    .await
    .expect("the audit trail");
    let actions: Vec<&str> = trail.iter().map(|(a, _, _)| a.as_str()).collect();
    assert_eq!(
        actions,
        [
            "subscription.cancel",
            "subscription.resume",
            "subscription.cancel",
            "subscription.resume"
        ]
    );
    for (_, actor, request_id) in &trail {
        assert_eq!(actor.as_deref(), Some(user.to_string().as_str()));
        assert!(request_id.is_some(), "{trail:?}");
    }

    // Another user's cancel does not touch this row.
    let other = Uuid::new_v4();
    post_as(
        &api,
        SUBSCRIPTION,
        &token(other, "other@example.com"),
        &json!({"action": "cancel"}),
    )
    .await
    .assert_problem(409, Some("free_plan"), None);
    assert_eq!(subscription_of(&pool, user).await, active);
    pool.close().await;
}

// ---------------------------------------------------------------------------
// 4. Admin role changes
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn admin_role_changes_are_guarded_and_audited() {
    let stack = Stack::new().await;
    let env = session_env(&stack)
        .with("ADMIN_EMAILS", "boss@example.com")
        .with("AUTH_TRUST_EMAIL_CLAIM", "true");
    let api = stack.api(&env).await;
    let pool = stack.db.pool().await;

    let admin = Uuid::new_v4();
    let admin_tok = token(admin, "boss@example.com");
    let member = Uuid::new_v4();
    let member_tok = token(member, "member@example.com");
    let mallory = Uuid::new_v4();
    let mallory_tok = token(mallory, "mallory@example.com");

    // Not logged in → 401.
    post(
        &api,
        ROLE,
        None,
        &json!({"user_id": member.to_string(), "role": "admin"}),
    )
    .await
    .assert_problem(401, None, None);

    // Create the accounts (first sight through the profile route).
    for tok in [&admin_tok, &member_tok, &mallory_tok] {
        let r = post_as(&api, PROFILE, tok, &json!({})).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(role_of(&pool, admin).await.as_deref(), Some("admin"));
    assert_eq!(role_of(&pool, member).await.as_deref(), Some("member"));
    assert_eq!(role_of(&pool, mallory).await.as_deref(), Some("member"));

    // A member → 403.
    post_as(
        &api,
        ROLE,
        &member_tok,
        &json!({"user_id": mallory.to_string(), "role": "admin"}),
    )
    .await
    .assert_problem(403, None, None);

    // A member cannot promote themselves with any body.
    let m = mallory.to_string();
    let a = admin.to_string();
    let bodies: Vec<String> = vec![
        json!({"user_id": m, "role": "admin"}).to_string(),
        json!({"user_id": m, "role": "ADMIN"}).to_string(),
        json!({"user_id": m, "role": " admin "}).to_string(),
        json!({"user_id": m, "role": "admin\u{0}"}).to_string(),
        json!({"user_id": m.to_uppercase(), "role": "admin"}).to_string(),
        json!({"user_id": format!("{{{m}}}"), "role": "admin"}).to_string(),
        json!({"user_id": m.replace('-', ""), "role": "admin"}).to_string(),
        json!({"user_id": m, "role": "admin", "actor_id": a}).to_string(),
        json!({"user_id": m, "role": "admin", "is_admin": true}).to_string(),
        json!({"user_id": [m], "role": "admin"}).to_string(),
        json!({"user_id": m, "role": ["admin"]}).to_string(),
        json!({"user_id": m, "role": {"name": "admin"}}).to_string(),
        json!({"user_id": a, "role": "member"}).to_string(),
        json!({"user_id": a, "role": "admin"}).to_string(),
        json!({"user_id": m}).to_string(),
        json!({"role": "admin"}).to_string(),
        json!({}).to_string(),
        format!(r#"{{"user_id":"{m}","role":"member","role":"admin"}}"#),
        format!(r#"{{"user_id":"{a}","user_id":"{m}","role":"admin"}}"#),
        format!(r#"[{{"user_id":"{m}","role":"admin"}}]"#),
        "null".to_string(),
        r#""admin""#.to_string(),
        format!(r#"{{"user_id":"{m}","role":"admin"}}trailing"#),
    ];
    // Tokens of the same member whose claims try to look privileged.
    let t = now();
    let privileged_claims = [
        json!({"sub": m, "aud": "authenticated", "exp": t + 3600, "role": "admin"}),
        json!({"sub": m, "aud": "authenticated", "exp": t + 3600, "role": "service_role"}),
        json!({"sub": m, "aud": "authenticated", "exp": t + 3600,
               "app_metadata": {"role": "admin"}, "user_role": "admin"}),
        // The admin email after first sight does not make an admin.
        json!({"sub": m, "aud": "authenticated", "exp": t + 3600, "email": "boss@example.com"}),
    ];
    let mut tokens = vec![mallory_tok.clone()];
    tokens.extend(privileged_claims.iter().map(hs256));
    let mut failures = Vec::new();
    for (ti, tok) in tokens.iter().enumerate() {
        for body in &bodies {
            let r = post_raw_as(&api, ROLE, tok, body).await;
            let ok =
                matches!(r.status.as_u16(), 400 | 403) && r.check_problem(None, None, None).is_ok();
            if !ok {
                failures.push(format!(
                    "token #{ti}, body {body}: expected 400/403 problem, got {} {}",
                    r.status, r.text
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "a member's self-promotion attempt was not refused:\n{}",
        failures.join("\n")
    );
    assert_eq!(role_of(&pool, mallory).await.as_deref(), Some("member"));
    assert_eq!(role_of(&pool, admin).await.as_deref(), Some("admin"));
    assert!(
        audit_rows(&pool).await.is_empty(),
        "refusals are not audited"
    );

    // Admin demoting their own account → 400 self_demotion (the contract's
    // status for it).
    post_as(
        &api,
        ROLE,
        &admin_tok,
        &json!({"user_id": a, "role": "member"}),
    )
    .await
    .assert_problem(400, Some("self_demotion"), None);
    assert_eq!(role_of(&pool, admin).await.as_deref(), Some("admin"));

    // Unknown user → 404.
    let nobody = Uuid::new_v4();
    post_as(
        &api,
        ROLE,
        &admin_tok,
        &json!({"user_id": nobody.to_string(), "role": "admin"}),
    )
    .await
    .assert_problem(404, Some("unknown_user"), None);
    assert_eq!(row_counts(&pool, nobody).await, [0, 0, 0, 0]);

    // Bad uuid / bad role → 400 naming the field.
    for bad in [
        "not-a-uuid",
        "",
        "123",
        "00000000-0000-0000-0000-00000000000g",
    ] {
        post_as(
            &api,
            ROLE,
            &admin_tok,
            &json!({"user_id": bad, "role": "admin"}),
        )
        .await
        .assert_problem(400, None, Some("user_id"));
    }
    for bad in ["owner", "", "superadmin", "Admin"] {
        post_as(&api, ROLE, &admin_tok, &json!({"user_id": m, "role": bad}))
            .await
            .assert_problem(400, None, Some("role"));
    }
    assert!(
        audit_rows(&pool).await.is_empty(),
        "refusals are not audited"
    );
    assert_eq!(role_of(&pool, member).await.as_deref(), Some("member"));

    // Success: the admin promotes the member. The client sends its own
    // request id: the audit row is filed under the server's id (the one
    // answered), with the client's kept beside it.
    let r = Reply::send(
        client()
            .post(api.url(ROLE))
            .bearer_auth(&admin_tok)
            .header("x-request-id", "client-chosen-id")
            .json(&json!({"user_id": member.to_string(), "role": "admin"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"success": true, "user_id": member.to_string(), "role": "admin"})
    );
    let request_id = r
        .header("x-request-id")
        .expect("x-request-id on the answer")
        .to_string();
    assert_eq!(role_of(&pool, member).await.as_deref(), Some("admin"));
    let audit = audit_rows(&pool).await;
    assert_eq!(audit.len(), 1, "exactly one audit row: {audit:?}");
    let row = &audit[0];
    assert_eq!(row.action, "role.change", "{row:?}");
    assert_eq!(row.actor_id.as_deref(), Some(a.as_str()), "{row:?}");
    assert_eq!(row.target_type, "user", "{row:?}");
    assert_eq!(row.target_id, member.to_string(), "{row:?}");
    assert_eq!(row.old_value, json!({"role": "member"}), "{row:?}");
    assert_eq!(row.new_value, json!({"role": "admin"}), "{row:?}");
    assert_eq!(
        row.request_id.as_deref(),
        Some(request_id.as_str()),
        "{row:?}"
    );
    assert_ne!(
        request_id, "client-chosen-id",
        "the server picks its own id"
    );
    assert_eq!(
        row.client_request_id.as_deref(),
        Some("client-chosen-id"),
        "{row:?}"
    );

    // Setting the role the user already has succeeds and writes no audit row.
    let r = post_as(
        &api,
        ROLE,
        &admin_tok,
        &json!({"user_id": member.to_string(), "role": "admin"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(audit_rows(&pool).await.len(), 1, "a no-op is not audited");

    // The promoted user is now an admin for real: they can demote the first
    // admin (who could not demote themselves); one more audit row.
    let new_admin_tok = member_tok;
    let r = post_as(
        &api,
        ROLE,
        &new_admin_tok,
        &json!({"user_id": a, "role": "member"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, admin).await.as_deref(), Some("member"));
    let audit = audit_rows(&pool).await;
    assert_eq!(audit.len(), 2, "{audit:?}");
    assert_eq!(
        audit[1].actor_id.as_deref(),
        Some(member.to_string().as_str())
    );
    assert_eq!(audit[1].target_id, a);
    assert_eq!(audit[1].old_value, json!({"role": "admin"}));
    assert_eq!(audit[1].new_value, json!({"role": "member"}));

    // The demoted admin's token (still carrying the ADMIN_EMAILS email) no
    // longer works on the admin route.
    post_as(
        &api,
        ROLE,
        &admin_tok,
        &json!({"user_id": m, "role": "admin"}),
    )
    .await
    .assert_problem(403, None, None);
    assert_eq!(role_of(&pool, mallory).await.as_deref(), Some("member"));
    pool.close().await;
}

// ---------------------------------------------------------------------------
// 5. ADMIN_EMAILS bootstrap
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn admin_emails_bootstrap_grants_admin_at_first_sight() {
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let base = session_env(&stack).with("AUTH_TRUST_EMAIL_CLAIM", "true");

    // Before the bootstrap: a target member, and a user seen while their
    // email was not listed yet.
    let target = Uuid::new_v4();
    let target_tok = token(target, "target@example.com");
    let late = Uuid::new_v4();
    let late_tok = token(late, "late@example.com");
    {
        let api = stack
            .api(&base.clone().with("ADMIN_EMAILS", "someone@example.com"))
            .await;
        for tok in [&target_tok, &late_tok] {
            let r = post_as(&api, PROFILE, tok, &json!({})).await;
            assert_eq!(r.status, 200, "{}", r.text);
        }
    }
    assert_eq!(role_of(&pool, target).await.as_deref(), Some("member"));
    assert_eq!(role_of(&pool, late).await.as_deref(), Some("member"));

    let api = stack
        .api(&base.with(
            "ADMIN_EMAILS",
            "first@example.com, Boss@Example.com ,late@example.com",
        ))
        .await;

    // A first-seen listed user changes a role with their very first request.
    let boss = Uuid::new_v4();
    let boss_tok = token(boss, "boss@example.com");
    let r = post_as(
        &api,
        ROLE,
        &boss_tok,
        &json!({"user_id": target.to_string(), "role": "admin"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"success": true, "user_id": target.to_string(), "role": "admin"})
    );
    assert_eq!(role_of(&pool, boss).await.as_deref(), Some("admin"));
    assert_eq!(role_of(&pool, target).await.as_deref(), Some("admin"));
    assert_eq!(row_counts(&pool, boss).await, [1, 1, 1, 1]);
    // The grant by ADMIN_EMAILS is audited too.
    let (grants,): (i64,) = sqlx::query_as(
        "SELECT COUNT(*) FROM audit_logs WHERE action = 'role.grant' AND target_id = $1 \
         AND new_value->>'by' = 'admin_emails'",
    )
    .bind(boss.to_string())
    .fetch_one(&pool)
    .await
    .expect("count role.grant rows");
    assert_eq!(grants, 1);
    let audit = audit_rows(&pool).await;
    assert_eq!(audit.len(), 1, "{audit:?}");
    assert_eq!(
        audit[0].actor_id.as_deref(),
        Some(boss.to_string().as_str())
    );
    assert_eq!(audit[0].old_value, json!({"role": "member"}));
    assert_eq!(audit[0].new_value, json!({"role": "admin"}));

    // The other listed email works too.
    let first = Uuid::new_v4();
    let r = post_as(
        &api,
        ROLE,
        &token(first, "first@example.com"),
        &json!({"user_id": target.to_string(), "role": "member"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, target).await.as_deref(), Some("member"));

    // An unlisted first-seen user is a member → 403.
    let plain = Uuid::new_v4();
    post_as(
        &api,
        ROLE,
        &token(plain, "plain@example.com"),
        &json!({"user_id": target.to_string(), "role": "admin"}),
    )
    .await
    .assert_problem(403, None, None);
    assert_eq!(role_of(&pool, plain).await.as_deref(), Some("member"));

    // A user seen before their email was listed is not promoted later.
    post_as(
        &api,
        ROLE,
        &late_tok,
        &json!({"user_id": late.to_string(), "role": "admin"}),
    )
    .await
    .assert_problem(403, None, None);
    assert_eq!(role_of(&pool, late).await.as_deref(), Some("member"));
    assert_eq!(audit_rows(&pool).await.len(), 2);
    pool.close().await;
}

// ---------------------------------------------------------------------------
// 6. Profile save
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn profile_save_validates_and_answers_the_saved_profile() {
    let stack = Stack::new().await;
    let api = stack.api(&session_env(&stack)).await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    let own_path = format!("{user}/avatar");
    let url = format!("https://cdn.example.com/avatars/{user}/avatar");

    let r = post_as(
        &api,
        PROFILE,
        &tok,
        &json!({"full_name": "Ann Lee", "avatar_path": own_path, "avatar_url": url}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json,
        json!({"success": true, "profile": {
            "full_name": "Ann Lee", "avatar_path": own_path, "avatar_url": url
        }})
    );

    // 100 characters (multi-byte) is fine; 101 is not.
    let hundred = "é".repeat(100);
    let r = post_as(&api, PROFILE, &tok, &json!({"full_name": hundred})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["profile"]["full_name"], hundred.as_str());

    let other = Uuid::new_v4();
    let mut failures = Vec::new();
    let bad: Vec<(Value, &str)> = vec![
        (json!({"full_name": "x".repeat(101)}), "full_name"),
        (json!({"full_name": "é".repeat(101)}), "full_name"),
        (
            json!({"avatar_url": "ftp://example.com/a.png"}),
            "avatar_url",
        ),
        (json!({"avatar_url": "javascript:alert(1)"}), "avatar_url"),
        (json!({"avatar_url": "not a url"}), "avatar_url"),
        (json!({"avatar_url": "/relative/avatar"}), "avatar_url"),
        (
            json!({"avatar_path": format!("{user}/other")}),
            "avatar_path",
        ),
        (
            json!({"avatar_path": format!("{user}/avatar/../x")}),
            "avatar_path",
        ),
        (
            json!({"avatar_path": format!("../{user}/avatar")}),
            "avatar_path",
        ),
        (
            json!({"avatar_path": format!("/{user}/avatar")}),
            "avatar_path",
        ),
        (json!({"avatar_path": "avatar"}), "avatar_path"),
    ];
    for (body, field) in &bad {
        let r = post_as(&api, PROFILE, &tok, body).await;
        if let Err(e) = r.check_problem(Some(400), None, Some(field)) {
            failures.push(format!("{body}: {e}"));
        }
    }
    // Another user's well-formed key: 400 naming the field, as the contract
    // answers an invalid profile body.
    let r = post_as(
        &api,
        PROFILE,
        &tok,
        &json!({"avatar_path": format!("{other}/avatar")}),
    )
    .await;
    if let Err(e) = r.check_problem(Some(400), None, Some("avatar_path")) {
        failures.push(format!("another user's avatar_path: {e}"));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing of the refused bodies was saved.
    let r = post_as(&api, PROFILE, &tok, &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.json["profile"],
        json!({"full_name": hundred, "avatar_path": own_path, "avatar_url": url})
    );

    // An empty avatar_path removes the reference.
    let r = post_as(
        &api,
        PROFILE,
        &tok,
        &json!({"avatar_path": "", "avatar_url": ""}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    for k in ["avatar_path", "avatar_url"] {
        let v = &r.json["profile"][k];
        assert!(v.is_null() || *v == "", "{k} not cleared: {}", r.text);
    }
}

// ---------------------------------------------------------------------------
// 7. Readiness gates
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn logged_in_routes_answer_503_when_not_ready() {
    let stack = Stack::new().await;
    let user = Uuid::new_v4();
    let tok = token(user, "boss@example.com");
    let sub_body = json!({"action": "cancel"});
    let profile_body = json!({"full_name": "Ann"});
    let role_body = json!({"user_id": user.to_string(), "role": "admin"});
    let base = session_env(&stack)
        .with("ADMIN_EMAILS", "boss@example.com")
        .with("AUTH_TRUST_EMAIL_CLAIM", "true");

    // No BACKEND_SERVICE_ROLE_KEY: every write route is 503.
    {
        let api = stack
            .api(&base.clone().without("BACKEND_SERVICE_ROLE_KEY"))
            .await;
        post_as(&api, PROFILE, &tok, &profile_body)
            .await
            .assert_problem(503, Some("not_configured"), None);
        post_as(&api, SUBSCRIPTION, &tok, &sub_body)
            .await
            .assert_problem(503, Some("not_configured"), None);
        post_as(&api, ROLE, &tok, &role_body).await.assert_problem(
            503,
            Some("not_configured"),
            None,
        );
    }

    // Payments and admin switched off by their toggles.
    {
        let api = stack
            .api(
                &base
                    .clone()
                    .with("NEXT_PUBLIC_ENABLE_PAYMENTS", "false")
                    .with("NEXT_PUBLIC_ENABLE_ADMIN", "off"),
            )
            .await;
        post_as(&api, SUBSCRIPTION, &tok, &sub_body)
            .await
            .assert_problem(503, Some("feature_disabled"), None);
        post_as(&api, ROLE, &tok, &role_body).await.assert_problem(
            503,
            Some("feature_disabled"),
            None,
        );
        let r = post_as(&api, PROFILE, &tok, &profile_body).await;
        assert_eq!(
            r.status, 200,
            "profile is not gated by those toggles: {}",
            r.text
        );
    }

    // No session key at all (neither secret nor JWKS): 503, never 500.
    {
        let api = stack
            .api(
                &base
                    .clone()
                    .without("BACKEND_JWT_SECRET")
                    .without("NEXT_PUBLIC_BACKEND_URL"),
            )
            .await;
        for (route, body) in [
            (PROFILE, &profile_body),
            (SUBSCRIPTION, &sub_body),
            (ROLE, &role_body),
        ] {
            let r = post_as(&api, route, &tok, body).await;
            if let Err(e) = r.check_problem(Some(503), None, None) {
                panic!("{route} without any session key: {e}");
            }
        }
    }

    // Everything configured: the same requests work.
    let api = stack.api(&base).await;
    let r = post_as(&api, PROFILE, &tok, &profile_body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    post_as(&api, SUBSCRIPTION, &tok, &sub_body)
        .await
        .assert_problem(409, Some("free_plan"), None);
    // The admin setting their own role to admin: a no-op success.
    let r = post_as(&api, ROLE, &tok, &role_body).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

// ---------------------------------------------------------------------------
// 7. Issue 7: one gate, bounded calls, who is admin at first sight
// ---------------------------------------------------------------------------

/// Every session route checks the auth toggle before the token: with
/// `NEXT_PUBLIC_ENABLE_AUTH=false` each answers a valid token with 503
/// `feature_disabled` (`POST /api/profile` used to answer 200).
#[tokio::test(flavor = "multi_thread")]
async fn auth_toggle_off_gates_every_session_route() {
    let stack = Stack::new().await;
    let api = stack
        .api(&session_env(&stack).with("NEXT_PUBLIC_ENABLE_AUTH", "false"))
        .await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    for (route, body) in [
        (PROFILE, json!({"full_name": "Ann"})),
        (SUBSCRIPTION, json!({"action": "cancel"})),
        (ROLE, json!({"user_id": user.to_string(), "role": "member"})),
        (
            "/api/profile/avatar",
            json!({"fileSize": 1000, "fileType": "image/png"}),
        ),
    ] {
        let r = post_as(&api, route, &tok, &body).await;
        if let Err(e) = r.check_problem(Some(503), Some("feature_disabled"), None) {
            panic!("{route}: {e}");
        }
        // Without a token too: the gate answers before the session check.
        let r = post(&api, route, None, &body).await;
        if let Err(e) = r.check_problem(Some(503), Some("feature_disabled"), None) {
            panic!("{route} without a token: {e}");
        }
    }
}

/// The database calls of profile, subscription and admin are bounded by
/// `DEPENDENCY_TIMEOUT_MS`: with the database silent they answer 503
/// `database_unavailable` instead of hanging.
#[tokio::test(flavor = "multi_thread")]
async fn session_routes_bound_their_database_calls() {
    let stack = Stack::new().await;
    let proxy = tests::TcpProxy::start(&tests::host_port(&stack.db.url)).await;
    let env = session_env(&stack)
        .with("DATABASE_URL", stack.db.url_via(proxy.addr))
        .with("DEPENDENCY_TIMEOUT_MS", "500")
        .with("ADMIN_EMAILS", "boss@example.com")
        .with("AUTH_TRUST_EMAIL_CLAIM", "true");
    let api = stack.api(&env).await;
    let boss = Uuid::new_v4();
    let tok = token(boss, "boss@example.com");
    // Seen once while the database answers, so the role is stored.
    let r = post_as(&api, PROFILE, &tok, &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);

    proxy.set(tests::ProxyMode::Freeze);
    for (route, body) in [
        (PROFILE, json!({"full_name": "Ann"})),
        (SUBSCRIPTION, json!({"action": "cancel"})),
        (ROLE, json!({"user_id": boss.to_string(), "role": "admin"})),
    ] {
        let r = post_as(&api, route, &tok, &body).await;
        if let Err(e) = r.check_problem(Some(503), Some("database_unavailable"), None) {
            panic!("{route}: {e}");
        }
    }
    proxy.on();
}

/// A connection the database ends in the middle of a statement answers 503
/// `database_unavailable`, not 500: the api's first-sight query waits on a
/// lock and PostgreSQL terminates its backend (SQLSTATE 57P01), long before
/// `DEPENDENCY_TIMEOUT_MS` could answer instead.
#[tokio::test(flavor = "multi_thread")]
async fn a_connection_ended_mid_statement_is_503_not_500() {
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let env = session_env(&stack).with("DEPENDENCY_TIMEOUT_MS", "30000");
    let api = stack.api(&env).await;
    let mut locker = pool.begin().await.expect("begin");
    sqlx::query("LOCK TABLE users IN ACCESS EXCLUSIVE MODE")
        .execute(&mut *locker)
        .await
        .expect("lock users");
    // Ends every backend of this database that waits on a lock: the api's.
    let terminate = async {
        for _ in 0..400 {
            let ended: i64 = sqlx::query_scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' \
                 AND pid <> pg_backend_pid()",
            )
            .fetch_one(&pool)
            .await
            .expect("pg_terminate_backend");
            if ended > 0 {
                return ended;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        0
    };
    let (tok, body) = (token(Uuid::new_v4(), "ann@example.com"), json!({}));
    let (r, ended) = tokio::join!(post_as(&api, PROFILE, &tok, &body), terminate);
    locker.rollback().await.expect("unlock");
    assert_eq!(
        ended, 1,
        "the api's query never waited on the lock: {}",
        r.text
    );
    if let Err(e) = r.check_problem(Some(503), Some("database_unavailable"), None) {
        panic!("{e}; api stderr:\n{}", api.stderr());
    }
    assert!(
        r.text.contains("unreachable"),
        "a lost connection, not the time bound: {}",
        r.text
    );
    // The pool recovers: the same caller is served once the lock is gone.
    let r = post_as(&api, PROFILE, &tok, &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
}

/// `ADMIN_USER_IDS` grants admin at first sight, by id alone (no email).
#[tokio::test(flavor = "multi_thread")]
async fn admin_user_ids_grant_admin_at_first_sight() {
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let boss = Uuid::new_v4();
    let env = session_env(&stack).with("ADMIN_USER_IDS", format!("{}, {}", Uuid::new_v4(), boss));
    let api = stack.api(&env).await;
    let member = Uuid::new_v4();
    let r = post_as(&api, PROFILE, &token(member, "m@example.com"), &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let boss_tok = hs256(&claims(&boss.to_string(), None));
    let r = post_as(
        &api,
        ROLE,
        &boss_tok,
        &json!({"user_id": member.to_string(), "role": "admin"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, boss).await.as_deref(), Some("admin"));
    assert_eq!(role_of(&pool, member).await.as_deref(), Some("admin"));
    pool.close().await;
}

/// `ADMIN_EMAILS` compares with ASCII-only case folding: an email spelled
/// with U+212A KELVIN SIGN is not `kim@…`.
#[tokio::test(flavor = "multi_thread")]
async fn admin_emails_fold_ascii_case_only() {
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let api = stack
        .api(
            &session_env(&stack)
                .with("ADMIN_EMAILS", "kim@example.com")
                .with("AUTH_TRUST_EMAIL_CLAIM", "true"),
        )
        .await;
    let kelvin = Uuid::new_v4();
    let r = post_as(
        &api,
        PROFILE,
        &token(kelvin, "\u{212A}im@example.com"),
        &json!({}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, kelvin).await.as_deref(), Some("member"));
    let upper = Uuid::new_v4();
    let r = post_as(&api, PROFILE, &token(upper, "KIM@example.com"), &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, upper).await.as_deref(), Some("admin"));
    pool.close().await;
}

/// The `email` of a JWKS-signed token (an external issuer) grants
/// `ADMIN_EMAILS` only with `AUTH_TRUST_EMAIL_CLAIM=true`.
#[tokio::test(flavor = "multi_thread")]
async fn external_email_claim_grants_admin_only_when_trusted() {
    let stack = Stack::new().await;
    let pool = stack.db.pool().await;
    let keys = Keys::load(&stack.dir.path().join("keys"));
    let fake = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"keys": [Keys::jwk(&keys.rsa, Algorithm::RS256, "rsa-1")]})),
        )
        .mount(&fake)
        .await;
    let base = session_env(&stack)
        .with("NEXT_PUBLIC_BACKEND_URL", fake.uri())
        .with("ADMIN_EMAILS", "boss@example.com");
    let rs256 = |user: Uuid| {
        sign(
            Algorithm::RS256,
            &keys.rsa,
            Some("rsa-1"),
            &claims(&user.to_string(), Some("boss@example.com")),
        )
    };
    let untrusted = Uuid::new_v4();
    {
        let api = stack.api(&base).await;
        let r = post_as(&api, PROFILE, &rs256(untrusted), &json!({})).await;
        assert_eq!(r.status, 200, "{}", r.text);
    }
    assert_eq!(role_of(&pool, untrusted).await.as_deref(), Some("member"));
    let trusted = Uuid::new_v4();
    let api = stack
        .api(&base.with("AUTH_TRUST_EMAIL_CLAIM", "true"))
        .await;
    let r = post_as(&api, PROFILE, &rs256(trusted), &json!({})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(role_of(&pool, trusted).await.as_deref(), Some("admin"));
    pool.close().await;
}

/// Secrets shorter than 32 bytes stop the api at start, naming the variable.
#[tokio::test(flavor = "multi_thread")]
async fn short_secrets_stop_the_api_at_start() {
    let stack = Stack::new().await;
    for var in ["BACKEND_JWT_SECRET", "BACKEND_SERVICE_ROLE_KEY"] {
        let env = session_env(&stack).with(var, "too-short-secret");
        let mut p = Proc::spawn("api", &[], &env, stack.dir.path());
        let status = p
            .wait_exit(Duration::from_secs(30))
            .await
            .unwrap_or_else(|| panic!("api with a short {var} kept running"));
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!status.success(), "{var}");
        assert!(p.stderr().contains(var), "{var}: {}", p.stderr());
    }
}

/// The JWKS comes over https or from a loopback host only.
#[tokio::test(flavor = "multi_thread")]
async fn plain_http_backend_url_to_a_remote_host_stops_the_api() {
    let stack = Stack::new().await;
    let env = session_env(&stack).with("NEXT_PUBLIC_BACKEND_URL", "http://auth.example.com");
    let mut p = Proc::spawn("api", &[], &env, stack.dir.path());
    let status = p
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("api with an http backend URL kept running");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!status.success());
    assert!(
        p.stderr().contains("NEXT_PUBLIC_BACKEND_URL"),
        "{}",
        p.stderr()
    );
}

/// The JWKS fetch follows no redirect: keys served behind a redirect are not
/// used (the RS256 token is not accepted).
#[tokio::test(flavor = "multi_thread")]
async fn jwks_redirects_are_not_followed() {
    let stack = Stack::new().await;
    let keys = Keys::load(&stack.dir.path().join("keys"));
    let fake = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path(JWKS_PATH))
        .respond_with(
            ResponseTemplate::new(302).insert_header("location", format!("{}/keys", fake.uri())),
        )
        .mount(&fake)
        .await;
    Mock::given(method("GET"))
        .and(path("/keys"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({"keys": [Keys::jwk(&keys.rsa, Algorithm::RS256, "rsa-1")]})),
        )
        .mount(&fake)
        .await;
    let api = stack
        .api(&session_env(&stack).with("NEXT_PUBLIC_BACKEND_URL", fake.uri()))
        .await;
    let user = Uuid::new_v4();
    let tok = sign(
        Algorithm::RS256,
        &keys.rsa,
        Some("rsa-1"),
        &claims(&user.to_string(), Some("a@example.com")),
    );
    let r = post_as(&api, PROFILE, &tok, &json!({})).await;
    assert_ne!(r.status, 200, "a redirected JWKS was used: {}", r.text);
    let served = fake.received_requests().await.unwrap_or_default();
    assert!(
        served.iter().all(|q| q.url.path() != "/keys"),
        "the redirect was followed"
    );
}
