//! NVIDIA: GFD labels for whole GPUs, MIG single and mixed, time-slicing, MPS, withdrawn GPUs.

use std::collections::BTreeSet;

use super::*;

#[test]
fn nvidia_whole_gpus() {
    let n = read_node(&node(H100));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.name, "gpu-h100-01");
    assert_eq!(n.ready, Some(true));
    assert!(n.accepts_new_pods());
    assert_eq!(n.cpu_millis, 191_500);
    assert_eq!(n.memory_bytes, 2_061_840_324 * 1024);
    assert_eq!(n.topology.zone.as_deref(), Some("zone-a"));
    assert_eq!(n.topology.region.as_deref(), Some("region-1"));
    assert_eq!(n.topology.rack.as_deref(), Some("rack-7"));
    assert_eq!(
        n.conditions.get("GpuThermalWatch"),
        Some(&("False".to_string(), "NoThermalIssue".to_string()))
    );
    assert_eq!(n.groups.len(), 1);
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.variant.vendor, Vendor::Nvidia);
    assert_eq!(g.variant.model, "NVIDIA-H100-80GB-HBM3");
    assert_eq!(g.variant.sharing, SharingMode::Whole);
    assert_eq!(g.variant.partition_profile, None);
    assert_eq!((g.capacity, g.allocatable), (8, 8));
    assert_eq!(g.memory_mib, Some(81559));
    assert_eq!(g.architecture.as_deref(), Some("hopper"));
    assert_eq!(g.compute_capability.as_deref(), Some("9.0"));
    assert_eq!(g.driver_version.as_deref(), Some("570.133.20"));
    assert_eq!(g.cuda_version.as_deref(), Some("12.8"));
    assert_eq!(
        g.pin_labels,
        pins(&[("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")])
    );
    assert_eq!(g.vendor_taint_keys, vec!["nvidia.com/gpu".to_string()]);
    assert_eq!(
        g.raw_labels.get("nvidia.com/gpu.count").map(String::as_str),
        Some("8")
    );
    assert!(!g.raw_labels.contains_key("kubernetes.io/hostname"));
}

