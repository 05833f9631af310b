use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{SharingMode, TopologyLevel, Vendor};

/// A capability users ask for ("8 whole accelerators with lots of memory", "a
/// partition for inference"), mapped by the platform team to concrete hardware.
/// kaccel resolves it to one Kueue ResourceFlavor per concrete device variant.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kaccel.io",
    version = "v1alpha1",
    kind = "AcceleratorClass",
    plural = "acceleratorclasses",
    shortname = "acls",
    shortname = "accelclass",
    category = "kaccel",
    status = "AcceleratorClassStatus",
    cel,
    printcolumn = r#"{"name":"Sharing","type":"string","jsonPath":".spec.sharing"}"#,
    printcolumn = r#"{"name":"Flavors","type":"string","jsonPath":".status.summary"}"#,
    printcolumn = r#"{"name":"Healthy","type":"integer","jsonPath":".status.devices.healthy"}"#,
    printcolumn = r#"{"name":"Degraded","type":"integer","jsonPath":".status.devices.degraded"}"#,
    printcolumn = r#"{"name":"Failed","type":"integer","jsonPath":".status.devices.failed"}"#,
    printcolumn = r#"{"name":"Unknown","type":"integer","jsonPath":".status.devices.unknown"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("self.sharing != 'Partition' || (has(self.selector) && has(self.selector.partitionProfile))")
        .message("spec.selector.partitionProfile is required when spec.sharing is Partition: name the partition profile, e.g. 1g.10gb, cpx_nps4 or 4c")
        .field_path(".sharing"),
    validation = Rule::new("self.sharing == 'Partition' || !has(self.selector) || !has(self.selector.partitionProfile)")
        .message("spec.selector.partitionProfile is only valid with spec.sharing: Partition; remove it or set sharing to Partition")
        .field_path(".sharing"),
    validation = Rule::new("self.sharing != 'CpuOnly' || !has(self.devicesPerPod) || size(self.devicesPerPod) == 0")
        .message("a CpuOnly class has no devices to count: remove spec.devicesPerPod")
        .field_path(".devicesPerPod"),
    validation = Rule::new("self.sharing != 'CpuOnly' || !has(self.topology)")
        .message("a CpuOnly class has no devices to place together: remove spec.topology")
        .field_path(".topology"),
    validation = Rule::new("self.sharing != 'CpuOnly' || !has(self.selector) || ((!has(self.selector.vendors) || size(self.selector.vendors) == 0) && (!has(self.selector.models) || size(self.selector.models) == 0) && !has(self.selector.minMemoryMiB) && !has(self.selector.minComputeCapability) && !has(self.selector.minCudaVersion))")
        .message("a CpuOnly class selects no accelerators: remove spec.selector.vendors, models, minMemoryMiB, minComputeCapability and minCudaVersion, or choose another spec.sharing")
        .field_path(".sharing"),
)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorClassSpec {
    /// What this class is for, shown to users.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 1024))]
    pub description: Option<String>,

    /// How a workload gets a device: Whole, Partition (MIG, AMD CPX/NPS, vNPU),
    /// TimeShare (time-slicing/MPS, no isolation), or CpuOnly (no accelerator).
    pub sharing: SharingMode,

    /// Hard hardware requirements. A device that fails any of them never lands in
    /// this class, whatever else is short.
    #[serde(default)]
    pub selector: HardwareSelector,

    /// How matching devices are pooled into Kueue ResourceFlavors.
    #[serde(default)]
    pub pooling: Pooling,

    /// Preferred models first: glob patterns over the model name (`*H100*`). Flavors
    /// matching an earlier pattern are tried first by Kueue; the rest follow in a
    /// stable order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(p, size(p) > 0 && size(p) <= 128)").message("spec.preference entries must be non-empty model patterns of at most 128 characters, e.g. '*H100*'"))]
    pub preference: Vec<String>,

    /// How many devices one pod of this class may ask for (e.g. `[8]` for large
    /// training, `[1]` for inference), counted over every name a device can be
    /// asked for (`kaccel.io/accelerator`, the vendor's resource). A Workload whose
    /// pods ask for another count is rejected by kaccel's credit check, naming the
    /// class and these counts. Empty: any count.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(n, n >= 1 && n <= 1024)").message("spec.devicesPerPod entries must be device counts from 1 to 1024, e.g. [8]"))]
    pub devices_per_pod: Vec<u32>,

    /// Pod settings per vendor or model, applied by kaccel's pod webhook to a pod
    /// that asks for `kaccel.io/accelerator` once Kueue has placed it on a flavor:
    /// the first entry whose `vendors` and `models` match the flavor's devices
    /// wins, so one Job manifest can run a CUDA image on NVIDIA and a ROCm image
    /// on AMD. Pods that name a vendor resource themselves are left alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub pod_settings: Vec<VendorPodSettings>,

    /// The topology level one Workload's pods must fit in (e.g. `rack` for large
    /// training). kaccel writes Kueue Topology objects for the levels its nodes
    /// carry; the class status shows, per flavor, the node label a Job names in
    /// `kueue.x-k8s.io/podset-required-topology` and the largest block of
    /// healthy devices at this level, and a budget whose guarantee fits in no
    /// such block is told so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologyRequirement>,

    /// What a device-hour of this class costs in credits.
    pub credits: CreditRate,
}

