//! AI rules without HTTP: the provider names, message roles, the input bound,
//! the monthly token quota (its window, its check, its figures) and the
//! `ai_usage` record written by the worker.
//!
//! Quota (decisions.md, "Plans"): input + output tokens recorded in `ai_usage`
//! since the first day of the month (UTC) against the plan's
//! `ai_tokens_per_month`; `None` (ULTIMATE) is unlimited.
//!
//! Reservation: before the upstream call a request reserves an upper bound of
//! what it may use ([`grant`]): its input at [`input_bound`] and its output
//! capped by what is left of the quota and the plan's `ai_max_output_tokens`.
//! The cap is sent upstream, so a provider that honours it never makes the
//! month's total pass the quota, however many requests run at once. The
//! reservation is held in a counter per user and month (Redis in the api, or
//! the `ai_quota_counters` table: [`crate::ai::quota`]) and settled with the
//! real tokens when the request ends ([`charge`]).

pub mod limits;
pub mod quota;
pub mod usage;
