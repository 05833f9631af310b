//! Kubernetes resource quantities (`8`, `3500m`, `64Gi`, `1e9`) parsed exactly, with
//! checked arithmetic: a value that does not fit is an error, never a wrap or a panic.
//!
//! The grammar is the one `k8s.io/apimachinery/pkg/api/resource` accepts:
//! `[+-]<digits>[.<digits>]<suffix>` where the suffix is a binary SI suffix
//! (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`n u m k M G T P E`, or none), or a
//! decimal exponent (`e3`, `E-2`). Like Kubernetes, fractional results are rounded
//! up when converted to a whole unit (CPU millicores, bytes); device counts must be
//! whole numbers.

use thiserror::Error;

/// A quantity that could not be read; names the offending value.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("invalid quantity {value:?}: {reason}")]
pub struct QuantityError {
    /// The value as given (shortened to 64 characters).
    pub value: String,
    pub reason: &'static str,
}

impl QuantityError {
    fn new(value: &str, reason: &'static str) -> Self {
        let value = if value.chars().count() > 64 {
            let mut v: String = value.chars().take(61).collect();
            v.push_str("...");
            v
        } else {
            value.to_string()
        };
        QuantityError { value, reason }
    }
}

/// Largest decimal exponent we evaluate; 10^38 is the largest power of ten in a u128.
const MAX_POW10: u32 = 38;

/// An exact, non-negative quantity: `numerator / 10^denominator_pow10`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Exact {
    numerator: u128,
    denominator_pow10: u32,
}

impl Exact {
    /// `self * unit`, rounded up to a whole number.
    fn ceil_times(self, unit: u128, raw: &str) -> Result<u128, QuantityError> {
        let n = self
            .numerator
            .checked_mul(unit)
            .ok_or_else(|| QuantityError::new(raw, "value is too large"))?;
        let d = pow10(self.denominator_pow10, raw)?;
        Ok(n / d + u128::from(n % d != 0))
    }

    /// `self * unit` if it is a whole number.
    fn exact_times(self, unit: u128, raw: &str) -> Result<u128, QuantityError> {
        let n = self
            .numerator
            .checked_mul(unit)
            .ok_or_else(|| QuantityError::new(raw, "value is too large"))?;
        let d = pow10(self.denominator_pow10, raw)?;
        if n % d != 0 {
            return Err(QuantityError::new(raw, "not a whole number"));
        }
        Ok(n / d)
    }
}

fn pow10(exp: u32, raw: &str) -> Result<u128, QuantityError> {
    if exp > MAX_POW10 {
        return Err(QuantityError::new(raw, "exponent out of range"));
    }
    10u128
        .checked_pow(exp)
        .ok_or_else(|| QuantityError::new(raw, "exponent out of range"))
}

