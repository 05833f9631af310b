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

use crate::api::Credits;
// Rates are parsed with the class (`api::rates`); the pricing math is here.
pub use crate::api::rates::{MAX_RATE, Rate};

/// Seconds per hour, the rate's time unit.
pub const SECONDS_PER_HOUR: u128 = 3600;

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
}

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

#[cfg(test)]
mod tests {
    use super::*;
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
        fn never_panics(rate: u64, units: u64, anchor: i64, start: i64, end: i64) {
            let _ = cumulative(Rate(rate), units, end as u64);
            let _ = price_interval(Rate(rate), units, anchor, start, end);
        }
    }
}
