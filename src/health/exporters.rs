//! Vendor exporter metrics, read into one [`DeviceReading`] per device.
//!
//! Each exporter names the same concepts differently (temperature, power, memory in
//! use, utilisation, uncorrectable memory errors, the vendor's own health verdict and
//! fault codes). This module maps the documented names onto one shape and keeps every
//! original sample under it (`raw_values`, `raw_labels`) for the engineer who needs
//! the vendor's own field. It reads a scrape that already parsed
//! ([`crate::health::prom::parse`]); a source that did not parse is the caller's
//! "source unavailable", never an empty reading.
//!
//! Where the names come from (checked against the vendors' public material):
//! - NVIDIA dcgm-exporter: `etc/default-counters.csv` in NVIDIA/dcgm-exporter (field
//!   names and units: temperatures in C, power in W, framebuffer in MiB, utilisation
//!   in %, last XID, volatile DBE count, remapped rows, row-remap failure). Series
//!   labels `gpu`, `UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`,
//!   `DCGM_FI_DRIVER_VERSION` as in the project's reference facts.
//! - AMD device-metrics-exporter: `docs/configuration/metricslist.md` and
//!   `pkg/exporter/proto/exporterconfig.proto` in ROCm/device-metrics-exporter
//!   (fields `GPU_*`, exported lower-case; `GPU_HEALTH` 1 healthy / 0 unhealthy;
//!   labels `gpu_id`, `gpu_uuid`, `serial_number`, `card_model`, `card_series`,
//!   `hostname`, `driver_version`, `vbios_version`). The exporter can prefix every
//!   name (`CommonConfig.MetricsFieldPrefix`, e.g. `amd_`); the prefix is ignored.
//! - Huawei Ascend npu-exporter (MindCluster): the "Prometheus Metrics" API pages on
//!   hiascend.com (`npu_chip_info_*`, labels `id`, `model_name`, `vdie_id`,
//!   `pcie_bus_info`, `pod_name`, `namespace`, `container_name`;
//!   `npu_chip_info_health_status` 1 healthy / 0 not; `npu_chip_info_error_code`;
//!   HBM used memory in MB). The HBM ECC counters
//!   (`npu_chip_info_hbm_ecc_double_bit_error_cnt`, `..._total_double_bit_error_cnt`)
//!   and `npu_chip_info_hbm_temperature` appear in the exporter's metric descriptors
//!   and in third-party dashboards, not in the page checked. The numbered
//!   `npu_chip_info_error_code_<n>` series (more than one active fault) are an
//!   assumption: harmless if absent.
//! - Intel Gaudi (habanalabs) metric exporter: the metric names are those listed by
//!   Intel's documentation and repositories (`habanalabs_temperature_onchip`,
//!   `habanalabs_power_mW` in mW, `habanalabs_memory_used_bytes`,
//!   `habanalabs_utilization`, `habanalabs_pending_rows_with_double_bit_ecc_errors`,
//!   ...). The label set is NOT confirmed from Habana's own page: the labels read here
//!   (`UUID`, `Serial`/`serial`, `id`, `driver`, `spi`/`fit`) follow an
//!   Intel-published re-implementation of the exporter. Identity falls back from
//!   index to UUID to serial, so a different label set still groups correctly as long
//!   as one of them is present.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::Vendor;
use crate::health::prom::Sample;

/// Which vendor exporter a scrape comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ExporterKind {
    /// NVIDIA dcgm-exporter (`DCGM_FI_*`).
    DcgmExporter,
    /// AMD device-metrics-exporter (`gpu_*`).
    AmdDeviceMetrics,
    /// Huawei Ascend npu-exporter (`npu_chip_info_*`).
    AscendNpuExporter,
    /// Intel Gaudi metric exporter (`habanalabs_*`).
    GaudiExporter,
}

impl ExporterKind {
    pub const ALL: [ExporterKind; 4] = [
        ExporterKind::DcgmExporter,
        ExporterKind::AmdDeviceMetrics,
        ExporterKind::AscendNpuExporter,
        ExporterKind::GaudiExporter,
    ];

