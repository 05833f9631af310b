//! Kubernetes timestamps (RFC 3339, UTC, second resolution) to and from unix
//! seconds, the unit kaccel's ledger and health history keep.

use jiff::Timestamp;

/// An RFC 3339 UTC timestamp for unix seconds (saturating to jiff's range).
pub fn rfc3339(secs: i64) -> String {
    Timestamp::from_second(secs)
        .unwrap_or(if secs < 0 {
            Timestamp::MIN
        } else {
            Timestamp::MAX
        })
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// Unix seconds of an RFC 3339 timestamp (`lastTransitionTime` and the like);
/// `None` when it does not parse.
pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<Timestamp>().ok().map(|t| t.as_second())
}

#[cfg(test)]
mod tests {
    use super::*;

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
