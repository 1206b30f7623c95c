//! Time stamps: ISO-8601 in UTC with milliseconds (`2026-01-01T00:00:00.000Z`), written
//! and parsed by hand so that the crate needs no date library.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

const MILLIS_PER_DAY: u128 = 86_400_000;

/// Days since 1970-01-01 of the proleptic Gregorian date `year-month-day`.
///
/// Works in 400-year eras (146,097 days each) of years that start on March 1, so that
/// the leap day is the last day of its year.
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400; // 0..=399
    let month_from_march = i64::from((month + 9) % 12); // March = 0
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1; // 0..=365
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468 // 719,468 days from 0000-03-01 to 1970-01-01
}

/// The date `(year, month, day)` of a day count since 1970-01-01; the inverse of
/// [`days_from_civil`].
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let days = days + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097; // 0..=146,096
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153; // 0..=11
    let day = day_of_year - (153 * month_from_march + 2) / 5 + 1; // 1..=31
    let month = (month_from_march + 2) % 12 + 1;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Both are in small ranges (1..=12, 1..=31) by construction.
    (year, month as u32, day as u32)
}

/// `t` as `YYYY-MM-DDTHH:MM:SS.mmmZ` in UTC, milliseconds truncated (so a timestamp never
/// reads later than the moment it records).
pub fn iso8601(t: SystemTime) -> String {
    // A clock before 1970 (never set) reads as 1970-01-01.
    let millis = t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis();
    let days = i64::try_from(millis / MILLIS_PER_DAY).unwrap_or(i64::MAX);
    let of_day = millis % MILLIS_PER_DAY;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        of_day / 3_600_000,
        of_day / 60_000 % 60,
        of_day / 1000 % 60,
        of_day % 1000
    )
}

/// The current time as `iso8601` formats it.
pub fn now_iso8601() -> String {
    iso8601(SystemTime::now())
}

/// Parses `YYYY-MM-DDTHH:MM:SS[.fraction]Z`, where the fraction has 1 to 9 digits and
/// `+00:00` may stand for `Z`. Anything else (another offset, a lowercase `t`, month 13,
/// February 30, hour 24, second 60...) is `None`.
pub fn parse_iso8601(s: &str) -> Option<SystemTime> {
    let b = s.as_bytes();
    if b.len() < 20 || [b[4], b[7], b[10], b[13], b[16]] != *b"--T::" {
        return None;
    }
    let [year, month, day, hour, minute, second] =
        [0..4, 5..7, 8..10, 11..13, 14..16, 17..19].map(|at| digits(&b[at]));
    let (year, month, day) = (i64::from(year?), month?, day?);
    let (hour, minute, second) = (hour?, minute?, second?);
    // A day past its month's end (February 30), or month 0 or 13, comes back as
    // another date.
    let days = days_from_civil(year, month, day);
    if civil_from_days(days) != (year, month, day) || hour > 23 || minute > 59 || second > 59 {
        return None;
    }
    let tail = s.get(19..)?;
    let fraction = tail.strip_suffix('Z').or(tail.strip_suffix("+00:00"))?;
    let nanos = match fraction.strip_prefix('.') {
        None if fraction.is_empty() => 0,
        Some(f) if (1..=9).contains(&f.len()) => {
            digits(f.as_bytes())? * 10u32.pow(9 - f.len() as u32)
        }
        _ => return None,
    };
    let secs = days * 86_400 + i64::from(hour) * 3600 + i64::from(minute) * 60 + i64::from(second);
    let whole = Duration::from_secs(secs.unsigned_abs());
    let base = if secs >= 0 {
        UNIX_EPOCH.checked_add(whole)?
    } else {
        UNIX_EPOCH.checked_sub(whole)?
    };
    base.checked_add(Duration::from_nanos(u64::from(nanos)))
}

