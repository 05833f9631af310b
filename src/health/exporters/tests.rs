//! Tests of the exporter mapping: vendor fixtures, device grouping, non-finite values, no panics.

use super::*;
use crate::health::prom;
use proptest::prelude::*;

const DCGM_FIXTURE: &str = include_str!("../testdata/dcgm.prom");
const AMD_FIXTURE: &str = include_str!("../testdata/amd.prom");
const ASCEND_FIXTURE: &str = include_str!("../testdata/ascend.prom");
const GAUDI_FIXTURE: &str = include_str!("../testdata/gaudi.prom");
const DCGM_TRENDS_FIXTURE: &str = include_str!("../testdata/dcgm-trends.prom");
const GARBAGE: &str = include_str!("../testdata/garbage.txt");

fn read(kind: ExporterKind, body: &str, node: Option<&str>) -> Vec<DeviceReading> {
    let samples = prom::parse(body).expect("fixture parses");
    readings(kind, &samples, node)
}

#[test]
fn garbage_is_a_parse_error() {
    let err = prom::parse(GARBAGE).unwrap_err();
    assert_eq!(err.line, 1, "{err}");
}

#[test]
fn dcgm_fixture() {
    let r = read(ExporterKind::DcgmExporter, DCGM_FIXTURE, Some("ignored"));
    assert_eq!(r.len(), 3);
    for d in &r {
        assert_eq!(d.vendor, Some(Vendor::Nvidia));
        assert_eq!(d.node.as_deref(), Some("gpu-node-a"), "Hostname wins");
        assert_eq!(d.model.as_deref(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(d.driver_version.as_deref(), Some("550.90.07"));
        assert!(d.device.starts_with("GPU-"), "{}", d.device);
        assert_eq!(d.uuid.as_deref(), Some(d.device.as_str()));
    }
    let healthy = &r[0];
    assert_eq!(healthy.index, Some(0));
    assert_eq!(healthy.pci_bus_id.as_deref(), Some("00000000:18:00.0"));
    assert_eq!(healthy.temperature_c, Some(34.0));
    assert_eq!(healthy.memory_temperature_c, Some(41.0));
    assert_eq!(healthy.power_w, Some(71.5));
    assert_eq!(healthy.memory_used_mib, Some(1.0));
    assert_eq!(healthy.utilization_percent, Some(0.0));
    assert_eq!(healthy.last_xid, Some(0));
    assert_eq!(healthy.ecc_uncorrectable, Some(0.0));
    assert_eq!(healthy.remapped_rows_uncorrectable, Some(0.0));
    assert_eq!(healthy.row_remap_failure, Some(false));
    assert_eq!(healthy.vendor_healthy, None);
    assert!(healthy.error_codes.is_empty());
    assert_eq!(
        healthy.raw_values.get("DCGM_FI_DEV_SM_CLOCK"),
        Some(&1980.0)
    );
    assert_eq!(
        healthy.raw_labels.get("device").map(|v| v.as_str()),
        Some("nvidia0")
    );

    let ecc = &r[1];
    assert_eq!(ecc.index, Some(1));
    assert_eq!(ecc.ecc_uncorrectable, Some(2.0));
    assert_eq!(ecc.remapped_rows_uncorrectable, Some(1.0));
    assert_eq!(ecc.row_remap_failure, Some(false));
    assert_eq!(ecc.last_xid, Some(0));

    let xid = &r[2];
    assert_eq!(xid.index, Some(2));
    assert_eq!(xid.last_xid, Some(79));
    assert_eq!(xid.ecc_uncorrectable, Some(0.0));
    assert_eq!(xid.utilization_percent, Some(100.0));
}

#[test]
fn amd_fixture() {
    let r = read(ExporterKind::AmdDeviceMetrics, AMD_FIXTURE, None);
    assert_eq!(r.len(), 2, "gpu_nodes_total has no gpu_id and is ignored");
    for d in &r {
        assert_eq!(d.vendor, Some(Vendor::Amd));
        assert_eq!(d.node.as_deref(), Some("mi300-node-7"));
        assert_eq!(d.model.as_deref(), Some("AMD Instinct MI300X OAM"));
        assert_eq!(d.driver_version.as_deref(), Some("6.10.5"));
        assert_eq!(d.firmware_version.as_deref(), Some("113-M3000100-102"));
    }
    let ok = &r[0];
    assert_eq!(ok.index, Some(0));
    assert_eq!(ok.device, "a4ff74a1-0000-1000-80a2-9e4c2f3b2e11");
    assert_eq!(ok.temperature_c, Some(48.0), "junction temperature");
    assert_eq!(ok.memory_temperature_c, Some(39.0));
    assert_eq!(
        ok.power_w,
        Some(162.0),
        "gpu_power_usage before package power"
    );
    assert_eq!(ok.memory_used_mib, Some(285.0));
    assert_eq!(ok.utilization_percent, Some(3.0));
    assert_eq!(ok.ecc_uncorrectable, Some(0.0));
    assert_eq!(ok.vendor_healthy, Some(true));

    let bad = &r[1];
    assert_eq!(bad.index, Some(1));
    assert_eq!(bad.ecc_uncorrectable, Some(4.0));
    assert_eq!(bad.vendor_healthy, Some(false));
    assert_eq!(bad.raw_values.get("gpu_ecc_uncorrect_umc"), Some(&4.0));
    assert_eq!(
        bad.raw_labels.get("serial_number").map(|v| v.as_str()),
        Some("692351000112")
    );
}

#[test]
fn amd_prefixed_names_and_per_block_ecc() {
    let body = "amd_gpu_junction_temperature{gpu_id=\"3\",hostname=\"n\"} 70\n\
                amd_gpu_ecc_uncorrect_umc{gpu_id=\"3\",hostname=\"n\"} 2\n\
                amd_gpu_ecc_uncorrect_gfx{gpu_id=\"3\",hostname=\"n\"} 1\n\
                amd_gpu_package_power{gpu_id=\"3\",hostname=\"n\"} 500\n";
    let r = read(ExporterKind::AmdDeviceMetrics, body, None);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].device, "3");
    assert_eq!(r[0].temperature_c, Some(70.0));
    assert_eq!(r[0].ecc_uncorrectable, Some(3.0));
    assert_eq!(r[0].power_w, Some(500.0));
    assert!(r[0].raw_values.contains_key("amd_gpu_ecc_uncorrect_umc"));
}

