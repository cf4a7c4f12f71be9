//! Bad input of every kind gets a 4xx problem-details answer naming the field
//! at fault, never a 5xx; valid edge cases (unicode, exact length limits) pass.

use std::time::Duration;

use serde_json::{json, Value};
use tests::{random_ip, Proc, Reply, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Clone, Copy, Debug)]
enum Expect {
    /// This status and, when given, this `field`.
    Status(u16, Option<&'static str>),
    /// Any 4xx problem.
    Client,
    /// Success.
    Ok,
}

struct Case {
    label: String,
    content_type: Option<&'static str>,
    body: Option<Vec<u8>>,
    expect: Expect,
}

fn case(label: impl Into<String>, body: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        label: label.into(),
        content_type: Some("application/json"),
        body: Some(body.into()),
        expect,
    }
}

fn json_case(label: impl Into<String>, v: Value, expect: Expect) -> Case {
    case(label, v.to_string(), expect)
}

async fn run_cases(api: &Proc, path: &str, cases: Vec<Case>) {
    let mut failures = Vec::new();
    for c in &cases {
        let mut req = tests::client()
            .post(api.url(path))
            .header("x-forwarded-for", random_ip());
        if let Some(ct) = c.content_type {
            req = req.header("content-type", ct);
        }
        if let Some(b) = &c.body {
            req = req.body(b.clone());
        }
        let r = match Reply::try_send(req).await {
            Ok(r) => r,
            Err(e) => {
                failures.push(format!("[{}] transport error: {e}", c.label));
                continue;
            }
        };
        let res = match c.expect {
            Expect::Ok => {
                if r.status == 200 {
                    Ok(())
                } else {
                    Err(format!("expected 200; got {} {}", r.status, r.text))
                }
            }
            Expect::Client => r.check_problem(None, None, None),
            Expect::Status(s, field) => r.check_problem(Some(s), None, field),
        };
        if let Err(e) = res {
            failures.push(format!("[{}] {e}", c.label));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases on {path} failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}

fn valid_contact() -> Value {
    json!({"name": "Ann", "email": "ann@example.com", "message": "hello"})
}

fn with(mut v: Value, k: &str, x: Value) -> Value {
    v[k] = x;
    v
}

fn without(mut v: Value, k: &str) -> Value {
    v.as_object_mut().unwrap().remove(k);
    v
}

/// A syntactically valid address of exactly `len` characters (len ≥ 70).
fn email_of_len(len: usize) -> String {
    let local = "a".repeat(64);
    let rest = len - 65; // domain length
    let last = rest - 128; // "b"*63 + "." + "c"*63 + "." + tld
    format!(
        "{local}@{}.{}.{}",
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(last)
    )
}

fn common_body_cases() -> Vec<Case> {
    let nested = format!("{{\"name\": {}1{}}}", "[".repeat(5000), "]".repeat(5000));
    let huge = json!({"name": "x", "email": "x@example.com", "message": "y".repeat(70 * 1024)});
    vec![
        Case { label: "no body, no content type".into(), content_type: None, body: None, expect: Expect::Client },
        Case { label: "no body, JSON content type".into(), content_type: Some("application/json"), body: None, expect: Expect::Client },
        case("empty body", "", Expect::Client),
        case("whitespace body", "   \n", Expect::Client),
        case("broken JSON", r#"{"name": "x","#, Expect::Status(400, None)),
        case("trailing garbage", r#"{"email": "x@example.com"} xyz"#, Expect::Status(400, None)),
        case("single quotes", "{'email': 'x@example.com'}", Expect::Status(400, None)),
        json_case("JSON array", json!([valid_contact()]), Expect::Status(400, None)),
        json_case("JSON string", json!("hello"), Expect::Status(400, None)),
        json_case("JSON number", json!(42), Expect::Status(400, None)),
        case("JSON null", "null", Expect::Status(400, None)),
        case("deeply nested JSON", nested, Expect::Client),
        case("invalid UTF-8", b"{\"name\": \"\xff\xfe\xfd\", \"email\": \"x@example.com\", \"message\": \"\xc3\x28\"}".to_vec(), Expect::Status(400, None)),
        Case { label: "text/plain content type".into(), content_type: Some("text/plain"), body: Some(valid_contact().to_string().into()), expect: Expect::Client },
        Case { label: "no content type".into(), content_type: None, body: Some(valid_contact().to_string().into()), expect: Expect::Client },
        Case {
            label: "form-encoded".into(),
            content_type: Some("application/x-www-form-urlencoded"),
            body: Some(b"name=Ann&email=ann%40example.com&message=hi".to_vec()),
            expect: Expect::Client,
        },
        Case { label: "XML".into(), content_type: Some("application/xml"), body: Some(b"<contact><name>Ann</name></contact>".to_vec()), expect: Expect::Client },
        json_case("70 KB body", huge, Expect::Status(413, None)),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn contact_bad_input_is_4xx_problem_naming_the_field() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("SMTP_URL", "smtp://127.0.0.1:9"))
        .await;
    let v = valid_contact;
    let mut cases = common_body_cases();
    for f in ["name", "message"] {
        let mut body = v();
        body[f] = json!("x\u{0}y");
        cases.push(json_case(
            format!("{f} with NUL"),
            body,
            Expect::Status(400, Some(if f == "name" { "name" } else { "message" })),
        ));
    }
    for f in ["name", "email", "message"] {
        let field = Some(match f {
            "name" => "name",
            "email" => "email",
            _ => "message",
        });
        cases.push(json_case(
            format!("{f} missing"),
            without(v(), f),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} null"),
            with(v(), f, Value::Null),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} number"),
            with(v(), f, json!(5)),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} bool"),
            with(v(), f, json!(true)),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} array"),
            with(v(), f, json!(["x"])),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} object"),
            with(v(), f, json!({"x": 1})),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} empty"),
            with(v(), f, json!("")),
            Expect::Status(400, field),
        ));
        cases.push(json_case(
            format!("{f} blank"),
            with(v(), f, json!("   ")),
            Expect::Status(400, field),
        ));
    }
    cases.extend([
        // Not representable: a JSON parse error rather than a field error.
        case("name huge number", r#"{"name": 1e400, "email": "a@example.com", "message": "m"}"#, Expect::Status(400, None)),
        json_case("name 101 chars", with(v(), "name", json!("n".repeat(101))), Expect::Status(400, Some("name"))),
        json_case("name 10,000 chars", with(v(), "name", json!("n".repeat(10_000))), Expect::Status(400, Some("name"))),
        json_case("message 5,001 chars", with(v(), "message", json!("m".repeat(5_001))), Expect::Status(400, Some("message"))),
        json_case("email 255 chars", with(v(), "email", json!(email_of_len(255))), Expect::Status(400, Some("email"))),
        json_case("email invalid", with(v(), "email", json!("not-an-email")), Expect::Status(400, Some("email"))),
        json_case("email two @", with(v(), "email", json!("a@@example.com")), Expect::Status(400, Some("email"))),
        json_case("email with CRLF", with(v(), "email", json!("a@example.com\r\nBcc: b@example.com")), Expect::Status(400, Some("email"))),
        json_case("unknown field", with(v(), "phone", json!("123")), Expect::Status(400, None)),
        json_case("unknown field only", json!({"foo": "bar"}), Expect::Status(400, None)),
        // Valid edge cases.
        json_case("unicode and emoji", json!({"name": "Zoë 李 🚀", "email": "zoe@example.com", "message": "こんにちは 👋 — ça va? \u{1F600}"}), Expect::Ok),
        json_case("name exactly 100 chars", with(v(), "name", json!("n".repeat(100))), Expect::Ok),
        json_case("name 100 emoji (chars, not bytes)", with(v(), "name", json!("😀".repeat(100))), Expect::Ok),
        json_case("message exactly 5,000 chars", with(v(), "message", json!("m".repeat(5_000))), Expect::Ok),
        json_case("email exactly 254 chars", with(v(), "email", json!(email_of_len(254))), Expect::Ok),
        Case {
            label: "JSON with charset".into(),
            content_type: Some("application/json; charset=utf-8"),
            body: Some(v().to_string().into()),
            expect: Expect::Ok,
        },
    ]);
    run_cases(&api, "/api/contact", cases).await;
    // The invalid email is reported as such.
    let r = Reply::send(
        tests::client()
            .post(api.url("/api/contact"))
            .header("x-forwarded-for", random_ip())
            .json(&with(v(), "email", json!("nope"))),
    )
    .await;
    r.assert_problem(400, Some("invalid_email"), Some("email"));
}

