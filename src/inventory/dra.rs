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

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::{
    DeviceGroup, DeviceRecord, DeviceVariant, Inventory, MODEL_LABEL, NodeInventory, SharingMode,
    UnclassifiedDevice, Vendor, parse_memory_bytes,
};

pub(crate) const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
pub(crate) const NVIDIA_MIG_CLASS: &str = "mig.nvidia.com";
pub(crate) const AMD_DRIVER: &str = "gpu.amd.com";
pub(crate) const GAUDI_DRIVER: &str = "gaudi.intel.com";
pub(crate) const INTEL_GPU_DRIVER: &str = "gpu.intel.com";
pub(crate) const TPU_DRIVER: &str = "tpu.google.com";
/// Huawei's Ascend DRA driver (mind-cluster
/// `component/ascend-dynamic-resource-allocation/pkg/consts/consts.go`), not read yet.
pub(crate) const ASCEND_DRIVER: &str = "npu.huawei.com";

/// The standard PCI bus ID attribute (k8s.io/dynamic-resource-allocation/deviceattribute).
const STD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";
/// The TPU driver's own node labels (dra-driver-google-tpu `util.go`), beside GKE's.
const TPU_ACCELERATOR_LABEL: &str = "tpu.google.com/accelerator";
const TPU_TOPOLOGY_LABEL: &str = "tpu.google.com/topology";

/// A DRA driver kaccel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    Nvidia,
    Amd,
    Gaudi,
    IntelGpu,
    Tpu,
}

impl Driver {
    fn of(name: &str) -> Option<Self> {
        match name {
            NVIDIA_DRIVER => Some(Driver::Nvidia),
            AMD_DRIVER => Some(Driver::Amd),
            GAUDI_DRIVER => Some(Driver::Gaudi),
            INTEL_GPU_DRIVER => Some(Driver::IntelGpu),
            TPU_DRIVER => Some(Driver::Tpu),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Driver::Nvidia => NVIDIA_DRIVER,
            Driver::Amd => AMD_DRIVER,
            Driver::Gaudi => GAUDI_DRIVER,
            Driver::IntelGpu => INTEL_GPU_DRIVER,
            Driver::Tpu => TPU_DRIVER,
        }
    }

    fn vendor(self) -> Vendor {
        match self {
            Driver::Nvidia => Vendor::Nvidia,
            Driver::Amd => Vendor::Amd,
            Driver::Gaudi | Driver::IntelGpu => Vendor::Intel,
            Driver::Tpu => Vendor::Google,
        }
    }

    /// Whether a group's resource (a device-plugin resource or a DeviceClass) names
    /// the devices this driver publishes: Gaudi devices never join an Intel GPU group.
    fn reads_resource(self, resource: &str) -> bool {
        match self {
            Driver::Nvidia => {
                resource.starts_with("nvidia.com/")
                    || resource == NVIDIA_DRIVER
                    || resource == NVIDIA_MIG_CLASS
            }
            Driver::Amd => resource.starts_with("amd.com/") || resource == AMD_DRIVER,
            Driver::Gaudi => resource == super::intel::GAUDI_RESOURCE || resource == GAUDI_DRIVER,
            Driver::IntelGpu => {
                super::intel::GPU_RESOURCES.contains(&resource) || resource == INTEL_GPU_DRIVER
            }
            Driver::Tpu => resource == super::google::RESOURCE || resource == TPU_DRIVER,
        }
    }

