//! The device inventory: every vendor's way of describing accelerators on a Node
//! (labels, extended resources, DRA ResourceSlices) read into one model.
//!
//! Vendor differences live in one adapter module per vendor family; the rest of
//! kaccel only sees [`NodeInventory`] and [`DeviceGroup`]. Adding an accelerator
//! family is adding one module and one line in `adapters`.

mod amd;
mod aws;
mod dra;
mod google;
pub mod holders;
mod huawei;
pub mod index;
mod intel;
pub mod labels;
mod nvidia;
use crate::k8s::quantity::{self, parse_count, parse_cpu_millis, parse_memory_bytes};
pub mod synthetic;
#[cfg(test)]
mod tests;
pub mod topology;
mod unclassified;
#[cfg(test)]
pub(crate) mod vendor_fleet_ascend_neuron;
#[cfg(test)]
pub(crate) mod vendor_fleet_intel_tpu_dra;
#[cfg(test)]
pub(crate) mod vendor_fleet_nvidia_amd;
#[cfg(test)]
pub(crate) mod vendor_fleet_other;

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node, Taint};
use k8s_openapi::api::resource::v1::ResourceSlice;
use serde::{Deserialize, Serialize};

pub use crate::api::{SharingMode, Vendor};
/// Node label choosing which Neuron view kaccel offers (see `aws.rs`).
pub use aws::VIEW_LABEL as NEURON_VIEW_LABEL;
/// Whether a resource name is a DRA DeviceClass kaccel plans for (DRA-only groups).
pub fn is_dra_device_class(resource_name: &str) -> bool {
    dra::is_device_class(resource_name)
}
/// The DRA DeviceClass through which a ResourceClaim can be given a group's devices
/// (see `dra.rs`), if any.
pub fn dra_device_class_of(group: &DeviceGroup) -> Option<&'static str> {
    dra::device_class_of(group)
}

/// The attributes that make a DRA device's variant, for a DeviceClass to pin.
pub fn dra_selector_attributes(driver: &str) -> &'static [&'static str] {
    dra::selector_attributes(driver)
}
/// Where a class's hard requirements are read on a DRA device of `driver`.
pub fn dra_requirement_attributes(driver: &str) -> DraRequirementAttributes {
    dra::requirement_attributes(driver)
}
pub use dra::RequirementAttributes as DraRequirementAttributes;
pub use dra::{PublishedIds, newest_generations, published_ids};

/// Well-known topology labels, read into [`Topology`] when present.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
pub const REGION_LABEL: &str = "topology.kubernetes.io/region";
pub const RACK_LABEL: &str = "topology.kaccel.io/rack";
pub const DATACENTER_LABEL: &str = "topology.kaccel.io/datacenter";

/// kaccel's own fallback label for the accelerator model, for hardware whose vendor
/// stack publishes no product label (Intel Gaudi's device plugin and feature
/// discovery label availability and driver version, not the product). The platform
/// team sets it, e.g. `kaccel.io/accelerator.model=Gaudi3`. Every adapter honours it
/// when the vendor's own product label is missing.
pub const MODEL_LABEL: &str = "kaccel.io/accelerator.model";

/// One concrete kind of schedulable accelerator: vendor + model + how it is shared.
/// Two devices with the same variant are interchangeable for scheduling; a Kueue
/// ResourceFlavor pins exactly one variant.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceVariant {
    pub vendor: Vendor,
    /// Normalised product name as the vendor labels it, e.g. `NVIDIA-H100-80GB-HBM3`.
    /// For NVIDIA MIG single strategy and time-slicing the vendor suffixes
    /// (`-MIG-1g.5gb`, `-SHARED`) are stripped: they are carried by `sharing` and
    /// `partition_profile` instead.
    pub model: String,
    pub sharing: SharingMode,
    /// Partition profile for [`SharingMode::Partition`], e.g. `1g.10gb`, `cpx_nps4`, `4c`.
    pub partition_profile: Option<String>,
    /// The Kubernetes extended resource a workload requests, e.g. `nvidia.com/gpu`.
    pub resource_name: String,
}

