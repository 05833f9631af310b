//! AMD Instinct: the ROCm k8s-device-plugin's resources plus its node labeller.
//!
//! Labeller labels (ROCm/k8s-device-plugin, node labeller; also written under the
//! legacy `beta.amd.com/` prefix): `amd.com/gpu.product-name`
//! (`AMD_Instinct_MI300X_OAM`), `amd.com/gpu.vram` (`192G`, GiB), `amd.com/gpu.family`
//! (the two-letter ASIC family, `AI` for MI300), `amd.com/gpu.cu-count`,
//! `amd.com/gpu.device-id`, `amd.com/gpu.driver-version`, and with the partition
//! flags `amd.com/compute-memory-partition` (`spx_nps1`, `cpx_nps4`; only on nodes
//! whose GPUs all share one mode), `amd.com/compute-partitioning-supported`,
//! `amd.com/memory-partitioning-supported`.
//!
//! Resources (device plugin `resource_naming_strategy`):
//! - `single` (the default): everything is `amd.com/gpu`, partitions included (a
//!   CPX/NPS4 MI300X node shows `amd.com/gpu: 64`); the partition label tells
//!   whole from partitioned.
//! - `mixed`: one resource per mode, `amd.com/<compute>_<memory>`, e.g.
//!   `amd.com/cpx_nps4: 64`, `amd.com/spx_nps1: 8`.
//!
//! SPX (one compute partition spanning all XCDs) is a whole GPU: `spx_*` resources and
//! `amd.com/gpu` under an `spx_*` partition label are [`SharingMode::Whole`]; DPX, TPX,
//! QPX and CPX are [`SharingMode::Partition`] with the mode as profile.
//!
//! Pin labels: `{amd.com/gpu.product-name: <product>}`, plus
//! `amd.com/compute-memory-partition` when the node carries it. Under the `single`
//! strategy that second label is the only thing telling a partitioned node's
//! `amd.com/gpu` from whole GPUs, so a fleet mixing both must run the labeller with
//! `compute-memory-partition`.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const RESOURCE: &str = "amd.com/gpu";
pub(crate) const PRODUCT: &str = "amd.com/gpu.product-name";
const PRODUCT_BETA: &str = "beta.amd.com/gpu.product-name";
pub(crate) const VRAM: &str = "amd.com/gpu.vram";
const VRAM_BETA: &str = "beta.amd.com/gpu.vram";
pub(crate) const FAMILY: &str = "amd.com/gpu.family";
pub(crate) const DRIVER_VERSION: &str = "amd.com/gpu.driver-version";
pub(crate) const PARTITION: &str = "amd.com/compute-memory-partition";
pub(crate) const TAINT_KEY: &str = "amd.com/gpu";

const COMPUTE_MODES: [&str; 5] = ["spx", "dpx", "tpx", "qpx", "cpx"];

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let raw_labels = view.raw_labels(&["amd.com/", "beta.amd.com/"]);
    let taints = view.taint_keys(&[TAINT_KEY]);
    let product = view.label(PRODUCT).or_else(|| view.label(PRODUCT_BETA));
    let vram_key = if view.label(VRAM).is_some() {
        VRAM
    } else {
        VRAM_BETA
    };
    let vram_mib = view.label_size_mib(vram_key, 1, warnings);
    let architecture = product
        .and_then(cdna_generation)
        .map(str::to_string)
        .or_else(|| view.label(FAMILY).map(str::to_ascii_lowercase));
    let driver = view.label(DRIVER_VERSION).map(str::to_string);
    let partition_label = view.label(PARTITION);
    if let Some(p) = partition_label
        && split_mode(p).is_none()
    {
        warnings.push(format!(
            "label {PARTITION}={p:?}: not a <compute>_<memory> partition mode; ignored"
        ));
    }

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

    for (resource, cap, alloc) in resources {
        // The partition mode: from the resource name under `mixed`, from the label
        // under `single`.
        let mode = if resource == RESOURCE {
            partition_label.filter(|p| split_mode(p).is_some())
        } else {
            Some(&resource["amd.com/".len()..])
        };
        let (sharing, profile) = match mode.and_then(split_mode) {
            Some(("spx", _)) | None => (SharingMode::Whole, None),
            Some(_) => (SharingMode::Partition, mode.map(str::to_string)),
        };
        let (model, mut pins) = match product {
            Some(p) => (
                p.to_string(),
                BTreeMap::from([(PRODUCT.to_string(), p.to_string())]),
            ),
            None => view.fallback_model(resource, PRODUCT, warnings),
        };
        if let Some(p) = partition_label.filter(|p| split_mode(p).is_some()) {
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
