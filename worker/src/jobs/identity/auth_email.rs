//! `send_auth_email`: renders one identity mail (confirmation, magic link /
//! code, recovery, email change) from its template and sends it through the
//! configured transport.
//!
//! Templates: `<kind>.txt` (first line `Subject: …`, a blank line, then the
//! plain-text body) and optionally `<kind>.html` (HTML body), where `<kind>`
//! is `confirmation`, `magic_link`, `recovery`, `email_change`,
//! `reauthentication` (the nonce of a password change; code only) or
//! `password_notice` (a confirmation dropped a password chosen before the
//! mailbox was proven; a set-password link). The
//! defaults are compiled in from `config/templates/auth/`; a file of the same
//! name in `AUTH_TEMPLATES_DIR` replaces one. Variables use the hosted auth
//! platform's names: `{{ .ConfirmationURL }}`, `{{ .Token }}`,
//! `{{ .TokenHash }}`, `{{ .SiteURL }}`, `{{ .RedirectTo }}`, `{{ .Email }}`
//! (the account's address: the recipient, but in an email change's two
//! mails the current address) and `{{ .NewEmail }}` (an email change's new
//! address) (plain substitution; values are HTML-escaped in `.html`
//! templates).

use entity::{base::mail::OutgoingEmail, identity::otp::MailKind};
use serde::{Deserialize, Serialize};

use crate::jobs::{
    context::{JobContext, JobError},
    email::{self, SendEmail},
};

/// Payload of the `send_auth_email` job. It carries the mail's secrets (the
/// code and the link token): the queue is as sensitive as the mailbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendAuthEmail {
    /// Which mail.
    pub kind: MailKind,
    /// Sender (`EMAIL_FROM`).
    pub from: String,
    /// Recipient.
    pub to: String,
    /// The 6-digit code.
    pub token: String,
    /// The link token (`token_hash` of `POST /verify`).
    pub token_hash: String,
    /// `{API_EXTERNAL_URL}/auth/v1/verify?token=…&type=…&redirect_to=…`.
    pub confirmation_url: String,
    /// Where the link lands after verification.
    pub redirect_to: String,
    /// `APP_URL`.
    pub site_url: String,
    /// Request id of the HTTP request that queued it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
    /// An email change's mails: the account's current address
    /// (`{{ .Email }}`; other mails: the recipient).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account_email: Option<String>,
    /// An email change's mails: the address it moves to (`{{ .NewEmail }}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new_email: Option<String>,
}

/// The template base name of `kind`.
pub fn template_name(kind: MailKind) -> &'static str {
    match kind {
        MailKind::Confirmation => "confirmation",
        MailKind::Recovery => "recovery",
        MailKind::Magiclink => "magic_link",
        MailKind::EmailChange => "email_change",
        MailKind::Reauthentication => "reauthentication",
        MailKind::PasswordNotice => "password_notice",
    }
}

fn default_text(kind: MailKind) -> &'static str {
    match kind {
        MailKind::Confirmation => {
            include_str!("../../../../config/templates/auth/confirmation.txt")
        }
        MailKind::Recovery => include_str!("../../../../config/templates/auth/recovery.txt"),
        MailKind::Magiclink => include_str!("../../../../config/templates/auth/magic_link.txt"),
        MailKind::EmailChange => include_str!("../../../../config/templates/auth/email_change.txt"),
        MailKind::Reauthentication => {
            include_str!("../../../../config/templates/auth/reauthentication.txt")
        }
        MailKind::PasswordNotice => {
            include_str!("../../../../config/templates/auth/password_notice.txt")
        }
    }
}

fn default_html(kind: MailKind) -> &'static str {
    match kind {
        MailKind::Confirmation => {
            include_str!("../../../../config/templates/auth/confirmation.html")
        }
        MailKind::Recovery => include_str!("../../../../config/templates/auth/recovery.html"),
        MailKind::Magiclink => include_str!("../../../../config/templates/auth/magic_link.html"),
        MailKind::EmailChange => {
            include_str!("../../../../config/templates/auth/email_change.html")
        }
        MailKind::Reauthentication => {
            include_str!("../../../../config/templates/auth/reauthentication.html")
        }
        MailKind::PasswordNotice => {
            include_str!("../../../../config/templates/auth/password_notice.html")
        }
    }
}

