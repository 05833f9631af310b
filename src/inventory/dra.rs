//! Dynamic Resource Allocation: `resource.k8s.io/v1` ResourceSlices add per-device
//! records (UUID, serial, PCI address, memory) to the node's groups, and devices only
//! DRA publishes form groups of their own.
//!
//! Drivers read (attributes may be written qualified, `gpu.nvidia.com/uuid`, or bare,
//! `uuid`, implicitly in the driver's domain; both are read; the standard attributes
//! `resource.kubernetes.io/pciBusID` and `resource.kubernetes.io/pcieRoot` are read
//! as written):
//! - `gpu.nvidia.com` (NVIDIA DRA driver): `uuid`, `productName`, `architecture`,
//!   `driverVersion`, `cudaComputeCapability`, `cudaDriverVersion`, `pcieBusID`,
//!   `type` (`gpu` or `mig`) and, for MIG devices, `profile`; capacity `memory`.
//! - `gpu.amd.com` (AMD DRA driver): `productName`, `family`, `partitionProfile`,
//!   `pciAddr`, `driverVersion`; capacity `memory`.
//! - `gaudi.intel.com` (intel/intel-resource-drivers-for-kubernetes gaudi-v0.7.2,
//!   `cmd/kubelet-gaudi-plugin/node_state.go` `GetResources`,
//!   `pkg/gaudi/device/device.go`): `model` (`Gaudi`, `Gaudi2`, `Gaudi3`, or
//!   `Unknown` for a PCI device ID the driver does not know), `serial`, `healthy`
//!   (bool; false once HLML reports a critical event), `pciRoot`,
//!   `resource.kubernetes.io/pcieRoot`. No capacity: memory follows the generation.
//! - `gpu.intel.com` (same repository, gpu-v0.11.0,
//!   `cmd/kubelet-gpu-plugin/node_state.go` `GetResources`,
//!   `pkg/gpu/device/{device,models}.go`): `model` (`Max 1550`, `Flex 170`, ... or
//!   `Unknown`), `family`, `type` (`gpu`, or `vf` for an SR-IOV virtual function),
//!   `driver`, `sriov`, `pciId`, `pciAddress`, `health` (`Healthy`, `Unhealthy`,
//!   `Unknown`), `resource.kubernetes.io/pciBusID`; capacity `memory` (`0` until
//!   xpumd reports it: read as unknown) and `millicores`.
//! - `tpu.google.com` (kubernetes-sigs/dra-driver-google-tpu v0.2.0,
//!   `cmd/tpu-dra-kubeletplugin/manager.go` `GetDevice`): `index`, `uuid` (one value
//!   for every chip of a node, derived from the node name: not a device identity),
//!   `tpuGen`, `brand`, `accelerator` (the node's `cloud.google.com/gke-tpu-accelerator`
//!   or `tpu.google.com/accelerator` label), `chipCount`, `topology` when known. No
//!   capacity: memory follows the TPU type.
//!
//! Slices not bound to one node (`allNodes`, `nodeSelector`) are ignored, and so are
//! slices of an older generation of their pool than the newest seen (the DRA
//! contract: a driver replacing its slices bumps the generation, and consumers ignore
//! the old ones meanwhile). A device is counted once per (driver, pool, name).
//!
//! Matching. Each device is attached to the node's group of the same driver family
//! (the vendor's device-plugin resource or the DeviceClass), vendor, sharing mode and
//! partition profile whose model equals the device's product once spelling is
//! normalised (GFD writes `NVIDIA-H100-80GB-HBM3`, the DRA driver `NVIDIA H100 80GB
//! HBM3`); failing a model match, to the only such group if there is exactly one.
//! Time-shared groups never receive DRA devices. Records attached to an
//! extended-resource group do not change its counts (the device plugin's numbers stay
//! authoritative).
//!
//! DRA-only groups. A device that matches no group (a node whose accelerators are
//! only published through DRA) forms a group of its own, counted from the slice; a
//! device tainted NoSchedule/NoExecute, or one its driver reports unhealthy (Gaudi
//! `healthy: false`, Intel GPU `health: Unhealthy`: without the DRADeviceTaints
//! feature gate the API server drops device taints, so the attribute is the only
//! signal), is counted but not allocatable. Its `resource_name` is the DeviceClass a
//! ResourceClaim names to get such a device: the driver name (NVIDIA MIG devices
//! `mig.nvidia.com`). Its pin labels are the node labels that name the same model the
//! way the vendor's labeller does (`nvidia.com/gpu.product`, `habana.ai/device.type`,
//! `gpu.intel.com/product`, the TPU accelerator label plus its topology, or
//! `kaccel.io/accelerator.model`), when the node carries them; without any, the flavor
//! selects every node, which is pure only while no other kind of device is published
//! under the same DeviceClass (the planner's purity check refuses it otherwise).
//!
//! What is not classified. A device whose model no attribute names (NVIDIA/AMD without
//! `productName`, Intel `model: Unknown`, a TPU without `accelerator`), an Intel GPU
//! SR-IOV virtual function (its share of the parent GPU is not published, and the
//! parent is published too), and the devices of Huawei's Ascend DRA driver
//! `npu.huawei.com` (mind-cluster `component/ascend-dynamic-resource-allocation`,
//! not read yet) are listed as unclassified on their node: never a known variant,
//! never CPU-only capacity. Slices of other drivers (NICs, ...) are ignored.
//!
//! This file merges the slices into the inventory; `dra/driver.rs` holds what kaccel
//! knows of each driver (names, vendors, resources, labels, DeviceClasses),
//! `dra/device.rs` reads one device's attributes, and `dra/groups.rs` attaches a
//! device to its group or forms a DRA-only group for it.

mod device;
mod driver;
mod groups;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::ResourceSlice;

