//! A fake GitHub at the HTTP level, with the payloads GitHub documents for
//! its OAuth app flow: `POST /login/oauth/access_token`, `GET /user` and
//! `GET /user/emails` (docs.github.com, "Authorizing OAuth apps", "Get the
//! authenticated user", "List email addresses for the authenticated user").
//! Point `OAUTH_GITHUB_BASE_URL` and `OAUTH_GITHUB_API_URL` at its URI.

use serde_json::{json, Value};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

/// The access token the fake issues (GitHub's documented example).
pub const GITHUB_TOKEN: &str = "gho_16C7e42F292c6912E7710c838347Ae178B4a";

/// A GitHub account as `GET /user` answers it: `login`, numeric `id`,
/// display `name`.
pub struct GithubUser<'a> {
    /// The login (`octocat`).
    pub login: &'a str,
    /// The numeric id.
    pub id: u64,
    /// The display name.
    pub name: &'a str,
}

/// Mounts the token endpoint, `GET /user` for `user` and `GET /user/emails`
/// answering `emails` (a JSON array of `{email, verified, primary,
/// visibility}`) on `server`.
pub async fn mount_github(server: &MockServer, user: GithubUser<'_>, emails: Value) {
    Mock::given(method("POST"))
        .and(path("/login/oauth/access_token"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "access_token": GITHUB_TOKEN,
            "scope": "read:user,user:email",
            "token_type": "bearer"
        })))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path("/user"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "login": user.login, "id": user.id,
            "avatar_url": format!("https://avatars.githubusercontent.com/u/{}?v=4", user.id),
            "type": "User", "site_admin": false, "name": user.name,
            "email": null
        })))
        .mount(server)
        .await;
    Mock::given(method("GET"))
        .and(path("/user/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(emails))
        .mount(server)
        .await;
}

/// A fake GitHub whose account has one primary address, `email`, verified
/// or not.
pub async fn fake_github_with(user: GithubUser<'_>, email: &str, verified: bool) -> MockServer {
    let server = MockServer::start().await;
    mount_github(
        &server,
        user,
        json!([{"email": email, "verified": verified, "primary": true, "visibility": "public"}]),
    )
    .await;
    server
}
