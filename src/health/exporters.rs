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
//! This file groups samples into devices ([`readings`]); how each exporter names
//! things, where those names come from and how its metrics fill a
//! [`DeviceReading`] are in `exporters/vendors.rs`.

#[cfg(test)]
mod tests;
mod vendors;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::api::Vendor;
use crate::health::prom::Sample;
use crate::health::shared_text::{FieldMap, SharedText};
use vendors::{AMD, ASCEND, DCGM, GAUDI, Profile};

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
    /// Correctable (single-bit) ECC errors, a counter (trend rules read its rise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_correctable: Option<f64>,
    /// Memory rows wait for a reset to be remapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub row_remap_pending: Option<bool>,
    /// The recovery the driver asks for (NVIDIA's `nvmlDeviceGpuRecoveryAction_t`:
    /// 0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recovery_action: Option<u64>,
    /// Clocks held down by the hardware (thermal / power slowdown, power brake) now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_throttle_active: Option<bool>,
    /// Occurrences per XID where the exporter counts them (dcgm-exporter's
    /// `DCGM_EXP_XID_ERRORS_COUNT{xid}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub xid_counts: BTreeMap<u64, f64>,
    pub driver_version: Option<String>,
    pub firmware_version: Option<String>,
    /// The pod holding the device, as the exporter attributes it (dcgm-exporter's
    /// `pod`/`namespace`/`container`, AMD's, Ascend's `pod_name`, ...). None: no
    /// pod holds it, or the exporter does not say; never guessed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<PodRef>,
    /// Trend signal name (`eccCorrectable`) -> the vendor metric(s) it was read
    /// from: verdicts name the vendor's own fields.
    #[serde(default, skip_serializing_if = "FieldMap::is_empty")]
    pub signal_fields: FieldMap<Vec<SharedText>>,
    /// Every original sample for this device: metric name -> value, and the label set of the first sample, kept for the engineer who needs the raw field.
    /// Names and label texts are shared across the fleet's devices ([`SharedText`]),
    /// each map one exact allocation ([`FieldMap`]): the tracker keeps them for
    /// every device.
    #[serde(default)]
    pub raw_values: FieldMap<f64>,
    #[serde(default)]
    pub raw_labels: FieldMap<SharedText>,
}

/// A pod as an exporter names it.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodRef {
    pub namespace: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
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
    values: FieldMap<f64>,
    /// The identity label value when the index label was not a number.
    fallback_ident: Option<String>,
}

impl Builder {
    fn new(vendor: Vendor, node: Option<String>, first: &Sample) -> Self {
        Builder {
            reading: DeviceReading {
                vendor: Some(vendor),
                node,
                raw_labels: first
                    .labels
                    .iter()
                    .map(|(name, value)| (SharedText::new(name), SharedText::new(value)))
                    .collect(),
                ..Default::default()
            },
            values: FieldMap::default(),
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
        if r.pod.is_none()
            && let (Some(name), Some(namespace)) =
                (first_label(s, p.pod), first_label(s, p.pod_namespace))
        {
            r.pod = Some(PodRef {
                namespace: namespace.to_string(),
                name: name.to_string(),
                container: first_label(s, p.container).map(str::to_string),
            });
        }
        fill_label(
            &mut self.fallback_ident,
            first_label(s, p.serial).or(first_label(s, p.index)),
        );
        merge_max(&mut r.raw_values, &s.name, s.value);
        merge_max(&mut self.values, normalised, s.value);
        if let Some(keyed) = p.keyed {
            keyed(r, normalised, s);
        }
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
        // Kept by the tracker as long as the device reports: no spare room.
        r.raw_values.shrink_to_fit();
        r.raw_labels.shrink_to_fit();
        r.signal_fields.shrink_to_fit();
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
fn merge_max(map: &mut FieldMap<f64>, name: &str, value: f64) {
    match map.get_mut(name) {
        Some(old) if old.is_nan() || value > *old => *old = value,
        Some(_) => {}
        None => {
            map.insert(name, value);
        }
    }
}
