//! How each vendor exporter names things, and how its metrics fill a [`DeviceReading`].
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

use super::DeviceReading;
use crate::health::prom::Sample;
use crate::health::shared_text::FieldMap;

/// How one exporter names things. Label lists are in order of preference.
pub(super) struct Profile {
    /// The vendor-neutral name of a metric this exporter owns (prefix stripped where
    /// the exporter allows one), or None for anything else (go_*, process_*, ...).
    pub(super) normalise: fn(&str) -> Option<&str>,
    pub(super) index: &'static [&'static str],
    pub(super) uuid: &'static [&'static str],
    pub(super) serial: &'static [&'static str],
    pub(super) node: &'static [&'static str],
    pub(super) model: &'static [&'static str],
    pub(super) pci: &'static [&'static str],
    pub(super) driver: &'static [&'static str],
    pub(super) firmware: &'static [&'static str],
    /// The pod holding the device, where the exporter attributes it (empty values:
    /// no pod holds it).
    pub(super) pod: &'static [&'static str],
    pub(super) pod_namespace: &'static [&'static str],
    pub(super) container: &'static [&'static str],
    /// Fill the normalised fields from the per-device values (normalised names).
    pub(super) fill: fn(&mut DeviceReading, &FieldMap<f64>),
    /// Series whose labels carry a value (dcgm-exporter's per-XID counts), read
    /// sample by sample: (reading, normalised name, sample).
    pub(super) keyed: Option<fn(&mut DeviceReading, &str, &Sample)>,
}

pub(super) static DCGM: Profile = Profile {
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
    // Kubernetes mode (`-k`); `--use-old-namespace` spells them `pod_name`, ...
    pod: &["pod", "pod_name"],
    pod_namespace: &["namespace", "pod_namespace"],
    container: &["container", "container_name"],
    fill: fill_dcgm,
    keyed: Some(dcgm_xid_count),
};

pub(super) static AMD: Profile = Profile {
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
    // Always present, filled on Kubernetes from the kubelet's pod resources.
    pod: &["pod"],
    pod_namespace: &["namespace"],
    container: &["container"],
    fill: fill_amd,
    keyed: None,
};

pub(super) static ASCEND: Profile = Profile {
    normalise: |n| n.starts_with("npu_chip_").then_some(n),
    index: &["id"],
    uuid: &["vdie_id"],
    serial: &[],
    node: &[],
    model: &["model_name"],
    pci: &["pcie_bus_info"],
    driver: &[],
    firmware: &[],
    // From the container runtime's io.kubernetes.* labels.
    pod: &["pod_name"],
    pod_namespace: &["namespace"],
    container: &["container_name"],
    fill: fill_ascend,
    keyed: None,
};

pub(super) static GAUDI: Profile = Profile {
    normalise: |n| n.starts_with("habanalabs_").then_some(n),
    index: &["id", "index"],
    uuid: &["UUID", "uuid"],
    serial: &["Serial", "serial"],
    node: &[],
    model: &[],
    pci: &[],
    driver: &["driver"],
    firmware: &["spi", "fit"],
    // Not confirmed from Habana's own page (see above); no container label.
    pod: &["pod_name"],
    pod_namespace: &["pod_namespace"],
    container: &[],
    fill: fill_gaudi,
    keyed: None,
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

/// A finite value for a metric (NaN / ±Inf read as "not reported").
fn num(values: &FieldMap<f64>, name: &str) -> Option<f64> {
    values.get(name).copied().filter(|v| v.is_finite())
}

fn first_num(values: &FieldMap<f64>, names: &[&str]) -> Option<f64> {
    names.iter().find_map(|n| num(values, n))
}

/// A counter or code read as an unsigned integer (negative or fractional: None).
fn to_u64(v: f64) -> Option<u64> {
    (v >= 0.0 && v.fract() == 0.0 && v < u64::MAX as f64).then_some(v as u64)
}

/// The first of `names` present, recorded as where trend signal `signal` came from.
fn traced(r: &mut DeviceReading, signal: &str, v: &FieldMap<f64>, names: &[&str]) -> Option<f64> {
    let (name, value) = names.iter().find_map(|n| num(v, n).map(|x| (*n, x)))?;
    r.signal_fields.insert(signal, vec![name.into()]);
    Some(value)
}

/// A counter exported as a `total`, or else as per-block counters `<prefix>*` summed
/// (AMD's ECC counts); the fields read are recorded under `signal`.
fn total_or_blocks(
    r: &mut DeviceReading,
    signal: &str,
    v: &FieldMap<f64>,
    total: &str,
    prefix: &str,
) -> Option<f64> {
    if let Some(t) = traced(r, signal, v, &[total]) {
        return Some(t);
    }
    let blocks: Vec<(&crate::health::shared_text::SharedText, f64)> = v
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(k, x)| x.is_finite().then_some((k, *x)))
        .collect();
    if blocks.is_empty() {
        return None;
    }
    r.signal_fields.insert(
        signal,
        blocks.iter().map(|(k, _)| k.as_str().into()).collect(),
    );
    Some(blocks.iter().map(|(_, x)| x).sum())
}

/// dcgm-exporter's XID collector: `DCGM_EXP_XID_ERRORS_COUNT{xid="79"}`, one series
/// per XID seen.
fn dcgm_xid_count(r: &mut DeviceReading, name: &str, s: &Sample) {
    if name != "DCGM_EXP_XID_ERRORS_COUNT" || !s.value.is_finite() {
        return;
    }
    if let Some(xid) = s
        .labels
        .get("xid")
        .and_then(|x| x.trim().parse::<u64>().ok())
    {
        let count = r.xid_counts.entry(xid).or_insert(s.value);
        *count = count.max(s.value);
        r.signal_fields
            .insert("xid", vec!["DCGM_EXP_XID_ERRORS_COUNT".into()]);
    }
}

