//! Email transports: the HTTP email API (`EMAIL_PROVIDER_API_KEY`), SMTP
//! (`SMTP_URL`), or, in the embedded default with nothing configured, an outbox
//! directory (`$DATA_DIR/outbox`, one RFC 5322 `.eml` file per message).
//!
//! Sender and recipients are RFC 5322 mailboxes (`addr@x` or `Name <addr@x>`),
//! used as-is.
//!
//! HTTP API: `POST {EMAIL_PROVIDER_BASE_URL}/emails` with `Authorization: Bearer <key>`,
//! JSON `{from, to, subject, text, html?, reply_to?}` and an `Idempotency-Key`
//! header equal to the job id, so a retried job never sends twice.
//! SMTP: lettre's pooled async transport; `smtp://` is plain (local relays and
//! sinks), `smtp://…?tls=required` upgrades with STARTTLS, `smtps://` is implicit TLS.
//! Outbox: `<DATA_DIR>/outbox/<idempotency key>.eml`, written to a temporary
//! file and renamed, so a retry overwrites instead of duplicating.

pub mod billing;

use std::{path::PathBuf, time::Duration};

use entity::{base::mail::OutgoingEmail, base::settings::EmailTransport, Settings};
use lettre::{
    message::{header::ContentType, Mailbox, MultiPart, SinglePart},
    AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor,
};
use serde::Serialize;

/// Why a send failed, split by whether trying again can help.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// Network error, timeout, 5xx or 429 from the API, 4xx SMTP reply.
    #[error("{0}")]
    Transient(String),
    /// The request itself is refused (4xx from the API, 5xx SMTP reply, bad address).
    #[error("{0}")]
    Permanent(String),
}

/// A configured transport.
pub enum Mailer {
    /// The HTTP email API.
    Http {
        /// Shared client with timeouts.
        client: reqwest::Client,
        /// `POST {base_url}/emails`.
        base_url: String,
        /// Bearer key.
        api_key: String,
    },
    /// SMTP through lettre.
    Smtp(AsyncSmtpTransport<Tokio1Executor>),
    /// `.eml` files in this directory (`$DATA_DIR/outbox`).
    Outbox(PathBuf),
}

/// How a failed attempt is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// Retried with backoff.
    Transient,
    /// Dead-lettered at once.
    Permanent,
}

/// Classifies a non-2xx answer of the email API: 408 (timeout), 409
/// (conflict: a request with the same idempotency key in progress), 425, 429
/// (rate limited) and every 5xx are transient; every other 4xx is permanent
/// (the request itself is refused); anything else (1xx, 3xx) is transient.
pub fn classify_http_status(status: u16) -> Failure {
    match status {
        408 | 409 | 425 | 429 => Failure::Transient,
        400..=499 => Failure::Permanent,
        _ => Failure::Transient,
    }
}

/// Classifies an SMTP reply code (RFC 5321 §4.2.1): 4yz (transient negative
/// completion) is retried, 5yz (permanent negative completion) is not. Any
/// other code reaching here is unexpected and retried.
pub fn classify_smtp_code(code: u16) -> Failure {
    match code {
        500..=599 => Failure::Permanent,
        _ => Failure::Transient,
    }
}

/// Checks that `EMAIL_FROM` and `CONTACT_EMAIL` parse as lettre mailboxes;
/// the error names the variable.
pub fn check_addresses(s: &Settings) -> anyhow::Result<()> {
    for (var, value) in [
        ("EMAIL_FROM", s.email_from.as_deref()),
        ("CONTACT_EMAIL", s.contact_email.as_deref()),
    ] {
        if let Some(v) = value {
            v.parse::<Mailbox>()
                .map_err(|e| anyhow::anyhow!("{var}: not an RFC 5322 mailbox ({v:?}): {e}"))?;
        }
    }
    Ok(())
}

#[derive(Serialize)]
struct ApiEmail<'a> {
    from: &'a str,
    to: &'a [String],
    subject: &'a str,
    text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    html: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reply_to: Option<&'a str>,
}

