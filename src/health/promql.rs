//! Reading vendor exporter metrics through a Prometheus server's query API
//! (`GET /api/v1/query`) instead of scraping each exporter: clusters usually scrape
//! the exporters already.
//!
//! Pure: this module builds the query and its URL, reads the JSON answer into
//! [`Sample`]s (the same shape the text parser produces, so
//! [`crate::health::exporters::readings`] maps both) and splits them by node with
//! their age. The HTTP fetch is [`crate::health::scrape::Scraper`]'s; the polling
//! loop is in `src/controller/health_poller.rs`.
//!
//! One query per source selects only the series the exporter mapping reads:
//! `{__name__=~"A|B|...",<selector matchers>}[<staleAfterSeconds>s]`. It is a range
//! selector on purpose: for an instant vector Prometheus answers with the
//! *evaluation* time and keeps returning a series' last value for its lookback
//! (5 minutes) after the exporter went away, so its timestamp says nothing about
//! freshness. A range selector returns the raw samples of the window with their own
//! timestamps, and nothing for a series that stopped. Both answer shapes (`vector`
//! and `matrix`) are read; samples older than `staleAfterSeconds` are dropped either
//! way (invariant 6: never the last value seen).
//!
//! Never panics on any input (property-tested); an answer that is not a successful
//! vector or matrix is a [`QueryError`], never "no samples".

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::exporters::{DeviceReading, ExporterKind, readings};
use super::prom::{MAX_BODY_BYTES, Sample};

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

