//! Dynamic Resource Allocation: `resource.k8s.io/v1` ResourceSlices add per-device
//! records (UUID, PCI address, memory) to the node's groups.
//!
//! Drivers read:
//! - `gpu.nvidia.com` (NVIDIA DRA driver): attributes `uuid`, `productName`,
//!   `architecture`, `driverVersion`, `cudaComputeCapability`, `cudaDriverVersion`,
//!   `pcieBusID`, `type` (`gpu` or `mig`) and, for MIG devices, `profile`; capacity
//!   `memory`.
//! - `gpu.amd.com` (AMD DRA driver): `productName`, `family`, `partitionProfile`,
//!   `pciAddr`, `driverVersion`; capacity `memory`.
//!
//! Attribute names may be written qualified (`gpu.nvidia.com/uuid`) or bare
//! (`uuid`, implicitly in the driver's domain); both are read. Slices of any other
//! driver, and slices not bound to one node (`allNodes`, `nodeSelector`), are ignored.
//!
//! Matching. Each device is attached to the node's group with the same vendor,
//! sharing mode and partition profile whose model equals the device's
//! `productName` once spelling is normalised (GFD writes `NVIDIA-H100-80GB-HBM3`,
//! the DRA driver `NVIDIA H100 80GB HBM3`); failing a model match, to the only such
//! group if there is exactly one. Time-shared groups never receive DRA devices.
//! Records attached to an extended-resource group do not change its counts (the
//! device plugin's numbers stay authoritative).
//!
//! DRA-only groups. A device that matches no group (a node whose GPUs are only
//! published through DRA) forms a group of its own, counted from the slice. Its
//! `resource_name` is the DeviceClass a ResourceClaim names to get such a device:
//! the driver name (`gpu.nvidia.com`, `gpu.amd.com`; NVIDIA MIG devices
//! `mig.nvidia.com`). It has no pin labels: the scheduler places DRA claims by
//! slice, not by node labels.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSlice};

use super::{
    DeviceGroup, DeviceRecord, DeviceVariant, Inventory, SharingMode, Vendor, parse_memory_bytes,
};

pub(crate) const NVIDIA_DRIVER: &str = "gpu.nvidia.com";
pub(crate) const NVIDIA_MIG_CLASS: &str = "mig.nvidia.com";
pub(crate) const AMD_DRIVER: &str = "gpu.amd.com";

