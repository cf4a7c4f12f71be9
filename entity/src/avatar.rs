//! Avatar rules: the accepted image types and size, the signed-upload grant
//! (`POST /api/profile/avatar` mints it, the upload route checks it), and the
//! magic-byte check of uploaded bytes.
//!
//! Objects live in the bucket [`BUCKET`] at `<user_id>/avatar`; the object
//! store key is `avatars/<user_id>/avatar`.

use std::time::Duration;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::validate::FieldError;

/// The storage bucket of avatars.
pub const BUCKET: &str = "avatars";
/// Largest accepted avatar, in bytes (2 MiB).
pub const MAX_BYTES: u64 = 2 * 1024 * 1024;
/// Lifetime of a signed-upload grant (2 hours).
pub const GRANT_TTL: Duration = Duration::from_secs(2 * 3600);
/// The `aud` claim of a signed-upload token, so that it can never pass as a
/// session token (those carry `authenticated`) and vice versa.
pub const GRANT_AUDIENCE: &str = "storage-upload";

/// An accepted avatar image type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ImageType {
    /// `image/jpeg`
    #[serde(rename = "image/jpeg")]
    Jpeg,
    /// `image/png`
    #[serde(rename = "image/png")]
    Png,
    /// `image/webp`
    #[serde(rename = "image/webp")]
    Webp,
    /// `image/gif`
    #[serde(rename = "image/gif")]
    Gif,
}

impl ImageType {
    /// Every accepted type.
    pub const ALL: [ImageType; 4] = [
        ImageType::Jpeg,
        ImageType::Png,
        ImageType::Webp,
        ImageType::Gif,
    ];

    /// The MIME type, e.g. `image/png`.
    pub fn mime(self) -> &'static str {
        match self {
            ImageType::Jpeg => "image/jpeg",
            ImageType::Png => "image/png",
            ImageType::Webp => "image/webp",
            ImageType::Gif => "image/gif",
        }
    }

    /// Parses a MIME type (case-insensitive, parameters such as `; charset`
    /// ignored; `image/jpg` is taken as `image/jpeg`). `None` when it is not
    /// an accepted type.
    pub fn from_mime(value: &str) -> Option<Self> {
        let essence = value.split(';').next()?.trim().to_ascii_lowercase();
        match essence.as_str() {
            "image/jpeg" | "image/jpg" => Some(ImageType::Jpeg),
            "image/png" => Some(ImageType::Png),
            "image/webp" => Some(ImageType::Webp),
            "image/gif" => Some(ImageType::Gif),
            _ => None,
        }
    }

    /// The type the leading bytes of a file show (its magic number), when it
    /// is one of the accepted types. [`SNIFF_LEN`] bytes are enough.
    pub fn sniff(head: &[u8]) -> Option<Self> {
        infer::get(head).and_then(|t| Self::from_mime(t.mime_type()))
    }
}

/// How many leading bytes [`ImageType::sniff`] needs to decide.
pub const SNIFF_LEN: usize = 16;

/// The object key of `user_id`'s avatar inside the store: `avatars/<user_id>/avatar`.
pub fn object_key(user_id: Uuid) -> String {
    format!("{BUCKET}/{}", crate::profile::avatar_path_of(user_id))
}

/// The object key of a profile's `avatar_path` (`<user_id>/…`) inside the store.
pub fn object_key_of_path(avatar_path: &str) -> String {
    format!("{BUCKET}/{avatar_path}")
}

/// A validated request for a signed upload: declared size and type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UploadRequest {
    /// Declared size in bytes (1 ..= [`MAX_BYTES`]).
    pub size: u64,
    /// Declared type.
    pub image_type: ImageType,
}

impl UploadRequest {
    /// Validates `fileSize` and `fileType`.
    ///
    /// Errors ([`FieldError`], field / code): `fileSize` / `file_too_large`
    /// above [`MAX_BYTES`], `fileSize` / `invalid_size` below 1, `fileType` /
    /// `unsupported_type` for anything but JPEG, PNG, WebP and GIF.
    pub fn new(file_size: i64, file_type: &str) -> Result<Self, FieldError> {
        if file_size < 1 {
            return Err(FieldError::new(
                "fileSize",
                "invalid_size",
                "fileSize must be a positive number of bytes",
            ));
        }
        let size = file_size as u64;
        if size > MAX_BYTES {
            return Err(FieldError::new(
                "fileSize",
                "file_too_large",
                format!("fileSize must be at most {MAX_BYTES} bytes (2 MB)"),
            ));
        }
        let image_type = ImageType::from_mime(file_type).ok_or_else(|| {
            FieldError::new(
                "fileType",
                "unsupported_type",
                "fileType must be one of image/jpeg, image/png, image/webp, image/gif",
            )
        })?;
        Ok(Self { size, image_type })
    }
}

