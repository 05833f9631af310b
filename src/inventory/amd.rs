//! AMD Instinct: the ROCm k8s-device-plugin's resources plus its node labeller.
//!
//! Checked against ROCm/k8s-device-plugin at v1.31.0.10-16-ged764684 (2026-08-11):
//! `cmd/k8s-node-labeller/main.go` (`createLabelPrefix`, `createLabels`, the
//! `compute-memory-partition` generator) and `cmd/k8s-device-plugin/main.go`
//! (`getResourceList`). Where the labeller's docs and its code disagree, the code is
//! what runs: every label key is `<prefix>/gpu.<name>`, so the partition label is
//! `amd.com/gpu.compute-memory-partition` (`spx_nps1`, `cpx_nps4`; lower case,
//! written only on nodes whose GPUs all share one mode), not the documented
//! `amd.com/compute-memory-partition`.
//!
//! Label schemes read, per property (product name, vram, family, device id):
//! - `amd.com/gpu.<name>=<value>`: the current labeller on a node whose GPUs agree;
//! - `amd.com/gpu.<name>.<value>=<count>`: the current labeller on a node whose GPUs
//!   disagree (read only when exactly one value is present);
//! - `beta.amd.com/gpu.<name>=<value>` and the legacy value-in-key
//!   `beta.amd.com/gpu.<name>.<value>=<count>` (`beta.amd.com/gpu.vram.16G=1`), the
//!   only scheme of labellers before product names (2019-2024); there the model comes
//!   from the PCI device id (`beta.amd.com/gpu.device-id.74a1`).
//!
//! Resources (device plugin `resource_naming_strategy`):
//! - `single` (the default): everything is `amd.com/gpu`, partitions included (a
//!   CPX/NPS4 MI300X node shows `amd.com/gpu: 64`); the partition label tells
//!   whole from partitioned.
//! - `mixed`: one resource per mode, `amd.com/<compute>_<memory>`, e.g.
//!   `amd.com/cpx_nps4: 64`, `amd.com/spx_nps1: 8` (`amd.com/gpu` on GPUs that
//!   cannot be partitioned).
//!
//! SPX (one compute partition spanning all XCDs) is a whole GPU: `spx_*` resources and
//! `amd.com/gpu` under an `spx_*` partition label are [`SharingMode::Whole`]; DPX, TPX,
//! QPX and CPX are [`SharingMode::Partition`] with the mode as profile. A
//! partition-capable product (CDNA3/CDNA4) counted under `amd.com/gpu` with no
//! partition label cannot be told whole from partitioned: it is skipped with a
//! warning rather than offered as whole GPUs.
//!
//! Pin labels: the product label as found on the node (whichever scheme), plus
//! `amd.com/gpu.compute-memory-partition` when the node carries it, so that a whole
//! (SPX) flavor never selects a CPX node and a `cpx_nps4` flavor never selects an SPX
//! node.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const RESOURCE: &str = "amd.com/gpu";
pub(crate) const PRODUCT: &str = "amd.com/gpu.product-name";
pub(crate) const DRIVER_VERSION: &str = "amd.com/gpu.driver-version";
/// The key `createLabelPrefix("compute-memory-partition", false)` builds.
pub(crate) const PARTITION: &str = "amd.com/gpu.compute-memory-partition";
pub(crate) const TAINT_KEY: &str = "amd.com/gpu";
const PREFIXES: [&str; 2] = ["amd.com/gpu.", "beta.amd.com/gpu."];

const COMPUTE_MODES: [&str; 5] = ["spx", "dpx", "tpx", "qpx", "cpx"];

/// One labeller property as found on the node: its value and the label that
/// carries it (to pin on), in whichever of the labeller's schemes the node uses.
struct Found {
    value: String,
    key: String,
    raw: String,
}

impl Found {
    fn pin(&self) -> (String, String) {
        (self.key.clone(), self.raw.clone())
    }
}

