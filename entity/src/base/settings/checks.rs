//! Checks of single values: mailbox syntax, SMTP credentials only over TLS,
//! Redis TLS and its CA, https-or-loopback URLs, the app name, the billing
//! time zone, absolute paths.

use std::path::PathBuf;

use super::{err, Reader, SettingsError, Source};

/// `APP_NAME`: 1–100 characters without control characters (it goes into
/// mail subjects); default `App`.
pub(super) fn read_app_name<S: Source + ?Sized>(
    r: &Reader<'_, S>,
) -> Result<String, SettingsError> {
    let Some(name) = r.opt("APP_NAME") else {
        return Ok("App".to_string());
    };
    let name = name.trim().to_string();
    if name.is_empty() || name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(err(
            "APP_NAME",
            "expected 1–100 characters without line breaks or control characters",
        ));
    }
    Ok(name)
}
/// An IANA time zone name (`Asia/Jakarta`, `UTC`), else `default`.
pub(super) fn read_time_zone<S: Source + ?Sized>(
    r: &Reader<'_, S>,
    var: &'static str,
    default: chrono_tz::Tz,
) -> Result<chrono_tz::Tz, SettingsError> {
    match r.opt(var) {
        None => Ok(default),
        Some(v) => v.trim().parse::<chrono_tz::Tz>().map_err(|_| {
            err(
                var,
                format!("expected an IANA time zone name such as Asia/Jakarta, got {v:?}"),
            )
        }),
    }
}
/// An RFC 5322 mailbox as a sender or recipient setting: a bare address
/// (`addr@example.com`) or `display-name <addr@example.com>`, where the display
/// name is a quoted string or words without the RFC 5322 specials
/// (`()<>[]:;@\,"`). The worker parses it again with lettre's `Mailbox`.
pub fn is_mailbox_spec(value: &str) -> bool {
    let value = value.trim();
    if value.chars().any(char::is_control) {
        return false;
    }
    let Some(open) = value.rfind('<') else {
        return crate::base::validate::is_mailbox(value);
    };
    let Some(addr) = value[open + 1..].strip_suffix('>') else {
        return false;
    };
    if !crate::base::validate::is_mailbox(addr) {
        return false;
    }
    let name = value[..open].trim();
    if let Some(inner) = name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        // quoted-string: no bare quote or backslash inside.
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '\\' if chars.next().is_none() => return false,
                '"' => return false,
                _ => {}
            }
        }
        true
    } else {
        !name.contains(['(', ')', '<', '>', '[', ']', ':', ';', '@', '\\', ',', '"'])
    }
}
/// Refuses SMTP credentials sent in clear: `SMTP_URL` with a user or password,
/// scheme `smtp` and no `tls=required`, to a host other than loopback.
pub(super) fn check_smtp_credentials(url: &str) -> Result<(), SettingsError> {
    let parsed = url::Url::parse(url).map_err(|e| err("SMTP_URL", format!("not a URL: {e}")))?;
    let has_credentials = !parsed.username().is_empty() || parsed.password().is_some();
    if !has_credentials || parsed.scheme().eq_ignore_ascii_case("smtps") {
        return Ok(());
    }
    let tls_required = parsed
        .query_pairs()
        .any(|(k, v)| k == "tls" && v.eq_ignore_ascii_case("required"));
    if tls_required {
        return Ok(());
    }
    let loopback = match parsed.host() {
        // `smtp` is not a special scheme: an IPv4 host stays a domain string.
        Some(url::Host::Domain(d)) => {
            d.eq_ignore_ascii_case("localhost")
                || d.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    if loopback {
        return Ok(());
    }
    Err(err(
        "SMTP_URL",
        "credentials would be sent in clear to a remote host: use smtps:// or add ?tls=required",
    ))
}
/// Checks the TLS side of `REDIS_URL` and reads `REDIS_CA_FILE`:
/// - `#insecure` (a `rediss://` URL that skips the certificate check) is
///   refused: give the server's CA in `REDIS_CA_FILE` instead;
/// - `REDIS_CA_FILE` needs a `rediss://` `REDIS_URL`, and must be a readable
///   PEM file holding at least one `CERTIFICATE` block (whether the blocks
///   parse is checked when the client is built).
pub(super) fn check_redis_tls(
    url: Option<&str>,
    ca_file: Option<String>,
) -> Result<Option<PathBuf>, SettingsError> {
    let tls = url.is_some_and(|u| u.len() > 7 && u[..7].eq_ignore_ascii_case("rediss:"));
    if tls && url.is_some_and(|u| u.contains("#insecure")) {
        return Err(err(
            "REDIS_URL",
            "`#insecure` (no certificate check) is not supported: put the server's CA certificate in REDIS_CA_FILE",
        ));
    }
    let Some(path) = ca_file else {
        return Ok(None);
    };
    if !tls {
        return Err(err(
            "REDIS_CA_FILE",
            "is set but REDIS_URL is not a rediss:// (TLS) URL",
        ));
    }
    let pem = std::fs::read_to_string(&path)
        .map_err(|e| err("REDIS_CA_FILE", format!("cannot read {path:?}: {e}")))?;
    if !pem.contains("-----BEGIN CERTIFICATE-----") {
        return Err(err(
            "REDIS_CA_FILE",
            format!("{path:?} holds no PEM certificate (`-----BEGIN CERTIFICATE-----`)"),
        ));
    }
    Ok(Some(PathBuf::from(path)))
}
/// Whether `url` is `https://…`, or `http://` to a loopback host
/// (`localhost`, `127.0.0.0/8`, `[::1]`).
pub(super) fn is_https_or_loopback(url: &str) -> bool {
    let lower = url.to_ascii_lowercase();
    if lower.starts_with("https://") {
        return true;
    }
    let Some(rest) = lower.strip_prefix("http://") else {
        return false;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit('@').next().unwrap_or("");
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}
pub(super) fn absolute(p: &std::path::Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir()
            .map(|d| d.join(p))
            .unwrap_or_else(|_| p.to_path_buf())
    }
}
