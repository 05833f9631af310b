//! Kubernetes timestamps (RFC 3339, UTC, second resolution) to and from unix
//! seconds, the unit kaccel's ledger and health history keep.

use jiff::Timestamp;

/// An RFC 3339 UTC timestamp for unix seconds (saturating to jiff's range).
pub fn rfc3339(secs: i64) -> String {
    let mut out = String::with_capacity(20);
    push_rfc3339(&mut out, secs);
    out
}

/// The last second jiff represents (late on 9999-12-30); beyond it the
/// timestamp saturates.
fn last_second() -> i64 {
    Timestamp::MAX.as_second()
}

/// Appends [`rfc3339`]`(secs)` to `out`. The exports write several per row, so
/// the common range (1970 to 9999) is computed directly (days to civil date,
/// H. Hinnant's algorithm) instead of through jiff's formatter; the rest goes
/// through jiff, which saturates.
pub fn push_rfc3339(out: &mut String, secs: i64) {
    if !(0..=last_second()).contains(&secs) {
        let t = Timestamp::from_second(secs).unwrap_or(if secs < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        });
        out.push_str(&t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string());
        return;
    }
    let (days, second_of_day) = (secs / 86_400, secs % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    // Written into a fixed buffer, then appended once.
    let mut text = *b"0000-00-00T00:00:00Z";
    let mut digits = |at: usize, v: i64, width: usize| {
        let mut rest = v;
        for i in (at..at + width).rev() {
            text[i] = b'0' + (rest % 10) as u8;
            rest /= 10;
        }
    };
    digits(0, year, 4);
    digits(5, month, 2);
    digits(8, day, 2);
    digits(11, second_of_day / 3600, 2);
    digits(14, second_of_day / 60 % 60, 2);
    digits(17, second_of_day % 60, 2);
    out.push_str(std::str::from_utf8(&text).unwrap_or_default());
}

/// Unix seconds of an RFC 3339 timestamp (`lastTransitionTime` and the like);
/// `None` when it does not parse.
pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The direct computation writes what jiff's formatter writes, over
        /// the whole four-digit range and its edges.
        #[test]
        fn direct_formatting_agrees_with_jiff(
            secs in prop_oneof![
                0i64..=last_second(),
                (last_second() - 200_000)..=(last_second() + 10),
                -10i64..200_000,
            ]
        ) {
            let by_jiff = Timestamp::from_second(secs)
                .unwrap_or(if secs < 0 { Timestamp::MIN } else { Timestamp::MAX })
                .strftime("%Y-%m-%dT%H:%M:%SZ")
                .to_string();
            prop_assert_eq!(rfc3339(secs), by_jiff);
        }
    }

    #[test]
    fn round_trips_and_saturates() {
        assert_eq!(rfc3339(1_764_547_200), "2025-12-01T00:00:00Z");
        assert_eq!(parse_time("2025-12-01T00:00:00Z"), Some(1_764_547_200));
        assert_eq!(parse_time(&rfc3339(12_345)), Some(12_345));
        assert_eq!(parse_time("yesterday"), None);
        // Out of jiff's range: saturates rather than panics.
        assert!(rfc3339(i64::MAX).starts_with("9999-"));
        assert_eq!(
            parse_time(&rfc3339(i64::MIN)),
            parse_time(&rfc3339(i64::MIN + 1))
        );
    }
}
