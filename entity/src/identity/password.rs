//! Password rules and argon2id hashing.
//!
//! Parameters: argon2id v0x13, m = 19456 KiB (19 MiB), t = 2, p = 1 — the
//! OWASP Password Storage Cheat Sheet's first argon2id configuration. The PHC
//! string stores them with each hash, so verifying keeps working after a
//! change of parameters. Hashing and verifying are CPU-bound (tens of ms):
//! call them off the async runtime (`spawn_blocking`).
//!
//! Each hash needs `m` KiB of work memory. It comes from a small pool that
//! keeps one buffer per core for reuse, not from a fresh allocation per hash:
//! the allocator would otherwise keep each freed 19 MiB in the arena of
//! whichever thread hashed (measured: 64 sign-ups took an api from 38 MiB to
//! 466 MiB RSS), and reusing skips the page faults (~20 % of a hash's time).

use std::sync::{Mutex, OnceLock};

use argon2::password_hash::phc::{Output, ParamsString, PasswordHash, Salt};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use super::IdentityError;

/// argon2id memory cost in KiB.
pub const ARGON2_M_KIB: u32 = 19_456;
/// argon2id passes.
pub const ARGON2_T: u32 = 2;
/// argon2id lanes.
pub const ARGON2_P: u32 = 1;
/// Longest password accepted, in bytes (bounds the hashing work).
pub const MAX_PASSWORD_BYTES: usize = 1024;

fn params() -> Params {
    Params::new(ARGON2_M_KIB, ARGON2_T, ARGON2_P, None).expect("valid argon2 parameters")
}

/// Work-memory buffers kept for reuse, at most one per core.
static SCRATCH: Mutex<Vec<Vec<Block>>> = Mutex::new(Vec::new());

fn scratch_kept() -> usize {
    static KEPT: OnceLock<usize> = OnceLock::new();
    *KEPT.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// Runs `f` with `blocks` blocks of work memory, taken from and given back
/// to [`SCRATCH`]. Argon2 writes every block before it reads it, so a reused
/// buffer needs no clearing.
fn with_scratch<R>(blocks: usize, f: impl FnOnce(&mut [Block]) -> R) -> R {
    let taken = SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).pop();
    let mut memory = taken.unwrap_or_default();
    memory.resize(blocks, Block::default());
    let out = f(&mut memory);
    let mut pool = SCRATCH.lock().unwrap_or_else(|e| e.into_inner());
    if pool.len() < scratch_kept() {
        pool.push(memory);
    }
    out
}

/// Computes the raw argon2 output of `password` with `salt` into `out`.
fn raw(
    algorithm: Algorithm,
    version: Version,
    params: Params,
    password: &[u8],
    salt: &[u8],
    out: &mut [u8],
) -> argon2::Result<()> {
    let blocks = params.block_count();
    let hasher = Argon2::new(algorithm, version, params);
    with_scratch(blocks, |memory| {
        hasher.hash_password_into_with_memory(password, salt, out, memory)
    })
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
///
/// # Panics
/// When the OS random source fails (no salt can be made).
pub fn hash(password: &str) -> String {
    let salt = argon2::password_hash::generate_salt();
    let params = params();
    let mut out = [0u8; Params::DEFAULT_OUTPUT_LEN];
    let phc_params = ParamsString::try_from(&params).expect("argon2 parameters as a PHC string");
    raw(
        Algorithm::Argon2id,
        Version::V0x13,
        params,
        password.as_bytes(),
        &salt,
        &mut out,
    )
    .expect("argon2 hashing with valid parameters and a recommended-length salt");
    PasswordHash {
        algorithm: Algorithm::Argon2id.ident(),
        version: Some(Version::V0x13.into()),
        params: phc_params,
        salt: Some(Salt::new(&salt).expect("a recommended-length salt")),
        hash: Some(Output::new(&out).expect("a default-length output")),
    }
    .to_string()
}

/// Whether `password` matches the PHC string `phc` (false for a malformed
/// string). Uses the algorithm, version and parameters stored in `phc`;
/// the outputs are compared in constant time.
pub fn verify(password: &str, phc: &str) -> bool {
    let Ok(parsed) = PasswordHash::new(phc) else {
        return false;
    };
    let (Some(salt), Some(expected)) = (&parsed.salt, &parsed.hash) else {
        return false;
    };
    let (Ok(algorithm), Ok(params)) = (
        Algorithm::try_from(parsed.algorithm.as_str()),
        Params::try_from(&parsed),
    ) else {
        return false;
    };
    let version = match parsed.version.map(Version::try_from).transpose() {
        Ok(v) => v.unwrap_or_default(),
        Err(_) => return false,
    };
    let mut out = [0u8; Output::MAX_LENGTH];
    let Some(out) = out.get_mut(..expected.len()) else {
        return false;
    };
    if raw(algorithm, version, params, password.as_bytes(), salt, out).is_err() {
        return false;
    }
    Output::new(out).is_ok_and(|computed| computed == *expected)
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
    fn verifies_hashes_made_by_the_reference_hasher() {
        use argon2::{PasswordHasher, PasswordVerifier};
        // Other parameters (as after a change of settings): still verified.
        let other = Argon2::new(
            Algorithm::Argon2id,
            Version::V0x13,
            Params::new(8192, 3, 1, None).unwrap(),
        );
        let h = other.hash_password(b"pw-12345").unwrap().to_string();
        assert!(verify("pw-12345", &h));
        assert!(!verify("pw-12346", &h));
        // Ours verify with the reference verifier.
        let ours = hash("pw-12345");
        assert!(Argon2::default()
            .verify_password(b"pw-12345", ours.as_str())
            .is_ok());
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
