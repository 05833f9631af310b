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
//! | MIG + sharing    | the above, replicated       | `...-MIG-1g.5gb-SHARED`          |
//!
//! Checked against the GFD label code in NVIDIA/k8s-device-plugin v0.20.0
//! (`internal/lm/resource.go`, `internal/lm/mig-strategy.go`, 2026-08-19): every
//! resource is labelled `<resource>.{product,count,replicas,sharing-strategy,memory}`
//! under its original name (`nvidia.com/gpu.*`, `nvidia.com/mig-1g.10gb.*`), also
//! when the plugin renames its replicas (`nvidia.com/gpu.shared`,
//! `nvidia.com/mig-1g.10gb.shared`); `replicas` is 1 on exclusive whole GPUs, N on
//! replicated ones and 0 on cards with MIG enabled; `-SHARED` is appended to the
//! product when replicas > 1 and the resource is not renamed.
//!
//! Time-slicing and MPS capacity is `GPUs x replicas` as the plugin advertises it.
//! Replicas of a MIG slice are [`SharingMode::TimeShare`] with the MIG profile kept as
//! `partition_profile`: they are never offered as hardware partitions. In MIG `mixed`
//! mode a node may also expose whole GPUs (MIG disabled on some cards) under
//! `nvidia.com/gpu`.
//!
//! Pin labels: the product label of the resource as on the node
//! (`nvidia.com/gpu.product`, or `nvidia.com/mig-<profile>.product` for MIG mixed),
//! plus, where GFD leaves the product undecorated, `<resource>.replicas` on exclusive
//! devices (so a whole-GPU flavor never selects a time-sliced node, nor a MIG-mixed
//! node whose cards are all MIG-enabled) and `<resource>.sharing-strategy` on
//! replicated ones. Older GFD without per-profile MIG labels: MIG mixed pins the base
//! product plus `nvidia.com/mig.strategy: mixed`.

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
pub(crate) const TAINT_KEY: &str = "nvidia.com/gpu";
const SHARED_SUFFIX: &str = "-SHARED";
/// What the device plugin appends to a replicated resource under `renameByDefault`.
const RENAMED_SUFFIX: &str = ".shared";
const MIG_INFIX: &str = "-MIG-";

