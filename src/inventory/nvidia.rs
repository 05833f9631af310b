//! NVIDIA: the k8s-device-plugin's extended resources plus GPU feature discovery
//! (GFD) labels.
//!
//! What the node carries, by operating model (GFD label catalogue in
//! NVIDIA/k8s-device-plugin `docs/gpu-feature-discovery/README.md`):
//!
//! | model            | resource                    | `nvidia.com/gpu.product`         |
//! |------------------|-----------------------------|----------------------------------|
//! | whole GPUs       | `nvidia.com/gpu`            | `NVIDIA-H100-80GB-HBM3`          |
//! | time-slicing/MPS | `nvidia.com/gpu` (replicas) | `NVIDIA-L4-SHARED`               |
//! | ... renamed      | `nvidia.com/gpu.shared`     | product, `-SHARED` if present    |
//! | MIG `single`     | `nvidia.com/gpu`            | `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb` |
//! | MIG `mixed`      | `nvidia.com/mig-<profile>`  | `NVIDIA-A100-SXM4-80GB` (base)   |
//!
//! Time-slicing and MPS capacity is `GPUs x replicas` as the plugin advertises it;
//! `nvidia.com/gpu.count` keeps the physical count and `nvidia.com/gpu.replicas` the
//! factor. In MIG `mixed` mode a node may also expose whole GPUs (MIG disabled on
//! some cards) under `nvidia.com/gpu`.
//!
//! Pin labels. The product label alone tells whole, time-shared and MIG-single
//! nodes apart, because GFD rewrites its value (`-SHARED`, `-MIG-<profile>`), so
//! those variants pin `{nvidia.com/gpu.product: <value as on the node>}`. MIG
//! mixed partitions keep the base product value, the same value a whole-GPU node
//! of that model carries; their resource name (`nvidia.com/mig-1g.10gb`) already
//! restricts where pods can land, and they additionally pin
//! `nvidia.com/mig.strategy: mixed` (set by GFD on every mixed node) so the flavor
//! never matches a node that is not MIG-partitioned. Whole GPUs on a mixed node are
//! the same variant as whole GPUs elsewhere and pin only the product.

use std::collections::BTreeMap;

use super::{DeviceGroup, DeviceVariant, NodeView, SharingMode, Vendor};

