//! Which transport carries the mails ([`EmailTransport`]) and the outbox's
//! default sender.

/// Which transport delivers mail (health's `email_transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EmailTransport {
    /// The HTTP email API (`EMAIL_PROVIDER_API_KEY` + `EMAIL_PROVIDER_BASE_URL`).
    Api,
    /// SMTP (`SMTP_URL`).
    Smtp,
    /// Embedded default with nothing configured: one `.eml` file per message in
    /// `$DATA_DIR/outbox`.
    Outbox,
    /// None: production (PostgreSQL or Redis configured) without a transport.
    None,
}
impl EmailTransport {
    /// `api`, `smtp`, `outbox` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            EmailTransport::Api => "api",
            EmailTransport::Smtp => "smtp",
            EmailTransport::Outbox => "outbox",
            EmailTransport::None => "none",
        }
    }
}
/// Sender used by the outbox transport when `EMAIL_FROM` is unset.
pub const OUTBOX_DEFAULT_FROM: &str = "noreply@localhost";
