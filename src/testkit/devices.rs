//! Hand-built devices and nodes for the planner's stage tests.

use std::collections::BTreeMap;

use crate::api::{SharingMode, Vendor};
use crate::inventory::{DeviceGroup, DeviceRecord, DeviceVariant, NodeInventory};

pub const PRODUCT_LABEL: &str = "nvidia.com/gpu.product";

pub fn whole_gpu(model: &str) -> DeviceVariant {
    DeviceVariant {
        vendor: Vendor::Nvidia,
        model: model.into(),
        sharing: SharingMode::Whole,
        partition_profile: None,
        resource_name: "nvidia.com/gpu".into(),
    }
}

/// A DRA device `name` of `driver` in `pool`, publishing nothing else, in service.
pub fn dra_device(name: &str, driver: &str, pool: &str) -> DeviceRecord {
    DeviceRecord {
        name: name.into(),
        driver: driver.to_string().into(),
        pool: pool.into(),
        uuid: None,
        serial: None,
        pci_address: None,
        memory_mib: None,
        driver_version: None,
        attribute_kinds: Default::default(),
        selector_values: Default::default(),
        raw_attributes: Default::default(),
        tainted: false,
    }
}

/// `count` whole GPUs of `model`, pinned by the product label, 80 GiB each.
pub fn gpus(model: &str, count: u32) -> DeviceGroup {
    let mut group = DeviceGroup::new(whole_gpu(model), count, count);
    group.pin_labels = BTreeMap::from([(PRODUCT_LABEL.to_string(), model.to_string())]);
    group.memory_mib = Some(81_920);
    group
}

/// A Ready, schedulable node with 64 cores and 512 GiB, carrying `labels` and the
/// pin labels of its groups.
pub fn node(name: &str, labels: &[(&str, &str)], groups: Vec<DeviceGroup>) -> NodeInventory {
    let mut all_labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for group in &groups {
        all_labels.extend(group.pin_labels.clone());
    }
    NodeInventory {
        name: name.into(),
        labels: all_labels.into(),
        annotations: BTreeMap::new(),
        topology: Default::default(),
        unschedulable: false,
        ready: Some(true),
        taints: Vec::new(),
        conditions: BTreeMap::new(),
        cpu_millis: 64_000,
        memory_bytes: 512 << 30,
        groups,
        unclassified: Vec::new(),
        class_resource_allocatable: None,
        warnings: Vec::new(),
    }
}
