//! Attaching a DRA device to its node's group, or forming a DRA-only group for it.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::resource::v1::Device;

use super::device::DraDevice;
use super::driver::{Driver, TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL};
use crate::inventory::{
    AttributeKind, DeviceGroup, DeviceVariant, MODEL_LABEL, NodeInventory, SharingMode, google,
    intel,
};

/// Attach one device to its group (or a new DRA-only group); `Err(reason)` when the
/// device cannot be classified.
pub(super) fn merge_device(
    node: &mut NodeInventory,
    driver: Driver,
    device: &Device,
    slice_name: &str,
    pool: &str,
    shapes: &mut Shapes,
) -> Result<(), String> {
    let dev = DraDevice::read(
        driver,
        device,
        &node.labels,
        &mut node.warnings,
        slice_name,
        pool,
    );
    if driver == Driver::IntelGpu && dev.kind.as_deref() == Some("vf") {
        return Err("SR-IOV virtual function of an Intel GPU: the ResourceSlice does not publish its share of the parent GPU (VF profile) and publishes the parent too; not offered".to_string());
    }
    let vendor = driver.vendor();
    let (sharing, profile, class) = dev.variant_shape(driver);
    let target = find_group(
        &node.groups,
        driver,
        sharing,
        profile.as_deref(),
        dev.product.as_deref(),
    );
    let index = match target {
        Some(i) => i,
        None => {
            let Some(product) = dev.product.as_deref() else {
                return Err(driver.no_model_reason().to_string());
            };
            let model = model_name(driver, product);
            let key = DeviceVariant {
                vendor,
                model: model.clone(),
                sharing,
                partition_profile: profile.clone(),
                resource_name: class.to_string(),
            };
            match node.groups.iter().position(|g| g.variant == key) {
                Some(i) => i,
                None => {
                    let mut g = DeviceGroup::new(key, 0, 0);
                    g.memory_mib = dev
                        .record
                        .memory_mib
                        .or_else(|| known_memory_mib(driver, &model));
                    g.pin_labels = pins(driver, &node.labels, &model);
                    g.raw_labels = g.pin_labels.clone();
                    let mut taints: Vec<String> = node
                        .taints
                        .iter()
                        .filter(|t| driver.taint_keys().contains(&t.key.as_str()))
                        .map(|t| t.key.clone())
                        .collect();
                    taints.sort();
                    taints.dedup();
                    g.vendor_taint_keys = taints;
                    node.groups.push(g);
                    node.groups.len() - 1
                }
            }
        }
    };
    let group = &mut node.groups[index];
    if group.devices.iter().any(|d| d.name == dev.record.name) {
        return Ok(());
    }
    if group.is_dra_only() {
        group.capacity = group.capacity.saturating_add(1);
        if !dev.record.tainted {
            group.allocatable = group.allocatable.saturating_add(1);
        }
    }
    if group.architecture.is_none() {
        group.architecture = dev
            .architecture
            .clone()
            .or_else(|| known_architecture(driver, &group.variant.model));
    }
    if group.driver_version.is_none() {
        group.driver_version = dev.record.driver_version.clone();
    }
    if group.compute_capability.is_none() {
        group.compute_capability = dev.compute_capability.clone();
    }
    if group.cuda_version.is_none() {
        group.cuda_version = dev.cuda_version.clone();
    }
    if group.memory_mib.is_none() {
        group.memory_mib = dev.record.memory_mib;
    }
    let mut record = dev.record;
    // Devices of one group publish the same shapes, almost always, and so do the
    // groups of one variant across the fleet: share them (one allocation each), so
    // the planner reads each shape once (it skips a device whose shapes it saw).
    match group.devices.last() {
        Some(last) if last.attribute_kinds == record.attribute_kinds => {
            record.attribute_kinds = last.attribute_kinds.clone();
        }
        _ => record.attribute_kinds = intern(&mut shapes.kinds, record.attribute_kinds),
    }
    match group.devices.last() {
        Some(last) if last.selector_values == record.selector_values => {
            record.selector_values = last.selector_values.clone();
        }
        _ => record.selector_values = intern(&mut shapes.values, record.selector_values),
    }
    group.devices.push(record);
    Ok(())
}

