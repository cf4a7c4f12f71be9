//! The one place a Redis client is built, for the queue (apalis-redis), the
//! api's rate limits and its caches alike: they all share the connection
//! [`crate::queue::Queues::connect`] opens with [`client`].
//!
//! * `redis://` and `unix://`: plain TCP or a Unix socket.
//! * `rediss://`: TLS through rustls (redis' `tokio-rustls-comp`). The
//!   server's certificate is checked against the public web roots
//!   (`webpki-roots`, compiled in), or, with `REDIS_CA_FILE`, against the
//!   certificates in that PEM file only (a managed Redis with a private CA).
//!   The host name in the URL must match the certificate.
//!
//! rustls needs one process-wide crypto provider and this build compiles two
//! (ring, for lettre, and aws-lc-rs, for reqwest and jsonwebtoken), so rustls
//! cannot pick one by itself: redis' TLS setup (`ClientConfig::builder()`)
//! would panic. [`install_crypto_provider`] installs aws-lc-rs, rustls' own
//! default; the binaries call it first thing, and [`client`] calls it again
//! (a no-op then) so a library user cannot forget it.

use entity::Settings;
use redis::{Client, RedisError, TlsCertificates};

/// Installs aws-lc-rs as rustls' process-wide crypto provider, unless one is
/// installed already. Call before the first TLS connection.
pub fn install_crypto_provider() {
    // Err means a provider is installed already: that one stays.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
}

/// The Redis client for `REDIS_URL` (`None` when unset), with
/// `REDIS_CA_FILE`'s certificates as the only trust anchors when set.
///
/// Errors: a URL redis cannot parse, an unreadable CA file, or a CA file
/// whose PEM blocks are not certificates.
pub fn client(settings: &Settings) -> Result<Option<Client>, RedisError> {
    let Some(url) = settings.redis_url.as_deref() else {
        return Ok(None);
    };
    install_crypto_provider();
    let Some(path) = &settings.redis_ca_file else {
        return Client::open(url).map(Some);
    };
    let pem = std::fs::read(path).map_err(|e| {
        RedisError::from(std::io::Error::other(format!(
            "REDIS_CA_FILE {}: {e}",
            path.display()
        )))
    })?;
    Client::build_with_tls(
        url,
        TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        },
    )
    .map(Some)
}