pub(crate) const RESOURCE: &str = "nvidia.com/gpu";
pub(crate) const SHARED_RESOURCE: &str = "nvidia.com/gpu.shared";
pub(crate) const MIG_PREFIX: &str = "nvidia.com/mig-";
pub(crate) const PRODUCT: &str = "nvidia.com/gpu.product";
pub(crate) const MEMORY: &str = "nvidia.com/gpu.memory";
pub(crate) const FAMILY: &str = "nvidia.com/gpu.family";
pub(crate) const COMPUTE_MAJOR: &str = "nvidia.com/gpu.compute.major";
pub(crate) const COMPUTE_MINOR: &str = "nvidia.com/gpu.compute.minor";
pub(crate) const MIG_STRATEGY: &str = "nvidia.com/mig.strategy";
pub(crate) const SHARING_STRATEGY: &str = "nvidia.com/gpu.sharing-strategy";
pub(crate) const TAINT_KEY: &str = "nvidia.com/gpu";
const SHARED_SUFFIX: &str = "-SHARED";
const MIG_INFIX: &str = "-MIG-";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let raw_labels = view.raw_labels(&["nvidia.com/"]);
    let taints = view.taint_keys(&[TAINT_KEY]);
    let product = view.label(PRODUCT);
    let common = Common::read(view, warnings);
    // What every group of this node shares: GFD's node-wide facts, taints, raw labels.
    let mut push = |variant: DeviceVariant,
                    (cap, alloc): (u32, u32),
                    memory_mib: Option<u64>,
                    pins: BTreeMap<String, String>| {
        let mut g = DeviceGroup::new(variant, cap, alloc);
        g.memory_mib = memory_mib;
        common.fill(&mut g);
        g.pin_labels = pins;
        g.vendor_taint_keys = taints.clone();
        g.raw_labels = raw_labels.clone();
        groups.push(g);
    };
    // Shared and MIG-mixed resources: the base model of the product label.
    let product_model = |resource: &str, warnings: &mut Vec<String>| match product {
        Some(p) => (
            base_model(p).to_string(),
            BTreeMap::from([(PRODUCT.to_string(), p.to_string())]),
        ),
        None => view.fallback_model(resource, PRODUCT, warnings),
    };

    // nvidia.com/gpu: whole, time-shared, or MIG single, told apart by the product value.
    if let Some((cap, alloc)) = view.count_checked(RESOURCE, warnings) {
        let sharing_strategy = view.label(SHARING_STRATEGY).unwrap_or("none");
        let (model, sharing, profile, pins) = match product {
            Some(p) => {
                let pins = BTreeMap::from([(PRODUCT.to_string(), p.to_string())]);
                if let Some((base, profile)) = split_mig(p) {
                    (
                        base.to_string(),
                        SharingMode::Partition,
                        Some(profile.to_string()),
                        pins,
                    )
                } else if let Some(base) = p.strip_suffix(SHARED_SUFFIX) {
                    (base.to_string(), SharingMode::TimeShare, None, pins)
                } else if matches!(sharing_strategy, "time-slicing" | "mps") {
                    // Sharing configured but the product not suffixed (unusual plugin
                    // configuration): the strategy label is what tells the nodes apart.
                    let mut pins = pins;
                    pins.insert(SHARING_STRATEGY.to_string(), sharing_strategy.to_string());
                    (p.to_string(), SharingMode::TimeShare, None, pins)
                } else {
                    (p.to_string(), SharingMode::Whole, None, pins)
                }
            }
            None => {
                let (model, pins) = view.fallback_model(RESOURCE, PRODUCT, warnings);
                (model, SharingMode::Whole, None, pins)
            }
        };
        push(
            DeviceVariant {
                vendor: Vendor::Nvidia,
                model,
                sharing,
                partition_profile: profile,
                resource_name: RESOURCE.to_string(),
            },
            (cap, alloc),
            common.memory_mib,
            pins,
        );
    }

    // Time-slicing with renameByDefault: a separate resource.
    if let Some(counts) = view.count_checked(SHARED_RESOURCE, warnings) {
        let (model, pins) = product_model(SHARED_RESOURCE, warnings);
        push(
            DeviceVariant {
                vendor: Vendor::Nvidia,
                model,
                sharing: SharingMode::TimeShare,
                partition_profile: None,
                resource_name: SHARED_RESOURCE.to_string(),
            },
            counts,
            common.memory_mib,
            pins,
        );
    }

    // MIG mixed: one resource per profile.
    for (resource, cap, alloc) in view.resources_with_prefix_checked(MIG_PREFIX, warnings) {
        let profile = &resource[MIG_PREFIX.len()..];
        if profile.is_empty() {
            continue;
        }
        let (model, mut pins) = product_model(resource, warnings);
        if let Some(strategy) = view.label(MIG_STRATEGY) {
            pins.insert(MIG_STRATEGY.to_string(), strategy.to_string());
        }
        let memory_label = format!("nvidia.com/mig-{profile}.memory");
        let memory_mib = view
            .label_u64(&memory_label, warnings)
            .or_else(|| profile_memory_mib(profile));
        push(
            DeviceVariant {
                vendor: Vendor::Nvidia,
                model,
                sharing: SharingMode::Partition,
                partition_profile: Some(profile.to_string()),
                resource_name: resource.to_string(),
            },
            (cap, alloc),
            memory_mib,
            pins,
        );
    }

    groups
}

/// GFD labels that describe every device on the node.
struct Common {
    memory_mib: Option<u64>,
    architecture: Option<String>,
    compute_capability: Option<String>,
    driver_version: Option<String>,
    cuda_version: Option<String>,
}

impl Common {
    fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Self {
        let memory_mib = view.label_u64(MEMORY, warnings);
        let architecture = view.label(FAMILY).map(str::to_ascii_lowercase);
        let compute_capability =
            version_from_parts(view, COMPUTE_MAJOR, COMPUTE_MINOR, None, warnings);
        let driver_version = view
            .label("nvidia.com/cuda.driver-version.full")
            .map(str::to_string)
            .or_else(|| {
                version_from_parts(
                    view,
                    "nvidia.com/cuda.driver-version.major",
                    "nvidia.com/cuda.driver-version.minor",
                    Some("nvidia.com/cuda.driver-version.revision"),
                    warnings,
                )
            })
            .or_else(|| {
                // Deprecated GFD names, still written alongside the new ones.
                version_from_parts(
                    view,
                    "nvidia.com/cuda.driver.major",
                    "nvidia.com/cuda.driver.minor",
                    Some("nvidia.com/cuda.driver.rev"),
                    warnings,
                )
            });
        let cuda_version = view
            .label("nvidia.com/cuda.runtime-version.full")
            .map(str::to_string)
            .or_else(|| {
                version_from_parts(
                    view,
                    "nvidia.com/cuda.runtime-version.major",
                    "nvidia.com/cuda.runtime-version.minor",
                    None,
                    warnings,
                )
            })
            .or_else(|| {
                version_from_parts(
                    view,
                    "nvidia.com/cuda.runtime.major",
                    "nvidia.com/cuda.runtime.minor",
                    None,
                    warnings,
                )
            });
        Common {
            memory_mib,
            architecture,
            compute_capability,
            driver_version,
            cuda_version,
        }
    }

