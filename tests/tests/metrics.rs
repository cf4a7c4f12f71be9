//! Prometheus metrics against the real binaries: after known traffic the
//! api's counters and queue gauges and the worker's job and upstream
//! counters read what happened, as Prometheus' own text-format parser
//! (`prometheus_client.parser` from PyPI, run by `$PROMETHEUS_PYTHON`, which
//! `.ci/test.sh` installs) reads them; `/metrics` wants its bearer token and
//! does not exist while `METRICS_TOKEN` is unset; the worker's probes answer.

use std::{io::Write as _, process::Stdio, time::Duration};

use serde_json::{json, Value};
use tests::{post_json, random_ip, Reply, Stack, CONTACT_EMAIL};
use wiremock::{
    matchers::{method, path},
    Mock, MockServer, ResponseTemplate,
};

const TOKEN: &str = "metrics-token-for-the-tests-0123456789abcdef";

async fn scrape(url: &str, token: Option<&str>) -> Reply {
    let mut req = tests::client().get(url);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    Reply::send(req).await
}

/// Parses the text format with `prometheus_client.parser` into samples
/// `{"name", "labels", "value"}` (a counter's sample is `<name>_total`).
const PARSE: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = []
for family in text_string_to_metric_families(sys.stdin.read()):
    for s in family.samples:
        out.append({"name": s.name, "labels": s.labels, "value": s.value})
print(json.dumps(out))
"#;

/// Samples of one scrape, as Prometheus' parser read them.
struct Scrape {
    samples: Vec<Value>,
}