#[test]
fn ascend_fixture() {
    let r = read(
        ExporterKind::AscendNpuExporter,
        ASCEND_FIXTURE,
        Some("ascend-node-3"),
    );
    assert_eq!(r.len(), 2, "machine_npu_nums is node-level and ignored");
    for d in &r {
        assert_eq!(d.vendor, Some(Vendor::Huawei));
        assert_eq!(d.node.as_deref(), Some("ascend-node-3"), "default node");
        assert_eq!(d.model.as_deref(), Some("Ascend910B3"));
    }
    let ok = &r[0];
    assert_eq!(ok.index, Some(0));
    assert_eq!(ok.device, "185011D4-21104518-A0C4ED94-14CC040A-56102003");
    assert_eq!(ok.pci_bus_id.as_deref(), Some("0000:C1:00.0"));
    assert_eq!(ok.temperature_c, Some(43.0));
    assert_eq!(ok.memory_temperature_c, Some(40.0));
    assert_eq!(ok.power_w, Some(95.5));
    assert_eq!(ok.memory_used_mib, Some(3383.0));
    assert_eq!(ok.utilization_percent, Some(0.0));
    assert_eq!(ok.ecc_uncorrectable, Some(0.0));
    assert_eq!(ok.vendor_healthy, Some(true));
    assert!(ok.error_codes.is_empty());

    let bad = &r[1];
    assert_eq!(bad.index, Some(1));
    assert_eq!(bad.vendor_healthy, Some(false));
    assert_eq!(bad.error_codes, vec!["0x80E01801".to_string()]);
    assert_eq!(
        bad.raw_values.get("npu_chip_info_error_code"),
        Some(&2_162_169_857.0)
    );
}

