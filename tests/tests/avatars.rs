//! Avatars against the real `api`, `worker`, PostgreSQL, Redis and an object
//! store (the local filesystem, or `s3s-fs`, a real S3 server checking SigV4
//! signatures): the signed-upload grant of `POST /api/profile/avatar`, the
//! upload to the signed URL (raw bytes, chunked, multipart as storage clients
//! send it) with every refusal writing nothing, serving the public file with
//! its ETag, and the worker's cleanup of objects a profile save left
//! unreferenced.
//!
//! The same scenarios run on both stores: [`Store`] says where the object of
//! a user lives as a file (`<root>/avatars/<user>/avatar`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use reqwest::{header::HeaderMap, StatusCode};
use sea_orm::sqlx;
use serde_json::{json, Value};
use tests::{
    client, hs256_token as hs256_with, session_claims as claims, tail, tamper_signature,
    unix_now as now, EnvMap, Proc, Reply, S3Server, Stack,
};
use uuid::Uuid;
use worker::{QueueName, Queues};

const SECRET: &str = "sessions-test-secret-0123456789abcdef0123456789";
const SERVICE_KEY: &str = "service-role-test-key-0123456789abcdef";
const APP_URL: &str = "https://app.example.test";
const PROFILE: &str = "/api/profile";
const GRANT: &str = "/api/profile/avatar";
const MAX_BYTES: usize = 2 * 1024 * 1024;

// ---------------------------------------------------------------------------
// Environment, session tokens (as in sessions.rs)
// ---------------------------------------------------------------------------

fn session_env(stack: &Stack) -> EnvMap {
    stack.session_env(SECRET, SERVICE_KEY)
}

/// A valid HS256 session token of `user`.
fn token(user: Uuid, email: &str) -> String {
    hs256_with(SECRET.as_bytes(), &claims(&user.to_string(), Some(email)))
}

/// Upload-grant claims as the api signs them, issued at `iat`.
fn grant_claims(user: Uuid, max_size: usize, content_type: &str, iat: i64) -> Value {
    json!({
        "sub": user.to_string(),
        "bucket": "avatars",
        "path": format!("{user}/avatar"),
        "max_size": max_size,
        "content_type": content_type,
        "aud": "storage-upload",
        "iat": iat,
        "exp": iat + 7200,
    })
}

/// The api environment for avatars: sessions ready and a known `APP_URL`.
fn avatar_env(stack: &Stack) -> EnvMap {
    session_env(stack).with("APP_URL", APP_URL)
}

// ---------------------------------------------------------------------------
// Object stores
// ---------------------------------------------------------------------------

/// An object store the api and worker use, and where its objects are files.
struct Store {
    /// `env` additions selecting the store.
    env: EnvMap,
    /// The object `avatars/<user>/<name>` is `<root>/avatars/<user>/<name>`.
    root: PathBuf,
    /// Which store, for messages.
    name: &'static str,
    /// Keeps the S3 server alive.
    _s3: Option<S3Server>,
}

impl Store {
    /// The default store: `file://<DATA_DIR>/storage`, `STORAGE_URL` unset.
    fn default_file(stack: &Stack) -> Store {
        Store {
            env: avatar_env(stack).without("STORAGE_URL"),
            root: stack.dir.path().join("data").join("storage"),
            name: "file store (default)",
            _s3: None,
        }
    }

    /// `STORAGE_URL=file://<dir>/objects`.
    fn file(stack: &Stack) -> Store {
        let root = stack.dir.path().join("objects");
        Store {
            env: avatar_env(stack).with("STORAGE_URL", format!("file://{}", root.display())),
            root,
            name: "file store",
            _s3: None,
        }
    }

    /// A fresh `s3s-fs` server and its bucket.
    async fn s3(stack: &Stack) -> Store {
        let s3 = S3Server::start().await;
        Store {
            env: s3.configure(avatar_env(stack)),
            root: s3.bucket_dir(),
            name: "S3 store",
            _s3: Some(s3),
        }
    }

    /// The file holding `avatars/<user>/<name>`.
    fn file_of(&self, user: Uuid, name: &str) -> PathBuf {
        self.root.join("avatars").join(user.to_string()).join(name)
    }

    /// The bytes of `user`'s avatar object, `None` when there is none (the
    /// store's root must exist, so `None` never passes vacuously).
    fn avatar(&self, user: Uuid) -> Option<Vec<u8>> {
        assert!(
            self.root.is_dir(),
            "{}: the store root {} is not a directory",
            self.name,
            self.root.display()
        );
        read_if_exists(&self.file_of(user, "avatar"))
    }

    /// The entries of `<root>/avatars/<user>/` (empty when that folder does
    /// not exist). Panics when the store's root is not a directory or the
    /// folder cannot be read, so "nothing written" never passes vacuously.
    fn listing(&self, user: Uuid) -> Vec<String> {
        assert!(
            self.root.is_dir(),
            "{}: the store root {} is not a directory",
            self.name,
            self.root.display()
        );
        let dir = self.root.join("avatars").join(user.to_string());
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => panic!("{}: cannot list {}: {e}", self.name, dir.display()),
        };
        let mut names: Vec<String> = entries
            .map(|e| {
                e.expect("read dir entry")
                    .file_name()
                    .to_string_lossy()
                    .to_string()
            })
            .collect();
        names.sort();
        names
    }
}