/// All devices of one variant on one node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceGroup {
    pub variant: DeviceVariant,
    /// What the node reports in `status.capacity` for the resource.
    pub capacity: u32,
    /// What the node reports in `status.allocatable`; lower than `capacity` when the
    /// vendor device plugin withdrew devices it found unhealthy.
    pub allocatable: u32,
    /// Memory of one device (or one partition), MiB.
    pub memory_mib: Option<u64>,
    /// Architecture or family, e.g. `hopper`, `ampere`, `cdna3`, `gaudi2`.
    pub architecture: Option<String>,
    /// NVIDIA compute capability, e.g. `9.0`.
    pub compute_capability: Option<String>,
    pub driver_version: Option<String>,
    /// CUDA driver API version (NVIDIA), e.g. `12.4`.
    pub cuda_version: Option<String>,
    /// The node labels `driver_version` and `cuda_version` were read from, with
    /// their values: what pins a flavor to nodes of one version when a class's
    /// minimum version splits a variant (empty when no label carries them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub version_labels: BTreeMap<String, String>,
    /// Node labels that select exactly this variant; a ResourceFlavor's `nodeLabels`.
    pub pin_labels: BTreeMap<String, String>,
    /// Taint keys the vendor's installation puts on such nodes (tolerated by flavors).
    pub vendor_taint_keys: Vec<String>,
    /// The raw vendor labels this group was read from, unchanged.
    pub raw_labels: BTreeMap<String, String>,
    /// Individual devices, where the source names them (DRA ResourceSlices);
    /// otherwise empty and devices are only counted.
    pub devices: Vec<DeviceRecord>,
}

impl DeviceGroup {
    /// A group with counts and nothing else known yet; adapters fill in the rest.
    /// Published by a DRA driver alone (no device plugin advertises its resource):
    /// its resource is the driver's DeviceClass.
    pub fn is_dra_only(&self) -> bool {
        is_dra_device_class(&self.variant.resource_name)
    }

    pub(crate) fn new(variant: DeviceVariant, capacity: u32, allocatable: u32) -> Self {
        DeviceGroup {
            variant,
            capacity,
            allocatable: allocatable.min(capacity),
            memory_mib: None,
            architecture: None,
            compute_capability: None,
            driver_version: None,
            cuda_version: None,
            version_labels: BTreeMap::new(),
            pin_labels: BTreeMap::new(),
            vendor_taint_keys: Vec::new(),
            raw_labels: BTreeMap::new(),
            devices: Vec::new(),
        }
    }
}

/// One physical device (or partition) as a DRA driver publishes it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRecord {
    /// The device name inside its ResourceSlice, e.g. `gpu-0`.
    pub name: String,
    /// The DRA driver and the pool that publish it: with `name`, the device's
    /// identity in the cluster (what a DeviceTaintRule selects). Read from a
    /// ResourceSlice it is the driver's own constant name, not a copy per
    /// device: the planner compares it on every device of the fleet, and a
    /// constant is one cache line where 40,000 copies were 40,000 misses.
    #[serde(default, skip_serializing_if = "is_empty")]
    pub driver: std::borrow::Cow<'static, str>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub pool: String,
    pub uuid: Option<String>,
    /// The board's serial number, where the driver publishes one (Intel Gaudi).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    pub pci_address: Option<String>,
    pub memory_mib: Option<u64>,
    /// The driver version the device publishes (`driverVersion`), where it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The type each attribute of the driver's domain is published as, by bare
    /// name: CEL compares a version with `semver()` and a string with `==`, and
    /// either on the other type is an error.
    /// Shared (one allocation) with the previous device of its group when equal,
    /// as devices of one group usually are: the planner reads each shape once.
    #[serde(skip)]
    pub attribute_kinds: std::sync::Arc<BTreeMap<String, AttributeKind>>,
    /// The values it publishes for its driver's variant attributes
    /// ([`dra_selector_attributes`], in that order; bare or qualified, empty is
    /// none), read once for the DeviceClass pins; shared like `attribute_kinds`.
    #[serde(skip)]
    pub selector_values: std::sync::Arc<[Option<String>]>,
    /// All attributes as published, stringified, for the engineer who needs them.
    pub raw_attributes: BTreeMap<String, String>,
    /// Out of service: the driver (or a DeviceTaintRule) put a NoSchedule/NoExecute
    /// taint on it, or the driver's own health attribute says it is unhealthy.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tainted: bool,
}