/// Parse the full Kubernetes quantity grammar into an exact value.
fn parse_exact(raw: &str) -> Result<Exact, QuantityError> {
    if raw.is_empty() {
        return Err(QuantityError::new(raw, "empty value"));
    }
    let bytes = raw.as_bytes();
    let mut i = 0;
    let mut negative = false;
    if let Some(&c) = bytes.first()
        && (c == b'+' || c == b'-')
    {
        negative = c == b'-';
        i = 1;
    }

    // Mantissa: digits, optional '.', digits; at least one digit in total.
    let mut mantissa: u128 = 0;
    let mut frac_digits: u32 = 0;
    let mut digits = 0usize;
    let mut seen_dot = false;
    while i < bytes.len() {
        let c = bytes[i];
        if c.is_ascii_digit() {
            // Leading zeros and trailing fractional zeros cost nothing; any other
            // digit beyond u128 precision is an overflow.
            mantissa = mantissa
                .checked_mul(10)
                .and_then(|m| m.checked_add(u128::from(c - b'0')))
                .ok_or_else(|| QuantityError::new(raw, "too many digits"))?;
            if seen_dot {
                frac_digits = frac_digits
                    .checked_add(1)
                    .ok_or_else(|| QuantityError::new(raw, "too many digits"))?;
            }
            digits += 1;
        } else if c == b'.' && !seen_dot {
            seen_dot = true;
        } else {
            break;
        }
        i += 1;
    }
    if digits == 0 {
        return Err(QuantityError::new(raw, "no digits"));
    }
    if negative && mantissa != 0 {
        return Err(QuantityError::new(raw, "negative value"));
    }

    // Suffix.
    let suffix = &raw[i..];
    let (pow10_exp, binary_shift): (i64, u32) = match suffix {
        "" => (0, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        s if s.starts_with(['e', 'E']) => {
            let exp = &s[1..];
            let (sign, digits) = match exp.as_bytes().first() {
                Some(b'-') => (-1i64, &exp[1..]),
                Some(b'+') => (1, &exp[1..]),
                _ => (1, exp),
            };
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) || digits.len() > 4
            {
                return Err(QuantityError::new(raw, "invalid exponent"));
            }
            let magnitude: i64 = digits
                .parse()
                .map_err(|_| QuantityError::new(raw, "invalid exponent"))?;
            (sign * magnitude, 0)
        }
        _ => return Err(QuantityError::new(raw, "unknown suffix")),
    };

    if mantissa == 0 {
        return Ok(Exact {
            numerator: 0,
            denominator_pow10: 0,
        });
    }

    let numerator = mantissa
        .checked_mul(1u128 << binary_shift)
        .ok_or_else(|| QuantityError::new(raw, "value is too large"))?;
    // value = numerator * 10^(pow10_exp - frac_digits)
    let scale = pow10_exp - i64::from(frac_digits);
    if scale >= 0 {
        let scale =
            u32::try_from(scale).map_err(|_| QuantityError::new(raw, "exponent out of range"))?;
        let numerator = numerator
            .checked_mul(pow10(scale, raw)?)
            .ok_or_else(|| QuantityError::new(raw, "value is too large"))?;
        Ok(Exact {
            numerator,
            denominator_pow10: 0,
        })
    } else {
        let denominator_pow10 =
            u32::try_from(-scale).map_err(|_| QuantityError::new(raw, "exponent out of range"))?;
        // Cancel common factors of ten so that e.g. "8.000" stays representable.
        let mut numerator = numerator;
        let mut denominator_pow10 = denominator_pow10;
        while denominator_pow10 > 0 && numerator % 10 == 0 {
            numerator /= 10;
            denominator_pow10 -= 1;
        }
        if denominator_pow10 > MAX_POW10 {
            return Err(QuantityError::new(raw, "exponent out of range"));
        }
        Ok(Exact {
            numerator,
            denominator_pow10,
        })
    }
}

/// A device count (extended resources are integers): `"8"` is 8; `"8.5"`, `"-1"`,
/// `"abc"` and values above `u32::MAX` are errors.
pub fn parse_count(raw: &str) -> Result<u32, QuantityError> {
    let value = parse_exact(raw)?.exact_times(1, raw)?;
    u32::try_from(value).map_err(|_| QuantityError::new(raw, "count is too large"))
}

/// CPU in millicores: `"4"` is 4000, `"3500m"` is 3500, `"0.5"` is 500; finer
/// fractions round up, as Kubernetes does.
pub fn parse_cpu_millis(raw: &str) -> Result<u64, QuantityError> {
    let value = parse_exact(raw)?.ceil_times(1000, raw)?;
    u64::try_from(value).map_err(|_| QuantityError::new(raw, "value is too large"))
}

/// Memory in bytes: `"64Gi"`, `"1G"`, `"1e9"`, `"1048576"`; fractions of a byte round up.
pub fn parse_memory_bytes(raw: &str) -> Result<u64, QuantityError> {
    let value = parse_exact(raw)?.ceil_times(1, raw)?;
    u64::try_from(value).map_err(|_| QuantityError::new(raw, "value is too large"))
}