    pub fn vendor(self) -> Vendor {
        match self {
            ExporterKind::DcgmExporter => Vendor::Nvidia,
            ExporterKind::AmdDeviceMetrics => Vendor::Amd,
            ExporterKind::AscendNpuExporter => Vendor::Huawei,
            ExporterKind::GaudiExporter => Vendor::Intel,
        }
    }

    fn profile(self) -> &'static Profile {
        match self {
            ExporterKind::DcgmExporter => &DCGM,
            ExporterKind::AmdDeviceMetrics => &AMD,
            ExporterKind::AscendNpuExporter => &ASCEND,
            ExporterKind::GaudiExporter => &GAUDI,
        }
    }
}

/// One device as an exporter describes it, vendor-neutral, with the raw fields kept.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceReading {
    pub vendor: Option<Vendor>,
    /// Node the device is on, from the exporter's hostname label (e.g. DCGM `Hostname`), or the source's configured node.
    pub node: Option<String>,
    /// Stable device id: UUID when the exporter gives one, else the index as a string.
    pub device: String,
    pub index: Option<u32>,
    pub uuid: Option<String>,
    pub model: Option<String>,
    pub pci_bus_id: Option<String>,
    pub temperature_c: Option<f64>,
    pub memory_temperature_c: Option<f64>,
    pub power_w: Option<f64>,
    pub memory_used_mib: Option<f64>,
    pub utilization_percent: Option<f64>,
    /// Last XID (NVIDIA), 0 = none.
    pub last_xid: Option<u64>,
    /// Uncorrectable (double-bit) ECC errors, volatile/total as the vendor counts them.
    pub ecc_uncorrectable: Option<f64>,
    pub remapped_rows_uncorrectable: Option<f64>,
    pub row_remap_failure: Option<bool>,
    /// Vendor's own health verdict where it publishes one (Ascend npu_chip_info_health_status: 1 healthy / 0 not; AMD/Gaudi equivalents if any).
    pub vendor_healthy: Option<bool>,
    /// Vendor fault/error codes (Ascend npu_chip_info_error_code != 0, ...), as strings.
    pub error_codes: Vec<String>,
    pub driver_version: Option<String>,
    pub firmware_version: Option<String>,
    /// Every original sample for this device: metric name -> value, and the label set of the first sample, kept for the engineer who needs the raw field.
    pub raw_values: BTreeMap<String, f64>,
    pub raw_labels: BTreeMap<String, String>,
}

/// How one exporter names things. Label lists are in order of preference.
struct Profile {
    /// The vendor-neutral name of a metric this exporter owns (prefix stripped where
    /// the exporter allows one), or None for anything else (go_*, process_*, ...).
    normalise: fn(&str) -> Option<&str>,
    index: &'static [&'static str],
    uuid: &'static [&'static str],
    serial: &'static [&'static str],
    node: &'static [&'static str],
    model: &'static [&'static str],
    pci: &'static [&'static str],
    driver: &'static [&'static str],
    firmware: &'static [&'static str],
    /// Fill the normalised fields from the per-device values (normalised names).
    fill: fn(&mut DeviceReading, &BTreeMap<String, f64>),
}

static DCGM: Profile = Profile {
    normalise: |n| n.starts_with("DCGM_").then_some(n),
    index: &["gpu"],
    uuid: &["UUID"],
    serial: &[],
    node: &["Hostname"],
    model: &["modelName"],
    pci: &["pci_bus_id"],
    driver: &["DCGM_FI_DRIVER_VERSION"],
    // Only present when the counters file exports the VBIOS field as a label.
    firmware: &["DCGM_FI_DEV_VBIOS_VERSION"],
    fill: fill_dcgm,
};