/// The type of a published DRA attribute (`resource.k8s.io/v1` DeviceAttribute).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum AttributeKind {
    String,
    Version,
    Int,
    Bool,
}

/// Accelerators a node advertises that kaccel cannot classify: an unknown resource
/// under an accelerator vendor's domain, a vendor label scheme it does not know, a
/// device whose model no label names, or a DRA driver it does not read. They are
/// never planned as a known variant nor as CPU-only capacity; the plan summary, the
/// inventory and the `kaccel_inventory_unclassified_devices` metric name them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UnclassifiedDevice {
    /// The resource (or DRA driver, or label) that advertises the devices.
    pub source: String,
    /// How many devices it advertises; 0 when only labels say an accelerator is there.
    pub count: u32,
    /// Why kaccel could not classify them, and what would fix it.
    pub reason: String,
    /// Set when a vendor adapter knew the devices but no node label names their
    /// model (`<resource>-unlabelled`): the vendor, so the classes that could
    /// have pooled them say so (`UnlabelledModels`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unlabelled_model_of: Option<Vendor>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    pub region: Option<String>,
    pub zone: Option<String>,
    pub rack: Option<String>,
    pub datacenter: Option<String>,
}

/// Everything kaccel knows about one Node, vendor-neutral.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInventory {
    /// The Node's name; [`worker_key`] for a MultiKueue worker's Node.
    pub name: String,
    pub labels: labels::Labels,
    /// kaccel's own annotations on the node (`kaccel.io/...`): what it did to it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub topology: Topology,
    /// `spec.unschedulable` (cordoned by anyone).
    pub unschedulable: bool,
    /// Status of the `Ready` condition: `Some(true)`, `Some(false)`, or `None` when absent/Unknown.
    pub ready: Option<bool>,
    pub taints: Vec<Taint>,
    /// Node conditions other than Ready: type -> (status, reason), for health adapters.
    pub conditions: BTreeMap<String, (String, String)>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub groups: Vec<DeviceGroup>,
    /// Accelerators on this node kaccel cannot classify (see [`UnclassifiedDevice`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unclassified: Vec<UnclassifiedDevice>,
    /// `status.allocatable[kaccel.io/accelerator]`, where the node advertises the
    /// class resource (Kueue's TAS needs it beside a transformed vendor resource;
    /// see `plan::topology`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class_resource_allocatable: Option<u32>,
    /// Problems met while reading this node (e.g. an unparseable quantity): the node is
    /// still listed, the affected group is skipped, and the reason is visible.
    pub warnings: Vec<String>,
}

/// A MultiKueue worker's Node as the pooled inventory keys it (and names it):
/// `<cluster>/<node>`. A Node's own name is a DNS subdomain, never holding '/',
/// so two clusters' names never meet and the key says the cluster.
pub fn worker_key(cluster: &str, node: &str) -> String {
    format!("{cluster}/{node}")
}

/// The MultiKueue worker cluster of a Node key ([`worker_key`]); None for a
/// Node of kaccel's own cluster (the only one kaccel changes Nodes in).
pub fn worker_of(key: &str) -> Option<&str> {
    key.split_once('/').map(|(cluster, _)| cluster)
}

