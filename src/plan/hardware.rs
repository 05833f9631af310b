//! A class's hard requirements against one hardware signature (used by flavor resolution).

use crate::api::{HardwareSelector, SharingMode};
use crate::inventory::{DeviceGroup, DeviceVariant};

use std::collections::BTreeMap;

use crate::k8s::names;

/// Hardware properties that decide whether a device group can join a class. Groups
/// with equal signatures are matched once, not once per node.
#[derive(Clone, PartialEq, Eq)]
pub(super) struct Signature<'a> {
    pub(super) variant: &'a DeviceVariant,
    pub(super) memory_mib: Option<u64>,
    pub(super) architecture: Option<&'a str>,
    pub(super) compute_capability: Option<&'a str>,
    pub(super) driver_version: Option<&'a str>,
    pub(super) cuda_version: Option<&'a str>,
    pub(super) pins: &'a BTreeMap<String, String>,
}

/// Hashes part of a signature: every device group of the fleet is hashed at each
/// plan, and hashing all of it (every pin label's key and value, the resource
/// name, partition profile, architecture, compute capability, driver and CUDA
/// versions) was a seventh of the plan. Equal signatures still hash equal; the few
/// that share the hashed fields but differ in the rest (two driver versions of a
/// model during a rollout) are told apart by `Eq`.
impl std::hash::Hash for Signature<'_> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.variant.vendor.hash(state);
        self.variant.sharing.hash(state);
        self.variant.model.hash(state);
        self.memory_mib.hash(state);
        self.pins.len().hash(state);
    }
}

impl<'a> Signature<'a> {
    pub(super) fn of(g: &'a DeviceGroup) -> Self {
        Signature {
            variant: &g.variant,
            memory_mib: g.memory_mib,
            architecture: g.architecture.as_deref(),
            compute_capability: g.compute_capability.as_deref(),
            driver_version: g.driver_version.as_deref(),
            cuda_version: g.cuda_version.as_deref(),
            pins: &g.pin_labels,
        }
    }
}

/// The reason a device of a model the class does not select is turned down.
pub(super) const MODEL_NOT_SELECTED: &str = "model not selected";

/// Why a device signature fails a class's hard requirements; `None` if it passes.
/// A property the device does not publish fails a requirement on it: abstraction
/// must never hide a compatibility limit.
pub(super) fn hardware_mismatch(
    sel: &HardwareSelector,
    sharing: SharingMode,
    sig: &Signature<'_>,
) -> Option<String> {
    let v = sig.variant;
    if v.sharing != sharing {
        return Some(format!("is {}, class wants {}", v.sharing, sharing));
    }
    if !sel.vendors.is_empty() && !sel.vendors.contains(&v.vendor) {
        return Some(format!("vendor {} not selected", v.vendor));
    }
    if !sel.models.is_empty() && !sel.models.iter().any(|m| names::glob_match(m, &v.model)) {
        return Some(MODEL_NOT_SELECTED.into());
    }
    if let Some(p) = &sel.partition_profile
        && v.partition_profile.as_deref() != Some(p.as_str())
    {
        return Some(format!(
            "partition {} is not {p}",
            v.partition_profile.as_deref().unwrap_or("none")
        ));
    }
    if let Some(min) = sel.min_memory_mib {
        match sig.memory_mib {
            Some(m) if m >= min => {}
            Some(m) => return Some(format!("memory {m} MiB below minMemoryMiB {min}")),
            None => return Some("memory not published, minMemoryMiB cannot be verified".into()),
        }
    }
    if !sel.architectures.is_empty() {
        match sig.architecture {
            Some(a) if sel.architectures.iter().any(|x| x.eq_ignore_ascii_case(a)) => {}
            Some(a) => return Some(format!("architecture {a} not allowed")),
            None => return Some("architecture not published".into()),
        }
    }
    for (what, want, have) in [
        (
            "minComputeCapability",
            &sel.min_compute_capability,
            sig.compute_capability,
        ),
        (
            "minDriverVersion",
            &sel.min_driver_version,
            sig.driver_version,
        ),
        ("minCudaVersion", &sel.min_cuda_version, sig.cuda_version),
    ] {
        if let Some(want) = want {
            match have.and_then(|h| names::version_at_least(h, want)) {
                Some(true) => {}
                Some(false) => {
                    return Some(format!("{} below {what} {want}", have.unwrap_or_default()));
                }
                None => return Some(format!("{what} {want} cannot be verified (not published)")),
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::devices::gpus;

    const H100: &str = "NVIDIA-H100-80GB-HBM3";

    fn mismatch(
        sel: &HardwareSelector,
        sharing: SharingMode,
        group: &DeviceGroup,
    ) -> Option<String> {
        hardware_mismatch(sel, sharing, &Signature::of(group))
    }

    #[test]
    fn a_requirement_on_a_property_the_device_does_not_publish_fails() {
        let mut group = gpus(H100, 8);
        let sel = HardwareSelector {
            min_memory_mib: Some(40_000),
            ..Default::default()
        };
        assert_eq!(mismatch(&sel, SharingMode::Whole, &group), None);
        group.memory_mib = None;
        assert_eq!(
            mismatch(&sel, SharingMode::Whole, &group).as_deref(),
            Some("memory not published, minMemoryMiB cannot be verified")
        );
    }

    #[test]
    fn sharing_model_and_versions_are_hard_requirements() {
        let mut group = gpus(H100, 8);
        group.driver_version = Some("550.54.15".into());
        let any = HardwareSelector::default();
        assert_eq!(
            mismatch(&any, SharingMode::TimeShare, &group).as_deref(),
            Some("is Whole, class wants TimeShare")
        );
        let h100s = HardwareSelector {
            models: vec!["NVIDIA-H100*".into()],
            min_driver_version: Some("535.104".into()),
            ..Default::default()
        };
        assert_eq!(mismatch(&h100s, SharingMode::Whole, &group), None);
        let a100s = HardwareSelector {
            models: vec!["*A100*".into()],
            ..Default::default()
        };
        assert_eq!(
            mismatch(&a100s, SharingMode::Whole, &group).as_deref(),
            Some("model not selected")
        );
        let newer_driver = HardwareSelector {
            min_driver_version: Some("560".into()),
            ..Default::default()
        };
        assert_eq!(
            mismatch(&newer_driver, SharingMode::Whole, &group).as_deref(),
            Some("550.54.15 below minDriverVersion 560")
        );
    }
}