/// The distinct shapes DRA devices publish, shared fleet-wide while slices merge.
#[derive(Default)]
pub(super) struct Shapes {
    kinds: std::collections::BTreeSet<Arc<BTreeMap<String, AttributeKind>>>,
    values: std::collections::BTreeSet<Arc<[Option<String>]>>,
}

/// The shared allocation of a shape equal to `shape`, `shape` itself when new.
fn intern<T: Ord + ?Sized>(seen: &mut std::collections::BTreeSet<Arc<T>>, shape: Arc<T>) -> Arc<T> {
    match seen.get(&shape) {
        Some(shared) => shared.clone(),
        None => {
            seen.insert(shape.clone());
            shape
        }
    }
}

/// A DRA-only group's model, spelled as the vendor's node labels spell it where kaccel
/// reads those labels too (`NVIDIA-H100-80GB-HBM3`, Intel `Max_1550`, `Gaudi2`,
/// `tpu-v6e-slice`).
fn model_name(driver: Driver, product: &str) -> String {
    let words: Vec<&str> = product.split_whitespace().collect();
    match driver {
        Driver::IntelGpu => words.join("_"),
        _ => words.join("-"),
    }
}

fn known_memory_mib(driver: Driver, model: &str) -> Option<u64> {
    match driver {
        Driver::Gaudi => intel::gaudi_generation(model).map(|(_, mib)| mib),
        Driver::Tpu => google::generation(model).map(|(_, mib)| mib),
        _ => None,
    }
}

fn known_architecture(driver: Driver, model: &str) -> Option<String> {
    match driver {
        Driver::Gaudi => intel::gaudi_generation(model).map(|(a, _)| a.to_string()),
        Driver::Tpu => google::generation(model).map(|(a, _)| a.to_string()),
        _ => None,
    }
}

/// Pin labels for a DRA-only group: the node label naming the same model the way the
/// vendor's labeller (or the platform team, `kaccel.io/accelerator.model`) writes it,
/// plus, for TPUs, the topology label of the same family.
fn pins(
    driver: Driver,
    labels: &crate::inventory::labels::Labels,
    model: &str,
) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    let found = driver
        .model_labels()
        .iter()
        .copied()
        .chain([MODEL_LABEL])
        .find_map(|key| {
            let v = labels.get(key)?;
            (!v.is_empty() && same_product(v, model)).then_some((key, v))
        });
    let Some((key, value)) = found else {
        return pins;
    };
    pins.insert(key.to_string(), value.to_string());
    if driver == Driver::Tpu && key != MODEL_LABEL {
        let topology_key = if key == TPU_ACCELERATOR_LABEL {
            TPU_TOPOLOGY_LABEL
        } else {
            google::TOPOLOGY
        };
        if let Some(t) = labels.get(topology_key)
            && google::valid_topology(t)
        {
            pins.insert(topology_key.to_string(), t.to_string());
        }
    }
    pins
}

/// Loose equality for product names across sources: case, spaces, dashes and
/// underscores ignored.
fn same_product(a: &str, b: &str) -> bool {
    let key = |s: &str| -> String {
        s.chars()
            .filter(|c| !matches!(c, ' ' | '-' | '_'))
            .flat_map(char::to_lowercase)
            .collect()
    };
    key(a) == key(b)
}

fn find_group(
    groups: &[DeviceGroup],
    driver: Driver,
    sharing: SharingMode,
    profile: Option<&str>,
    product: Option<&str>,
) -> Option<usize> {
    let candidates: Vec<usize> = groups
        .iter()
        .enumerate()
        .filter(|(_, g)| {
            g.variant.vendor == driver.vendor()
                && driver.reads_resource(&g.variant.resource_name)
                && g.variant.sharing == sharing
                && g.variant.sharing != SharingMode::TimeShare
                && g.variant.partition_profile.as_deref() == profile
        })
        .map(|(i, _)| i)
        .collect();
    if let Some(p) = product
        && let Some(&i) = candidates
            .iter()
            .find(|&&i| same_product(&groups[i].variant.model, p))
    {
        return Some(i);
    }
    // One device-plugin group of the family: the device is one of the plugin's
    // (the plugin's counts stay authoritative, the record only adds detail). A
    // DRA-only group is counted from its devices, so only a device of its model joins.
    match candidates.as_slice() {
        [only] if !groups[*only].is_dra_only() => Some(*only),
        _ => None,
    }
}
