//! The billing anchor (Stripe's `billing_cycle_anchor`): the day of the
//! month and the time of day, in `BILLING_TIME_ZONE`, on which a
//! subscription's periods end. A renewal ends on the anchor day of the
//! month after the current end, clamped to that month's last day and
//! restored after it: anchored on 31 January, the ends run 28 February,
//! 31 March, 30 April, 31 May (never 28 March, 28 April: the day is not
//! lost to a short month).
//!
//! Stored on the subscription (`billing_anchor_day`, `billing_anchor_time`).
//! Adding a whole renewal month keeps it; every other change of the period
//! end (a checkout, a plan change with its carry, time bought by an
//! outdated renewal, a take-back, a start after a lapse) re-anchors on the
//! new period ([`Anchor::of`]). A subscription stored before anchors were
//! (both columns `NULL`) is anchored on its current end.
//!
//! "One calendar month after `t`" everywhere in billing is
//! [`month_after`]: the anchor of `t` itself, one month on.

use chrono::{DateTime, Datelike, Months, NaiveDate, NaiveDateTime, NaiveTime, TimeZone, Utc};
use chrono_tz::Tz;

/// Day of the month (1–31) and time of day, in the billing time zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Anchor {
    /// 1–31; in a shorter month the month's last day.
    pub day: u32,
    /// Local time of day (microsecond precision, as stored).
    pub time: NaiveTime,
}

impl Anchor {
    /// The anchor on which `t` lies: its local day and time in `zone`.
    pub fn of(t: DateTime<Utc>, zone: Tz) -> Self {
        let local = t.with_timezone(&zone).naive_local();
        Self {
            day: local.day(),
            time: local.time(),
        }
    }

    /// The anchor stored as `day` and `time`, when both are set and the day
    /// is one of 1–31.
    pub fn stored(day: Option<i16>, time: Option<NaiveTime>) -> Option<Self> {
        let day = u32::try_from(day?).ok().filter(|d| (1..=31).contains(d))?;
        Some(Self { day, time: time? })
    }

    /// The period end one anchored month after `end`: the anchor's day
    /// (clamped to the month's last day) and time in the month after
    /// `end`'s local month.
    pub fn next_end(&self, end: DateTime<Utc>, zone: Tz) -> DateTime<Utc> {
        let local = end.with_timezone(&zone).naive_local();
        let first = first_of_month(local.date())
            .checked_add_months(Months::new(1))
            .expect("a month after a real date is representable");
        let date = first
            .with_day(self.day_in(first))
            .expect("a day within the month");
        resolve(date.and_time(self.time), zone)
    }

    /// Whether `t` is the instant of this anchor on its local day: the
    /// anchor's day (clamped to the month) at the anchor's time, resolved as
    /// [`Anchor::next_end`] resolves it. An end moved an hour later because
    /// a clock change skipped the anchor's time still lies on the anchor, so
    /// the next month returns to the anchor's own hour instead of
    /// re-anchoring an hour later for good.
    pub fn holds(&self, t: DateTime<Utc>, zone: Tz) -> bool {
        let date = t.with_timezone(&zone).date_naive();
        // The skipped time may resolve into the next local day.
        [Some(date), date.pred_opt()]
            .into_iter()
            .flatten()
            .any(|d| {
                d.day() == self.day_in(first_of_month(d))
                    && resolve(d.and_time(self.time), zone) == t
            })
    }

    /// The anchor's day in the month that starts on `first`: the day,
    /// clamped to that month's last.
    fn day_in(&self, first: NaiveDate) -> u32 {
        let last = first
            .checked_add_months(Months::new(1))
            .and_then(|d| d.pred_opt())
            .map_or(28, |d| d.day());
        self.day.min(last)
    }

    /// The day as stored (`SMALLINT`).
    pub fn day_column(&self) -> i16 {
        i16::try_from(self.day).unwrap_or(1)
    }
}

/// The anchor stored on `s`, if any.
pub fn of_subscription(s: &crate::entities::subscriptions::Model) -> Option<Anchor> {
    Anchor::stored(s.billing_anchor_day, s.billing_anchor_time)
}

/// One calendar month after `t` in `zone`: the same local day (clamped to
/// the next month's last day) and time.
pub fn month_after(t: DateTime<Utc>, zone: Tz) -> DateTime<Utc> {
    Anchor::of(t, zone).next_end(t, zone)
}

/// The first day of `d`'s month.
fn first_of_month(d: NaiveDate) -> NaiveDate {
    d.with_day(1).expect("every month has a first day")
}

