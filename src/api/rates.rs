//! A class's credit rates, parsed once: every rate field read into a [`Rate`]
//! (micro-credits per device-hour) with the error of each field that cannot
//! price, the model overrides kept in order, and the rate-card version. The
//! planner marks a class whose rates do not parse Invalid with these errors, and
//! the credit check prices with the parsed [`ClassRates`]: no other code reads a
//! rate string.

use super::{CreditRate, Credits};
use crate::k8s::names::{fnv1a, glob_match};

/// A rate in micro-credits per device-hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(pub u64);

/// The largest rate, 999999999.999999 credits per device-hour: a year (366 days)
/// of one device at this rate still fits the ledger's signed 64-bit micro-credit
/// amounts. The CRD's CEL rule allows at most 9 integer digits for the same reason.
pub const MAX_RATE: Rate = Rate(999_999_999_999_999);

/// A rate field that cannot price.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?} is not a usable credit rate: {problem}")]
pub struct RateError {
    /// The field, e.g. `spec.credits.modelOverrides[1].perDeviceHour`.
    pub field: String,
    pub value: String,
    /// What is wrong and how to fix it.
    pub problem: String,
}

/// The parsed rates of one class.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassRates {
    per_device_hour: Rate,
    /// (model glob, rate), first match wins.
    model_overrides: Vec<(String, Rate)>,
    rate_card: String,
}

impl ClassRates {
    /// Every rate of `credits`, or the error of each field that cannot price.
    /// `generation` (the class's) goes into the rate-card version.
    pub fn parse(credits: &CreditRate, generation: Option<i64>) -> Result<Self, Vec<RateError>> {
        let mut errors = Vec::new();
        let mut read = |field: String, value: &str| match read_rate(value) {
            Ok(rate) => Some(rate),
            Err(problem) => {
                errors.push(RateError {
                    field,
                    value: value.to_string(),
                    problem,
                });
                None
            }
        };
        let per_device_hour = read(
            "spec.credits.perDeviceHour".to_string(),
            &credits.per_device_hour,
        );
        let model_overrides: Vec<Option<(String, Rate)>> = credits
            .model_overrides
            .iter()
            .enumerate()
            .map(|(i, o)| {
                let field = format!("spec.credits.modelOverrides[{i}].perDeviceHour");
                read(field, &o.per_device_hour).map(|rate| (o.model.clone(), rate))
            })
            .collect();
        match per_device_hour {
            Some(per_device_hour) if errors.is_empty() => Ok(ClassRates {
                per_device_hour,
                model_overrides: model_overrides.into_iter().flatten().collect(),
                rate_card: rate_card_version(credits, generation),
            }),
            _ => Err(errors),
        }
    }

    /// The rate of a device `model`: the first model override whose glob
    /// matches, else `perDeviceHour`.
    pub fn for_model(&self, model: &str) -> Rate {
        self.model_overrides
            .iter()
            .find(|(glob, _)| glob_match(glob, model))
            .map_or(self.per_device_hour, |(_, rate)| *rate)
    }

    /// The rate-card version recorded on every ledger entry priced with these rates.
    pub fn rate_card(&self) -> &str {
        &self.rate_card
    }
}

/// A rate field's value, or what is wrong with it and how to fix it.
fn read_rate(value: &str) -> Result<Rate, String> {
    let credits = value.parse::<Credits>().map_err(|e| e.to_string())?;
    // Nine integer digits as written, as the CRD's pattern says (leading zeros too).
    let integer_digits = value.split('.').next().map_or(0, str::len);
    if credits.0 > MAX_RATE.0 || integer_digits > 9 {
        return Err(format!(
            "{value:?} credits per device-hour is above the largest rate, {}: a year of one device must fit the ledger's amounts; use a smaller credit unit",
            Credits(MAX_RATE.0)
        ));
    }
    Ok(Rate(credits.0))
}

