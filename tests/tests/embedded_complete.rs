//! The embedded default is complete: with nothing configured, the
//! server-side secret (`BACKEND_SERVICE_ROLE_KEY`) is generated once into
//! `DATA_DIR` (mode 0600), so sign-up, `GET /api/me`, profile, avatar
//! uploads, billing and admin work; only payments and AI wait for their
//! keys. Health says where the secret came from; production (`DATABASE_URL`
//! set) still requires it. And two origins: `API_EXTERNAL_URL` builds the
//! upload URL, not `APP_URL`.

use serde_json::{json, Value};
use tests::{client, plans_file, EnvMap, Proc, Reply, Stack, TempDir};

const APP: &str = "http://app.example.test:5173";
const API: &str = "http://api.example.test:8443";

fn nothing_configured() -> EnvMap {
    EnvMap::default()
        .with("PORT", "0")
        .with("PLANS_FILE", plans_file().display().to_string())
        .with("AUTH_AUTOCONFIRM", "true")
}

async fn sign_up(api: &Proc, email: &str) -> String {
    let r = Reply::send(
        client()
            .post(api.url("/auth/v1/signup"))
            .json(&json!({"email": email, "password": "correct horse battery"})),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.json["access_token"]
        .as_str()
        .unwrap_or_else(|| panic!("no session: {}", r.text))
        .to_string()
}

async fn get_auth(api: &Proc, path: &str, token: &str) -> Reply {
    Reply::send(client().get(api.url(path)).bearer_auth(token)).await
}

async fn post_auth(api: &Proc, path: &str, token: &str, body: Value) -> Reply {
    Reply::send(client().post(api.url(path)).bearer_auth(token).json(&body)).await
}

fn png() -> Vec<u8> {
    let mut v =
        b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89"
            .to_vec();
    v.extend_from_slice(
        b"\0\0\0\x0aIDATx\x9cc\0\x01\0\0\x05\0\x01\x0d\x0a\x2d\xb4\0\0\0\0IEND\xaeB`\x82",
    );
    v
}

#[tokio::test(flavor = "multi_thread")]
async fn everything_but_payments_and_ai_works_with_nothing_configured() {
    let dir = TempDir::new();
    let env = nothing_configured();
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;

    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(
        h.json["backend_service_role_source"], "generated",
        "{}",
        h.text
    );
    assert_eq!(h.json["checks"]["backend_service_role"], true, "{}", h.text);
    for f in ["auth", "billing", "admin"] {
        assert_eq!(h.json["features"][f]["enabled"], true, "{f}: {}", h.text);
    }
    for f in ["payments", "ai"] {
        assert_eq!(h.json["features"][f]["enabled"], false, "{f}: {}", h.text);
        let missing = h.json["features"][f]["missing_env"].to_string();
        assert!(
            !missing.contains("BACKEND_SERVICE_ROLE_KEY"),
            "{f}: {missing}"
        );
    }
    let key_file = dir.path().join("data/service_role_key");
    let key = std::fs::read_to_string(&key_file).expect("the generated key file");
    assert!(key.trim().len() >= 32);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key_file).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    }

    let t = sign_up(&api, "embedded@example.com").await;
    let r = get_auth(&api, "/api/me", &t).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json["email"], "embedded@example.com");
    assert_eq!(r.json["subscription"]["plan"], "FREE");
    let user = r.json["id"].as_str().unwrap().to_string();

    let r = post_auth(&api, "/api/profile", &t, json!({"full_name": "Em Bedded"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = post_auth(&api, "/api/subscription", &t, json!({"action": "cancel"})).await;
    r.assert_problem(409, Some("free_plan"), None);
    let r = post_auth(&api, "/api/payments", &t, json!({"plan": "PRO"})).await;
    r.assert_problem(503, Some("not_configured"), None);

    let bytes = png();
    let r = post_auth(
        &api,
        "/api/profile/avatar",
        &t,
        json!({"fileSize": bytes.len(), "fileType": "image/png"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let upload_token = r.json["token"].as_str().unwrap().to_string();

    // A restart keeps the same secret: the grant made before still uploads.
    drop(api);
    let api = Proc::api(&env, &["--with-worker"], dir.path()).await;
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key);
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["backend_service_role_source"], "generated");
    let r = Reply::send(
        client()
            .put(api.url(&format!(
                "/storage/v1/object/upload/sign/avatars/{user}/avatar?token={upload_token}"
            )))
            .header("content-type", "image/png")
            .body(bytes.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = tests::get(&api.url(&format!("/storage/v1/object/public/avatars/{user}/avatar"))).await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_set_key_is_used_and_production_still_requires_one() {
    // Set in the environment: used, nothing written.
    let dir = TempDir::new();
    let env = nothing_configured().with(
        "BACKEND_SERVICE_ROLE_KEY",
        "set-service-role-key-0123456789abcdef0123",
    );
    let api = Proc::api(&env, &[], dir.path()).await;
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["backend_service_role_source"], "env", "{}", h.text);
    assert!(!dir.path().join("data/service_role_key").exists());
    drop(api);

    // Production: PostgreSQL configured, no key: not generated, still 503.
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let h = tests::get(&api.url("/api/health")).await;
    assert_eq!(h.json["backend_service_role_source"], "none", "{}", h.text);
    assert_eq!(h.json["checks"]["backend_service_role"], false);
    assert!(!stack.dir.path().join("data/service_role_key").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn the_upload_url_is_on_the_api_origin() {
    let dir = TempDir::new();
    let env = nothing_configured()
        .with("APP_URL", APP)
        .with("API_EXTERNAL_URL", API);
    let api = Proc::api(&env, &[], dir.path()).await;
    let t = sign_up(&api, "two@example.com").await;
    let r = post_auth(
        &api,
        "/api/profile/avatar",
        &t,
        json!({"fileSize": 100, "fileType": "image/png"}),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let url = r.json["signedUrl"].as_str().unwrap();
    assert!(
        url.starts_with(&format!("{API}/storage/v1/object/upload/sign/avatars/")),
        "{url}"
    );
}