/// A memory size written in a vendor label, in MiB. Vendor labellers write sizes in
/// their own dialect: AMD's node labeller writes `192G` (GiB, computed from bytes by
/// powers of 1024), Ascend's `64G`; GFD writes plain MiB. So here a bare number is
/// `plain_unit_mib` MiB, and the single-letter suffixes `M`, `G`, `T` are read as
/// binary units like `Mi`, `Gi`, `Ti`. Returns `None` for anything else.
pub(crate) fn parse_label_size_mib(raw: &str, plain_unit_mib: u64) -> Option<u64> {
    let raw = raw.trim();
    // `64GB`, `64GiB`: a trailing byte unit after a size suffix adds nothing.
    let raw = match raw.strip_suffix('B') {
        Some(r) if r.ends_with(['T', 'G', 'M', 'i']) => r,
        _ => raw,
    };
    let (digits, mult): (&str, u64) =
        if let Some(d) = raw.strip_suffix("Ti").or_else(|| raw.strip_suffix('T')) {
            (d, 1024 * 1024)
        } else if let Some(d) = raw.strip_suffix("Gi").or_else(|| raw.strip_suffix('G')) {
            (d, 1024)
        } else if let Some(d) = raw.strip_suffix("Mi").or_else(|| raw.strip_suffix('M')) {
            (d, 1)
        } else {
            (raw, plain_unit_mib)
        };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse::<u64>().ok()?.checked_mul(mult)
}

