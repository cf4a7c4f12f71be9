//! The waitlist: one lead per email address, compared trimmed and lowercased.

use chrono::Utc;
use sea_orm::{ActiveModelTrait, ConnectionTrait, DbErr, Set, SqlErr};
use uuid::Uuid;

use crate::{
    base::validate::{self, FieldError},
    entities::waitlist,
};

/// Longest accepted `name`, in characters.
pub const NAME_MAX: usize = 100;

/// Why a lead was not stored.
#[derive(Debug, thiserror::Error)]
pub enum WaitlistError {
    /// A field is invalid.
    #[error(transparent)]
    Invalid(#[from] FieldError),
    /// The (normalised) email is on the list already.
    #[error("email already registered")]
    AlreadyRegistered,
    /// The database failed.
    #[error(transparent)]
    Db(#[from] DbErr),
}

/// A validated lead: email trimmed and lowercased.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lead {
    /// Normalised email.
    pub email: String,
    /// Name, trimmed; may be empty (the waitlist form often asks only for an email).
    pub name: String,
}

impl Lead {
    /// Validates `email` (required, valid, ≤ 254) and `name` (≤ 100 characters, may be empty).
    pub fn new(email: &str, name: Option<&str>) -> Result<Self, FieldError> {
        let email = validate::email("email", email)?.to_lowercase();
        let name = name.unwrap_or("").trim();
        validate::no_nul("name", name)?;
        if name.chars().count() > NAME_MAX {
            return Err(FieldError::new(
                "name",
                "too_long",
                format!("name must be at most {NAME_MAX} characters"),
            ));
        }
        Ok(Self {
            email,
            name: name.to_string(),
        })
    }
}

/// Stores `lead`; a second lead with the same normalised email is
/// [`WaitlistError::AlreadyRegistered`] (enforced by the unique index, so it
/// holds under concurrent requests too).
pub async fn join<C: ConnectionTrait>(db: &C, lead: Lead) -> Result<(), WaitlistError> {
    let row = waitlist::ActiveModel {
        id: Set(Uuid::now_v7()),
        email: Set(lead.email),
        name: Set(lead.name),
        created_at: Set(Utc::now()),
    };
    match row.insert(db).await {
        Ok(_) => Ok(()),
        Err(e) if matches!(e.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
            Err(WaitlistError::AlreadyRegistered)
        }
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_email() {
        let l = Lead::new("  Ann@Example.COM ", Some(" Ann ")).unwrap();
        assert_eq!(l.email, "ann@example.com");
        assert_eq!(l.name, "Ann");
        assert_eq!(Lead::new("bad", None).unwrap_err().field, "email");
        assert_eq!(
            Lead::new("a@b.co", Some(&"x".repeat(101)))
                .unwrap_err()
                .field,
            "name"
        );
    }
}
