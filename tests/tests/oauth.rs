//! OAuth sign-in (`GET /auth/v1/authorize` → provider → `GET /auth/v1/callback`)
//! against the real api, PostgreSQL and Redis, with GitHub and Google faked
//! over HTTP (wiremock) speaking their documented payloads: GitHub's
//! `POST /login/oauth/access_token`, REST `GET /user` and `GET /user/emails`;
//! Google's token endpoint and OpenID Connect userinfo.
//!
//! Checked: the authorize redirect (client id, registered callback, scopes,
//! state, S256 challenge), the upstream token request (the code, the PKCE
//! verifier matching the challenge, the client secret), the implicit flow's
//! session in the fragment (and `GET /auth/v1/user` with it), the PKCE flow's
//! `?code=` exchanged at `POST /auth/v1/token?grant_type=pkce` (a wrong
//! verifier → `bad_code_verifier`), the state (missing, unknown, reused →
//! refused), unknown/disabled providers, provider errors, and `redirect_to`
//! to another origin landing on `APP_URL`.

use std::collections::HashMap;

use serde_json::json;
use tests::{client, EnvMap, Proc, Reply, Stack};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const APP_URL: &str = "https://app.example.test";
const GH_ID: &str = "Iv1.gh-client-id";
const GH_SECRET: &str = "gh-client-secret-0123456789";
const GOOGLE_ID: &str = "1234.apps.googleusercontent.com";
const GOOGLE_SECRET: &str = "GOCSPX-google-secret";
const GH_TOKEN: &str = tests::GITHUB_TOKEN;

/// A fake GitHub: token endpoint, `/user`, `/user/emails` (two verified
/// addresses, the primary one public).
async fn fake_github() -> MockServer {
    let server = MockServer::start().await;
    tests::mount_github(
        &server,
        tests::GithubUser {
            login: "octocat",
            id: 583231,
            name: "The Octocat",
        },
        json!([
            {"email": "octocat@users.noreply.github.com", "verified": true, "primary": false, "visibility": null},
            {"email": "octocat@example.com", "verified": true, "primary": true, "visibility": "public"}
        ]),
    )
    .await;
    server
}

/// A fake Google: token endpoint and userinfo.
async fn fake_google() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": "ya29.a0AfH6SMB", "expires_in": 3599,
            "scope": "openid https://www.googleapis.com/auth/userinfo.email https://www.googleapis.com/auth/userinfo.profile",
            "token_type": "Bearer", "id_token": "eyJhbGciOiJSUzI1NiJ9.e30.sig"
        })))
        .mount(&server)
        .await;
    Mock::given(method("GET"))
        .and(path("/v1/userinfo"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "sub": "110169484474386276334", "name": "Jane Doe",
            "given_name": "Jane", "family_name": "Doe",
            "picture": "https://lh3.googleusercontent.com/a/photo.jpg",
            "email": "jane.doe@example.com", "email_verified": true, "locale": "en"
        })))
        .mount(&server)
        .await;
    server
}

fn env(stack: &Stack, github: &MockServer, google: Option<&MockServer>) -> EnvMap {
    let mut env = stack
        .env()
        .with("APP_URL", APP_URL)
        .with("OAUTH_GITHUB_CLIENT_ID", GH_ID)
        .with("OAUTH_GITHUB_CLIENT_SECRET", GH_SECRET)
        .with("OAUTH_GITHUB_BASE_URL", github.uri())
        .with("OAUTH_GITHUB_API_URL", github.uri())
        .with("OAUTH_TIMEOUT_MS", "2000")
        .with("AUTH_RATE_LIMIT_PER_5MIN", "100000");
    if let Some(g) = google {
        env = env
            .with("OAUTH_GOOGLE_CLIENT_ID", GOOGLE_ID)
            .with("OAUTH_GOOGLE_CLIENT_SECRET", GOOGLE_SECRET)
            .with(
                "OAUTH_GOOGLE_AUTH_URL",
                format!("{}/o/oauth2/v2/auth", g.uri()),
            )
            .with("OAUTH_GOOGLE_TOKEN_URL", format!("{}/token", g.uri()))
            .with(
                "OAUTH_GOOGLE_USERINFO_URL",
                format!("{}/v1/userinfo", g.uri()),
            );
    }
    env
}

fn with_query(url: &str, pairs: &[(&str, &str)]) -> String {
    reqwest::Url::parse_with_params(url, pairs)
        .unwrap()
        .to_string()
}

fn query_of(url: &str) -> HashMap<String, String> {
    let u = reqwest::Url::parse(url).unwrap_or_else(|e| panic!("{url:?}: {e}"));
    u.query_pairs().into_owned().collect()
}

