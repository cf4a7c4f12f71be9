//! Secrets generated once into `DATA_DIR` for the embedded default (nothing
//! configured): today the server-side secret `BACKEND_SERVICE_ROLE_KEY`,
//! kept in `<DATA_DIR>/service_role_key` with mode 0600, as the identity
//! provider keeps its signing key. Production (`DATABASE_URL` set) never
//! generates one: the key must be set there, the same on every process.

use std::{io::Write as _, path::Path};

use base64::Engine as _;
use rand::RngCore as _;

/// Shortest accepted `BACKEND_JWT_SECRET` and `BACKEND_SERVICE_ROLE_KEY`,
/// in bytes (256 bits, the HS256 key size of RFC 7518 §3.2).
pub const SECRET_MIN_BYTES: usize = 32;

/// File name of the generated server-side secret under `DATA_DIR`.
pub const SERVICE_ROLE_KEY_FILE: &str = "service_role_key";

/// Where a secret setting came from (health's `checks.backend_service_role_source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySource {
    /// Set in the environment.
    Env,
    /// Generated once into `DATA_DIR` (embedded default).
    Generated,
    /// Not set (the features that need it answer 503 `not_configured`).
    None,
}

impl KeySource {
    /// `env`, `generated` or `none`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeySource::Env => "env",
            KeySource::Generated => "generated",
            KeySource::None => "none",
        }
    }
}

/// The secret stored at `path`, or a new one (256 random bits, base64url, 43
/// characters) written there first with mode 0600 (created with
/// `create_new`, so two processes starting at once end up with the file's
/// single value). Errors: the directory or file cannot be created or read, or
/// the file holds fewer than [`SECRET_MIN_BYTES`] bytes.
pub fn load_or_generate(path: &Path) -> Result<String, String> {
    if !path.exists() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let secret = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        write_private(path, secret.as_bytes())?;
    }
    let stored =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let stored = stored.trim().to_string();
    if stored.len() < SECRET_MIN_BYTES {
        return Err(format!(
            "{} holds fewer than {} bytes",
            path.display(),
            SECRET_MIN_BYTES
        ));
    }
    Ok(stored)
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt as _;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(mut f) => f
            .write_all(bytes)
            .map_err(|e| format!("writing {}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(format!("creating {}: {e}", path.display())),
    }
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    std::fs::File::create(path)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_private_and_reused() {
        let dir = std::env::temp_dir().join(format!("secret-file-{}", uuid::Uuid::new_v4()));
        let path = dir.join(SERVICE_ROLE_KEY_FILE);
        let a = load_or_generate(&path).unwrap();
        let b = load_or_generate(&path).unwrap();
        assert_eq!(a, b);
        assert!(a.len() >= SECRET_MIN_BYTES);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
