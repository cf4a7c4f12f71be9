//! The AI rules without I/O: provider names, message roles, the input bound,
//! the reservation rule ([`grant`]), the charge, and the monthly window.

use chrono::{DateTime, Datelike, NaiveDate, TimeZone, Utc};
use sea_orm::{
    sea_query::Expr, ColumnTrait, ConnectionTrait, DbErr, EntityTrait, QueryFilter, QuerySelect,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::entities::ai_usage;

/// An AI provider (`provider` in requests and `ai_usage.provider`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Provider {
    /// OpenAI Chat Completions (`OPENAI_API_KEY`).
    Openai,
    /// Anthropic Messages API (`ANTHROPIC_API_KEY`).
    Anthropic,
    /// Any server speaking Chat Completions (`OPENAI_COMPATIBLE_BASE_URL`).
    OpenaiCompatible,
}

impl Provider {
    /// Every provider.
    pub const ALL: [Provider; 3] = [
        Provider::Openai,
        Provider::Anthropic,
        Provider::OpenaiCompatible,
    ];

    /// The wire name: `openai`, `anthropic`, `openai_compatible`.
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Openai => "openai",
            Provider::Anthropic => "anthropic",
            Provider::OpenaiCompatible => "openai_compatible",
        }
    }

    /// The provider with this wire name (exact, lower case).
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions.
    System,
    /// The person chatting.
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// `system`, `user` or `assistant`; anything else is `None`.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }

    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message as sent upstream: role and plain text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Author.
    pub role: Role,
    /// Text (UTF-8).
    pub content: String,
}

/// Total UTF-8 bytes of the messages' texts: what `AI_MAX_INPUT_BYTES` bounds.
pub fn input_bytes(messages: &[ChatMessage]) -> usize {
    messages.iter().map(|m| m.content.len()).sum()
}

/// Tokens counted for one message beyond its text (role and framing tokens:
/// OpenAI's chat format adds 3–4 per message; a safe margin for every provider).
pub const MESSAGE_OVERHEAD_TOKENS: u64 = 8;

/// Tokens counted once per request beyond its messages (the reply's priming
/// and the system slot).
pub const REQUEST_OVERHEAD_TOKENS: u64 = 8;

/// An upper bound of the input tokens the provider will count for `messages`:
/// the UTF-8 bytes of every text (a token of a byte-level tokenizer covers at
/// least one byte) plus [`MESSAGE_OVERHEAD_TOKENS`] per message and
/// [`REQUEST_OVERHEAD_TOKENS`].
pub fn input_bound(messages: &[ChatMessage]) -> u64 {
    let per_message = MESSAGE_OVERHEAD_TOKENS * messages.len() as u64;
    input_bytes(messages) as u64 + per_message + REQUEST_OVERHEAD_TOKENS
}

/// Tokens one request may reserve: `used` of `limit` are taken this month,
/// `input` is its [`input_bound`] and `max_output` the plan's output cap.
/// `0` when not even one output token fits (the quota's 429); otherwise
/// `input + max_output`, lowered to what is left, and the request's output
/// cap is the grant minus `input`. The Redis script and
/// [`crate::ai::quota::reserve_in_db`] apply the same rule atomically.
pub fn grant(used: u64, limit: u64, input: u64, max_output: u32) -> u64 {
    let left = limit.saturating_sub(used);
    if left > input {
        left.min(input + u64::from(max_output))
    } else {
        0
    }
}

/// The tokens one request is charged: `(input, output, estimated)`.
///
/// The provider's counts when it sent them (`reported`). A missing count is
/// charged at the reservation's upper bound, never guessed low: the input at
/// `input_bound` ([`input_bound`]); the output at the `relayed` bytes (a
/// token of a byte-level tokenizer covers at least one byte) when the answer
/// ended normally (`complete`), and otherwise at least `output_cap`, the cap
/// sent upstream: a request cut off (client gone, provider broke off) may
/// have been billed by the provider up to its cap, whatever reached the
/// client. `estimated` is whether a count is ours.
pub fn charge(
    reported: (Option<u64>, Option<u64>),
    input_bound: u64,
    output_cap: u32,
    relayed: usize,
    complete: bool,
) -> (i32, i32, bool) {
    let clamp = |n: u64| i32::try_from(n).unwrap_or(i32::MAX);
    let relayed = relayed as u64;
    let output = reported.1.unwrap_or(if complete {
        relayed
    } else {
        relayed.max(u64::from(output_cap))
    });
    (
        clamp(reported.0.unwrap_or(input_bound)),
        clamp(output),
        reported.0.is_none() || reported.1.is_none(),
    )
}

/// First instant of the calendar month (UTC) that contains `now`.
pub fn month_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let d = NaiveDate::from_ymd_opt(now.year(), now.month(), 1).expect("day 1 exists");
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists"))
}

/// First instant of the next calendar month (UTC): when the quota resets.
pub fn next_month_start(now: DateTime<Utc>) -> DateTime<Utc> {
    let (y, m) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    let d = NaiveDate::from_ymd_opt(y, m, 1).expect("day 1 exists");
    Utc.from_utc_datetime(&d.and_hms_opt(0, 0, 0).expect("midnight exists"))
}

