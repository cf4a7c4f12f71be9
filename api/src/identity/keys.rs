//! The ES256 signing keys of the built-in provider and their JWKS.
//!
//! The current private key comes from `AUTH_JWT_PRIVATE_KEY` (PKCS#8 PEM of a
//! P-256 key), else from `<DATA_DIR>/auth_jwt_key.pem`, which is generated on
//! first start (mode 0600) and reused afterwards. `AUTH_JWT_PREVIOUS_KEYS`
//! (PEM blocks, public `PUBLIC KEY` or private `PRIVATE KEY`) lists keys that
//! signed tokens still in circulation: they are published in the JWKS and
//! accepted, never used to sign. The `kid` of a key is its RFC 7638 JWK
//! thumbprint (SHA-256, base64url).

use std::path::Path;

use anyhow::Context as _;
use base64::{engine::general_purpose::URL_SAFE_NO_PAD, Engine as _};
use jsonwebtoken::{DecodingKey, EncodingKey};
use p256::{
    elliptic_curve::sec1::ToEncodedPoint,
    pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, LineEnding},
    PublicKey, SecretKey,
};
use sha2::{Digest, Sha256};

/// File name of the generated key under `DATA_DIR`.
pub const KEY_FILE: &str = "auth_jwt_key.pem";

/// One public key: its `kid`, JWK and verification key.
pub struct PublicEntry {
    /// RFC 7638 thumbprint.
    pub kid: String,
    /// The public JWK as published.
    pub jwk: serde_json::Value,
    /// The verification key.
    pub decoding: DecodingKey,
}

/// The signing key and every accepted public key (current first).
pub struct KeySet {
    /// `kid` of the signing key.
    pub kid: String,
    /// The signing key (PKCS#8 DER).
    pub encoding: EncodingKey,
    /// Raw secret bytes of the signing key (derives the refresh-token secret).
    pub secret_bytes: Vec<u8>,
    /// Current and previous public keys.
    pub public: Vec<PublicEntry>,
}

fn public_entry(pk: &PublicKey) -> anyhow::Result<PublicEntry> {
    let point = pk.to_encoded_point(false);
    let x = URL_SAFE_NO_PAD.encode(point.x().context("P-256 point without x")?);
    let y = URL_SAFE_NO_PAD.encode(point.y().context("P-256 point without y")?);
    // RFC 7638: the required members in lexicographic order, no whitespace.
    let canonical = format!(r#"{{"crv":"P-256","kty":"EC","x":"{x}","y":"{y}"}}"#);
    let kid = URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()));
    let decoding = DecodingKey::from_ec_components(&x, &y).context("P-256 public key")?;
    let jwk = serde_json::json!({
        "kty": "EC",
        "crv": "P-256",
        "x": x,
        "y": y,
        "kid": kid,
        "alg": "ES256",
        "use": "sig",
        "key_ops": ["verify"],
    });
    Ok(PublicEntry { kid, jwk, decoding })
}

fn generate() -> SecretKey {
    loop {
        let mut bytes = [0u8; 32];
        rand::Rng::fill(&mut rand::rng(), &mut bytes[..]);
        if let Ok(k) = SecretKey::from_slice(&bytes) {
            return k;
        }
    }
}

