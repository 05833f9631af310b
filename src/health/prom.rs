//! A parser for the Prometheus text exposition format (version 0.0.4), as the vendor
//! exporters serve it, tolerant of the OpenMetrics additions that real endpoints mix
//! in (`# EOF`, `_created` series, exemplars, float-second timestamps).
//!
//! Strict where it matters for invariant 6: a body that is not exposition text (an
//! HTML error page, a proxy's "404 page not found", random bytes) is a
//! [`ParseError`], never "zero samples", so the caller can mark the source
//! unavailable instead of reading it as an empty node. Lenient about what exporters
//! really emit: `# HELP` / `# TYPE` / free comments, blank lines, `\r\n` line ends,
//! trailing whitespace, escaped label values, empty label values, a trailing comma in
//! the label set, `NaN` / `+Inf` / `-Inf`, scientific notation, timestamps.
//!
//! Bounded: bodies over [`MAX_BODY_BYTES`] and lines over [`MAX_LINE_BYTES`] are
//! rejected before anything is allocated for them. Never panics (property-tested on
//! arbitrary strings and bytes).
//!
//! Writing samples back out as exposition text is `prom/render.rs`.

mod exposition;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

pub use exposition::{format_value, render};

/// Largest body accepted, in bytes (64 MiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024 * 1024;
/// Largest single line accepted, in bytes (1 MiB).
pub const MAX_LINE_BYTES: usize = 1024 * 1024;

/// One sample: a series (name + labels) with its value at one instant.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
    /// Milliseconds since the Unix epoch, when the exporter gave one. (OpenMetrics
    /// bodies, recognised by their closing `# EOF`, give seconds; they are converted.)
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    /// The value of one label, if present.
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// Why a body is not exposition text. `line` is 1-based; 0 means the body as a whole.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl ParseError {
    fn new(line: usize, message: impl Into<String>) -> Self {
        ParseError {
            line,
            message: message.into(),
        }
    }
}

/// Metric types a `# TYPE` line may name (Prometheus 0.0.4 and OpenMetrics).
const METRIC_TYPES: [&str; 9] = [
    "counter",
    "gauge",
    "histogram",
    "summary",
    "untyped",
    "unknown",
    "info",
    "stateset",
    "gaugehistogram",
];

/// Parse an exposition body into samples, in the order they appear.
///
/// An empty (or whitespace-only) body is `Ok(vec![])`: an exporter with nothing to
/// report. Anything else must consist of comments and well-formed sample lines;
/// the first malformed line is the error.
pub fn parse(text: &str) -> Result<Vec<Sample>, ParseError> {
    if text.len() > MAX_BODY_BYTES {
        return Err(ParseError::new(
            0,
            format!(
                "body is {} bytes, over the limit of {} bytes (64 MiB)",
                text.len(),
                MAX_BODY_BYTES
            ),
        ));
    }
    // OpenMetrics bodies end with `# EOF` and carry timestamps in seconds.
    let open_metrics = text.trim_end().ends_with("# EOF");
    let mut samples = Vec::new();
    let mut eof_line: Option<usize> = None;

    for (i, raw_line) in text.split('\n').enumerate() {
        let line_no = i + 1;
        if raw_line.len() > MAX_LINE_BYTES {
            return Err(ParseError::new(
                line_no,
                format!(
                    "line is {} bytes, over the limit of {} bytes (1 MiB)",
                    raw_line.len(),
                    MAX_LINE_BYTES
                ),
            ));
        }
        let line = raw_line.strip_suffix('\r').unwrap_or(raw_line);
        let trimmed = line.trim_matches(|c| c == ' ' || c == '\t');
        if trimmed.is_empty() {
            continue;
        }
        if let Some(eof) = eof_line {
            return Err(ParseError::new(
                line_no,
                format!("content after `# EOF` on line {eof}"),
            ));
        }
        if let Some(comment) = trimmed.strip_prefix('#') {
            if parse_comment(comment, line_no)? {
                eof_line = Some(line_no);
            }
            continue;
        }
        samples.push(parse_sample(trimmed, line_no, open_metrics)?);
    }
    Ok(samples)
}

