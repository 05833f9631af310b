//! Reading a Prometheus query answer (a vector or a matrix) into samples, or a [`QueryError`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::health::prom::{MAX_BODY_BYTES, Sample};

/// Why an answer cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum QueryError {
    #[error("answer is {0} bytes, over the limit of {MAX_BODY_BYTES} bytes")]
    TooLarge(usize),
    #[error("answer is not JSON: {0}")]
    NotJson(String),
    #[error("Prometheus reported an error: {0}")]
    Prometheus(String),
    #[error("answer is not a Prometheus query result: {0}")]
    Shape(String),
    #[error("result type {0:?}: expected a vector or a matrix")]
    ResultType(String),
}

/// Read a query answer into samples (name from `__name__`, the other labels, the
/// value, and the sample's own timestamp in ms). For a matrix, each series' newest
/// sample. Series without `__name__` or without a float sample (native histograms)
/// are skipped. An empty result is `Ok(vec![])`; the caller decides what it means.
pub fn parse(body: &str) -> Result<Vec<Sample>, QueryError> {
    if body.len() > MAX_BODY_BYTES {
        return Err(QueryError::TooLarge(body.len()));
    }
    let v: Value = serde_json::from_str(body).map_err(|e| QueryError::NotJson(e.to_string()))?;
    let Some(top) = v.as_object() else {
        return Err(QueryError::Shape("not a JSON object".into()));
    };
    match top.get("status").and_then(Value::as_str) {
        Some("success") => {}
        Some("error") => {
            let kind = top.get("errorType").and_then(Value::as_str).unwrap_or("");
            let message = top.get("error").and_then(Value::as_str).unwrap_or("");
            let text = match (kind.is_empty(), message.is_empty()) {
                (true, true) => "no message".to_string(),
                (false, true) => kind.to_string(),
                (true, false) => message.to_string(),
                (false, false) => format!("{kind}: {message}"),
            };
            return Err(QueryError::Prometheus(truncate(&text, 300)));
        }
        Some(other) => {
            return Err(QueryError::Shape(format!(
                "status {:?}",
                truncate(other, 40)
            )));
        }
        None => return Err(QueryError::Shape("no status".into())),
    }
    let data = top
        .get("data")
        .and_then(Value::as_object)
        .ok_or_else(|| QueryError::Shape("no data".into()))?;
    let result_type = data
        .get("resultType")
        .and_then(Value::as_str)
        .ok_or_else(|| QueryError::Shape("no data.resultType".into()))?;
    let matrix = match result_type {
        "vector" => false,
        "matrix" => true,
        other => return Err(QueryError::ResultType(truncate(other, 40))),
    };
    let result = data
        .get("result")
        .and_then(Value::as_array)
        .ok_or_else(|| QueryError::Shape("no data.result list".into()))?;
    let mut samples = Vec::with_capacity(result.len());
    for (i, series) in result.iter().enumerate() {
        let metric = series
            .get("metric")
            .and_then(Value::as_object)
            .ok_or_else(|| QueryError::Shape(format!("result[{i}] has no metric")))?;
        let mut labels = BTreeMap::new();
        let mut name = None;
        for (k, v) in metric {
            let Some(v) = v.as_str() else {
                return Err(QueryError::Shape(format!(
                    "result[{i}].metric.{} is not a string",
                    truncate(k, 60)
                )));
            };
            if k == "__name__" {
                name = Some(v.to_string());
            } else {
                labels.insert(k.clone(), v.to_string());
            }
        }
        let point = if matrix {
            match series.get("values") {
                None | Some(Value::Null) => None,
                Some(Value::Array(points)) => {
                    let mut newest: Option<(i64, f64)> = None;
                    for p in points {
                        let (t, v) = point(p, i)?;
                        if newest.is_none_or(|(nt, _)| t >= nt) {
                            newest = Some((t, v));
                        }
                    }
                    newest
                }
                Some(_) => {
                    return Err(QueryError::Shape(format!(
                        "result[{i}].values is not a list"
                    )));
                }
            }
        } else {
            match series.get("value") {
                None | Some(Value::Null) => None,
                Some(p) => Some(point(p, i)?),
            }
        };
        if let (Some(name), Some((timestamp_ms, value))) = (name, point) {
            samples.push(Sample {
                name,
                labels,
                value,
                timestamp_ms: Some(timestamp_ms),
            });
        }
    }
    Ok(samples)
}

/// `[<unix seconds>, "<value>"]` -> (ms, value).
fn point(p: &Value, i: usize) -> Result<(i64, f64), QueryError> {
    let bad = || QueryError::Shape(format!("result[{i}] has a malformed [time, value] pair"));
    let [t, v] = p.as_array().map(Vec::as_slice).ok_or_else(bad)? else {
        return Err(bad());
    };
    let seconds = t.as_f64().filter(|s| s.is_finite()).ok_or_else(bad)?;
    let ms = (seconds * 1000.0).round();
    if !(-9.0e15..=9.0e15).contains(&ms) {
        return Err(bad());
    }
    let value = v.as_str().and_then(parse_value).ok_or_else(bad)?;
    Ok((ms as i64, value))
}

/// Prometheus' value strings: decimals, scientific notation, `NaN`, `+Inf`, `-Inf`.
fn parse_value(s: &str) -> Option<f64> {
    match s {
        "NaN" => Some(f64::NAN),
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// At most `max` characters of text the server sent, for a message: control
/// characters (a line break, a terminal escape) are shown escaped, so the text
/// cannot forge log lines or condition messages.
fn truncate(s: &str, max: usize) -> String {
    let mut out = String::new();
    for (n, c) in s.chars().enumerate() {
        if n == max {
            out.push_str("...");
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}