impl NodeInventory {
    /// The MultiKueue worker cluster the Node is in (see [`worker_of`]).
    pub fn worker_cluster(&self) -> Option<&str> {
        worker_of(&self.name)
    }

    /// Whether the node carries any accelerator, classified or not: a node with an
    /// accelerator kaccel cannot classify is still no CPU-only node.
    pub fn has_accelerators(&self) -> bool {
        !self.groups.is_empty() || !self.unclassified.is_empty()
    }

    /// Whether new pods could land here at all, ignoring taints.
    pub fn accepts_new_pods(&self) -> bool {
        !self.unschedulable && self.ready != Some(false)
    }
}

/// The whole fleet, keyed by node name (sorted, so everything built from it is deterministic).
///
/// Each node is shared (`Arc`): a copy of the fleet (the Node index changing while a
/// re-plan holds its snapshot, ResourceSlices merged into a re-plan's own copy)
/// copies the map of pointers and then only the nodes it changes, not 5,000
/// nodes' labels and groups.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    #[serde(with = "shared_nodes")]
    pub nodes: BTreeMap<String, Arc<NodeInventory>>,
}

/// (De)serialises the shared nodes as plain ones (serde's `rc` feature would
/// rebuild every dependency for two functions).
mod shared_nodes {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use serde::{Deserialize, Deserializer, Serializer};

    use super::NodeInventory;

    pub fn serialize<S: Serializer>(
        nodes: &BTreeMap<String, Arc<NodeInventory>>,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.collect_map(nodes.iter().map(|(name, node)| (name, &**node)))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<BTreeMap<String, Arc<NodeInventory>>, D::Error> {
        let nodes = BTreeMap::<String, NodeInventory>::deserialize(deserializer)?;
        Ok(nodes
            .into_iter()
            .map(|(name, node)| (name, Arc::new(node)))
            .collect())
    }
}

impl Inventory {
    pub fn from_nodes<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Self {
        Self::from_nodes_and_slices(nodes, std::iter::empty())
    }

    /// Build from Nodes plus, where present, DRA ResourceSlices (which add per-device
    /// records and DRA-only device groups).
    pub fn from_nodes_and_slices<'a>(
        nodes: impl IntoIterator<Item = &'a Node>,
        slices: impl IntoIterator<Item = &'a ResourceSlice>,
    ) -> Self {
        let mut inventory = Inventory::default();
        for node in nodes {
            let entry = read_node(node);
            inventory.nodes.insert(entry.name.clone(), Arc::new(entry));
        }
        dra::merge_slices(&mut inventory, slices);
        inventory
    }

    /// A copy with DRA ResourceSlices merged in (a slice's devices land on its
    /// Node's entry).
    pub fn with_slices<'a>(&self, slices: impl IntoIterator<Item = &'a ResourceSlice>) -> Self {
        let mut inventory = self.clone();
        dra::merge_slices(&mut inventory, slices);
        inventory
    }

    /// Every accelerator kaccel could not classify, with its node.
    pub fn unclassified(&self) -> impl Iterator<Item = (&NodeInventory, &UnclassifiedDevice)> {
        self.nodes
            .values()
            .flat_map(|n| n.unclassified.iter().map(move |u| (&**n, u)))
    }

    /// Devices kaccel could not classify, over the fleet (what the
    /// `kaccel_inventory_unclassified_devices` metric reports; a label-only entry counts 1).
    pub fn unclassified_device_count(&self) -> u64 {
        self.unclassified()
            .map(|(_, u)| u64::from(u.count.max(1)))
            .sum()
    }

    pub fn groups(&self) -> impl Iterator<Item = (&NodeInventory, &DeviceGroup)> {
        self.nodes
            .values()
            .flat_map(|n| n.groups.iter().map(move |g| (&**n, g)))
    }
}