pub(crate) fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Vec<DeviceGroup> {
    let mut groups = Vec::new();
    let raw_labels = view.raw_labels(&["nvidia.com/"]);
    let taints = view.taint_keys(&[TAINT_KEY]);
    let product = product_label(view, PRODUCT, warnings);
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

    // nvidia.com/gpu: whole, time-shared, or MIG single, told apart by the product
    // value and GFD's per-resource replicas / sharing-strategy labels.
    if let Some((cap, alloc)) = view.count_checked(RESOURCE, warnings) {
        let read = match product {
            Some(p) => classify(view, RESOURCE, p, false, warnings),
            None => {
                let (model, pins) = view.fallback_model(RESOURCE, PRODUCT, warnings);
                Some((model, SharingMode::Whole, None, pins))
            }
        };
        if let Some((model, sharing, profile, pins)) = read {
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
    }

    // Time-slicing / MPS with renameByDefault: a separate resource whose labels stay
    // under `nvidia.com/gpu.*` (GFD labels the original resource name) without the
    // `-SHARED` suffix. Replicas of a MIG-single slice keep the MIG profile.
    if let Some(counts) = view.count_checked(SHARED_RESOURCE, warnings) {
        let (model, profile, pins) = match product {
            Some(p) => {
                let unshared = p.strip_suffix(SHARED_SUFFIX).unwrap_or(p);
                let (base, profile) = match split_mig(unshared) {
                    Some((base, profile)) => (base, Some(profile.to_string())),
                    None => (unshared, None),
                };
                let mut pins = BTreeMap::from([(PRODUCT.to_string(), p.to_string())]);
                sharing_pins(view, RESOURCE, true, &mut pins);
                (base.to_string(), profile, pins)
            }
            None => {
                let (model, pins) = view.fallback_model(SHARED_RESOURCE, PRODUCT, warnings);
                (model, None, pins)
            }
        };
        push(
            DeviceVariant {
                vendor: Vendor::Nvidia,
                model,
                sharing: SharingMode::TimeShare,
                partition_profile: profile,
                resource_name: SHARED_RESOURCE.to_string(),
            },
            counts,
            common.memory_mib,
            pins,
        );
    }

    // MIG mixed: one resource per profile, `nvidia.com/mig-<profile>`, or
    // `nvidia.com/mig-<profile>.shared` when its replicas are renamed.
    for (resource, cap, alloc) in view.resources_with_prefix_checked(MIG_PREFIX, warnings) {
        let rest = &resource[MIG_PREFIX.len()..];
        let (profile, renamed_shared) = match rest.strip_suffix(RENAMED_SUFFIX) {
            Some(profile) => (profile, true),
            None => (rest, false),
        };
        if profile.is_empty() {
            continue;
        }
        // GFD labels each MIG resource under its own (original) name.
        let own = format!("{MIG_PREFIX}{profile}");
        let own_product = product_label(view, &format!("{own}.product"), warnings);
        let read = match own_product {
            Some(p) => classify(view, &own, p, renamed_shared, warnings)
                .map(|(_, sharing, _, pins)| (base_model(p).to_string(), sharing, pins)),
            None => {
                // Older GFD: no per-profile product; the node's product and MIG
                // strategy are all there is.
                let (model, mut pins) = product_model(resource, warnings);
                if let Some(strategy) = view.label(MIG_STRATEGY) {
                    pins.insert(MIG_STRATEGY.to_string(), strategy.to_string());
                }
                let shared = renamed_shared || replicated(view, &own);
                sharing_pins(view, &own, shared, &mut pins);
                let sharing = if shared {
                    SharingMode::TimeShare
                } else {
                    SharingMode::Partition
                };
                Some((model, sharing, pins))
            }
        };
        let Some((model, sharing, pins)) = read else {
            continue;
        };
        let memory_mib = view
            .label_u64(&format!("{own}.memory"), warnings)
            .or_else(|| profile_memory_mib(profile));
        push(
            DeviceVariant {
                vendor: Vendor::Nvidia,
                model,
                sharing,
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

type Classified = (
    String,
    SharingMode,
    Option<String>,
    BTreeMap<String, String>,
);

/// What a resource's devices are, from GFD's product label for it (`<resource>.product`
/// or `nvidia.com/gpu.product`) and its replicas / sharing-strategy labels:
/// `-SHARED` or replicas > 1 is time-sharing (of a whole GPU or, with `-MIG-<p>`, of
/// a MIG slice: replicas of a slice are never a hardware partition); `-MIG-<p>`
/// alone is a partition; anything else a whole GPU. `-MIG-INVALID` (GFD's marker for
/// a mig-strategy=single node it cannot describe) is skipped with a warning.
fn classify(
    view: &NodeView<'_>,
    resource: &str,
    product: &str,
    renamed_shared: bool,
    warnings: &mut Vec<String>,
) -> Option<Classified> {
    let product_key = if resource == RESOURCE {
        PRODUCT.to_string()
    } else {
        format!("{resource}.product")
    };
    let (unshared, suffixed) = match product.strip_suffix(SHARED_SUFFIX) {
        Some(base) => (base, true),
        None => (product, false),
    };
    let mig = split_mig(unshared);
    if let Some((_, "INVALID")) = mig {
        warnings.push(format!(
            "{resource}: label {product_key}={product:?} is GFD's marker for an invalid \
             MIG configuration; devices not offered"
        ));
        return None;
    }
    let shared = suffixed || renamed_shared || replicated(view, resource);
    let (model, profile) = match mig {
        Some((base, profile)) => (base.to_string(), Some(profile.to_string())),
        None => (unshared.to_string(), None),
    };
    let sharing = match (shared, &profile) {
        (true, _) => SharingMode::TimeShare,
        (false, Some(_)) => SharingMode::Partition,
        (false, None) => SharingMode::Whole,
    };
    let mut pins = BTreeMap::from([(product_key, product.to_string())]);
    // The product value alone tells these apart except where GFD leaves it
    // undecorated: renamed replicas and whole GPUs share it, and so do whole GPUs and
    // a MIG-mixed node's MIG-enabled cards. Pin the labels that differ.
    if !suffixed {
        sharing_pins(view, resource, shared, &mut pins);
    }
    Some((model, sharing, profile, pins))
}

/// GFD's `<resource>.replicas` > 1 or `<resource>.sharing-strategy` of
/// time-slicing / MPS: the resource is replicated.
fn replicated(view: &NodeView<'_>, resource: &str) -> bool {
    let replicas = view
        .label(&format!("{resource}.replicas"))
        .and_then(|r| r.parse::<u32>().ok())
        .unwrap_or(0);
    let strategy = view.label(&format!("{resource}.sharing-strategy"));
    replicas > 1 || matches!(strategy, Some("time-slicing" | "mps"))
}

/// Pins that keep exclusive and replicated devices of one product apart: time-shared
/// devices pin `<resource>.sharing-strategy` (time-slicing / mps), exclusive ones
/// `<resource>.replicas` (1 on whole GPUs; 0 on MIG-enabled cards).
fn sharing_pins(
    view: &NodeView<'_>,
    resource: &str,
    shared: bool,
    pins: &mut BTreeMap<String, String>,
) {
    let key = if shared {
        format!("{resource}.sharing-strategy")
    } else {
        format!("{resource}.replicas")
    };
    if let Some(v) = view.label(&key) {
        pins.insert(key, v.to_string());
    }
}

/// GFD labels that describe every device on the node.
struct Common {
    memory_mib: Option<u64>,
    architecture: Option<String>,
    compute_capability: Option<String>,
    driver_version: Option<String>,
    cuda_version: Option<String>,
    /// The labels the two versions were read from.
    version_labels: BTreeMap<String, String>,
}

impl Common {
    fn read(view: &NodeView<'_>, warnings: &mut Vec<String>) -> Self {
        let memory_mib = view.label_u64(MEMORY, warnings);
        let architecture = view.label(FAMILY).map(str::to_ascii_lowercase);
        let compute_capability =
            version_from_parts(view, COMPUTE_MAJOR, COMPUTE_MINOR, None, warnings);
        let mut version_labels = BTreeMap::new();
        let driver_version = version_from(
            view,
            "nvidia.com/cuda.driver-version.full",
            &[
                (
                    "nvidia.com/cuda.driver-version.major",
                    "nvidia.com/cuda.driver-version.minor",
                    Some("nvidia.com/cuda.driver-version.revision"),
                ),
                // Deprecated GFD names, still written alongside the new ones.
                (
                    "nvidia.com/cuda.driver.major",
                    "nvidia.com/cuda.driver.minor",
                    Some("nvidia.com/cuda.driver.rev"),
                ),
            ],
            &mut version_labels,
            warnings,
        );
        let cuda_version = version_from(
            view,
            "nvidia.com/cuda.runtime-version.full",
            &[
                (
                    "nvidia.com/cuda.runtime-version.major",
                    "nvidia.com/cuda.runtime-version.minor",
                    None,
                ),
                (
                    "nvidia.com/cuda.runtime.major",
                    "nvidia.com/cuda.runtime.minor",
                    None,
                ),
            ],
            &mut version_labels,
            warnings,
        );
        Common {
            memory_mib,
            architecture,
            compute_capability,
            driver_version,
            cuda_version,
            version_labels,
        }
    }

    fn fill(&self, g: &mut DeviceGroup) {
        g.architecture = self.architecture.clone();
        g.compute_capability = self.compute_capability.clone();
        g.driver_version = self.driver_version.clone();
        g.cuda_version = self.cuda_version.clone();
        g.version_labels = self.version_labels.clone();
    }
}

/// A version from the first spelling GFD writes it in (one `full` label, else
/// major/minor[/revision] labels), recording the labels it was read from.
fn version_from(
    view: &NodeView<'_>,
    full: &str,
    parts: &[(&str, &str, Option<&str>)],
    read_from: &mut BTreeMap<String, String>,
    warnings: &mut Vec<String>,
) -> Option<String> {
    if let Some(v) = view.label(full) {
        read_from.insert(full.to_string(), v.to_string());
        return Some(v.to_string());
    }
    parts.iter().find_map(|&(major, minor, rev)| {
        let version = version_from_parts(view, major, minor, rev, warnings)?;
        for key in [Some(major), Some(minor), rev].into_iter().flatten() {
            if let Some(v) = view.label(key) {
                read_from.insert(key.to_string(), v.to_string());
            }
        }
        Some(version)
    })
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

/// A product label that names a model once GFD's decorations are stripped. A value
/// that is only a decoration (`-SHARED`) names none: it is treated as missing, so the
/// devices are listed as unlabelled rather than as a model with an empty name.
fn product_label<'a>(
    view: &'a NodeView<'_>,
    key: &str,
    warnings: &mut Vec<String>,
) -> Option<&'a str> {
    let product = view.label(key)?;
    if base_model(product).is_empty() {
        warnings.push(format!(
            "label {key}={product:?} names no model once GFD's -SHARED / -MIG-<profile> \
             decorations are removed; treated as missing"
        ));
        return None;
    }
    Some(product)
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