/// The month key of the quota counter, `YYYYMM` (UTC).
pub fn month_key(now: DateTime<Utc>) -> String {
    format!("{:04}{:02}", now.year(), now.month())
}

/// The quota was used up: the figures of the 429 answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaExceeded {
    /// Tokens counted this month.
    pub used: u64,
    /// The plan's monthly tokens.
    pub limit: u64,
    /// The plan id.
    pub plan: String,
    /// When the quota resets (the next month's first instant, UTC).
    pub resets_at: DateTime<Utc>,
}

/// Checks `used` tokens against the plan's monthly `limit` (`None` =
/// unlimited): `used >= limit` is used up. (A request also needs room for its
/// input and one output token: [`grant`].)
pub fn check_quota(
    plan: &str,
    limit: Option<u64>,
    used: u64,
    now: DateTime<Utc>,
) -> Result<(), QuotaExceeded> {
    match limit {
        Some(limit) if used >= limit => Err(QuotaExceeded {
            used,
            limit,
            plan: plan.to_string(),
            resets_at: next_month_start(now),
        }),
        _ => Ok(()),
    }
}

/// Tokens (input + output) of `user_id` recorded since the first of the
/// month containing `now` (UTC).
pub async fn tokens_this_month<C: ConnectionTrait>(
    db: &C,
    user_id: Uuid,
    now: DateTime<Utc>,
) -> Result<u64, DbErr> {
    let sum: Option<Option<i64>> = ai_usage::Entity::find()
        .select_only()
        .column_as(
            Expr::cust("COALESCE(SUM(input_tokens + output_tokens), 0)"),
            "total",
        )
        .filter(ai_usage::Column::UserId.eq(user_id))
        .filter(ai_usage::Column::CreatedAt.gte(month_start(now)))
        .into_tuple()
        .one(db)
        .await?;
    Ok(sum.flatten().unwrap_or(0).max(0) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        s.parse().unwrap()
    }

    #[test]
    fn month_window_is_utc_calendar_month() {
        let now = at("2026-12-31T23:59:59Z");
        assert_eq!(month_start(now), at("2026-12-01T00:00:00Z"));
        assert_eq!(next_month_start(now), at("2027-01-01T00:00:00Z"));
        assert_eq!(month_key(now), "202612");
        assert_eq!(
            next_month_start(at("2026-02-10T00:00:00Z")),
            at("2026-03-01T00:00:00Z")
        );
    }

    #[test]
    fn quota_allows_below_the_limit_and_never_limits_unlimited_plans() {
        let now = at("2026-11-23T10:00:00Z");
        assert!(check_quota("FREE", Some(20_000), 19_999, now).is_ok());
        let e = check_quota("FREE", Some(20_000), 20_000, now).unwrap_err();
        assert_eq!((e.used, e.limit, e.plan.as_str()), (20_000, 20_000, "FREE"));
        assert_eq!(e.resets_at, at("2026-12-01T00:00:00Z"));
        assert!(check_quota("ULTIMATE", None, u64::MAX, now).is_ok());
    }

    #[test]
    fn a_grant_fits_the_input_and_the_output_cap_in_what_is_left() {
        // Room for all: input + the plan's cap.
        assert_eq!(grant(0, 20_000, 17, 2048), 2065);
        // Little left: all of it, the output cap being the rest after the input.
        assert_eq!(grant(19_900, 20_000, 17, 2048), 100);
        // Not one output token left: refused.
        assert_eq!(grant(19_983, 20_000, 17, 2048), 0);
        assert_eq!(grant(19_982, 20_000, 17, 2048), 18);
        assert_eq!(grant(25_000, 20_000, 17, 2048), 0);
    }

    #[test]
    fn names_and_estimates() {
        assert_eq!(
            Provider::parse("openai_compatible"),
            Some(Provider::OpenaiCompatible)
        );
        assert_eq!(Provider::parse("OpenAI"), None);
        assert_eq!(Role::parse("tool"), None);
        let m = |c: &str| ChatMessage {
            role: Role::User,
            content: c.into(),
        };
        // "héllo": 6 bytes, + 8 per message, + 8 per request.
        assert_eq!(input_bound(&[m("héllo")]), 22);
        assert_eq!(input_bound(&[m("a"), m("b")]), 26);
    }

    #[test]
    fn missing_counts_are_charged_at_the_reservations_bound() {
        // The provider's counts win.
        assert_eq!(
            charge((Some(9), Some(2)), 5016, 2048, 5, false),
            (9, 2, false)
        );
        // Cut off before the usage: the input bound and the output cap.
        assert_eq!(
            charge((None, None), 5016, 2048, 5, false),
            (5016, 2048, true)
        );
        // Anthropic's input came first; the output never did.
        assert_eq!(
            charge((Some(9), None), 5016, 2048, 5, false),
            (9, 2048, true)
        );
        // More relayed than the cap (a server that ignores it): the bytes.
        assert_eq!(charge((None, None), 10, 4, 30, false), (10, 30, true));
        // Ended normally without counts: one token per relayed byte.
        assert_eq!(charge((None, None), 10, 2048, 30, true), (10, 30, true));
    }
}
