//! Intel: Gaudi accelerators (`habana.ai/gaudi`) and data-centre GPUs
//! (`gpu.intel.com/i915`, `gpu.intel.com/xe`).
//!
//! Gaudi. Intel Gaudi's device plugin registers `habana.ai/gaudi`. The model is read,
//! in order, from Habana feature discovery's `habana.ai/device.type` (a generation
//! name such as `GAUDI2`), its `habana.ai/device.id` (the PCI device ID, e.g. `1020`;
//! IDs from the habanalabs kernel driver's `PCI_IDS_GAUDI*`: 0x1000/0x1001/0x1010/
//! 0x1011 Gaudi, 0x1020/0x1021 Gaudi2, 0x1060/0x1063 Gaudi3), the AWS `dl1.*`
//! instance type (first-generation Gaudi), then kaccel's own label
//! [`MODEL_LABEL`](super::MODEL_LABEL) (`kaccel.io/accelerator.model=Gaudi3`). The
//! label the model came from is the pin label. A `device.type`/`device.id` value that
//! names no known generation is not guessed: the devices are unclassified (with a
//! warning) unless `MODEL_LABEL` names the model. Without any of these labels, the
//! devices are unclassified too. Memory per device is known per generation (Gaudi
//! 32 GiB, Gaudi2 96 GiB, Gaudi3 128 GiB).
//!
//! Intel GPUs. Labels from Intel's NFD rules and GPU plugin
//! (intel-device-plugins-for-kubernetes `cmd/gpu_plugin/labels.md`):
//! `gpu.intel.com/product` (`Max_1550`), `gpu.intel.com/family` (`Max_Series`),
//! `gpu.intel.com/device.count`, `gpu.intel.com/millicores` (GPUs x 1000),
//! `gpu.intel.com/memory.max` (sum over the node's GPUs, bytes),
//! `gpu.intel.com/tiles`. The plugin's `-shared-dev-num N` multiplies the resource
//! count by N (time-sharing without isolation): when the resource count exceeds the
//! physical count, the group is [`SharingMode::TimeShare`]. Pin label:
//! `{gpu.intel.com/product: <product>}`.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const GAUDI_RESOURCE: &str = "habana.ai/gaudi";
pub(crate) const GPU_RESOURCES: [&str; 2] = ["gpu.intel.com/i915", "gpu.intel.com/xe"];
pub(crate) const GPU_PRODUCT: &str = "gpu.intel.com/product";
pub(crate) const GPU_FAMILY: &str = "gpu.intel.com/family";
const GPU_DEVICE_COUNT: &str = "gpu.intel.com/device.count";
const GPU_MILLICORES: &str = "gpu.intel.com/millicores";
const GPU_MEMORY_MAX: &str = "gpu.intel.com/memory.max";
const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Habana feature discovery: generation name of the node's Gaudi devices.
pub(crate) const HABANA_DEVICE_TYPE: &str = "habana.ai/device.type";
/// Habana feature discovery: PCI device ID of the node's Gaudi devices.
pub(crate) const HABANA_DEVICE_ID: &str = "habana.ai/device.id";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    if let Some(g) = read_gaudi(view, warnings) {
        groups.push(g);
    }
    groups.extend(read_gpus(view, warnings));
    groups
}

fn read_gaudi(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Option<DeviceGroup> {
    let (cap, alloc) = view.count_checked(GAUDI_RESOURCE, warnings)?;
    let pinned = |key: &str, value: &str| BTreeMap::from([(key.to_string(), value.to_string())]);
    let from_type = view.label(HABANA_DEVICE_TYPE).map(|t| {
        (
            gaudi_generation_by_type(t).map(generation_model),
            HABANA_DEVICE_TYPE,
            t,
        )
    });
    let from_id = view.label(HABANA_DEVICE_ID).map(|id| {
        (
            gaudi_generation_by_pci_id(id).map(generation_model),
            HABANA_DEVICE_ID,
            id,
        )
    });
    let (model, pins) = match from_type.into_iter().chain(from_id).next() {
        Some((Some(model), key, value)) => (model.to_string(), pinned(key, value)),
        Some((None, key, value)) if view.label(super::MODEL_LABEL).is_none() => {
            warnings.push(format!(
                "label {key}={value:?} names no Gaudi generation kaccel knows; set {} to classify these devices",
                super::MODEL_LABEL
            ));
            (format!("{GAUDI_RESOURCE}-unlabelled"), BTreeMap::new())
        }
        _ => match view.label(INSTANCE_TYPE).filter(|t| t.starts_with("dl1.")) {
            Some(instance) if view.label(super::MODEL_LABEL).is_none() => {
                ("Gaudi".to_string(), pinned(INSTANCE_TYPE, instance))
            }
            _ => view.fallback_model(GAUDI_RESOURCE, super::MODEL_LABEL, warnings),
        },
    };
    let generation = if model.ends_with("-unlabelled") {
        None
    } else {
        gaudi_generation(&model)
    };
    let mut g = DeviceGroup::new(
        DeviceVariant {
            vendor: Vendor::Intel,
            model,
            sharing: SharingMode::Whole,
            partition_profile: None,
            resource_name: GAUDI_RESOURCE.to_string(),
        },
        cap,
        alloc,
    );
    g.architecture = generation.map(|(arch, _)| arch.to_string());
    g.memory_mib = generation.map(|(_, mib)| mib);
    g.pin_labels = pins;
    g.vendor_taint_keys = view.taint_keys(&[GAUDI_RESOURCE]);
    let mut raw = view.raw_labels(&["habana.ai/", "kaccel.io/accelerator."]);
    if let Some(t) = view.label(INSTANCE_TYPE) {
        raw.insert(INSTANCE_TYPE.to_string(), t.to_string());
    }
    g.raw_labels = raw;
    Some(g)
}

/// (architecture, memory MiB) for a Gaudi model name.
pub(crate) fn gaudi_generation(model: &str) -> Option<(&'static str, u64)> {
    let m = model.to_ascii_lowercase().replace([' ', '-', '_'], "");
    if m.contains("gaudi3") || m.contains("hl325") {
        Some(("gaudi3", 128 * 1024))
    } else if m.contains("gaudi2") || m.contains("hl225") {
        Some(("gaudi2", 96 * 1024))
    } else if m.contains("gaudi") || m.contains("hl205") {
        Some(("gaudi", 32 * 1024))
    } else {
        None
    }
}

fn generation_model(architecture: &str) -> &'static str {
    match architecture {
        "gaudi3" => "Gaudi3",
        "gaudi2" => "Gaudi2",
        _ => "Gaudi",
    }
}