    /// Node labels naming the model the way the vendor's labeller writes it.
    fn model_labels(self) -> &'static [&'static str] {
        match self {
            Driver::Nvidia => &["nvidia.com/gpu.product"],
            Driver::Amd => &["amd.com/gpu.product-name"],
            Driver::Gaudi => &[super::intel::HABANA_DEVICE_TYPE],
            Driver::IntelGpu => &[super::intel::GPU_PRODUCT],
            Driver::Tpu => &[super::google::ACCELERATOR, TPU_ACCELERATOR_LABEL],
        }
    }

    /// Taint keys the vendor's installation puts on its nodes.
    fn taint_keys(self) -> &'static [&'static str] {
        match self {
            Driver::Nvidia => &["nvidia.com/gpu"],
            Driver::Amd => &["amd.com/gpu"],
            Driver::Gaudi => &[super::intel::GAUDI_RESOURCE],
            Driver::IntelGpu => &super::intel::GPU_RESOURCES,
            Driver::Tpu => &[super::google::TAINT_KEY],
        }
    }

    /// Why a device of this driver whose model is unknown is not offered.
    fn no_model_reason(self) -> &'static str {
        match self {
            Driver::Nvidia | Driver::Amd => {
                "the device publishes no productName attribute: its model is unknown; not offered"
            }
            Driver::Gaudi | Driver::IntelGpu => {
                "the driver publishes model Unknown (a PCI device ID it does not know): its model is unknown; not offered (update the DRA driver)"
            }
            Driver::Tpu => {
                "the device publishes no accelerator attribute and the node has no cloud.google.com/gke-tpu-accelerator label: the TPU type is unknown; not offered"
            }
        }
    }
}

