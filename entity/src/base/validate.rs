//! Input rules shared by the routes: which field is wrong and why.

/// A rejected input field: the field's name and a stable reason code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// The JSON field name, e.g. `email`.
    pub field: &'static str,
    /// Stable snake_case code, e.g. `invalid_email`, `too_long`, `required`.
    pub code: &'static str,
    /// Human-readable explanation.
    pub message: String,
}

impl FieldError {
    /// Builds a field error.
    pub fn new(field: &'static str, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            field,
            code,
            message: message.into(),
        }
    }
}

/// Longest email address accepted (RFC 5321 path limit), in characters.
pub const EMAIL_MAX: usize = 254;

/// Whether `value` is one plain email address (`local@domain.tld`, no display
/// name, no spaces), as RFC 5322's addr-spec with a dotted domain.
pub fn is_mailbox(value: &str) -> bool {
    let Ok(parsed) = value.parse::<email_address::EmailAddress>() else {
        return false;
    };
    // Reject display-name forms ("Name <a@b>") and dotless domains; a plain
    // address must round-trip unchanged.
    parsed.as_str() == value && parsed.domain().contains('.') && !value.contains(['<', '>', ' '])
}

/// Refuses a NUL character (U+0000), which PostgreSQL `text` cannot store and
/// no human-typed text holds: 400 `invalid_character` naming the field.
pub fn no_nul(field: &'static str, value: &str) -> Result<(), FieldError> {
    if value.contains('\0') {
        return Err(FieldError::new(
            field,
            "invalid_character",
            format!("{field} must not contain U+0000 (NUL)"),
        ));
    }
    Ok(())
}

/// Trims `value`, requires it non-empty, at most `max` characters and free
/// of NUL ([`no_nul`]).
pub fn text(field: &'static str, value: &str, max: usize) -> Result<String, FieldError> {
    no_nul(field, value)?;
    let v = value.trim();
    if v.is_empty() {
        return Err(FieldError::new(
            field,
            "required",
            format!("{field} is required"),
        ));
    }
    if v.chars().count() > max {
        return Err(FieldError::new(
            field,
            "too_long",
            format!("{field} must be at most {max} characters"),
        ));
    }
    Ok(v.to_string())
}

/// Trims `value`, requires a valid email of at most [`EMAIL_MAX`] characters.
/// Returns the trimmed address (case preserved).
pub fn email(field: &'static str, value: &str) -> Result<String, FieldError> {
    let v = value.trim();
    if v.is_empty() {
        return Err(FieldError::new(
            field,
            "required",
            format!("{field} is required"),
        ));
    }
    if v.chars().count() > EMAIL_MAX {
        return Err(FieldError::new(
            field,
            "too_long",
            format!("{field} must be at most {EMAIL_MAX} characters"),
        ));
    }
    if !is_mailbox(v) {
        return Err(FieldError::new(
            field,
            "invalid_email",
            format!("{field} is not a valid email address"),
        ));
    }
    Ok(v.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails() {
        assert!(email("email", " a.b+c@example.co.id ").is_ok());
        for bad in [
            "",
            "a",
            "a@",
            "@b.com",
            "a@b",
            "a b@c.com",
            "Name <a@b.com>",
            "a@@b.com",
        ] {
            assert!(email("email", bad).is_err(), "{bad:?}");
        }
        let long = format!("{}@example.com", "a".repeat(250));
        assert_eq!(email("email", &long).unwrap_err().code, "too_long");
    }

    #[test]
    fn texts() {
        assert_eq!(text("name", "  Ann ", 100).unwrap(), "Ann");
        assert_eq!(text("name", "   ", 100).unwrap_err().code, "required");
        assert_eq!(
            text("name", &"é".repeat(101), 100).unwrap_err().code,
            "too_long"
        );
        assert!(text("name", &"é".repeat(100), 100).is_ok());
        assert_eq!(
            text("name", "a\0b", 100).unwrap_err().code,
            "invalid_character"
        );
    }
}