impl Mailer {
    /// The transport the settings select ([`Settings::email_transport`]): the
    /// HTTP API when its key and base URL are set, else SMTP when `SMTP_URL` is
    /// set, else the outbox in the embedded default, else `None`. Fails when
    /// `EMAIL_FROM`/`CONTACT_EMAIL` are not mailboxes (naming the variable).
    pub fn from_settings(s: &Settings) -> anyhow::Result<Option<Self>> {
        check_addresses(s)?;
        if s.email_transport() == EmailTransport::Outbox {
            let dir = s.outbox_dir();
            tracing::info!(outbox = %dir.display(), "no email transport configured: mail is written to the outbox directory");
            return Ok(Some(Mailer::Outbox(dir)));
        }
        if let (Some(key), Some(base)) = (&s.email_provider_api_key, &s.email_provider_base_url) {
            let client = reqwest::Client::builder()
                .timeout(s.email_timeout)
                .connect_timeout(Duration::from_secs(5))
                .pool_max_idle_per_host(64)
                .build()?;
            return Ok(Some(Mailer::Http {
                client,
                base_url: base.clone(),
                api_key: key.clone(),
            }));
        }
        if let Some(url) = &s.smtp_url {
            let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url)
                .map_err(|e| anyhow::anyhow!("SMTP_URL: {e}"))?
                .timeout(Some(s.email_timeout))
                .build();
            return Ok(Some(Mailer::Smtp(transport)));
        }
        Ok(None)
    }

    /// Sends `email`; `idempotency_key` is the job id.
    pub async fn send(
        &self,
        email: &OutgoingEmail,
        idempotency_key: &str,
    ) -> Result<(), SendError> {
        let upstream = crate::metrics::Upstream::start("email");
        upstream.observe(self.deliver(email, idempotency_key).await)
    }

    async fn deliver(&self, email: &OutgoingEmail, idempotency_key: &str) -> Result<(), SendError> {
        match self {
            Mailer::Http {
                client,
                base_url,
                api_key,
            } => {
                let body = ApiEmail {
                    from: &email.from,
                    to: &email.to,
                    subject: &email.subject,
                    text: &email.text,
                    html: email.html.as_deref(),
                    reply_to: email.reply_to.as_deref(),
                };
                let res = client
                    .post(format!("{base_url}/emails"))
                    .bearer_auth(api_key)
                    .header("Idempotency-Key", idempotency_key)
                    .json(&body)
                    .send()
                    .await
                    .map_err(|e| SendError::Transient(format!("email API unreachable: {e}")))?;
                let status = res.status();
                if status.is_success() {
                    return Ok(());
                }
                let detail: String = res
                    .text()
                    .await
                    .unwrap_or_default()
                    .chars()
                    .take(500)
                    .collect();
                let msg = format!("email API answered {status}: {detail}");
                match classify_http_status(status.as_u16()) {
                    Failure::Permanent => Err(SendError::Permanent(msg)),
                    Failure::Transient => Err(SendError::Transient(msg)),
                }
            }
            Mailer::Smtp(transport) => {
                let message = build_message(email)?;
                match transport.send(message).await {
                    Ok(_) => Ok(()),
                    Err(e) => {
                        let class = match e.status() {
                            Some(code) => classify_smtp_code(u16::from(code)),
                            // Invalid input detected by lettre itself.
                            None if e.is_client() => Failure::Permanent,
                            // Connection, TLS, timeout: the server may come back.
                            None => Failure::Transient,
                        };
                        match class {
                            Failure::Permanent => {
                                Err(SendError::Permanent(format!("SMTP rejected: {e}")))
                            }
                            Failure::Transient => {
                                Err(SendError::Transient(format!("SMTP failed: {e}")))
                            }
                        }
                    }
                }
            }
            Mailer::Outbox(dir) => {
                let message = build_message(email)?;
                let path = write_outbox(dir, idempotency_key, &message.formatted())
                    .await
                    .map_err(|e| {
                        SendError::Transient(format!("cannot write to {}: {e}", dir.display()))
                    })?;
                tracing::info!(path = %path.display(), "email written to the outbox");
                Ok(())
            }
        }
    }

    /// `api`, `smtp` or `outbox`.
    pub fn kind(&self) -> &'static str {
        match self {
            Mailer::Http { .. } => "api",
            Mailer::Smtp(_) => "smtp",
            Mailer::Outbox(_) => "outbox",
        }
    }
}

/// The outbox file name of the message with this idempotency key: the key
/// with every character outside `[A-Za-z0-9_-]` replaced by `_`, plus `.eml`.
pub fn outbox_file_name(idempotency_key: &str) -> String {
    let safe: String = idempotency_key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}.eml")
}