/// NVML clock event (throttle) reasons that mean the hardware is holding clocks
/// down: HW slowdown 0x8, SW thermal 0x20, HW thermal 0x40, HW power brake 0x80.
/// Idle 0x1, application clocks 0x2, SW power cap 0x4, sync boost 0x10 and display
/// clocks 0x100 are how a healthy card runs.
pub(super) const DEGRADING_CLOCK_REASONS: u64 = 0x8 | 0x20 | 0x40 | 0x80;

/// The last-XID field (renamed in DCGM 4.6).
const DCGM_LAST_XID: [&str; 2] = ["DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_XID_ERROR"];

fn fill_dcgm(r: &mut DeviceReading, v: &FieldMap<f64>) {
    r.temperature_c = traced(r, "temperature", v, &["DCGM_FI_DEV_GPU_TEMP"]);
    r.memory_temperature_c = traced(r, "memoryTemperature", v, &["DCGM_FI_DEV_MEMORY_TEMP"]);
    r.power_w = num(v, "DCGM_FI_DEV_POWER_USAGE");
    r.memory_used_mib = num(v, "DCGM_FI_DEV_FB_USED");
    r.utilization_percent = num(v, "DCGM_FI_DEV_GPU_UTIL");
    // DCGM 4.6 renamed some fields and keeps the old names; exporters use either.
    // The trend rules count XIDs from the per-XID counts when the exporter has them.
    r.last_xid = if r.xid_counts.is_empty() {
        traced(r, "xid", v, &DCGM_LAST_XID)
    } else {
        first_num(v, &DCGM_LAST_XID)
    }
    .and_then(to_u64);
    // Volatile (since the driver loaded) first; the aggregate (lifetime) count when
    // only that is exported.
    r.ecc_uncorrectable = traced(
        r,
        "eccUncorrectable",
        v,
        &[
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        ],
    );
    r.remapped_rows_uncorrectable = first_num(
        v,
        &[
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL",
        ],
    );
    r.row_remap_failure = first_num(
        v,
        &[
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_ROW_REMAP_FAILED",
        ],
    )
    .map(|f| f != 0.0);
    // DCGM >= 4.5 (nvmlDeviceGpuRecoveryAction_t); not in the exporter's default CSV.
    r.recovery_action = traced(
        r,
        "resets",
        v,
        &[
            "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "DCGM_FI_DEV_GPU_RECOVERY_ACTION",
        ],
    )
    .and_then(to_u64);
    r.ecc_correctable = traced(
        r,
        "eccCorrectable",
        v,
        &[
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        ],
    );
    r.row_remap_pending =
        traced(r, "rowRemapPending", v, &["DCGM_FI_DEV_ROW_REMAP_PENDING"]).map(|p| p != 0.0);
    // Renamed from THROTTLE to CLOCKS_EVENT in DCGM 3.2; exporters publish either.
    r.clock_throttle_active = traced(
        r,
        "clockThrottle",
        v,
        &[
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        ],
    )
    .and_then(to_u64)
    .map(|reasons| reasons & DEGRADING_CLOCK_REASONS != 0);
}

fn fill_amd(r: &mut DeviceReading, v: &FieldMap<f64>) {
    // MI3xx publish the junction (hotspot) temperature only, MI2xx the edge one.
    r.temperature_c = traced(
        r,
        "temperature",
        v,
        &["gpu_junction_temperature", "gpu_edge_temperature"],
    );
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
    r.ecc_uncorrectable = total_or_blocks(
        r,
        "eccUncorrectable",
        v,
        "gpu_ecc_uncorrect_total",
        "gpu_ecc_uncorrect_",
    );
    r.vendor_healthy = num(v, "gpu_health").map(|h| h == 1.0);
    // A gauge holding a count (every AMD metric is a gauge): trend rules read its rise.
    r.ecc_correctable = total_or_blocks(
        r,
        "eccCorrectable",
        v,
        "gpu_ecc_correct_total",
        "gpu_ecc_correct_",
    );
}

fn fill_ascend(r: &mut DeviceReading, v: &FieldMap<f64>) {
    r.temperature_c = traced(r, "temperature", v, &["npu_chip_info_temperature"]);
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
    // -1 when the exporter failed to collect it: not a count.
    r.ecc_correctable = traced(
        r,
        "eccCorrectable",
        v,
        &[
            "npu_chip_info_hbm_ecc_single_bit_error_cnt",
            "npu_chip_info_hbm_ecc_total_single_bit_error_cnt",
        ],
    )
    .filter(|n| *n >= 0.0);
    traced(r, "faultCode", v, &["npu_chip_info_error_code"]);
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

fn fill_gaudi(r: &mut DeviceReading, v: &FieldMap<f64>) {
    r.temperature_c = num(v, "habanalabs_temperature_onchip");
    r.power_w = num(v, "habanalabs_power_mW").map(|mw| mw / 1000.0);
    r.memory_used_mib = num(v, "habanalabs_memory_used_bytes").map(|b| b / (1024.0 * 1024.0));
    r.utilization_percent = num(v, "habanalabs_utilization");
    // Rows waiting to be replaced because of double-bit errors: the Gaudi
    // counterpart of NVIDIA's rows remapped for uncorrectable errors. Gaudi's
    // exporter publishes no separate uncorrectable-ECC event counter.
    r.remapped_rows_uncorrectable = num(v, "habanalabs_pending_rows_with_double_bit_ecc_errors");
}
