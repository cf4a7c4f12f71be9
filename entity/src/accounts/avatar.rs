//! Avatar rules: the accepted image types and size, the signed-upload grant
//! (`POST /api/profile/avatar` mints it, the upload route checks it), the
//! magic-byte check of uploaded bytes, the key rules, and the avatar
//! generation that orders uploads and cleanups.
//!
//! Key rules, here only: objects live in the bucket [`BUCKET`] at
//! `<user_id>/avatar` ([`path_of`]); the object store key is
//! `avatars/<user_id>/avatar` ([`object_key`]).
//!
//! Generation: `profiles.avatar_generation` counts completed uploads. An
//! upload puts its object in place under the profile row lock while bumping
//! it ([`begin_upload`]); a profile save that drops a reference records it in
//! the cleanup job; the cleanup locks the row and deletes only when the
//! generation is unchanged and the object is unreferenced ([`begin_cleanup`],
//! [`cleanup_decision`]).

use std::time::Duration;

use chrono::{DateTime, Utc};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use sea_orm::{
    ColumnTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, PaginatorTrait, QueryFilter,
    QuerySelect, Statement, TransactionTrait,
};

use crate::{
    base::validate::FieldError,
    entities::{auth_sessions, profiles},
};

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

/// The file name of every avatar inside its user's folder: `<user_id>/avatar`.
pub const FILE_NAME: &str = "avatar";

/// The only legal avatar path of `user_id` inside [`BUCKET`]: `<user_id>/avatar`
/// (what the profile's `avatar_path` holds and the upload grant names).
pub fn path_of(user_id: Uuid) -> String {
    path_of_segment(&user_id.to_string())
}

/// The avatar path named by the user segment of a URL, as sent (not parsed):
/// `<segment>/avatar`. An upload grant matches it only when the segment is the
/// grant's user id exactly.
pub fn path_of_segment(user_segment: &str) -> String {
    format!("{user_segment}/{FILE_NAME}")
}

/// The object key of `user_id`'s avatar inside the store: `avatars/<user_id>/avatar`.
pub fn object_key(user_id: Uuid) -> String {
    object_key_of_path(&path_of(user_id))
}

/// The object key of a profile's `avatar_path` (`<user_id>/…`) inside the store:
/// `avatars/<avatar_path>`.
pub fn object_key_of_path(avatar_path: &str) -> String {
    format!("{BUCKET}/{avatar_path}")
}

/// Whether `avatar_path` is an object of `user_id` that a cleanup may delete:
/// inside the user's own `<user_id>/` prefix, with a name, and no `..`.
pub fn is_own_path(user_id: Uuid, avatar_path: &str) -> bool {
    let own = format!("{user_id}/");
    avatar_path.starts_with(&own) && avatar_path.len() > own.len() && !avatar_path.contains("..")
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
/// `content_type`, `aud` = [`GRANT_AUDIENCE`], `iat`, `exp`, and `sid` when it
/// was asked with a token of the built-in provider: the upload is refused
/// once that session has ended, see [`grant_session_alive`]).
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
    /// The built-in provider's session that asked for the grant (its
    /// `session_id`); absent for a session of another issuer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sid: Option<Uuid>,
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
            path: path_of(user_id),
            max_size: req.size,
            content_type: req.image_type,
            aud: GRANT_AUDIENCE.to_string(),
            iat: now.timestamp(),
            exp: now.timestamp() + GRANT_TTL.as_secs() as i64,
            sid: None,
        }
    }

    /// The grant bound to `session` (the built-in provider's session id of
    /// the token that asked for it; `None`: not bound).
    pub fn for_session(mut self, session: Option<Uuid>) -> Self {
        self.sid = session;
        self
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
        if g.bucket != bucket || g.path != path || g.path != path_of(g.sub) {
            return Err(GrantError::WrongObject);
        }
        Ok(g)
    }
}

/// Whether the session `grant` is bound to still exists (of the grant's
/// user); `true` for a grant bound to none (asked with another issuer's
/// token). A signed-out session, or one ended by a password change, can no
/// longer upload with the grants it was given.
pub async fn grant_session_alive<C: ConnectionTrait>(
    db: &C,
    grant: &UploadGrant,
) -> Result<bool, DbErr> {
    let Some(sid) = grant.sid else {
        return Ok(true);
    };
    let found = auth_sessions::Entity::find_by_id(sid)
        .filter(auth_sessions::Column::UserId.eq(grant.sub))
        .count(db)
        .await?;
    Ok(found > 0)
}

/// What the avatar-cleanup job does with an object a profile save left
/// unreferenced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cleanup {
    /// Delete the object.
    Delete,
    /// Leave it: the profile references it again.
    KeepReferenced,
    /// Leave it: an upload completed after the save that dropped the
    /// reference (the profile's generation moved on), e.g. a new avatar
    /// waiting for its profile save.
    KeepRewritten,
}

