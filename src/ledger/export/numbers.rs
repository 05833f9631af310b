//! Exact decimals and device-time quantities, as the CSV and FOCUS rows print them.

/// Exact decimal of `num / 10^scale`, trailing zeros trimmed, signed.
pub(super) fn decimal(num: i128, scale: u32) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(24);
    if num < 0 {
        out.push('-');
    }
    let m = num.unsigned_abs();
    let p = 10u128.pow(scale);
    // Exports print millions of these: 64-bit division when the value fits.
    let (int, frac) = match (u64::try_from(m), u64::try_from(p)) {
        (Ok(m), Ok(p)) => (u128::from(m / p), u128::from(m % p)),
        _ => (m / p, m % p),
    };
    let _ = write!(out, "{int}");
    if frac != 0 {
        let (mut frac, mut width) = (frac, scale as usize);
        while frac % 10 == 0 {
            frac /= 10;
            width -= 1;
        }
        let _ = write!(out, ".{frac:0width$}");
    }
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
