//! The one pricing function (invariant 2): credits for `device_units` of a flavor
//! over an admitted time span, at a class rate in micro-credits per device-hour.
//!
//! Rounding rule: **floor of the cumulative price since the admission anchor**.
//! The price of `[start, end)` for an admission that started at `anchor` is
//! `C(end - anchor) - C(start - anchor)` with
//! `C(s) = floor(rate × units × s / 3600)` micro-credits. Because the
//! differences telescope, posting `[a, b)` and `[b, c)` separately equals posting
//! `[a, c)` at once, however a running workload's usage is split into posts; the
//! whole admission is under-charged by less than one micro-credit and never
//! over-charged. All arithmetic is integer (u128 intermediates); overflow is an
//! error, never a panic or a wrap.

use crate::api::CreditRate;
use crate::api::Credits;
use crate::k8s::names::glob_match;

/// Seconds per hour, the rate's time unit.
pub const SECONDS_PER_HOUR: u128 = 3600;

/// A rate in micro-credits per device-hour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Rate(pub u64);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PricingError {
    #[error(
        "pricing overflow: {units} device units × {rate} micro-credits/device-hour × {seconds} s does not fit a 64-bit micro-credit amount"
    )]
    Overflow { units: u64, rate: u64, seconds: u64 },
    #[error(
        "interval [{start}, {end}) with admission anchor {anchor} is not ordered (need anchor ≤ start ≤ end, unix seconds)"
    )]
    BadInterval { anchor: i64, start: i64, end: i64 },
    #[error("{what} {value:?} is not a usable credit rate: {problem}")]
    BadRate {
        /// The field, e.g. `spec.credits.modelOverrides[1].perDeviceHour`.
        what: String,
        value: String,
        /// What is wrong and how to fix it.
        problem: String,
    },
}

/// The largest rate, 999999999.999999 credits per device-hour: a year (366 days)
/// of one device at this rate still fits the ledger's signed 64-bit micro-credit
/// amounts. The CRD's CEL rule allows at most 9 integer digits for the same reason.
pub const MAX_RATE: Rate = Rate(999_999_999_999_999);

/// The cumulative price of `seconds` of `device_units` at `rate`, floored to the
/// micro-credit. Also the price a quota view shows for a given horizon.
pub fn cumulative(rate: Rate, device_units: u64, seconds: u64) -> Result<Credits, PricingError> {
    let overflow = || PricingError::Overflow {
        units: device_units,
        rate: rate.0,
        seconds,
    };
    let micros = u128::from(rate.0)
        .checked_mul(u128::from(device_units))
        .and_then(|v| v.checked_mul(u128::from(seconds)))
        .ok_or_else(overflow)?
        / SECONDS_PER_HOUR;
    u64::try_from(micros).map(Credits).map_err(|_| overflow())
}

/// The price of the admitted span `[start, end)` (unix seconds) of an admission
/// that began at `anchor`. Split-additive: see the module documentation.
pub fn price_interval(
    rate: Rate,
    device_units: u64,
    anchor: i64,
    start: i64,
    end: i64,
) -> Result<Credits, PricingError> {
    if !(anchor <= start && start <= end) {
        return Err(PricingError::BadInterval { anchor, start, end });
    }
    // anchor <= start <= end, so the differences are non-negative and fit u64.
    let to_start = start.abs_diff(anchor);
    let to_end = end.abs_diff(anchor);
    let hi = cumulative(rate, device_units, to_end)?;
    let lo = cumulative(rate, device_units, to_start)?;
    Ok(Credits(hi.0 - lo.0))
}

/// The rate for a device `model` of a class: the first model override whose glob
/// matches, else the class's `perDeviceHour`.
pub fn resolve_rate(credits: &CreditRate, model: &str) -> Result<Rate, PricingError> {
    for (i, o) in credits.model_overrides.iter().enumerate() {
        if glob_match(&o.model, model) {
            return parse_rate(
                &format!("spec.credits.modelOverrides[{i}].perDeviceHour"),
                &o.per_device_hour,
            );
        }
    }
    parse_rate("spec.credits.perDeviceHour", &credits.per_device_hour)
}