/// One metric-name pattern of an exporter mapping.
#[derive(Clone, Copy, Debug)]
enum Name {
    /// Exactly this name.
    Exact(&'static str),
    /// This prefix and at least one more character.
    Prefix(&'static str),
    /// This prefix and one or more digits.
    Numbered(&'static str),
}

/// The metric names a [`readings`] mapping reads for one exporter kind (see the
/// `fill_*` functions in `src/health/exporters.rs`; the test
/// `query_selects_everything_the_mapping_reads` keeps the two in step).
struct Names {
    /// The exporter may prefix every name with `<anything>_` (AMD's
    /// `MetricsFieldPrefix`).
    any_prefix: bool,
    names: &'static [Name],
}

fn names(kind: ExporterKind) -> Names {
    use Name::*;
    match kind {
        ExporterKind::DcgmExporter => Names {
            any_prefix: false,
            names: &[
                Exact("DCGM_FI_DEV_GPU_TEMP"),
                Exact("DCGM_FI_DEV_MEMORY_TEMP"),
                Exact("DCGM_FI_DEV_POWER_USAGE"),
                Exact("DCGM_FI_DEV_FB_USED"),
                Exact("DCGM_FI_DEV_GPU_UTIL"),
                Exact("DCGM_FI_DEV_XID_ERRORS"),
                Exact("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
                Exact("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
                Exact("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
                Exact("DCGM_FI_DEV_ROW_REMAP_FAILURE"),
            ],
        },
        ExporterKind::AmdDeviceMetrics => Names {
            any_prefix: true,
            names: &[
                Exact("gpu_junction_temperature"),
                Exact("gpu_edge_temperature"),
                Exact("gpu_memory_temperature"),
                Exact("gpu_power_usage"),
                Exact("gpu_package_power"),
                Exact("gpu_average_package_power"),
                Exact("gpu_used_vram"),
                Exact("gpu_gfx_activity"),
                // gpu_ecc_uncorrect_total and the per-block counters.
                Prefix("gpu_ecc_uncorrect_"),
                Exact("gpu_health"),
            ],
        },
        ExporterKind::AscendNpuExporter => Names {
            any_prefix: false,
            names: &[
                Exact("npu_chip_info_temperature"),
                Exact("npu_chip_info_hbm_temperature"),
                Exact("npu_chip_info_power"),
                Exact("npu_chip_info_hbm_used_memory"),
                Exact("npu_chip_info_used_memory"),
                Exact("npu_chip_info_utilization"),
                Exact("npu_chip_info_hbm_ecc_double_bit_error_cnt"),
                Exact("npu_chip_info_hbm_ecc_total_double_bit_error_cnt"),
                Exact("npu_chip_info_health_status"),
                Exact("npu_chip_info_error_code"),
                Numbered("npu_chip_info_error_code_"),
            ],
        },
        ExporterKind::GaudiExporter => Names {
            any_prefix: false,
            names: &[
                Exact("habanalabs_temperature_onchip"),
                Exact("habanalabs_power_mW"),
                Exact("habanalabs_memory_used_bytes"),
                Exact("habanalabs_utilization"),
                Exact("habanalabs_pending_rows_with_double_bit_ecc_errors"),
            ],
        },
    }
}

impl Name {
    fn matches(self, name: &str) -> bool {
        match self {
            Name::Exact(n) => name == n,
            Name::Prefix(p) => name.len() > p.len() && name.starts_with(p),
            Name::Numbered(p) => name
                .strip_prefix(p)
                .is_some_and(|rest| !rest.is_empty() && rest.bytes().all(|b| b.is_ascii_digit())),
        }
    }

    /// The same pattern as an RE2 regex fragment (metric names need no escaping).
    fn regex(self) -> String {
        match self {
            Name::Exact(n) => n.to_string(),
            Name::Prefix(p) => format!("{p}.+"),
            Name::Numbered(p) => format!("{p}[0-9]+"),
        }
    }
}

/// The `__name__` regex a query for `kind` uses (Prometheus anchors it).
pub fn name_regex(kind: ExporterKind) -> String {
    let n = names(kind);
    let alternatives: Vec<String> = n.names.iter().map(|p| p.regex()).collect();
    if n.any_prefix {
        format!("(.+_)?({})", alternatives.join("|"))
    } else {
        alternatives.join("|")
    }
}

/// Whether the query for `kind` selects a series named `name` (what [`name_regex`]
/// matches, in Rust).
pub fn selects(kind: ExporterKind, name: &str) -> bool {
    let n = names(kind);
    let direct = |s: &str| n.names.iter().any(|p| p.matches(s));
    if direct(name) {
        return true;
    }
    n.any_prefix
        && name
            .match_indices('_')
            .any(|(i, _)| i > 0 && direct(&name[i + 1..]))
}

/// Check a configured selector: empty, or `{matchers}` without a `__name__` matcher
/// (kaccel sets the name). Returns the matchers between the braces.
pub fn selector_matchers(selector: &str) -> Result<&str, String> {
    let s = selector.trim();
    if s.is_empty() {
        return Ok("");
    }
    let inner = s
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(|| {
            format!("{selector:?} must be label matchers in braces, e.g. {{job=\"dcgm-exporter\"}}")
        })?;
    if inner.contains("__name__") {
        return Err("must not match __name__: kaccel selects the metric names itself".into());
    }
    if inner.contains(['\n', '\r', '{', '}']) {
        return Err(format!("{selector:?} is not one set of label matchers"));
    }
    Ok(inner.trim().trim_end_matches(',').trim())
}

/// The PromQL expression for one source: the mapping's series under the selector,
/// as a range selector over the staleness window (raw samples, real timestamps).
pub fn query(kind: ExporterKind, selector: &str, window_seconds: i64) -> Result<String, String> {
    let matchers = selector_matchers(selector)?;
    let mut q = format!("{{__name__=~\"{}\"", name_regex(kind));
    if !matchers.is_empty() {
        q.push(',');
        q.push_str(matchers);
    }
    let _ = write!(q, "}}[{}s]", window_seconds.max(1));
    Ok(q)
}

/// `GET` URL of an instant query against a Prometheus base URL
/// (`http://prometheus:9090`, or with a path prefix such as `.../prometheus`).
pub fn query_url(base: &str, query: &str) -> String {
    format!(
        "{}/api/v1/query?query={}",
        base.trim_end_matches('/'),
        percent_encode(query)
    )
}

/// Percent-encode everything but RFC 3986 unreserved characters.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
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

fn truncate(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s.to_string(),
    }
}

/// The label that names a series' node when the source does not configure one:
/// the exporter's own hostname label. Ascend's and Gaudi's exporters have none
/// (configure `nodeLabel`, e.g. the `node` label a relabelling rule adds).
pub fn default_node_label(kind: ExporterKind) -> Option<&'static str> {
    match kind {
        ExporterKind::DcgmExporter => Some("Hostname"),
        ExporterKind::AmdDeviceMetrics => Some("hostname"),
        ExporterKind::AscendNpuExporter | ExporterKind::GaudiExporter => None,
    }
}

/// A query answer split by node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ByNode {
    /// Nodes with fresh samples: their device readings (node set to the node).
    pub fresh: BTreeMap<String, Vec<DeviceReading>>,
    /// Nodes whose every sample is older than the staleness limit: the age of their
    /// newest sample, in seconds.
    pub stale: BTreeMap<String, i64>,
    /// Samples dropped for having no node label.
    pub without_node: usize,
    /// Stale samples dropped (on any node).
    pub stale_samples: usize,
}

/// Split samples by the value of `node_label`, drop those older than
/// `stale_after_seconds` at `now_ms`, and map each node's fresh samples to device
/// readings. A sample without a timestamp counts as fresh. The node label wins over
/// the exporter's own hostname label, so devices on different nodes never merge.
pub fn by_node(
    kind: ExporterKind,
    samples: Vec<Sample>,
    node_label: &str,
    now_ms: i64,
    stale_after_seconds: i64,
) -> ByNode {
    let limit_ms = stale_after_seconds.saturating_mul(1000);
    let mut fresh: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut newest_stale: BTreeMap<String, i64> = BTreeMap::new();
    let mut out = ByNode::default();
    for s in samples {
        let Some(node) = s.label(node_label).map(str::trim).filter(|n| !n.is_empty()) else {
            out.without_node += 1;
            continue;
        };
        let node = node.to_string();
        match s.timestamp_ms {
            Some(t) if now_ms.saturating_sub(t) > limit_ms => {
                out.stale_samples += 1;
                let newest = newest_stale.entry(node).or_insert(t);
                *newest = (*newest).max(t);
            }
            _ => fresh.entry(node).or_default().push(s),
        }
    }
    for (node, t) in newest_stale {
        if !fresh.contains_key(&node) {
            out.stale.insert(node, now_ms.saturating_sub(t) / 1000);
        }
    }
    for (node, samples) in fresh {
        let mut found = readings(kind, &samples, Some(&node));
        for r in &mut found {
            r.node = Some(node.clone());
        }
        if !found.is_empty() {
            out.fresh.insert(node, found);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::prom;
    use proptest::prelude::*;

    const NOW_MS: i64 = 1_767_225_600_000; // 2026-01-01T00:00:00Z

    /// (name, labels, timestamp in seconds, value).
    type Series<'a> = (&'a str, &'a [(&'a str, &'a str)], f64, &'a str);

    fn vector(series: &[Series]) -> String {
        let result: Vec<Value> = series
            .iter()
            .map(|(name, labels, ts, v)| {
                let mut metric = serde_json::Map::new();
                metric.insert("__name__".into(), Value::from(*name));
                for (k, val) in *labels {
                    metric.insert((*k).into(), Value::from(*val));
                }
                serde_json::json!({"metric": metric, "value": [ts, v]})
            })
            .collect();
        serde_json::json!({"status": "success", "data": {"resultType": "vector", "result": result}})
            .to_string()
    }

    #[test]
    fn reads_a_vector_answer() {
        let body = vector(&[
            (
                "DCGM_FI_DEV_GPU_TEMP",
                &[("gpu", "0"), ("UUID", "GPU-a"), ("Hostname", "n1")],
                1_767_225_599.5,
                "41",
            ),
            (
                "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
                &[("gpu", "0"), ("UUID", "GPU-a"), ("Hostname", "n1")],
                1_767_225_599.5,
                "1e+00",
            ),
            ("up", &[], 1.0, "NaN"),
            ("x", &[], 1.0, "+Inf"),
            ("y", &[], 1.0, "-Inf"),
        ]);
        let s = parse(&body).unwrap();
        assert_eq!(s.len(), 5);
        assert_eq!(s[0].name, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(s[0].label("Hostname"), Some("n1"));
        assert!(!s[0].labels.contains_key("__name__"));
        assert_eq!(s[0].value, 41.0);
        assert_eq!(s[0].timestamp_ms, Some(1_767_225_599_500));
        assert_eq!(s[1].value, 1.0);
        assert!(s[2].value.is_nan());
        assert_eq!(s[3].value, f64::INFINITY);
        assert_eq!(s[4].value, f64::NEG_INFINITY);
    }

    #[test]
    fn reads_a_matrix_answer_newest_sample_per_series() {
        let body = r#"{"status":"success","data":{"resultType":"matrix","result":[
            {"metric":{"__name__":"DCGM_FI_DEV_GPU_TEMP","gpu":"0","Hostname":"n1"},
             "values":[[100.0,"40"],[115.0,"42"],[110,"41"]]},
            {"metric":{"gpu":"1"},"values":[[115,"1"]]},
            {"metric":{"__name__":"h"},"histograms":[[115,{"count":"1"}]]}
        ]},"warnings":["something"]}"#;
        let s = parse(body).unwrap();
        assert_eq!(s.len(), 1, "no name / histogram-only series skipped: {s:?}");
        assert_eq!(s[0].value, 42.0);
        assert_eq!(s[0].timestamp_ms, Some(115_000));
    }

    #[test]
    fn errors_are_errors_not_empty() {
        let err =
            parse(r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "Prometheus reported an error: bad_data: parse error at char 3"
        );
        for (body, what) in [
            ("<html>502 Bad Gateway</html>", "not JSON"),
            ("", "not JSON"),
            ("[]", "not a JSON object"),
            (r#"{"status":"success"}"#, "no data"),
            (
                r#"{"status":"success","data":{"resultType":"scalar","result":[1,"2"]}}"#,
                "scalar",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":{}}}"#,
                "list",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a"},"value":[1,2]}]}}"#,
                "malformed",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a"},"value":["1","2"]}]}}"#,
                "malformed",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a"},"value":[1,"0x10"]}]}}"#,
                "malformed",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a","b":1},"value":[1,"2"]}]}}"#,
                "not a string",
            ),
            (
                r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a"},"value":[1e300,"2"]}]}}"#,
                "malformed",
            ),
            (r#"{"status":"partial"}"#, "status"),
        ] {
            let err = parse(body).unwrap_err().to_string();
            assert!(err.contains(what), "{body}: {err}");
        }
        assert_eq!(
            parse(r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#).unwrap(),
            vec![]
        );
    }

    #[test]
    fn builds_one_query_with_the_selector() {
        let q = query(
            ExporterKind::DcgmExporter,
            r#"{job="dcgm-exporter", namespace="gpu-operator",}"#,
            30,
        )
        .unwrap();
        assert!(q.starts_with("{__name__=~\"DCGM_FI_DEV_GPU_TEMP|"), "{q}");
        assert!(
            q.ends_with(r#"",job="dcgm-exporter", namespace="gpu-operator"}[30s]"#),
            "{q}"
        );
        assert_eq!(
            query(ExporterKind::GaudiExporter, "", 15).unwrap(),
            "{__name__=~\"habanalabs_temperature_onchip|habanalabs_power_mW|habanalabs_memory_used_bytes|habanalabs_utilization|habanalabs_pending_rows_with_double_bit_ecc_errors\"}[15s]"
        );
        assert!(
            name_regex(ExporterKind::AmdDeviceMetrics)
                .starts_with("(.+_)?(gpu_junction_temperature|")
        );
        assert!(
            name_regex(ExporterKind::AscendNpuExporter)
                .ends_with("|npu_chip_info_error_code_[0-9]+")
        );
        for bad in [
            "job=\"x\"",
            "{__name__=\"x\"}",
            "{a=\"b\"} or {c=\"d\"}",
            "{a=\"b\",\nc=\"d\"}",
        ] {
            assert!(selector_matchers(bad).is_err(), "{bad}");
        }
        let url = query_url("http://prometheus:9090/", "{a=\"b c\"}[30s]");
        assert_eq!(
            url,
            "http://prometheus:9090/api/v1/query?query=%7Ba%3D%22b%20c%22%7D%5B30s%5D"
        );
        assert!(url.parse::<hyper::Uri>().is_ok());
    }

    #[test]
    fn name_matching_follows_the_regex() {
        use ExporterKind::*;
        assert!(selects(DcgmExporter, "DCGM_FI_DEV_GPU_TEMP"));
        assert!(!selects(DcgmExporter, "DCGM_FI_DEV_SM_CLOCK"));
        assert!(selects(AmdDeviceMetrics, "gpu_health"));
        assert!(selects(AmdDeviceMetrics, "amd_gpu_health"));
        assert!(selects(AmdDeviceMetrics, "gpu_ecc_uncorrect_umc"));
        assert!(!selects(AmdDeviceMetrics, "gpu_ecc_uncorrect_"));
        assert!(!selects(AmdDeviceMetrics, "_gpu_health"));
        assert!(!selects(AmdDeviceMetrics, "gpu_clock"));
        assert!(selects(AscendNpuExporter, "npu_chip_info_error_code"));
        assert!(selects(AscendNpuExporter, "npu_chip_info_error_code_2"));
        assert!(!selects(AscendNpuExporter, "npu_chip_info_error_code_x"));
    }

    /// Readings from only the series the query selects equal readings from the
    /// whole exporter output, field for field (the raw fields aside): the query
    /// misses nothing the mapping reads.
    #[test]
    fn query_selects_everything_the_mapping_reads() {
        for (kind, fixture) in [
            (
                ExporterKind::DcgmExporter,
                include_str!("testdata/dcgm.prom"),
            ),
            (
                ExporterKind::AmdDeviceMetrics,
                include_str!("testdata/amd.prom"),
            ),
            (
                ExporterKind::AscendNpuExporter,
                include_str!("testdata/ascend.prom"),
            ),
            (
                ExporterKind::GaudiExporter,
                include_str!("testdata/gaudi.prom"),
            ),
        ] {
            let all = prom::parse(fixture).unwrap();
            let selected: Vec<Sample> = all
                .iter()
                .filter(|s| selects(kind, &s.name))
                .cloned()
                .collect();
            assert!(selected.len() < all.len(), "{kind:?}: the query narrows");
            let strip = |mut r: Vec<DeviceReading>| {
                for d in &mut r {
                    d.raw_values.clear();
                    d.raw_labels.clear();
                }
                r
            };
            let full = strip(readings(kind, &all, Some("n")));
            let narrow = strip(readings(kind, &selected, Some("n")));
            assert!(!full.is_empty());
            assert_eq!(
                full, narrow,
                "{kind:?}: the query misses a metric the mapping reads"
            );
        }
    }

    #[test]
    fn splits_by_node_and_drops_stale_samples() {
        let fresh = (NOW_MS - 5_000) as f64 / 1000.0;
        let old = (NOW_MS - 300_000) as f64 / 1000.0;
        let gpu = |node: &'static str, i: &'static str| -> [(&'static str, &'static str); 3] {
            [
                ("gpu", i),
                ("Hostname", "exporter-pod"),
                ("kubernetes_node", node),
            ]
        };
        let (a0, a1, b0, b1, c0) = (
            gpu("a", "0"),
            gpu("a", "1"),
            gpu("b", "0"),
            gpu("b", "1"),
            gpu("c", "0"),
        );
        let body = vector(&[
            ("DCGM_FI_DEV_GPU_TEMP", &a0, fresh, "40"),
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", &a0, fresh, "1"),
            ("DCGM_FI_DEV_GPU_TEMP", &a1, old, "40"),
            ("DCGM_FI_DEV_GPU_TEMP", &b0, old, "40"),
            ("DCGM_FI_DEV_GPU_TEMP", &b1, old - 10.0, "40"),
            ("DCGM_FI_DEV_GPU_TEMP", &c0, fresh, "40"),
            ("DCGM_FI_DEV_GPU_TEMP", &[("gpu", "0")], fresh, "40"),
        ]);
        let samples = parse(&body).unwrap();
        let split = by_node(
            ExporterKind::DcgmExporter,
            samples,
            "kubernetes_node",
            NOW_MS,
            30,
        );
        assert_eq!(split.without_node, 1);
        assert_eq!(split.stale_samples, 3);
        assert_eq!(split.stale, BTreeMap::from([("b".to_string(), 300)]));
        assert_eq!(split.fresh.keys().collect::<Vec<_>>(), ["a", "c"]);
        let a = &split.fresh["a"];
        assert_eq!(a.len(), 1, "the stale GPU of node a is left out: {a:?}");
        assert_eq!(
            a[0].node.as_deref(),
            Some("a"),
            "nodeLabel wins over Hostname"
        );
        assert_eq!(a[0].ecc_uncorrectable, Some(1.0));
        // Same GPU index on two nodes: two devices.
        assert_eq!(split.fresh["c"][0].index, Some(0));
    }

    #[test]
    fn stale_answer_has_no_fresh_node() {
        let old = (NOW_MS - 120_000) as f64 / 1000.0;
        let l = [("gpu", "0"), ("Hostname", "n1")];
        let samples = parse(&vector(&[("DCGM_FI_DEV_GPU_TEMP", &l, old, "40")])).unwrap();
        let split = by_node(ExporterKind::DcgmExporter, samples, "Hostname", NOW_MS, 30);
        assert!(split.fresh.is_empty());
        assert_eq!(split.stale["n1"], 120);
    }

    proptest! {
        #[test]
        fn never_panics_on_strings(s in ".{0,400}") {
            let _ = parse(&s);
        }

        #[test]
        fn never_panics_on_json_like_text(s in r#"[\[\]{}",:0-9a-z_. eE+-]{0,300}"#) {
            let _ = parse(&s);
            let wrapped = format!(r#"{{"status":"success","data":{{"resultType":"vector","result":[{{"metric":{{"__name__":"a"}},"value":{s}}}]}}}}"#);
            let _ = parse(&wrapped);
        }

        #[test]
        fn never_panics_on_points(t in proptest::num::f64::ANY, v in ".{0,20}", m in proptest::bool::ANY) {
            let ts = serde_json::Number::from_f64(t).map(Value::Number).unwrap_or(Value::Null);
            let body = if m {
                serde_json::json!({"status":"success","data":{"resultType":"matrix","result":[{"metric":{"__name__":"a","Hostname":"n"},"values":[[ts, v]]}]}})
            } else {
                serde_json::json!({"status":"success","data":{"resultType":"vector","result":[{"metric":{"__name__":"a","Hostname":"n"},"value":[ts, v]}]}})
            };
            if let Ok(samples) = parse(&body.to_string()) {
                let _ = by_node(ExporterKind::DcgmExporter, samples, "Hostname", i64::MAX, i64::MAX);
            }
        }

        #[test]
        fn selector_check_never_panics(s in ".{0,80}") {
            if let Ok(q) = query(ExporterKind::AmdDeviceMetrics, &s, 30) {
                prop_assert!(q.starts_with("{__name__=~"), "{}", q);
                prop_assert!(query_url("http://p:9090", &q).parse::<hyper::Uri>().is_ok(), "{}", q);
            }
        }
    }
}