fn read_if_exists(path: &Path) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(b) => Some(b),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("read {}: {e}", path.display()),
    }
}

// ---------------------------------------------------------------------------
// Test images
// ---------------------------------------------------------------------------

/// `n` pseudo-random bytes from `seed` (so different images differ).
fn noise(n: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x >> 24) as u8
        })
        .collect()
}

/// A PNG-headed file of exactly `len` bytes (signature, IHDR chunk, noise).
fn png(len: usize, seed: u32) -> Vec<u8> {
    let mut v = b"\x89PNG\r\n\x1a\n".to_vec();
    v.extend_from_slice(&[0, 0, 0, 13]);
    v.extend_from_slice(b"IHDR");
    v.extend_from_slice(&[0, 0, 0, 64, 0, 0, 0, 64, 8, 6, 0, 0, 0]);
    v.extend_from_slice(&[0x5b, 0x28, 0x9c, 0x0e]);
    assert!(len >= v.len(), "a PNG needs at least {} bytes", v.len());
    v.extend(noise(len - v.len(), seed));
    v
}

/// A JPEG (JFIF) file of exactly `len` bytes.
fn jpeg(len: usize, seed: u32) -> Vec<u8> {
    let mut v = b"\xFF\xD8\xFF\xE0\x00\x10JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00".to_vec();
    assert!(len >= v.len());
    v.extend(noise(len - v.len(), seed));
    v
}

/// A GIF89a file of exactly `len` bytes.
fn gif(len: usize, seed: u32) -> Vec<u8> {
    let mut v = b"GIF89a\x40\x00\x40\x00\x80\x00\x00".to_vec();
    assert!(len >= v.len());
    v.extend(noise(len - v.len(), seed));
    v
}

/// An SVG document (text, not an accepted image).
fn svg() -> Vec<u8> {
    br#"<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><script>alert(1)</script></svg>"#
        .to_vec()
}

// ---------------------------------------------------------------------------
// Requests
// ---------------------------------------------------------------------------

/// `POST /api/profile` as `token`.
async fn save_profile(api: &Proc, tok: &str, body: &Value) -> Reply {
    Reply::send(client().post(api.url(PROFILE)).bearer_auth(tok).json(body)).await
}

/// `POST /api/profile/avatar` as `token`.
async fn request_grant(api: &Proc, tok: &str, size: i64, mime: &str) -> Reply {
    Reply::send(
        client()
            .post(api.url(GRANT))
            .bearer_auth(tok)
            .json(&json!({"fileSize": size, "fileType": mime})),
    )
    .await
}

/// A granted upload: its token and the signed URL pointed at `api`.
struct Grant {
    token: String,
    url: String,
}

/// `POST /api/profile/avatar` that must succeed; checks the answer's shape.
async fn grant(api: &Proc, user: Uuid, size: usize, mime: &str) -> Grant {
    let tok = token(user, &format!("{}@example.com", &user.to_string()[..8]));
    let r = request_grant(api, &tok, i64::try_from(size).expect("size"), mime).await;
    assert_eq!(r.status, 200, "grant {size} bytes of {mime}: {}", r.text);
    let token = r.json["token"]
        .as_str()
        .unwrap_or_else(|| panic!("no token: {}", r.text))
        .to_string();
    let path = format!("{user}/avatar");
    assert_eq!(
        r.json,
        json!({
            "bucket": "avatars",
            "path": path,
            "token": token,
            "signedUrl": format!(
                "{APP_URL}/storage/v1/object/upload/sign/avatars/{path}?token={token}"
            ),
        })
    );
    Grant {
        url: upload_url(api, user, Some(&token)),
        token,
    }
}

/// The signed-upload URL of `user` on `api`, with `token` when given.
fn upload_url(api: &Proc, user: Uuid, token: Option<&str>) -> String {
    let base = api.url(&format!(
        "/storage/v1/object/upload/sign/avatars/{user}/avatar"
    ));
    match token {
        Some(t) => format!("{base}?token={t}"),
        None => base,
    }
}