static AMD: Profile = Profile {
    normalise: normalise_amd,
    index: &["gpu_id"],
    uuid: &["gpu_uuid"],
    serial: &["serial_number"],
    node: &["hostname"],
    // `card_series` is the marketing name (e.g. "AMD Instinct MI300X OAM");
    // `card_model` is often a PCI device id (e.g. "0x74a1").
    model: &["card_series", "card_model"],
    pci: &[],
    driver: &["driver_version"],
    firmware: &["vbios_version"],
    fill: fill_amd,
};

static ASCEND: Profile = Profile {
    normalise: |n| n.starts_with("npu_chip_").then_some(n),
    index: &["id"],
    uuid: &["vdie_id"],
    serial: &[],
    node: &[],
    model: &["model_name"],
    pci: &["pcie_bus_info"],
    driver: &[],
    firmware: &[],
    fill: fill_ascend,
};

static GAUDI: Profile = Profile {
    normalise: |n| n.starts_with("habanalabs_").then_some(n),
    index: &["id", "index"],
    uuid: &["UUID", "uuid"],
    serial: &["Serial", "serial"],
    node: &[],
    model: &[],
    pci: &[],
    driver: &["driver"],
    firmware: &["spi", "fit"],
    fill: fill_gaudi,
};

/// AMD names, with an optional configured prefix (`amd_gpu_edge_temperature`)
/// stripped: the name from the first `gpu_` / `pcie_` that starts a `_`-separated word.
fn normalise_amd(name: &str) -> Option<&str> {
    let mut start = 0;
    loop {
        let rest = name.get(start..)?;
        if rest.starts_with("gpu_") || rest.starts_with("pcie_") {
            return Some(rest);
        }
        start += rest.find('_')? + 1;
    }
}

/// Group samples into devices. Samples that belong to no device (process metrics, go_* etc.) are ignored. `default_node` is used when the exporter has no hostname label.
pub fn readings(
    kind: ExporterKind,
    samples: &[Sample],
    default_node: Option<&str>,
) -> Vec<DeviceReading> {
    let profile = kind.profile();
    let mut devices: BTreeMap<DeviceKey, Builder> = BTreeMap::new();
    for sample in samples {
        let Some(normalised) = (profile.normalise)(&sample.name) else {
            continue;
        };
        let index_raw = first_label(sample, profile.index);
        let index = index_raw.and_then(|v| v.trim().parse::<u32>().ok());
        let uuid = first_label(sample, profile.uuid);
        let serial = first_label(sample, profile.serial);
        let ident = match (index, uuid.or(serial).or(index_raw)) {
            (Some(i), _) => IdentKey::Index(i),
            (None, Some(id)) => IdentKey::Name(id.to_string()),
            // No device identity: a node-level series (e.g. a device count).
            (None, None) => continue,
        };
        let node = first_label(sample, profile.node)
            .or(default_node)
            .map(str::to_string);
        let builder = devices
            .entry(DeviceKey {
                node: node.clone(),
                ident,
            })
            .or_insert_with(|| Builder::new(kind.vendor(), node, sample));
        builder.absorb(profile, sample, normalised, index, uuid);
    }
    devices.into_values().map(|b| b.finish(profile)).collect()
}

/// Devices sort by node, then index, then name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct DeviceKey {
    node: Option<String>,
    ident: IdentKey,
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum IdentKey {
    Index(u32),
    Name(String),
}

struct Builder {
    reading: DeviceReading,
    /// Normalised metric name -> value (largest when reported more than once).
    values: BTreeMap<String, f64>,
    /// The identity label value when the index label was not a number.
    fallback_ident: Option<String>,
}

impl Builder {
    fn new(vendor: Vendor, node: Option<String>, first: &Sample) -> Self {
        Builder {
            reading: DeviceReading {
                vendor: Some(vendor),
                node,
                raw_labels: first.labels.clone(),
                ..Default::default()
            },
            values: BTreeMap::new(),
            fallback_ident: None,
        }
    }

