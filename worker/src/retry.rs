//! Retry schedule of jobs that failed transiently: exponential backoff with
//! jitter over a horizon, the same on both queue backends.
//!
//! apalis-redis retries a failed job `attempt` seconds later, 25 times, and
//! apalis-sqlite retries at once; neither survives an outage of more than a few
//! minutes. So a job attempt that fails transiently is acknowledged and a new
//! task carrying the same job (and its [`RetryState`]: the original job id as
//! idempotency key, the attempt count, the delay spent so far) is scheduled
//! [`RetryPolicy::next_delay`] later. Once the delays add up to the horizon the
//! next transient failure dead-letters the job with its last error.
//!
//! The horizon is measured as the sum of the scheduled delays, not by comparing
//! the clock of the worker that made the first attempt with another one's.

use std::time::Duration;

use entity::Settings;
use serde::{Deserialize, Serialize};

/// How retries are spaced (`JOB_RETRY_BASE_SECS`, `JOB_RETRY_MAX_DELAY_SECS`,
/// `JOB_RETRY_HORIZON_SECS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Delay before the first retry; doubles per failed attempt.
    pub base: Duration,
    /// Cap on one delay.
    pub max_delay: Duration,
    /// Total delay after which a transient failure dead-letters the job.
    pub horizon: Duration,
}

impl RetryPolicy {
    /// The policy the settings describe.
    pub fn from_settings(s: &Settings) -> Self {
        RetryPolicy {
            base: s.job_retry_base,
            max_delay: s.job_retry_max_delay,
            horizon: s.job_retry_horizon,
        }
    }

    /// Delay before the retry that follows failed attempt number `failed_attempt`
    /// (1-based), without jitter: `base · 2^(failed_attempt − 1)`, capped at `max_delay`.
    pub fn nominal_delay(&self, failed_attempt: u32) -> Duration {
        let exp = failed_attempt.saturating_sub(1).min(32);
        self.base
            .checked_mul(1u32 << exp.min(31))
            .unwrap_or(self.max_delay)
            .min(self.max_delay)
    }

    /// [`RetryPolicy::nominal_delay`] with "equal jitter": uniformly in
    /// `[nominal / 2, nominal]` as `jitter` goes from 0 to 1 (clamped), so retries
    /// of many jobs that failed together spread out instead of arriving in a wave.
    pub fn delay(&self, failed_attempt: u32, jitter: f64) -> Duration {
        let nominal = self.nominal_delay(failed_attempt);
        let j = if jitter.is_finite() {
            jitter.clamp(0.0, 1.0)
        } else {
            0.0
        };
        nominal / 2 + (nominal / 2).mul_f64(j)
    }

    /// What to do after failed attempt `failed_attempt` of a job whose retries
    /// have already waited `delayed` in total: `Some(delay)` to retry after
    /// `delay` (never past the horizon: the last retry runs when the horizon is
    /// reached), `None` to dead-letter it (the horizon is spent).
    pub fn next_delay(
        &self,
        failed_attempt: u32,
        delayed: Duration,
        jitter: f64,
    ) -> Option<Duration> {
        if delayed >= self.horizon {
            return None;
        }
        Some(
            self.delay(failed_attempt, jitter)
                .min(self.horizon - delayed),
        )
    }
}

/// Retry bookkeeping carried in a job's payload (`"retry"` key of the queued JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryState {
    /// The id the job got when first queued; the idempotency key towards
    /// providers (the email API's `Idempotency-Key`) on every attempt.
    pub idempotency_key: String,
    /// This attempt's number (1 = first attempt).
    pub attempt: u32,
    /// Sum of the retry delays scheduled so far, in milliseconds.
    pub delayed_ms: u64,
}

impl RetryState {
    /// The state of a job queued for the first time (or redriven) under `id`.
    pub fn first(id: &str) -> Self {
        RetryState {
            idempotency_key: id.to_string(),
            attempt: 1,
            delayed_ms: 0,
        }
    }

