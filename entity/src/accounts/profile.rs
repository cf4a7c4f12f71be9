//! Saving a user's profile (`POST /api/profile`): display name and avatar
//! references, and which stored avatar object became unreferenced.

use chrono::{DateTime, Utc};
use sea_orm::{
    ActiveModelTrait, ConnectionTrait, DbBackend, DbErr, EntityTrait, FromQueryResult,
    IntoActiveModel, QuerySelect, Set, Statement, TransactionSession, TransactionTrait, Value,
};
use uuid::Uuid;

use crate::{base::db::begin_write, base::outbox, base::validate::FieldError, entities::profiles};

/// Longest accepted `full_name`, in characters (after trimming).
pub const FULL_NAME_MAX: usize = 100;
/// Longest accepted `avatar_url`, in characters (after trimming).
pub const AVATAR_URL_MAX: usize = 2048;

/// What a save does to one profile field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldChange {
    /// The field was absent from the request: the stored value stays.
    Keep,
    /// The field was sent empty (or blank): the stored value becomes `NULL`.
    Clear,
    /// The field was sent with this (trimmed, validated) value.
    Set(String),
}

impl FieldChange {
    fn apply(&self, old: Option<String>) -> Option<String> {
        match self {
            Self::Keep => old,
            Self::Clear => None,
            Self::Set(v) => Some(v.clone()),
        }
    }
}

/// A validated profile update for one user.
///
/// Each field is a [`FieldChange`]: a field passed as `None` to
/// [`ProfileInput::new`] (absent from the request body) keeps its stored value,
/// so a client that only sends `full_name` does not drop its avatar; a field
/// sent empty clears the stored value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProfileInput {
    user_id: Uuid,
    full_name: FieldChange,
    avatar_path: FieldChange,
    avatar_url: FieldChange,
}

impl ProfileInput {
    /// Validates a profile update of `user_id`. All values are trimmed; an
    /// empty value means [`FieldChange::Clear`], `None` means
    /// [`FieldChange::Keep`].
    ///
    /// Errors ([`FieldError`], field / code):
    /// - `full_name` / `too_long`: more than [`FULL_NAME_MAX`] characters;
    /// - `avatar_path` / `invalid_avatar_path`: anything but exactly
    ///   `<user_id>/avatar` (see [`crate::accounts::avatar::path_of`]);
    /// - `avatar_url` / `too_long`: more than [`AVATAR_URL_MAX`] characters;
    /// - `avatar_url` / `invalid_url`: not an absolute `http` or `https` URL
    ///   with a host.
    pub fn new(
        user_id: Uuid,
        full_name: Option<&str>,
        avatar_path: Option<&str>,
        avatar_url: Option<&str>,
    ) -> Result<Self, FieldError> {
        let full_name = change(full_name, |v| {
            crate::base::validate::no_nul("full_name", v)?;
            if v.chars().count() > FULL_NAME_MAX {
                return Err(FieldError::new(
                    "full_name",
                    "too_long",
                    format!("full_name must be at most {FULL_NAME_MAX} characters"),
                ));
            }
            Ok(v.to_string())
        })?;
        let avatar_path = change(avatar_path, |v| {
            if v != crate::accounts::avatar::path_of(user_id) {
                return Err(FieldError::new(
                    "avatar_path",
                    "invalid_avatar_path",
                    "avatar_path must be \"<your user id>/avatar\" or empty",
                ));
            }
            Ok(v.to_string())
        })?;
        let avatar_url = change(avatar_url, |v| {
            if v.chars().count() > AVATAR_URL_MAX {
                return Err(FieldError::new(
                    "avatar_url",
                    "too_long",
                    format!("avatar_url must be at most {AVATAR_URL_MAX} characters"),
                ));
            }
            if !is_http_url(v) {
                return Err(FieldError::new(
                    "avatar_url",
                    "invalid_url",
                    "avatar_url must be an absolute http(s) URL",
                ));
            }
            Ok(v.to_string())
        })?;
        Ok(Self {
            user_id,
            full_name,
            avatar_path,
            avatar_url,
        })
    }

