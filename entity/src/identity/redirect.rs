//! Where the identity flows may send a browser: never an open redirect.
//!
//! Two rules, both pure functions over the configured `APP_URL`:
//!
//! * [`allowed_redirect`]: the `redirect_to` of `/auth/v1` (sign-up, OTP,
//!   recovery, OAuth, `GET /verify`). Accepted when it is on `APP_URL`'s
//!   origin, or when it matches one of the `AUTH_REDIRECT_ALLOW_LIST` globs;
//!   anything else (another origin, a malformed URL, `javascript:`/`data:`,
//!   a URL with user info) falls back to `APP_URL`.
//! * [`safe_next`]: the `next` of the `/auth/confirm` page route: a path on
//!   `APP_URL`'s origin (default `/`). An absolute URL is accepted only on
//!   that origin; scheme-relative (`//evil.example`), backslash
//!   (`/\evil.example`) and encoded variants fall back to `/`.
//!
//! Globs (`AUTH_REDIRECT_ALLOW_LIST`, comma separated) are matched against
//! the candidate as the WHATWG URL parser normalises it (`globset`, with `*`
//! not crossing `/` and `**` crossing it), so `https://*.example.com/**`
//! allows `https://app.example.com/welcome` but not
//! `https://evil.test/?.example.com/` nor `https://example.com.evil.test/`.
//! The same semantics as the hosted auth platform's allow list.

use globset::{GlobBuilder, GlobMatcher};
use url::Url;

/// Schemes a redirect may never use, even when a glob would allow them.
const FORBIDDEN_SCHEMES: &[&str] = &["javascript", "data", "vbscript", "file", "blob"];

/// The parsed `AUTH_REDIRECT_ALLOW_LIST`: globs over normalised URLs.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    globs: Vec<GlobMatcher>,
}

impl AllowList {
    /// Parses a comma-separated list of globs; blank entries are skipped.
    ///
    /// # Errors
    /// The first entry that is not a valid glob, with the parser's reason.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut globs = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let glob = GlobBuilder::new(entry)
                .literal_separator(true)
                .case_insensitive(false)
                .build()
                .map_err(|e| format!("`{entry}`: {e}"))?;
            globs.push(glob.compile_matcher());
        }
        Ok(Self { globs })
    }

    /// Whether no glob is configured.
    pub fn is_empty(&self) -> bool {
        self.globs.is_empty()
    }

    fn matches(&self, url: &Url) -> bool {
        let s = url.as_str();
        // `Url` adds a trailing `/` to an empty path; try both spellings so
        // `https://app.example.com` in the list matches it.
        let trimmed = s.strip_suffix('/').unwrap_or(s);
        self.globs
            .iter()
            .any(|g| g.is_match(s) || g.is_match(trimmed))
    }
}

/// The URL a browser may be sent to for `redirect_to`: the candidate when it
/// is on `app_url`'s origin or matches `allow`, else `app_url` itself.
///
/// `app_url` is the configured `APP_URL` (already validated as an absolute
/// http(s) URL); `candidate` is the raw query or body value, `None` or empty
/// when the client sent none.
pub fn allowed_redirect(app_url: &str, allow: &AllowList, candidate: Option<&str>) -> String {
    let Some(candidate) = candidate.map(str::trim).filter(|c| !c.is_empty()) else {
        return app_url.to_owned();
    };
    let Ok(app) = Url::parse(app_url) else {
        return app_url.to_owned();
    };
    let Ok(url) = Url::parse(candidate) else {
        return app_url.to_owned();
    };
    if FORBIDDEN_SCHEMES.contains(&url.scheme())
        || !url.username().is_empty()
        || url.password().is_some()
        || url.cannot_be_a_base()
    {
        return app_url.to_owned();
    }
    if same_origin(&url, &app) || allow.matches(&url) {
        return url.into();
    }
    app_url.to_owned()
}

/// The absolute URL on `app_url`'s origin that `/auth/confirm` redirects to
/// for `next`: `next` must be a path (`/dashboard?tab=1`) or an absolute URL
/// on that origin; anything else, and a missing `next`, gives the origin's
/// `/`.
pub fn safe_next(app_url: &str, next: Option<&str>) -> String {
    let Ok(app) = Url::parse(app_url) else {
        return app_url.to_owned();
    };
    let root = app
        .join("/")
        .map(String::from)
        .unwrap_or_else(|_| app_url.to_owned());
    let Some(next) = next.map(str::trim).filter(|n| !n.is_empty()) else {
        return root;
    };
    if next.chars().any(|c| c.is_control() || c == '\\') {
        return root;
    }
    let resolved = if next.starts_with('/') {
        // A single leading slash only: `//host` and `/\host` are
        // scheme-relative to browsers.
        if next.starts_with("//") {
            return root;
        }
        app.join(next)
    } else {
        Url::parse(next)
    };
    match resolved {
        Ok(url)
            if same_origin(&url, &app) && url.username().is_empty() && url.password().is_none() =>
        {
            url.into()
        }
        _ => root,
    }
}