/// What one vendor adapter contributes: it reads the node's labels and resources and
/// returns the device groups it recognises. An adapter must never panic on odd input;
/// it reports unparseable values as warnings.
pub(crate) struct NodeView<'a> {
    pub labels: &'a BTreeMap<String, String>,
    pub capacity: BTreeMap<&'a str, &'a str>,
    pub allocatable: BTreeMap<&'a str, &'a str>,
    pub taints: &'a [Taint],
}

impl<'a> NodeView<'a> {
    /// The (capacity, allocatable) count of an extended resource present with a
    /// non-zero capacity. An unparseable capacity or allocatable value is reported in
    /// `warnings`, naming the resource and the value. A bad capacity drops the resource (it cannot be counted); a
    /// bad allocatable keeps it with allocatable 0 (nothing schedulable is assumed).
    pub fn count_checked(&self, resource: &str, warnings: &mut Vec<String>) -> Option<(u32, u32)> {
        let raw_cap = self.capacity.get(resource)?;
        let cap = match parse_count(raw_cap) {
            Ok(c) => c,
            Err(e) => {
                warnings.push(format!(
                    "status.capacity[{resource}]: {e}; resource skipped"
                ));
                return None;
            }
        };
        if cap == 0 {
            return None;
        }
        let alloc = match self.allocatable.get(resource).map(|a| parse_count(a)) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                warnings.push(format!(
                    "status.allocatable[{resource}]: {e}; counted as 0 allocatable"
                ));
                0
            }
            None => 0,
        };
        if alloc > cap {
            warnings.push(format!(
                "status.allocatable[{resource}]={alloc} exceeds capacity {cap}; capped at capacity"
            ));
        }
        Some((cap, alloc.min(cap)))
    }

    /// Every extended resource whose name starts with `prefix`, counted as by
    /// [`NodeView::count_checked`].
    pub fn resources_with_prefix_checked(
        &self,
        prefix: &str,
        warnings: &mut Vec<String>,
    ) -> Vec<(&'a str, u32, u32)> {
        let names: Vec<&'a str> = self
            .capacity
            .keys()
            .copied()
            .filter(|name| name.starts_with(prefix))
            .collect();
        names
            .into_iter()
            .filter_map(|name| {
                self.count_checked(name, warnings)
                    .map(|(cap, alloc)| (name, cap, alloc))
            })
            .collect()
    }

    /// A label holding a plain non-negative integer; a malformed value is a warning.
    pub fn label_u64(&self, key: &str, warnings: &mut Vec<String>) -> Option<u64> {
        let raw = self.label(key)?;
        let parsed = quantity::parse_label_u64(raw);
        if parsed.is_none() {
            warnings.push(format!(
                "label {key}={raw:?}: not a non-negative integer; ignored"
            ));
        }
        parsed
    }

    /// A label holding a memory size (see [`quantity::parse_label_size_mib`]), in MiB.
    pub fn label_size_mib(
        &self,
        key: &str,
        plain_unit_mib: u64,
        warnings: &mut Vec<String>,
    ) -> Option<u64> {
        let raw = self.label(key)?;
        let parsed = quantity::parse_label_size_mib(raw, plain_unit_mib);
        if parsed.is_none() {
            warnings.push(format!("label {key}={raw:?}: not a memory size; ignored"));
        }
        parsed
    }

    /// The model and pin labels to use when the vendor's product label is missing:
    /// kaccel's own [`MODEL_LABEL`] when the platform team set it, otherwise
    /// `<resource>-unlabelled` with no pin labels and a warning naming the missing
    /// label, so that the gap is visible instead of silently pooled.
    pub(crate) fn fallback_model(
        &self,
        resource: &str,
        missing_label: &str,
        warnings: &mut Vec<String>,
    ) -> (String, BTreeMap<String, String>) {
        if let Some(model) = self.label(MODEL_LABEL) {
            let pins = BTreeMap::from([(MODEL_LABEL.to_string(), model.to_string())]);
            return (model.to_string(), pins);
        }
        warnings.push(format!(
            "{resource}: node has no {missing_label} label (nor {MODEL_LABEL}); \
             devices listed as model {resource}-unlabelled and not pinned by label"
        ));
        (format!("{resource}-unlabelled"), BTreeMap::new())
    }

    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .get(key)
            .map(String::as_str)
            .filter(|v| !v.is_empty())
    }

    /// Labels whose key starts with one of the prefixes, kept raw.
    pub fn raw_labels(&self, prefixes: &[&str]) -> BTreeMap<String, String> {
        self.labels
            .iter()
            .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    pub fn taint_keys(&self, keys: &[&str]) -> Vec<String> {
        let mut found: Vec<String> = self
            .taints
            .iter()
            .filter(|t| keys.contains(&t.key.as_str()))
            .map(|t| t.key.clone())
            .collect();
        found.sort();
        found.dedup();
        found
    }
}

