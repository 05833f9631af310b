//! The DRA drivers kaccel reads: names, vendors, resources, labels, taints and DeviceClasses.

use crate::inventory::{DeviceGroup, SharingMode, Vendor, google, intel};

pub(crate) const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
pub(crate) const NVIDIA_MIG_CLASS: &str = "mig.nvidia.com";
pub(crate) const AMD_DRIVER: &str = "gpu.amd.com";
pub(crate) const GAUDI_DRIVER: &str = "gaudi.intel.com";
pub(crate) const INTEL_GPU_DRIVER: &str = "gpu.intel.com";
pub(crate) const TPU_DRIVER: &str = "tpu.google.com";
/// Huawei's Ascend DRA driver (mind-cluster
/// `component/ascend-dynamic-resource-allocation/pkg/consts/consts.go`), not read yet.
pub(crate) const ASCEND_DRIVER: &str = "npu.huawei.com";

/// The TPU driver's own node labels (dra-driver-google-tpu `util.go`), beside GKE's.
pub(super) const TPU_ACCELERATOR_LABEL: &str = "tpu.google.com/accelerator";
pub(super) const TPU_TOPOLOGY_LABEL: &str = "tpu.google.com/topology";

/// A DRA driver kaccel reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Driver {
    Nvidia,
    Amd,
    Gaudi,
    IntelGpu,
    Tpu,
}

impl Driver {
    pub(super) fn of(name: &str) -> Option<Self> {
        match name {
            NVIDIA_DRIVER => Some(Driver::Nvidia),
            AMD_DRIVER => Some(Driver::Amd),
            GAUDI_DRIVER => Some(Driver::Gaudi),
            INTEL_GPU_DRIVER => Some(Driver::IntelGpu),
            TPU_DRIVER => Some(Driver::Tpu),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Driver::Nvidia => NVIDIA_DRIVER,
            Driver::Amd => AMD_DRIVER,
            Driver::Gaudi => GAUDI_DRIVER,
            Driver::IntelGpu => INTEL_GPU_DRIVER,
            Driver::Tpu => TPU_DRIVER,
        }
    }

    pub(super) fn vendor(self) -> Vendor {
        match self {
            Driver::Nvidia => Vendor::Nvidia,
            Driver::Amd => Vendor::Amd,
            Driver::Gaudi | Driver::IntelGpu => Vendor::Intel,
            Driver::Tpu => Vendor::Google,
        }
    }

    /// Whether a group's resource (a device-plugin resource or a DeviceClass) names
    /// the devices this driver publishes: Gaudi devices never join an Intel GPU group.
    pub(super) fn reads_resource(self, resource: &str) -> bool {
        match self {
            Driver::Nvidia => {
                resource.starts_with("nvidia.com/")
                    || resource == NVIDIA_DRIVER
                    || resource == NVIDIA_MIG_CLASS
            }
            Driver::Amd => resource.starts_with("amd.com/") || resource == AMD_DRIVER,
            Driver::Gaudi => resource == intel::GAUDI_RESOURCE || resource == GAUDI_DRIVER,
            Driver::IntelGpu => {
                intel::GPU_RESOURCES.contains(&resource) || resource == INTEL_GPU_DRIVER
            }
            Driver::Tpu => resource == google::RESOURCE || resource == TPU_DRIVER,
        }
    }

    /// Node labels naming the model the way the vendor's labeller writes it.
    pub(super) fn model_labels(self) -> &'static [&'static str] {
        match self {
            Driver::Nvidia => &["nvidia.com/gpu.product"],
            Driver::Amd => &["amd.com/gpu.product-name"],
            Driver::Gaudi => &[intel::HABANA_DEVICE_TYPE],
            Driver::IntelGpu => &[intel::GPU_PRODUCT],
            Driver::Tpu => &[google::ACCELERATOR, TPU_ACCELERATOR_LABEL],
        }
    }

    /// Taint keys the vendor's installation puts on its nodes.
    pub(super) fn taint_keys(self) -> &'static [&'static str] {
        match self {
            Driver::Nvidia => &["nvidia.com/gpu"],
            Driver::Amd => &["amd.com/gpu"],
            Driver::Gaudi => &[intel::GAUDI_RESOURCE],
            Driver::IntelGpu => &intel::GPU_RESOURCES,
            Driver::Tpu => &[google::TAINT_KEY],
        }
    }

    /// Why a device of this driver whose model is unknown is not offered.
    pub(super) fn no_model_reason(self) -> &'static str {
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

/// The attributes that make a device's variant, by driver (what
/// [`super::device::DraDevice::variant_shape`] and the product read): a DeviceClass
/// pins them to select one variant.
pub(crate) fn selector_attributes(driver: &str) -> &'static [&'static str] {
    match Driver::of(driver) {
        Some(Driver::Nvidia) => &["type", "productName", "profile"],
        Some(Driver::Amd) => &["type", "productName", "partitionProfile"],
        Some(Driver::Gaudi) => &["model"],
        Some(Driver::IntelGpu) => &["type", "model"],
        Some(Driver::Tpu) => &["accelerator"],
        None => &[],
    }
}

/// Where a class's hard requirements are read on a device of a driver: the one
/// table both the inventory's reader (`super::device`) and the DeviceClass
/// selectors (`plan::device_classes`) follow, so the two cannot drift apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RequirementAttributes {
    /// Memory comes from kaccel's table for the model, not from the device.
    pub memory_from_model: bool,
    /// The attribute read as the architecture; `None`: from the model.
    pub architecture: Option<&'static str>,
    /// Intel names a family (`Data Center GPU Max` -> `xe-hpc`; `Unknown`: none).
    pub intel_family: bool,
    /// Versions, read wherever a driver publishes them (compute capability and
    /// CUDA as major.minor).
    pub compute_capability: Option<&'static str>,
    pub cuda_version: Option<&'static str>,
    pub driver_version: Option<&'static str>,
}

impl RequirementAttributes {
    /// The architecture a published value names, lower-cased.
    pub fn architecture_of(&self, value: &str) -> Option<String> {
        let named = if !self.intel_family {
            value
        } else if value == "Unknown" {
            return None;
        } else if value.contains("Max") {
            "xe-hpc"
        } else if value.contains("Flex") {
            "xe-hpg"
        } else {
            value
        };
        Some(named.to_ascii_lowercase())
    }
}

pub(crate) fn requirement_attributes(driver: &str) -> RequirementAttributes {
    let versions = RequirementAttributes {
        compute_capability: Some("cudaComputeCapability"),
        cuda_version: Some("cudaDriverVersion"),
        driver_version: Some("driverVersion"),
        ..Default::default()
    };
    match Driver::of(driver) {
        Some(Driver::Nvidia) => RequirementAttributes {
            architecture: Some("architecture"),
            ..versions
        },
        Some(Driver::Amd) => RequirementAttributes {
            architecture: Some("family"),
            ..versions
        },
        Some(Driver::IntelGpu) => RequirementAttributes {
            architecture: Some("family"),
            intel_family: true,
            ..versions
        },
        Some(Driver::Gaudi | Driver::Tpu) => RequirementAttributes {
            memory_from_model: true,
            ..versions
        },
        None => RequirementAttributes::default(),
    }
}
