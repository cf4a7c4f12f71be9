//! Random secrets and their digests: refresh tokens, one-time codes, link
//! hashes and PKCE auth codes are sent to the client once and stored only as
//! SHA-256 digests.

use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use hmac::{Hmac, KeyInit, Mac};
use rand::Rng;
use sha2::{Digest, Sha256};

/// `n` random bytes from the OS-seeded CSPRNG, base64url without padding.
pub fn random_token(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill(&mut bytes[..]);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// `n` random bytes as lowercase hex.
pub fn random_hex(n: usize) -> String {
    let mut bytes = vec![0u8; n];
    rand::rng().fill(&mut bytes[..]);
    hex(&bytes)
}

/// A 6-digit one-time code (`000000`–`999999`, uniform).
pub fn otp_code() -> String {
    format!("{:06}", rand::rng().random_range(0..1_000_000u32))
}

/// Lowercase hex SHA-256 of `s`.
pub fn sha256_hex(s: &str) -> String {
    hex(&Sha256::digest(s.as_bytes()))
}

/// The digest stored for a one-time code: SHA-256 of `<email_norm>:<code>`.
pub fn otp_digest(email_norm: &str, code: &str) -> String {
    sha256_hex(&format!("{email_norm}:{code}"))
}

/// The refresh token string of token row `id`: base64url of
/// HMAC-SHA256(`secret`, id bytes). Derived rather than stored, so the
/// active token can be handed out again within the reuse interval although
/// only its SHA-256 is stored.
pub fn refresh_token_for(secret: &[u8], id: uuid::Uuid) -> String {
    let mut mac =
        <Hmac<Sha256> as KeyInit>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(id.as_bytes());
    URL_SAFE_NO_PAD.encode(mac.finalize().into_bytes())
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otp_codes_have_six_digits() {
        for _ in 0..200 {
            let c = otp_code();
            assert_eq!(c.len(), 6);
            assert!(c.bytes().all(|b| b.is_ascii_digit()));
        }
    }

    #[test]
    fn digests_are_stable_and_distinct() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_ne!(
            otp_digest("a@x.io", "123456"),
            otp_digest("b@x.io", "123456")
        );
        let id = uuid::Uuid::new_v4();
        assert_eq!(refresh_token_for(b"k", id), refresh_token_for(b"k", id));
        assert_ne!(refresh_token_for(b"k", id), refresh_token_for(b"k2", id));
        assert_ne!(random_token(32), random_token(32));
        assert_eq!(random_hex(16).len(), 32);
    }
}