pub(crate) fn merge_slice(inventory: &mut Inventory, slice: &ResourceSlice) {
    let driver = slice.spec.driver.as_str();
    let vendor = match driver {
        NVIDIA_DRIVER => Vendor::Nvidia,
        AMD_DRIVER => Vendor::Amd,
        _ => return,
    };
    let Some(node_name) = slice.spec.node_name.as_deref() else {
        return;
    };
    let Some(node) = inventory.nodes.get_mut(node_name) else {
        return;
    };
    let slice_name = slice.metadata.name.as_deref().unwrap_or("<unnamed>");
    for device in slice.spec.devices.iter().flatten() {
        let dev = DraDevice::read(driver, device, &mut node.warnings, slice_name);
        let (sharing, profile, class) = dev.variant_shape(vendor, driver);
        let target = find_group(
            &node.groups,
            vendor,
            sharing,
            profile.as_deref(),
            dev.product.as_deref(),
        );
        let index = match target {
            Some(i) => i,
            None => {
                let model = dev
                    .product
                    .as_deref()
                    .map(normalise_product)
                    .unwrap_or_else(|| format!("{class}-unlabelled"));
                let key = DeviceVariant {
                    vendor,
                    model,
                    sharing,
                    partition_profile: profile.clone(),
                    resource_name: class.to_string(),
                };
                match node.groups.iter().position(|g| g.variant == key) {
                    Some(i) => i,
                    None => {
                        let mut g = DeviceGroup::new(key, 0, 0);
                        g.memory_mib = dev.record.memory_mib;
                        node.groups.push(g);
                        node.groups.len() - 1
                    }
                }
            }
        };
        let group = &mut node.groups[index];
        let dra_only = is_dra_only(group);
        if group.devices.iter().any(|d| d.name == dev.record.name) {
            continue;
        }
        if dra_only {
            group.capacity = group.capacity.saturating_add(1);
            if !dev.tainted {
                group.allocatable = group.allocatable.saturating_add(1);
            }
        }
        if group.architecture.is_none() {
            group.architecture = dev.architecture.clone();
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
    }
    for g in &mut node.groups {
        g.devices.sort_by(|a, b| a.name.cmp(&b.name));
    }
    node.groups.sort_by(|a, b| a.variant.cmp(&b.variant));
}

/// What one DRA device says about itself.
struct DraDevice {
    record: DeviceRecord,
    product: Option<String>,
    architecture: Option<String>,
    driver_version: Option<String>,
    compute_capability: Option<String>,
    cuda_version: Option<String>,
    /// NVIDIA `type` attribute: `gpu` or `mig`.
    kind: Option<String>,
    /// NVIDIA MIG `profile` or AMD `partitionProfile`.
    profile: Option<String>,
    /// The driver marked the device with a NoSchedule/NoExecute device taint.
    tainted: bool,
}

impl DraDevice {
    fn read(driver: &str, device: &Device, warnings: &mut Vec<String>, slice: &str) -> Self {
        let attrs: BTreeMap<String, String> = device
            .attributes
            .iter()
            .flatten()
            .filter_map(|(k, v)| attribute_string(v).map(|s| (k.clone(), s)))
            .collect();
        let qualified = format!("{driver}/");
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
        DraDevice {
            record: DeviceRecord {
                name: device.name.clone(),
                uuid: get("uuid"),
                pci_address: get("pciAddr")
                    .or_else(|| get("pcieBusID"))
                    .or_else(|| get("pciBusID")),
                memory_mib,
                raw_attributes: attrs.clone(),
                tainted,
            },
            product: get("productName"),
            architecture: get("architecture")
                .or_else(|| get("family"))
                .map(|a| a.to_ascii_lowercase()),
            driver_version: get("driverVersion"),
            compute_capability: get("cudaComputeCapability").map(major_minor),
            cuda_version: get("cudaDriverVersion").map(major_minor),
            kind: get("type"),
            profile: get("profile").or_else(|| get("partitionProfile")),
            tainted,
        }
    }

    /// Sharing mode, partition profile and DeviceClass name for this device.
    fn variant_shape(
        &self,
        vendor: Vendor,
        driver: &str,
    ) -> (SharingMode, Option<String>, &'static str) {
        match vendor {
            Vendor::Nvidia => {
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
            _ => {
                let class = if driver == AMD_DRIVER {
                    AMD_DRIVER
                } else {
                    NVIDIA_DRIVER
                };
                match self.profile.as_deref().map(|p| p.to_ascii_lowercase()) {
                    Some(p) if super::amd::split_mode(&p).is_some_and(|(c, _)| c != "spx") => {
                        (SharingMode::Partition, Some(p), class)
                    }
                    _ => (SharingMode::Whole, None, class),
                }
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

/// Product names as the labels spell them: spaces become dashes
/// (`NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`).
fn normalise_product(p: &str) -> String {
    p.split_whitespace().collect::<Vec<_>>().join("-")
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
    vendor: Vendor,
    sharing: SharingMode,
    profile: Option<&str>,
    product: Option<&str>,
) -> Option<usize> {
    let candidates: Vec<usize> = groups
        .iter()
        .enumerate()
        .filter(|(_, g)| {
            g.variant.vendor == vendor
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
    // One candidate and no contradicting product name: it is that group.
    match candidates.as_slice() {
        [only] if product.is_none() || groups[*only].variant.model.ends_with("-unlabelled") => {
            Some(*only)
        }
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
    matches!(resource_name, NVIDIA_DRIVER | NVIDIA_MIG_CLASS | AMD_DRIVER)
}
