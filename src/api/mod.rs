//! kaccel's own custom resources, group `kaccel.io`, version `v1alpha1`.
//!
//! Every rule that can be checked on one object at apply time is a schema
//! constraint or a CEL rule (`x-kubernetes-validations`) with a message naming the
//! field and the fix. Rules that need other objects (a budget naming a missing
//! class, two classes pooling the same hardware differently) are checked by the
//! planner and reported as status conditions.

mod accelerator_class;
mod conditions;
mod credit_budget;
mod credits;
pub mod parsed;
pub mod rates;
pub mod synthetic;

pub use accelerator_class::*;
pub use conditions::*;
pub use credit_budget::*;
pub use credits::{Credits, CreditsParseError};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub const GROUP: &str = "kaccel.io";
pub const VERSION: &str = "v1alpha1";

/// The vendor-neutral extended resource a workload asks for devices of its
/// queue's class with (`kaccel.io/accelerator: 8`). Kueue counts every vendor
/// device resource as it too (a `Retain` transformation), so one device is one
/// count however it is asked for.
pub const CLASS_RESOURCE: &str = "kaccel.io/accelerator";

/// Accelerator vendors kaccel has adapters for.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Vendor {
    /// NVIDIA GPUs (`nvidia.com/gpu`, MIG `nvidia.com/mig-*`).
    Nvidia,
    /// AMD Instinct GPUs (`amd.com/gpu`, partitions `amd.com/<compute>_<memory>`).
    Amd,
    /// Intel data-centre GPUs (`gpu.intel.com/*`) and Gaudi (`habana.ai/gaudi`).
    Intel,
    /// Huawei Ascend NPUs (`huawei.com/Ascend*`).
    Huawei,
    /// AWS Trainium / Inferentia (`aws.amazon.com/neuron`, `neuroncore`).
    Aws,
    /// Google Cloud TPU (`google.com/tpu`).
    Google,
}

impl Vendor {
    pub const ALL: [Vendor; 6] = [
        Vendor::Nvidia,
        Vendor::Amd,
        Vendor::Intel,
        Vendor::Huawei,
        Vendor::Aws,
        Vendor::Google,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia",
            Vendor::Amd => "amd",
            Vendor::Intel => "intel",
            Vendor::Huawei => "huawei",
            Vendor::Aws => "aws",
            Vendor::Google => "google",
        }
    }
}

impl std::fmt::Display for Vendor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How a workload gets an accelerator. The three operating models have different
/// isolation and are never pooled together.
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
)]
pub enum SharingMode {
    /// Whole devices, exclusively.
    #[default]
    Whole,
    /// A hardware partition with its own memory and compute (NVIDIA MIG, AMD CPX/NPS,
    /// Ascend vNPU, a Neuron core).
    Partition,
    /// Time-slicing or MPS on a whole device: no memory or fault isolation.
    TimeShare,
    /// No accelerator at all: the class covers CPU and memory on accelerator-free nodes.
    CpuOnly,
}

impl SharingMode {
    pub fn as_str(self) -> &'static str {
        match self {
            SharingMode::Whole => "Whole",
            SharingMode::Partition => "Partition",
            SharingMode::TimeShare => "TimeShare",
            SharingMode::CpuOnly => "CpuOnly",
        }
    }
}

impl std::fmt::Display for SharingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A level of the physical topology a class's Workloads may be required to fit
/// in, widest first. kaccel reads each from the node labels vendors publish (see
/// `inventory::topology`); the class names the level, not the label, so one
/// class covers GKE, EKS and on-premises fleets alike.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub enum TopologyLevel {
    /// `topology.kubernetes.io/region`.
    Region,
    /// `topology.kubernetes.io/zone`.
    Zone,
    /// `topology.kaccel.io/datacenter`.
    Datacenter,
    /// A reserved block: GKE `cloud.google.com/gce-topology-block`, EKS
    /// `topology.k8s.aws/network-node-layer-1`.
    Block,
    /// GKE `cloud.google.com/gce-topology-subblock`, EKS `network-node-layer-2`.
    Subblock,
    /// `topology.kaccel.io/rack`, EKS `network-node-layer-3` (the layer closest
    /// to the instance on most types).
    Rack,
    /// NVIDIA's NVLink clique (`nvidia.com/gpu.clique`, GB200 NVL72 racks).
    NvlinkDomain,
    /// GKE `cloud.google.com/gce-topology-host`: the physical machine.
    PhysicalHost,
    /// `kubernetes.io/hostname`: one node.
    Host,
}

impl TopologyLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyLevel::Region => "region",
            TopologyLevel::Zone => "zone",
            TopologyLevel::Datacenter => "datacenter",
            TopologyLevel::Block => "block",
            TopologyLevel::Subblock => "subblock",
            TopologyLevel::Rack => "rack",
            TopologyLevel::NvlinkDomain => "nvlinkDomain",
            TopologyLevel::PhysicalHost => "physicalHost",
            TopologyLevel::Host => "host",
        }
    }
}

impl std::fmt::Display for TopologyLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests;