/// A signed-upload grant: who may write which object, how many bytes at most,
/// of which type, until when. Carried as an HS256 JWT signed with
/// `BACKEND_SERVICE_ROLE_KEY` (claims `sub`, `bucket`, `path`, `max_size`,
/// `content_type`, `aud` = [`GRANT_AUDIENCE`], `iat`, `exp`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UploadGrant {
    /// The uploading user.
    pub sub: Uuid,
    /// Always [`BUCKET`].
    pub bucket: String,
    /// Path inside the bucket: `<user_id>/avatar`.
    pub path: String,
    /// Largest accepted body, in bytes (the declared `fileSize`).
    pub max_size: u64,
    /// The one accepted type.
    pub content_type: ImageType,
    /// Audience: [`GRANT_AUDIENCE`].
    pub aud: String,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds.
    pub exp: i64,
}

/// Why a signed-upload token was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    /// Past its `exp`.
    #[error("the upload token has expired; request a new one")]
    Expired,
    /// Bad signature, garbage, wrong audience or algorithm.
    #[error("the upload token is invalid")]
    Invalid,
    /// Valid, but for another bucket or path.
    #[error("the upload token is not for this object")]
    WrongObject,
}

impl UploadGrant {
    /// The grant for `user_id` uploading `req`, valid for [`GRANT_TTL`] from `now`.
    pub fn new(user_id: Uuid, req: UploadRequest, now: DateTime<Utc>) -> Self {
        UploadGrant {
            sub: user_id,
            bucket: BUCKET.to_string(),
            path: crate::profile::avatar_path_of(user_id),
            max_size: req.size,
            content_type: req.image_type,
            aud: GRANT_AUDIENCE.to_string(),
            iat: now.timestamp(),
            exp: now.timestamp() + GRANT_TTL.as_secs() as i64,
        }
    }

    /// Signs the grant (HS256 with `key`).
    pub fn sign(&self, key: &str) -> String {
        jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            self,
            &EncodingKey::from_secret(key.as_bytes()),
        )
        .expect("HS256 signing of a plain struct cannot fail")
    }

    /// Verifies `token` with `key` (HS256 only, `exp` with no leeway, `aud`)
    /// and that it grants `bucket`/`path`.
    pub fn verify(key: &str, token: &str, bucket: &str, path: &str) -> Result<Self, GrantError> {
        let mut v = Validation::new(Algorithm::HS256);
        v.leeway = 0;
        v.set_audience(&[GRANT_AUDIENCE]);
        v.set_required_spec_claims(&["exp", "aud", "sub"]);
        let data = jsonwebtoken::decode::<UploadGrant>(
            token,
            &DecodingKey::from_secret(key.as_bytes()),
            &v,
        )
        .map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::ExpiredSignature => GrantError::Expired,
            _ => GrantError::Invalid,
        })?;
        let g = data.claims;
        if g.bucket != bucket || g.path != path || g.path != crate::profile::avatar_path_of(g.sub) {
            return Err(GrantError::WrongObject);
        }
        Ok(g)
    }
}

/// What the avatar-cleanup job does with an object a profile save left
/// unreferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Delete the object.
    Delete,
    /// Leave it: the profile references it again.
    KeepReferenced,
    /// Leave it: it was written again at or after the moment it lost its
    /// reference (a new upload to the same key, waiting for its profile save).
    KeepRewritten,
    /// Nothing to do: the object is already gone.
    Gone,
}