/// How an upload body is sent.
#[derive(Clone)]
enum Payload {
    /// The raw bytes with this `Content-Type` (none when `None`) and a
    /// `Content-Length`.
    Raw(Option<&'static str>, Vec<u8>),
    /// The bytes in these chunks, `Transfer-Encoding: chunked` (no length).
    Chunked(&'static str, Vec<Vec<u8>>),
    /// `multipart/form-data` as supabase-js `uploadToSignedUrl` sends a
    /// browser `File`: a `cacheControl` field, then the file part named ""
    /// with filename `blob` and this type.
    Multipart(&'static str, Vec<u8>),
}

const BOUNDARY: &str = "----formdata-undici-026584771349";

fn multipart_body(part_type: &str, bytes: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"cacheControl\"\r\n\r\n3600\r\n"
        )
        .as_bytes(),
    );
    b.extend_from_slice(
        format!(
            "--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"\"; filename=\"blob\"\r\nContent-Type: {part_type}\r\n\r\n"
        )
        .as_bytes(),
    );
    b.extend_from_slice(bytes);
    b.extend_from_slice(format!("\r\n--{BOUNDARY}--\r\n").as_bytes());
    b
}

/// `PUT url` with `payload`.
async fn put(url: &str, payload: Payload) -> Reply {
    let req = client().put(url);
    let req = match payload {
        Payload::Raw(ct, bytes) => {
            let req = match ct {
                Some(ct) => req.header("content-type", ct),
                None => req,
            };
            req.body(bytes)
        }
        Payload::Chunked(ct, chunks) => {
            let stream =
                futures::stream::iter(chunks.into_iter().map(Ok::<Vec<u8>, std::io::Error>));
            req.header("content-type", ct)
                .body(reqwest::Body::wrap_stream(stream))
        }
        Payload::Multipart(part_type, bytes) => req
            .header(
                "content-type",
                format!("multipart/form-data; boundary={BOUNDARY}"),
            )
            .body(multipart_body(part_type, &bytes)),
    };
    Reply::send(req).await
}

/// Uploads `bytes` as `user`'s avatar (raw `PUT`, type `mime`); checks the answer.
async fn upload(api: &Proc, user: Uuid, mime: &'static str, bytes: &[u8]) {
    let g = grant(api, user, bytes.len(), mime).await;
    let r = put(&g.url, Payload::Raw(Some(mime), bytes.to_vec())).await;
    assert_eq!(
        r.status,
        200,
        "upload of {} bytes: {}; api stderr (tail):\n{}",
        bytes.len(),
        r.text,
        tail(&api.stderr(), 3000)
    );
    assert_eq!(
        r.json,
        json!({"Key": format!("avatars/{user}/avatar"), "path": format!("{user}/avatar"), "size": bytes.len()})
    );
}

/// An answer with its raw body.
struct Fetched {
    status: StatusCode,
    headers: HeaderMap,
    bytes: Vec<u8>,
}

impl Fetched {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.bytes).unwrap_or(Value::Null)
    }
}

/// `GET /storage/v1/object/public/avatars/<id>/avatar`, with `If-None-Match`.
async fn fetch(api: &Proc, id: &str, if_none_match: Option<&str>) -> Fetched {
    let mut req = client().get(api.url(&format!("/storage/v1/object/public/avatars/{id}/avatar")));
    if let Some(e) = if_none_match {
        req = req.header("if-none-match", e);
    }
    let resp = req.send().await.expect("GET avatar");
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.expect("read avatar body").to_vec();
    Fetched {
        status,
        headers,
        bytes,
    }
}

/// Checks `user`'s public avatar is exactly `bytes` of type `mime`, with the
/// caching headers; returns its ETag.
async fn assert_served(api: &Proc, user: Uuid, mime: &str, bytes: &[u8]) -> String {
    let f = fetch(api, &user.to_string(), None).await;
    assert_eq!(
        f.status,
        200,
        "GET avatar: {}",
        String::from_utf8_lossy(&f.bytes)
    );
    assert!(
        f.bytes == bytes,
        "served {} bytes differ from the {} uploaded",
        f.bytes.len(),
        bytes.len()
    );
    assert_eq!(f.header("content-type"), Some(mime));
    assert_eq!(f.header("cache-control"), Some("no-cache"));
    assert_eq!(f.header("x-content-type-options"), Some("nosniff"));
    f.header("etag")
        .filter(|e| !e.is_empty())
        .unwrap_or_else(|| panic!("no ETag; headers {:?}", f.headers))
        .to_string()
}

/// Checks `GET` of avatar `id` is a 404 `not_found` problem.
async fn assert_not_served(api: &Proc, id: &str) {
    let f = fetch(api, id, None).await;
    let reply = Reply {
        status: f.status,
        json: f.json(),
        text: String::from_utf8_lossy(&f.bytes).to_string(),
        headers: f.headers,
        elapsed: Duration::ZERO,
    };
    if let Err(e) = reply.check_problem(Some(404), Some("not_found"), None) {
        panic!("GET avatar {id}: {e}");
    }
}

// ---------------------------------------------------------------------------
// Worker, queue, clock
// ---------------------------------------------------------------------------

/// The producer side of the queues, as the api connects.
async fn queues(stack: &Stack) -> Queues {
    let source: std::collections::HashMap<&str, &str> = [
        ("REDIS_URL", stack.redis.url.as_str()),
        ("QUEUE_PREFIX", stack.redis.prefix.as_str()),
    ]
    .into();
    let settings = entity::Settings::from_source(&source).expect("settings");
    Queues::connect(&settings)
        .await
        .expect("connect the queues")
}