fn fragment_of(url: &str) -> HashMap<String, String> {
    let u = reqwest::Url::parse(url).unwrap();
    let frag = u.fragment().unwrap_or_default().to_owned();
    reqwest::Url::parse(&format!("http://x/?{frag}"))
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

/// `GET /auth/v1/authorize?…` → the 302's `Location`.
async fn authorize(api: &Proc, query: &[(&str, &str)]) -> Reply {
    Reply::send(tests::no_redirects().get(with_query(&api.url("/auth/v1/authorize"), query))).await
}

fn location(r: &Reply) -> String {
    assert_eq!(
        r.status.as_u16(),
        302,
        "expected a redirect: {} {}",
        r.status,
        r.text
    );
    r.header("location").expect("Location").to_owned()
}

/// The provider sends the browser back: `GET /auth/v1/callback?code&state`.
async fn callback(api: &Proc, query: &[(&str, &str)]) -> String {
    let r =
        Reply::send(tests::no_redirects().get(with_query(&api.url("/auth/v1/callback"), query)))
            .await;
    location(&r)
}

/// Token requests the fake provider received, as form maps.
async fn token_requests(server: &MockServer, token_path: &str) -> Vec<HashMap<String, String>> {
    server
        .received_requests()
        .await
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.method.as_str() == "POST" && r.url.path() == token_path)
        .map(|r| query_of(&format!("http://x/?{}", String::from_utf8_lossy(&r.body))))
        .collect()
}

#[tokio::test]
async fn github_implicit_flow_signs_in_and_the_session_works() {
    let github = fake_github().await;
    let stack = Stack::new().await;
    let api = stack.api(&env(&stack, &github, None)).await;

    let to = format!("{APP_URL}/welcome");
    let r = authorize(&api, &[("provider", "github"), ("redirect_to", &to)]).await;
    let upstream = location(&r);
    assert!(
        upstream.starts_with(&format!("{}/login/oauth/authorize?", github.uri())),
        "{upstream}"
    );
    let q = query_of(&upstream);
    assert_eq!(q["client_id"], GH_ID);
    assert_eq!(q["response_type"], "code");
    assert_eq!(q["redirect_uri"], format!("{APP_URL}/auth/v1/callback"));
    assert_eq!(q["scope"], "read:user user:email");
    assert_eq!(q["code_challenge_method"], "S256");
    let state = q["state"].clone();
    assert!(state.len() >= 43, "an unguessable state: {state}");
    assert!(!upstream.contains(GH_SECRET));

    let back = callback(&api, &[("code", "gh-code-1"), ("state", &state)]).await;
    assert!(back.starts_with(&format!("{to}#")), "{back}");
    let f = fragment_of(&back);
    assert_eq!(f["token_type"], "bearer");
    assert_eq!(f["provider_token"], GH_TOKEN);
    assert!(f["expires_in"].parse::<u64>().unwrap() > 0);
    assert!(f["expires_at"].parse::<u64>().unwrap() > 0);
    assert!(!f["refresh_token"].is_empty());

    // The upstream token request carried the code, the verifier of the
    // challenge sent in the authorize URL, and the client secret.
    let reqs = token_requests(&github, "/login/oauth/access_token").await;
    assert_eq!(reqs.len(), 1);
    let t = &reqs[0];
    assert_eq!(t["grant_type"], "authorization_code");
    assert_eq!(t["code"], "gh-code-1");
    assert_eq!(t["client_id"], GH_ID);
    assert_eq!(t["client_secret"], GH_SECRET);
    assert_eq!(t["redirect_uri"], format!("{APP_URL}/auth/v1/callback"));
    assert_eq!(
        entity::identity::oauth::s256_challenge(&t["code_verifier"]),
        q["code_challenge"]
    );

    let user = Reply::send(
        client()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(&f["access_token"]),
    )
    .await;
    assert_eq!(user.status.as_u16(), 200, "{}", user.text);
    assert_eq!(user.json["email"], "octocat@example.com");
    assert_eq!(user.json["app_metadata"]["provider"], "github");
    assert_eq!(user.json["user_metadata"]["user_name"], "octocat");

    // The same GitHub account signs in again as the same user.
    let r = authorize(&api, &[("provider", "github")]).await;
    let state2 = query_of(&location(&r))["state"].clone();
    let back2 = callback(&api, &[("code", "gh-code-2"), ("state", &state2)]).await;
    assert!(back2.starts_with(APP_URL), "{back2}");
    let f2 = fragment_of(&back2);
    let user2 = Reply::send(
        client()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(&f2["access_token"]),
    )
    .await;
    assert_eq!(user2.json["id"], user.json["id"]);

    // A refresh of that session answers the same user (identities included).
    let r = Reply::send(
        client()
            .post(api.url("/auth/v1/token?grant_type=refresh_token"))
            .json(&json!({ "refresh_token": f2["refresh_token"] })),
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text);
    assert_eq!(r.json["user"], user2.json);
    assert_eq!(r.json["user"]["identities"][0]["provider"], "github");
}

