//! Google Cloud TPU on GKE.
//!
//! GKE TPU nodes expose `google.com/tpu` (chips on the VM) and carry
//! `cloud.google.com/gke-tpu-accelerator` (`tpu-v5-lite-podslice`, `tpu-v5p-slice`,
//! `tpu-v6e-slice`, ...) and `cloud.google.com/gke-tpu-topology` (`2x4`, `4x4x4`),
//! with the taint `google.com/tpu=present:NoSchedule`. Workloads must select both
//! labels: a slice's topology decides whether a multi-host job fits. So both are pin
//! labels; TPU flavors are per (accelerator, topology).

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const RESOURCE: &str = "google.com/tpu";
pub(crate) const ACCELERATOR: &str = "cloud.google.com/gke-tpu-accelerator";
pub(crate) const TOPOLOGY: &str = "cloud.google.com/gke-tpu-topology";
pub(crate) const TAINT_KEY: &str = "google.com/tpu";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let Some((cap, alloc)) = view.count_checked(RESOURCE, warnings) else {
        return Vec::new();
    };
    let (model, mut pins) = match view.label(ACCELERATOR) {
        Some(a) => (
            a.to_string(),
            BTreeMap::from([(ACCELERATOR.to_string(), a.to_string())]),
        ),
        None => view.fallback_model(RESOURCE, ACCELERATOR, warnings),
    };
    match view.label(TOPOLOGY) {
        Some(t) if valid_topology(t) => {
            pins.insert(TOPOLOGY.to_string(), t.to_string());
        }
        Some(t) => warnings.push(format!(
            "label {TOPOLOGY}={t:?}: not a topology like 2x4 or 4x4x4; not pinned"
        )),
        None => warnings.push(format!(
            "{RESOURCE}: node has no {TOPOLOGY} label; TPU flavor pinned by accelerator only"
        )),
    }
    let generation = generation(&model);
    let mut g = DeviceGroup::new(
        DeviceVariant {
            vendor: Vendor::Google,
            model,
            sharing: SharingMode::Whole,
            partition_profile: None,
            resource_name: RESOURCE.to_string(),
        },
        cap,
        alloc,
    );
    g.architecture = generation.map(|(a, _)| a.to_string());
    g.memory_mib = generation.map(|(_, m)| m);
    g.pin_labels = pins;
    g.vendor_taint_keys = view.taint_keys(&[TAINT_KEY]);
    g.raw_labels = view.raw_labels(&[
        "cloud.google.com/gke-tpu",
        "cloud.google.com/gke-accelerator",
    ]);
    vec![g]
}

pub(crate) fn valid_topology(t: &str) -> bool {
    let parts: Vec<&str> = t.split('x').collect();
    (2..=3).contains(&parts.len())
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.len() <= 4 && p.bytes().all(|b| b.is_ascii_digit()))
}

/// (TPU generation, HBM per chip in MiB) for GKE accelerator names.
pub(crate) fn generation(accelerator: &str) -> Option<(&'static str, u64)> {
    let gib = |g: u64| g * 1024;
    match accelerator {
        "tpu-v4-podslice" => Some(("v4", gib(32))),
        "tpu-v5-lite-podslice" | "tpu-v5-lite-device" => Some(("v5e", gib(16))),
        "tpu-v5p-slice" => Some(("v5p", gib(95))),
        "tpu-v6e-slice" => Some(("v6e", gib(32))),
        "tpu7x" => Some(("v7", gib(192))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topologies() {
        assert!(valid_topology("2x4"));
        assert!(valid_topology("4x4x4"));
        assert!(!valid_topology("2x"));
        assert!(!valid_topology("four"));
        assert!(!valid_topology("1x2x3x4"));
        assert_eq!(generation("tpu-v5-lite-podslice"), Some(("v5e", 16384)));
    }
}