/// Every rate field of a class that cannot price: `(field, what is wrong and the
/// fix)`. Empty when every rate parses and is at most [`MAX_RATE`]. The planner
/// marks such a class Invalid with these, and the credit check rejects Workloads
/// priced by it with them: a bad rate is never read as zero or skipped.
pub fn rate_errors(credits: &CreditRate) -> Vec<(String, String)> {
    let overrides = credits.model_overrides.iter().enumerate().map(|(i, o)| {
        (
            format!("spec.credits.modelOverrides[{i}].perDeviceHour"),
            &o.per_device_hour,
        )
    });
    std::iter::once((
        "spec.credits.perDeviceHour".to_string(),
        &credits.per_device_hour,
    ))
    .chain(overrides)
    .filter_map(|(field, value)| read_rate(value).err().map(|problem| (field, problem)))
    .collect()
}

fn parse_rate(what: &str, value: &str) -> Result<Rate, PricingError> {
    read_rate(value).map_err(|problem| PricingError::BadRate {
        what: what.to_string(),
        value: value.to_string(),
        problem,
    })
}

/// A rate field's value, or what is wrong with it and how to fix it.
fn read_rate(value: &str) -> Result<Rate, String> {
    let credits = value.parse::<Credits>().map_err(|e| e.to_string())?;
    if credits.0 > MAX_RATE.0 {
        return Err(format!(
            "{value:?} credits per device-hour is above the largest rate, {}: a year of one device must fit the ledger's amounts; use a smaller credit unit",
            Credits(MAX_RATE.0)
        ));
    }
    Ok(Rate(credits.0))
}

/// The rate-card version recorded on every entry: a stable 64-bit FNV-1a hash of
/// the class's credit spec (rates normalised to micro-credits, overrides in order)
/// and the class's generation, printed as `rc-<16 hex digits>`. It changes
/// whenever a rate changes and is the same on every machine and release.
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
    format!("rc-{:016x}", fnv1a64(canon.as_bytes()))
}