/// Decides the fate of `path` (a profile `avatar_path`) that a profile save
/// left unreferenced when the profile's avatar generation was
/// `unreferenced_generation`, given the profile as it is now (locked):
/// `current` = its `avatar_path` and `avatar_generation`, `None` when the
/// profile is gone (the user was deleted).
///
/// Exact: the generation is a counter bumped under the profile row lock by
/// every completed upload, so no clock is read and no interleaving of upload
/// and cleanup deletes an upload that completed after the removal.
pub fn cleanup_decision(
    path: &str,
    unreferenced_generation: i64,
    current: Option<(Option<&str>, i64)>,
) -> Cleanup {
    match current {
        None => Cleanup::Delete,
        Some((reference, _)) if reference == Some(path) => Cleanup::KeepReferenced,
        Some((_, generation)) if generation != unreferenced_generation => Cleanup::KeepRewritten,
        Some(_) => Cleanup::Delete,
    }
}

/// Starts finalising an avatar upload of `user_id` whose bytes have fully
/// arrived and passed every check: in a new write transaction (`BEGIN
/// IMMEDIATE` on SQLite, which serialises writers), bumps the profile's
/// `avatar_generation` with the row locked until the transaction ends (an
/// upsert, so a missing profile row is created). Returns the open
/// transaction and the new generation: put the object in place, then commit;
/// drop the transaction (roll back) when that fails.
///
/// Errors: [`DbErr`] (a foreign-key violation when the user row is gone).
pub async fn begin_upload<C>(db: &C, user_id: Uuid) -> Result<(C::Transaction, i64), DbErr>
where
    C: TransactionTrait,
    C::Transaction: ConnectionTrait,
{
    let txn = crate::base::db::begin_write(db).await?;
    let backend = txn.get_database_backend();
    let sql = match backend {
        DbBackend::Postgres => {
            "INSERT INTO profiles (user_id, avatar_generation) VALUES ($1, 1) \
             ON CONFLICT (user_id) DO UPDATE SET avatar_generation = profiles.avatar_generation + 1 \
             RETURNING avatar_generation"
        }
        _ => {
            "INSERT INTO profiles (user_id, avatar_generation) VALUES (?, 1) \
             ON CONFLICT (user_id) DO UPDATE SET avatar_generation = profiles.avatar_generation + 1 \
             RETURNING avatar_generation"
        }
    };
    let row = txn
        .query_one_raw(Statement::from_sql_and_values(
            backend,
            sql,
            [user_id.into()],
        ))
        .await?
        .ok_or_else(|| DbErr::RecordNotFound("profile upsert returned no row".into()))?;
    let generation: i64 = row.try_get("", "avatar_generation")?;
    Ok((txn, generation))
}

/// Starts an avatar cleanup of `user_id`: in a new write transaction, locks
/// the profile row (`SELECT … FOR UPDATE` on PostgreSQL; SQLite's `BEGIN
/// IMMEDIATE` serialises writers) and returns it with the transaction (`None`:
/// no profile). Decide with [`cleanup_decision`], delete the object while the
/// transaction is open, then commit: an upload cannot complete in between.
pub async fn begin_cleanup<C>(
    db: &C,
    user_id: Uuid,
) -> Result<(C::Transaction, Option<profiles::Model>), DbErr>
where
    C: TransactionTrait,
    C::Transaction: ConnectionTrait,
{
    let txn = crate::base::db::begin_write(db).await?;
    let mut select = profiles::Entity::find_by_id(user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        select = select.lock_exclusive();
    }
    let profile = select.one(&txn).await?;
    Ok((txn, profile))
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
    fn cleanup_decides_from_the_generation_only() {
        let p = "u/avatar";
        // Nothing uploaded since the removal: delete.
        assert_eq!(cleanup_decision(p, 3, Some((None, 3))), Cleanup::Delete);
        assert_eq!(
            cleanup_decision(p, 3, Some((Some("u/other"), 3))),
            Cleanup::Delete
        );
        // Referenced again: keep, whatever the generation.
        assert_eq!(
            cleanup_decision(p, 3, Some((Some(p), 3))),
            Cleanup::KeepReferenced
        );
        assert_eq!(
            cleanup_decision(p, 3, Some((Some(p), 4))),
            Cleanup::KeepReferenced
        );
        // An upload completed after the removal: keep.
        assert_eq!(
            cleanup_decision(p, 3, Some((None, 4))),
            Cleanup::KeepRewritten
        );
        // The profile is gone with its user: delete.
        assert_eq!(cleanup_decision(p, 3, None), Cleanup::Delete);
    }

    #[test]
    fn key_rules() {
        let u = Uuid::parse_str("0191a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b").unwrap();
        assert_eq!(path_of(u), format!("{u}/avatar"));
        assert_eq!(object_key(u), format!("avatars/{u}/avatar"));
        assert_eq!(path_of_segment("x"), "x/avatar");
        assert!(is_own_path(u, &format!("{u}/avatar")));
        assert!(is_own_path(u, &format!("{u}/legacy.png")));
        assert!(!is_own_path(u, &format!("{u}/")));
        assert!(!is_own_path(u, &format!("{u}/../x")));
        assert!(!is_own_path(u, &format!("{}/avatar", Uuid::now_v7())));
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
        let path = path_of(user);
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
        let other = path_of(Uuid::now_v7());
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