#[test]
fn gaudi_fixture() {
    let r = read(
        ExporterKind::GaudiExporter,
        GAUDI_FIXTURE,
        Some("gaudi-node-2"),
    );
    assert_eq!(r.len(), 2, "habanalabs_kube_info has no device identity");
    for d in &r {
        assert_eq!(d.vendor, Some(Vendor::Intel));
        assert_eq!(d.node.as_deref(), Some("gaudi-node-2"));
        assert_eq!(d.driver_version.as_deref(), Some("1.19.1-6f47ddd"));
        assert!(d.uuid.is_some());
    }
    let cool = &r[0];
    assert_eq!(cool.index, Some(0));
    assert_eq!(cool.device, "01P0-HL3090A0-15-TNQ812-11-07-01");
    assert_eq!(cool.temperature_c, Some(38.0));
    assert_eq!(cool.power_w, Some(231.0));
    assert_eq!(cool.memory_used_mib, Some(768.0));
    assert_eq!(cool.utilization_percent, Some(12.0));
    assert_eq!(cool.remapped_rows_uncorrectable, Some(0.0));
    assert_eq!(
        cool.firmware_version.as_deref(),
        Some("hl-gaudi3-1.19.1-fw-57.2.2-sec-9")
    );

    let hot = &r[1];
    assert_eq!(hot.index, Some(1));
    assert_eq!(hot.temperature_c, Some(97.0));
    assert_eq!(
        hot.raw_values.get("habanalabs_temperature_threshold_gpu"),
        Some(&95.0)
    );
    assert_eq!(
        hot.raw_values.get("habanalabs_nic_port_status"),
        Some(&1.0),
        "several ports per device: the largest value is kept"
    );
}

#[test]
fn dcgm_trend_fields_and_the_vendor_names_they_came_from() {
    let r = read(ExporterKind::DcgmExporter, DCGM_TRENDS_FIXTURE, None);
    assert_eq!(r.len(), 2);
    let (quiet, busy) = (&r[0], &r[1]);
    assert_eq!(quiet.ecc_correctable, Some(0.0));
    assert_eq!(quiet.row_remap_pending, Some(false));
    assert_eq!(
        quiet.clock_throttle_active,
        Some(false),
        "idle (0x1) is no throttle"
    );
    assert_eq!(quiet.recovery_action, Some(0));
    assert!(
        quiet.xid_counts.is_empty(),
        "the zero series has no xid label"
    );
    assert_eq!(quiet.pod, None, "empty pod labels: nobody holds it");
    assert_eq!(busy.ecc_correctable, Some(1412.0));
    assert_eq!(busy.row_remap_pending, Some(true));
    assert_eq!(
        busy.clock_throttle_active,
        Some(true),
        "HW thermal (0x40) + power cap"
    );
    assert_eq!(busy.recovery_action, Some(1));
    assert_eq!(busy.last_xid, Some(48));
    assert_eq!(busy.xid_counts, [(13, 5.0), (48, 2.0)].into());
    assert_eq!(
        busy.pod,
        Some(PodRef {
            namespace: "team-b".into(),
            name: "finetune-7".into(),
            container: Some("worker".into()),
        })
    );
    // Exactly one vendor field per signal.
    let field = |s: &str| match busy.signal_fields.get(s).map(Vec::as_slice) {
        Some([one]) => Some(one.as_str()),
        _ => None,
    };
    assert_eq!(
        field("eccCorrectable"),
        Some("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL")
    );
    assert_eq!(
        field("clockThrottle"),
        Some("DCGM_FI_DEV_CLOCKS_EVENT_REASONS")
    );
    assert_eq!(field("resets"), Some("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"));
    assert_eq!(field("xid"), Some("DCGM_EXP_XID_ERRORS_COUNT"));
    assert_eq!(field("temperature"), Some("DCGM_FI_DEV_GPU_TEMP"));
}