/// The rate-card version: a stable 64-bit FNV-1a hash of the class's credit spec
/// (rates normalised to micro-credits, overrides in order) and the class's
/// generation, printed as `rc-<16 hex digits>`. It changes whenever a rate
/// changes and is the same on every machine and release.
pub fn rate_card_version(credits: &CreditRate, generation: Option<i64>) -> String {
    let norm = |s: &str| match s.parse::<Credits>() {
        Ok(c) => c.0.to_string(),
        Err(_) => format!("raw:{s}"),
    };
    let mut canon = format!("v1;rate={}", norm(&credits.per_device_hour));
    for o in &credits.model_overrides {
        canon.push_str(&format!(
            ";override={}:{}={}",
            o.model.len(),
            o.model,
            norm(&o.per_device_hour)
        ));
    }
    canon.push_str(&format!(";generation={}", generation.unwrap_or(0)));
    format!("rc-{:016x}", fnv1a(canon.as_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelRate;
    use crate::ledger::pricing::cumulative;
    use proptest::prelude::*;

    fn rates(base: &str, overrides: &[(&str, &str)]) -> CreditRate {
        CreditRate {
            per_device_hour: base.into(),
            model_overrides: overrides
                .iter()
                .map(|(model, rate)| ModelRate {
                    model: model.to_string(),
                    per_device_hour: rate.to_string(),
                })
                .collect(),
        }
    }

    #[test]
    fn overrides_first_match_wins() {
        let spec = rates("2", &[("*H100*", "6"), ("NVIDIA-*", "3")]);
        let parsed = ClassRates::parse(&spec, None).unwrap();
        assert_eq!(parsed.for_model("NVIDIA-H100-80GB-HBM3"), Rate(6_000_000));
        assert_eq!(parsed.for_model("NVIDIA-A100"), Rate(3_000_000));
        assert_eq!(parsed.for_model("MI300X"), Rate(2_000_000));
        let errors = ClassRates::parse(&rates("-1", &[]), None).unwrap_err();
        assert!(
            errors[0].to_string().contains("perDeviceHour"),
            "{errors:?}"
        );
    }

    #[test]
    fn rates_above_the_largest_are_errors_naming_the_field_and_fix() {
        let largest = ClassRates::parse(&rates("999999999.999999", &[]), None).unwrap();
        assert_eq!(largest.for_model("MI300X"), MAX_RATE);
        let spec = rates(
            "999999999.999999",
            &[("*H100*", "1000000000"), ("*A100*", "two")],
        );
        // Every field that cannot price is named, not only the first.
        let errors = ClassRates::parse(&spec, None).unwrap_err();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(
            errors[0].field,
            "spec.credits.modelOverrides[0].perDeviceHour"
        );
        assert!(
            errors[0].problem.contains("largest rate, 999999999.999999"),
            "{errors:?}"
        );
        assert!(errors[0].to_string().contains("smaller"), "{errors:?}");
        assert_eq!(
            errors[1].field,
            "spec.credits.modelOverrides[1].perDeviceHour"
        );
        assert!(errors[1].problem.contains("e.g. \"2.5\""), "{errors:?}");
        // The largest rate prices a year of one device within the ledger's i64.
        let year = cumulative(MAX_RATE, 1, 366 * 24 * 3600).unwrap();
        assert!(i64::try_from(year.0).is_ok());
    }

    #[test]
    fn rate_card_is_stable_and_sensitive() {
        let a = rates("2.5", &[]);
        let b = rates("2.50", &[]);
        let c = rates("2.6", &[]);
        assert_eq!(
            rate_card_version(&a, Some(1)),
            rate_card_version(&b, Some(1))
        );
        assert_ne!(
            rate_card_version(&a, Some(1)),
            rate_card_version(&c, Some(1))
        );
        assert_ne!(
            rate_card_version(&a, Some(1)),
            rate_card_version(&a, Some(2))
        );
        assert!(rate_card_version(&a, None).starts_with("rc-"));
        assert_eq!(
            ClassRates::parse(&a, Some(1)).unwrap().rate_card(),
            rate_card_version(&a, Some(1))
        );
        // Pinned: entries already in ledgers carry this version; it must never
        // change between releases.
        assert_eq!(rate_card_version(&a, Some(1)), "rc-e6955e2734021656");
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    proptest! {
        #[test]
        fn each_field_parses_or_is_named(base in "[0-9]{1,12}(\\.[0-9]{1,7})?|[a-z-]{0,4}",
                                         over in "[0-9]{1,12}(\\.[0-9]{1,6})?") {
            let spec = rates(&base, &[("X*", &over)]);
            let alone = |v: &str| read_rate(v).is_ok();
            match ClassRates::parse(&spec, None) {
                Ok(parsed) => {
                    prop_assert!(alone(&base) && alone(&over));
                    prop_assert!(parsed.for_model("other") <= MAX_RATE);
                    prop_assert!(parsed.for_model("X1") <= MAX_RATE);
                }
                Err(errors) => {
                    let fields: Vec<&str> = errors.iter().map(|e| e.field.as_str()).collect();
                    prop_assert_eq!(!alone(&base), fields.contains(&"spec.credits.perDeviceHour"));
                    prop_assert_eq!(!alone(&over),
                        fields.contains(&"spec.credits.modelOverrides[0].perDeviceHour"));
                }
            }
        }
    }
}
