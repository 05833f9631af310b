//! What the vendor adapters left over: accelerators a node advertises that no adapter
//! could classify. Run after every adapter, so a scheme kaccel does not know is
//! reported instead of silently read as a CPU node or as a known variant.
//!
//! Three ways a node says it has an accelerator kaccel cannot classify:
//! - a group an adapter could only name `<resource>-unlabelled` (no product label,
//!   no `kaccel.io/accelerator.model`): its model is unknown, so it cannot be pinned
//!   to a flavor that selects exactly its nodes;
//! - an extended resource with a non-zero count under an accelerator vendor's domain
//!   that no adapter read (a new resource name, a renamed one);
//! - no accelerator resource at all, but labels a vendor's labeller or NFD writes
//!   only on accelerator nodes (`nvidia.com/gpu.present`, a PCI accelerator class).

use super::{DeviceGroup, NodeView, UnclassifiedDevice};

/// Extended-resource domains (and prefixes) under which a resource is an accelerator.
const ACCELERATOR_RESOURCE_PREFIXES: [&str; 16] = [
    "nvidia.com/",
    "amd.com/",
    "habana.ai/",
    "gpu.intel.com/",
    "huawei.com/",
    "aws.amazon.com/neuron",
    "google.com/tpu",
    "xilinx.com/",
    "qualcomm.com/",
    "cambricon.com/",
    "hygon.com/",
    "iluvatar.com/",
    "metax-tech.com/",
    "mthreads.com/",
    "tenstorrent.com/",
    "alibabacloud.com/ppu",
];

/// Resources under those domains that are accounting views, not devices: the Ascend
/// plugin's (and HAMi's) `-memory`/`-core` companions, and the Intel GPU plugin's
/// shared-resource accounting (intel-device-plugins-for-kubernetes
/// `cmd/gpu_plugin`: `millicores`, `memory.max`, `tiles`).
fn is_accounting_resource(resource: &str) -> bool {
    resource.ends_with("-memory")
        || resource.ends_with("-core")
        || resource.ends_with("mem")
        || matches!(
            resource,
            "gpu.intel.com/millicores" | "gpu.intel.com/memory.max" | "gpu.intel.com/tiles"
        )
}

/// Labels written only on accelerator nodes: `(key, value or "" for any value)`.
/// NFD's default PCI labels name `<class>_<vendor>`: 0302 is a 3D controller
/// (NVIDIA data-centre GPUs), 1200 a processing accelerator (Gaudi, Inferentia,
/// Ascend); 0300 (VGA) is left out because every server's BMC has one.
const PRESENCE_LABELS: [(&str, &str); 6] = [
    ("nvidia.com/gpu.present", "true"),
    ("amd.com/gpu.present", "true"),
    ("habana.ai/device.count", ""),
    ("intel.feature.node.kubernetes.io/gaudi", "true"),
    ("cloud.google.com/gke-tpu-accelerator", ""),
    ("cloud.google.com/gke-accelerator", ""),
];
const NFD_PCI_PREFIXES: [&str; 2] = [
    "feature.node.kubernetes.io/pci-0302_",
    "feature.node.kubernetes.io/pci-1200_",
];

/// Take the groups no flavor can pin out of `groups`, and list every accelerator the
/// node advertises that no group accounts for.
pub(crate) fn sweep(
    view: &NodeView<'_>,
    groups: &mut Vec<DeviceGroup>,
    accounted: &[&str],
) -> Vec<UnclassifiedDevice> {
    let mut out = Vec::new();
    groups.retain(|g| {
        if !g.variant.model.ends_with("-unlabelled") {
            return true;
        }
        out.push(UnclassifiedDevice {
            source: g.variant.resource_name.clone(),
            count: g.capacity,
            reason: format!(
                "no product label names the model: label the nodes {}=<model> (or deploy the vendor's labeller)",
                super::MODEL_LABEL
            ),
            unlabelled_model_of: Some(g.variant.vendor),
        });
        false
    });
    for (&resource, raw) in &view.capacity {
        let count = crate::k8s::quantity::parse_count(raw).unwrap_or(0);
        if count == 0
            || !ACCELERATOR_RESOURCE_PREFIXES
                .iter()
                .any(|p| resource.starts_with(p))
            || is_accounting_resource(resource)
            || accounted.contains(&resource)
            || groups.iter().any(|g| g.variant.resource_name == resource)
            || out.iter().any(|u| u.source == resource)
        {
            continue;
        }
        out.push(UnclassifiedDevice {
            source: resource.to_string(),
            count,
            reason: "resource name no kaccel adapter reads; not offered to any class".to_string(),
            unlabelled_model_of: None,
        });
    }
    if groups.is_empty() && out.is_empty() {
        let presence = view
            .labels
            .iter()
            .find(|(k, v)| {
                PRESENCE_LABELS
                    .iter()
                    .any(|(key, want)| k.as_str() == *key && (want.is_empty() || v == want))
                    || (NFD_PCI_PREFIXES.iter().any(|p| k.starts_with(p))
                        && k.ends_with(".present")
                        && v.as_str() == "true")
            })
            .map(|(k, v)| format!("{k}={v}"));
        if let Some(label) = presence {
            out.push(UnclassifiedDevice {
                source: label,
                count: 0,
                reason: "labels say an accelerator is here but the node advertises no accelerator resource kaccel reads (device plugin not running, or an unknown resource); not counted as CPU-only".to_string(),
                unlabelled_model_of: None,
            });
        }
    }
    out
}