#[test]
fn the_pod_holding_each_device_as_each_exporter_says() {
    let holder = |kind, body| -> Vec<Option<(String, String)>> {
        read(kind, body, Some("n"))
            .into_iter()
            .map(|d| d.pod.map(|p| (p.namespace, p.name)))
            .collect()
    };
    let dcgm = holder(ExporterKind::DcgmExporter, DCGM_FIXTURE);
    assert_eq!(dcgm[0], None);
    assert_eq!(dcgm[1], Some(("team-a".into(), "llm-pretrain-0".into())));
    let ascend = holder(ExporterKind::AscendNpuExporter, ASCEND_FIXTURE);
    assert!(ascend.contains(&Some(("team-b".into(), "mindspore-job-1".into()))));
    assert!(ascend.contains(&None));
    let gaudi = holder(ExporterKind::GaudiExporter, GAUDI_FIXTURE);
    assert!(gaudi.iter().flatten().count() > 0, "{gaudi:?}");
    assert!(
        gaudi
            .iter()
            .flatten()
            .all(|(_, pod)| pod == "optimum-habana-0"),
        "the exporter's own pod (habanalabs_kube_info) holds no device: {gaudi:?}"
    );
}

#[test]
fn correctable_ecc_from_amd_and_ascend_and_never_a_failed_read() {
    let amd = read(ExporterKind::AmdDeviceMetrics, AMD_FIXTURE, None);
    assert_eq!(amd[1].ecc_correctable, Some(17.0));
    assert_eq!(
        amd[1]
            .signal_fields
            .get("eccCorrectable")
            .map(Vec::as_slice),
        Some(["gpu_ecc_correct_total".into()].as_slice())
    );
    let body = "npu_chip_info_hbm_ecc_single_bit_error_cnt{id=\"0\",model_name=\"910B\"} -1\n";
    let ascend = read(ExporterKind::AscendNpuExporter, body, Some("n"));
    assert_eq!(
        ascend[0].ecc_correctable, None,
        "-1: the exporter could not read it"
    );
}

#[test]
fn non_device_samples_are_ignored() {
    let body = "go_goroutines 12\nprocess_cpu_seconds_total 3.2\n\
                promhttp_metric_handler_requests_total{code=\"200\"} 5\n\
                DCGM_FI_DEV_GPU_TEMP{Hostname=\"x\"} 40\n";
    for kind in ExporterKind::ALL {
        assert!(read(kind, body, Some("n")).is_empty(), "{kind:?}");
    }
}

#[test]
fn wrong_kind_reads_nothing() {
    assert!(read(ExporterKind::AmdDeviceMetrics, DCGM_FIXTURE, None).is_empty());
    assert!(read(ExporterKind::DcgmExporter, ASCEND_FIXTURE, None).is_empty());
    assert!(read(ExporterKind::AscendNpuExporter, GAUDI_FIXTURE, None).is_empty());
}

#[test]
fn non_finite_values_read_as_not_reported_but_stay_raw() {
    let body = "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\"} NaN\nDCGM_FI_DEV_XID_ERRORS{gpu=\"0\"} +Inf\n";
    let r = read(ExporterKind::DcgmExporter, body, None);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].device, "0");
    assert_eq!(r[0].node, None);
    assert_eq!(r[0].temperature_c, None);
    assert_eq!(r[0].last_xid, None);
    assert!(r[0].raw_values["DCGM_FI_DEV_GPU_TEMP"].is_nan());
}

#[test]
fn devices_on_different_hosts_stay_apart() {
    let body = "DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"b\"} 1\n\
                DCGM_FI_DEV_GPU_TEMP{gpu=\"0\",Hostname=\"a\"} 2\n";
    let r = read(ExporterKind::DcgmExporter, body, None);
    let nodes: Vec<_> = r.iter().map(|d| d.node.clone().unwrap()).collect();
    assert_eq!(nodes, ["a", "b"]);
}

