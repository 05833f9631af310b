//! AWS Trainium / Inferentia: the Neuron device plugin.
//!
//! Resources (AWS Neuron docs, "Neuron device plugin"): `aws.amazon.com/neuron`
//! allocates whole Neuron devices (all cores of a device), `aws.amazon.com/neuroncore`
//! single NeuronCores; the older `aws.amazon.com/neurondevice` is read like
//! `neuron`. Devices are read as [`SharingMode::Whole`], cores as
//! [`SharingMode::Partition`] with profile `neuroncore`.
//!
//! The plugin publishes no product label; the EC2 instance type
//! (`node.kubernetes.io/instance-type`, e.g. `trn1.32xlarge`) identifies the chip:
//! `trn1*` Trainium, `trn2*` Trainium2, `trn3*` Trainium3, `inf1` Inferentia,
//! `inf2` Inferentia2. The instance type is the pin label (it is what EKS node
//! groups and Karpenter set and what the plugin's own DaemonSet selects on), and is
//! kept in the raw labels. Because the pin names one instance size, two sizes of one
//! family are one variant with two pin sets. Taint key `aws.amazon.com/neuron`.
//!
//! One view per node. The plugin advertises both resources on one node
//! (aws-neuron/neuron-device-plugin; AWS Neuron docs "Neuron Device Plugin": a pod
//! asks for `aws.amazon.com/neuron` *or* `aws.amazon.com/neuroncore`): they are two
//! views of the same chips, so quota over both would offer the silicon twice.
//! kaccel reads one view per node: the one named by the node label
//! `kaccel.io/neuron.view` (`device` or `core`), else the device view, else (a node
//! advertising only cores) the core view. The other view is accounted for, never
//! offered: no ClusterQueue covers it, so Kueue admits nothing through it. When the
//! node carries the view label and it names the view offered, it is a pin label too,
//! so a `core` flavor never selects a node read in the `device` view, nor a flavor
//! of nodes labelled `device` a node read as cores. A view label naming neither, or a
//! view the node does not advertise, is a warning and the default applies (unpinned).
//!
//! Partly labelled fleets. Kueue's nodeLabels can only require a label, never its
//! absence: the device flavor of nodes *without* the view label selects every node of
//! the instance type, including those labelled `core`, so the planner refuses it
//! (its devices would also be offered as cores there) and names the fix: label the
//! device-view nodes `kaccel.io/neuron.view=device` too.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const DEVICE_RESOURCE: &str = "aws.amazon.com/neuron";
const LEGACY_DEVICE_RESOURCE: &str = "aws.amazon.com/neurondevice";
pub(crate) const CORE_RESOURCE: &str = "aws.amazon.com/neuroncore";
pub(crate) const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
const INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
pub(crate) const TAINT_KEY: &str = "aws.amazon.com/neuron";
/// Every resource name the Neuron plugin advertises (the views of one set of chips).
pub(crate) const ALL_RESOURCES: [&str; 3] =
    [DEVICE_RESOURCE, LEGACY_DEVICE_RESOURCE, CORE_RESOURCE];
