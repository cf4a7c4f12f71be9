//! Password rules and argon2id hashing.
//!
//! Parameters: argon2id v0x13, m = 19456 KiB (19 MiB), t = 2, p = 1 — the
//! OWASP Password Storage Cheat Sheet's first argon2id configuration. The PHC
//! string stores them with each hash, so verifying keeps working after a
//! change of parameters. Hashing and verifying are CPU-bound (tens of ms):
//! call them off the async runtime (`spawn_blocking`).

use argon2::{Algorithm, Argon2, Params, PasswordHasher, PasswordVerifier, Version};

use super::IdentityError;

/// argon2id memory cost in KiB.
pub const ARGON2_M_KIB: u32 = 19_456;
/// argon2id passes.
pub const ARGON2_T: u32 = 2;
/// argon2id lanes.
pub const ARGON2_P: u32 = 1;
/// Longest password accepted, in bytes (bounds the hashing work).
pub const MAX_PASSWORD_BYTES: usize = 1024;

fn hasher() -> Argon2<'static> {
    Argon2::new(
        Algorithm::Argon2id,
        Version::V0x13,
        Params::new(ARGON2_M_KIB, ARGON2_T, ARGON2_P, None).expect("valid argon2 parameters"),
    )
}

/// Checks `password` against the policy: at least `min_len` characters
/// (reason `length`), at most [`MAX_PASSWORD_BYTES`] bytes.
///
/// # Errors
/// [`IdentityError::WeakPassword`] with the reasons, or
/// [`IdentityError::Validation`] for an over-long password.
pub fn check_strength(password: &str, min_len: usize) -> Result<(), IdentityError> {
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(IdentityError::Validation(format!(
            "password must be at most {MAX_PASSWORD_BYTES} bytes"
        )));
    }
    if password.chars().count() < min_len {
        return Err(IdentityError::WeakPassword {
            min: min_len,
            reasons: vec!["length"],
        });
    }
    Ok(())
}

/// Hashes `password` with a fresh random salt: an argon2id PHC string.
pub fn hash(password: &str) -> String {
    hasher()
        .hash_password(password.as_bytes())
        .expect("argon2 hashing with valid parameters and an OS random salt")
        .to_string()
}

/// Whether `password` matches the PHC string `phc` (false for a malformed string).
pub fn verify(password: &str, phc: &str) -> bool {
    hasher().verify_password(password.as_bytes(), phc).is_ok()
}

/// A hash of a random password, verified against when an email is unknown
/// so that "no such user" costs the same time as "wrong password".
pub fn dummy_hash() -> &'static str {
    static DUMMY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DUMMY.get_or_init(|| hash(&super::tokens::random_token(16)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_and_carry_parameters() {
        let h = hash("correct horse");
        assert!(h.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{h}");
        assert!(verify("correct horse", &h));
        assert!(!verify("wrong horse", &h));
        assert!(!verify("correct horse", "not a phc string"));
        assert_ne!(hash("correct horse"), h, "fresh salt each time");
    }

    #[test]
    fn strength_needs_the_minimum_length() {
        assert!(check_strength("12345678", 8).is_ok());
        match check_strength("1234567", 8) {
            Err(IdentityError::WeakPassword { reasons, .. }) => assert_eq!(reasons, vec!["length"]),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            check_strength(&"x".repeat(2000), 8),
            Err(IdentityError::Validation(_))
        ));
    }
}
