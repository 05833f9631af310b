//! Exact decimals and device-time quantities, as the CSV and FOCUS rows print them.

pub(super) use crate::ledger::decimal::push_decimal;

/// Exact decimal of `num / 10^scale`, trailing zeros trimmed, signed.
pub(super) fn decimal(num: i128, scale: u32) -> String {
    let mut out = String::with_capacity(24);
    push_decimal(&mut out, num, scale);
    out
}

/// An exact decimal `units / 10^scale`: products of these are exact, so a cost
/// printed from one is exactly the product of the printed factors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Fixed {
    units: i128,
    scale: u32,
}

impl Fixed {
    pub(super) fn micros(units: impl Into<i128>) -> Fixed {
        Fixed {
            units: units.into(),
            scale: 6,
        }
    }

    pub(super) fn checked_mul(self, other: Fixed) -> Option<Fixed> {
        Some(Fixed {
            units: self.units.checked_mul(other.units)?,
            scale: self.scale + other.scale,
        })
    }
}

impl std::fmt::Display for Fixed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

impl Fixed {
    /// The decimal text ([`decimal`]; `to_string` without the second copy).
    pub(super) fn text(self) -> String {
        decimal(self.units, self.scale)
    }

    /// Appends the decimal text to `out`.
    pub(super) fn push_to(self, out: &mut String) {
        push_decimal(out, self.units, self.scale);
    }
}

/// Device-seconds of an interval (exact).
pub(super) fn device_seconds(units: u64, start: i64, end: i64) -> i128 {
    i128::from(units) * i128::from(end.saturating_sub(start).max(0))
}

/// Micro-device-hours of an interval, rounded half-up (device-seconds x 10^6 /
/// 3600, non-negative); None when that does not fit 128 bits (a damaged row: no
/// reservation lasts for 10^23 device-hours).
pub(super) fn micro_device_hours(units: u64, start: i64, end: i64) -> Option<i128> {
    let micro_seconds = device_seconds(units, start, end).checked_mul(1_000_000)?;
    Some(micro_seconds.checked_add(1800)? / 3600)
}