type Adapter = fn(&NodeView<'_>, &mut Vec<String>) -> Vec<DeviceGroup>;

/// Every vendor adapter, in a fixed order.
fn adapters() -> [Adapter; 6] {
    [
        nvidia::read,
        amd::read,
        intel::read,
        huawei::read,
        aws::read,
        google::read,
    ]
}

/// Read one Node into the common model.
pub fn read_node(node: &Node) -> NodeInventory {
    let name = node.metadata.name.clone().unwrap_or_default();
    let unlabelled = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&unlabelled);
    let spec = node.spec.as_ref();
    let status = node.status.as_ref();
    let taints = spec.and_then(|s| s.taints.clone()).unwrap_or_default();
    let capacity: BTreeMap<&str, &str> = status
        .and_then(|s| s.capacity.as_ref())
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v.0.as_str())).collect())
        .unwrap_or_default();
    let allocatable: BTreeMap<&str, &str> = status
        .and_then(|s| s.allocatable.as_ref())
        .map(|m| m.iter().map(|(k, v)| (k.as_str(), v.0.as_str())).collect())
        .unwrap_or_default();

    let mut warnings = Vec::new();
    let cpu_millis = match allocatable.get("cpu").map(|v| parse_cpu_millis(v)) {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            warnings.push(format!("status.allocatable.cpu: {e}"));
            0
        }
        None => 0,
    };
    let memory_bytes = match allocatable.get("memory").map(|v| parse_memory_bytes(v)) {
        Some(Ok(v)) => v,
        Some(Err(e)) => {
            warnings.push(format!("status.allocatable.memory: {e}"));
            0
        }
        None => 0,
    };

    let class_resource_allocatable = allocatable
        .get(crate::api::CLASS_RESOURCE)
        .and_then(|v| parse_count(v).ok());
    let view = NodeView {
        labels,
        capacity,
        allocatable,
        taints: &taints,
    };
    let mut groups: Vec<DeviceGroup> = adapters()
        .iter()
        .flat_map(|adapter| adapter(&view, &mut warnings))
        .collect();
    // One Neuron view is read per node (see aws.rs); the other view names the same
    // chips and is accounted for, not unknown.
    let accounted: &[&str] = if groups.iter().any(|g| g.variant.vendor == Vendor::Aws) {
        &aws::ALL_RESOURCES
    } else {
        &[]
    };
    let mut unclassified = unclassified::sweep(&view, &mut groups, accounted);
    for u in unclassified.iter_mut() {
        // An adapter that read the resource and declined to classify it said why
        // (e.g. an MI300X under amd.com/gpu with no partition label): that reason
        // beats the generic one.
        let prefix = format!("{}: ", u.source);
        if let Some(why) = warnings.iter().find_map(|w| w.strip_prefix(&prefix)) {
            u.reason = why.to_string();
        }
    }
    for u in &unclassified {
        warnings.push(format!(
            "unclassified accelerator {} (count {}): {}",
            u.source, u.count, u.reason
        ));
    }
    groups.sort_by(|a, b| a.variant.cmp(&b.variant));

    let mut ready = None;
    let mut conditions = BTreeMap::new();
    for c in status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
    {
        if c.type_ == "Ready" {
            ready = match c.status.as_str() {
                "True" => Some(true),
                "False" => Some(false),
                _ => None,
            };
        } else {
            conditions.insert(
                c.type_.clone(),
                (c.status.clone(), c.reason.clone().unwrap_or_default()),
            );
        }
    }

    let topology = Topology {
        region: labels.get(REGION_LABEL).cloned(),
        zone: labels.get(ZONE_LABEL).cloned(),
        rack: labels.get(RACK_LABEL).cloned(),
        datacenter: labels.get(DATACENTER_LABEL).cloned(),
    };

    let annotations = node
        .metadata
        .annotations
        .iter()
        .flatten()
        .filter(|(k, _)| k.starts_with("kaccel.io/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    NodeInventory {
        name,
        annotations,
        topology,
        unschedulable: spec.and_then(|s| s.unschedulable).unwrap_or(false),
        ready,
        taints,
        conditions,
        cpu_millis,
        memory_bytes,
        groups,
        unclassified,
        class_resource_allocatable,
        warnings,
        labels: labels.into(),
    }
}

