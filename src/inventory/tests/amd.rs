//! AMD: the ROCm node labeller's whole GPUs and compute/memory partitions.

use super::*;

#[test]
fn amd_whole_and_partitions() {
    let whole = read_node(&node(
        r#"
metadata:
  name: gpu-mi300x-01
  labels:
    amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    amd.com/gpu.family: AI
    amd.com/gpu.vram: 192G
    amd.com/gpu.cu-count: "304"
    amd.com/gpu.driver-version: 6.10.5
    amd.com/gpu.compute-memory-partition: spx_nps1
    beta.amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
spec:
  taints: [{key: amd.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {amd.com/gpu: "8"}
  allocatable: {amd.com/gpu: "8"}
"#,
    ));
    assert!(whole.warnings.is_empty(), "{:?}", whole.warnings);
    let g = group(&whole, "amd.com/gpu");
    assert_eq!(g.variant.vendor, Vendor::Amd);
    assert_eq!(g.variant.model, "AMD_Instinct_MI300X_OAM");
    assert_eq!(g.variant.sharing, SharingMode::Whole);
    assert_eq!(g.memory_mib, Some(192 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("cdna3"));
    assert_eq!(g.driver_version.as_deref(), Some("6.10.5"));
    assert_eq!(g.vendor_taint_keys, vec!["amd.com/gpu".to_string()]);
    assert_eq!(
        g.pin_labels,
        pins(&[
            ("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
            ("amd.com/gpu.compute-memory-partition", "spx_nps1")
        ])
    );
    assert!(g.raw_labels.contains_key("beta.amd.com/gpu.product-name"));

    // `mixed` naming: heterogeneous node with SPX and CPX GPUs.
    let mixed = read_node(&node(
        r#"
metadata:
  name: gpu-mi300x-02
  labels: {amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM, amd.com/gpu.vram: 192G}
status:
  capacity: {amd.com/spx_nps1: "5", amd.com/cpx_nps1: "24"}
  allocatable: {amd.com/spx_nps1: "5", amd.com/cpx_nps1: "24"}
"#,
    ));
    assert!(mixed.warnings.is_empty(), "{:?}", mixed.warnings);
    let spx = group(&mixed, "amd.com/spx_nps1");
    assert_eq!(spx.variant.sharing, SharingMode::Whole);
    assert_eq!(spx.variant.partition_profile, None);
    let cpx = group(&mixed, "amd.com/cpx_nps1");
    assert_eq!(cpx.variant.sharing, SharingMode::Partition);
    assert_eq!(cpx.variant.partition_profile.as_deref(), Some("cpx_nps1"));
    assert_eq!(cpx.capacity, 24);

    // `single` naming on a homogeneous CPX/NPS4 node: 64 partitions as amd.com/gpu.
    let single = read_node(&node(
        r#"
metadata:
  name: gpu-mi300x-03
  labels: {amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM, amd.com/gpu.compute-memory-partition: cpx_nps4}
status:
  capacity: {amd.com/gpu: "64"}
  allocatable: {amd.com/gpu: "64"}
"#,
    ));
    let g = group(&single, "amd.com/gpu");
    assert_eq!(g.variant.sharing, SharingMode::Partition);
    assert_eq!(g.variant.partition_profile.as_deref(), Some("cpx_nps4"));
    assert_eq!(
        g.pin_labels
            .get("amd.com/gpu.compute-memory-partition")
            .map(String::as_str),
        Some("cpx_nps4")
    );
}