fn parse(text: &str) -> Scrape {
    let python = std::env::var("PROMETHEUS_PYTHON").unwrap_or_else(|_| "python3".into());
    let mut child = std::process::Command::new(&python)
        .args(["-c", PARSE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write the exposition");
    let out = child.wait_with_output().expect("parser");
    assert!(
        out.status.success(),
        "prometheus_client could not parse the exposition (PROMETHEUS_PYTHON={python}; \
         .ci/test.sh installs it):\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<Value> = serde_json::from_slice(&out.stdout).expect("parser output");
    Scrape { samples }
}

/// The parsed exposition at `url` (asserting a 200 in the text format).
async fn metrics(url: &str) -> Scrape {
    let r = scrape(url, Some(TOKEN)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(
        r.header("content-type")
            .unwrap_or("")
            .starts_with("text/plain"),
        "{:?}",
        r.headers
    );
    parse(&r.text)
}

/// The value of the sample `name` whose labels include `labels` (`None`
/// when there is none).
fn value(s: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    s.samples
        .iter()
        .filter(|x| x["name"] == name)
        .filter(|x| labels.iter().all(|(k, v)| x["labels"][*k] == *v))
        .find_map(|x| x["value"].as_f64())
}

/// The samples named `name`, for failure messages.
fn named(s: &Scrape, name: &str) -> Vec<String> {
    s.samples
        .iter()
        .filter(|x| x["name"] == name)
        .map(Value::to_string)
        .collect()
}

async fn fake_email_api() -> MockServer {
    let server = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/emails"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({"id": "email_ok"})))
        .mount(&server)
        .await;
    server
}

#[tokio::test(flavor = "multi_thread")]
async fn counters_and_queue_depth_read_the_traffic_sent() {
    let stack = Stack::new().await;
    let email = fake_email_api().await;
    let env = stack
        .env()
        .with("METRICS_TOKEN", TOKEN)
        .with("RATE_LIMIT_PUBLIC_PER_HOUR", "3")
        .with("EMAIL_PROVIDER_API_KEY", "re_metrics")
        .with("EMAIL_PROVIDER_BASE_URL", email.uri())
        .with("CONTACT_EMAIL", CONTACT_EMAIL);
    let api = stack.api(&env).await;
    let url = api.url("/metrics");

    // The token is required.
    scrape(&url, None)
        .await
        .assert_problem(401, Some("missing_token"), None);
    scrape(&url, Some("wrong-token"))
        .await
        .assert_problem(401, Some("invalid_token"), None);

    // Known traffic, no worker running: 3 contacts and a 4th refused by the
    // limit (3 per hour per IP), an unknown path, a templated route.
    let ip = random_ip();
    for i in 0..4 {
        let body = json!({"name": "Metric Max", "email": "max@example.org", "message": format!("hello {i}")});
        let r = post_json(&api.url("/api/contact"), &ip, &body).await;
        assert_eq!(r.status, if i < 3 { 200 } else { 429 }, "{}", r.text);
    }
    assert_eq!(tests::get(&api.url("/no/such/route")).await.status, 404);
    let avatar = format!(
        "/storage/v1/object/public/avatars/{}/avatar",
        uuid::Uuid::new_v4()
    );
    assert_eq!(tests::get(&api.url(&avatar)).await.status, 404);

    let s = metrics(&url).await;
    let contact = |status| {
        value(
            &s,
            "http_requests_total",
            &[
                ("route", "/api/contact"),
                ("method", "POST"),
                ("status", status),
            ],
        )
    };
    assert_eq!(contact("200"), Some(3.0));
    assert_eq!(contact("429"), Some(1.0));
    assert_eq!(
        value(
            &s,
            "http_request_duration_seconds_count",
            &[
                ("route", "/api/contact"),
                ("method", "POST"),
                ("status", "200")
            ]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(&s, "rate_limit_refusals_total", &[("limit", "contact")]),
        Some(1.0)
    );
    assert_eq!(
        value(
            &s,
            "http_requests_total",
            &[("route", "unmatched"), ("status", "404")]
        ),
        Some(1.0),
        "an unknown path counts under one fixed label"
    );
    assert!(
        s.samples
            .iter()
            .all(|x| x["labels"]["route"] != "/no/such/route"),
        "the raw path is never a label"
    );
    assert_eq!(
        value(
            &s,
            "http_requests_total",
            &[
                (
                    "route",
                    "/storage/v1/object/public/avatars/{user_id}/avatar"
                ),
                ("status", "404")
            ]
        ),
        Some(1.0),
        "{:?}",
        named(&s, "http_requests_total")
    );
    assert_eq!(value(&s, "queue_waiting", &[("queue", "email")]), Some(3.0));
    assert_eq!(value(&s, "queue_dead", &[("queue", "email")]), Some(0.0));
    assert_eq!(
        value(&s, "queue_in_flight", &[("queue", "email")]),
        Some(0.0)
    );
    let age = value(
        &s,
        "queue_oldest_waiting_age_seconds",
        &[("queue", "email")],
    )
    .expect("oldest age");
    assert!((0.0..60.0).contains(&age), "{age}");
    assert!(value(&s, "db_pool_connections", &[("state", "in_use")]).is_some());
    assert!(value(&s, "db_pool_max_connections", &[]).is_some());

    // A worker with its own port drains the queue.
    let wenv = env.clone().with("WORKER_HTTP_PORT", "0");
    let worker = stack.worker(&wenv).await;
    let base = tests::worker_http(&worker).await;
    assert_eq!(tests::get(&format!("{base}/healthz")).await.status, 200);
    let ready = tests::get(&format!("{base}/readyz")).await;
    assert_eq!(ready.status, 200, "{}", ready.text);
    assert_eq!(ready.json, json!({"database": "ok", "queue": "ok"}));
    assert_eq!(
        scrape(&format!("{base}/metrics"), None).await.status,
        401,
        "the worker's metrics want the token too"
    );
    let drained = tests::wait_until(Duration::from_secs(30), || async {
        email.received_requests().await.map_or(0, |r| r.len()) >= 3
    })
    .await;
    assert!(drained, "worker stderr:\n{}", worker.stderr());
    let ok = tests::wait_until(Duration::from_secs(10), || async {
        let w = metrics(&format!("{base}/metrics")).await;
        value(
            &w,
            "jobs_total",
            &[("job", "send_email"), ("outcome", "done")],
        ) == Some(3.0)
    })
    .await;
    let w = metrics(&format!("{base}/metrics")).await;
    assert!(ok, "jobs_total: {:?}", named(&w, "jobs_total"));
    assert_eq!(
        value(
            &w,
            "upstream_requests_total",
            &[("upstream", "email"), ("outcome", "ok")]
        ),
        Some(3.0)
    );
    assert_eq!(
        value(
            &w,
            "job_duration_seconds_count",
            &[("job", "send_email"), ("outcome", "done")]
        ),
        Some(3.0)
    );
    assert!(value(&w, "jobs_total", &[("outcome", "dead_lettered")]).is_none());

    // The queue-depth gauge follows (read again once its short cache expires).
    let empty = tests::wait_until(Duration::from_secs(10), || async {
        value(&metrics(&url).await, "queue_waiting", &[("queue", "email")]) == Some(0.0)
    })
    .await;
    assert!(empty, "queue_waiting never went back to 0");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_token_there_is_no_metrics_route() {
    let stack = Stack::new().await;
    let env = stack.env().with("WORKER_HTTP_PORT", "0");
    let api = stack.api(&env).await;
    let r = scrape(&api.url("/metrics"), Some(TOKEN)).await;
    r.assert_problem(404, Some("not_found"), None);
    let worker = stack.worker(&env).await;
    let base = tests::worker_http(&worker).await;
    assert_eq!(
        scrape(&format!("{base}/metrics"), Some(TOKEN)).await.status,
        404
    );
    assert_eq!(tests::get(&format!("{base}/healthz")).await.status, 200);
}