/// A plain non-negative integer label value (`"81920"`, `"9"`).
pub(crate) fn parse_label_u64(raw: &str) -> Option<u64> {
    let raw = raw.trim();
    if raw.is_empty() || raw.len() > 20 || !raw.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    raw.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn counts() {
        assert_eq!(parse_count("8"), Ok(8));
        assert_eq!(parse_count("0"), Ok(0));
        assert_eq!(parse_count("+3"), Ok(3));
        assert_eq!(parse_count("8.0"), Ok(8));
        assert_eq!(parse_count("8000m"), Ok(8));
        assert_eq!(parse_count("1k"), Ok(1000));
        assert_eq!(parse_count("4294967295"), Ok(u32::MAX));
        for bad in [
            "8.5",
            "-1",
            "",
            "abc",
            "8 ",
            " 8",
            "8x",
            "4294967296",
            "1e10",
            "1Ei",
            "500m",
            ".",
            "-",
            "1e",
            "1e-",
            "99999999999999999999999999999999999999999999",
        ] {
            let err = parse_count(bad).expect_err(bad);
            assert!(err.to_string().contains("invalid quantity"), "{err}");
        }
    }

    #[test]
    fn error_names_the_value() {
        let err = parse_count("eight").unwrap_err();
        assert_eq!(err.value, "eight");
        assert!(err.to_string().contains("\"eight\""));
        let long = "9".repeat(200);
        let err = parse_count(&long).unwrap_err();
        assert!(err.value.len() <= 64);
    }

    #[test]
    fn cpu() {
        assert_eq!(parse_cpu_millis("4"), Ok(4000));
        assert_eq!(parse_cpu_millis("3500m"), Ok(3500));
        assert_eq!(parse_cpu_millis("0.5"), Ok(500));
        assert_eq!(parse_cpu_millis(".5"), Ok(500));
        assert_eq!(parse_cpu_millis("5."), Ok(5000));
        assert_eq!(
            parse_cpu_millis("0.0001"),
            Ok(1),
            "rounds up like Kubernetes"
        );
        assert_eq!(parse_cpu_millis("100u"), Ok(1));
        assert_eq!(parse_cpu_millis("1e3"), Ok(1_000_000));
        assert_eq!(parse_cpu_millis("191850m"), Ok(191_850));
        assert!(parse_cpu_millis("-1").is_err());
        assert!(parse_cpu_millis("1Q").is_err());
        assert!(parse_cpu_millis("1e9999").is_err());
        assert!(parse_cpu_millis("1e-9999").is_err());
    }

    #[test]
    fn memory() {
        assert_eq!(parse_memory_bytes("1048576"), Ok(1_048_576));
        assert_eq!(parse_memory_bytes("1Ki"), Ok(1024));
        assert_eq!(parse_memory_bytes("1.5Ki"), Ok(1536));
        assert_eq!(parse_memory_bytes("64Mi"), Ok(64 << 20));
        assert_eq!(parse_memory_bytes("2063937476Ki"), Ok(2_063_937_476 * 1024));
        assert_eq!(parse_memory_bytes("80Gi"), Ok(80 << 30));
        assert_eq!(parse_memory_bytes("2Ti"), Ok(2 << 40));
        assert_eq!(parse_memory_bytes("1k"), Ok(1000));
        assert_eq!(parse_memory_bytes("1M"), Ok(1_000_000));
        assert_eq!(parse_memory_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(parse_memory_bytes("1T"), Ok(1_000_000_000_000));
        assert_eq!(parse_memory_bytes("1e9"), Ok(1_000_000_000));
        assert_eq!(parse_memory_bytes("1E9"), Ok(1_000_000_000));
        assert_eq!(parse_memory_bytes("12e-1"), Ok(2), "1.2 bytes rounds up");
        assert_eq!(parse_memory_bytes("1.5"), Ok(2));
        assert_eq!(parse_memory_bytes("0"), Ok(0));
        assert_eq!(parse_memory_bytes("-0"), Ok(0));
        assert_eq!(parse_memory_bytes("15Ei"), Ok(15 << 60));
        assert!(parse_memory_bytes("16Ei").is_err(), "above u64::MAX");
        assert!(parse_memory_bytes("64GiB").is_err());
        assert!(parse_memory_bytes("-64Gi").is_err());
        assert!(parse_memory_bytes("Gi").is_err());
    }

    #[test]
    fn label_sizes() {
        assert_eq!(parse_label_size_mib("192G", 1), Some(192 * 1024));
        assert_eq!(parse_label_size_mib("64G", 1), Some(64 * 1024));
        assert_eq!(parse_label_size_mib("64GB", 1), Some(64 * 1024));
        assert_eq!(parse_label_size_mib("81920", 1), Some(81920));
        assert_eq!(parse_label_size_mib("512M", 1), Some(512));
        assert_eq!(parse_label_size_mib("1T", 1), Some(1024 * 1024));
        assert_eq!(parse_label_size_mib("abc", 1), None);
        assert_eq!(parse_label_size_mib("", 1), None);
        assert_eq!(parse_label_size_mib("99999999999999999999T", 1), None);
        assert_eq!(parse_label_u64("9"), Some(9));
        assert_eq!(parse_label_u64("-9"), None);
        assert_eq!(parse_label_u64("99999999999999999999999"), None);
    }

    proptest! {
        #[test]
        fn never_panics_on_arbitrary_strings(s in ".{0,64}") {
            let _ = parse_count(&s);
            let _ = parse_cpu_millis(&s);
            let _ = parse_memory_bytes(&s);
            let _ = parse_label_size_mib(&s, 1);
            let _ = parse_label_u64(&s);
        }

        #[test]
        fn never_panics_on_quantity_like_strings(s in "[+-]?[0-9]{0,45}(\\.[0-9]{0,45})?([eE][+-]?[0-9]{0,6}|Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?") {
            let _ = parse_count(&s);
            let _ = parse_cpu_millis(&s);
            let _ = parse_memory_bytes(&s);
        }

        #[test]
        fn integers_round_trip(n in any::<u32>()) {
            prop_assert_eq!(parse_count(&n.to_string()), Ok(n));
            prop_assert_eq!(parse_cpu_millis(&n.to_string()), Ok(u64::from(n) * 1000));
            prop_assert_eq!(parse_memory_bytes(&format!("{n}Ki")), Ok(u64::from(n) * 1024));
        }
    }
}

/// Whether two quantity strings mean the same amount (to the milli-unit), e.g.
/// `"274877906944"` and `"256Gi"`: the API server rewrites quantities into its
/// canonical form, so the controller compares amounts, not spellings.
pub fn same_quantity(a: &str, b: &str) -> bool {
    if a == b {
        return true;
    }
    match (parse_exact(a), parse_exact(b)) {
        (Ok(x), Ok(y)) => match (x.ceil_times(1000, a), y.ceil_times(1000, b)) {
            (Ok(x), Ok(y)) => x == y,
            _ => false,
        },
        _ => false,
    }
}

#[cfg(test)]
mod same_quantity_tests {
    use super::same_quantity;

    #[test]
    fn canonical_forms_compare_equal() {
        assert!(same_quantity("274877906944", "256Gi"));
        assert!(same_quantity("1000m", "1"));
        assert!(same_quantity("166666m", "166666m"));
        assert!(!same_quantity("8", "7"));
        assert!(!same_quantity("x", "8"));
    }
}
