//! Any vendor: garbage values, a missing product label, kaccel's model label, CPU-only nodes.

use super::*;

#[test]
fn garbage_values_warn_and_never_panic() {
    let n = read_node(&node(
        r#"
metadata:
  name: garbage
  labels:
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.memory: lots
    nvidia.com/gpu.compute.major: nine
    nvidia.com/gpu.compute.minor: "0"
    amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    amd.com/gpu.vram: huge
    cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice
    cloud.google.com/gke-tpu-topology: 2by4
status:
  capacity: {cpu: many, memory: 12Qi, nvidia.com/gpu: "8", amd.com/gpu: eight, google.com/tpu: "4", huawei.com/Ascend910: "8.5"}
  allocatable: {cpu: many, memory: 12Qi, nvidia.com/gpu: "-1", amd.com/gpu: "8", google.com/tpu: "9"}
"#,
    ));
    let all = n.warnings.join("\n");
    for needle in [
        "status.allocatable.cpu",
        "status.allocatable.memory",
        "status.allocatable[nvidia.com/gpu]",
        "\"-1\"",
        "nvidia.com/gpu.memory=\"lots\"",
        "nvidia.com/gpu.compute.major=\"nine\"",
        "status.capacity[amd.com/gpu]",
        "\"eight\"",
        "amd.com/gpu.vram=\"huge\"",
        "gke-tpu-topology=\"2by4\"",
        "exceeds capacity",
        "huawei.com/Ascend910",
    ] {
        assert!(all.contains(needle), "missing {needle:?} in:\n{all}");
    }
    // The NVIDIA count is valid, so its group exists, with nothing allocatable.
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!((g.capacity, g.allocatable), (8, 0));
    assert_eq!(g.memory_mib, None);
    assert_eq!(g.compute_capability, None);
    // The AMD capacity is garbage: no group.
    assert!(n.groups.iter().all(|g| g.variant.vendor != Vendor::Amd));
    // TPU allocatable above capacity is capped.
    let tpu = group(&n, "google.com/tpu");
    assert_eq!((tpu.capacity, tpu.allocatable), (4, 4));
    assert!(
        !tpu.pin_labels
            .contains_key("cloud.google.com/gke-tpu-topology")
    );
    assert_eq!((n.cpu_millis, n.memory_bytes), (0, 0));
}

#[test]
fn missing_product_label_is_visible() {
    let n = read_node(&node(
        r#"
metadata: {name: bare}
status:
  capacity: {nvidia.com/gpu: "4", amd.com/gpu: "2", habana.ai/gaudi: "8"}
  allocatable: {nvidia.com/gpu: "4", amd.com/gpu: "2", habana.ai/gaudi: "8"}
"#,
    ));
    // No model: never a variant (its flavor could not be pinned to its nodes), but
    // listed as unclassified, with the label that is missing named in a warning.
    assert!(n.groups.is_empty(), "{:#?}", n.groups);
    assert!(n.has_accelerators());
    let sources: BTreeMap<&str, u32> = n
        .unclassified
        .iter()
        .map(|u| (u.source.as_str(), u.count))
        .collect();
    assert_eq!(
        sources,
        BTreeMap::from([
            ("amd.com/gpu", 2),
            ("habana.ai/gaudi", 8),
            ("nvidia.com/gpu", 4)
        ])
    );
    assert!(
        n.warnings
            .iter()
            .any(|w| w.contains("nvidia.com/gpu.product"))
    );
    assert!(
        n.warnings
            .iter()
            .any(|w| w.contains("amd.com/gpu.product-name"))
    );
    assert!(n.warnings.iter().any(|w| w.contains(MODEL_LABEL)));
}

#[test]
fn kaccel_model_label_fills_the_gap() {
    let n = read_node(&node(
        r#"
metadata:
  name: labelled-by-platform
  labels: {kaccel.io/accelerator.model: NVIDIA-B200}
status:
  capacity: {nvidia.com/gpu: "8"}
  allocatable: {nvidia.com/gpu: "8"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.variant.model, "NVIDIA-B200");
    assert_eq!(g.pin_labels, pins(&[(MODEL_LABEL, "NVIDIA-B200")]));
    assert!(n.warnings.is_empty());
}

#[test]
fn cpu_only_cordoned_and_not_ready() {
    let n = read_node(&node(
        r#"
metadata:
  name: cpu-01
  labels: {kaccel.io/pool: cpu}
spec: {unschedulable: true}
status:
  capacity: {cpu: "64", memory: 256Gi}
  allocatable: {cpu: 63500m, memory: 250Gi}
  conditions: [{type: Ready, status: "False", reason: KubeletNotReady}]
"#,
    ));
    assert!(!n.has_accelerators());
    assert!(n.unschedulable);
    assert_eq!(n.ready, Some(false));
    assert!(!n.accepts_new_pods());
    assert_eq!(n.memory_bytes, 250 << 30);
}