/// A device UUID as compared across sources (exporters and DRA drivers differ
/// in case and spacing).
pub fn uuid_key(uuid: &str) -> String {
    uuid.trim().to_ascii_lowercase()
}

/// A PCI address as `domain:bus:device.function`, lower case, with the domain
/// as 4 hex digits (DCGM writes `00000000:18:00.0`, drivers `0000:18:00.0`).
pub fn pci_key(address: &str) -> String {
    let a = address.trim().to_ascii_lowercase();
    match a.split_once(':') {
        Some((domain, rest)) if rest.contains(':') => {
            let domain = domain.trim_start_matches('0');
            format!("{domain:0>4}:{rest}")
        }
        _ => format!("0000:{a}"),
    }
}

/// Values found by what two sources both know of a card: its node and UUID, else
/// its node and PCI address, each compared as [`uuid_key`] and [`pci_key`] spell
/// it. Joins an exporter's readings to DRA devices and back.
#[derive(Clone, Debug)]
pub struct ByIdentity<T> {
    by_uuid: BTreeMap<String, BTreeMap<String, T>>,
    by_pci: BTreeMap<String, BTreeMap<String, T>>,
}

impl<T> Default for ByIdentity<T> {
    fn default() -> Self {
        ByIdentity {
            by_uuid: BTreeMap::new(),
            by_pci: BTreeMap::new(),
        }
    }
}

impl<T: Clone> ByIdentity<T> {
    /// Index (node, UUID, PCI address, value); a later entry with the same key
    /// wins.
    pub fn new<'a>(
        entries: impl IntoIterator<Item = (&'a str, Option<&'a str>, Option<&'a str>, T)>,
    ) -> Self {
        let mut index = ByIdentity::default();
        for (node, uuid, pci, value) in entries {
            if let Some(u) = uuid {
                index
                    .by_uuid
                    .entry(node.to_string())
                    .or_default()
                    .insert(uuid_key(u), value.clone());
            }
            if let Some(p) = pci {
                index
                    .by_pci
                    .entry(node.to_string())
                    .or_default()
                    .insert(pci_key(p), value);
            }
        }
        index
    }

    /// The value of the card on `node` with this UUID, else this PCI address.
    pub fn get(&self, node: &str, uuid: Option<&str>, pci: Option<&str>) -> Option<&T> {
        let by_uuid = uuid.and_then(|u| self.by_uuid.get(node)?.get(&uuid_key(u)));
        by_uuid.or_else(|| self.by_pci.get(node)?.get(&pci_key(pci?)))
    }
}

/// serde's `skip_serializing_if` for a text that is not a `String` (a
/// [`Cow`](std::borrow::Cow)).
fn is_empty<T: AsRef<str>>(text: &T) -> bool {
    text.as_ref().is_empty()
}