#[test]
fn serialises_camel_case() {
    let r = read(ExporterKind::AscendNpuExporter, ASCEND_FIXTURE, Some("n"));
    let json = serde_json::to_value(&r[1]).unwrap();
    assert_eq!(json["vendorHealthy"], serde_json::json!(false));
    assert_eq!(json["errorCodes"][0], serde_json::json!("0x80E01801"));
    assert_eq!(json["vendor"], serde_json::json!("huawei"));
    let kind = serde_json::to_value(ExporterKind::AscendNpuExporter).unwrap();
    assert_eq!(kind, serde_json::json!("ascend-npu-exporter"));
}

fn arb_samples() -> impl Strategy<Value = Vec<Sample>> {
    let names = prop::sample::select(vec![
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        "gpu_ecc_uncorrect_umc",
        "amd_gpu_health",
        "gpu_",
        "_gpu_",
        "npu_chip_info_error_code",
        "npu_chip_info_error_code_",
        "npu_chip_info_error_code_7",
        "npu_chip_info_health_status",
        "habanalabs_power_mW",
        "habanalabs_memory_used_bytes",
        "go_goroutines",
        "x",
    ]);
    let keys = prop::sample::select(vec![
        "gpu",
        "UUID",
        "Hostname",
        "gpu_id",
        "gpu_uuid",
        "serial_number",
        "hostname",
        "id",
        "vdie_id",
        "UUID",
        "Serial",
        "index",
        "modelName",
        "card_model",
        "other",
    ]);
    let value = prop_oneof![
        any::<f64>(),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(0.0),
        Just(1.0),
        Just(u64::MAX as f64),
        Just(4_294_967_296.0),
    ];
    let label_value = prop_oneof![Just(String::new()), "[0-9]{1,11}", any::<String>()];
    let sample = (
        names,
        prop::collection::btree_map(keys.prop_map(str::to_string), label_value, 0..5),
        value,
    )
        .prop_map(|(name, labels, value)| Sample {
            name: name.to_string(),
            labels,
            value,
            timestamp_ms: None,
        });
    prop::collection::vec(sample, 0..24)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn readings_never_panic(samples in arb_samples(), node in proptest::option::of("[a-z]{1,5}")) {
        for kind in ExporterKind::ALL {
            let r = readings(kind, &samples, node.as_deref());
            prop_assert!(r.len() <= samples.len());
            for d in &r {
                prop_assert_eq!(d.vendor, Some(kind.vendor()));
                prop_assert!(!d.device.is_empty());
                prop_assert!(!d.raw_values.is_empty());
                for v in [d.temperature_c, d.power_w, d.memory_used_mib, d.ecc_uncorrectable] {
                    prop_assert!(v.is_none_or(f64::is_finite));
                }
            }
        }
    }
}

#[test]
fn devices_share_the_names_and_label_texts_they_report_alike() {
    let first = read(ExporterKind::DcgmExporter, DCGM_FIXTURE, None);
    let other_node = DCGM_FIXTURE.replace("gpu-node-a", "gpu-node-b");
    let second = read(ExporterKind::DcgmExporter, &other_node, None);
    let same = |a: &str, b: &str| std::ptr::eq(a.as_ptr(), b.as_ptr());
    let (a, b) = (&first[0], &second[1]);
    for ((name_a, _), (name_b, _)) in a.raw_values.iter().zip(&b.raw_values) {
        assert_eq!(name_a, name_b);
        assert!(same(name_a, name_b), "metric {name_a} is one text");
    }
    let model = |r: &DeviceReading| r.raw_labels["modelName"].clone();
    assert!(
        same(&model(a), &model(b)),
        "the model label's value is one text"
    );
    let (key_a, _) = a.raw_labels.get_key_value("Hostname").unwrap();
    let (key_b, _) = b.raw_labels.get_key_value("Hostname").unwrap();
    assert!(same(key_a, key_b), "label names are one text");
    assert_eq!(a.raw_labels["Hostname"], "gpu-node-a");
    assert_eq!(b.raw_labels["Hostname"], "gpu-node-b");
    let signal = |r: &DeviceReading| r.signal_fields.values().next().unwrap()[0].clone();
    assert!(
        same(&signal(a), &signal(b)),
        "trend signal fields are one text"
    );
}