    /// The user this input was validated for.
    pub fn user_id(&self) -> Uuid {
        self.user_id
    }

    /// What happens to `full_name`.
    pub fn full_name(&self) -> &FieldChange {
        &self.full_name
    }

    /// What happens to `avatar_path`.
    pub fn avatar_path(&self) -> &FieldChange {
        &self.avatar_path
    }

    /// What happens to `avatar_url`.
    pub fn avatar_url(&self) -> &FieldChange {
        &self.avatar_url
    }
}

/// `None` → keep; blank → clear; otherwise the trimmed value checked by `check`.
fn change(
    value: Option<&str>,
    check: impl FnOnce(&str) -> Result<String, FieldError>,
) -> Result<FieldChange, FieldError> {
    match value.map(str::trim) {
        None => Ok(FieldChange::Keep),
        Some("") => Ok(FieldChange::Clear),
        Some(v) => check(v).map(FieldChange::Set),
    }
}

/// Whether `v` is an absolute `http`/`https` URL with a host.
fn is_http_url(v: &str) -> bool {
    match url::Url::parse(v) {
        Ok(u) => {
            matches!(u.scheme(), "http" | "https") && u.host_str().is_some_and(|h| !h.is_empty())
        }
        Err(_) => false,
    }
}

/// The outcome of [`save`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedProfile {
    /// The profile row as stored after the save.
    pub profile: profiles::Model,
    /// Object key of the avatar that the save left unreferenced, for the
    /// avatar-cleanup job (with `profile.avatar_generation`, the generation at
    /// that moment: see [`crate::accounts::avatar::cleanup_decision`]); `None` when no
    /// object became unreferenced.
    ///
    /// Since the only legal new path is `<user_id>/avatar` (a new upload
    /// overwrites that same object in place), this is `Some` only when:
    /// - the avatar is removed (new `avatar_path` cleared while one was stored), or
    /// - the stored path was some other key of this user (legacy or imported
    ///   data, e.g. `<user_id>/old.png`) and the save sets `<user_id>/avatar`.
    ///
    /// It is never the path just saved, and never a key outside the user's own
    /// `<user_id>/` prefix (such a stored value is not returned, so a cleanup
    /// can never delete another user's object).
    pub replaced_object: Option<String>,
}

/// Applies `input` to the profile of `user_id` and reports the avatar object
/// the save left unreferenced.
///
/// On PostgreSQL this is one statement: an `UPDATE … FROM (SELECT … FOR
/// UPDATE)` that locks the row, writes the changed fields and returns the
/// row together with its previous `avatar_path` (the common case, one round
/// trip). Otherwise, and when the row is missing, one transaction (row locked
/// with `FOR UPDATE` on PostgreSQL, `BEGIN IMMEDIATE` on SQLite) reads,
/// updates or creates it (the user row must exist: foreign key).
///
/// Errors: [`DbErr`] only; `DbErr::Custom` when `input` was validated for a
/// different user than `user_id` (a programming error, never user input).
pub async fn save<C>(db: &C, user_id: Uuid, input: ProfileInput) -> Result<SavedProfile, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    if input.user_id != user_id {
        return Err(DbErr::Custom(format!(
            "profile input validated for {} saved for {user_id}",
            input.user_id
        )));
    }
    let now = Utc::now();
    if db.get_database_backend() == DbBackend::Postgres {
        if let Some(saved) = update_returning_previous(db, user_id, &input, now).await? {
            return Ok(saved);
        }
    }
    save_in_transaction(db, user_id, input, now).await
}