/// Loads or creates the key set. `pem` is `AUTH_JWT_PRIVATE_KEY`, `previous`
/// is `AUTH_JWT_PREVIOUS_KEYS`, `data_dir` holds the generated key.
pub fn load(pem: Option<&str>, previous: Option<&str>, data_dir: &Path) -> anyhow::Result<KeySet> {
    let secret = match pem {
        Some(pem) => SecretKey::from_pkcs8_pem(pem.trim()).map_err(|e| {
            anyhow::anyhow!("AUTH_JWT_PRIVATE_KEY is not a PKCS#8 PEM P-256 key: {e}")
        })?,
        None => load_or_generate(&data_dir.join(KEY_FILE))?,
    };
    let der = secret
        .to_pkcs8_der()
        .map_err(|e| anyhow::anyhow!("encoding the signing key: {e}"))?;
    let current = public_entry(&secret.public_key())?;
    let mut public = vec![];
    let kid = current.kid.clone();
    public.push(current);
    if let Some(prev) = previous {
        for block in pem_blocks(prev) {
            let pk = if block.contains("PRIVATE KEY") {
                SecretKey::from_pkcs8_pem(&block)
                    .map(|s| s.public_key())
                    .map_err(|e| anyhow::anyhow!("AUTH_JWT_PREVIOUS_KEYS: {e}"))?
            } else {
                PublicKey::from_public_key_pem(&block)
                    .map_err(|e| anyhow::anyhow!("AUTH_JWT_PREVIOUS_KEYS: {e}"))?
            };
            let entry = public_entry(&pk)?;
            if !public.iter().any(|p| p.kid == entry.kid) {
                public.push(entry);
            }
        }
    }
    Ok(KeySet {
        kid,
        encoding: EncodingKey::from_ec_der(der.as_bytes()),
        secret_bytes: secret.to_bytes().to_vec(),
        public,
    })
}

fn pem_blocks(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in s.lines() {
        let line = line.trim();
        if line.starts_with("-----BEGIN") {
            cur.clear();
        }
        if !line.is_empty() {
            cur.push_str(line);
            cur.push('\n');
        }
        if line.starts_with("-----END") {
            out.push(std::mem::take(&mut cur));
        }
    }
    out
}

fn load_or_generate(path: &Path) -> anyhow::Result<SecretKey> {
    if let Ok(pem) = std::fs::read_to_string(path) {
        return SecretKey::from_pkcs8_pem(pem.trim())
            .map_err(|e| anyhow::anyhow!("{} is not a PKCS#8 PEM P-256 key: {e}", path.display()));
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let key = generate();
    let pem = key
        .to_pkcs8_pem(LineEnding::LF)
        .map_err(|e| anyhow::anyhow!("encoding the generated key: {e}"))?;
    write_private(path, pem.as_bytes())?;
    // Another process may have written its key first: use the file's.
    let stored =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    SecretKey::from_pkcs8_pem(stored.trim()).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => f
            .write_all(bytes)
            .with_context(|| format!("writing {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_key_is_persisted_and_reused() {
        let dir = std::env::temp_dir().join(format!("idp-keys-{}", uuid::Uuid::new_v4()));
        let a = load(None, None, &dir).unwrap();
        let b = load(None, None, &dir).unwrap();
        assert_eq!(a.kid, b.kid);
        assert_eq!(a.public.len(), 1);
        assert!(a.public[0].jwk.get("d").is_none());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(dir.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn previous_keys_are_published_not_used() {
        let old = generate().to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
        let new = generate().to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
        let dir = std::env::temp_dir();
        let ks = load(Some(&new), Some(&old), &dir).unwrap();
        assert_eq!(ks.public.len(), 2);
        assert_eq!(ks.public[0].kid, ks.kid);
        assert_ne!(ks.public[1].kid, ks.kid);
        assert!(load(Some("garbage"), None, &dir).is_err());
    }

    #[test]
    fn kid_is_the_rfc7638_thumbprint() {
        // RFC 7638 has no P-256 vector; check the construction instead.
        let k = generate();
        let e = public_entry(&k.public_key()).unwrap();
        let canonical = format!(
            r#"{{"crv":"P-256","kty":"EC","x":"{}","y":"{}"}}"#,
            e.jwk["x"].as_str().unwrap(),
            e.jwk["y"].as_str().unwrap()
        );
        assert_eq!(
            e.kid,
            URL_SAFE_NO_PAD.encode(Sha256::digest(canonical.as_bytes()))
        );
        assert_eq!(
            URL_SAFE_NO_PAD
                .decode(e.jwk["x"].as_str().unwrap())
                .unwrap()
                .len(),
            32
        );
    }
}
