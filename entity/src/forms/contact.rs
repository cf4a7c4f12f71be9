//! The contact form: validation rules and the mail it produces.

use crate::{
    base::mail::OutgoingEmail,
    base::validate::{self, FieldError},
};

/// Longest accepted `name`, in characters.
pub const NAME_MAX: usize = 100;
/// Longest accepted `message`, in characters.
pub const MESSAGE_MAX: usize = 5_000;

/// A validated contact-form message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContactMessage {
    /// Sender's name, trimmed, 1–100 characters.
    pub name: String,
    /// Sender's email, trimmed, valid, ≤ 254 characters.
    pub email: String,
    /// The message, trimmed, 1–5,000 characters.
    pub message: String,
}

impl ContactMessage {
    /// Validates the three fields; the error names the first bad field
    /// (checked in the order `name`, `email`, `message`).
    pub fn new(name: &str, email: &str, message: &str) -> Result<Self, FieldError> {
        Ok(Self {
            name: validate::text("name", name, NAME_MAX)?,
            email: validate::email("email", email)?,
            message: validate::text("message", message, MESSAGE_MAX)?,
        })
    }

    /// The mail to the site's inbox: names the sender, carries the message,
    /// and replies go to the sender.
    pub fn to_email(&self, from: &str, inbox: &str) -> OutgoingEmail {
        let subject_name: String = self.name.chars().filter(|c| !c.is_control()).collect();
        OutgoingEmail {
            from: from.to_string(),
            to: vec![inbox.to_string()],
            reply_to: Some(self.email.clone()),
            subject: format!("Contact form: message from {subject_name}"),
            text: format!(
                "New contact-form message\n\nFrom: {} <{}>\n\n{}\n",
                self.name, self.email, self.message
            ),
            html: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_a_reply_to_mail() {
        let m = ContactMessage::new(" Ann ", "ann@example.com", "Hello\nthere").unwrap();
        let e = m.to_email("site@example.com", "inbox@example.com");
        assert_eq!(e.to, vec!["inbox@example.com"]);
        assert_eq!(e.reply_to.as_deref(), Some("ann@example.com"));
        assert!(e.subject.contains("Ann"));
        assert!(e.text.contains("Hello\nthere") && e.text.contains("ann@example.com"));
    }

    #[test]
    fn names_the_bad_field() {
        assert_eq!(
            ContactMessage::new("", "a@b.co", "x").unwrap_err().field,
            "name"
        );
        assert_eq!(
            ContactMessage::new("A", "nope", "x").unwrap_err().field,
            "email"
        );
        assert_eq!(
            ContactMessage::new("A", "a@b.co", &"x".repeat(5001))
                .unwrap_err()
                .field,
            "message"
        );
    }

    #[test]
    fn header_injection_in_the_name_is_neutralised() {
        let m = ContactMessage::new("Ann\r\nBcc: x@evil.com", "ann@example.com", "hi").unwrap();
        assert!(!m.to_email("a@b.co", "c@d.co").subject.contains('\n'));
    }
}