/// [`save`], keeping the follow-up job of an object the save leaves
/// unreferenced in the job outbox ([`crate::base::outbox`]) in the same
/// transaction: `followup` gets the saved profile and the unreferenced path
/// and builds the job. Returns the save and the outbox row id (`Some` exactly
/// when `replaced_object` is). The row is due after
/// [`outbox::FOLLOWUP_HOLD`]: the caller pushes the job itself after the
/// commit and deletes the row, or makes it due at once when the push failed.
///
/// A save that keeps `avatar_path` cannot leave an object unreferenced and is
/// [`save`] alone (PostgreSQL's one-statement save); otherwise the save and
/// the outbox row share one transaction.
pub async fn save_with_followup<C, F>(
    db: &C,
    user_id: Uuid,
    input: ProfileInput,
    followup: F,
) -> Result<(SavedProfile, Option<Uuid>), DbErr>
where
    C: ConnectionTrait + TransactionTrait,
    F: FnOnce(&SavedProfile, &str) -> outbox::NewJob,
{
    if input.avatar_path == FieldChange::Keep {
        return Ok((save(db, user_id, input).await?, None));
    }
    let txn = begin_write(db).await?;
    let saved = save(&txn, user_id, input).await?;
    let row = match &saved.replaced_object {
        Some(path) => {
            let job = followup(&saved, path);
            Some(outbox::insert(&txn, &job, outbox::FOLLOWUP_HOLD).await?)
        }
        None => None,
    };
    txn.commit().await?;
    Ok((saved, row))
}

/// The object a save from `old` to `new` leaves unreferenced: the old path
/// when it changed and lies inside the user's own `<user_id>/` prefix.
fn unreferenced(user_id: Uuid, old: Option<String>, new: Option<&String>) -> Option<String> {
    old.filter(|p| Some(p) != new)
        .filter(|p| crate::accounts::avatar::is_own_path(user_id, p))
}

/// PostgreSQL's one-statement save; `None` when the profile row is missing.
async fn update_returning_previous<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    input: &ProfileInput,
    now: DateTime<Utc>,
) -> Result<Option<SavedProfile>, DbErr> {
    let mut values: Vec<Value> = vec![user_id.into(), now.into()];
    let mut sets = vec!["updated_at = $2".to_string()];
    for (column, change) in [
        ("full_name", &input.full_name),
        ("avatar_path", &input.avatar_path),
        ("avatar_url", &input.avatar_url),
    ] {
        match change {
            FieldChange::Keep => {}
            FieldChange::Clear => sets.push(format!("{column} = NULL")),
            FieldChange::Set(v) => {
                values.push(v.clone().into());
                sets.push(format!("{column} = ${}", values.len()));
            }
        }
    }
    let sql = format!(
        "UPDATE profiles AS p SET {} \
         FROM (SELECT user_id, avatar_path FROM profiles WHERE user_id = $1 FOR UPDATE) AS old \
         WHERE p.user_id = old.user_id \
         RETURNING p.user_id, p.full_name, p.avatar_path, p.avatar_url, p.created_at, \
         p.updated_at, p.avatar_generation, old.avatar_path AS previous_avatar_path",
        sets.join(", ")
    );
    let stmt = Statement::from_sql_and_values(DbBackend::Postgres, sql, values);
    let Some(row) = db.query_one_raw(stmt).await? else {
        return Ok(None);
    };
    let profile = profiles::Model::from_query_result(&row, "")?;
    let previous: Option<String> = row.try_get("", "previous_avatar_path")?;
    let replaced_object = unreferenced(user_id, previous, profile.avatar_path.as_ref());
    Ok(Some(SavedProfile {
        profile,
        replaced_object,
    }))
}