#[tokio::test]
async fn the_state_is_required_single_use_and_unguessable() {
    let github = fake_github().await;
    let stack = Stack::new().await;
    let api = stack.api(&env(&stack, &github, None)).await;
    let to = format!("{APP_URL}/after");

    let error_of = |url: &str| {
        let mut m = query_of(url);
        m.extend(fragment_of(url));
        m
    };

    // Missing state.
    let back = callback(&api, &[("code", "c")]).await;
    assert!(back.starts_with(APP_URL), "{back}");
    assert_eq!(
        error_of(&back)["error_code"],
        "bad_oauth_callback",
        "{back}"
    );
    // Unknown state.
    let back = callback(&api, &[("code", "c"), ("state", "forged-state-value")]).await;
    assert_eq!(error_of(&back)["error_code"], "bad_oauth_state", "{back}");
    assert!(error_of(&back).contains_key("error_description"));

    let r = authorize(&api, &[("provider", "github"), ("redirect_to", &to)]).await;
    let state = query_of(&location(&r))["state"].clone();
    let ok = callback(&api, &[("code", "c1"), ("state", &state)]).await;
    assert!(fragment_of(&ok).contains_key("access_token"), "{ok}");
    // Reused state.
    let again = callback(&api, &[("code", "c1"), ("state", &state)]).await;
    assert_eq!(error_of(&again)["error_code"], "bad_oauth_state", "{again}");
    assert!(!fragment_of(&again).contains_key("access_token"));
    // Only one code exchange reached the provider; the refused callbacks none.
    assert_eq!(
        token_requests(&github, "/login/oauth/access_token")
            .await
            .len(),
        1
    );

    // The user refused at the provider: its error is passed on to redirect_to.
    let r = authorize(&api, &[("provider", "github"), ("redirect_to", &to)]).await;
    let state = query_of(&location(&r))["state"].clone();
    let denied = callback(
        &api,
        &[
            ("error", "access_denied"),
            (
                "error_description",
                "The user has denied your application access.",
            ),
            ("state", &state),
        ],
    )
    .await;
    assert!(denied.starts_with(&to), "{denied}");
    assert_eq!(error_of(&denied)["error"], "access_denied");
}

#[tokio::test]
async fn pkce_flow_gives_a_code_checked_against_the_verifier() {
    let github = fake_github().await;
    let stack = Stack::new().await;
    let api = stack.api(&env(&stack, &github, None)).await;
    let to = format!("{APP_URL}/auth/callback");
    let verifier = "4f1d0c9a8b7e6d5c4b3a29181706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b";
    let challenge = entity::identity::oauth::s256_challenge(verifier);

    let code_for = |api: &Proc| {
        let api_url = api.url("");
        let to = to.clone();
        let challenge = challenge.clone();
        async move {
            let r = Reply::send(tests::no_redirects().get(with_query(
                &format!("{api_url}/auth/v1/authorize"),
                &[
                    ("provider", "github"),
                    ("redirect_to", to.as_str()),
                    ("code_challenge", challenge.as_str()),
                    ("code_challenge_method", "s256"),
                ],
            )))
            .await;
            let state = query_of(&location(&r))["state"].clone();
            let back = Reply::send(tests::no_redirects().get(with_query(
                &format!("{api_url}/auth/v1/callback"),
                &[("code", "gh-pkce"), ("state", state.as_str())],
            )))
            .await;
            let back = location(&back);
            assert!(back.starts_with(&format!("{to}?")), "{back}");
            assert!(!back.contains("access_token"), "{back}");
            query_of(&back)["code"].clone()
        }
    };

    let exchange = |code: String, verifier: String| {
        let url = api.url("/auth/v1/token?grant_type=pkce");
        async move {
            Reply::send(
                client()
                    .post(url)
                    .header("content-type", "application/json;charset=UTF-8")
                    .header("X-Supabase-Api-Version", "2024-01-01")
                    .body(json!({"auth_code": code, "code_verifier": verifier}).to_string()),
            )
            .await
        }
    };

    // A wrong verifier is refused.
    let code = code_for(&api).await;
    let wrong = exchange(code, "0".repeat(112)).await;
    assert_eq!(wrong.status.as_u16(), 400, "{}", wrong.text);
    assert_eq!(wrong.json["code"], "bad_code_verifier", "{}", wrong.text);

    // The right one gives the session.
    let code = code_for(&api).await;
    let ok = exchange(code.clone(), verifier.to_owned()).await;
    assert_eq!(ok.status.as_u16(), 200, "{}", ok.text);
    assert_eq!(ok.json["token_type"], "bearer");
    assert_eq!(ok.json["user"]["email"], "octocat@example.com");
    let user = Reply::send(
        client()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(ok.json["access_token"].as_str().unwrap()),
    )
    .await;
    assert_eq!(user.status.as_u16(), 200, "{}", user.text);
    // The code is single use.
    let reuse = exchange(code, verifier.to_owned()).await;
    assert_ne!(reuse.status.as_u16(), 200, "{}", reuse.text);
}

