//! Outgoing email as the model describes it; the worker's email job carries one.

use serde::{Deserialize, Serialize};

/// One email to send. Addresses are plain `local@domain` strings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutgoingEmail {
    /// Sender (`EMAIL_FROM`).
    pub from: String,
    /// Recipients.
    pub to: Vec<String>,
    /// Where replies go (the contact form's sender).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// Subject line.
    pub subject: String,
    /// Plain-text body.
    pub text: String,
    /// Optional HTML body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
}