use super::{Inventory, NodeInventory, UnclassifiedDevice};
use driver::{ASCEND_DRIVER, Driver};
use groups::merge_device;

pub use driver::RequirementAttributes;
pub(crate) use driver::{
    device_class_of, is_device_class, requirement_attributes, selector_attributes,
};

/// A DRA device's node and the identities its driver publishes (UUID, PCI
/// address), read exactly as the inventory reads them; `None` when the slice does
/// not hold the device or its driver is not one kaccel reads.
pub fn published_ids(slice: &ResourceSlice, device: &str) -> Option<PublishedIds> {
    let driver = Driver::of(&slice.spec.driver)?;
    let published = slice
        .spec
        .devices
        .iter()
        .flatten()
        .find(|d| d.name == device)?;
    let read = device::DraDevice::read(
        driver,
        published,
        &super::labels::Labels::default(),
        &mut Vec::new(),
        slice.metadata.name.as_deref().unwrap_or_default(),
        &slice.spec.pool.name,
    );
    Some(PublishedIds {
        node: slice.spec.node_name.clone(),
        uuid: read.record.uuid,
        pci_address: read.record.pci_address,
    })
}

/// What [`published_ids`] reads.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedIds {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uuid: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_address: Option<String>,
}

/// The newest generation of each pool, by (driver, pool): a consumer reads only the
/// slices of that generation (a driver replacing its slices bumps it).
pub fn newest_generations<'a>(
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) -> BTreeMap<(&'a str, &'a str), i64> {
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in slices {
        let g = newest
            .entry((s.spec.driver.as_str(), s.spec.pool.name.as_str()))
            .or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    newest
}

/// Merge ResourceSlices into the inventory: the newest generation of each pool, each
/// device once.
pub(crate) fn merge_slices<'a>(
    inventory: &mut Inventory,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) {
    let slices: Vec<&ResourceSlice> = slices.into_iter().collect();
    let newest = newest_generations(slices.iter().copied());
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    // (node, source, reason) -> devices not classified.
    let mut unclassified: BTreeMap<(String, String, String), u32> = BTreeMap::new();
    let mut touched: BTreeSet<String> = BTreeSet::new();
    let mut shapes = groups::Shapes::default();
    for slice in slices {
        let spec = &slice.spec;
        if newest.get(&(spec.driver.as_str(), spec.pool.name.as_str()))
            != Some(&spec.pool.generation)
        {
            continue;
        }
        let Some(node_name) = spec.node_name.as_deref() else {
            continue;
        };
        let Some(node) = inventory.nodes.get_mut(node_name).map(Arc::make_mut) else {
            continue;
        };
        let fresh =
            spec.devices.iter().flatten().filter(|d| {
                seen.insert((spec.driver.clone(), spec.pool.name.clone(), d.name.clone()))
            });
        match Driver::of(&spec.driver) {
            Some(driver) => {
                let slice_name = slice.metadata.name.as_deref().unwrap_or("<unnamed>");
                for device in fresh {
                    if let Err(reason) = merge_device(
                        node,
                        driver,
                        device,
                        slice_name,
                        &spec.pool.name,
                        &mut shapes,
                    ) {
                        *unclassified
                            .entry((node.name.clone(), source(driver.name()), reason))
                            .or_default() += 1;
                    }
                    touched.insert(node.name.clone());
                }
            }
            None if spec.driver == ASCEND_DRIVER => {
                let count = fresh.count() as u32;
                if count > 0 {
                    *unclassified
                        .entry((
                            node.name.clone(),
                            source(ASCEND_DRIVER),
                            "Huawei Ascend DRA driver kaccel does not read yet; not offered (use the Ascend device plugin's huawei.com/ resources meanwhile)".to_string(),
                        ))
                        .or_default() += count;
                }
            }
            None => {}
        }
    }
    // A node whose only sign of an accelerator was a presence label (GFD's
    // `nvidia.com/gpu.present`, GKE's TPU labels, ...) and whose devices DRA publishes
    // is accounted for: the label-only entry goes.
    for name in touched.iter().chain(unclassified.keys().map(|(n, _, _)| n)) {
        if let Some(node) = inventory.nodes.get_mut(name) {
            drop_presence_entries(Arc::make_mut(node));
        }
    }
    for ((node, source, reason), count) in unclassified {
        let Some(node) = inventory.nodes.get_mut(&node).map(Arc::make_mut) else {
            continue;
        };
        node.warnings.push(format!(
            "unclassified accelerator {source} (count {count}): {reason}"
        ));
        node.unclassified.push(UnclassifiedDevice {
            source,
            count,
            reason,
            unlabelled_model_of: None,
        });
    }
    for name in touched {
        if let Some(node) = inventory.nodes.get_mut(&name).map(Arc::make_mut) {
            for g in &mut node.groups {
                g.devices.sort_by(|a, b| a.name.cmp(&b.name));
            }
            node.groups.sort_by(|a, b| a.variant.cmp(&b.variant));
        }
    }
}

/// Remove the label-only unclassified entries (count 0: a presence label, no device
/// kaccel read) of a node DRA publishes devices for, with their warnings.
fn drop_presence_entries(node: &mut NodeInventory) {
    let presence: Vec<String> = node
        .unclassified
        .iter()
        .filter(|u| u.count == 0)
        .map(|u| u.source.clone())
        .collect();
    if presence.is_empty() {
        return;
    }
    node.unclassified.retain(|u| u.count != 0);
    node.warnings.retain(|w| {
        !presence
            .iter()
            .any(|s| w.starts_with(&format!("unclassified accelerator {s} (count 0)")))
    });
}

/// How an unclassified DRA device's source is named.
fn source(driver: &str) -> String {
    format!("{driver} (DRA)")
}