/// Check a comment line (without its `#`). Returns true for `# EOF`.
fn parse_comment(comment: &str, line_no: usize) -> Result<bool, ParseError> {
    let body = comment.trim_start_matches([' ', '\t']);
    let (keyword, rest) = split_token(body);
    match keyword {
        "EOF" if rest.trim().is_empty() => Ok(true),
        "HELP" | "TYPE" | "UNIT" => {
            let (name, rest) = split_token(rest);
            if name.is_empty() {
                return Err(ParseError::new(
                    line_no,
                    format!("`# {keyword}` without a metric name"),
                ));
            }
            if !is_metric_name(name) {
                return Err(ParseError::new(
                    line_no,
                    format!("`# {keyword}` names an invalid metric name {name:?}"),
                ));
            }
            if keyword == "TYPE" {
                let (kind, extra) = split_token(rest);
                if !METRIC_TYPES.contains(&kind) || !extra.trim().is_empty() {
                    return Err(ParseError::new(
                        line_no,
                        format!("`# TYPE {name}` has an unknown type {:?}", rest.trim()),
                    ));
                }
            }
            Ok(false)
        }
        // Any other comment is free text.
        _ => Ok(false),
    }
}

/// First blank-separated token and the rest (rest starts after the separator).
fn split_token(s: &str) -> (&str, &str) {
    let s = s.trim_start_matches([' ', '\t']);
    match s.find([' ', '\t']) {
        Some(i) => (&s[..i], &s[i + 1..]),
        None => (s, ""),
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

fn is_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A cursor over one line. Every position it stops at is right before or after an
/// ASCII byte, so slicing the line there is always on a char boundary.
struct Cursor<'a> {
    line: &'a str,
    pos: usize,
    line_no: usize,
}

impl<'a> Cursor<'a> {
    fn peek(&self) -> Option<u8> {
        self.line.as_bytes().get(self.pos).copied()
    }

    fn rest(&self) -> &'a str {
        self.line.get(self.pos..).unwrap_or("")
    }

    fn skip_blanks(&mut self) -> usize {
        let start = self.pos;
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.pos += 1;
        }
        self.pos - start
    }

    /// Take bytes while `pred` holds (pred only accepts ASCII bytes).
    fn take_while(&mut self, pred: impl Fn(u8) -> bool) -> &'a str {
        let start = self.pos;
        while matches!(self.peek(), Some(b) if b.is_ascii() && pred(b)) {
            self.pos += 1;
        }
        self.line.get(start..self.pos).unwrap_or("")
    }

    fn error(&self, message: impl Into<String>) -> ParseError {
        ParseError::new(self.line_no, message)
    }
}

fn parse_sample(line: &str, line_no: usize, open_metrics: bool) -> Result<Sample, ParseError> {
    let mut c = Cursor {
        line,
        pos: 0,
        line_no,
    };
    let name = c.take_while(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':');
    if name.is_empty() || !is_metric_name(name) {
        return Err(c.error(format!("expected a metric name, found {:?}", excerpt(line))));
    }
    let name = name.to_string();
    let mut blanks = c.skip_blanks();
    let labels = if c.peek() == Some(b'{') {
        c.pos += 1;
        let labels = parse_labels(&mut c, &name)?;
        blanks = c.skip_blanks();
        labels
    } else {
        BTreeMap::new()
    };

    if blanks == 0 && c.peek().is_some() {
        return Err(c.error(format!(
            "expected a blank after the series of {name}, found {:?}",
            excerpt(c.rest())
        )));
    }
    let value_token = c.take_while(|b| !matches!(b, b' ' | b'\t'));
    if c.peek().is_some_and(|b| !b.is_ascii()) {
        return Err(c.error(format!("invalid value for {name}: {:?}", excerpt(c.rest()))));
    }
    if value_token.is_empty() {
        return Err(c.error(format!("missing value for {name}")));
    }
    let value = parse_value(value_token).ok_or_else(|| {
        c.error(format!(
            "invalid value {:?} for {name}",
            excerpt(value_token)
        ))
    })?;

    c.skip_blanks();
    let mut timestamp_ms = None;
    if let Some(b) = c.peek()
        && b != b'#'
    {
        let token = c.take_while(|b| !matches!(b, b' ' | b'\t'));
        if c.peek().is_some_and(|b| !b.is_ascii()) || token.is_empty() {
            return Err(c.error(format!(
                "invalid timestamp for {name}: {:?}",
                excerpt(c.rest())
            )));
        }
        timestamp_ms = Some(parse_timestamp(token, open_metrics).ok_or_else(|| {
            c.error(format!("invalid timestamp {:?} for {name}", excerpt(token)))
        })?);
        c.skip_blanks();
    }
    match c.peek() {
        None => {}
        // An OpenMetrics exemplar (` # {labels} value [timestamp]`): accepted, not kept.
        Some(b'#') => {
            c.pos += 1;
            c.skip_blanks();
            if c.peek() != Some(b'{') {
                return Err(c.error(format!(
                    "unexpected text after the sample of {name}: {:?}",
                    excerpt(c.rest())
                )));
            }
        }
        Some(_) => {
            return Err(c.error(format!(
                "unexpected text after the sample of {name}: {:?}",
                excerpt(c.rest())
            )));
        }
    }
    Ok(Sample {
        name,
        labels,
        value,
        timestamp_ms,
    })
}