    /// The state of the retry scheduled `delay` after this attempt.
    pub fn next(&self, delay: Duration) -> Self {
        RetryState {
            idempotency_key: self.idempotency_key.clone(),
            attempt: self.attempt.saturating_add(1),
            delayed_ms: self
                .delayed_ms
                .saturating_add(delay.as_millis().min(u64::MAX as u128) as u64),
        }
    }

    /// Total retry delay so far.
    pub fn delayed(&self) -> Duration {
        Duration::from_millis(self.delayed_ms)
    }
}

/// A random jitter in `[0, 1)`.
pub fn random_jitter() -> f64 {
    rand::random::<f64>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            base: Duration::from_secs(10),
            max_delay: Duration::from_secs(3600),
            horizon: Duration::from_secs(86_400),
        }
    }

    #[test]
    fn nominal_delay_doubles_from_the_base() {
        let p = policy();
        assert_eq!(p.nominal_delay(1), Duration::from_secs(10));
        assert_eq!(p.nominal_delay(2), Duration::from_secs(20));
        assert_eq!(p.nominal_delay(3), Duration::from_secs(40));
        assert_eq!(p.nominal_delay(9), Duration::from_secs(2560));
    }

    #[test]
    fn delays_are_monotone_and_capped() {
        let p = policy();
        for j in [0.0, 0.3, 0.999, 1.0] {
            let mut prev = Duration::ZERO;
            for attempt in 1..=200 {
                let d = p.delay(attempt, j);
                assert!(d >= prev, "attempt {attempt}, jitter {j}: {d:?} < {prev:?}");
                assert!(d <= p.max_delay, "attempt {attempt}: {d:?} over the cap");
                prev = d;
            }
            assert!(prev >= p.max_delay / 2, "the cap is reached");
        }
        // No overflow at absurd attempt numbers.
        assert_eq!(p.nominal_delay(u32::MAX), p.max_delay);
    }

    #[test]
    fn jitter_stays_within_half_and_full_nominal() {
        let p = policy();
        for attempt in 1..=20 {
            let n = p.nominal_delay(attempt);
            assert_eq!(p.delay(attempt, 0.0), n / 2);
            assert_eq!(p.delay(attempt, 1.0), n);
            for _ in 0..100 {
                let d = p.delay(attempt, random_jitter());
                assert!(d >= n / 2 && d <= n, "{d:?} outside [{:?}, {n:?}]", n / 2);
            }
        }
        // Out-of-range jitter is clamped, never panics.
        assert_eq!(p.delay(1, -3.0), Duration::from_secs(5));
        assert_eq!(p.delay(1, 7.0), Duration::from_secs(10));
        assert_eq!(p.delay(1, f64::NAN), Duration::from_secs(5));
    }

    #[test]
    fn the_horizon_ends_the_retries() {
        let p = policy();
        let mut state = RetryState::first("01JOB");
        let mut retries = 0;
        while let Some(d) = p.next_delay(state.attempt, state.delayed(), 1.0) {
            state = state.next(d);
            retries += 1;
            assert!(state.delayed() <= p.horizon);
            assert!(retries < 1000, "never ends");
        }
        // 10+20+…+2560 s = 5110 s, then 3600 s each until one day: 24 retries,
        // the last one clamped so it runs exactly at the horizon.
        assert_eq!(state.delayed(), p.horizon);
        assert_eq!(retries, 9 + 23);
        assert_eq!(state.idempotency_key, "01JOB", "the key never changes");
        assert_eq!(state.attempt, retries + 1);
    }

    #[test]
    fn a_zero_horizon_never_retries() {
        let p = RetryPolicy {
            horizon: Duration::ZERO,
            ..policy()
        };
        assert_eq!(p.next_delay(1, Duration::ZERO, 0.5), None);
    }

    #[test]
    fn retries_span_hours_not_minutes() {
        // An outage of six hours is survived with the defaults.
        let p = policy();
        assert!(p
            .next_delay(20, Duration::from_secs(6 * 3600), 0.0)
            .is_some());
    }
}