/// Where the pods of one Workload of a class must land together.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyRequirement {
    /// The widest domain the pods may spread over: `zone`, `datacenter`,
    /// `block`, `subblock`, `rack`, `nvlinkDomain`, `physicalHost` or `host`.
    pub level: TopologyLevel,
}

/// What a pod placed on matching devices gets, besides its vendor resource.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VendorPodSettings {
    /// The vendors this entry is for; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 6))]
    pub vendors: Vec<Vendor>,
    /// Model glob patterns (`*MI300X*`) this entry is for; empty: any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(m, size(m) > 0 && size(m) <= 128)").message("spec.podSettings[].models entries must be non-empty patterns of at most 128 characters"))]
    pub models: Vec<String>,
    /// Environment variables added to every container that asks for devices
    /// (a variable the container already sets is left as it is).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub env: Vec<PodEnvVar>,
    /// Tolerations added to the pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<k8s_openapi::api::core::v1::Toleration>,
    /// The pod's `runtimeClassName` (e.g. `nvidia`), when it sets none itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub runtime_class_name: Option<String>,
    /// The image of every container that asks for devices (e.g. the ROCm build
    /// of the same program).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub image: Option<String>,
}

/// A literal environment variable.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct PodEnvVar {
    #[schemars(length(min = 1, max = 256))]
    pub name: String,
    #[serde(default)]
    #[schemars(length(max = 4096))]
    pub value: String,
}

/// Hard constraints on the hardware a class may use. Empty lists mean "any".
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HardwareSelector {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 6))]
    pub vendors: Vec<Vendor>,

    /// Model name glob patterns (`NVIDIA-H100*`, `AMD_Instinct_MI300X`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(m, size(m) > 0 && size(m) <= 128)").message("spec.selector.models entries must be non-empty patterns of at most 128 characters"))]
    pub models: Vec<String>,

    /// Minimum memory of one device (or partition), MiB.
    #[serde(
        default,
        rename = "minMemoryMiB",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub min_memory_mib: Option<u64>,

    /// Allowed architectures or families (`hopper`, `ampere`, `cdna3`, `gaudi3`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub architectures: Vec<String>,

    /// Minimum NVIDIA compute capability, `major.minor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+\\\\.[0-9]+$')").message("spec.selector.minComputeCapability must be major.minor, e.g. 8.0"))]
    pub min_compute_capability: Option<String>,

    /// Minimum driver version, dotted numbers (`550.54`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(\\\\.[0-9]+){0,3}$')").message("spec.selector.minDriverVersion must be dotted numbers, e.g. 550.54.15"))]
    pub min_driver_version: Option<String>,

    /// Minimum CUDA driver API version (NVIDIA), `major.minor`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+\\\\.[0-9]+$')").message("spec.selector.minCudaVersion must be major.minor, e.g. 12.4"))]
    pub min_cuda_version: Option<String>,

    /// Allowed firmware (VBIOS) versions, exactly as the vendor's exporter reports
    /// them (dcgm-exporter `DCGM_FI_DEV_VBIOS_VERSION`, AMD `vbios_version`, Gaudi
    /// `spi`). A hard constraint: no node label or DRA attribute publishes
    /// firmware, so kaccel cannot keep pods off some cards of a flavor, and a
    /// variant is admitted only when every card on the nodes the class selects
    /// reports an allowed version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(v, size(v) > 0 && size(v) <= 64)").message("spec.selector.firmwareVersions entries must be non-empty versions of at most 64 characters, e.g. 96.00.89.00.01"))]
    pub firmware_versions: Vec<String>,

    /// The partition profile a Partition class uses (`1g.10gb`, `cpx_nps4`, `4c`, `neuroncore`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub partition_profile: Option<String>,

    /// Extra node labels every node of the class must carry (e.g. a pool label).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
}

