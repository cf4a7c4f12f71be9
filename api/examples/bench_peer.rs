//! Benchmark peer: a bare poem route (`GET /bare`, the baseline every figure in
//! BENCHMARKS.md is compared to) and a fake HTTP email API (`POST /emails`,
//! answers 200 and counts) for measuring the worker's drain rate.
//!
//! `cargo run --release -p api --example bench_peer -- 127.0.0.1:9999`
//!
//! Why this file is long: it is every fake peer the benchmarks talk to (the
//! baseline route, the email API, both payment providers, the AI upstreams)
//! in one binary, so a benchmark run starts one process.
//! `GET /count` returns the number of emails answered so far. The fake email
//! API answers after `EMAIL_DELAY_MS` milliseconds (default 0: at once), as
//! a real provider's round trip would, and counts an email when it answers.
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
//! Load split by status (overload and shedding):
//! `bench_peer load <url> <connections> <seconds> <json body with {n}>`
//! prints, per answer status, the count, median, p99 and max latency.
//! `LOAD_RETRY_AFTER=1`: a connection refused with 503 and `Retry-After`
//! waits that long before its next request; `LOAD_REQUESTS=<n>`: at most
//! `n` requests in all (see the `load` module).
//!
//! Payments:
//! * instant fake providers: `POST /snap/v1/transactions` answers provider_a's
//!   (Midtrans Snap) 201 `{"token","redirect_url"}`; `POST /checkout/v1/payment`
//!   answers provider_b's (DOKU Checkout) documented 200 body with
//!   `response.payment.url`. `GET /count` counts these calls too.
//! * signed notifications for the webhook benchmark:
//!   `bench_peer notify-a <PROVIDER_A_SERVER_KEY> <gross_amount> < order_ids`
//!   prints one provider_a `settlement` notification (JSON, one line) per
//!   order id read from stdin, signed with `entity::billing::payment::provider_a_signature`.
//!
//! AI:
//! * a fake OpenAI Chat Completions upstream, `POST /v1/chat/completions`
//!   (point `OPENAI_BASE_URL` at `http://<addr>/v1`). With `"stream": true`
//!   it answers SSE, as OpenAI documents it: one `chat.completion.chunk` with
//!   `delta.role`, then `chunks` chunks of one `delta.content` each, sent
//!   `delay_ms` apart (the role chunk and the first content chunk at once), one with `finish_reason: "stop"`,
//!   the usage chunk (`choices: []`, `usage: {prompt_tokens, completion_tokens,
//!   total_tokens}`; `stream_options.include_usage`) and `data: [DONE]`.
//!   Without `stream` it answers a `chat.completion` JSON object with the same
//!   text and usage at once. `chunks` and `delay_ms` come from directives in
//!   the last message's text (`chunks=200 delay_ms=0`, so one api process can
//!   be driven with different shapes per request), else from the env
//!   `AI_CHUNKS` (default 200) and `AI_CHUNK_DELAY_MS` (default 20).
//! * measuring clients (one line of figures each, milliseconds):
//!   `bench_peer ttfb <url> <tokens file|-> <n> <json body> [<url2> <tokens2|-> <body2>]`:
//!   `n` sequential POSTs (after 10 unmeasured warm-ups), time from sending
//!   to the first byte of the body, each body read to its end; median, p99,
//!   max, twice: as this process read the byte, and on arrival (the kernel's
//!   receive time of the socket buffer holding it, `SO_TIMESTAMPNS`: what a
//!   client on its own core or host would see, without the measuring
//!   process's wait for a core it shares with the server). With a second
//!   target the two take turns, and the last lines give the second's median
//!   and p99 minus the first's, as read and on arrival. `TTFB_CLIENT=reqwest`
//!   measures with reqwest instead (as read only; the client before
//!   2026-11-25). The second target's answers
//!   must be a success, or with `TTFB_STATUS=<code>` that status (a refusal
//!   timed on purpose, to see where the time goes). `TTFB_PAUSE_MS=<ms>`
//!   pauses before each measured request.
//!   `bench_peer streams <url> <tokens file|-> <n> <json body>`: `n`
//!   concurrent POSTs (token `i` of the file for stream `i`, round robin);
//!   counts the streams that end with `data: [DONE]` and carry no error
//!   chunk, and reports min/median/max total duration, the largest first-byte
//!   time and the largest gap between two body chunks of one stream (a stall).

