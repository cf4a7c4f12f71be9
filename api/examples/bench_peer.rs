//! Benchmark peer: a bare poem route (`GET /bare`, the baseline every figure in
//! BENCHMARKS.md is compared to) and a fake HTTP email API (`POST /emails`,
//! answers 200 and counts) for measuring the worker's drain rate.
//!
//! `cargo run --release -p api --example bench_peer -- 127.0.0.1:9999`
//! `GET /count` returns the number of emails received so far.
//! `GET /auth/v1/.well-known/jwks.json` publishes a fixed ES256 key (kid
//! `bench-es256`), as the auth platform does, for the session benchmarks.
//!
//! Token minting for wrk scripts (one token per line, distinct users):
//! `bench_peer tokens HS256 <secret> 1000`, `bench_peer tokens ES256 - 1000`.
//! Session verification timing (first check, then the verified-token cache):
//! `bench_peer verify <jwks url> <BACKEND_JWT_SECRET> 20000`.
//! Upload grants for the avatar benchmark:
//! `bench_peer grants <BACKEND_SERVICE_ROLE_KEY> 16 <bytes>` prints
//! `<user id> <token>` lines.
//!
//! Payments (issue 8):
//! * instant fake providers: `POST /snap/v1/transactions` answers provider_a's
//!   (Midtrans Snap) 201 `{"token","redirect_url"}`; `POST /checkout/v1/payment`
//!   answers provider_b's (DOKU Checkout) documented 200 body with
//!   `response.payment.url`. `GET /count` counts these calls too.
//! * signed notifications for the webhook benchmark:
//!   `bench_peer notify-a <PROVIDER_A_SERVER_KEY> <gross_amount> < order_ids`
//!   prints one provider_a `settlement` notification (JSON, one line) per
//!   order id read from stdin, signed with `entity::payment::provider_a_signature`.

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use poem::{get, handler, listener::TcpListener, post, web::Data, EndpointExt, Route, Server};

#[handler]
fn bare() -> &'static str {
    "ok"
}

#[handler]
fn emails(count: Data<&Arc<AtomicU64>>, body: poem::Body) -> poem::Response {
    drop(body);
    let n = count.fetch_add(1, Ordering::Relaxed) + 1;
    poem::Response::builder()
        .content_type("application/json")
        .body(format!("{{\"id\":\"{n}\"}}"))
}

/// provider_a's Snap "create transaction" answer (201), at once.
#[handler]
fn snap_transactions(count: Data<&Arc<AtomicU64>>, body: poem::Body) -> poem::Response {
    drop(body);
    count.fetch_add(1, Ordering::Relaxed);
    let token = uuid::Uuid::new_v4();
    poem::Response::builder()
        .status(poem::http::StatusCode::CREATED)
        .content_type("application/json")
        .body(format!(
            r#"{{"token":"{token}","redirect_url":"https://app.sandbox.midtrans.com/snap/v4/redirection/{token}"}}"#
        ))
}

/// provider_b's Checkout "payment" answer (200, DOKU's documented body), at
/// once. The invoice number is echoed from the request when it parses.
#[handler]
async fn doku_payment(count: Data<&Arc<AtomicU64>>, body: poem::Body) -> poem::Response {
    count.fetch_add(1, Ordering::Relaxed);
    let req: serde_json::Value = body
        .into_bytes()
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let invoice = req["order"]["invoice_number"].as_str().unwrap_or("INV-0");
    let amount = &req["order"]["amount"];
    let token = uuid::Uuid::new_v4().simple().to_string();
    let answer = serde_json::json!({
        "message": ["SUCCESS"],
        "response": {
            "order": {
                "amount": amount.to_string(),
                "invoice_number": invoice,
                "currency": "IDR",
                "session_id": token,
                "callback_url": req["order"]["callback_url"],
            },
            "payment": {
                "payment_method_types": ["VIRTUAL_ACCOUNT_BCA", "CREDIT_CARD"],
                "payment_due_date": 60,
                "token_id": token,
                "url": format!("https://sandbox.doku.com/checkout-link-v2/{token}"),
                "expired_date": "20261123110000",
            },
            "uuid": 2_611_231_000_000_000_000u64,
            "headers": {
                "request_id": uuid::Uuid::new_v4().to_string(),
                "signature": "HMACSHA256=bench",
                "date": "2026-11-23T10:00:00Z",
                "client_id": "BRN-bench",
            },
        },
    });
    poem::Response::builder()
        .content_type("application/json")
        .body(answer.to_string())
}

/// Prints one signed provider_a `settlement` notification per order id on
/// stdin (one JSON object per line), the shape Midtrans sends.
fn notify_a(server_key: &str, gross_amount: &str) {
    use std::io::{BufRead, Write};
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in std::io::stdin().lock().lines() {
        let line = line.expect("read an order id");
        let order_id = line.trim();
        if order_id.is_empty() {
            continue;
        }
        let body = serde_json::json!({
            "transaction_time": "2026-11-23 10:00:00",
            "transaction_status": "settlement",
            "transaction_id": uuid::Uuid::new_v4().to_string(),
            "status_message": "midtrans payment notification",
            "status_code": "200",
            "signature_key": entity::payment::provider_a_signature(order_id, "200", gross_amount, server_key),
            "payment_type": "bank_transfer",
            "order_id": order_id,
            "merchant_id": "G000000000",
            "gross_amount": gross_amount,
            "fraud_status": "accept",
            "currency": "IDR",
            "settlement_time": "2026-11-23 10:00:05",
        });
        writeln!(out, "{body}").expect("write a notification");
    }
}