    fn fill(&self, g: &mut DeviceGroup) {
        g.architecture = self.architecture.clone();
        g.compute_capability = self.compute_capability.clone();
        g.driver_version = self.driver_version.clone();
        g.cuda_version = self.cuda_version.clone();
    }
}

/// `major.minor[.rev]` from separate numeric labels; `None` (with a warning) if a
/// present part is not a number, `None` silently if major or minor is absent.
fn version_from_parts(
    view: &NodeView<'_>,
    major: &str,
    minor: &str,
    rev: Option<&str>,
    warnings: &mut Vec<String>,
) -> Option<String> {
    let ma = view.label(major)?;
    let mi = view.label(minor)?;
    let numeric = |key: &str, v: &str, warnings: &mut Vec<String>| {
        let ok = !v.is_empty() && v.len() <= 10 && v.bytes().all(|b| b.is_ascii_digit());
        if !ok {
            warnings.push(format!("label {key}={v:?}: not a version number; ignored"));
        }
        ok
    };
    if !numeric(major, ma, warnings) | !numeric(minor, mi, warnings) {
        return None;
    }
    match rev.and_then(|r| view.label(r).map(|v| (r, v))) {
        Some((key, r)) if numeric(key, r, warnings) => Some(format!("{ma}.{mi}.{r}")),
        Some(_) => None,
        None => Some(format!("{ma}.{mi}")),
    }
}

/// `NVIDIA-A100-SXM4-40GB-MIG-1g.5gb` -> (`NVIDIA-A100-SXM4-40GB`, `1g.5gb`).
fn split_mig(product: &str) -> Option<(&str, &str)> {
    let at = product.rfind(MIG_INFIX)?;
    let base = &product[..at];
    let profile = &product[at + MIG_INFIX.len()..];
    (!base.is_empty() && !profile.is_empty()).then_some((base, profile))
}

/// The product without GFD's `-SHARED` / `-MIG-<profile>` decorations.
fn base_model(product: &str) -> &str {
    let p = product.strip_suffix(SHARED_SUFFIX).unwrap_or(product);
    split_mig(p).map_or(p, |(base, _)| base)
}

/// Memory from a MIG profile name when GFD did not label it: `3g.40gb` -> 40 GiB.
/// (`1g.10gb+me` and `1g.12gb` style names are handled; GFD's own
/// `nvidia.com/mig-<profile>.memory` label takes precedence when present.)
fn profile_memory_mib(profile: &str) -> Option<u64> {
    let mem = profile.split('.').nth(1)?;
    let mem = mem.split('+').next()?;
    let gb = mem.strip_suffix("gb")?;
    gb.parse::<u64>().ok()?.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn product_decorations() {
        assert_eq!(
            split_mig("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"),
            Some(("NVIDIA-A100-SXM4-40GB", "1g.5gb"))
        );
        assert_eq!(split_mig("NVIDIA-H100-80GB-HBM3"), None);
        assert_eq!(split_mig("-MIG-"), None);
        assert_eq!(base_model("NVIDIA-L4-SHARED"), "NVIDIA-L4");
        assert_eq!(base_model("A100-SXM4-40GB-MIG-1g.5gb"), "A100-SXM4-40GB");
        assert_eq!(base_model("NVIDIA-H100-80GB-HBM3"), "NVIDIA-H100-80GB-HBM3");
        assert_eq!(profile_memory_mib("3g.40gb"), Some(40 * 1024));
        assert_eq!(profile_memory_mib("1g.10gb+me"), Some(10 * 1024));
        assert_eq!(profile_memory_mib("weird"), None);
    }
}
