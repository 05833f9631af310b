//! Writing samples back out as Prometheus exposition text.

use std::fmt::Write as _;

use super::Sample;

/// Write samples back out as Prometheus 0.0.4 text (no HELP/TYPE lines). Used by test
/// exporters and to show a source's raw view; `parse(&render(x)) == x` for valid
/// samples (NaN compares unequal, as always).
pub fn render(samples: &[Sample]) -> String {
    let mut out = String::new();
    for s in samples {
        out.push_str(&s.name);
        if !s.labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in s.labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(k);
                out.push_str("=\"");
                for ch in v.chars() {
                    match ch {
                        '\\' => out.push_str("\\\\"),
                        '"' => out.push_str("\\\""),
                        '\n' => out.push_str("\\n"),
                        other => out.push(other),
                    }
                }
                out.push('"');
            }
            out.push('}');
        }
        out.push(' ');
        out.push_str(&format_value(s.value));
        if let Some(ts) = s.timestamp_ms {
            let _ = write!(out, " {ts}");
        }
        out.push('\n');
    }
    out
}

/// A value as exposition text: `NaN`, `+Inf`, `-Inf`, or Rust's shortest round-trip form.
pub fn format_value(v: f64) -> String {
    if v.is_nan() {
        "NaN".to_string()
    } else if v == f64::INFINITY {
        "+Inf".to_string()
    } else if v == f64::NEG_INFINITY {
        "-Inf".to_string()
    } else {
        format!("{v}")
    }
}