/// Decides the fate of `path` (a profile `avatar_path`), unreferenced at
/// `unreferenced_at`, given the profile's current `avatar_path` and the
/// object's last-modified time (`None`: no such object).
///
/// Times compare in whole seconds (S3 reports `Last-Modified` to the second),
/// so an object rewritten within the second it lost its reference is kept:
/// when in doubt the object stays, since a stray object at `<user>/avatar` is
/// overwritten by the next upload while a deleted fresh upload is lost.
pub fn cleanup_decision(
    path: &str,
    current_reference: Option<&str>,
    last_modified: Option<DateTime<Utc>>,
    unreferenced_at: DateTime<Utc>,
) -> Cleanup {
    if current_reference == Some(path) {
        return Cleanup::KeepReferenced;
    }
    match last_modified {
        None => Cleanup::Gone,
        Some(t) if t.timestamp() >= unreferenced_at.timestamp() => Cleanup::KeepRewritten,
        Some(_) => Cleanup::Delete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "service-role-key";

    fn png() -> Vec<u8> {
        let mut v = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR".to_vec();
        v.extend_from_slice(&[0; 32]);
        v
    }

    #[test]
    fn sniffs_the_accepted_types_only() {
        assert_eq!(ImageType::sniff(&png()), Some(ImageType::Png));
        assert_eq!(
            ImageType::sniff(b"\xFF\xD8\xFF\xE0\0\x10JFIF\0\x01\x01\0\0\x01"),
            Some(ImageType::Jpeg)
        );
        assert_eq!(
            ImageType::sniff(b"GIF89a\x01\0\x01\0\0\0\0;"),
            Some(ImageType::Gif)
        );
        assert_eq!(
            ImageType::sniff(b"RIFF\x24\0\0\0WEBPVP8 "),
            Some(ImageType::Webp)
        );
        assert_eq!(ImageType::sniff(b"%PDF-1.7\n%\xE2\xE3\xCF\xD3\n1 0"), None);
        assert_eq!(
            ImageType::sniff(b"<svg xmlns=\"http://www.w3.org/2000/svg\">"),
            None
        );
        assert_eq!(ImageType::sniff(b""), None);
    }

    #[test]
    fn cleanup_keeps_what_is_referenced_or_rewritten() {
        let t = Utc::now();
        let s = chrono::Duration::seconds(1);
        let p = "u/avatar";
        assert_eq!(
            cleanup_decision(p, None, Some(t - s * 5), t),
            Cleanup::Delete
        );
        assert_eq!(
            cleanup_decision(p, Some("u/other"), Some(t - s), t),
            Cleanup::Delete
        );
        assert_eq!(
            cleanup_decision(p, Some(p), Some(t - s * 5), t),
            Cleanup::KeepReferenced
        );
        assert_eq!(
            cleanup_decision(p, None, Some(t + s), t),
            Cleanup::KeepRewritten
        );
        assert_eq!(
            cleanup_decision(p, None, Some(t), t),
            Cleanup::KeepRewritten
        );
        assert_eq!(cleanup_decision(p, None, None, t), Cleanup::Gone);
    }

    #[test]
    fn validates_the_request() {
        let ok = UploadRequest::new(1024, "IMAGE/PNG; x=y").unwrap();
        assert_eq!((ok.size, ok.image_type), (1024, ImageType::Png));
        assert!(UploadRequest::new(MAX_BYTES as i64, "image/jpeg").is_ok());
        let e = UploadRequest::new(MAX_BYTES as i64 + 1, "image/png").unwrap_err();
        assert_eq!((e.field, e.code), ("fileSize", "file_too_large"));
        let e = UploadRequest::new(0, "image/png").unwrap_err();
        assert_eq!((e.field, e.code), ("fileSize", "invalid_size"));
        for t in ["image/svg+xml", "text/html", "", "image/bmp"] {
            let e = UploadRequest::new(10, t).unwrap_err();
            assert_eq!((e.field, e.code), ("fileType", "unsupported_type"), "{t}");
        }
    }

    #[test]
    fn grants_round_trip_and_refuse_tampering() {
        let user = Uuid::now_v7();
        let path = crate::profile::avatar_path_of(user);
        let req = UploadRequest::new(100, "image/png").unwrap();
        let g = UploadGrant::new(user, req, Utc::now());
        let token = g.sign(KEY);
        assert_eq!(
            UploadGrant::verify(KEY, &token, BUCKET, &path),
            Ok(g.clone())
        );

        assert_eq!(
            UploadGrant::verify("other-key", &token, BUCKET, &path),
            Err(GrantError::Invalid)
        );
        let other = crate::profile::avatar_path_of(Uuid::now_v7());
        assert_eq!(
            UploadGrant::verify(KEY, &token, BUCKET, &other),
            Err(GrantError::WrongObject)
        );
        assert_eq!(
            UploadGrant::verify(KEY, "garbage", BUCKET, &path),
            Err(GrantError::Invalid)
        );
        let old = UploadGrant::new(user, req, Utc::now() - chrono::Duration::hours(3));
        assert_eq!(
            UploadGrant::verify(KEY, &old.sign(KEY), BUCKET, &path),
            Err(GrantError::Expired)
        );
        let mut wrong_aud = g.clone();
        wrong_aud.aud = "authenticated".into();
        assert_eq!(
            UploadGrant::verify(KEY, &wrong_aud.sign(KEY), BUCKET, &path),
            Err(GrantError::Invalid)
        );
    }
}
