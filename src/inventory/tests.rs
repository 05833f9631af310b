//! Adapter tests on realistic Node objects (as the vendors' stacks label them), the
//! example fleet, DRA slices, and a property test that no input panics `read_node`.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;
use serde::Deserialize;

use super::*;

pub(super) fn node(yaml: &str) -> Node {
    serde_yaml::from_str(yaml).expect("test node YAML")
}

fn slice(yaml: &str) -> ResourceSlice {
    serde_yaml::from_str(yaml).expect("test slice YAML")
}

pub(super) fn group<'a>(n: &'a NodeInventory, resource: &str) -> &'a DeviceGroup {
    n.groups
        .iter()
        .find(|g| g.variant.resource_name == resource)
        .unwrap_or_else(|| panic!("no group for {resource} in {:#?}", n.groups))
}

pub(super) fn pins(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const H100: &str = r#"
metadata:
  name: gpu-h100-01
  labels:
    topology.kubernetes.io/zone: zone-a
    topology.kubernetes.io/region: region-1
    topology.kaccel.io/rack: rack-7
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.family: hopper
    nvidia.com/gpu.memory: "81559"
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.compute.major: "9"
    nvidia.com/gpu.compute.minor: "0"
    nvidia.com/cuda.driver-version.full: "570.133.20"
    nvidia.com/cuda.runtime-version.full: "12.8"
    nvidia.com/mig.strategy: none
    kubernetes.io/hostname: gpu-h100-01
spec:
  taints:
    - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
status:
  capacity: {cpu: "192", memory: 2063937476Ki, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: 191500m, memory: 2061840324Ki, pods: "110", nvidia.com/gpu: "8"}
  conditions:
    - {type: Ready, status: "True", reason: KubeletReady}
    - {type: GpuThermalWatch, status: "False", reason: NoThermalIssue}
"#;

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

#[test]
fn intel_gaudi_and_gpus() {
    let n = read_node(&node(
        r#"
metadata:
  name: hpu-gaudi3-01
  labels: {kaccel.io/accelerator.model: Gaudi3}
spec:
  taints: [{key: habana.ai/gaudi, value: present, effect: NoSchedule}]
status:
  capacity: {habana.ai/gaudi: "8"}
  allocatable: {habana.ai/gaudi: "7"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let g = group(&n, "habana.ai/gaudi");
    assert_eq!(g.variant.vendor, Vendor::Intel);
    assert_eq!(g.variant.model, "Gaudi3");
    assert_eq!((g.capacity, g.allocatable), (8, 7));
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("gaudi3"));
    assert_eq!(g.pin_labels, pins(&[(MODEL_LABEL, "Gaudi3")]));
    assert_eq!(g.vendor_taint_keys, vec!["habana.ai/gaudi".to_string()]);

    let dl1 = read_node(&node(
        r#"
metadata:
  name: dl1
  labels: {node.kubernetes.io/instance-type: dl1.24xlarge}
status:
  capacity: {habana.ai/gaudi: "8"}
  allocatable: {habana.ai/gaudi: "8"}
"#,
    ));
    let g = group(&dl1, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi");
    assert_eq!(
        g.pin_labels,
        pins(&[("node.kubernetes.io/instance-type", "dl1.24xlarge")])
    );

    let gpu = read_node(&node(
        r#"
metadata:
  name: max1550
  labels:
    gpu.intel.com/product: Max_1550
    gpu.intel.com/family: Max_Series
    gpu.intel.com/device.count: "4"
    gpu.intel.com/memory.max: "549755813888"
    gpu.intel.com/millicores: "4000"
    gpu.intel.com/tiles: "8"
status:
  capacity: {gpu.intel.com/i915: "4", gpu.intel.com/millicores: "4000", gpu.intel.com/memory.max: "549755813888"}
  allocatable: {gpu.intel.com/i915: "4", gpu.intel.com/millicores: "4000", gpu.intel.com/memory.max: "549755813888"}
"#,
    ));
    assert!(gpu.warnings.is_empty(), "{:?}", gpu.warnings);
    assert_eq!(gpu.groups.len(), 1, "millicores/memory.max are not devices");
    let g = group(&gpu, "gpu.intel.com/i915");
    assert_eq!(g.variant.model, "Max_1550");
    assert_eq!(g.variant.sharing, SharingMode::Whole);
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("xe-hpc"));
    assert_eq!(g.pin_labels, pins(&[("gpu.intel.com/product", "Max_1550")]));

    let shared = read_node(&node(
        r#"
metadata:
  name: flex-shared
  labels: {gpu.intel.com/product: Flex_170, gpu.intel.com/device.count: "1"}
status:
  capacity: {gpu.intel.com/xe: "10"}
  allocatable: {gpu.intel.com/xe: "10"}
"#,
    ));
    assert_eq!(
        group(&shared, "gpu.intel.com/xe").variant.sharing,
        SharingMode::TimeShare
    );
}

#[test]
fn huawei_ascend_whole_and_vnpu() {
    let n = read_node(&node(
        r#"
metadata:
  name: npu-910b-02
  labels:
    accelerator: huawei-Ascend910
    accelerator-type: module-910b-8
    node.kubernetes.io/npu.chip.name: 910B3
    servertype: Ascend910B-20
    kubernetes.io/arch: arm64
status:
  capacity: {huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "20", huawei.com/Ascend910-memory: "262144"}
  allocatable: {huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "19", huawei.com/Ascend910-memory: "262144"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 2, "{:#?}", n.groups);
    let whole = group(&n, "huawei.com/Ascend910");
    assert_eq!(whole.variant.vendor, Vendor::Huawei);
    assert_eq!(whole.variant.model, "Ascend910B3");
    assert_eq!(whole.variant.sharing, SharingMode::Whole);
    assert_eq!(whole.memory_mib, Some(64 * 1024));
    assert_eq!(
        whole.pin_labels,
        pins(&[
            ("accelerator", "huawei-Ascend910"),
            ("node.kubernetes.io/npu.chip.name", "910B3")
        ])
    );
    assert_eq!(
        whole.raw_labels.get("servertype").map(String::as_str),
        Some("Ascend910B-20")
    );
    let vnpu = group(&n, "huawei.com/Ascend910-4c");
    assert_eq!(vnpu.variant.sharing, SharingMode::Partition);
    assert_eq!(vnpu.variant.partition_profile.as_deref(), Some("4c"));
    assert_eq!(vnpu.variant.model, "Ascend910B3");
    assert_eq!((vnpu.capacity, vnpu.allocatable), (20, 19));

    let older = read_node(&node(
        r#"
metadata:
  name: npu-910-01
  labels: {accelerator: huawei-Ascend910, accelerator-type: module}
status:
  capacity: {huawei.com/Ascend910: "8"}
  allocatable: {huawei.com/Ascend910: "8"}
"#,
    ));
    let g = group(&older, "huawei.com/Ascend910");
    assert_eq!(g.variant.model, "Ascend910");
    assert_eq!(
        g.pin_labels,
        pins(&[
            ("accelerator", "huawei-Ascend910"),
            ("accelerator-type", "module")
        ])
    );
}

#[test]
fn aws_neuron_devices_and_cores() {
    let n = read_node(&node(
        r#"
metadata:
  name: trn1-01
  labels: {node.kubernetes.io/instance-type: trn1.32xlarge}
spec:
  taints: [{key: aws.amazon.com/neuron, value: present, effect: NoSchedule}]
status:
  capacity: {aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  allocatable: {aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "30"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let dev = group(&n, "aws.amazon.com/neuron");
    assert_eq!(dev.variant.vendor, Vendor::Aws);
    assert_eq!(dev.variant.model, "Trainium");
    assert_eq!(dev.variant.sharing, SharingMode::Whole);
    assert_eq!(dev.memory_mib, Some(32 * 1024));
    assert_eq!(
        dev.pin_labels,
        pins(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")])
    );
    assert_eq!(
        dev.vendor_taint_keys,
        vec!["aws.amazon.com/neuron".to_string()]
    );
    assert_eq!(
        dev.raw_labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("trn1.32xlarge")
    );
    // The cores are the same chips: one view per node, the device view by default.
    assert_eq!(n.groups.len(), 1, "{:#?}", n.groups);
    assert!(n.unclassified.is_empty(), "{:?}", n.unclassified);
}

/// The Neuron device plugin advertises `aws.amazon.com/neuron` and
/// `aws.amazon.com/neuroncore` on one node (aws-neuron/neuron-device-plugin README;
/// AWS Neuron docs "Kubernetes environment setup", checked against device plugin
/// 2.x docs). They are two views of the same chips: kaccel offers one per node, so
/// what is offered never exceeds the silicon. `kaccel.io/neuron.view=core` picks the
/// cores and pins the flavor to nodes so labelled.
#[test]
fn aws_neuron_one_view_per_node() {
    let read = |view: Option<&str>| {
        let label = view
            .map(|v| format!(", kaccel.io/neuron.view: {v}"))
            .unwrap_or_default();
        read_node(&node(&format!(
            r#"
metadata:
  name: trn1-01
  labels: {{node.kubernetes.io/instance-type: trn1.32xlarge{label}}}
status:
  capacity: {{aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}}
  allocatable: {{aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "30"}}
"#
        )))
    };
    // Chips offered, counted in device units (2 cores a Trainium chip).
    let chips = |n: &NodeInventory| -> u32 {
        n.groups
            .iter()
            .map(|g| match g.variant.sharing {
                SharingMode::Partition => g.capacity / 2,
                _ => g.capacity,
            })
            .sum()
    };
    let default = read(None);
    assert_eq!(chips(&default), 16, "{:#?}", default.groups);
    assert_eq!(
        default.groups[0].variant.resource_name,
        "aws.amazon.com/neuron"
    );

    let cores = read(Some("core"));
    assert_eq!(chips(&cores), 16, "{:#?}", cores.groups);
    let core = group(&cores, "aws.amazon.com/neuroncore");
    assert_eq!(core.variant.sharing, SharingMode::Partition);
    assert_eq!(
        core.variant.partition_profile.as_deref(),
        Some("neuroncore")
    );
    assert_eq!((core.capacity, core.allocatable), (32, 30));
    assert_eq!(core.memory_mib, Some(16 * 1024));
    assert_eq!(
        core.pin_labels,
        pins(&[
            ("kaccel.io/neuron.view", "core"),
            ("node.kubernetes.io/instance-type", "trn1.32xlarge")
        ])
    );
    assert!(cores.unclassified.is_empty());

    let bad = read(Some("both"));
    assert_eq!(chips(&bad), 16);
    assert!(
        bad.warnings
            .iter()
            .any(|w| w.contains("kaccel.io/neuron.view"))
    );
}

#[test]
fn google_tpu() {
    let n = read_node(&node(
        r#"
metadata:
  name: tpu-v5e-01
  labels:
    cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice
    cloud.google.com/gke-tpu-topology: 2x4
    cloud.google.com/gke-nodepool: tpu-pool
spec:
  taints: [{key: google.com/tpu, value: present, effect: NoSchedule}]
status:
  capacity: {google.com/tpu: "8"}
  allocatable: {google.com/tpu: "8"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let g = group(&n, "google.com/tpu");
    assert_eq!(g.variant.vendor, Vendor::Google);
    assert_eq!(g.variant.model, "tpu-v5-lite-podslice");
    assert_eq!(g.memory_mib, Some(16 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("v5e"));
    assert_eq!(
        g.pin_labels,
        pins(&[
            (
                "cloud.google.com/gke-tpu-accelerator",
                "tpu-v5-lite-podslice"
            ),
            ("cloud.google.com/gke-tpu-topology", "2x4")
        ])
    );
    assert_eq!(g.raw_labels.len(), 2, "node pool name is not a TPU label");
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

const GPU_SLICE: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gpu-h100-01-gpu.nvidia.com-abcde}
spec:
  driver: gpu.nvidia.com
  nodeName: gpu-h100-01
  pool: {name: gpu-h100-01, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0
      attributes:
        type: {string: gpu}
        uuid: {string: GPU-4a3f2c1e-0000-1111-2222-333344445555}
        productName: {string: NVIDIA H100 80GB HBM3}
        architecture: {string: Hopper}
        driverVersion: {version: 570.133.20}
        cudaComputeCapability: {version: 9.0.0}
        cudaDriverVersion: {version: 12.8.0}
        pcieBusID: {string: "0000:18:00.0"}
        index: {int: 0}
      capacity:
        memory: {value: 81559Mi}
    - name: gpu-1
      attributes:
        gpu.nvidia.com/uuid: {string: GPU-9b8c7d6e-0000-1111-2222-333344445555}
        gpu.nvidia.com/productName: {string: NVIDIA H100 80GB HBM3}
      capacity:
        memory: {value: 80Gi}
"#;

#[test]
fn dra_slice_attaches_uuids() {
    let nodes = [node(H100)];
    let slices = [slice(GPU_SLICE)];
    let inv = Inventory::from_nodes_and_slices(&nodes, &slices);
    let n = &inv.nodes["gpu-h100-01"];
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 1, "devices join the device-plugin group");
    let g = group(n, "nvidia.com/gpu");
    assert_eq!(
        (g.capacity, g.allocatable),
        (8, 8),
        "counts stay the plugin's"
    );
    assert_eq!(g.devices.len(), 2);
    assert_eq!(g.devices[0].name, "gpu-0");
    assert_eq!(
        g.devices[0].uuid.as_deref(),
        Some("GPU-4a3f2c1e-0000-1111-2222-333344445555")
    );
    assert_eq!(g.devices[0].pci_address.as_deref(), Some("0000:18:00.0"));
    assert_eq!(g.devices[0].memory_mib, Some(81559));
    assert_eq!(
        g.devices[0].raw_attributes.get("index").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        g.devices[1].uuid.as_deref(),
        Some("GPU-9b8c7d6e-0000-1111-2222-333344445555")
    );
    assert_eq!(g.devices[1].memory_mib, Some(80 * 1024));

    // Merging the same slice twice doubles nothing.
    let inv2 = Inventory::from_nodes_and_slices(&nodes, [&slices[0], &slices[0]]);
    assert_eq!(inv2, inv);
}

#[test]
fn dra_only_groups_and_ignored_slices() {
    let nodes = [node(
        r#"
metadata:
  name: gpu-mi300x-dra
  labels: {kubernetes.io/hostname: gpu-mi300x-dra}
status:
  capacity: {cpu: "192"}
  allocatable: {cpu: "191"}
"#,
    )];
    let amd = slice(
        r#"
metadata: {name: amd-slice}
spec:
  driver: gpu.amd.com
  nodeName: gpu-mi300x-dra
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0
      attributes:
        productName: {string: AMD Instinct MI300X}
        family: {string: CDNA3}
        partitionProfile: {string: spx_nps1}
        pciAddr: {string: "0000:0c:00.0"}
        driverVersion: {version: 6.10.5}
      capacity: {memory: {value: 192Gi}}
    - name: gpu-1
      attributes:
        productName: {string: AMD Instinct MI300X}
        partitionProfile: {string: spx_nps1}
        pciAddr: {string: "0000:22:00.0"}
      capacity: {memory: {value: 192Gi}}
      taints: [{key: gpu.amd.com/unhealthy, effect: NoSchedule}]
    - name: gpu-2-partition-0
      attributes:
        productName: {string: AMD Instinct MI300X}
        partitionProfile: {string: cpx_nps4}
      capacity: {memory: {value: 24Gi}}
"#,
    );
    let other = slice(
        r#"
metadata: {name: nic}
spec:
  driver: sriov.example.com
  nodeName: gpu-mi300x-dra
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: vf-0}]
"#,
    );
    let elsewhere = slice(
        r#"
metadata: {name: unknown-node}
spec:
  driver: gpu.nvidia.com
  nodeName: not-in-inventory
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"#,
    );
    let network = slice(
        r#"
metadata: {name: all-nodes}
spec:
  driver: gpu.nvidia.com
  allNodes: true
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"#,
    );
    let inv = Inventory::from_nodes_and_slices(&nodes, [&amd, &other, &elsewhere, &network]);
    assert_eq!(inv.nodes.len(), 1);
    let n = &inv.nodes["gpu-mi300x-dra"];
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 2, "{:#?}", n.groups);
    let whole = n
        .groups
        .iter()
        .find(|g| g.variant.sharing == SharingMode::Whole)
        .expect("whole DRA group");
    assert_eq!(whole.variant.resource_name, "gpu.amd.com");
    assert_eq!(whole.variant.model, "AMD-Instinct-MI300X");
    assert_eq!(
        (whole.capacity, whole.allocatable),
        (2, 1),
        "a tainted device is not allocatable"
    );
    assert_eq!(whole.memory_mib, Some(192 * 1024));
    assert_eq!(whole.architecture.as_deref(), Some("cdna3"));
    assert!(whole.pin_labels.is_empty());
    assert_eq!(
        whole.devices[1].pci_address.as_deref(),
        Some("0000:22:00.0")
    );
    let part = n
        .groups
        .iter()
        .find(|g| g.variant.sharing == SharingMode::Partition)
        .expect("partition DRA group");
    assert_eq!(part.variant.partition_profile.as_deref(), Some("cpx_nps4"));
    assert_eq!(part.capacity, 1);
}

#[test]
fn dra_mig_devices_join_mig_groups() {
    let nodes = [node(
        r#"
metadata:
  name: mig
  labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB, nvidia.com/mig.strategy: mixed}
status:
  capacity: {nvidia.com/mig-1g.10gb: "7"}
  allocatable: {nvidia.com/mig-1g.10gb: "7"}
"#,
    )];
    let s = slice(
        r#"
metadata: {name: mig-slice}
spec:
  driver: gpu.nvidia.com
  nodeName: mig
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0-mig-1g10gb-0
      attributes:
        type: {string: mig}
        profile: {string: 1g.10gb}
        uuid: {string: MIG-aaaa}
        productName: {string: NVIDIA A100-SXM4-80GB}
"#,
    );
    let inv = Inventory::from_nodes_and_slices(&nodes, [&s]);
    let n = &inv.nodes["mig"];
    assert_eq!(n.groups.len(), 1);
    assert_eq!(n.groups[0].devices[0].uuid.as_deref(), Some("MIG-aaaa"));
    assert_eq!(n.groups[0].capacity, 7);
}

const EXAMPLE_FLEET: &str = include_str!("../../examples/nodes.yaml");

pub(crate) fn example_nodes() -> Vec<Node> {
    serde_yaml::Deserializer::from_str(EXAMPLE_FLEET)
        .map(|doc| Node::deserialize(doc).expect("examples/nodes.yaml: a v1 Node"))
        .collect()
}

#[test]
fn example_fleet_reads_cleanly() {
    let nodes = example_nodes();
    assert_eq!(nodes.len(), 22);
    let inv = Inventory::from_nodes(&nodes);
    assert_eq!(inv.nodes.len(), 22, "node names are unique");
    for n in inv.nodes.values() {
        assert!(n.warnings.is_empty(), "{}: {:?}", n.name, n.warnings);
        assert_eq!(n.ready, Some(true), "{}", n.name);
        assert!(n.topology.zone.is_some(), "{}", n.name);
        assert!(n.cpu_millis > 0 && n.memory_bytes > 0, "{}", n.name);
    }
    let vendors: BTreeSet<Vendor> = inv.groups().map(|(_, g)| g.variant.vendor).collect();
    assert!(vendors.len() >= 6, "{vendors:?}");

    let variants: BTreeSet<&DeviceVariant> = inv.groups().map(|(_, g)| &g.variant).collect();
    let has = |model: &str, sharing: SharingMode, profile: Option<&str>| {
        variants.iter().any(|v| {
            v.model == model && v.sharing == sharing && v.partition_profile.as_deref() == profile
        })
    };
    assert!(has("NVIDIA-H100-80GB-HBM3", SharingMode::Whole, None));
    assert!(has("NVIDIA-A100-SXM4-80GB", SharingMode::Whole, None));
    assert!(has(
        "NVIDIA-A100-SXM4-80GB",
        SharingMode::Partition,
        Some("1g.10gb")
    ));
    assert!(has(
        "NVIDIA-A100-SXM4-80GB",
        SharingMode::Partition,
        Some("3g.40gb")
    ));
    assert!(has("NVIDIA-L4", SharingMode::TimeShare, None));
    assert!(has("NVIDIA-L40S", SharingMode::Whole, None));
    assert!(has("AMD_Instinct_MI300X_OAM", SharingMode::Whole, None));
    assert!(has(
        "AMD_Instinct_MI300X_OAM",
        SharingMode::Partition,
        Some("cpx_nps4")
    ));
    assert!(has("Gaudi2", SharingMode::Whole, None));
    assert!(has("Gaudi3", SharingMode::Whole, None));
    assert!(has("Ascend910B3", SharingMode::Whole, None));
    assert!(has("Ascend910B3", SharingMode::Partition, Some("4c")));
    assert!(has("Trainium", SharingMode::Whole, None));
    // One Neuron view per node: the example trn1 node advertises both, the device
    // view is offered.
    assert!(!has("Trainium", SharingMode::Partition, Some("neuroncore")));
    assert!(has("tpu-v5-lite-podslice", SharingMode::Whole, None));

    // Whole H100s: 4 nodes x 8, one withdrawn.
    let (cap, alloc) = inv
        .groups()
        .filter(|(_, g)| g.variant.model == "NVIDIA-H100-80GB-HBM3")
        .fold((0, 0), |(c, a), (_, g)| (c + g.capacity, a + g.allocatable));
    assert_eq!((cap, alloc), (32, 31));
    // Pins of one variant agree across its nodes (one flavor per variant here).
    let mut pins_by_variant: BTreeMap<&DeviceVariant, BTreeSet<&BTreeMap<String, String>>> =
        BTreeMap::new();
    for (_, g) in inv.groups() {
        pins_by_variant
            .entry(&g.variant)
            .or_default()
            .insert(&g.pin_labels);
        assert!(!g.pin_labels.is_empty(), "{:?}", g.variant);
        for (k, v) in &g.pin_labels {
            // Every pin label exists on the node with that value (checked per node below).
            assert!(!k.is_empty() && !v.is_empty());
        }
    }
    for (v, p) in &pins_by_variant {
        assert_eq!(p.len(), 1, "{v:?}: {p:?}");
    }
    for n in inv.nodes.values() {
        for g in &n.groups {
            for (k, v) in &g.pin_labels {
                assert_eq!(n.labels.get(k), Some(v), "{}: pin {k} not on node", n.name);
            }
        }
    }
    // Different variants never share a pin set and resource (flavors stay apart).
    let mut seen = BTreeSet::new();
    for (v, p) in &pins_by_variant {
        let key = (v.resource_name.clone(), p.iter().next().cloned());
        assert!(seen.insert(key), "two variants with one pin set: {v:?}");
    }
    let cpu_only = inv
        .nodes
        .values()
        .filter(|n| n.labels.get("kaccel.io/pool").map(String::as_str) == Some("cpu"))
        .count();
    assert_eq!(cpu_only, 3);
}

fn arb_quantity() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{1,3}",
        "-?[0-9]{0,25}(\\.[0-9]{0,5})?(Ki|Mi|Gi|m|k|e[0-9]{1,3})?",
        ".{0,12}",
    ]
}

fn arb_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nvidia.com/gpu".to_string()),
        Just("nvidia.com/gpu.shared".to_string()),
        Just("nvidia.com/mig-1g.10gb".to_string()),
        Just("nvidia.com/mig-".to_string()),
        Just("amd.com/gpu".to_string()),
        Just("amd.com/cpx_nps4".to_string()),
        Just("amd.com/spx_nps1".to_string()),
        Just("habana.ai/gaudi".to_string()),
        Just("gpu.intel.com/i915".to_string()),
        Just("huawei.com/Ascend910".to_string()),
        Just("huawei.com/Ascend910-".to_string()),
        Just("huawei.com/Ascend910-4c".to_string()),
        Just("aws.amazon.com/neuron".to_string()),
        Just("aws.amazon.com/neuroncore".to_string()),
        Just("google.com/tpu".to_string()),
        Just("cpu".to_string()),
        Just("memory".to_string()),
        "(nvidia\\.com|amd\\.com|huawei\\.com|gpu\\.intel\\.com|aws\\.amazon\\.com)/[a-zA-Z0-9_.-]{0,12}",
    ]
}

fn arb_label_key() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("nvidia.com/gpu.product".to_string()),
        Just("nvidia.com/gpu.memory".to_string()),
        Just("nvidia.com/gpu.compute.major".to_string()),
        Just("nvidia.com/gpu.compute.minor".to_string()),
        Just("nvidia.com/cuda.driver-version.major".to_string()),
        Just("nvidia.com/cuda.driver-version.minor".to_string()),
        Just("nvidia.com/cuda.driver-version.revision".to_string()),
        Just("nvidia.com/mig.strategy".to_string()),
        Just("nvidia.com/gpu.sharing-strategy".to_string()),
        Just("nvidia.com/mig-1g.10gb.memory".to_string()),
        Just("amd.com/gpu.product-name".to_string()),
        Just("amd.com/gpu.vram".to_string()),
        Just("amd.com/gpu.compute-memory-partition".to_string()),
        Just("gpu.intel.com/product".to_string()),
        Just("gpu.intel.com/memory.max".to_string()),
        Just("gpu.intel.com/device.count".to_string()),
        Just("gpu.intel.com/millicores".to_string()),
        Just("accelerator".to_string()),
        Just("accelerator-type".to_string()),
        Just("node.kubernetes.io/npu.chip.name".to_string()),
        Just("mind-cluster/npu-chip-memory".to_string()),
        Just("node.kubernetes.io/instance-type".to_string()),
        Just("cloud.google.com/gke-tpu-accelerator".to_string()),
        Just("cloud.google.com/gke-tpu-topology".to_string()),
        Just(MODEL_LABEL.to_string()),
        "[a-z./-]{1,20}",
    ]
}

fn arb_label_value() -> impl Strategy<Value = String> {
    prop_oneof![
        "[0-9]{0,22}",
        "[0-9]{1,4}[GMT]?",
        "[A-Za-z0-9_.-]{0,20}(-MIG-[0-9a-z.]{0,6}|-SHARED)?",
        "(spx|cpx|dpx)_nps[0-9x]{0,3}",
        "(trn1|inf2|dl1|trn2)\\.[a-z0-9]{0,8}",
        ".{0,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn read_node_never_panics(
        labels in prop::collection::btree_map(arb_label_key(), arb_label_value(), 0..12),
        capacity in prop::collection::btree_map(arb_key(), arb_quantity(), 0..8),
        allocatable in prop::collection::btree_map(arb_key(), arb_quantity(), 0..8),
    ) {
        let node = Node {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("fuzz".to_string()),
                labels: Some(labels),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::core::v1::NodeStatus {
                capacity: Some(capacity.into_iter().map(|(k, v)| (k, Quantity(v))).collect()),
                allocatable: Some(allocatable.into_iter().map(|(k, v)| (k, Quantity(v))).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let n = read_node(&node);
        for g in &n.groups {
            prop_assert!(g.allocatable <= g.capacity);
            prop_assert!(g.capacity > 0);
            prop_assert!(!g.variant.model.is_empty());
            prop_assert!(!g.variant.resource_name.is_empty());
            // A partition names its profile; time-shared replicas may name the MIG
            // slice they replicate; nothing else has one.
            prop_assert!(
                match g.variant.sharing {
                    SharingMode::Partition => g.variant.partition_profile.is_some(),
                    SharingMode::TimeShare => true,
                    _ => g.variant.partition_profile.is_none(),
                },
                "{:?}", g.variant
            );
            for (k, v) in &g.pin_labels {
                prop_assert_eq!(n.labels.get(k), Some(v));
            }
        }
        // Reading is a pure function of the Node.
        prop_assert_eq!(read_node(&node), n);
    }

    #[test]
    fn synthetic_fleets_read_cleanly(seed in any::<u64>(), size in 1usize..60) {
        let fleet = synthetic::generate_fleet(size, seed);
        prop_assert_eq!(fleet.len(), size);
        let inv = Inventory::from_nodes(&fleet);
        prop_assert_eq!(inv.nodes.len(), size);
        for n in inv.nodes.values() {
            prop_assert!(n.warnings.is_empty(), "{:?}", n.warnings);
        }
    }
}

/// Habana feature discovery labels (HabanaAI habanalabs-feature-discovery README:
/// `habana.ai/device.count`, `habana.ai/machine.type`, `habana.ai/driver.version`;
/// the issue's `habana.ai/device.type` and `habana.ai/device.id`). PCI IDs from the
/// habanalabs kernel driver (`PCI_IDS_GAUDI2 0x1020`, `PCI_IDS_GAUDI3 0x1060`,
/// HabanaAI/drivers.accel.habanalabs.kernel `habanalabs_drv.c`). A value kaccel does
/// not know is unclassified, never guessed.
#[test]
fn habana_feature_discovery_schemes() {
    let read = |labels: &str| {
        read_node(&node(&format!(
            r#"
metadata:
  name: gaudi-01
  labels: {{habana.ai/device.count: "8", habana.ai/driver.version: 1.18.0-524, {labels}}}
status:
  capacity: {{habana.ai/gaudi: "8"}}
  allocatable: {{habana.ai/gaudi: "8"}}
"#
        )))
    };
    let by_type = read("habana.ai/device.type: GAUDI3");
    let g = group(&by_type, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi3");
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.pin_labels, pins(&[("habana.ai/device.type", "GAUDI3")]));

    let by_id = read("habana.ai/device.id: \"1020\"");
    let g = group(&by_id, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi2");
    assert_eq!(g.pin_labels, pins(&[("habana.ai/device.id", "1020")]));

    let unknown = read("habana.ai/device.type: GAUDI9");
    assert!(unknown.groups.is_empty(), "{:#?}", unknown.groups);
    assert_eq!(unknown.unclassified.len(), 1);
    assert_eq!(unknown.unclassified[0].count, 8);
    assert!(unknown.warnings.iter().any(|w| w.contains("GAUDI9")));
}

/// Ascend schemes beyond first-generation 910 (MindCluster "创建节点标签" table:
/// `accelerator-type` `module-a3-16` for A200T A3 Box8, `module-a3-16-super-pod` for
/// Atlas 900 A3 SuperPoD; Ascend 950 nodes through `huawei.com/npu` with
/// `350-Atlas-*` / `850-*` / `950-SuperPod-*` form factors, mind-cluster
/// `ASCEND_950_NPU_NUM`). An A3 node is never the first-generation 910 variant, nor
/// selected by its flavor; an unknown form factor is unclassified.
#[test]
fn ascend_a3_npu_and_unknown_form_factors() {
    let read = |accel_type: &str, resource: &str| {
        read_node(&node(&format!(
            r#"
metadata:
  name: npu-01
  labels: {{accelerator: huawei-Ascend910, accelerator-type: {accel_type}}}
status:
  capacity: {{"{resource}": "16"}}
  allocatable: {{"{resource}": "16"}}
"#
        )))
    };
    let first_gen = read("module", "huawei.com/Ascend910");
    let a3 = read("module-a3-16-super-pod", "huawei.com/Ascend910");
    let g1 = group(&first_gen, "huawei.com/Ascend910");
    let g3 = group(&a3, "huawei.com/Ascend910");
    assert_eq!(g1.variant.model, "Ascend910");
    assert_eq!(g3.variant.model, "Ascend910A3");
    assert_ne!(g1.variant, g3.variant);
    // Pure: each flavor's pins are not all carried by the other node.
    assert!(
        g1.pin_labels
            .iter()
            .any(|(k, v)| a3.labels.get(k) != Some(v))
    );
    assert!(
        g3.pin_labels
            .iter()
            .any(|(k, v)| first_gen.labels.get(k) != Some(v))
    );

    let a5 = read("950-SuperPod-Atlas-8", "huawei.com/npu");
    let g5 = group(&a5, "huawei.com/npu");
    assert_eq!(g5.variant.model, "Ascend950");
    assert_eq!(g5.variant.sharing, SharingMode::Whole);

    let unknown = read("module-z9-64", "huawei.com/Ascend910");
    assert!(unknown.groups.is_empty(), "{:#?}", unknown.groups);
    assert_eq!(unknown.unclassified[0].source, "huawei.com/Ascend910");
    assert!(unknown.has_accelerators());
}
