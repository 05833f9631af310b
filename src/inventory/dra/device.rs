//! What one DRA device says about itself: its attributes, read per driver.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute};

use super::driver::{
    AMD_DRIVER, Driver, NVIDIA_DRIVER, NVIDIA_MIG_CLASS, TPU_ACCELERATOR_LABEL,
    requirement_attributes,
};
use crate::inventory::{AttributeKind, DeviceRecord, SharingMode, amd, google};
use crate::k8s::quantity::parse_memory_bytes;

/// The standard PCI bus ID attribute (k8s.io/dynamic-resource-allocation/deviceattribute).
const STD_PCI_BUS_ID: &str = "resource.kubernetes.io/pciBusID";

/// What one DRA device says about itself.
pub(super) struct DraDevice {
    pub(super) record: DeviceRecord,
    /// The model as the driver names it (`productName`, `model`, TPU `accelerator`);
    /// `None` when it names none (Intel's `Unknown` included).
    pub(super) product: Option<String>,
    pub(super) architecture: Option<String>,
    pub(super) compute_capability: Option<String>,
    pub(super) cuda_version: Option<String>,
    /// `type`: NVIDIA `gpu`/`mig`, AMD `amdgpu`/`amdgpu-partition`, Intel `gpu`/`vf`.
    pub(super) kind: Option<String>,
    /// NVIDIA MIG `profile` or AMD `partitionProfile`.
    pub(super) profile: Option<String>,
}

impl DraDevice {
    pub(super) fn read(
        driver: Driver,
        device: &Device,
        node_labels: &crate::inventory::labels::Labels,
        warnings: &mut Vec<String>,
        slice: &str,
        pool: &str,
    ) -> Self {
        let attrs: BTreeMap<String, String> = device
            .attributes
            .iter()
            .flatten()
            .filter_map(|(k, v)| attribute_string(v).map(|s| (k.clone(), s)))
            .collect();
        let qualified = format!("{}/", driver.name());
        // Every attribute of the driver's domain by its bare name, the bare
        // spelling winning over the qualified one: one lookup per attribute read,
        // no key built per miss.
        let mut by_name: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, v) in &attrs {
            match k.strip_prefix(qualified.as_str()) {
                Some(bare) => {
                    by_name.entry(bare).or_insert(v.as_str());
                }
                None => {
                    by_name.insert(k.as_str(), v.as_str());
                }
            }
        }
        let get = |name: &str| -> Option<String> {
            by_name
                .get(name)
                .filter(|v| !v.is_empty())
                .map(|v| v.to_string())
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
                [google::ACCELERATOR, TPU_ACCELERATOR_LABEL]
                    .iter()
                    .find_map(|k| {
                        node_labels
                            .get(k)
                            .filter(|v| !v.is_empty())
                            .map(str::to_string)
                    })
            }),
        };
        let read = requirement_attributes(driver.name());
        let architecture = read
            .architecture
            .and_then(get)
            .and_then(|a| read.architecture_of(&a));
        DraDevice {
            record: DeviceRecord {
                name: device.name.clone(),
                driver: driver.name().into(),
                pool: pool.to_string(),
                // The TPU driver's uuid is one value per node, not per chip.
                uuid: (driver != Driver::Tpu).then(|| get("uuid")).flatten(),
                serial: get("serial"),
                pci_address: get("pciAddr")
                    .or_else(|| get("pcieBusID"))
                    .or_else(|| get("pciBusID"))
                    .or_else(|| attrs.get(STD_PCI_BUS_ID).cloned())
                    .or_else(|| get("pciAddress")),
                memory_mib,
                driver_version: read.driver_version.and_then(get),
                selector_values: super::driver::selector_attributes(driver.name())
                    .iter()
                    .map(|id| get(id))
                    .collect(),
                attribute_kinds: device
                    .attributes
                    .iter()
                    .flatten()
                    .filter(|(k, _)| !k.contains('/') || k.starts_with(&qualified))
                    .filter_map(|(k, v)| {
                        let kind = if v.string.is_some() {
                            AttributeKind::String
                        } else if v.version.is_some() {
                            AttributeKind::Version
                        } else if v.int.is_some() {
                            AttributeKind::Int
                        } else {
                            v.bool.map(|_| AttributeKind::Bool)?
                        };
                        Some((k.strip_prefix(&qualified).unwrap_or(k).to_string(), kind))
                    })
                    .collect::<BTreeMap<_, _>>()
                    .into(),
                raw_attributes: attrs.clone(),
                tainted: tainted || unhealthy,
            },
            product,
            architecture,
            compute_capability: read.compute_capability.and_then(get).map(major_minor),
            cuda_version: read.cuda_version.and_then(get).map(major_minor),
            kind: get("type"),
            profile: get("profile").or_else(|| get("partitionProfile")),
        }
    }

    /// Sharing mode, partition profile and DeviceClass name for this device.
    pub(super) fn variant_shape(
        &self,
        driver: Driver,
    ) -> (SharingMode, Option<String>, &'static str) {
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
                Some(p) if amd::split_mode(&p).is_some_and(|(c, _)| c != "spx") => {
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