/// Parse `name="value", ...}` (the opening brace already consumed).
fn parse_labels(c: &mut Cursor<'_>, metric: &str) -> Result<BTreeMap<String, String>, ParseError> {
    let mut labels = BTreeMap::new();
    loop {
        c.skip_blanks();
        match c.peek() {
            Some(b'}') => {
                c.pos += 1;
                return Ok(labels);
            }
            None => return Err(c.error(format!("unterminated label set for {metric}"))),
            _ => {}
        }
        let label = c.take_while(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !is_label_name(label) {
            return Err(c.error(format!(
                "invalid label name in the label set of {metric}: {:?}",
                excerpt(c.rest())
            )));
        }
        c.skip_blanks();
        if c.peek() != Some(b'=') {
            return Err(c.error(format!("expected `=` after label {label} of {metric}")));
        }
        c.pos += 1;
        c.skip_blanks();
        if c.peek() != Some(b'"') {
            return Err(c.error(format!(
                "expected a quoted value for label {label} of {metric}"
            )));
        }
        c.pos += 1;
        let value = parse_label_value(c, label, metric)?;
        if labels.insert(label.to_string(), value).is_some() {
            return Err(c.error(format!("label {label} appears twice on {metric}")));
        }
        c.skip_blanks();
        match c.peek() {
            Some(b',') => c.pos += 1,
            Some(b'}') => {}
            _ => {
                return Err(c.error(format!(
                    "expected `,` or `}}` after label {label} of {metric}"
                )));
            }
        }
    }
}

/// Read a label value up to its closing quote (the opening one consumed), unescaping
/// `\\`, `\"` and `\n`. Other escapes are kept as written.
fn parse_label_value(c: &mut Cursor<'_>, label: &str, metric: &str) -> Result<String, ParseError> {
    let bytes = c.line.as_bytes();
    let mut out: Vec<u8> = Vec::new();
    loop {
        match bytes.get(c.pos).copied() {
            None => {
                return Err(c.error(format!("unterminated value for label {label} of {metric}")));
            }
            Some(b'"') => {
                c.pos += 1;
                break;
            }
            Some(b'\\') => {
                match bytes.get(c.pos + 1).copied() {
                    Some(b'\\') => out.push(b'\\'),
                    Some(b'"') => out.push(b'"'),
                    Some(b'n') => out.push(b'\n'),
                    Some(other) if other.is_ascii() => {
                        out.push(b'\\');
                        out.push(other);
                    }
                    // A backslash before a multi-byte char or at the end: keep the
                    // backslash, let the loop copy what follows.
                    _ => {
                        out.push(b'\\');
                        c.pos += 1;
                        continue;
                    }
                }
                c.pos += 2;
            }
            Some(b) => {
                out.push(b);
                c.pos += 1;
            }
        }
    }
    // Only whole ASCII bytes were removed or replaced, so this is valid UTF-8; the
    // error arm is unreachable but handled rather than unwrapped.
    String::from_utf8(out)
        .map_err(|_| c.error(format!("label {label} of {metric} is not valid UTF-8")))
}

/// Go's `strconv.ParseFloat` spellings that exporters use, via Rust's parser (which
/// also accepts `inf`, `infinity`, `nan` in any case, and `+`/`-` signs).
fn parse_value(token: &str) -> Option<f64> {
    if token.len() > 1024 {
        return None;
    }
    token.parse::<f64>().ok()
}

/// Integer milliseconds (Prometheus 0.0.4), or seconds when the body is OpenMetrics.
/// A fractional timestamp is always seconds (only OpenMetrics writes those).
fn parse_timestamp(token: &str, open_metrics: bool) -> Option<i64> {
    if !open_metrics && let Ok(ms) = token.parse::<i64>() {
        return Some(ms);
    }
    let seconds = parse_value(token)?;
    let ms = (seconds * 1000.0).round();
    // i64::MAX as f64 rounds up to 2^63, so the upper bound is exclusive.
    if ms.is_finite() && ms >= i64::MIN as f64 && ms < i64::MAX as f64 {
        Some(ms as i64)
    } else {
        None
    }
}

/// A short, printable piece of offending input for error messages.
fn excerpt(s: &str) -> String {
    let mut out: String = s.chars().take(40).collect();
    if s.chars().nth(40).is_some() {
        out.push('…');
    }
    out
}