fn same_origin(a: &Url, b: &Url) -> bool {
    a.origin() == b.origin() && a.origin().is_tuple()
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "https://app.example.com";

    fn list(s: &str) -> AllowList {
        AllowList::parse(s).unwrap()
    }

    #[test]
    fn redirect_on_the_app_origin_is_kept() {
        let none = AllowList::default();
        assert_eq!(
            allowed_redirect(APP, &none, Some("https://app.example.com/welcome?x=1")),
            "https://app.example.com/welcome?x=1"
        );
        assert_eq!(allowed_redirect(APP, &none, None), APP);
        assert_eq!(allowed_redirect(APP, &none, Some("  ")), APP);
    }

    #[test]
    fn other_origins_fall_back_to_the_app() {
        let none = AllowList::default();
        for evil in [
            "https://evil.example/",
            "//evil.example",
            "/\\evil.example",
            "javascript:alert(1)",
            "JAVASCRIPT:alert(1)",
            "data:text/html,<script>alert(1)</script>",
            "https://app.example.com@evil.example/",
            "https://user:pw@app.example.com/",
            "http://app.example.com/",
            "https://app.example.com:8443/",
            "https://app.example.com.evil.example/",
            "not a url",
        ] {
            assert_eq!(allowed_redirect(APP, &none, Some(evil)), APP, "{evil}");
        }
    }

    #[test]
    fn globs_allow_what_they_name_and_nothing_more() {
        let allow = list("https://*.example.com/**, http://localhost:3000/**, myapp://callback");
        assert_eq!(
            allowed_redirect(APP, &allow, Some("https://preview.example.com/a/b")),
            "https://preview.example.com/a/b"
        );
        assert_eq!(
            allowed_redirect(APP, &allow, Some("http://localhost:3000/auth/callback")),
            "http://localhost:3000/auth/callback"
        );
        assert_eq!(
            allowed_redirect(APP, &allow, Some("myapp://callback")),
            "myapp://callback"
        );
        for evil in [
            "https://evil.test/?.example.com/",
            "https://evil.test/.example.com/",
            "https://example.com.evil.test/",
            "https://a.example.com@evil.test/",
            "https://evil.test\\.example.com/",
            "http://localhost:3001/",
            "javascript://a.example.com/%0aalert(1)",
        ] {
            assert_eq!(allowed_redirect(APP, &allow, Some(evil)), APP, "{evil}");
        }
    }

    #[test]
    fn a_bad_glob_is_reported() {
        assert!(AllowList::parse("https://[a.example.com").is_err());
        assert!(AllowList::parse(" , ").unwrap().is_empty());
    }

    #[test]
    fn next_stays_on_the_app_origin() {
        assert_eq!(safe_next(APP, None), "https://app.example.com/");
        assert_eq!(
            safe_next(APP, Some("/dashboard?tab=1#x")),
            "https://app.example.com/dashboard?tab=1#x"
        );
        assert_eq!(
            safe_next(APP, Some("https://app.example.com/settings")),
            "https://app.example.com/settings"
        );
        for evil in [
            "https://evil.example/",
            "//evil.example",
            "///evil.example",
            "/\\evil.example",
            "\\\\evil.example",
            "javascript:alert(1)",
            "/%0d%0aSet-Cookie:x=1",
            "https://app.example.com@evil.example/",
            "http://app.example.com/",
            "dashboard",
            "/\tevil",
        ] {
            let got = safe_next(APP, Some(evil));
            assert!(
                got.starts_with("https://app.example.com/"),
                "{evil} -> {got}"
            );
            assert_eq!(
                Url::parse(&got).unwrap().host_str(),
                Some("app.example.com")
            );
        }
        // Percent-encoded bytes stay encoded in the path: no header injection.
        assert_eq!(
            safe_next(APP, Some("/%0d%0aSet-Cookie:x=1")),
            "https://app.example.com/%0d%0aSet-Cookie:x=1"
        );
    }
}