/// Merge ResourceSlices into the inventory: the newest generation of each pool, each
/// device once.
pub(crate) fn merge_slices<'a>(
    inventory: &mut Inventory,
    slices: impl IntoIterator<Item = &'a ResourceSlice>,
) {
    let slices: Vec<&ResourceSlice> = slices.into_iter().collect();
    let mut newest: BTreeMap<(&str, &str), i64> = BTreeMap::new();
    for s in &slices {
        let g = newest
            .entry((s.spec.driver.as_str(), s.spec.pool.name.as_str()))
            .or_insert(s.spec.pool.generation);
        *g = (*g).max(s.spec.pool.generation);
    }
    let mut seen: BTreeSet<(String, String, String)> = BTreeSet::new();
    // (node, source, reason) -> devices not classified.
    let mut unclassified: BTreeMap<(String, String, String), u32> = BTreeMap::new();
    let mut touched: BTreeSet<String> = BTreeSet::new();
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
        let Some(node) = inventory.nodes.get_mut(node_name) else {
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
                    if let Err(reason) = merge_device(node, driver, device, slice_name) {
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
            drop_presence_entries(node);
        }
    }
    for ((node, source, reason), count) in unclassified {
        let Some(node) = inventory.nodes.get_mut(&node) else {
            continue;
        };
        node.warnings.push(format!(
            "unclassified accelerator {source} (count {count}): {reason}"
        ));
        node.unclassified.push(UnclassifiedDevice {
            source,
            count,
            reason,
        });
    }
    for name in touched {
        if let Some(node) = inventory.nodes.get_mut(&name) {
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

/// Attach one device to its group (or a new DRA-only group); `Err(reason)` when the
/// device cannot be classified.
fn merge_device(
    node: &mut NodeInventory,
    driver: Driver,
    device: &Device,
    slice_name: &str,
) -> Result<(), String> {
    let dev = DraDevice::read(driver, device, &node.labels, &mut node.warnings, slice_name);
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
    if is_dra_only(group) {
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
        group.driver_version = dev.driver_version.clone();
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
    group.devices.push(dev.record);
    Ok(())
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
        Driver::Gaudi => super::intel::gaudi_generation(model).map(|(_, mib)| mib),
        Driver::Tpu => super::google::generation(model).map(|(_, mib)| mib),
        _ => None,
    }
}

fn known_architecture(driver: Driver, model: &str) -> Option<String> {
    match driver {
        Driver::Gaudi => super::intel::gaudi_generation(model).map(|(a, _)| a.to_string()),
        Driver::Tpu => super::google::generation(model).map(|(a, _)| a.to_string()),
        _ => None,
    }
}

/// Pin labels for a DRA-only group: the node label naming the same model the way the
/// vendor's labeller (or the platform team, `kaccel.io/accelerator.model`) writes it,
/// plus, for TPUs, the topology label of the same family.
fn pins(
    driver: Driver,
    labels: &BTreeMap<String, String>,
    model: &str,
) -> BTreeMap<String, String> {
    let mut pins = BTreeMap::new();
    let found = driver
        .model_labels()
        .iter()
        .copied()
        .chain([MODEL_LABEL])
        .find_map(|key| {
            let (k, v) = labels.get_key_value(key)?;
            (!v.is_empty() && same_product(v, model)).then_some((k, v))
        });
    let Some((key, value)) = found else {
        return pins;
    };
    pins.insert(key.clone(), value.clone());
    if driver == Driver::Tpu && key != MODEL_LABEL {
        let topology_key = if key == TPU_ACCELERATOR_LABEL {
            TPU_TOPOLOGY_LABEL
        } else {
            super::google::TOPOLOGY
        };
        if let Some(t) = labels.get(topology_key)
            && super::google::valid_topology(t)
        {
            pins.insert(topology_key.to_string(), t.clone());
        }
    }
    pins
}

/// What one DRA device says about itself.
struct DraDevice {
    record: DeviceRecord,
    /// The model as the driver names it (`productName`, `model`, TPU `accelerator`);
    /// `None` when it names none (Intel's `Unknown` included).
    product: Option<String>,
    architecture: Option<String>,
    driver_version: Option<String>,
    compute_capability: Option<String>,
    cuda_version: Option<String>,
    /// `type`: NVIDIA `gpu`/`mig`, AMD `amdgpu`/`amdgpu-partition`, Intel `gpu`/`vf`.
    kind: Option<String>,
    /// NVIDIA MIG `profile` or AMD `partitionProfile`.
    profile: Option<String>,
}

impl DraDevice {
    fn read(
        driver: Driver,
        device: &Device,
        node_labels: &BTreeMap<String, String>,
        warnings: &mut Vec<String>,
        slice: &str,
    ) -> Self {
        let attrs: BTreeMap<String, String> = device
            .attributes
            .iter()
            .flatten()
            .filter_map(|(k, v)| attribute_string(v).map(|s| (k.clone(), s)))
            .collect();
        let qualified = format!("{}/", driver.name());
        let get = |name: &str| -> Option<String> {
            attrs
                .get(name)
                .or_else(|| attrs.get(&format!("{qualified}{name}")))
                .filter(|v| !v.is_empty())
                .cloned()
        };
        let memory_mib = device
            .capacity
            .as_ref()
            .and_then(|c| {
                c.get("memory")
                    .or_else(|| c.get(&format!("{qualified}memory")))
            })
            .and_then(|cap| match parse_memory_bytes(&cap.value.0) {
                // Intel publishes 0 until xpumd reports the size: unknown, not empty.
                Ok(0) => None,
                Ok(bytes) => Some(bytes / (1024 * 1024)),
                Err(e) => {
                    warnings.push(format!(
                        "ResourceSlice {slice} device {}: capacity memory: {e}; ignored",
                        device.name
                    ));
                    None
                }
            });
        let major_minor = |v: String| -> String {
            let mut parts = v.split('.');
            match (parts.next(), parts.next()) {
                (Some(a), Some(b)) => format!("{a}.{b}"),
                _ => v.clone(),
            }
        };
        let tainted = device
            .taints
            .iter()
            .flatten()
            .any(|t| t.effect != "PreferNoSchedule" && t.effect != "None");
        let unhealthy = match driver {
            Driver::Gaudi => get("healthy").as_deref() == Some("false"),
            Driver::IntelGpu => get("health").as_deref() == Some("Unhealthy"),
            _ => false,
        };
        let product = match driver {
            Driver::Nvidia | Driver::Amd => get("productName"),
            Driver::Gaudi | Driver::IntelGpu => get("model").filter(|m| m != "Unknown"),
            Driver::Tpu => get("accelerator").or_else(|| {
                [super::google::ACCELERATOR, TPU_ACCELERATOR_LABEL]
                    .iter()
                    .find_map(|k| node_labels.get(*k).filter(|v| !v.is_empty()).cloned())
            }),
        };
        let architecture = match driver {
            Driver::Nvidia => get("architecture"),
            Driver::Amd => get("family"),
            Driver::IntelGpu => get("family").filter(|f| f != "Unknown").map(|f| {
                if f.contains("Max") {
                    "xe-hpc".to_string()
                } else if f.contains("Flex") {
                    "xe-hpg".to_string()
                } else {
                    f
                }
            }),
            Driver::Gaudi => None,
            Driver::Tpu => None,
        }
        .map(|a| a.to_ascii_lowercase());
        DraDevice {
            record: DeviceRecord {
                name: device.name.clone(),
                // The TPU driver's uuid is one value per node, not per chip.
                uuid: (driver != Driver::Tpu).then(|| get("uuid")).flatten(),
                serial: get("serial"),
                pci_address: get("pciAddr")
                    .or_else(|| get("pcieBusID"))
                    .or_else(|| get("pciBusID"))
                    .or_else(|| attrs.get(STD_PCI_BUS_ID).cloned())
                    .or_else(|| get("pciAddress")),
                memory_mib,
                raw_attributes: attrs.clone(),
                tainted: tainted || unhealthy,
            },
            product,
            architecture,
            driver_version: get("driverVersion"),
            compute_capability: get("cudaComputeCapability").map(major_minor),
            cuda_version: get("cudaDriverVersion").map(major_minor),
            kind: get("type"),
            profile: get("profile").or_else(|| get("partitionProfile")),
        }
    }

    /// Sharing mode, partition profile and DeviceClass name for this device.
    fn variant_shape(&self, driver: Driver) -> (SharingMode, Option<String>, &'static str) {
        match driver {
            Driver::Nvidia => {
                let is_mig = self.kind.as_deref() == Some("mig") || self.profile.is_some();
                if is_mig {
                    (
                        SharingMode::Partition,
                        self.profile.clone(),
                        NVIDIA_MIG_CLASS,
                    )
                } else {
                    (SharingMode::Whole, None, NVIDIA_DRIVER)
                }
            }
            Driver::Amd => match self.profile.as_deref().map(|p| p.to_ascii_lowercase()) {
                Some(p) if super::amd::split_mode(&p).is_some_and(|(c, _)| c != "spx") => {
                    (SharingMode::Partition, Some(p), AMD_DRIVER)
                }
                _ => (SharingMode::Whole, None, AMD_DRIVER),
            },
            Driver::Gaudi | Driver::IntelGpu | Driver::Tpu => {
                (SharingMode::Whole, None, driver.name())
            }
        }
    }
}

fn attribute_string(a: &DeviceAttribute) -> Option<String> {
    a.string
        .clone()
        .or_else(|| a.version.clone())
        .or_else(|| a.int.map(|i| i.to_string()))
        .or_else(|| a.bool.map(|b| b.to_string()))
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
        [only] if !is_dra_only(&groups[*only]) => Some(*only),
        _ => None,
    }
}

fn is_dra_only(g: &DeviceGroup) -> bool {
    is_device_class(&g.variant.resource_name)
}

/// Whether a variant's resource is a DRA DeviceClass (a DRA-only group) rather than
/// an extended resource.
pub(crate) fn is_device_class(resource_name: &str) -> bool {
    matches!(
        resource_name,
        NVIDIA_DRIVER
            | NVIDIA_MIG_CLASS
            | AMD_DRIVER
            | GAUDI_DRIVER
            | INTEL_GPU_DRIVER
            | TPU_DRIVER
    )
}

/// The DeviceClass through which a ResourceClaim can be given this group's devices:
/// the group's own class for a DRA-only group; for a device-plugin group whose devices
/// a DRA driver publishes too (records attached), that driver's class; else none.
pub(crate) fn device_class_of(g: &DeviceGroup) -> Option<&'static str> {
    let resource = g.variant.resource_name.as_str();
    let class = [
        NVIDIA_DRIVER,
        NVIDIA_MIG_CLASS,
        AMD_DRIVER,
        GAUDI_DRIVER,
        INTEL_GPU_DRIVER,
        TPU_DRIVER,
    ]
    .into_iter()
    .find(|c| *c == resource);
    if class.is_some() || g.devices.is_empty() {
        return class;
    }
    let driver = [
        Driver::Nvidia,
        Driver::Amd,
        Driver::Gaudi,
        Driver::IntelGpu,
        Driver::Tpu,
    ]
    .into_iter()
    .find(|d| d.vendor() == g.variant.vendor && d.reads_resource(resource))?;
    Some(match driver {
        Driver::Nvidia if g.variant.sharing == SharingMode::Partition => NVIDIA_MIG_CLASS,
        d => d.name(),
    })
}