/// `<prefix>/gpu.<name>=<value>` first, then the value-in-key form
/// `<prefix>/gpu.<name>.<value>=<count>` when exactly one value is present; several
/// values (GPUs of different kinds on one node) read as unknown, with a warning.
fn labeller_property(view: &NodeView<'_>, name: &str, warnings: &mut Vec<String>) -> Option<Found> {
    for prefix in PREFIXES {
        let key = format!("{prefix}{name}");
        if let Some(v) = view.label(&key) {
            return Some(Found {
                value: v.to_string(),
                raw: v.to_string(),
                key,
            });
        }
    }
    for prefix in PREFIXES {
        let stem = format!("{prefix}{name}.");
        let in_key: Vec<(&String, &String)> = view
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with(&stem) && k.len() > stem.len())
            .collect();
        match in_key.as_slice() {
            [] => continue,
            [(k, v)] => {
                return Some(Found {
                    value: k[stem.len()..].to_string(),
                    key: (*k).clone(),
                    raw: (*v).clone(),
                });
            }
            several => {
                warnings.push(format!(
                    "labels {stem}*: {} different values on one node ({}); not read",
                    several.len(),
                    several
                        .iter()
                        .map(|(k, _)| &k[stem.len()..])
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
                return None;
            }
        }
    }
    None
}

/// Product names for PCI device ids of Instinct accelerators, as the labeller spells
/// product names (spaces to `_`), from the `amdgpu.ids` the labeller ships
/// (`cmd/k8s-node-labeller/amdgpu.ids`). Used only for the legacy scheme, which
/// labels the device id but no product.
fn product_from_device_id(id: &str) -> Option<&'static str> {
    Some(match id.to_ascii_lowercase().trim_start_matches("0x") {
        "738c" => "AMD_Instinct_MI100",
        "7408" => "AMD_Instinct_MI250X",
        "740c" => "AMD_Instinct_MI250X_/_MI250",
        "740f" => "AMD_Instinct_MI210",
        "74a0" => "AMD_Instinct_MI300A",
        "74a1" => "AMD_Instinct_MI300X",
        "74a5" => "AMD_Instinct_MI325X",
        "74a9" | "74bd" => "AMD_Instinct_MI300X_HF",
        "75a0" => "AMD_Instinct_MI350X",
        "75a3" => "AMD_Instinct_MI355X",
        _ => return None,
    })
}

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let mut resources: Vec<(&str, u32, u32)> = Vec::new();
    if let Some((cap, alloc)) = view.count_checked(RESOURCE, warnings) {
        resources.push((RESOURCE, cap, alloc));
    }
    let mode_resources: Vec<&str> = view
        .capacity
        .keys()
        .copied()
        .filter(|name| {
            name.strip_prefix("amd.com/")
                .is_some_and(|mode| split_mode(mode).is_some())
        })
        .collect();
    for name in mode_resources {
        if let Some((cap, alloc)) = view.count_checked(name, warnings) {
            resources.push((name, cap, alloc));
        }
    }
    let raw_labels = view.raw_labels(&["amd.com/", "beta.amd.com/"]);
    let taints = view.taint_keys(&[TAINT_KEY]);
    let product = labeller_property(view, "product-name", warnings);
    // Legacy labellers name no product: the PCI device id does.
    let legacy_product = || {
        let id = labeller_property(view, "device-id", &mut Vec::new())?;
        product_from_device_id(&id.value).map(|p| (p.to_string(), id.pin()))
    };
    let model_and_pin: Option<(String, (String, String))> = product
        .as_ref()
        .map(|p| (p.value.clone(), p.pin()))
        .or_else(legacy_product);
    let vram_mib = labeller_property(view, "vram", warnings).and_then(|found| {
        let parsed = super::quantity::parse_label_size_mib(&found.value, 1);
        if parsed.is_none() {
            warnings.push(format!(
                "label {}={:?}: not a memory size; ignored",
                found.key, found.raw
            ));
        }
        parsed
    });
    let architecture = model_and_pin
        .as_ref()
        .and_then(|(m, _)| cdna_generation(m))
        .map(str::to_string)
        .or_else(|| {
            labeller_property(view, "family", warnings).map(|f| f.value.to_ascii_lowercase())
        });
    let driver = view.label(DRIVER_VERSION).map(str::to_string);
    let partition_label = view.label(PARTITION);
    if let Some(p) = partition_label
        && split_mode(p).is_none()
    {
        warnings.push(format!(
            "label {PARTITION}={p:?}: not a <compute>_<memory> partition mode; ignored"
        ));
    }
    let partition_label = partition_label.filter(|p| split_mode(p).is_some());
    if resources.is_empty() {
        return groups;
    }

    for (resource, cap, alloc) in resources {
        // The partition mode: from the resource name under `mixed`, from the label
        // under `single`.
        let mode = if resource == RESOURCE {
            partition_label
        } else {
            Some(&resource["amd.com/".len()..])
        };
        if resource == RESOURCE
            && mode.is_none()
            && model_and_pin
                .as_ref()
                .and_then(|(m, _)| cdna_generation(m))
                .is_some_and(|g| g == "cdna3" || g == "cdna4")
        {
            warnings.push(format!(
                "{RESOURCE}: {cap} devices of a partition-capable product without a {PARTITION} \
                 label: whole GPUs cannot be told from CPX/DPX partitions; not offered \
                 (run the node labeller with -compute-memory-partition)"
            ));
            continue;
        }
        let (sharing, profile) = match mode.and_then(split_mode) {
            Some(("spx", _)) | None => (SharingMode::Whole, None),
            Some(_) => (SharingMode::Partition, mode.map(str::to_string)),
        };
        let (model, mut pins) = match &model_and_pin {
            Some((m, (k, v))) => (m.clone(), BTreeMap::from([(k.clone(), v.clone())])),
            None => view.fallback_model(resource, PRODUCT, warnings),
        };
        if let Some(p) = partition_label {
            pins.insert(PARTITION.to_string(), p.to_string());
        }
        let mut g = DeviceGroup::new(
            DeviceVariant {
                vendor: Vendor::Amd,
                model,
                sharing,
                partition_profile: profile,
                resource_name: resource.to_string(),
            },
            cap,
            alloc,
        );
        // The labeller reports the VRAM of the devices it sees; on a partitioned node
        // these are the partitions, so the value is used as reported.
        g.memory_mib = vram_mib;
        g.architecture = architecture.clone();
        g.driver_version = driver.clone();
        if let Some(v) = &driver {
            g.version_labels
                .insert(DRIVER_VERSION.to_string(), v.clone());
        }
        g.pin_labels = pins;
        g.vendor_taint_keys = taints.clone();
        g.raw_labels = raw_labels.clone();
        groups.push(g);
    }
    groups
}

