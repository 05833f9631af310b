//! Reading an export back, for checks (tests, the e2e suite, finance scripts).

/// Parses RFC 4180 CSV as written here: an empty unquoted field is NULL (None).
pub fn read_csv(csv: &str) -> Vec<Vec<Option<String>>> {
    let mut rows = Vec::new();
    let (mut row, mut cur, mut quoted, mut was_quoted) = (Vec::new(), String::new(), false, false);
    let mut chars = csv.chars().peekable();
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cur.push(c),
            (false, '"') => (quoted, was_quoted) = (true, true),
            (false, ',' | '\n') => {
                let v = std::mem::take(&mut cur);
                row.push((was_quoted || !v.is_empty()).then_some(v));
                was_quoted = false;
                if c == '\n' {
                    rows.push(std::mem::take(&mut row));
                }
            }
            (false, '\r') => {}
            (false, c) => cur.push(c),
        }
    }
    rows
}

/// The rows of a CSV export as column name -> value (None: NULL); None when a
/// row is not as wide as the header.
pub fn read_csv_table(
    csv: &str,
) -> Option<Vec<std::collections::BTreeMap<String, Option<String>>>> {
    let mut rows = read_csv(csv).into_iter();
    let header: Vec<String> = rows
        .next()?
        .into_iter()
        .map(Option::unwrap_or_default)
        .collect();
    rows.map(|r| (r.len() == header.len()).then(|| header.iter().cloned().zip(r).collect()))
        .collect()
}

/// An exported number (NumericFormat: optional `-`, digits, optional fraction)
/// as the exact `(units, scale)` of `units / 10^scale`.
pub fn parse_decimal(s: &str) -> Option<(i128, u32)> {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    let (neg, int) = match int.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, int),
    };
    let digits = format!("{int}{frac}");
    if int.is_empty()
        || (s.contains('.') && frac.is_empty())
        || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    let v: i128 = digits.parse().ok()?;
    Some((if neg { -v } else { v }, u32::try_from(frac.len()).ok()?))
}