#[test]
fn nvidia_deprecated_version_labels() {
    let n = read_node(&node(
        r#"
metadata:
  name: old-gfd
  labels:
    nvidia.com/gpu.product: Tesla-T4
    nvidia.com/gpu.compute.major: "7"
    nvidia.com/gpu.compute.minor: "5"
    nvidia.com/cuda.driver.major: "535"
    nvidia.com/cuda.driver.minor: "183"
    nvidia.com/cuda.driver.rev: "01"
    nvidia.com/cuda.runtime.major: "12"
    nvidia.com/cuda.runtime.minor: "2"
status:
  capacity: {nvidia.com/gpu: "1"}
  allocatable: {nvidia.com/gpu: "1"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.driver_version.as_deref(), Some("535.183.01"));
    assert_eq!(g.cuda_version.as_deref(), Some("12.2"));
    assert_eq!(g.compute_capability.as_deref(), Some("7.5"));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(
        n.ready, None,
        "no Ready condition is unknown, not unhealthy"
    );
}

#[test]
fn nvidia_mig_mixed_two_profiles_plus_whole() {
    let n = read_node(&node(
        r#"
metadata:
  name: gpu-a100-mig-01
  labels:
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
    nvidia.com/gpu.family: ampere
    nvidia.com/gpu.memory: "81920"
    nvidia.com/gpu.compute.major: "8"
    nvidia.com/gpu.compute.minor: "0"
    nvidia.com/mig.strategy: mixed
    nvidia.com/mig-1g.10gb.count: "28"
    nvidia.com/mig-1g.10gb.memory: "9728"
    nvidia.com/mig-3g.40gb.count: "4"
    nvidia.com/mig-3g.40gb.memory: "40192"
status:
  capacity: {nvidia.com/gpu: "2", nvidia.com/mig-1g.10gb: "28", nvidia.com/mig-3g.40gb: "4"}
  allocatable: {nvidia.com/gpu: "2", nvidia.com/mig-1g.10gb: "27", nvidia.com/mig-3g.40gb: "4"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 3);
    let whole = group(&n, "nvidia.com/gpu");
    assert_eq!(whole.variant.sharing, SharingMode::Whole);
    assert_eq!(whole.variant.model, "NVIDIA-A100-SXM4-80GB");
    assert_eq!(whole.memory_mib, Some(81920));
    assert_eq!(
        whole.pin_labels,
        pins(&[("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB")])
    );

    let small = group(&n, "nvidia.com/mig-1g.10gb");
    assert_eq!(small.variant.sharing, SharingMode::Partition);
    assert_eq!(small.variant.model, "NVIDIA-A100-SXM4-80GB");
    assert_eq!(small.variant.partition_profile.as_deref(), Some("1g.10gb"));
    assert_eq!((small.capacity, small.allocatable), (28, 27));
    assert_eq!(small.memory_mib, Some(9728));
    assert_eq!(small.compute_capability.as_deref(), Some("8.0"));
    assert_eq!(
        small.pin_labels,
        pins(&[
            ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
            ("nvidia.com/mig.strategy", "mixed")
        ])
    );
    let big = group(&n, "nvidia.com/mig-3g.40gb");
    assert_eq!(big.variant.partition_profile.as_deref(), Some("3g.40gb"));
    assert_eq!(big.capacity, 4);
    assert_eq!(big.memory_mib, Some(40192));
    // Distinct variants, so distinct flavors.
    let variants: BTreeSet<_> = n.groups.iter().map(|g| &g.variant).collect();
    assert_eq!(variants.len(), 3);
}

#[test]
fn nvidia_mig_memory_from_profile_name_when_unlabelled() {
    let n = read_node(&node(
        r#"
metadata:
  name: m
  labels: {nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3, nvidia.com/mig.strategy: mixed}
status:
  capacity: {nvidia.com/mig-2g.20gb: "3"}
  allocatable: {nvidia.com/mig-2g.20gb: "3"}
"#,
    ));
    assert_eq!(
        group(&n, "nvidia.com/mig-2g.20gb").memory_mib,
        Some(20 * 1024)
    );
}

#[test]
fn nvidia_time_slicing() {
    let n = read_node(&node(
        r#"
metadata:
  name: gpu-l4-ts-01
  labels:
    nvidia.com/gpu.product: NVIDIA-L4-SHARED
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "4"
    nvidia.com/gpu.sharing-strategy: time-slicing
    nvidia.com/gpu.memory: "23034"
status:
  capacity: {nvidia.com/gpu: "32"}
  allocatable: {nvidia.com/gpu: "32"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.variant.sharing, SharingMode::TimeShare);
    assert_eq!(g.variant.model, "NVIDIA-L4");
    assert_eq!(g.capacity, 32, "capacity is replicas as reported");
    assert_eq!(g.memory_mib, Some(23034));
    assert_eq!(
        g.pin_labels,
        pins(&[("nvidia.com/gpu.product", "NVIDIA-L4-SHARED")])
    );
}

#[test]
fn a_product_that_is_only_a_decoration_names_no_model() {
    // Found by `read_node_never_panics`: `-SHARED` alone stripped to an empty model.
    let n = read_node(&node(
        r#"
metadata:
  name: gpu-odd-01
  labels:
    nvidia.com/gpu.product: "-SHARED"
status:
  capacity: {nvidia.com/gpu: "1"}
  allocatable: {nvidia.com/gpu: "1"}
"#,
    ));
    // Unlabelled devices are not offered as a model; they are reported as unclassified.
    assert!(n.groups.is_empty(), "{:?}", n.groups);
    assert_eq!(n.unclassified.len(), 1, "{:?}", n.unclassified);
    assert_eq!(n.unclassified[0].source, "nvidia.com/gpu");
    assert_eq!(n.unclassified[0].count, 1);
    assert!(
        n.warnings.iter().any(|w| w.contains("names no model")),
        "{:?}",
        n.warnings
    );
}

#[test]
fn nvidia_time_slicing_renamed_and_mps_without_suffix() {
    let n = read_node(&node(
        r#"
metadata:
  name: renamed
  labels: {nvidia.com/gpu.product: NVIDIA-A10G, nvidia.com/gpu.sharing-strategy: time-slicing}
status:
  capacity: {nvidia.com/gpu.shared: "8"}
  allocatable: {nvidia.com/gpu.shared: "8"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu.shared");
    assert_eq!(g.variant.sharing, SharingMode::TimeShare);
    assert_eq!(g.variant.model, "NVIDIA-A10G");

    let n = read_node(&node(
        r#"
metadata:
  name: mps
  labels: {nvidia.com/gpu.product: NVIDIA-A10G, nvidia.com/gpu.sharing-strategy: mps}
status:
  capacity: {nvidia.com/gpu: "8"}
  allocatable: {nvidia.com/gpu: "8"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.variant.sharing, SharingMode::TimeShare);
    assert_eq!(
        g.pin_labels,
        pins(&[
            ("nvidia.com/gpu.product", "NVIDIA-A10G"),
            ("nvidia.com/gpu.sharing-strategy", "mps")
        ])
    );
}

#[test]
fn nvidia_mig_single() {
    let n = read_node(&node(
        r#"
metadata:
  name: gpu-a100-single
  labels:
    nvidia.com/gpu.product: A100-SXM4-40GB-MIG-1g.5gb
    nvidia.com/gpu.count: "56"
    nvidia.com/gpu.memory: "5120"
    nvidia.com/mig.strategy: single
status:
  capacity: {nvidia.com/gpu: "56"}
  allocatable: {nvidia.com/gpu: "56"}
"#,
    ));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!(g.variant.sharing, SharingMode::Partition);
    assert_eq!(g.variant.model, "A100-SXM4-40GB");
    assert_eq!(g.variant.partition_profile.as_deref(), Some("1g.5gb"));
    assert_eq!(g.memory_mib, Some(5120));
    assert_eq!(
        g.pin_labels,
        pins(&[("nvidia.com/gpu.product", "A100-SXM4-40GB-MIG-1g.5gb")])
    );
}

#[test]
fn withdrawn_devices_keep_both_counts() {
    let yaml = H100.replace(
        "allocatable: {cpu: 191500m, memory: 2061840324Ki, pods: \"110\", nvidia.com/gpu: \"8\"}",
        "allocatable: {cpu: 191500m, memory: 2061840324Ki, pods: \"110\", nvidia.com/gpu: \"6\"}",
    );
    let n = read_node(&node(&yaml));
    let g = group(&n, "nvidia.com/gpu");
    assert_eq!((g.capacity, g.allocatable), (8, 6));
    assert!(n.warnings.is_empty());
}