use std::sync::{
    atomic::{AtomicU64, Ordering},
    Arc,
};

use poem::{get, handler, listener::TcpListener, post, web::Data, EndpointExt, Route, Server};

#[handler]
fn bare() -> &'static str {
    "ok"
}

/// How long the fake email API takes to answer (`EMAIL_DELAY_MS`, default 0:
/// at once), as a real provider's round trip would.
#[derive(Clone, Copy)]
struct EmailDelay(std::time::Duration);

/// The fake email API: reads the body, waits [`EmailDelay`], counts the
/// email (so `GET /count` counts answered sends), answers 200.
#[handler]
async fn emails(
    count: Data<&Arc<AtomicU64>>,
    Data(EmailDelay(delay)): Data<&EmailDelay>,
    body: poem::Body,
) -> poem::Response {
    let _ = body.into_bytes().await;
    if !delay.is_zero() {
        tokio::time::sleep(*delay).await;
    }
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

/// provider_a's Get Transaction Status (`GET /v2/{order_id}/status`), which
/// the settlement job asks before a notification may pay: every order is
/// `settlement` for 99,000.00, signed with `PROVIDER_A_SERVER_KEY` (default:
/// the key `bench/run.sh` gives the api).
#[handler]
fn snap_status(poem::web::Path(order_id): poem::web::Path<String>) -> poem::Response {
    let key = std::env::var("PROVIDER_A_SERVER_KEY")
        .unwrap_or_else(|_| "SB-Mid-server-bench0123456789".into());
    let amount = "99000.00";
    let answer = serde_json::json!({
        "status_code": "200",
        "status_message": "Success, transaction is found",
        "transaction_id": uuid::Uuid::new_v4().to_string(),
        "order_id": order_id,
        "gross_amount": amount,
        "currency": "IDR",
        "payment_type": "bank_transfer",
        "transaction_time": "2026-11-23 10:00:00",
        "transaction_status": "settlement",
        "fraud_status": "accept",
        "signature_key": entity::billing::payment::provider_a_signature(&order_id, "200", amount, &key),
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
            "signature_key": entity::billing::payment::provider_a_signature(order_id, "200", gross_amount, server_key),
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
    let v = api::identity::session::SessionVerifier::new(
        Some(secret.into()),
        Some(jwks_url.into()),
        None,
    );
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
    use entity::accounts::avatar::{UploadGrant, UploadRequest};
    for _ in 0..n {
        let user = uuid::Uuid::now_v7();
        let req = UploadRequest::new(size, "image/png").expect("valid grant request");
        let token = UploadGrant::new(user, req, chrono::Utc::now()).sign(key);
        println!("{user} {token}");
    }
}

/// `name=<number>` in `text`, if present.
fn directive(text: &str, name: &str) -> Option<u64> {
    text.split(|c: char| c.is_whitespace() || c == ',')
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The fake OpenAI Chat Completions endpoint (see the module docs).
#[handler]
async fn chat_completions(body: poem::Body) -> poem::Response {
    let req: serde_json::Value = body
        .into_bytes()
        .await
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let last = req["messages"]
        .as_array()
        .and_then(|m| m.last())
        .and_then(|m| m["content"].as_str())
        .unwrap_or_default()
        .to_string();
    let chunks = directive(&last, "chunks").unwrap_or_else(|| env_u64("AI_CHUNKS", 200));
    let delay = directive(&last, "delay_ms").unwrap_or_else(|| env_u64("AI_CHUNK_DELAY_MS", 20));
    let model = req["model"].as_str().unwrap_or("gpt-4o-mini").to_string();
    let prompt_tokens = (req["messages"].to_string().len() / 4).max(1) as u64;
    let created = chrono::Utc::now().timestamp();
    let id = format!("chatcmpl-{}", uuid::Uuid::new_v4().simple());
    if req["stream"] != serde_json::Value::Bool(true) {
        let text: String = (0..chunks).map(|i| format!("tok{i} ")).collect();
        let answer = serde_json::json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": null},
                "logprobs": null,
                "finish_reason": "stop",
            }],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": chunks,
                "total_tokens": prompt_tokens + chunks,
            },
            "system_fingerprint": "fp_bench",
        });
        return poem::Response::builder()
            .content_type("application/json")
            .body(answer.to_string());
    }
    let chunk = move |choices: serde_json::Value, usage: serde_json::Value| {
        let v = serde_json::json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "system_fingerprint": "fp_bench",
            "choices": choices,
            "usage": usage,
        });
        bytes::Bytes::from(format!("data: {v}\n\n"))
    };
    let null = serde_json::Value::Null;
    let stream = async_stream::stream! {
        yield Ok::<_, std::io::Error>(chunk(
            serde_json::json!([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
            null.clone(),
        ));
        for i in 0..chunks {
            if delay > 0 && i > 0 {
                tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
            }
            yield Ok(chunk(
                serde_json::json!([{"index": 0, "delta": {"content": format!("tok{i} ")}, "logprobs": null, "finish_reason": null}]),
                null.clone(),
            ));
        }
        yield Ok(chunk(
            serde_json::json!([{"index": 0, "delta": {}, "logprobs": null, "finish_reason": "stop"}]),
            null.clone(),
        ));
        yield Ok(chunk(
            serde_json::json!([]),
            serde_json::json!({"prompt_tokens": prompt_tokens, "completion_tokens": chunks, "total_tokens": prompt_tokens + chunks}),
        ));
        yield Ok(bytes::Bytes::from_static(b"data: [DONE]\n\n"));
    };
    poem::Response::builder()
        .content_type("text/event-stream")
        .header("cache-control", "no-cache")
        .body(poem::Body::from_bytes_stream(stream))
}

/// One measured request: time to the first body byte, total time, the
/// largest gap between two body chunks, and whether the body is a complete
/// stream (ends with `data: [DONE]`, no `"type":"error"` chunk).
struct Timed {
    first: std::time::Duration,
    total: std::time::Duration,
    gap: std::time::Duration,
    complete: bool,
}

/// `expect`: the status the answer must have (`None`: any success).
async fn timed_post(
    client: &reqwest::Client,
    url: &str,
    token: Option<&str>,
    body: &str,
    expect: Option<u16>,
) -> Result<Timed, String> {
    let t0 = std::time::Instant::now();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let mut resp = req.send().await.map_err(|e| e.to_string())?;
    let status = resp.status();
    let mut first = None;
    let mut last = std::time::Instant::now();
    let mut gap = std::time::Duration::ZERO;
    let mut all = Vec::new();
    while let Some(c) = resp.chunk().await.map_err(|e| e.to_string())? {
        let now = std::time::Instant::now();
        if first.is_none() {
            first = Some(now - t0);
        } else {
            gap = gap.max(now - last);
        }
        last = now;
        all.extend_from_slice(&c);
    }
    let total = t0.elapsed();
    let wanted = expect.map_or(status.is_success(), |e| status.as_u16() == e);
    if !wanted {
        return Err(format!("{status}: {}", String::from_utf8_lossy(&all)));
    }
    Ok(Timed {
        first: first.unwrap_or(total),
        total,
        gap,
        complete: complete_stream(&String::from_utf8_lossy(&all)),
    })
}

/// A complete AI chat stream: ends with `data: [DONE]`, no `"type":"error"` chunk.
fn complete_stream(text: &str) -> bool {
    text.trim_end().ends_with("data: [DONE]") && !text.contains(r#""type":"error""#)
}

fn read_tokens(path: &str) -> Vec<String> {
    if path == "-" || path.is_empty() {
        return Vec::new();
    }
    std::fs::read_to_string(path)
        .expect("read the tokens file")
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// The `q` quantile (0..=1) of sorted `v`, nearest rank.
fn quantile(v: &[std::time::Duration], q: f64) -> std::time::Duration {
    if v.is_empty() {
        return std::time::Duration::ZERO;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// One ttfb target: URL, session tokens (none: no `Authorization`), body,
/// the status its answers must have (`None`: any success). Measured with
/// [`wire::Conn`] (first body byte as read and on arrival), or with
/// `TTFB_CLIENT=reqwest` by reqwest as before 2026-11-25 (as read only).
struct Target {
    url: String,
    tokens: Vec<String>,
    body: String,
    expect: Option<u16>,
    client: Option<reqwest::Client>,
    conn: wire::Conn,
    firsts: Vec<std::time::Duration>,
    arrivals: Vec<std::time::Duration>,
    incomplete: usize,
}

impl Target {
    fn new(url: String, tokens: &str, body: String, expect: Option<u16>) -> Self {
        let reqwest = std::env::var("TTFB_CLIENT").is_ok_and(|c| c == "reqwest");
        Target {
            conn: wire::Conn::new(&url),
            url,
            tokens: read_tokens(tokens),
            body,
            expect,
            client: reqwest.then(reqwest::Client::new),
            firsts: Vec::new(),
            arrivals: Vec::new(),
            incomplete: 0,
        }
    }

    async fn once(&mut self, i: usize, measure: bool) {
        let token = (!self.tokens.is_empty()).then(|| self.tokens[i % self.tokens.len()].as_str());
        let (t, arrived) = match &self.client {
            Some(client) => (
                timed_post(client, &self.url, token, &self.body, self.expect)
                    .await
                    .expect("request"),
                None,
            ),
            None => {
                // Blocking, on purpose: requests are sequential, and a
                // plain read leaves no other task to schedule.
                let seen = self.conn.post(token, &self.body).expect("request");
                let text = String::from_utf8_lossy(&seen.body);
                let wanted = self
                    .expect
                    .map_or((200..300).contains(&seen.status), |e| seen.status == e);
                assert!(wanted, "{}: {text}", seen.status);
                let t = Timed {
                    first: seen.read,
                    total: seen.total,
                    gap: std::time::Duration::ZERO,
                    complete: complete_stream(&text),
                };
                (t, Some(seen.arrived))
            }
        };
        if measure {
            self.incomplete += usize::from(!t.complete);
            self.firsts.push(t.first);
            self.arrivals.extend(arrived);
        }
    }
}

/// `n` sequential requests per target, the targets taking turns (so both
/// see the same background load), each with its own keep-alive connection and
/// 10 unmeasured warm-ups; prints the first-byte median, p99 and max of
/// each, as read and (wire client) on arrival, and with two targets the
/// second's median and p99 minus the first's.
async fn ttfb(mut targets: Vec<Target>, n: usize) {
    for i in 0..10 {
        for t in &mut targets {
            t.once(i, false).await;
        }
    }
    // TTFB_PAUSE_MS: a pause before each measured request (think time), so
    // that work a previous answer left behind is done by then.
    let pause = std::time::Duration::from_millis(env_u64("TTFB_PAUSE_MS", 0));
    for i in 0..n {
        for t in &mut targets {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            t.once(i, true).await;
        }
    }
    let mut read = Vec::new();
    let mut arrived = Vec::new();
    for t in &mut targets {
        let line = |what: &str, v: &mut Vec<std::time::Duration>| {
            v.sort();
            let (median, p99) = (quantile(v, 0.5), quantile(v, 0.99));
            println!(
                "ttfb {} ({what}): median {:.3} ms, p99 {:.3} ms, max {:.3} ms over {n} sequential requests ({} incomplete)",
                t.url,
                ms(median),
                ms(p99),
                ms(v.last().copied().unwrap_or_default()),
                t.incomplete,
            );
            (ms(median), ms(p99))
        };
        read.push(line("as read", &mut t.firsts));
        if !t.arrivals.is_empty() {
            arrived.push(line("on arrival", &mut t.arrivals));
        }
    }
    for (what, figures) in [("as read", read), ("on arrival", arrived)] {
        if let [(m1, p1), (m2, p2)] = figures[..] {
            println!(
                "ttfb difference {what} (second minus first): median {:+.3} ms, p99 {:+.3} ms",
                m2 - m1,
                p2 - p1
            );
        }
    }
}

/// `n` concurrent requests; prints completion and duration figures.
async fn streams(url: &str, tokens: &str, n: usize, body: &str) {
    let tokens = std::sync::Arc::new(read_tokens(tokens));
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(n)
        .build()
        .expect("client");
    let t0 = std::time::Instant::now();
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (client, tokens, url, body) = (
                client.clone(),
                tokens.clone(),
                url.to_string(),
                body.to_string(),
            );
            tokio::spawn(async move {
                let token = (!tokens.is_empty()).then(|| tokens[i % tokens.len()].as_str());
                timed_post(&client, &url, token, &body, None).await
            })
        })
        .collect();
    let mut done = Vec::new();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await.expect("task") {
            Ok(t) => done.push(t),
            Err(e) => errors.push(e),
        }
    }
    let wall = t0.elapsed();
    let complete = done.iter().filter(|t| t.complete).count();
    let mut totals: Vec<_> = done.iter().map(|t| t.total).collect();
    totals.sort();
    let first_max = done.iter().map(|t| t.first).max().unwrap_or_default();
    let gap_max = done.iter().map(|t| t.gap).max().unwrap_or_default();
    println!(
        "streams {url}: {complete}/{n} complete, {} failed; duration min {:.0} / median {:.0} / max {:.0} ms; first byte max {:.1} ms; largest gap between chunks {:.1} ms; wall {:.0} ms",
        errors.len(),
        ms(totals.first().copied().unwrap_or_default()),
        ms(quantile(&totals, 0.5)),
        ms(totals.last().copied().unwrap_or_default()),
        ms(first_max),
        ms(gap_max),
        ms(wall),
    );
    if let Some(e) = errors.first() {
        println!("streams: first error: {e}");
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
        "ttfb" | "streams" => {
            let n = arg(4)
                .parse()
                .unwrap_or(if arg(1) == "ttfb" { 200 } else { 500 });
            if arg(1) == "ttfb" {
                let mut targets = vec![Target::new(arg(2), &arg(3), arg(5), None)];
                if !arg(6).is_empty() {
                    // TTFB_STATUS: the status the second target answers
                    // (a refusal measured on purpose), else any success.
                    let expect = std::env::var("TTFB_STATUS")
                        .ok()
                        .and_then(|s| s.parse().ok());
                    targets.push(Target::new(arg(6), &arg(7), arg(8), expect));
                }
                ttfb(targets, n).await;
            } else {
                streams(&arg(2), &arg(3), n, &arg(5)).await;
            }
            return Ok(());
        }
        "load" => {
            load::run(
                &arg(2),
                arg(3).parse().unwrap_or(1024),
                arg(4).parse().unwrap_or(15),
                &arg(5),
            )
            .await;
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
        .at("/v2/:order_id/status", get(snap_status))
        .at("/checkout/v1/payment", post(doku_payment))
        .at("/v1/chat/completions", post(chat_completions))
        .data(count)
        .data(EmailDelay(std::time::Duration::from_millis(env_u64(
            "EMAIL_DELAY_MS",
            0,
        ))));
    println!("bench peer on http://{addr}");
    Server::new(TcpListener::bind(addr)).run(app).await
}

/// `bench_peer load <url> <connections> <seconds> <json body>`: a closed-loop
/// load like wrk's (each connection sends its next POST when the answer to
/// the last is read), whose figures are split by status: per status the
/// count, median, p99 and max latency (send to the last body byte), so the
/// admitted requests (200) and the shed ones (503) of an overloaded server
/// are told apart. `{n}` in the body becomes a number unique per request.
/// Only `content-length` answers are understood (JSON and problem bodies).
///
/// Options (environment):
/// * `LOAD_RETRY_AFTER=1`: a connection answered 503 with `Retry-After:
///   <seconds>` (the delay-seconds form) waits that long before its next
///   request, as the refusal asks of a client (the wait is cut short at the
///   run's end, and is not part of any latency); the connection stays open.
///   Unset: the next request goes at once, as wrk's would.
/// * `LOAD_JITTER=1` (with `LOAD_RETRY_AFTER=1`): the wait is `Retry-After`
///   plus a uniformly random part of it (between 1 and 2 × `Retry-After`),
///   as clients that back off with jitter do, so that the connections
///   refused together do not all come back in the same instant.
/// * `LOAD_WARMUP_SECS=<s>`: answers to requests sent in the first `s`
///   seconds are not counted (the start, when every connection sends at
///   once); counts and rates are over the rest of the run.
/// * `LOAD_REQUESTS=<n>`: at most `n` requests in all, then the connections
///   stop (the run also ends at `<seconds>`); used to queue a known number
///   of jobs.
mod load {
    use std::{
        collections::BTreeMap,
        sync::{
            atomic::{AtomicUsize, Ordering},
            Arc,
        },
        time::Duration,
    };

    use tokio::{
        io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader},
        net::TcpStream,
    };

    /// One answer: its status, whether the server closes the connection,
    /// and its `Retry-After` in seconds (delay-seconds form only).
    struct Answer {
        status: u16,
        close: bool,
        retry_after: Option<Duration>,
    }

    async fn one(s: &mut BufReader<TcpStream>, head: &str, body: &str) -> std::io::Result<Answer> {
        let req = format!("{head}content-length: {}\r\n\r\n{body}", body.len());
        s.get_mut().write_all(req.as_bytes()).await?;
        let mut line = String::new();
        s.read_line(&mut line).await?;
        let status = line
            .split(' ')
            .nth(1)
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("status line {line:?}")))?;
        let (mut len, mut close, mut retry_after) = (0usize, false, None);
        loop {
            line.clear();
            if s.read_line(&mut line).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let l = line.trim_end().to_ascii_lowercase();
            if l.is_empty() {
                break;
            }
            if let Some(v) = l.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            if l.starts_with("connection:") && l.contains("close") {
                close = true;
            }
            if let Some(v) = l.strip_prefix("retry-after:") {
                retry_after = v.trim().parse().ok().map(Duration::from_secs);
            }
        }
        let mut buf = vec![0u8; len];
        s.read_exact(&mut buf).await?;
        Ok(Answer {
            status,
            close,
            retry_after,
        })
    }

    pub async fn run(url: &str, conns: usize, secs: u64, body: &str) {
        let u = url::Url::parse(url).expect("url");
        let addr = format!(
            "{}:{}",
            u.host_str().expect("host"),
            u.port_or_known_default().expect("port")
        );
        let head = format!(
            "POST {} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n",
            u.path()
        );
        let honour = std::env::var("LOAD_RETRY_AFTER").is_ok_and(|v| v == "1");
        let jitter = std::env::var("LOAD_JITTER").is_ok_and(|v| v == "1");
        let warmup = Duration::from_secs(
            std::env::var("LOAD_WARMUP_SECS")
                .ok()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
                .min(secs),
        );
        let cap: Option<usize> = std::env::var("LOAD_REQUESTS")
            .ok()
            .and_then(|v| v.parse().ok());
        let sent = Arc::new(AtomicUsize::new(0));
        let started = std::time::Instant::now();
        let until = started + Duration::from_secs(secs);
        let counted_from = started + warmup;
        let tasks: Vec<_> = (0..conns)
            .map(|c| {
                let (addr, head, body) = (addr.clone(), head.clone(), body.to_string());
                let sent = sent.clone();
                tokio::spawn(async move {
                    let mut seen: Vec<(u16, Duration)> = Vec::new();
                    let (mut errors, mut waits) = (0usize, 0usize);
                    let mut conn: Option<BufReader<TcpStream>> = None;
                    let mut n = 0usize;
                    while std::time::Instant::now() < until {
                        let mut s = match conn.take() {
                            Some(s) => s,
                            None => match TcpStream::connect(&addr).await {
                                Ok(t) => {
                                    let _ = t.set_nodelay(true);
                                    BufReader::new(t)
                                }
                                Err(_) => {
                                    errors += 1;
                                    tokio::time::sleep(Duration::from_millis(10)).await;
                                    continue;
                                }
                            },
                        };
                        if cap.is_some_and(|cap| sent.fetch_add(1, Ordering::Relaxed) >= cap) {
                            break;
                        }
                        n += 1;
                        let ip = format!(
                            "x-forwarded-for: 10.{}.{}.{}\r\n",
                            c % 256,
                            (n / 256) % 256,
                            n % 256
                        );
                        let b = body.replace("{n}", &format!("{c}-{n}-{}", std::process::id()));
                        let t0 = std::time::Instant::now();
                        match one(&mut s, &format!("{head}{ip}"), &b).await {
                            Ok(a) => {
                                if t0 >= counted_from {
                                    seen.push((a.status, t0.elapsed()));
                                }
                                if !a.close {
                                    conn = Some(s);
                                }
                                if let (true, 503, Some(wait)) = (honour, a.status, a.retry_after) {
                                    waits += 1;
                                    let wait = if jitter {
                                        wait.mul_f64(1.0 + rand::random::<f64>())
                                    } else {
                                        wait
                                    };
                                    let left =
                                        until.saturating_duration_since(std::time::Instant::now());
                                    tokio::time::sleep(wait.min(left)).await;
                                }
                            }
                            Err(_) => errors += 1,
                        }
                    }
                    (seen, errors, waits)
                })
            })
            .collect();
        let mut by_status: BTreeMap<u16, Vec<Duration>> = BTreeMap::new();
        let (mut errors, mut waits) = (0, 0);
        for t in tasks {
            let (seen, e, w) = t.await.expect("task");
            errors += e;
            waits += w;
            for (s, d) in seen {
                by_status.entry(s).or_default().push(d);
            }
        }
        // With LOAD_REQUESTS the run may end before `secs`: rates are over
        // the time the connections ran.
        let ran =
            (started.elapsed().as_secs_f64().min(secs as f64) - warmup.as_secs_f64()).max(1e-3);
        let total: usize = by_status.values().map(Vec::len).sum();
        println!(
            "load {url}: {conns} connections, {ran:.1} s: {total} answers ({:.0}/s), {errors} transport errors",
            total as f64 / ran
        );
        if honour {
            println!(
                "load retry-after: honoured{} ({waits} waits after a 503 with Retry-After)",
                if jitter { " with jitter" } else { "" }
            );
        }
        if !warmup.is_zero() {
            println!("load warm-up: the first {} s not counted", warmup.as_secs());
        }
        for (status, v) in &mut by_status {
            v.sort();
            println!(
                "load status {status}: {} answers ({:.1} %), median {:.2} ms, p99 {:.2} ms, max {:.2} ms",
                v.len(),
                100.0 * v.len() as f64 / total.max(1) as f64,
                super::ms(super::quantile(v, 0.5)),
                super::ms(super::quantile(v, 0.99)),
                super::ms(v.last().copied().unwrap_or_default()),
            );
        }
    }
}

/// A keep-alive HTTP/1.1 client for the ttfb measurement that stamps the
/// first body byte twice: when this process read it, and when the kernel
/// queued it on the socket (`SO_TIMESTAMPNS`, socket(7)). On loopback the
/// second is the moment the server's write reached the client's socket, what
/// a client on another host would see (less the network): it leaves out the
/// measuring process's own wait for a core, which on a small box it shares
/// with the server. Only what the ttfb targets answer is understood: one
/// response per request, `chunked` or `content-length` bodies.
mod wire {
    use std::io::{BufRead, BufReader, IoSliceMut, Read, Write};
    use std::net::TcpStream;
    use std::os::fd::AsRawFd;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    use nix::sys::socket::{recv, recvmsg, setsockopt, sockopt, ControlMessageOwned, MsgFlags};

    /// One answer: status, body, and the first body byte as read and on arrival
    /// (both from just before the request's first byte was written).
    pub struct Seen {
        pub status: u16,
        pub body: Vec<u8>,
        pub read: Duration,
        pub arrived: Duration,
        pub total: Duration,
    }

    /// A connection to one `http://host:port/path` URL, opened on first use
    /// and kept while the server keeps it.
    pub struct Conn {
        addr: String,
        path: String,
        stream: Option<TcpStream>,
    }

    fn invalid(what: impl Into<String>) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
    }

    /// Takes `want` bytes (waiting for all of them) and the receive time of
    /// the last socket buffer they came from.
    fn recv_stamped(s: &TcpStream, want: usize) -> std::io::Result<(Vec<u8>, SystemTime)> {
        let mut buf = vec![0u8; want];
        let mut cmsg = nix::cmsg_space!(nix::sys::time::TimeSpec);
        let (n, stamp) = {
            let mut iov = [IoSliceMut::new(&mut buf)];
            let msg = recvmsg::<()>(
                s.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg[..]),
                MsgFlags::MSG_WAITALL,
            )?;
            let mut stamp = None;
            for c in msg.cmsgs()? {
                if let ControlMessageOwned::ScmTimestampns(t) = c {
                    let (secs, nanos) = (u64::try_from(t.tv_sec()), u32::try_from(t.tv_nsec()));
                    if let (Ok(secs), Ok(nanos)) = (secs, nanos) {
                        stamp = Some(UNIX_EPOCH + Duration::new(secs, nanos));
                    }
                }
            }
            (msg.bytes, stamp)
        };
        if n < want {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let stamp = stamp.ok_or_else(|| invalid("no SO_TIMESTAMPNS control message"))?;
        Ok((buf, stamp))
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// Reads a `chunked` body (RFC 9112 §7.1) to its last chunk into `out`.
    fn read_chunked(r: &mut impl BufRead, out: &mut Vec<u8>) -> std::io::Result<()> {
        let mut line = String::new();
        loop {
            line.clear();
            r.read_line(&mut line)?;
            let size = line.trim().split(';').next().unwrap_or_default();
            let size = usize::from_str_radix(size, 16)
                .map_err(|_| invalid(format!("chunk size line {line:?}")))?;
            if size == 0 {
                loop {
                    line.clear();
                    if r.read_line(&mut line)? == 0 || line == "\r\n" {
                        return Ok(());
                    }
                }
            }
            let start = out.len();
            out.resize(start + size, 0);
            r.read_exact(&mut out[start..])?;
            let mut crlf = [0u8; 2];
            r.read_exact(&mut crlf)?;
        }
    }

    impl Conn {
        pub fn new(url: &str) -> Self {
            let u = url::Url::parse(url).expect("ttfb url");
            Conn {
                addr: format!(
                    "{}:{}",
                    u.host_str().expect("ttfb url host"),
                    u.port_or_known_default().expect("ttfb url port")
                ),
                path: u.path().to_string(),
                stream: None,
            }
        }

        fn connect(&self) -> std::io::Result<TcpStream> {
            let s = TcpStream::connect(&self.addr)?;
            s.set_nodelay(true)?;
            setsockopt(&s, sockopt::ReceiveTimestampns, &true)?;
            Ok(s)
        }

        /// POSTs `body` as JSON (with a bearer `token`) and reads the answer to its end.
        pub fn post(&mut self, token: Option<&str>, body: &str) -> std::io::Result<Seen> {
            let s = match self.stream.take() {
                Some(s) => s,
                None => self.connect()?,
            };
            let auth = token.map_or(String::new(), |t| format!("authorization: Bearer {t}\r\n"));
            let request = format!(
                "POST {} HTTP/1.1\r\nhost: {}\r\ncontent-type: application/json\r\n{auth}content-length: {}\r\n\r\n{body}",
                self.path,
                self.addr,
                body.len()
            );
            let (t0, t0_wall) = (Instant::now(), SystemTime::now());
            (&s).write_all(request.as_bytes())?;

            // The head, then exactly one body byte: peek at what has come,
            // take everything before the head's end, then the head's end and
            // the first body byte in one stamped read.
            let mut head = Vec::new();
            let mut peeked = vec![0u8; 64 * 1024];
            let (read_at, arrived_at, end) = loop {
                let n = recv(s.as_raw_fd(), &mut peeked, MsgFlags::MSG_PEEK)?;
                if n == 0 {
                    return Err(std::io::ErrorKind::UnexpectedEof.into());
                }
                let seen = Instant::now();
                let mut all = head.clone();
                all.extend_from_slice(&peeked[..n]);
                match find(&all, b"\r\n\r\n") {
                    Some(i) if all.len() > i + 4 => {
                        let (bytes, stamp) = recv_stamped(&s, i + 5 - head.len())?;
                        head.extend_from_slice(&bytes);
                        break (seen, stamp, i + 4);
                    }
                    Some(i) if head_says_empty(&all[..i + 4]) => {
                        let (bytes, stamp) = recv_stamped(&s, i + 4 - head.len())?;
                        head.extend_from_slice(&bytes);
                        break (seen, stamp, i + 4);
                    }
                    _ => {
                        let (bytes, _) = recv_stamped(&s, n)?;
                        head.extend_from_slice(&bytes);
                    }
                }
            };
            let read = read_at - t0;
            let arrived = arrived_at.duration_since(t0_wall).unwrap_or_default();

            let text = String::from_utf8_lossy(&head[..end]).to_ascii_lowercase();
            let status = text
                .split(' ')
                .nth(1)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| invalid("status line"))?;
            let header = |name: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
            };
            let mut body = Vec::new();
            let mut rest = (&head[end..]).chain(BufReader::new(&s));
            if header("transfer-encoding:").is_some_and(|v| v.contains("chunked")) {
                read_chunked(&mut rest, &mut body)?;
            } else {
                let len = header("content-length:")
                    .and_then(|v| v.parse().ok())
                    .ok_or_else(|| invalid("neither chunked nor content-length"))?;
                body.resize(len, 0);
                rest.read_exact(&mut body)?;
            }
            let total = t0.elapsed();
            if header("connection:").is_none_or(|v| !v.contains("close")) {
                self.stream = Some(s);
            }
            Ok(Seen {
                status,
                body,
                read,
                arrived,
                total,
            })
        }
    }

    /// A complete head announcing an empty body (`content-length: 0`).
    fn head_says_empty(head: &[u8]) -> bool {
        String::from_utf8_lossy(head)
            .to_ascii_lowercase()
            .lines()
            .any(|l| {
                l.strip_prefix("content-length:")
                    .is_some_and(|v| v.trim() == "0")
            })
    }
}
