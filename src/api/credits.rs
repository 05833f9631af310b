//! Credits as exact integers (micro-credits), parsed from and printed as decimal
//! strings. No floating point anywhere a credit is counted.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Micro-credits per credit.
pub const MICROS: u64 = 1_000_000;

/// A non-negative amount of credits with six decimal places, stored as micro-credits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Credits(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{value:?} is not a credit amount: write a non-negative decimal with at most 6 places, e.g. \"2.5\""
)]
pub struct CreditsParseError {
    pub value: String,
}

impl Credits {
    pub const ZERO: Credits = Credits(0);

    pub fn from_micros(micros: u64) -> Self {
        Credits(micros)
    }

    pub fn micros(self) -> u64 {
        self.0
    }

    pub fn whole(credits: u64) -> Self {
        Credits(credits.saturating_mul(MICROS))
    }
}

impl FromStr for Credits {
    type Err = CreditsParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || CreditsParseError {
            value: s.to_string(),
        };
        let (int, frac) = match s.split_once('.') {
            Some((i, f)) => (i, f),
            None => (s, ""),
        };
        if int.is_empty()
            || int.len() > 12
            || frac.len() > 6
            || !int.bytes().all(|b| b.is_ascii_digit())
            || !frac.bytes().all(|b| b.is_ascii_digit())
            || (s.contains('.') && frac.is_empty())
        {
            return Err(err());
        }
        let int: u64 = int.parse().map_err(|_| err())?;
        let mut frac_micros: u64 = 0;
        for (i, b) in frac.bytes().enumerate() {
            frac_micros += u64::from(b - b'0') * 10u64.pow(5 - i as u32);
        }
        int.checked_mul(MICROS)
            .and_then(|v| v.checked_add(frac_micros))
            .map(Credits)
            .ok_or_else(err)
    }
}

impl fmt::Display for Credits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let int = self.0 / MICROS;
        let frac = self.0 % MICROS;
        if frac == 0 {
            write!(f, "{int}")
        } else {
            let digits = format!("{frac:06}");
            write!(f, "{int}.{}", digits.trim_end_matches('0'))
        }
    }
}

impl Serialize for Credits {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Credits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_and_prints() {
        assert_eq!("2.5".parse::<Credits>().unwrap(), Credits(2_500_000));
        assert_eq!("0".parse::<Credits>().unwrap(), Credits(0));
        assert_eq!("0.000001".parse::<Credits>().unwrap(), Credits(1));
        assert_eq!(Credits(2_500_000).to_string(), "2.5");
        assert_eq!(Credits(3 * MICROS).to_string(), "3");
        assert_eq!(Credits(1).to_string(), "0.000001");
    }

    #[test]
    fn rejects_bad_amounts() {
        for bad in [
            "",
            "-1",
            "1.",
            ".5",
            "1.1234567",
            "abc",
            "1e3",
            " 1",
            "1,5",
            "+2",
        ] {
            assert!(bad.parse::<Credits>().is_err(), "{bad:?} accepted");
        }
    }

    proptest! {
        #[test]
        fn round_trips(micros in 0u64..999_999_999_999_999_999) {
            let c = Credits(micros);
            prop_assert_eq!(c.to_string().parse::<Credits>().unwrap(), c);
        }

        #[test]
        fn never_panics(s in ".{0,24}") {
            let _ = s.parse::<Credits>();
        }
    }
}