/// The value of a run of ASCII digits (at most 9, so it fits), or `None` if any byte is
/// not a digit.
fn digits(b: &[u8]) -> Option<u32> {
    b.iter().try_fold(0u32, |acc, &c| {
        c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64, millis: u64) -> SystemTime {
        let whole = Duration::from_secs(secs.unsigned_abs());
        let base = if secs >= 0 {
            UNIX_EPOCH + whole
        } else {
            UNIX_EPOCH - whole
        };
        base + Duration::from_millis(millis)
    }

    #[test]
    fn iso8601_known_values() {
        let cases = [
            (at(0, 0), "1970-01-01T00:00:00.000Z"),
            (at(951_782_400, 0), "2000-02-29T00:00:00.000Z"),
            (at(951_868_799, 999), "2000-02-29T23:59:59.999Z"),
            (at(1_767_225_600, 0), "2026-01-01T00:00:00.000Z"),
            (at(1_795_977_418, 123), "2026-11-29T18:36:58.123Z"),
            (at(4_107_456_000, 0), "2100-02-28T00:00:00.000Z"),
            (at(4_107_542_400, 0), "2100-03-01T00:00:00.000Z"),
            (at(253_402_300_799, 0), "9999-12-31T23:59:59.000Z"),
        ];
        for (t, want) in cases {
            assert_eq!(iso8601(t), want);
            assert_eq!(parse_iso8601(want), Some(t), "{want}");
        }
        // Sub-millisecond parts are truncated, never rounded up.
        assert_eq!(
            iso8601(at(0, 0) + Duration::from_micros(999_999)),
            "1970-01-01T00:00:00.999Z"
        );
        // Times before 1970 are read, but a clock before 1970 writes 1970-01-01.
        for (t, text) in [
            (at(-1, 0), "1969-12-31T23:59:59.000Z"),
            (at(-1, 500), "1969-12-31T23:59:59.500Z"),
        ] {
            assert_eq!(parse_iso8601(text), Some(t), "{text}");
            assert_eq!(iso8601(t), "1970-01-01T00:00:00.000Z");
        }
    }

    #[test]
    fn parse_iso8601_forms() {
        let base = at(1_795_977_418, 0);
        let cases: &[(&str, Option<SystemTime>)] = &[
            ("2026-11-29T18:36:58Z", Some(base)),
            ("2026-11-29T18:36:58+00:00", Some(base)),
            (
                "2026-11-29T18:36:58.1Z",
                Some(base + Duration::from_millis(100)),
            ),
            (
                "2026-11-29T18:36:58.123+00:00",
                Some(base + Duration::from_millis(123)),
            ),
            (
                "2026-11-29T18:36:58.000000001Z",
                Some(base + Duration::from_nanos(1)),
            ),
            ("2024-02-29T00:00:00Z", Some(at(1_709_164_800, 0))),
            ("2026-11-29T18:36:58.Z", None),
            ("2026-11-29T18:36:58.1234567890Z", None),
            ("2026-11-29T18:36:58", None),
            ("2026-11-29T18:36:58+01:00", None),
            ("2026-11-29T18:36:58z", None),
            ("2026-11-29t18:36:58Z", None),
            ("2026-11-29 18:36:58Z", None),
            ("2026-11-29T18:36:58ZZ", None),
            ("2026-11-29T18:36:58+00:00Z", None),
            ("2026-11-29T18:36:58.5Z+00:00", None),
            ("2026-13-01T00:00:00Z", None),
            ("2026-00-01T00:00:00Z", None),
            ("2026-01-00T00:00:00Z", None),
            ("2026-04-31T00:00:00Z", None),
            ("2026-02-29T00:00:00Z", None),
            ("2100-02-29T00:00:00Z", None),
            ("2026-01-01T24:00:00Z", None),
            ("2026-01-01T00:60:00Z", None),
            ("2026-01-01T00:00:60Z", None),
            ("+026-01-01T00:00:00Z", None),
            ("2026-1-01T00:00:00Z", None),
            ("2026-01-01T00:00:0aZ", None),
            ("", None),
            ("yesterday", None),
        ];
        for (s, want) in cases {
            assert_eq!(parse_iso8601(s), *want, "{s:?}");
        }
    }

    #[test]
    fn iso8601_round_trips_now() {
        let now = now_iso8601();
        let parsed = parse_iso8601(&now).unwrap();
        assert_eq!(iso8601(parsed), now);
        let drift = SystemTime::now().duration_since(parsed).unwrap();
        assert!(drift < Duration::from_secs(60));
    }

    #[test]
    fn civil_day_conversions_agree_over_centuries() {
        for days in (-800_000..800_000).step_by(97) {
            let (y, m, d) = civil_from_days(days);
            assert!((1..=12).contains(&m) && (1..=31).contains(&d));
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }
}