/// Node label choosing which Neuron view kaccel offers: `device` or `core`.
pub const VIEW_LABEL: &str = "kaccel.io/neuron.view";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let mut devices = view
        .count_checked(DEVICE_RESOURCE, warnings)
        .map(|c| (DEVICE_RESOURCE, c))
        .or_else(|| {
            view.count_checked(LEGACY_DEVICE_RESOURCE, warnings)
                .map(|c| (LEGACY_DEVICE_RESOURCE, c))
        });
    let mut cores = view.count_checked(CORE_RESOURCE, warnings);
    if devices.is_none() && cores.is_none() {
        return groups;
    }
    // Per-core memory needs the device count even when the device view is not offered.
    let device_count = devices.map(|(_, (cap, _))| cap);
    let chosen_view = match view.label(VIEW_LABEL) {
        Some(v @ ("device" | "core")) => Some(v),
        Some(other) => {
            warnings.push(format!(
                "label {VIEW_LABEL}={other:?}: expected \"device\" or \"core\"; the device view is offered"
            ));
            None
        }
        None => None,
    };
    match chosen_view {
        Some("core") if cores.is_some() => devices = None,
        Some("core") => warnings.push(format!(
            "label {VIEW_LABEL}=core but the node advertises no {CORE_RESOURCE}; the device view is offered"
        )),
        _ if devices.is_some() => cores = None,
        _ => {}
    }
    let (instance_key, instance) = match view.label(INSTANCE_TYPE) {
        Some(t) => (INSTANCE_TYPE, Some(t)),
        None => (INSTANCE_TYPE_BETA, view.label(INSTANCE_TYPE_BETA)),
    };
    let chip = instance.and_then(chip_for_instance);
    let (model, mut pins) = match (chip, instance) {
        (Some(chip), Some(t)) => (
            chip.name.to_string(),
            BTreeMap::from([(instance_key.to_string(), t.to_string())]),
        ),
        _ => {
            let resource = devices.map_or(CORE_RESOURCE, |(r, _)| r);
            view.fallback_model(resource, INSTANCE_TYPE, warnings)
        }
    };
    // The view label is a pin only where it names the view offered: a node labelled
    // `core` that advertises no cores is offered in the device view, and pinning
    // `core` on its device flavor would select the nodes really read as cores.
    let offered_view = if devices.is_some() { "device" } else { "core" };
    if chosen_view == Some(offered_view) && !pins.is_empty() {
        pins.insert(VIEW_LABEL.to_string(), offered_view.to_string());
    }
    let mut raw = view.raw_labels(&["aws.amazon.com/", "karpenter.k8s.aws/instance-accelerator"]);
    if let Some(t) = instance {
        raw.insert(instance_key.to_string(), t.to_string());
    }
    let taints = view.taint_keys(&[TAINT_KEY]);

    let mut push = |resource: &str, cap: u32, alloc: u32, sharing, memory_mib| {
        let mut g = DeviceGroup::new(
            DeviceVariant {
                vendor: Vendor::Aws,
                model: model.clone(),
                sharing,
                partition_profile: (sharing == SharingMode::Partition)
                    .then(|| "neuroncore".to_string()),
                resource_name: resource.to_string(),
            },
            cap,
            alloc,
        );
        g.memory_mib = memory_mib;
        g.architecture = chip.map(|c| c.architecture.to_string());
        g.pin_labels = pins.clone();
        g.vendor_taint_keys = taints.clone();
        g.raw_labels = raw.clone();
        groups.push(g);
    };
    if let Some((resource, (cap, alloc))) = devices {
        push(
            resource,
            cap,
            alloc,
            SharingMode::Whole,
            chip.map(|c| c.device_memory_mib),
        );
    }
    if let Some((cap, alloc)) = cores {
        // Memory per core: the device's HBM split over its cores, when both counts are known.
        let per_core = match (chip, device_count) {
            (Some(c), Some(dev_cap)) if cap > 0 => c
                .device_memory_mib
                .checked_mul(u64::from(dev_cap))
                .map(|total| total / u64::from(cap)),
            _ => None,
        };
        push(CORE_RESOURCE, cap, alloc, SharingMode::Partition, per_core);
    }
    groups
}

#[derive(Clone, Copy)]
struct Chip {
    name: &'static str,
    architecture: &'static str,
    device_memory_mib: u64,
}

fn chip_for_instance(instance_type: &str) -> Option<Chip> {
    let family = instance_type.split('.').next()?;
    let chip = |name, architecture, gib: u64| Chip {
        name,
        architecture,
        device_memory_mib: gib * 1024,
    };
    match family {
        "trn1" | "trn1n" => Some(chip("Trainium", "neuron-v2", 32)),
        "trn2" | "trn2u" => Some(chip("Trainium2", "neuron-v3", 96)),
        "trn3" | "trn3u" => Some(chip("Trainium3", "neuron-v4", 144)),
        "inf1" => Some(chip("Inferentia", "neuron-v1", 8)),
        "inf2" => Some(chip("Inferentia2", "neuron-v2", 32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instance_types() {
        assert_eq!(
            chip_for_instance("trn1.32xlarge").map(|c| c.name),
            Some("Trainium")
        );
        assert_eq!(
            chip_for_instance("trn2.48xlarge").map(|c| c.name),
            Some("Trainium2")
        );
        assert_eq!(
            chip_for_instance("inf2.48xlarge").map(|c| c.name),
            Some("Inferentia2")
        );
        assert!(chip_for_instance("p5.48xlarge").is_none());
        assert!(chip_for_instance("").is_none());
    }
}