#[tokio::test]
async fn google_signs_in_and_bad_requests_are_refused() {
    let github = fake_github().await;
    let google = fake_google().await;
    let stack = Stack::new().await;
    let api = stack.api(&env(&stack, &github, Some(&google))).await;

    let r = authorize(
        &api,
        &[
            ("provider", "google"),
            ("redirect_to", "https://evil.example/steal"),
        ],
    )
    .await;
    let upstream = location(&r);
    assert!(
        upstream.starts_with(&format!("{}/o/oauth2/v2/auth?", google.uri())),
        "{upstream}"
    );
    let q = query_of(&upstream);
    assert_eq!(q["client_id"], GOOGLE_ID);
    assert_eq!(q["scope"], "openid email profile");
    let back = callback(&api, &[("code", "4/0Adeu5B"), ("state", &q["state"])]).await;
    // Another origin in redirect_to lands on APP_URL.
    assert!(
        back.starts_with(&format!("{APP_URL}/#")) || back.starts_with(&format!("{APP_URL}#")),
        "{back}"
    );
    let f = fragment_of(&back);
    assert_eq!(f["provider_token"], "ya29.a0AfH6SMB");
    let reqs = token_requests(&google, "/token").await;
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0]["client_secret"], GOOGLE_SECRET);
    assert_eq!(
        entity::identity::oauth::s256_challenge(&reqs[0]["code_verifier"]),
        q["code_challenge"]
    );
    let user = Reply::send(
        client()
            .get(api.url("/auth/v1/user"))
            .bearer_auth(&f["access_token"]),
    )
    .await;
    assert_eq!(user.json["email"], "jane.doe@example.com");
    assert_eq!(user.json["app_metadata"]["provider"], "google");

    // Unknown provider, missing provider, bad PKCE parameters.
    for query in [
        vec![("provider", "gitlab")],
        vec![],
        vec![
            ("provider", "github"),
            ("code_challenge", "short"),
            ("code_challenge_method", "s256"),
        ],
        vec![("provider", "github"), ("code_challenge_method", "s256")],
    ] {
        let r = Reply::send(
            tests::no_redirects()
                .get(with_query(&api.url("/auth/v1/authorize"), &query))
                .header("X-Supabase-Api-Version", "2024-01-01"),
        )
        .await;
        assert_eq!(r.status.as_u16(), 400, "{query:?}: {}", r.text);
        assert_eq!(r.json["code"], "validation_failed", "{query:?}: {}", r.text);
        assert!(r.json["message"].is_string());
    }
    // Legacy error format without the version header.
    let r = authorize(&api, &[("provider", "gitlab")]).await;
    assert_eq!(r.status.as_u16(), 400);
    assert_eq!(r.json["code"], 400);
    assert_eq!(r.json["error_code"], "validation_failed");
}

#[tokio::test]
async fn a_disabled_provider_and_a_failing_provider() {
    let github = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/login/oauth/access_token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "error": "bad_verification_code",
            "error_description": "The code passed is incorrect or expired.",
            "error_uri": "https://docs.github.com/apps/managing-oauth-apps/troubleshooting-oauth-app-access-token-request-errors/#bad-verification-code"
        })))
        .mount(&github)
        .await;
    let stack = Stack::new().await;
    let api = stack.api(&env(&stack, &github, None)).await;

    let r = Reply::send(
        tests::no_redirects()
            .get(with_query(
                &api.url("/auth/v1/authorize"),
                &[("provider", "google")],
            ))
            .header("X-Supabase-Api-Version", "2024-01-01"),
    )
    .await;
    assert_eq!(r.status.as_u16(), 400, "{}", r.text);
    assert_eq!(r.json["code"], "provider_disabled", "{}", r.text);

    let to = format!("{APP_URL}/x");
    let r = authorize(&api, &[("provider", "github"), ("redirect_to", &to)]).await;
    let state = query_of(&location(&r))["state"].clone();
    let back = callback(&api, &[("code", "stale"), ("state", &state)]).await;
    assert!(back.starts_with(&format!("{to}#")), "{back}");
    let f = fragment_of(&back);
    assert!(f.contains_key("error"), "{back}");
    assert!(f.contains_key("error_description"), "{back}");
    assert!(!f.contains_key("access_token"));
}
