//! Time as text: every format the project writes or reads, each written
//! once, on the `time` crate's well-known formats and format descriptions.
//! All are UTC.

use time::format_description::well_known::Rfc3339;
use time::macros::format_description;
use time::{Date, OffsetDateTime, UtcOffset};

/// The time now.
pub fn now() -> OffsetDateTime {
    OffsetDateTime::now_utc()
}

/// RFC 3339 as `time` writes it (`Z`, as many sub-second digits as the
/// time has): records, conversations, reflections, logs.
pub fn rfc3339(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(&Rfc3339)
        .unwrap_or_default()
}

/// [`rfc3339`] of the time now.
pub fn now_rfc3339() -> String {
    rfc3339(now())
}

/// An RFC 3339 time read from a file or a flag (`None` when it is not one).
pub fn parse_rfc3339(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

/// A `YYYY-MM-DD` day read from a flag (`None` when it is not one).
pub fn parse_day(s: &str) -> Option<Date> {
    Date::parse(s, format_description!("[year]-[month]-[day]")).ok()
}

/// RFC 3339 with exactly six sub-second digits: fixed width, so the audit
/// log's times compare as strings.
pub fn fixed_micros(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
        ))
        .unwrap_or_default()
}

/// JavaScript's `Date.prototype.toISOString()`: milliseconds, and a year
/// outside 0..=9999 signed with six digits.
pub fn js_iso(t: OffsetDateTime) -> String {
    let t = t.to_offset(UtcOffset::UTC);
    let rest = t
        .format(format_description!(
            "-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
        ))
        .unwrap_or_default();
    let year = t.year();
    match year {
        0..=9999 => format!("{year:04}{rest}"),
        i32::MIN..=-1 => format!("-{:06}{rest}", year.unsigned_abs()),
        _ => format!("+{year:06}{rest}"),
    }
}

/// The `<memory_metadata>` timestamp letta-code writes:
/// `2026-01-05 03:04:05 PM UTC+0000` (12-hour clock, year unpadded).
pub fn prompt_metadata(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(format_description!(
            "[year padding:none]-[month]-[day] [hour repr:12]:[minute]:[second] [period] UTC+0000"
        ))
        .unwrap_or_default()
}

/// RFC 3339 in whole seconds (`2026-12-02T07:30:00Z`): the one format
/// every table and line shows a person.
pub(crate) fn whole_seconds(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(format_description!(
            "[year]-[month]-[day]T[hour]:[minute]:[second]Z"
        ))
        .unwrap_or_default()
}

/// `YYYYMMDDhhmmss`: a time in a name (a ref, a file).
pub fn compact(t: OffsetDateTime) -> String {
    t.to_offset(UtcOffset::UTC)
        .format(format_description!(
            "[year][month][day][hour][minute][second]"
        ))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn each_format_writes_what_it_says() {
        let t = datetime!(2026-01-05 15:04:05.123456789 UTC);
        assert_eq!(rfc3339(t), "2026-01-05T15:04:05.123456789Z");
        assert_eq!(fixed_micros(t), "2026-01-05T15:04:05.123456Z");
        assert_eq!(js_iso(t), "2026-01-05T15:04:05.123Z");
        assert_eq!(prompt_metadata(t), "2026-01-05 03:04:05 PM UTC+0000");
        assert_eq!(compact(t), "20260105150405");
        assert_eq!(whole_seconds(t), "2026-01-05T15:04:05Z");
        let morning = datetime!(2026-12-06 00:30:00 +02:00);
        assert_eq!(prompt_metadata(morning), "2026-12-05 10:30:00 PM UTC+0000");
        assert_eq!(fixed_micros(morning), "2026-12-05T22:30:00.000000Z");
        assert_eq!(
            prompt_metadata(datetime!(2026-12-06 12:00:00 UTC)),
            "2026-12-06 12:00:00 PM UTC+0000"
        );
        assert_eq!(
            prompt_metadata(datetime!(0987-12-06 00:00:00 UTC)),
            "987-12-06 12:00:00 AM UTC+0000"
        );
        assert_eq!(
            js_iso(datetime!(0987-12-06 00:00:00 UTC)),
            "0987-12-06T00:00:00.000Z"
        );
    }

    /// The stamps letta-code writes, at the edges of the clock and the
    /// calendar (moved here from the compiler's tests).
    #[test]
    fn letta_codes_stamps_at_the_edges() {
        let cases = [
            (
                datetime!(2026-05-04 00:00:00 UTC),
                "2026-05-04 12:00:00 AM UTC+0000",
                "2026-05-04T00:00:00.000Z",
            ),
            (
                datetime!(2024-02-29 12:00:00 UTC),
                "2024-02-29 12:00:00 PM UTC+0000",
                "2024-02-29T12:00:00.000Z",
            ),
            (
                datetime!(1999-12-31 23:59:59.999 UTC),
                "1999-12-31 11:59:59 PM UTC+0000",
                "1999-12-31T23:59:59.999Z",
            ),
            (
                datetime!(0999-01-01 13:05:09 UTC),
                "999-01-01 01:05:09 PM UTC+0000",
                "0999-01-01T13:05:09.000Z",
            ),
        ];
        for (t, metadata, iso) in cases {
            assert_eq!(prompt_metadata(t), metadata);
            assert_eq!(js_iso(t), iso);
        }
    }

    #[test]
    fn what_is_written_reads_back() {
        let t = datetime!(2026-01-05 15:04:05.5 UTC);
        assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t));
        assert_eq!(parse_rfc3339(&fixed_micros(t)), Some(t));
        assert_eq!(parse_rfc3339("yesterday"), None);
        assert_eq!(parse_day("2026-01-05"), Some(t.date()));
        assert_eq!(parse_day("2026-13-05"), None);
    }
}
