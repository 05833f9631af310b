//! Exact decimals and integers written into a reused buffer: an export of
//! millions of rows prints a dozen numbers a row, and a `format!` each was a
//! third of its time.

/// Appends `num / 10^scale` exactly, trailing zeros trimmed, signed (`-2.5`,
/// `0.000001`, `3`).
pub fn push_decimal(out: &mut String, num: i128, scale: u32) {
    if num < 0 {
        out.push('-');
    }
    let m = num.unsigned_abs();
    let p = 10u128.pow(scale);
    // 64-bit division when the value fits (every credit amount does).
    let (int, frac) = match (u64::try_from(m), u64::try_from(p)) {
        (Ok(m), Ok(p)) => (u128::from(m / p), u128::from(m % p)),
        _ => (m / p, m % p),
    };
    push_u128(out, int);
    if frac != 0 {
        let (frac, width) = without_trailing_zeros(frac, scale);
        out.push('.');
        for _ in digits(frac)..width {
            out.push('0');
        }
        push_u128(out, frac);
    }
}

/// `n / 10^k` and `width - k` for the most `k` leaving `n` whole (`n` > 0).
fn without_trailing_zeros(mut n: u128, mut width: u32) -> (u128, u32) {
    while n > u128::from(u64::MAX) && n.is_multiple_of(10) {
        n /= 10;
        width -= 1;
    }
    let Ok(mut small) = u64::try_from(n) else {
        return (n, width);
    };
    while small.is_multiple_of(10) {
        small /= 10;
        width -= 1;
    }
    (u128::from(small), width)
}

/// Appends a signed integer.
pub fn push_int(out: &mut String, n: i64) {
    if n < 0 {
        out.push('-');
    }
    push_u128(out, u128::from(n.unsigned_abs()));
}

fn push_u128(out: &mut String, n: u128) {
    // 64-bit division where the value fits: a 128-bit one is a library call.
    // Larger values (damaged rows, products of three prices) are rare: the
    // formatter writes them.
    match u64::try_from(n) {
        Ok(n) => out.push_str(u64_digits(n, &mut [0u8; 20])),
        Err(_) => {
            use std::fmt::Write as _;
            let _ = write!(out, "{n}");
        }
    }
}

/// The decimal digits of `n`, written at the end of `text`.
pub fn u64_digits(n: u64, text: &mut [u8; 20]) -> &str {
    let mut at = text.len();
    let mut rest = n;
    loop {
        at -= 1;
        text[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    std::str::from_utf8(&text[at..]).unwrap_or_default()
}

fn digits(n: u128) -> u32 {
    if let Ok(n) = u64::try_from(n) {
        return n.checked_ilog10().unwrap_or(0) + 1;
    }
    let mut n = n;
    let mut count = 1;
    while n >= 10 {
        n /= 10;
        count += 1;
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn decimal(num: i128, scale: u32) -> String {
        let mut out = String::new();
        push_decimal(&mut out, num, scale);
        out
    }

    #[test]
    fn decimals_and_integers() {
        assert_eq!(decimal(0, 6), "0");
        assert_eq!(decimal(2_500_000, 6), "2.5");
        assert_eq!(decimal(-1, 6), "-0.000001");
        assert_eq!(decimal(1, 12), "0.000000000001");
        assert_eq!(decimal(i128::MIN, 0), i128::MIN.to_string());
        assert_eq!(decimal(i128::MAX, 38).len(), "1.".len() + 38);
        let mut out = String::from("x");
        push_int(&mut out, i64::MIN);
        push_int(&mut out, 0);
        assert_eq!(out, format!("x{}0", i64::MIN));
    }

    proptest! {
        /// The same text as the formatter's reference rendering.
        #[test]
        fn matches_the_formatter(num in any::<i128>(), scale in 0u32..=38) {
            let p = 10u128.pow(scale);
            let m = num.unsigned_abs();
            let frac = format!("{:0width$}", m % p, width = scale as usize);
            let frac = frac.trim_end_matches('0');
            let sign = if num < 0 { "-" } else { "" };
            let expected = if frac.is_empty() {
                format!("{sign}{}", m / p)
            } else {
                format!("{sign}{}.{frac}", m / p)
            };
            prop_assert_eq!(decimal(num, scale), expected);
        }

        #[test]
        fn integers_match_the_formatter(n in any::<i64>()) {
            let mut out = String::new();
            push_int(&mut out, n);
            prop_assert_eq!(out, n.to_string());
        }
    }
}
