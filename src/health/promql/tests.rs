//! Tests of the PromQL source: answers and errors, the query against the mapping, the node split.

use super::*;
use crate::health::prom;
use proptest::prelude::*;
use serde_json::Value;

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
    let err = parse(r#"{"status":"error","errorType":"bad_data","error":"parse error at char 3"}"#)
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
        name_regex(ExporterKind::AmdDeviceMetrics).starts_with("(.+_)?(gpu_junction_temperature|")
    );
    assert!(
        name_regex(ExporterKind::AscendNpuExporter).ends_with("|npu_chip_info_error_code_[0-9]+")
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
            include_str!("../testdata/dcgm.prom"),
        ),
        (
            ExporterKind::AmdDeviceMetrics,
            include_str!("../testdata/amd.prom"),
        ),
        (
            ExporterKind::AscendNpuExporter,
            include_str!("../testdata/ascend.prom"),
        ),
        (
            ExporterKind::GaudiExporter,
            include_str!("../testdata/gaudi.prom"),
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
fn query_selects_every_trend_field() {
    let all = prom::parse(include_str!("../testdata/dcgm-trends.prom")).unwrap();
    for s in &all {
        assert!(
            selects(ExporterKind::DcgmExporter, &s.name),
            "{} is read by the trend rules",
            s.name
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
