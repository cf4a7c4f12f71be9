//! Reading variables: the [`Source`] of values (the environment, or a map in
//! tests), the [`Reader`] that parses them, and the parsers of list values.

use std::{collections::HashMap, fmt};

use super::{checks::is_mailbox_spec, SettingsError};
use crate::base::secrets::SECRET_MIN_BYTES;

/// Reads variables by name; lets tests supply a map instead of the process environment.
pub trait Source {
    /// The value of `name`, or `None` when unset. Empty values count as unset.
    fn get(&self, name: &str) -> Option<String>;
}
/// The process environment (after an optional `.env` was loaded).
pub struct Env;
impl Source for Env {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }
}
impl Source for HashMap<String, String> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name)
            .cloned()
            .filter(|v| !v.trim().is_empty())
    }
}
impl Source for HashMap<&str, &str> {
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name)
            .map(|v| v.to_string())
            .filter(|v| !v.trim().is_empty())
    }
}
pub(super) fn err(var: &'static str, message: impl Into<String>) -> SettingsError {
    SettingsError {
        var,
        message: message.into(),
    }
}
/// Parses a boolean the way the toggles do: `true/1/yes/on`, `false/0/no/off`, any case.
pub fn parse_bool(var: &'static str, value: &str) -> Result<bool, SettingsError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        other => Err(err(
            var,
            format!("expected true/false/1/0/yes/no/on/off, got {other:?}"),
        )),
    }
}
pub(super) struct Reader<'a, S: Source + ?Sized>(pub(super) &'a S);

impl<S: Source + ?Sized> Reader<'_, S> {
    pub(super) fn opt(&self, var: &'static str) -> Option<String> {
        self.0.get(var).map(|v| v.trim().to_string())
    }

    pub(super) fn bool_or(&self, var: &'static str, default: bool) -> Result<bool, SettingsError> {
        self.opt(var).map_or(Ok(default), |v| parse_bool(var, &v))
    }

    pub(super) fn num_or<T>(
        &self,
        var: &'static str,
        default: T,
        min: T,
        max: T,
    ) -> Result<T, SettingsError>
    where
        T: std::str::FromStr + PartialOrd + fmt::Display + Copy,
    {
        let Some(raw) = self.opt(var) else {
            return Ok(default);
        };
        let v: T = raw
            .parse()
            .map_err(|_| err(var, format!("expected a whole number, got {raw:?}")))?;
        if v < min || v > max {
            return Err(err(
                var,
                format!("must be between {min} and {max}, got {v}"),
            ));
        }
        Ok(v)
    }

    pub(super) fn url(
        &self,
        var: &'static str,
        schemes: &[&str],
    ) -> Result<Option<String>, SettingsError> {
        let Some(v) = self.opt(var) else {
            return Ok(None);
        };
        let scheme_ok = schemes.iter().any(|s| {
            v.len() > s.len() + 1
                && v[..s.len()].eq_ignore_ascii_case(s)
                && v[s.len()..].starts_with(':')
        });
        if !scheme_ok {
            return Err(err(
                var,
                format!("expected a URL starting with one of {schemes:?}"),
            ));
        }
        Ok(Some(v.trim_end_matches('/').to_string()))
    }

    /// A secret of at least [`SECRET_MIN_BYTES`] bytes.
    pub(super) fn secret(&self, var: &'static str) -> Result<Option<String>, SettingsError> {
        match self.opt(var) {
            Some(v) if v.len() < SECRET_MIN_BYTES => Err(err(
                var,
                format!("must be at least {SECRET_MIN_BYTES} bytes, got {}", v.len()),
            )),
            v => Ok(v),
        }
    }

    pub(super) fn email(&self, var: &'static str) -> Result<Option<String>, SettingsError> {
        let Some(v) = self.opt(var) else {
            return Ok(None);
        };
        if !is_mailbox_spec(&v) {
            return Err(err(
                var,
                "expected an email address (`addr@example.com`) or an RFC 5322 mailbox \
                 (`Name <addr@example.com>`)",
            ));
        }
        Ok(Some(v))
    }
}

/// Parses `RENEWAL_REMINDER_DAYS`: a comma list of whole days, each 1–365;
/// answers them largest first without repeats. Empty (or only commas and
/// spaces) → none.
pub fn parse_reminder_days(var: &'static str, value: &str) -> Result<Vec<u32>, SettingsError> {
    let mut out = Vec::new();
    for raw in value.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let d: u32 = raw
            .parse()
            .ok()
            .filter(|d| (1..=365).contains(d))
            .ok_or_else(|| err(var, format!("{raw:?} is not a whole number of days 1–365")))?;
        if !out.contains(&d) {
            out.push(d);
        }
    }
    out.sort_unstable_by(|a, b| b.cmp(a));
    Ok(out)
}
/// Parses a comma list of exact web origins (`CORS_ALLOWED_ORIGINS`): each
/// `http(s)://host[:port]`, no path, query or user; kept in the form browsers
/// send in `Origin` (lower-case host, default port dropped). Empty → none.
pub fn parse_origins(var: &'static str, value: &str) -> Result<Vec<String>, SettingsError> {
    let mut out = Vec::new();
    for raw in value.split(',').map(str::trim).filter(|v| !v.is_empty()) {
        let bad = || {
            err(
                var,
                format!(
                    "{raw:?} is not an origin: expected scheme://host[:port] such as \
                     https://app.example.com (no path, no trailing slash, no wildcard)"
                ),
            )
        };
        let url = url::Url::parse(raw).map_err(|_| bad())?;
        if !matches!(url.scheme(), "http" | "https")
            || url.path() != "/"
            || raw.ends_with('/')
            || url.query().is_some()
            || url.fragment().is_some()
            || !url.username().is_empty()
            || raw.contains('*')
        {
            return Err(bad());
        }
        let origin = url.origin().ascii_serialization();
        if !out.contains(&origin) {
            out.push(origin);
        }
    }
    Ok(out)
}