/// The instant of local `at` in `zone`: the earlier of two in a repeated
/// hour, and for a time skipped by a clock change, the same time an hour
/// later (a period end is never moved before its month).
fn resolve(at: NaiveDateTime, zone: Tz) -> DateTime<Utc> {
    zone.from_local_datetime(&at)
        .earliest()
        .or_else(|| {
            zone.from_local_datetime(&(at + chrono::Duration::hours(1)))
                .earliest()
        })
        .map_or_else(|| Utc.from_utc_datetime(&at), |t| t.with_timezone(&Utc))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono_tz::Asia::Jakarta;

    fn jakarta(s: &str) -> DateTime<Utc> {
        Jakarta
            .from_local_datetime(&s.parse::<NaiveDateTime>().unwrap())
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn the_day_is_clamped_and_restored() {
        let a = Anchor::of(jakarta("2027-01-31T03:00:00.25"), Jakarta);
        assert_eq!(a.day, 31);
        let mut end = jakarta("2027-01-31T03:00:00.25");
        let mut ends = vec![];
        for _ in 0..5 {
            end = a.next_end(end, Jakarta);
            assert!(a.holds(end, Jakarta));
            ends.push(end);
        }
        assert_eq!(
            ends,
            [
                jakarta("2027-02-28T03:00:00.25"),
                jakarta("2027-03-31T03:00:00.25"),
                jakarta("2027-04-30T03:00:00.25"),
                jakarta("2027-05-31T03:00:00.25"),
                jakarta("2027-06-30T03:00:00.25"),
            ]
        );
        // A leap year's February.
        assert_eq!(
            a.next_end(jakarta("2028-01-31T03:00:00.25"), Jakarta),
            jakarta("2028-02-29T03:00:00.25")
        );
    }

    /// The day is the billing zone's: 31 January 03:00 in Jakarta is 30
    /// January in UTC, and its month ends on 28 February in Jakarta.
    #[test]
    fn the_month_is_counted_in_the_billing_zone() {
        let t = jakarta("2027-01-31T03:00:00");
        assert_eq!(t.day(), 30);
        assert_eq!(month_after(t, Jakarta), jakarta("2027-02-28T03:00:00"));
        // UTC would have given 28 February 20:00 UTC = 1 March in Jakarta.
        assert_ne!(
            month_after(t, Jakarta),
            t.checked_add_months(Months::new(1)).unwrap()
        );
    }

    #[test]
    fn a_clock_change_never_moves_an_end_before_its_month() {
        let berlin = chrono_tz::Europe::Berlin;
        // 02:30 on 28 March 2027 does not exist in Berlin.
        let a = Anchor {
            day: 28,
            time: NaiveTime::from_hms_opt(2, 30, 0).unwrap(),
        };
        let end = berlin
            .with_ymd_and_hms(2027, 2, 28, 2, 30, 0)
            .unwrap()
            .with_timezone(&Utc);
        let next = a.next_end(end, berlin);
        assert_eq!(
            next,
            berlin
                .with_ymd_and_hms(2027, 3, 28, 3, 30, 0)
                .unwrap()
                .with_timezone(&Utc)
        );
        // The moved end still lies on the anchor, so the month after it
        // returns to 02:30 (re-anchoring on 03:30 would keep the hour lost).
        assert!(a.holds(next, berlin));
        assert_eq!(
            a.next_end(next, berlin),
            berlin
                .with_ymd_and_hms(2027, 4, 28, 2, 30, 0)
                .unwrap()
                .with_timezone(&Utc)
        );
        // 03:30 on an ordinary day is not on a 02:30 anchor.
        let ordinary = berlin
            .with_ymd_and_hms(2027, 4, 28, 3, 30, 0)
            .unwrap()
            .with_timezone(&Utc);
        assert!(!a.holds(ordinary, berlin));
        // In the repeated hour (31 October 2027, 02:30 happens twice) the
        // end is the earlier one, and only that one lies on the anchor.
        let b = Anchor { day: 31, ..a };
        let autumn = b.next_end(
            berlin
                .with_ymd_and_hms(2027, 9, 30, 2, 30, 0)
                .unwrap()
                .with_timezone(&Utc),
            berlin,
        );
        assert!(b.holds(autumn, berlin));
        assert!(!b.holds(autumn + chrono::Duration::hours(1), berlin));
    }

    #[test]
    fn stored_anchors_are_checked() {
        let t = NaiveTime::from_hms_opt(1, 2, 3);
        assert_eq!(Anchor::stored(Some(31), t).map(|a| a.day), Some(31));
        assert_eq!(Anchor::stored(Some(0), t), None);
        assert_eq!(Anchor::stored(Some(32), t), None);
        assert_eq!(Anchor::stored(None, t), None);
        assert_eq!(Anchor::stored(Some(5), None), None);
    }
}
