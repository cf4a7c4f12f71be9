//! HTTP answers: a fully read answer with problem-details assertions ([`Reply`]).

use super::*;

/// A fully read HTTP answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body as text (lossy).
    pub text: String,
    /// Body as JSON, when it is JSON.
    pub json: Value,
    /// Time from sending to the full body.
    pub elapsed: Duration,
}

impl Reply {
    /// Sends `req` and reads the whole answer.
    pub async fn send(req: reqwest::RequestBuilder) -> Reply {
        let t = Instant::now();
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("request failed: {e}"));
        Self::read(resp, t)
            .await
            .unwrap_or_else(|e| panic!("reading the answer's body failed: {e}"))
    }

    /// Like [`Reply::send`] but a transport error (timeout, reset, also while
    /// reading the body) is returned.
    pub async fn try_send(req: reqwest::RequestBuilder) -> Result<Reply, reqwest::Error> {
        let t = Instant::now();
        let resp = req.send().await?;
        Self::read(resp, t).await
    }

    /// Reads the whole answer; a failed body read is an error, never an
    /// empty body (so "nothing answered" cannot pass vacuously).
    async fn read(resp: reqwest::Response, t: Instant) -> Result<Reply, reqwest::Error> {
        let status = resp.status();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await?;
        let text = String::from_utf8_lossy(&bytes).to_string();
        let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Ok(Reply {
            status,
            headers,
            text,
            json,
            elapsed: t.elapsed(),
        })
    }

    /// A header as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header parsed as an integer (panics with context when absent).
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self
            .header(name)
            .unwrap_or_else(|| panic!("header {name} missing; headers: {:?}", self.headers));
        v.parse()
            .unwrap_or_else(|_| panic!("header {name} = {v:?} is not an integer"))
    }

    /// Checks the answer is a problem-details body with `status`, `code`
    /// (when given) and `field` (when given); returns the body. Every problem
    /// carries `type`, `title`, `status`, `detail`, `code`, `error` (= detail)
    /// and the response an `x-request-id`.
    pub fn assert_problem(&self, status: u16, code: Option<&str>, field: Option<&str>) -> &Value {
        if let Err(e) = self.check_problem(Some(status), code, field) {
            panic!("{e}");
        }
        &self.json
    }

    /// Non-panicking form of [`Reply::assert_problem`]; `status: None`
    /// accepts any 4xx.
    pub fn check_problem(
        &self,
        status: Option<u16>,
        code: Option<&str>,
        field: Option<&str>,
    ) -> Result<(), String> {
        let ctx = || format!("status {}, body {}", self.status, self.text);
        match status {
            Some(s) if self.status.as_u16() != s => {
                return Err(format!("expected status {s}; got {}", ctx()))
            }
            None if !self.status.is_client_error() => {
                return Err(format!("expected a 4xx; got {}", ctx()))
            }
            _ => {}
        }
        let ct = self.header("content-type").unwrap_or("");
        if !ct.starts_with("application/problem+json") {
            return Err(format!(
                "content-type {ct:?} is not application/problem+json; {}",
                ctx()
            ));
        }
        if self.header("x-request-id").is_none_or(str::is_empty) {
            return Err(format!("no x-request-id; {}", ctx()));
        }
        let b = &self.json;
        for k in ["type", "title", "detail", "code", "error"] {
            if !b[k].is_string() {
                return Err(format!(
                    "problem member {k:?} missing or not a string; {}",
                    ctx()
                ));
            }
        }
        if b["status"].as_u64() != Some(u64::from(self.status.as_u16())) {
            return Err(format!(
                "problem `status` differs from the HTTP status; {}",
                ctx()
            ));
        }
        if b["error"] != b["detail"] {
            return Err(format!("problem `error` differs from `detail`; {}", ctx()));
        }
        if let Some(c) = code {
            if b["code"] != c {
                return Err(format!("expected code {c:?}; {}", ctx()));
            }
        }
        if let Some(f) = field {
            if b["field"] != f {
                return Err(format!("expected field {f:?}; {}", ctx()));
            }
        }
        Ok(())
    }
}

/// `POST url` with a JSON body, as client IP `ip` (`X-Forwarded-For`).
pub async fn post_json(url: &str, ip: &str, body: &Value) -> Reply {
    Reply::send(client().post(url).header("x-forwarded-for", ip).json(body)).await
}

/// `GET url`.
pub async fn get(url: &str) -> Reply {
    Reply::send(client().get(url)).await
}

/// A random client IP in 10.0.0.0/8 for `X-Forwarded-For`.
pub fn random_ip() -> String {
    let b = uuid::Uuid::new_v4().into_bytes();
    format!("10.{}.{}.{}", b[0], b[1], b[2].max(1))
}