/// Substitutes the platform's variables in `template`; `html` escapes the values.
pub fn render(template: &str, job: &SendAuthEmail, html: bool) -> String {
    let esc = |s: &str| {
        if html {
            s.replace('&', "&amp;")
                .replace('<', "&lt;")
                .replace('>', "&gt;")
                .replace('"', "&quot;")
                .replace('\'', "&#39;")
        } else {
            s.to_string()
        }
    };
    let mut out = template.to_string();
    for (name, value) in [
        ("ConfirmationURL", job.confirmation_url.as_str()),
        ("TokenHash", job.token_hash.as_str()),
        ("Token", job.token.as_str()),
        ("SiteURL", job.site_url.as_str()),
        ("RedirectTo", job.redirect_to.as_str()),
        ("NewEmail", job.new_email.as_deref().unwrap_or("")),
        ("Email", job.account_email.as_deref().unwrap_or(&job.to)),
    ] {
        let v = esc(value);
        for pat in [format!("{{{{ .{name} }}}}"), format!("{{{{.{name}}}}}")] {
            out = out.replace(&pat, &v);
        }
    }
    out
}

/// Splits a text template into its `Subject:` line and body.
fn split_subject(t: &str) -> (String, String) {
    let t = t.trim_start_matches('\u{feff}');
    match t.split_once('\n') {
        Some((first, rest)) if first.to_ascii_lowercase().starts_with("subject:") => (
            first["subject:".len()..].trim().to_string(),
            rest.trim_start_matches(['\r', '\n']).to_string(),
        ),
        _ => ("Your sign-in link".to_string(), t.to_string()),
    }
}

/// The mail for `job`, with templates from `dir` when given.
pub fn build(job: &SendAuthEmail, dir: Option<&std::path::Path>) -> OutgoingEmail {
    let name = template_name(job.kind);
    let read =
        |ext: &str| dir.and_then(|d| std::fs::read_to_string(d.join(format!("{name}.{ext}"))).ok());
    let text = read("txt").unwrap_or_else(|| default_text(job.kind).to_string());
    let html = read("html").unwrap_or_else(|| default_html(job.kind).to_string());
    let (subject, body) = split_subject(&text);
    OutgoingEmail {
        from: job.from.clone(),
        to: vec![job.to.clone()],
        reply_to: None,
        subject: render(&subject, job, false),
        text: render(&body, job, false),
        html: Some(render(&html, job, true)),
    }
}

/// Renders and sends the mail (retry and dead-letter rules of `send_email`).
pub async fn handle(
    job: SendAuthEmail,
    task_id: &str,
    attempt: usize,
    ctx: &JobContext,
) -> Result<(), JobError> {
    let dir = std::env::var("AUTH_TEMPLATES_DIR")
        .ok()
        .filter(|d| !d.trim().is_empty())
        .map(std::path::PathBuf::from);
    let mail = build(&job, dir.as_deref());
    email::handle(
        SendEmail {
            email: mail,
            request_id: job.request_id.clone(),
        },
        task_id,
        attempt,
        ctx,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(kind: MailKind) -> SendAuthEmail {
        SendAuthEmail {
            kind,
            from: "site@example.com".into(),
            to: "ann@example.com".into(),
            token: "123456".into(),
            token_hash: "abc<def".into(),
            confirmation_url:
                "https://api.example.com/auth/v1/verify?token=abc&type=signup&redirect_to=x".into(),
            redirect_to: "https://app.example.com/welcome".into(),
            site_url: "https://app.example.com".into(),
            request_id: None,
            account_email: None,
            new_email: None,
        }
    }

    #[test]
    fn defaults_carry_the_link_and_the_code() {
        for kind in [
            MailKind::Confirmation,
            MailKind::Recovery,
            MailKind::Magiclink,
            MailKind::EmailChange,
            MailKind::PasswordNotice,
        ] {
            let m = build(&job(kind), None);
            assert!(!m.subject.is_empty());
            assert!(
                m.text
                    .contains("https://api.example.com/auth/v1/verify?token=abc"),
                "{kind:?}: {}",
                m.text
            );
            assert!(m.text.contains("123456"), "{kind:?}");
            assert!(!m.text.contains("{{"), "{kind:?}: unreplaced variable");
            assert!(
                m.html.unwrap().contains("abc&lt;def"),
                "{kind:?}: html escapes values"
            );
        }
    }

    #[test]
    fn the_reauthentication_mail_carries_the_code_only() {
        let m = build(&job(MailKind::Reauthentication), None);
        assert!(!m.subject.is_empty());
        assert!(m.text.contains("code: 123456"), "{}", m.text);
        assert!(!m.text.contains("/verify?token="), "{}", m.text);
        assert!(!m.text.contains("{{"), "unreplaced variable");
        assert!(m.html.unwrap().contains("123456"));
    }

    #[test]
    fn a_directory_replaces_a_template() {
        let dir = std::env::temp_dir().join(format!("auth-tpl-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("recovery.txt"),
            "Subject: Reset for {{ .Email }}\n\nCode {{.Token}} hash {{ .TokenHash }}",
        )
        .unwrap();
        let m = build(&job(MailKind::Recovery), Some(&dir));
        assert_eq!(m.subject, "Reset for ann@example.com");
        assert_eq!(m.text, "Code 123456 hash abc<def");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