/// `cpx_nps4` -> (`cpx`, `nps4`); `None` for anything that is not a partition mode.
pub(crate) fn split_mode(mode: &str) -> Option<(&str, &str)> {
    let (compute, memory) = mode.split_once('_')?;
    let nps = memory.strip_prefix("nps")?;
    let ok = COMPUTE_MODES.contains(&compute)
        && !nps.is_empty()
        && nps.len() <= 2
        && nps.bytes().all(|b| b.is_ascii_digit());
    ok.then_some((compute, memory))
}

/// CDNA generation from the product name, where known (the labeller's `family`
/// label is the ASIC family code, e.g. `AI`, which says little to a user).
pub(crate) fn cdna_generation(product: &str) -> Option<&'static str> {
    let p = product.to_ascii_uppercase();
    if p.contains("MI355") || p.contains("MI350") {
        Some("cdna4")
    } else if p.contains("MI300") || p.contains("MI325") {
        Some("cdna3")
    } else if p.contains("MI250") || p.contains("MI210") || p.contains("MI200") {
        Some("cdna2")
    } else if p.contains("MI100") {
        Some("cdna")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        assert_eq!(split_mode("cpx_nps4"), Some(("cpx", "nps4")));
        assert_eq!(split_mode("spx_nps1"), Some(("spx", "nps1")));
        assert_eq!(split_mode("gpu_vf"), None);
        assert_eq!(split_mode("cpx_"), None);
        assert_eq!(split_mode("cpx_npsx"), None);
        assert_eq!(cdna_generation("AMD_Instinct_MI300X_OAM"), Some("cdna3"));
        assert_eq!(cdna_generation("AMD_Radeon_RX_9070_XT"), None);
    }
}