/// How devices are pooled into flavors. The default is one flavor per concrete
/// vendor + model + sharing + partition variant: two models never share a flavor.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Pooling {
    /// Node label keys that further split a variant into separate flavors, e.g.
    /// `topology.kubernetes.io/zone` for one flavor per zone. Every class using a
    /// variant must split it the same way.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    #[x_kube(validation = Rule::new("self.all(k, size(k) > 0 && size(k) <= 253)").message("spec.pooling.splitBy entries must be node label keys, e.g. topology.kubernetes.io/zone"))]
    pub split_by: Vec<String>,
}

/// Credits per device-hour (per partition-hour for Partition classes, per
/// replica-hour for TimeShare, per CPU-core-hour for CpuOnly).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreditRate {
    /// Decimal, non-negative, below 1000000000 (a year of one device must fit the
    /// ledger), at most 6 places, e.g. "4" or "0.25".
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,9}(\\\\.[0-9]{1,6})?$')").message("spec.credits.perDeviceHour must be a non-negative decimal below 1000000000 with at most 6 places, e.g. \"2.5\""))]
    pub per_device_hour: String,

    /// Per-model rates that override `perDeviceHour` (first match wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub model_overrides: Vec<ModelRate>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ModelRate {
    /// Model glob pattern.
    #[schemars(length(min = 1, max = 128))]
    pub model: String,
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,9}(\\\\.[0-9]{1,6})?$')").message("spec.credits.modelOverrides[].perDeviceHour must be a non-negative decimal below 1000000000 with at most 6 places, e.g. \"6\""))]
    pub per_device_hour: String,
}

/// Devices by normalised health status.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HealthCounts {
    pub healthy: u32,
    pub warning: u32,
    pub degraded: u32,
    pub failed: u32,
    pub unknown: u32,
}

impl HealthCounts {
    pub fn total(&self) -> u32 {
        self.healthy + self.warning + self.degraded + self.failed + self.unknown
    }

    pub fn add(&mut self, other: &HealthCounts) {
        self.healthy += other.healthy;
        self.warning += other.warning;
        self.degraded += other.degraded;
        self.failed += other.failed;
        self.unknown += other.unknown;
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AcceleratorClassStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Flavor names in the preference order in force, comma-separated (for `kubectl get`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// The flavors this class resolved to, in the preference order in force.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flavors: Vec<ResolvedFlavor>,
    /// All devices of the class by health.
    #[serde(default)]
    pub devices: HealthCounts,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResolvedFlavor {
    /// The Kueue ResourceFlavor name.
    pub name: String,
    pub vendor: String,
    pub model: String,
    pub sharing: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition_profile: Option<String>,
    /// The extended resource workloads request.
    pub resource_name: String,
    pub nodes: u32,
    pub devices: HealthCounts,
    /// Devices that count towards quota: schedulable and not known to be broken.
    pub healthy_capacity: u32,
    /// True when health warnings moved this flavor later in the preference order.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub demoted: bool,
    /// The Kueue Topology this flavor's nodes are placed by, when they carry
    /// topology labels (Kueue's Topology Aware Scheduling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<FlavorTopology>,
}

/// A flavor's topology as Kueue's Topology Aware Scheduling sees it.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorTopology {
    /// The Kueue Topology object (`spec.topologyName` of the ResourceFlavor).
    pub name: String,
    /// Its levels' node labels, widest first.
    pub levels: Vec<String>,
    /// The node label of the class's `spec.topology.level` in this flavor: what
    /// a Job names in `kueue.x-k8s.io/podset-required-topology`. Absent when the
    /// class states no level, or this flavor's nodes do not carry it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level_label: Option<String>,
    /// Domains at the class's level (e.g. racks) holding this flavor's devices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocks: Option<u32>,
    /// Healthy capacity of the fullest such domain: the most devices one
    /// Workload of the class can get here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub largest_block: Option<u64>,
}
