//! Email transports: the HTTP email API (`EMAIL_PROVIDER_API_KEY`) or SMTP (`SMTP_URL`).
//!
//! HTTP API: `POST {EMAIL_PROVIDER_BASE_URL}/emails` with `Authorization: Bearer <key>`,
//! JSON `{from, to, subject, text, html?, reply_to?}` and an `Idempotency-Key`
//! header equal to the job id, so a retried job never sends twice.
//! SMTP: lettre's pooled async transport; `smtp://` is plain (local relays and
//! sinks), `smtp://…?tls=required` upgrades with STARTTLS, `smtps://` is implicit TLS.

use std::time::Duration;

use entity::{mail::OutgoingEmail, Settings};
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
    /// The transport the settings select: the HTTP API when its key and base URL
    /// are set, else SMTP when `SMTP_URL` is set, else `None`.
    pub fn from_settings(s: &Settings) -> anyhow::Result<Option<Self>> {
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
                if status.is_client_error()
                    && status.as_u16() != 408
                    && status.as_u16() != 429
                    && status.as_u16() != 409
                {
                    Err(SendError::Permanent(msg))
                } else {
                    Err(SendError::Transient(msg))
                }
            }
            Mailer::Smtp(transport) => {
                let message = build_message(email)?;
                match transport.send(message).await {
                    Ok(_) => Ok(()),
                    Err(e) if e.is_permanent() => {
                        Err(SendError::Permanent(format!("SMTP rejected: {e}")))
                    }
                    Err(e) => Err(SendError::Transient(format!("SMTP failed: {e}"))),
                }
            }
        }
    }
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
