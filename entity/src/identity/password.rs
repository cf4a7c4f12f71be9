//! Password rules and argon2id hashing.
//!
//! Parameters: argon2id v0x13, one lane, memory and passes from
//! [`HashCost`] (settings `AUTH_ARGON2_MEMORY_KIB`, `AUTH_ARGON2_ITERATIONS`).
//! The default, m = 7168 KiB (7 MiB), t = 5, p = 1, is a row of the OWASP
//! Password Storage Cheat Sheet's argon2id table, whose rows "provide an equal
//! level of defense" and trade memory for passes; measured here it is the
//! fastest of them (the work memory stays in cache), and it holds 7 MiB per
//! hash instead of 19. The PHC string stores the parameters with each hash,
//! so verifying keeps working after a change of settings. Hashing and
//! verifying are CPU-bound (~12 ms): call them off the async runtime
//! (`spawn_blocking`).
//!
//! Each hash needs `m` KiB of work memory. It comes from a small pool that
//! keeps one buffer per core for reuse, not from a fresh allocation per hash:
//! the allocator would otherwise keep each freed buffer in the arena of
//! whichever thread hashed (measured with 19 MiB: 64 sign-ups took an api
//! from 38 MiB to 466 MiB RSS), and reusing skips the page faults (~20 % of
//! a hash's time).

use std::sync::{Mutex, OnceLock};

use argon2::password_hash::phc::{Output, ParamsString, PasswordHash, Salt};
use argon2::{Algorithm, Argon2, Block, Params, Version};

use super::IdentityError;

/// Longest password accepted, in bytes (bounds the hashing work).
pub const MAX_PASSWORD_BYTES: usize = 1024;

/// The cost of new argon2id hashes (one lane).
///
/// Source: OWASP Password Storage Cheat Sheet, "Argon2id": m = 47104 KiB,
/// t = 1; 19456, 2; 12288, 3; 9216, 4; 7168, 5 (all p = 1), equal in
/// defense. [`HashCost::new`] refuses a cost below all of those rows:
/// `memory_kib` under 7168, or `memory_kib × iterations` under
/// 7168 × 5 = 35,840.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HashCost {
    /// Work memory per hash, KiB.
    pub memory_kib: u32,
    /// Passes over the memory.
    pub iterations: u32,
}

impl HashCost {
    /// Smallest `memory_kib` accepted (OWASP's lowest-memory row).
    pub const MIN_MEMORY_KIB: u32 = 7168;
    /// Smallest `memory_kib × iterations` accepted (OWASP's cheapest row).
    pub const MIN_MEMORY_PASSES: u64 = 7168 * 5;

    /// A cost, checked against OWASP's table (see the type's doc).
    ///
    /// # Errors
    /// A message saying which bound is not met.
    pub fn new(memory_kib: u32, iterations: u32) -> Result<Self, String> {
        if memory_kib < Self::MIN_MEMORY_KIB {
            return Err(format!(
                "argon2id memory must be at least {} KiB, got {memory_kib}",
                Self::MIN_MEMORY_KIB
            ));
        }
        if u64::from(memory_kib) * u64::from(iterations) < Self::MIN_MEMORY_PASSES {
            return Err(format!(
                "argon2id memory × iterations must be at least {} (OWASP's cheapest row, \
                 7168 KiB × 5), got {memory_kib} × {iterations}",
                Self::MIN_MEMORY_PASSES
            ));
        }
        Params::new(memory_kib, iterations, 1, None).map_err(|e| e.to_string())?;
        Ok(Self {
            memory_kib,
            iterations,
        })
    }

    fn params(self) -> Params {
        Params::new(self.memory_kib, self.iterations, 1, None)
            .expect("argon2 parameters checked by HashCost::new")
    }
}

impl Default for HashCost {
    /// m = 7168 KiB, t = 5, p = 1.
    fn default() -> Self {
        Self {
            memory_kib: 7168,
            iterations: 5,
        }
    }
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

/// Hashes `password` with a fresh random salt at `cost`: an argon2id PHC
/// string (`$argon2id$v=19$m=…,t=…,p=1$<salt>$<hash>`).
///
/// # Panics
/// When the OS random source fails (no salt can be made).
pub fn hash(password: &str, cost: HashCost) -> String {
    let salt = argon2::password_hash::generate_salt();
    let params = cost.params();
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
/// so that "no such user" costs the same time as "wrong password". Made
/// once per process at the first call's `cost` (a process has one cost).
pub fn dummy_hash(cost: HashCost) -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| hash(&super::tokens::random_token(16), cost))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_verify_and_carry_parameters() {
        let h = hash("correct horse", HashCost::default());
        assert!(h.starts_with("$argon2id$v=19$m=7168,t=5,p=1$"), "{h}");
        assert!(verify("correct horse", &h));
        assert!(!verify("wrong horse", &h));
        assert!(!verify("correct horse", "not a phc string"));
        assert_ne!(
            hash("correct horse", HashCost::default()),
            h,
            "fresh salt each time"
        );
        let other = hash("correct horse", HashCost::new(19_456, 2).unwrap());
        assert!(
            other.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"),
            "{other}"
        );
        assert!(verify("correct horse", &other));
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
        let ours = hash("pw-12345", HashCost::default());
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

    #[test]
    fn cost_below_every_owasp_row_is_refused() {
        for (m, t) in [(47_104, 1), (19_456, 2), (12_288, 3), (9216, 4), (7168, 5)] {
            assert!(HashCost::new(m, t).is_ok(), "OWASP row {m}, {t}");
        }
        assert!(HashCost::new(7168, 4).unwrap_err().contains("35840"));
        assert!(HashCost::new(4096, 20).unwrap_err().contains("7168 KiB"));
        assert!(HashCost::new(19_456, 0).is_err());
    }
}
