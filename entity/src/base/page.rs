//! Keyset pagination of the read API's lists: newest first by
//! `(created_at, id)`, and one opaque cursor for every list.
//!
//! A cursor is the position of the last row of a page,
//! `<created_at as Unix microseconds>.<id as 32 lower-case hex digits>`
//! ([`CURSOR_PATTERN`], which the OpenAPI schema states, so every string it
//! admits is a position). The next page holds the rows strictly after it in
//! the order `created_at DESC, id DESC`, so rows inserted meanwhile never
//! shift a page nor repeat a row. An empty cursor is the first page.

use chrono::{DateTime, Utc};
use sea_orm::{ColumnTrait, Condition};
use uuid::Uuid;

use crate::base::validate::FieldError;

/// Default page size.
pub const DEFAULT_LIMIT: u64 = 20;
/// Largest page size.
pub const MAX_LIMIT: u64 = 100;

/// What a `cursor` query parameter may be: empty (the first page) or a
/// position, `<Unix microseconds, at most 16 digits>.<32 lower-case hex
/// digits>`. Every match decodes ([`Cursor::decode`]).
pub const CURSOR_PATTERN: &str = r"^(?:-?[0-9]{1,16}\.[0-9a-f]{32})?$";

/// A position in a list: the last row of a page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cursor {
    /// The row's `created_at`.
    pub at: DateTime<Utc>,
    /// The row's id (breaks ties of `created_at`).
    pub id: Uuid,
}

impl Cursor {
    /// The text of this cursor (`next_cursor`).
    pub fn encode(&self) -> String {
        format!("{}.{}", self.at.timestamp_micros(), self.id.simple())
    }

    /// Parses a `next_cursor`: `None` for an empty one (the first page); a
    /// text [`CURSOR_PATTERN`] does not admit is 400 naming `cursor`.
    pub fn decode(text: &str) -> Result<Option<Self>, FieldError> {
        let bad = || {
            FieldError::new(
                "cursor",
                "invalid_cursor",
                "cursor is not a `next_cursor` of this list",
            )
        };
        if text.is_empty() {
            return Ok(None);
        }
        let (micros, id) = text.split_once('.').ok_or_else(bad)?;
        let digits = micros.strip_prefix('-').unwrap_or(micros);
        let hex = |c: char| c.is_ascii_digit() || ('a'..='f').contains(&c);
        if !(1..=16).contains(&digits.len())
            || !digits.chars().all(|c| c.is_ascii_digit())
            || id.len() != 32
            || !id.chars().all(hex)
        {
            return Err(bad());
        }
        let micros: i64 = micros.parse().map_err(|_| bad())?;
        let at = DateTime::<Utc>::from_timestamp_micros(micros).ok_or_else(bad)?;
        let id = Uuid::try_parse(id).map_err(|_| bad())?;
        Ok(Some(Cursor { at, id }))
    }

    /// The condition "after this cursor" in `created_at DESC, id DESC` order.
    pub fn after<C: ColumnTrait>(&self, created_at: C, id: C) -> Condition {
        Condition::any().add(created_at.lt(self.at)).add(
            Condition::all()
                .add(created_at.eq(self.at))
                .add(id.lt(self.id)),
        )
    }
}

/// A page size from the query: default [`DEFAULT_LIMIT`], 1 to
/// [`MAX_LIMIT`], else 400 naming `limit`.
pub fn limit(requested: Option<u64>) -> Result<u64, FieldError> {
    match requested {
        None => Ok(DEFAULT_LIMIT),
        Some(n) if (1..=MAX_LIMIT).contains(&n) => Ok(n),
        Some(_) => Err(FieldError::new(
            "limit",
            "invalid_parameter",
            format!("limit must be between 1 and {MAX_LIMIT}"),
        )),
    }
}

/// One page: its rows and the cursor of the next page (`None` on the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The rows, newest first.
    pub items: Vec<T>,
    /// Where the next page starts; `None` on the last page.
    pub next: Option<Cursor>,
}

impl<T> Page<T> {
    /// A page from `limit + 1` fetched rows: the extra row only says that a
    /// next page exists. `key` gives a row's `(created_at, id)`.
    pub fn from_rows(mut rows: Vec<T>, limit: u64, key: impl Fn(&T) -> Cursor) -> Self {
        let more = rows.len() as u64 > limit;
        rows.truncate(limit as usize);
        let next = if more { rows.last().map(key) } else { None };
        Page { items: rows, next }
    }

    /// The same page with its rows mapped.
    pub fn map<U>(self, f: impl FnMut(T) -> U) -> Page<U> {
        Page {
            items: self.items.into_iter().map(f).collect(),
            next: self.next,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_rejects_junk() {
        let c = Cursor {
            at: DateTime::<Utc>::from_timestamp_micros(1_764_000_000_123_456).unwrap(),
            id: Uuid::now_v7(),
        };
        assert_eq!(Cursor::decode(&c.encode()).unwrap(), Some(c));
        assert_eq!(Cursor::decode("").unwrap(), None, "empty: the first page");
        let re = regex::Regex::new(CURSOR_PATTERN).unwrap();
        assert!(re.is_match(&c.encode()));
        for edge in [
            format!("9999999999999999.{}", "f".repeat(32)),
            format!("-9999999999999999.{}", "0".repeat(32)),
            format!("0.{}", "a".repeat(32)),
        ] {
            assert!(re.is_match(&edge), "{edge}");
            assert!(Cursor::decode(&edge).unwrap().is_some(), "{edge}");
        }
        for junk in [
            "x",
            "!!!",
            "MTIz",
            "01JD5X9Q6Z8K4M2N7P3R5T1V9W",
            " 1.00000000000000000000000000000000",
            "1.0000000000000000000000000000000A",
            "12345678901234567.00000000000000000000000000000000",
            "+1.00000000000000000000000000000000",
            "1.0000000000000000000000000000000",
        ] {
            assert!(!re.is_match(junk), "{junk}");
            assert_eq!(Cursor::decode(junk).unwrap_err().field, "cursor", "{junk}");
        }
    }

    #[test]
    fn limits() {
        assert_eq!(limit(None).unwrap(), 20);
        assert_eq!(limit(Some(100)).unwrap(), 100);
        assert_eq!(limit(Some(0)).unwrap_err().field, "limit");
        assert_eq!(limit(Some(101)).unwrap_err().field, "limit");
    }

    #[test]
    fn pages() {
        let p = Page::from_rows(vec![1, 2, 3], 2, |n| Cursor {
            at: DateTime::<Utc>::from_timestamp_micros(*n).unwrap(),
            id: Uuid::nil(),
        });
        assert_eq!(p.items, vec![1, 2]);
        assert_eq!(p.next.unwrap().at.timestamp_micros(), 2);
        let p = Page::from_rows(vec![1, 2], 2, |_| unreachable!());
        assert_eq!(p.next, None);
    }
}