/// The portable save: read (locked), then update or insert, in one transaction.
async fn save_in_transaction<C>(
    db: &C,
    user_id: Uuid,
    input: ProfileInput,
    now: DateTime<Utc>,
) -> Result<SavedProfile, DbErr>
where
    C: ConnectionTrait + TransactionTrait,
{
    let txn = begin_write(db).await?;
    let mut select = profiles::Entity::find_by_id(user_id);
    if txn.get_database_backend() == DbBackend::Postgres {
        select = select.lock_exclusive();
    }
    let old = select.one(&txn).await?;

    let (profile, replaced_object) = match old {
        Some(old) => {
            let new_path = input.avatar_path.apply(old.avatar_path.clone());
            let replaced = unreferenced(user_id, old.avatar_path.clone(), new_path.as_ref());
            let full_name = input.full_name.apply(old.full_name.clone());
            let avatar_url = input.avatar_url.apply(old.avatar_url.clone());
            let mut am = old.into_active_model();
            am.full_name = Set(full_name);
            am.avatar_path = Set(new_path);
            am.avatar_url = Set(avatar_url);
            am.updated_at = Set(now);
            (am.update(&txn).await?, replaced)
        }
        None => {
            let am = profiles::ActiveModel {
                user_id: Set(user_id),
                full_name: Set(input.full_name.apply(None)),
                avatar_path: Set(input.avatar_path.apply(None)),
                avatar_url: Set(input.avatar_url.apply(None)),
                created_at: Set(now),
                updated_at: Set(now),
                avatar_generation: Set(0),
            };
            (am.insert(&txn).await?, None)
        }
    };
    txn.commit().await?;
    Ok(SavedProfile {
        profile,
        replaced_object,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid() -> Uuid {
        Uuid::parse_str("0191a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b").unwrap()
    }

    #[test]
    fn validates_fields() {
        let u = uid();
        let ok = ProfileInput::new(
            u,
            Some("  Ann  "),
            Some(&format!("{u}/avatar")),
            Some(" https://cdn.example.com/a.png "),
        )
        .unwrap();
        assert_eq!(ok.full_name(), &FieldChange::Set("Ann".into()));
        assert_eq!(ok.avatar_path(), &FieldChange::Set(format!("{u}/avatar")));
        assert_eq!(
            ok.avatar_url(),
            &FieldChange::Set("https://cdn.example.com/a.png".into())
        );

        let empty = ProfileInput::new(u, Some(" "), Some(""), Some("")).unwrap();
        assert_eq!(empty.full_name(), &FieldChange::Clear);
        assert_eq!(empty.avatar_path(), &FieldChange::Clear);
        let absent = ProfileInput::new(u, None, None, None).unwrap();
        assert_eq!(absent.avatar_url(), &FieldChange::Keep);

        let e = ProfileInput::new(u, Some(&"é".repeat(101)), None, None).unwrap_err();
        assert_eq!((e.field, e.code), ("full_name", "too_long"));
        assert!(ProfileInput::new(u, Some(&"é".repeat(100)), None, None).is_ok());

        let other = Uuid::now_v7();
        for bad in [
            format!("{other}/avatar"),
            format!("{u}/avatar2"),
            format!("{u}/../x/avatar"),
            format!("{}/avatar", u.to_string().to_uppercase()),
            "avatar".to_string(),
        ] {
            let e = ProfileInput::new(u, None, Some(&bad), None).unwrap_err();
            assert_eq!(
                (e.field, e.code),
                ("avatar_path", "invalid_avatar_path"),
                "{bad}"
            );
        }

        for bad in [
            "javascript:alert(1)",
            "ftp://x.com/a",
            "/relative.png",
            "https://",
            "data:image/png;base64,AAAA",
            "not a url",
        ] {
            let e = ProfileInput::new(u, None, None, Some(bad)).unwrap_err();
            assert_eq!((e.field, e.code), ("avatar_url", "invalid_url"), "{bad}");
        }
        let long = format!("https://x.com/{}", "a".repeat(2048));
        let e = ProfileInput::new(u, None, None, Some(&long)).unwrap_err();
        assert_eq!((e.field, e.code), ("avatar_url", "too_long"));
        assert!(ProfileInput::new(u, None, None, Some("http://localhost:8080/a")).is_ok());
    }
}