/// 64-bit FNV-1a: tiny, stable across platforms and releases.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ModelRate;
    use proptest::prelude::*;

    #[test]
    fn one_device_hour_at_rate() {
        assert_eq!(
            cumulative(Rate(4_000_000), 1, 3600).unwrap(),
            Credits::whole(4)
        );
        assert_eq!(
            cumulative(Rate(4_000_000), 8, 1800).unwrap(),
            Credits::whole(16)
        );
        // 1 second of 1 device at 1 credit/h = 277.77.. micro -> floor 277.
        assert_eq!(cumulative(Rate(1_000_000), 1, 1).unwrap(), Credits(277));
    }

    #[test]
    fn split_posts_equal_one_post() {
        let r = Rate(1_000_000);
        let whole = price_interval(r, 1, 0, 0, 3).unwrap();
        let parts: u64 = (0..3)
            .map(|s| price_interval(r, 1, 0, s, s + 1).unwrap().0)
            .sum();
        assert_eq!(whole.0, parts);
        assert_eq!(whole, Credits(833));
    }

    #[test]
    fn overflow_is_an_error() {
        let e = cumulative(Rate(u64::MAX), u64::MAX, u64::MAX).unwrap_err();
        assert!(matches!(e, PricingError::Overflow { .. }), "{e}");
        assert!(cumulative(Rate(u64::MAX), 1, 3601).is_err());
        assert!(price_interval(Rate(1), 1, 10, 5, 20).is_err());
    }

    #[test]
    fn overrides_first_match_wins() {
        let spec = CreditRate {
            per_device_hour: "2".into(),
            model_overrides: vec![
                ModelRate {
                    model: "*H100*".into(),
                    per_device_hour: "6".into(),
                },
                ModelRate {
                    model: "NVIDIA-*".into(),
                    per_device_hour: "3".into(),
                },
            ],
        };
        assert_eq!(
            resolve_rate(&spec, "NVIDIA-H100-80GB-HBM3").unwrap(),
            Rate(6_000_000)
        );
        assert_eq!(resolve_rate(&spec, "NVIDIA-A100").unwrap(), Rate(3_000_000));
        assert_eq!(resolve_rate(&spec, "MI300X").unwrap(), Rate(2_000_000));
        let bad = CreditRate {
            per_device_hour: "-1".into(),
            model_overrides: vec![],
        };
        assert!(
            resolve_rate(&bad, "x")
                .unwrap_err()
                .to_string()
                .contains("perDeviceHour")
        );
    }

    #[test]
    fn rates_above_the_largest_are_errors_naming_the_field_and_fix() {
        let spec = CreditRate {
            per_device_hour: "999999999.999999".into(),
            model_overrides: vec![
                ModelRate {
                    model: "*H100*".into(),
                    per_device_hour: "1000000000".into(),
                },
                ModelRate {
                    model: "*A100*".into(),
                    per_device_hour: "two".into(),
                },
            ],
        };
        assert_eq!(resolve_rate(&spec, "MI300X").unwrap(), MAX_RATE);
        let errors = rate_errors(&spec);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].0, "spec.credits.modelOverrides[0].perDeviceHour");
        assert!(
            errors[0].1.contains("largest rate, 999999999.999999"),
            "{errors:?}"
        );
        assert_eq!(errors[1].0, "spec.credits.modelOverrides[1].perDeviceHour");
        assert!(errors[1].1.contains("e.g. \"2.5\""), "{errors:?}");
        let e = resolve_rate(&spec, "NVIDIA-H100").unwrap_err().to_string();
        assert!(
            e.contains("spec.credits.modelOverrides[0].perDeviceHour") && e.contains("smaller"),
            "{e}"
        );
        // The largest rate prices a year of one device within the ledger's i64.
        let year = cumulative(MAX_RATE, 1, 366 * 24 * 3600).unwrap();
        assert!(i64::try_from(year.0).is_ok());
    }

    #[test]
    fn rate_card_is_stable_and_sensitive() {
        let a = CreditRate {
            per_device_hour: "2.5".into(),
            model_overrides: vec![],
        };
        let b = CreditRate {
            per_device_hour: "2.50".into(),
            model_overrides: vec![],
        };
        let c = CreditRate {
            per_device_hour: "2.6".into(),
            model_overrides: vec![],
        };
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
        // Pinned: the version must never change between releases.
        assert_eq!(
            rate_card_version(&a, Some(1)),
            rate_card_version(&a, Some(1))
        );
        assert!(rate_card_version(&a, None).starts_with("rc-"));
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    proptest! {
        #[test]
        fn additive_over_any_split(rate in 0u64..100_000_000_000, units in 0u64..10_000,
                                   anchor in -1_000_000_000i64..2_000_000_000,
                                   cuts in proptest::collection::vec(0i64..10_000_000, 0..12),
                                   len in 0i64..10_000_000) {
            let end = anchor + len;
            let mut pts: Vec<i64> = cuts.into_iter().map(|c| anchor + c % (len + 1)).collect();
            pts.push(anchor);
            pts.push(end);
            pts.sort_unstable();
            let r = Rate(rate);
            let whole = price_interval(r, units, anchor, anchor, end).unwrap();
            let sum: u64 = pts.windows(2)
                .map(|w| price_interval(r, units, anchor, w[0], w[1]).unwrap().0)
                .sum();
            prop_assert_eq!(whole.0, sum);
            // Never more than the exact price, less by under one micro-credit.
            let exact_num = u128::from(rate) * u128::from(units) * (len as u128);
            prop_assert!(u128::from(whole.0) * 3600 <= exact_num);
            prop_assert!(exact_num < (u128::from(whole.0) + 1) * 3600);
        }

        #[test]
        fn monotone(rate in 0u64..1_000_000_000, units in 0u64..100_000, s in 0u64..100_000_000, d in 0u64..100_000_000) {
            let a = cumulative(Rate(rate), units, s).unwrap();
            let b = cumulative(Rate(rate), units, s + d).unwrap();
            prop_assert!(a <= b);
            let c = cumulative(Rate(rate), units + 1, s).unwrap();
            prop_assert!(a <= c);
        }

        #[test]
        fn rate_errors_agree_with_resolve_rate(base in "[0-9]{1,12}(\\.[0-9]{1,7})?|[a-z-]{0,4}",
                                                over in "[0-9]{1,12}(\\.[0-9]{1,6})?") {
            let spec = CreditRate {
                per_device_hour: base,
                model_overrides: vec![ModelRate { model: "X*".into(), per_device_hour: over }],
            };
            let errors = rate_errors(&spec);
            let fields: Vec<&str> = errors.iter().map(|(f, _)| f.as_str()).collect();
            prop_assert_eq!(resolve_rate(&spec, "other").is_err(), fields.contains(&"spec.credits.perDeviceHour"));
            prop_assert_eq!(resolve_rate(&spec, "X1").is_err(),
                fields.contains(&"spec.credits.modelOverrides[0].perDeviceHour"));
            if let Ok(rate) = resolve_rate(&spec, "other") {
                prop_assert!(rate <= MAX_RATE);
            }
        }

        #[test]
        fn never_panics(rate: u64, units: u64, anchor: i64, start: i64, end: i64) {
            let _ = cumulative(Rate(rate), units, end as u64);
            let _ = price_interval(Rate(rate), units, anchor, start, end);
        }
    }
}