#[tokio::test(flavor = "multi_thread")]
async fn waitlist_bad_input_is_4xx_problem_naming_the_field() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let mut cases = common_body_cases();
    cases.extend([
        // PostgreSQL text cannot hold NUL: a 400 naming the field, not a 500
        // (found by the contract fuzzer).
        json_case(
            "name with NUL",
            json!({"email": "nul@example.com", "name": "a\u{0}b"}),
            Expect::Status(400, Some("name")),
        ),
        json_case(
            "email number",
            json!({"email": 5}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "email missing",
            json!({"name": "x"}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "empty object",
            json!({}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "email null",
            json!({"email": null}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "email array",
            json!({"email": ["a@example.com"]}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "email 255 chars",
            json!({"email": email_of_len(255)}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "email 10,000 chars",
            json!({"email": format!("{}@example.com", "a".repeat(10_000))}),
            Expect::Status(400, Some("email")),
        ),
        json_case(
            "name number",
            json!({"email": "n1@example.com", "name": 5}),
            Expect::Status(400, Some("name")),
        ),
        json_case(
            "name 10,000 chars",
            json!({"email": "n2@example.com", "name": "n".repeat(10_000)}),
            Expect::Status(400, Some("name")),
        ),
        json_case(
            "unknown field",
            json!({"email": "u@example.com", "referrer": "x"}),
            Expect::Status(400, None),
        ),
        json_case(
            "unicode name",
            json!({"email": "uni@example.com", "name": "Zoë 李 🚀"}),
            Expect::Ok,
        ),
        json_case(
            "email exactly 254 chars",
            json!({"email": email_of_len(254)}),
            Expect::Ok,
        ),
    ]);
    run_cases(&api, "/api/waitlist", cases).await;

    // Unicode stored intact.
    let pool = stack.db.pool().await;
    let name: Option<String> =
        sea_orm::sqlx::query_scalar("SELECT name FROM waitlist WHERE email = 'uni@example.com'")
            .fetch_one(&pool)
            .await
            .expect("unicode row");
    assert_eq!(name.as_deref(), Some("Zoë 李 🚀"));
}

/// A chunked body (no Content-Length) above the limit is refused too.
#[tokio::test(flavor = "multi_thread")]
async fn chunked_body_over_the_limit_is_413() {
    let stack = Stack::new().await;
    let api = stack
        .api(&stack.env().with("SMTP_URL", "smtp://127.0.0.1:9"))
        .await;
    let addr = api.base_url.trim_start_matches("http://").to_string();
    let mut s = tokio::net::TcpStream::connect(&addr)
        .await
        .expect("connect");
    let head = format!(
        "POST /api/contact HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut body = br#"{"name":"x","email":"x@example.com","message":""#.to_vec();
    body.extend(std::iter::repeat_n(b'y', 80 * 1024));
    body.extend(br#""}"#);
    for chunk in body.chunks(8 * 1024) {
        let _ = s
            .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
            .await;
        let _ = s.write_all(chunk).await;
        let _ = s.write_all(b"\r\n").await;
    }
    let _ = s.write_all(b"0\r\n\r\n").await;
    let mut resp = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp)).await;
    let text = String::from_utf8_lossy(&resp);
    let status_line = text.lines().next().unwrap_or("");
    assert!(status_line.contains(" 413"), "expected 413; got:\n{text}");
    assert!(
        text.to_ascii_lowercase()
            .contains("application/problem+json"),
        "{text}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn wrong_methods_and_unknown_routes_are_problems() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let c = tests::client();
    let mut failures = Vec::new();
    for (label, req, status) in [
        ("GET /api/contact", c.get(api.url("/api/contact")), 405),
        (
            "PUT /api/waitlist",
            c.put(api.url("/api/waitlist"))
                .json(&json!({"email": "x@example.com"})),
            405,
        ),
        (
            "DELETE /api/waitlist",
            c.delete(api.url("/api/waitlist")),
            405,
        ),
        ("POST /api/health", c.post(api.url("/api/health")), 405),
        ("GET /api/nope", c.get(api.url("/api/nope")), 404),
        (
            "POST /api/nope",
            c.post(api.url("/api/nope")).json(&json!({})),
            404,
        ),
    ] {
        let r = Reply::send(req).await;
        if let Err(e) = r.check_problem(Some(status), None, None) {
            failures.push(format!("[{label}] {e}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A 405 names the allowed methods in `Allow` (RFC 9110 §15.5.6), as the
/// OpenAPI document lists them, and is a problem.
#[tokio::test(flavor = "multi_thread")]
async fn method_not_allowed_carries_allow() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let c = tests::client();
    let mut failures = Vec::new();
    let user = uuid::Uuid::new_v4();
    for (label, req, allow) in [
        ("GET /api/contact", c.get(api.url("/api/contact")), "POST"),
        (
            "DELETE /api/waitlist",
            c.delete(api.url("/api/waitlist")),
            "POST",
        ),
        (
            "POST /api/health",
            c.post(api.url("/api/health")),
            "GET, HEAD",
        ),
        (
            "PATCH /api/profile",
            c.patch(api.url("/api/profile")),
            "POST",
        ),
        (
            "POST public avatar",
            c.post(api.url(&format!("/storage/v1/object/public/avatars/{user}/avatar"))),
            "GET, HEAD",
        ),
    ] {
        let r = Reply::send(req).await;
        if let Err(e) = r.check_problem(Some(405), Some("method_not_allowed"), None) {
            failures.push(format!("[{label}] {e}"));
        }
        if r.header("allow") != Some(allow) {
            failures.push(format!(
                "[{label}] Allow: {:?}, expected {allow:?}",
                r.header("allow")
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A JSON route answers a body without `Content-Type`, or of another type,
/// with 415 problem details (documented in the OpenAPI document).
#[tokio::test(flavor = "multi_thread")]
async fn missing_or_wrong_content_type_is_415() {
    let stack = Stack::new().await;
    let api = stack.api(&stack.env()).await;
    let body = json!({"email": "ct@example.com"}).to_string();
    for ct in [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
    ] {
        let mut req = tests::client()
            .post(api.url("/api/waitlist"))
            .header("x-forwarded-for", random_ip())
            .body(body.clone());
        if let Some(ct) = ct {
            req = req.header("content-type", ct);
        }
        let r = Reply::send(req).await;
        if let Err(e) = r.check_problem(Some(415), None, None) {
            panic!("content type {ct:?}: {e}");
        }
    }
}