async fn write_outbox(dir: &std::path::Path, key: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
    tokio::fs::create_dir_all(dir).await?;
    let name = outbox_file_name(key);
    let path = dir.join(&name);
    let tmp = dir.join(format!(".{name}.{}.tmp", ulid::Ulid::new()));
    tokio::fs::write(&tmp, bytes).await?;
    if let Err(e) = tokio::fs::rename(&tmp, &path).await {
        let _ = tokio::fs::remove_file(&tmp).await;
        return Err(e);
    }
    Ok(path)
}

fn mailbox(addr: &str, field: &str) -> Result<Mailbox, SendError> {
    addr.parse()
        .map_err(|e| SendError::Permanent(format!("invalid {field} address {addr:?}: {e}")))
}

/// Builds the MIME message for SMTP.
fn build_message(email: &OutgoingEmail) -> Result<Message, SendError> {
    let mut b = Message::builder()
        .from(mailbox(&email.from, "from")?)
        .subject(email.subject.clone());
    for to in &email.to {
        b = b.to(mailbox(to, "to")?);
    }
    if let Some(r) = &email.reply_to {
        b = b.reply_to(mailbox(r, "reply_to")?);
    }
    let built = match &email.html {
        Some(html) => b.multipart(MultiPart::alternative_plain_html(
            email.text.clone(),
            html.clone(),
        )),
        None => b.singlepart(
            SinglePart::builder()
                .header(ContentType::TEXT_PLAIN)
                .body(email.text.clone()),
        ),
    };
    built.map_err(|e| SendError::Permanent(format!("cannot build message: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn email_api_statuses_split_into_retried_and_permanent() {
        for s in [408, 409, 425, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify_http_status(s), Failure::Transient, "{s}");
        }
        for s in [400, 401, 403, 404, 405, 410, 413, 415, 422, 451] {
            assert_eq!(classify_http_status(s), Failure::Permanent, "{s}");
        }
    }

    #[test]
    fn smtp_codes_4yz_are_retried_and_5yz_are_not() {
        for c in [421, 450, 451, 452, 454] {
            assert_eq!(classify_smtp_code(c), Failure::Transient, "{c}");
        }
        for c in [500, 501, 503, 550, 551, 552, 553, 554] {
            assert_eq!(classify_smtp_code(c), Failure::Permanent, "{c}");
        }
    }

    #[test]
    fn outbox_file_names_come_from_the_key_and_cannot_escape() {
        assert_eq!(outbox_file_name("01JABCDEF"), "01JABCDEF.eml");
        assert_eq!(outbox_file_name("../etc/passwd"), "___etc_passwd.eml");
    }

    fn email(from: &str, to: &str) -> OutgoingEmail {
        OutgoingEmail {
            from: from.into(),
            to: vec![to.into()],
            reply_to: Some("ann@example.org".into()),
            subject: "Hello".into(),
            text: "Body line".into(),
            html: None,
        }
    }

    #[test]
    fn display_name_mailboxes_are_used_as_is() {
        let m = build_message(&email(
            "Site <noreply@example.com>",
            "Team <in@example.com>",
        ))
        .unwrap();
        let raw = String::from_utf8(m.formatted()).unwrap();
        assert!(raw.contains("From: Site <noreply@example.com>"), "{raw}");
        assert!(raw.contains("To: Team <in@example.com>"), "{raw}");
        let env = m.envelope();
        assert_eq!(env.from().unwrap().to_string(), "noreply@example.com");
        assert_eq!(env.to()[0].to_string(), "in@example.com");
    }

    #[tokio::test]
    async fn the_outbox_writes_one_file_per_key_and_a_retry_overwrites() {
        let dir = std::env::temp_dir().join(format!("outbox-test-{}", ulid::Ulid::new()));
        let mailer = Mailer::Outbox(dir.clone());
        let e = email("noreply@localhost", "in@example.com");
        mailer.send(&e, "01KEY").await.unwrap();
        mailer.send(&e, "01KEY").await.unwrap();
        let names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, vec!["01KEY.eml".to_string()]);
        let raw = std::fs::read_to_string(dir.join("01KEY.eml")).unwrap();
        assert!(
            raw.contains("Subject: Hello") && raw.contains("Body line"),
            "{raw}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