/// Jobs waiting on the `storage` queue.
async fn storage_backlog(q: &Queues) -> u64 {
    q.backlog(QueueName::Storage)
        .await
        .expect("storage backlog")
}

/// The worker's `avatar cleanup` log lines (JSON).
fn cleanups(worker: &Proc) -> Vec<Value> {
    worker
        .stderr()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"] == "avatar cleanup")
        .collect()
}

/// Waits until the worker has logged `n` finished avatar cleanups; returns them.
async fn wait_cleanups(worker: &Proc, n: usize) -> Vec<Value> {
    let done = tests::wait_until(Duration::from_secs(30), || async {
        cleanups(worker).len() >= n
    })
    .await;
    assert!(
        done,
        "the worker did not finish {n} avatar cleanup(s) in 30 s; stderr:\n{}",
        worker.stderr()
    );
    cleanups(worker)
}

// ---------------------------------------------------------------------------
// 1. The grant
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn avatar_grant_validates_the_file_and_signs_a_two_hour_token() {
    let stack = Stack::new().await;
    let api = stack.api(&avatar_env(&stack)).await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");

    // Every accepted type, up to exactly 2 MiB.
    for mime in ["image/jpeg", "image/png", "image/webp", "image/gif"] {
        let before = now();
        let g = grant(&api, user, MAX_BYTES, mime).await;
        let mut v = Validation::new(Algorithm::HS256);
        v.set_audience(&["storage-upload"]);
        let data = jsonwebtoken::decode::<Value>(
            &g.token,
            &DecodingKey::from_secret(SERVICE_KEY.as_bytes()),
            &v,
        )
        .unwrap_or_else(|e| panic!("token not HS256 with BACKEND_SERVICE_ROLE_KEY: {e}"));
        let c = data.claims;
        let iat = c["iat"].as_i64().expect("iat");
        assert!(
            (before - 5..=now() + 5).contains(&iat),
            "iat {iat} is not now"
        );
        assert_eq!(c, grant_claims(user, MAX_BYTES, mime, iat), "{mime}");
    }

    let mut failures = Vec::new();
    let bad: [(i64, &str, &str, &str); 9] = [
        // The bounds and the type list are in the OpenAPI schema; the
        // schema check answers them with its generic codes.
        (2_097_153, "image/png", "out_of_range", "fileSize"),
        (50_000_000, "image/jpeg", "out_of_range", "fileSize"),
        (0, "image/png", "out_of_range", "fileSize"),
        (-1, "image/png", "out_of_range", "fileSize"),
        (1000, "image/svg+xml", "invalid_format", "fileType"),
        (1000, "text/html", "invalid_format", "fileType"),
        (1000, "application/pdf", "invalid_format", "fileType"),
        (1000, "image/bmp", "invalid_format", "fileType"),
        (1000, "", "invalid_format", "fileType"),
    ];
    for (size, mime, code, field) in bad {
        let r = request_grant(&api, &tok, size, mime).await;
        if let Err(e) = r.check_problem(Some(400), Some(code), Some(field)) {
            failures.push(format!("fileSize {size}, fileType {mime:?}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // No session, or a bad one.
    let body = json!({"fileSize": 1000, "fileType": "image/png"});
    let r = Reply::send(client().post(api.url(GRANT)).json(&body)).await;
    r.assert_problem(401, None, None);
    for bad_token in [
        "garbage".to_string(),
        tamper_signature(&tok),
        hs256_with(
            b"another-secret-0123456789abcdef0123456789",
            &claims(&user.to_string(), None),
        ),
    ] {
        let r = Reply::send(
            client()
                .post(api.url(GRANT))
                .bearer_auth(&bad_token)
                .json(&body),
        )
        .await;
        r.assert_problem(401, None, None);
    }
    // An upload token is no session token.
    let g = grant(&api, user, 1000, "image/png").await;
    let r = request_grant(&api, &g.token, 1000, "image/png").await;
    r.assert_problem(401, None, None);
}

#[tokio::test(flavor = "multi_thread")]
async fn avatar_routes_answer_503_when_auth_is_off_or_not_configured() {
    let stack = Stack::new().await;
    let store = Store::file(&stack);
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    let bytes = png(4096, 1);
    // A token exactly as the api would sign it.
    let upload_token = hs256_with(
        SERVICE_KEY.as_bytes(),
        &grant_claims(user, bytes.len(), "image/png", now()),
    );

    // Auth switched off.
    {
        let api = stack
            .api(&store.env.clone().with("NEXT_PUBLIC_ENABLE_AUTH", "false"))
            .await;
        request_grant(&api, &tok, 4096, "image/png")
            .await
            .assert_problem(503, Some("feature_disabled"), None);
        let r = put(
            &upload_url(&api, user, Some(&upload_token)),
            Payload::Raw(Some("image/png"), bytes.clone()),
        )
        .await;
        r.assert_problem(503, None, None);
        assert_eq!(
            store.listing(user),
            Vec::<String>::new(),
            "written: {}",
            r.text
        );
    }

    // No BACKEND_SERVICE_ROLE_KEY: nothing to sign or check tokens with.
    {
        let api = stack
            .api(&store.env.clone().without("BACKEND_SERVICE_ROLE_KEY"))
            .await;
        request_grant(&api, &tok, 4096, "image/png")
            .await
            .assert_problem(503, Some("not_configured"), None);
        let r = put(
            &upload_url(&api, user, Some(&upload_token)),
            Payload::Raw(Some("image/png"), bytes.clone()),
        )
        .await;
        r.assert_problem(503, None, None);
        assert_eq!(
            store.listing(user),
            Vec::<String>::new(),
            "written: {}",
            r.text
        );
    }

    // Configured: the same token works (once the account exists, as it does
    // for every token the grant route signs).
    let api = stack.api(&store.env).await;
    let r = put(
        &upload_url(&api, user, Some(&upload_token)),
        Payload::Raw(Some("image/png"), bytes.clone()),
    )
    .await;
    r.assert_problem(403, Some("unknown_user"), None);
    assert_eq!(
        store.listing(user),
        Vec::<String>::new(),
        "written: {}",
        r.text
    );
    let r = save_profile(&api, &tok, &json!({"full_name": "Ann"})).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = put(
        &upload_url(&api, user, Some(&upload_token)),
        Payload::Raw(Some("image/png"), bytes.clone()),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(store.avatar(user), Some(bytes));
}

// ---------------------------------------------------------------------------
// 2. Upload, serve, refusals — on both stores
// ---------------------------------------------------------------------------

/// One refused upload.
struct Refusal {
    what: &'static str,
    url: String,
    payload: Payload,
    status: u16,
    code: &'static str,
}

/// The upload/serve/refusal scenario on `store`.
async fn upload_serve_and_refusals(stack: &Stack, store: &Store) {
    let api = stack.api(&store.env).await;
    let label = store.name;
    let ann = Uuid::new_v4();
    let bob = Uuid::new_v4();

    // A 1.5 MiB PNG, raw body: stored and served byte for byte.
    let first = png(1536 * 1024, 7);
    let g = grant(&api, ann, first.len(), "image/png").await;
    let r = put(&g.url, Payload::Raw(Some("image/png"), first.clone())).await;
    assert_eq!(
        r.status,
        200,
        "{label}: upload: {}; api stderr (tail):\n{}",
        r.text,
        tail(&api.stderr(), 3000)
    );
    assert_eq!(
        r.json,
        json!({"Key": format!("avatars/{ann}/avatar"), "path": format!("{ann}/avatar"), "size": first.len()}),
        "{label}"
    );
    assert!(
        store.avatar(ann).as_deref() == Some(&first[..]),
        "{label}: the object file {} is not the uploaded bytes",
        store.file_of(ann, "avatar").display()
    );
    let etag = assert_served(&api, ann, "image/png", &first).await;
    // Checks below that do not stop the scenario (so one run shows them all).
    let mut failures = Vec::new();
    let f = fetch(&api, &ann.to_string(), Some(&etag)).await;
    if f.status != 304 || !f.bytes.is_empty() {
        failures.push(format!(
            "{label}: GET with If-None-Match: {etag} (the current ETag): expected 304 without a body, got {} with {} bytes",
            f.status,
            f.bytes.len()
        ));
    }
    if f.status == 304
        && (f.header("etag") != Some(etag.as_str())
            || f.header("cache-control") != Some("no-cache"))
    {
        failures.push(format!(
            "{label}: a 304 must carry the ETag {etag} and Cache-Control: no-cache as the 200 does; headers {:?}",
            f.headers
        ));
    }

    // Replaced through multipart/form-data, as supabase-js sends a File.
    let second = png(300 * 1024 + 17, 8);
    let g = grant(&api, ann, second.len(), "image/png").await;
    let r = put(&g.url, Payload::Multipart("image/png", second.clone())).await;
    assert_eq!(r.status, 200, "{label}: multipart upload: {}", r.text);
    assert_eq!(r.json["size"], second.len(), "{label}: {}", r.text);
    assert!(
        store.avatar(ann).as_deref() == Some(&second[..]),
        "{label}: multipart upload not stored byte for byte"
    );
    let new_etag = assert_served(&api, ann, "image/png", &second).await;
    assert_ne!(new_etag, etag, "{label}: the ETag did not change");
    let f = fetch(&api, &ann.to_string(), Some(&etag)).await;
    assert_eq!(f.status, 200, "{label}: a stale ETag must get the new file");
    assert!(f.bytes == second, "{label}: stale ETag answered old bytes");

    // A chunked body (no Content-Length) within the grant is fine too; the
    // type served is the one the bytes show.
    let carl = Uuid::new_v4();
    let animation = gif(200 * 1024, 9);
    let g = grant(&api, carl, animation.len(), "image/gif").await;
    let chunks: Vec<Vec<u8>> = animation.chunks(64 * 1024).map(<[u8]>::to_vec).collect();
    let r = put(&g.url, Payload::Chunked("image/gif", chunks)).await;
    assert_eq!(r.status, 200, "{label}: chunked upload: {}", r.text);
    assert_eq!(r.json["size"], animation.len(), "{label}: {}", r.text);
    assert_served(&api, carl, "image/gif", &animation).await;

    // Unknown user, or not a user id at all.
    assert_not_served(&api, &Uuid::new_v4().to_string()).await;
    assert_not_served(&api, "not-a-uuid").await;

    // Refusals: against ann (who has an avatar: it must stay byte-identical)
    // and bob (who has none: none may appear).
    let small = 1000;
    for user in [ann, bob] {
        let ok = grant(&api, user, small, "image/png").await;
        let other_user = if user == ann { bob } else { ann };
        let other = grant(&api, other_user, small, "image/png").await;
        let expired = hs256_with(
            SERVICE_KEY.as_bytes(),
            &grant_claims(user, small, "image/png", now() - 7260),
        );
        let foreign_key = hs256_with(
            b"not-the-service-role-key",
            &grant_claims(user, small, "image/png", now()),
        );
        let session_key = hs256_with(
            SECRET.as_bytes(),
            &grant_claims(user, small, "image/png", now()),
        );
        let fits = png(small, 10);
        let url = |t: &str| upload_url(&api, user, Some(t));
        let raw = |b: &[u8]| Payload::Raw(Some("image/png"), b.to_vec());
        let cases = vec![
            Refusal {
                what: "no token",
                url: upload_url(&api, user, None),
                payload: raw(&fits),
                status: 401,
                code: "missing_token",
            },
            Refusal {
                what: "garbage token",
                url: url("garbage"),
                payload: raw(&fits),
                status: 401,
                code: "invalid_token",
            },
            Refusal {
                what: "tampered signature",
                url: url(&tamper_signature(&ok.token)),
                payload: raw(&fits),
                status: 401,
                code: "invalid_token",
            },
            Refusal {
                what: "signed with another key",
                url: url(&foreign_key),
                payload: raw(&fits),
                status: 401,
                code: "invalid_token",
            },
            Refusal {
                what: "signed with the session secret",
                url: url(&session_key),
                payload: raw(&fits),
                status: 401,
                code: "invalid_token",
            },
            Refusal {
                what: "expired token",
                url: url(&expired),
                payload: raw(&fits),
                status: 401,
                code: "token_expired",
            },
            Refusal {
                what: "another user's token",
                url: url(&other.token),
                payload: raw(&fits),
                status: 403,
                code: "token_path_mismatch",
            },
            Refusal {
                what: "Content-Length above the grant",
                url: ok.url.clone(),
                payload: raw(&png(small + 1, 11)),
                status: 413,
                code: "payload_too_large",
            },
            Refusal {
                what: "Content-Length far above the grant",
                url: ok.url.clone(),
                payload: raw(&png(MAX_BYTES + 1, 11)),
                status: 413,
                code: "payload_too_large",
            },
            Refusal {
                what: "chunked body above the grant",
                url: ok.url.clone(),
                payload: Payload::Chunked(
                    "image/png",
                    png(small + 600, 12)
                        .chunks(400)
                        .map(<[u8]>::to_vec)
                        .collect(),
                ),
                status: 413,
                code: "payload_too_large",
            },
            Refusal {
                what: "multipart file part above the grant",
                url: ok.url.clone(),
                payload: Payload::Multipart("image/png", png(small + 1, 13)),
                status: 413,
                code: "payload_too_large",
            },
            Refusal {
                what: "image/gif when png was granted",
                url: ok.url.clone(),
                payload: Payload::Raw(Some("image/gif"), gif(small, 14)),
                status: 400,
                code: "type_mismatch",
            },
            Refusal {
                what: "text/plain",
                url: ok.url.clone(),
                payload: Payload::Raw(Some("text/plain"), fits.clone()),
                status: 400,
                code: "type_mismatch",
            },
            Refusal {
                what: "no Content-Type",
                url: ok.url.clone(),
                payload: Payload::Raw(None, fits.clone()),
                status: 400,
                code: "type_mismatch",
            },
            Refusal {
                what: "multipart part typed image/gif",
                url: ok.url.clone(),
                payload: Payload::Multipart("image/gif", gif(small, 15)),
                status: 400,
                code: "type_mismatch",
            },
            Refusal {
                what: "JPEG bytes sent as image/png",
                url: ok.url.clone(),
                payload: raw(&jpeg(small, 16)),
                status: 400,
                code: "invalid_image",
            },
            Refusal {
                what: "SVG text sent as image/png",
                url: ok.url.clone(),
                payload: raw(&svg()),
                status: 400,
                code: "invalid_image",
            },
            Refusal {
                what: "JPEG bytes in a multipart image/png part",
                url: ok.url.clone(),
                payload: Payload::Multipart("image/png", jpeg(small, 17)),
                status: 400,
                code: "invalid_image",
            },
            Refusal {
                what: "empty body",
                url: ok.url.clone(),
                payload: raw(&[]),
                status: 400,
                code: "empty_body",
            },
        ];
        for case in cases {
            let r = put(&case.url, case.payload).await;
            let who = if user == ann { "ann" } else { "bob" };
            if let Err(e) = r.check_problem(Some(case.status), Some(case.code), None) {
                failures.push(format!("{label}: {who}: {}: {e}", case.what));
            }
            let ann_now = store.avatar(ann);
            if ann_now.as_deref() != Some(&second[..]) {
                failures.push(format!(
                    "{label}: {who}: {}: ann's avatar changed ({:?} bytes now)",
                    case.what,
                    ann_now.map(|b| b.len())
                ));
            }
            if store.listing(ann) != ["avatar"] {
                failures.push(format!(
                    "{label}: {who}: {}: ann's directory holds {:?}",
                    case.what,
                    store.listing(ann)
                ));
            }
            if !store.listing(bob).is_empty() {
                failures.push(format!(
                    "{label}: {who}: {}: bob's directory holds {:?}",
                    case.what,
                    store.listing(bob)
                ));
            }
        }
    }
    assert_served(&api, ann, "image/png", &second).await;
    assert_not_served(&api, &bob.to_string()).await;

    // The grant is reusable until it expires: bob's upload within it works.
    let bobs = png(small, 18);
    let g = grant(&api, bob, small, "image/png").await;
    let r = put(&g.url, Payload::Raw(Some("image/png"), bobs.clone())).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    assert_served(&api, bob, "image/png", &bobs).await;
    assert_eq!(store.avatar(bob), Some(bobs), "{label}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread")]
async fn file_store_upload_serve_and_refusals() {
    let stack = Stack::new().await;
    let store = Store::default_file(&stack);
    upload_serve_and_refusals(&stack, &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_upload_serve_and_refusals() {
    let stack = Stack::new().await;
    let store = Store::s3(&stack).await;
    upload_serve_and_refusals(&stack, &store).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_wrong_secret_key_fails_the_upload_and_writes_nothing() {
    let stack = Stack::new().await;
    let store = Store::s3(&stack).await;
    let ann = Uuid::new_v4();
    let bob = Uuid::new_v4();

    // With the right keys the store works.
    let first = png(64 * 1024, 19);
    {
        let api = stack.api(&store.env).await;
        upload(&api, ann, "image/png", &first).await;
        assert_eq!(store.avatar(ann), Some(first.clone()));
    }

    // A wrong secret: the server refuses the signature, the upload fails.
    let env = store
        .env
        .clone()
        .with("AWS_SECRET_ACCESS_KEY", "wrong-secret-key-0123456789");
    let api = stack.api(&env).await;
    for user in [ann, bob] {
        let bytes = png(32 * 1024, 26);
        let g = grant(&api, user, bytes.len(), "image/png").await;
        let r = put(&g.url, Payload::Raw(Some("image/png"), bytes)).await;
        assert!(
            r.status.is_server_error(),
            "upload with a wrong S3 secret: expected 5xx, got {} {}",
            r.status,
            r.text
        );
        r.check_problem(Some(r.status.as_u16()), None, None)
            .unwrap_or_else(|e| panic!("{e}"));
    }
    assert_eq!(store.avatar(ann), Some(first), "ann's avatar changed");
    assert_eq!(store.listing(ann), ["avatar"]);
    assert_eq!(store.listing(bob), Vec::<String>::new());
    assert!(
        api.stderr().contains("SignatureDoesNotMatch"),
        "the failure was not the signature check; api stderr (tail):\n{}",
        tail(&api.stderr(), 3000)
    );
}

// ---------------------------------------------------------------------------
// 3. Cleanup by the worker — on both stores
// ---------------------------------------------------------------------------

/// Removing the avatar from the profile deletes the object once the worker
/// runs, even when upload, save and removal fall in the same second (no wait
/// between the steps: the cleanup compares generations, not clocks).
async fn removed_avatar_is_deleted(stack: &Stack, store: &Store) {
    let label = store.name;
    let api = stack.api(&store.env).await;
    let q = queues(stack).await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    let path = format!("{user}/avatar");
    let bytes = png(50_000, 20);
    upload(&api, user, "image/png", &bytes).await;
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    // Saves that keep the reference queue nothing.
    let r = save_profile(&api, &tok, &json!({"full_name": "Ann"})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    assert_eq!(storage_backlog(&q).await, 0, "{label}: a job was queued");

    let r = save_profile(&api, &tok, &json!({"avatar_path": ""})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    assert_eq!(
        storage_backlog(&q).await,
        1,
        "{label}: one cleanup job on the storage queue"
    );
    assert_eq!(
        store.avatar(user),
        Some(bytes),
        "{label}: the api itself must not delete"
    );

    let worker = stack.worker(&store.env).await;
    let removed = tests::wait_until(Duration::from_secs(30), || async {
        store.avatar(user).is_none()
    })
    .await;
    assert!(
        removed,
        "{label}: the object was not deleted; worker stderr:\n{}",
        worker.stderr()
    );
    wait_cleanups(&worker, 1).await;
    assert_eq!(storage_backlog(&q).await, 0, "{label}");
    assert_not_served(&api, &user.to_string()).await;
}

/// A legacy object key of the user, replaced by `<user>/avatar`, is deleted;
/// the new avatar stays.
async fn replaced_legacy_object_is_deleted(stack: &Stack, store: &Store) {
    let label = store.name;
    let api = stack.api(&store.env).await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    let r = save_profile(&api, &tok, &json!({"full_name": "Ann"})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    let pool = stack.db.pool().await;
    let legacy = format!("{user}/legacy.png");
    let n = sqlx::query("UPDATE profiles SET avatar_path = $1 WHERE user_id::text = $2")
        .bind(&legacy)
        .bind(user.to_string())
        .execute(&pool)
        .await
        .expect("set a legacy avatar_path")
        .rows_affected();
    assert_eq!(n, 1, "{label}: no profile row");
    let legacy_file = store.file_of(user, "legacy.png");
    std::fs::create_dir_all(legacy_file.parent().expect("parent")).expect("mkdir");
    std::fs::write(&legacy_file, png(2000, 21)).expect("write the legacy object");

    let bytes = png(40_000, 22);
    upload(&api, user, "image/png", &bytes).await;
    let path = format!("{user}/avatar");
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    assert_eq!(r.json["profile"]["avatar_path"], path.as_str(), "{label}");

    let worker = stack.worker(&store.env).await;
    wait_cleanups(&worker, 1).await;
    assert!(
        !legacy_file.exists(),
        "{label}: the legacy object is still there; worker stderr:\n{}",
        worker.stderr()
    );
    assert_eq!(store.listing(user), ["avatar"], "{label}");
    assert_eq!(store.avatar(user), Some(bytes.clone()), "{label}");
    assert_served(&api, user, "image/png", &bytes).await;
    pool.close().await;
}

/// An avatar uploaded again after its removal, before the worker ran,
/// survives the cleanup: re-saved, or not (yet) re-saved.
async fn reuploaded_avatar_survives(stack: &Stack, store: &Store) {
    let label = store.name;
    let api = stack.api(&store.env).await;
    let user = Uuid::new_v4();
    let tok = token(user, "ann@example.com");
    let path = format!("{user}/avatar");
    upload(&api, user, "image/png", &png(30_000, 23)).await;
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);

    // Removed, uploaded again at once (no wait: the generation, not the
    // clock, decides), saved again; then the worker.
    let r = save_profile(&api, &tok, &json!({"avatar_path": ""})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    let again = gif(25_000, 24);
    upload(&api, user, "image/gif", &again).await;
    let r = save_profile(&api, &tok, &json!({"avatar_path": path})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    {
        let worker = stack.worker(&store.env).await;
        wait_cleanups(&worker, 1).await;
        assert_eq!(
            store.avatar(user),
            Some(again.clone()),
            "{label}: the re-saved upload was deleted; worker stderr:\n{}",
            worker.stderr()
        );
    }
    assert_served(&api, user, "image/gif", &again).await;

    // Removed, uploaded again at once but not saved yet: still kept
    // (the client saves the path right after uploading).
    let r = save_profile(&api, &tok, &json!({"avatar_path": ""})).await;
    assert_eq!(r.status, 200, "{label}: {}", r.text);
    let third = png(20_000, 25);
    upload(&api, user, "image/png", &third).await;
    let worker = stack.worker(&store.env).await;
    wait_cleanups(&worker, 1).await;
    assert_eq!(
        store.avatar(user),
        Some(third.clone()),
        "{label}: the fresh upload was deleted; worker stderr:\n{}",
        worker.stderr()
    );
    assert_served(&api, user, "image/png", &third).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_store_removed_avatar_is_deleted_by_the_worker() {
    let stack = Stack::new().await;
    removed_avatar_is_deleted(&stack, &Store::file(&stack)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_store_replaced_legacy_object_is_deleted() {
    let stack = Stack::new().await;
    replaced_legacy_object_is_deleted(&stack, &Store::file(&stack)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn file_store_reuploaded_avatar_survives_the_cleanup() {
    let stack = Stack::new().await;
    reuploaded_avatar_survives(&stack, &Store::file(&stack)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_removed_avatar_is_deleted_by_the_worker() {
    let stack = Stack::new().await;
    removed_avatar_is_deleted(&stack, &Store::s3(&stack).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_replaced_legacy_object_is_deleted() {
    let stack = Stack::new().await;
    replaced_legacy_object_is_deleted(&stack, &Store::s3(&stack).await).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn s3_store_reuploaded_avatar_survives_the_cleanup() {
    let stack = Stack::new().await;
    reuploaded_avatar_survives(&stack, &Store::s3(&stack).await).await;
}