#[handler]
fn counted(count: Data<&Arc<AtomicU64>>) -> String {
    count.load(Ordering::Relaxed).to_string()
}

/// A P-256 key for the ES256 benchmark only (never used elsewhere).
const EC_PRIVATE_PEM: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgknDYndBpxWONqTD8
NPT9Gzjc/iTeC6FOteYdlxAnCsyhRANCAAQbo2lO0AwFycRWCcuJr4OCTGofaEZc
eHt24j4awvQGo4qeBiA/zF6OyC1Z3X6GtuST/RE5C8T3X1Y/OmlJn5gh
-----END PRIVATE KEY-----
";
const EC_X: &str = "G6NpTtAMBcnEVgnLia-DgkxqH2hGXHh7duI-GsL0BqM";
const EC_Y: &str = "ip4GID_MXo7ILVndfoa25JP9ETkLxPdfVj86aUmfmCE";
const KID: &str = "bench-es256";

#[handler]
fn jwks() -> poem::Response {
    let body = format!(
        r#"{{"keys":[{{"kty":"EC","kid":"{KID}","use":"sig","alg":"ES256","crv":"P-256","x":"{EC_X}","y":"{EC_Y}"}}]}}"#
    );
    poem::Response::builder()
        .content_type("application/json")
        .body(body)
}

/// A session token of a new user (`alg` HS256 with `secret`, or ES256 with
/// the bench key), valid for 2 hours.
fn mint(alg: &str, secret: &str, i: usize) -> String {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    let (header, key) = match alg {
        "HS256" => (
            Header::new(Algorithm::HS256),
            EncodingKey::from_secret(secret.as_bytes()),
        ),
        "ES256" => {
            let mut h = Header::new(Algorithm::ES256);
            h.kid = Some(KID.into());
            (
                h,
                EncodingKey::from_ec_pem(EC_PRIVATE_PEM.as_bytes()).expect("EC key"),
            )
        }
        other => panic!("unknown alg {other}: HS256 or ES256"),
    };
    let now = chrono::Utc::now().timestamp();
    let claims = serde_json::json!({
        "sub": uuid::Uuid::now_v7().to_string(),
        "email": format!("bench{i}@example.com"),
        "aud": "authenticated",
        "role": "authenticated",
        "iat": now,
        "exp": now + 7200,
    });
    jsonwebtoken::encode(&header, &claims, &key).expect("sign")
}

/// Prints `n` session tokens of distinct users, valid for 2 hours.
fn tokens(alg: &str, secret: &str, n: usize) {
    for i in 0..n {
        println!("{}", mint(alg, secret, i));
    }
}

/// Times `SessionVerifier::verify` in process: the first verification of a
/// token and the mean of `n` repeats of the same token. An ES256 token is
/// checked against the JWKS at `jwks_url` once, then answered from the
/// verified-token cache; HS256 is decoded every time. Prints one line per
/// algorithm (the figure BENCHMARKS.md quotes; no pass/fail).
async fn verify(jwks_url: &str, secret: &str, n: u32) {
    let v = api::session::SessionVerifier::new(Some(secret.into()), Some(jwks_url.into()), None);
    for alg in ["HS256", "ES256"] {
        let token = mint(alg, secret, 0);
        let t0 = std::time::Instant::now();
        v.verify(&token).await.expect("first verification");
        let first = t0.elapsed();
        let t0 = std::time::Instant::now();
        for _ in 0..n {
            v.verify(&token).await.expect("repeated verification");
        }
        let per = t0.elapsed() / n.max(1);
        println!("verify {alg}: first {first:?}, then {per:?} per verification ({n} repeats)");
    }
}

/// Prints `n` lines `<user id> <upload token>` granting `size` bytes of PNG.
fn grants(key: &str, n: usize, size: i64) {
    use entity::avatar::{UploadGrant, UploadRequest};
    for _ in 0..n {
        let user = uuid::Uuid::now_v7();
        let req = UploadRequest::new(size, "image/png").expect("valid grant request");
        let token = UploadGrant::new(user, req, chrono::Utc::now()).sign(key);
        println!("{user} {token}");
    }
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).cloned().unwrap_or_default();
    match arg(1).as_str() {
        "tokens" => {
            tokens(&arg(2), &arg(3), arg(4).parse().unwrap_or(1000));
            return Ok(());
        }
        "verify" => {
            verify(&arg(2), &arg(3), arg(4).parse().unwrap_or(20_000)).await;
            return Ok(());
        }
        "grants" => {
            grants(
                &arg(2),
                arg(3).parse().unwrap_or(16),
                arg(4).parse().unwrap_or(2 * 1024 * 1024),
            );
            return Ok(());
        }
        "notify-a" => {
            let amount = if arg(3).is_empty() {
                "99000.00".to_string()
            } else {
                arg(3)
            };
            notify_a(&arg(2), &amount);
            return Ok(());
        }
        _ => {}
    }
    let addr = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:9999".into());
    let count = Arc::new(AtomicU64::new(0));
    let app = Route::new()
        .at("/bare", get(bare))
        .at("/emails", post(emails))
        .at("/count", get(counted))
        .at("/auth/v1/.well-known/jwks.json", get(jwks))
        .at("/snap/v1/transactions", post(snap_transactions))
        .at("/checkout/v1/payment", post(doku_payment))
        .data(count);
    println!("bench peer on http://{addr}");
    Server::new(TcpListener::bind(addr)).run(app).await
}