    fn absorb(
        &mut self,
        p: &Profile,
        s: &Sample,
        normalised: &str,
        index: Option<u32>,
        uuid: Option<&str>,
    ) {
        let r = &mut self.reading;
        r.index = r.index.or(index);
        fill_label(&mut r.uuid, uuid);
        fill_label(&mut r.model, first_label(s, p.model));
        fill_label(&mut r.pci_bus_id, first_label(s, p.pci));
        fill_label(&mut r.driver_version, first_label(s, p.driver));
        fill_label(&mut r.firmware_version, first_label(s, p.firmware));
        fill_label(
            &mut self.fallback_ident,
            first_label(s, p.serial).or(first_label(s, p.index)),
        );
        merge_max(&mut r.raw_values, &s.name, s.value);
        merge_max(&mut self.values, normalised, s.value);
    }

    fn finish(mut self, p: &Profile) -> DeviceReading {
        let r = &mut self.reading;
        r.device = match (&r.uuid, r.index, self.fallback_ident) {
            (Some(uuid), _, _) => uuid.clone(),
            (None, Some(i), _) => i.to_string(),
            (None, None, Some(id)) => id,
            (None, None, None) => String::new(),
        };
        (p.fill)(r, &self.values);
        self.reading
    }
}

/// The first non-empty value among `names`.
fn first_label<'a>(s: &'a Sample, names: &[&str]) -> Option<&'a str> {
    names
        .iter()
        .filter_map(|n| s.labels.get(*n))
        .map(|v| v.trim())
        .find(|v| !v.is_empty())
}

fn fill_label(slot: &mut Option<String>, value: Option<&str>) {
    if slot.is_none()
        && let Some(v) = value
    {
        *slot = Some(v.to_string());
    }
}

/// Keep the largest value per name; a NaN never hides a number.
fn merge_max(map: &mut BTreeMap<String, f64>, name: &str, value: f64) {
    match map.get_mut(name) {
        Some(old) if old.is_nan() || value > *old => *old = value,
        Some(_) => {}
        None => {
            map.insert(name.to_string(), value);
        }
    }
}

/// A finite value for a metric (NaN / ±Inf read as "not reported").
fn num(values: &BTreeMap<String, f64>, name: &str) -> Option<f64> {
    values.get(name).copied().filter(|v| v.is_finite())
}

fn first_num(values: &BTreeMap<String, f64>, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| num(values, n))
}