/// Gaudi generation for a `habana.ai/device.type` value, matched whole (`GAUDI2`,
/// `Gaudi 3`, `HL-225`): an unknown name such as `GAUDI9` is not a Gaudi we know.
fn gaudi_generation_by_type(value: &str) -> Option<&'static str> {
    let v = value.to_ascii_lowercase().replace([' ', '-', '_'], "");
    let v = v.trim_start_matches("intel").trim_start_matches("habana");
    match v {
        "gaudi" | "gaudi1" | "hl205" => Some("gaudi"),
        "gaudi2" | "hl225" => Some("gaudi2"),
        "gaudi3" | "hl325" => Some("gaudi3"),
        _ => None,
    }
}

/// Gaudi generation for a PCI device ID as Habana feature discovery labels it
/// (`1020`, `0x1020`).
fn gaudi_generation_by_pci_id(id: &str) -> Option<&'static str> {
    let id = id.trim().to_ascii_lowercase();
    match id.strip_prefix("0x").unwrap_or(&id) {
        "1000" | "1001" | "1010" | "1011" => Some("gaudi"),
        "1020" | "1021" => Some("gaudi2"),
        "1060" | "1063" => Some("gaudi3"),
        _ => None,
    }
}

fn read_gpus(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let physical = view
        .label_u64(GPU_DEVICE_COUNT, warnings)
        .or_else(|| view.label_u64(GPU_MILLICORES, warnings).map(|m| m / 1000))
        .filter(|&n| n > 0);
    let memory_total = view.label_u64(GPU_MEMORY_MAX, warnings);
    for resource in GPU_RESOURCES {
        let Some((cap, alloc)) = view.count_checked(resource, warnings) else {
            continue;
        };
        let (model, pins) = match view.label(GPU_PRODUCT) {
            Some(p) => (
                p.to_string(),
                BTreeMap::from([(GPU_PRODUCT.to_string(), p.to_string())]),
            ),
            None => view.fallback_model(resource, GPU_PRODUCT, warnings),
        };
        let shared = physical.is_some_and(|n| u64::from(cap) > n);
        let mut g = DeviceGroup::new(
            DeviceVariant {
                vendor: Vendor::Intel,
                model,
                sharing: if shared {
                    SharingMode::TimeShare
                } else {
                    SharingMode::Whole
                },
                partition_profile: None,
                resource_name: resource.to_string(),
            },
            cap,
            alloc,
        );
        let devices = physical.unwrap_or(u64::from(cap)).max(1);
        g.memory_mib = memory_total.map(|bytes| bytes / devices / (1024 * 1024));
        g.architecture = view.label(GPU_FAMILY).map(|f| match f {
            "Max_Series" => "xe-hpc".to_string(),
            "Flex_Series" => "xe-hpg".to_string(),
            other => other.to_ascii_lowercase(),
        });
        g.pin_labels = pins;
        g.vendor_taint_keys = view.taint_keys(&GPU_RESOURCES);
        g.raw_labels = view.raw_labels(&["gpu.intel.com/"]);
        groups.push(g);
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations() {
        assert_eq!(gaudi_generation("Gaudi3"), Some(("gaudi3", 131072)));
        assert_eq!(gaudi_generation("Intel-Gaudi2"), Some(("gaudi2", 98304)));
        assert_eq!(gaudi_generation("HL-225"), Some(("gaudi2", 98304)));
        assert_eq!(gaudi_generation("Gaudi"), Some(("gaudi", 32768)));
        assert_eq!(gaudi_generation("mystery"), None);
    }
}