/// A counter or code read as an unsigned integer (negative or fractional: None).
fn to_u64(v: f64) -> Option<u64> {
    (v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

fn fill_dcgm(r: &mut DeviceReading, v: &BTreeMap<String, f64>) {
    r.temperature_c = num(v, "DCGM_FI_DEV_GPU_TEMP");
    r.memory_temperature_c = num(v, "DCGM_FI_DEV_MEMORY_TEMP");
    r.power_w = num(v, "DCGM_FI_DEV_POWER_USAGE");
    r.memory_used_mib = num(v, "DCGM_FI_DEV_FB_USED");
    r.utilization_percent = num(v, "DCGM_FI_DEV_GPU_UTIL");
    r.last_xid = num(v, "DCGM_FI_DEV_XID_ERRORS").and_then(to_u64);
    // Volatile (since the driver loaded) first; the aggregate (lifetime) count when
    // only that is exported.
    r.ecc_uncorrectable = first_num(
        v,
        &[
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        ],
    );
    r.remapped_rows_uncorrectable = num(v, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS");
    r.row_remap_failure = num(v, "DCGM_FI_DEV_ROW_REMAP_FAILURE").map(|f| f != 0.0);
}

fn fill_amd(r: &mut DeviceReading, v: &BTreeMap<String, f64>) {
    // MI3xx publish the junction (hotspot) temperature only, MI2xx the edge one.
    r.temperature_c = first_num(v, &["gpu_junction_temperature", "gpu_edge_temperature"]);
    r.memory_temperature_c = num(v, "gpu_memory_temperature");
    r.power_w = first_num(
        v,
        &[
            "gpu_power_usage",
            "gpu_package_power",
            "gpu_average_package_power",
        ],
    );
    r.memory_used_mib = num(v, "gpu_used_vram");
    r.utilization_percent = num(v, "gpu_gfx_activity");
    // The total when exported, else the sum of the per-block counters.
    r.ecc_uncorrectable = num(v, "gpu_ecc_uncorrect_total").or_else(|| {
        let blocks: Vec<f64> = v
            .iter()
            .filter(|(k, _)| k.starts_with("gpu_ecc_uncorrect_"))
            .filter_map(|(_, x)| x.is_finite().then_some(*x))
            .collect();
        (!blocks.is_empty()).then(|| blocks.iter().sum())
    });
    r.vendor_healthy = num(v, "gpu_health").map(|h| h == 1.0);
}

fn fill_ascend(r: &mut DeviceReading, v: &BTreeMap<String, f64>) {
    r.temperature_c = num(v, "npu_chip_info_temperature");
    r.memory_temperature_c = num(v, "npu_chip_info_hbm_temperature");
    r.power_w = num(v, "npu_chip_info_power");
    // HBM on training chips; DDR (`used_memory`) on inference cards without HBM. MB.
    r.memory_used_mib = first_num(
        v,
        &["npu_chip_info_hbm_used_memory", "npu_chip_info_used_memory"],
    );
    r.utilization_percent = num(v, "npu_chip_info_utilization");
    r.ecc_uncorrectable = first_num(
        v,
        &[
            "npu_chip_info_hbm_ecc_double_bit_error_cnt",
            "npu_chip_info_hbm_ecc_total_double_bit_error_cnt",
        ],
    );
    r.vendor_healthy = num(v, "npu_chip_info_health_status").map(|h| h == 1.0);
    let mut codes: Vec<String> = v
        .iter()
        .filter(|(k, _)| {
            k.strip_prefix("npu_chip_info_error_code")
                .is_some_and(|rest| {
                    rest.is_empty()
                        || rest
                            .strip_prefix('_')
                            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
        })
        .filter_map(|(_, code)| format_error_code(*code))
        .collect();
    codes.sort();
    codes.dedup();
    r.error_codes = codes;
}

/// Ascend fault codes are 32-bit values documented in hex (e.g. `0x80E01801`); a
/// value that is not a non-negative integer is kept as written.
fn format_error_code(code: f64) -> Option<String> {
    if code == 0.0 || code.is_nan() {
        return None;
    }
    Some(match to_u64(code) {
        Some(c) => format!("0x{c:08X}"),
        None => crate::health::prom::format_value(code),
    })
}

fn fill_gaudi(r: &mut DeviceReading, v: &BTreeMap<String, f64>) {
    r.temperature_c = num(v, "habanalabs_temperature_onchip");
    r.power_w = num(v, "habanalabs_power_mW").map(|mw| mw / 1000.0);
    r.memory_used_mib = num(v, "habanalabs_memory_used_bytes").map(|b| b / (1024.0 * 1024.0));
    r.utilization_percent = num(v, "habanalabs_utilization");
    // Rows waiting to be replaced because of double-bit errors: the Gaudi
    // counterpart of NVIDIA's rows remapped for uncorrectable errors. Gaudi's
    // exporter publishes no separate uncorrectable-ECC event counter.
    r.remapped_rows_uncorrectable = num(v, "habanalabs_pending_rows_with_double_bit_ecc_errors");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::prom;
    use proptest::prelude::*;

    const DCGM_FIXTURE: &str = include_str!("testdata/dcgm.prom");
    const AMD_FIXTURE: &str = include_str!("testdata/amd.prom");
    const ASCEND_FIXTURE: &str = include_str!("testdata/ascend.prom");
    const GAUDI_FIXTURE: &str = include_str!("testdata/gaudi.prom");
    const GARBAGE: &str = include_str!("testdata/garbage.txt");

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
            healthy.raw_labels.get("device").map(String::as_str),
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
            bad.raw_labels.get("serial_number").map(String::as_str),
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
}
