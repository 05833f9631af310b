//! A fleet written from what NVIDIA's and AMD's own labellers and device plugins
//! publish (not from kaccel's output), and the adapter tests that read it.
//!
//! Sources, each node's comment names the code path it follows:
//! - NVIDIA: NVIDIA/k8s-device-plugin v0.20.0 (commit 1b826acc, 2026-08-19),
//!   GFD label code `internal/lm/resource.go` (`baseLabeler`: `<resource>.product`,
//!   `.count`, `.replicas`, `.sharing-strategy`; `getProductName` appends `-SHARED`
//!   when replicas > 1 and the resource is not renamed; `NewMIGResourceLabeler`:
//!   `<model>-MIG-<profile>`) and `internal/lm/mig-strategy.go` (MIG-enabled cards
//!   labelled without sharing: replicas 0; `nvidia.com/mig.strategy`).
//! - AMD: ROCm/k8s-device-plugin v1.31.0.10-16-ged764684 (2026-08-11),
//!   `cmd/k8s-node-labeller/main.go` (`createLabelPrefix` = `<prefix>/gpu.<name>`,
//!   `createLabels`: `<key>=<value>` when all GPUs agree, `<key>.<value>=<count>`
//!   otherwise and always under `beta.`; the `compute-memory-partition` generator,
//!   lower-case `cpx_nps4`, only on homogeneous nodes) and
//!   `cmd/k8s-device-plugin/main.go` (`getResourceList`: `single` -> `amd.com/gpu`,
//!   `mixed` -> `amd.com/<compute>_<memory>`); the legacy value-in-key scheme from the
//!   same file at commit 06c7abd6 (2019: `beta.amd.com/gpu.family.AI=8`,
//!   `beta.amd.com/gpu.vram.64G=4`, `beta.amd.com/gpu.device-id.740f=4`, no product).

use k8s_openapi::api::core::v1::Node;

/// (node name, YAML) for every node of the fleet.
pub(crate) const NODES: &[(&str, &str)] = &[
    // GFD, whole GPUs: replicas 1, sharing-strategy none (baseLabeler with no
    // replicated resource), mig.strategy single with MIG disabled.
    (
        "nv-h100-whole",
        r#"
metadata:
  name: nv-h100-whole
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "1"
    nvidia.com/gpu.sharing-strategy: none
    nvidia.com/gpu.memory: "81559"
    nvidia.com/gpu.family: hopper
    nvidia.com/gpu.compute.major: "9"
    nvidia.com/gpu.compute.minor: "0"
    nvidia.com/mig.capable: "true"
    nvidia.com/mig.strategy: single
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, nvidia.com/gpu: "8"}
  allocatable: {cpu: "191", memory: 2Ti, nvidia.com/gpu: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // GFD, time-slicing with renameByDefault: the resource is nvidia.com/gpu.shared,
    // the labels stay under nvidia.com/gpu.* and the product is NOT suffixed.
    (
        "nv-h100-ts-renamed",
        r#"
metadata:
  name: nv-h100-ts-renamed
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "4"
    nvidia.com/gpu.sharing-strategy: time-slicing
    nvidia.com/gpu.memory: "81559"
    nvidia.com/gpu.family: hopper
    nvidia.com/gpu.compute.major: "9"
    nvidia.com/gpu.compute.minor: "0"
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, nvidia.com/gpu.shared: "32"}
  allocatable: {cpu: "191", memory: 2Ti, nvidia.com/gpu.shared: "32"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // GFD, MIG mixed with every card MIG-enabled: nvidia.com/gpu.* labelled without
    // sharing (replicas 0), no whole GPU advertised; per-profile labels under the MIG
    // resource name. The base product equals the whole-GPU node's of that model.
    (
        "nv-a100-mig-mixed",
        r#"
metadata:
  name: nv-a100-mig-mixed
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "0"
    nvidia.com/gpu.sharing-strategy: none
    nvidia.com/gpu.memory: "81920"
    nvidia.com/mig.capable: "true"
    nvidia.com/mig.strategy: mixed
    nvidia.com/mig-1g.10gb.product: NVIDIA-A100-SXM4-80GB-MIG-1g.10gb
    nvidia.com/mig-1g.10gb.count: "56"
    nvidia.com/mig-1g.10gb.replicas: "1"
    nvidia.com/mig-1g.10gb.sharing-strategy: none
    nvidia.com/mig-1g.10gb.memory: "9728"
    nvidia.com/mig-1g.10gb.multiprocessors: "14"
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, nvidia.com/gpu: "0", nvidia.com/mig-1g.10gb: "56"}
  allocatable: {cpu: "191", memory: 2Ti, nvidia.com/gpu: "0", nvidia.com/mig-1g.10gb: "56"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // A whole-GPU A100 node of the same model: the MIG flavor must not select it and
    // its whole flavor must not select the MIG node above.
    (
        "nv-a100-whole",
        r#"
metadata:
  name: nv-a100-whole
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "1"
    nvidia.com/gpu.sharing-strategy: none
    nvidia.com/gpu.memory: "81920"
    nvidia.com/mig.capable: "true"
    nvidia.com/mig.strategy: mixed
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, nvidia.com/gpu: "8"}
  allocatable: {cpu: "191", memory: 2Ti, nvidia.com/gpu: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // GFD, MIG single combined with time-slicing (2 replicas per 1g.5gb slice, not
    // renamed): `<model>-MIG-<profile>` then `-SHARED`.
    (
        "nv-a100-mig-single-shared",
        r#"
metadata:
  name: nv-a100-mig-single-shared
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB-MIG-1g.5gb-SHARED
    nvidia.com/gpu.count: "56"
    nvidia.com/gpu.replicas: "2"
    nvidia.com/gpu.sharing-strategy: time-slicing
    nvidia.com/gpu.memory: "4864"
    nvidia.com/mig.strategy: single
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "96", memory: 1Ti, nvidia.com/gpu: "112"}
  allocatable: {cpu: "95", memory: 1Ti, nvidia.com/gpu: "112"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // GFD, MIG mixed combined with time-slicing (4 replicas per 1g.10gb slice, not
    // renamed): the per-profile product carries `-SHARED`.
    (
        "nv-a100-mig-mixed-shared",
        r#"
metadata:
  name: nv-a100-mig-mixed-shared
  labels:
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.replicas: "0"
    nvidia.com/gpu.sharing-strategy: none
    nvidia.com/mig.strategy: mixed
    nvidia.com/mig-1g.10gb.product: NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED
    nvidia.com/mig-1g.10gb.count: "56"
    nvidia.com/mig-1g.10gb.replicas: "4"
    nvidia.com/mig-1g.10gb.sharing-strategy: time-slicing
    nvidia.com/mig-1g.10gb.memory: "9728"
spec:
  taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, nvidia.com/mig-1g.10gb: "224"}
  allocatable: {cpu: "191", memory: 2Ti, nvidia.com/mig-1g.10gb: "224"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // ROCm labeller + plugin `single` naming, SPX/NPS1: 8 whole GPUs as amd.com/gpu.
    (
        "amd-mi300x-spx",
        r#"
metadata:
  name: amd-mi300x-spx
  labels:
    amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    beta.amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM: "8"
    amd.com/gpu.family: AI
    amd.com/gpu.device-id: 74a1
    amd.com/gpu.vram: 192G
    amd.com/gpu.cu-count: "304"
    amd.com/gpu.driver-version: 6.10.5
    amd.com/gpu.compute-memory-partition: spx_nps1
    amd.com/gpu.compute-partitioning-supported: "true"
    amd.com/gpu.memory-partitioning-supported: "true"
spec:
  taints: [{key: amd.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, amd.com/gpu: "8"}
  allocatable: {cpu: "191", memory: 2Ti, amd.com/gpu: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // ROCm `single` naming, CPX/NPS4: the 64 partitions are amd.com/gpu too; only the
    // partition label tells them from whole GPUs (the issue's 72-"whole"-GPU case).
    (
        "amd-mi300x-cpx-single",
        r#"
metadata:
  name: amd-mi300x-cpx-single
  labels:
    amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    beta.amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM: "64"
    amd.com/gpu.family: AI
    amd.com/gpu.device-id: 74a1
    amd.com/gpu.vram: 48G
    amd.com/gpu.cu-count: "38"
    amd.com/gpu.driver-version: 6.10.5
    amd.com/gpu.compute-memory-partition: cpx_nps4
    amd.com/gpu.compute-partitioning-supported: "true"
    amd.com/gpu.memory-partitioning-supported: "true"
spec:
  taints: [{key: amd.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, amd.com/gpu: "64"}
  allocatable: {cpu: "191", memory: 2Ti, amd.com/gpu: "64"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // ROCm `mixed` naming, CPX/NPS4: amd.com/cpx_nps4.
    (
        "amd-mi300x-cpx-mixed",
        r#"
metadata:
  name: amd-mi300x-cpx-mixed
  labels:
    amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM
    amd.com/gpu.family: AI
    amd.com/gpu.device-id: 74a1
    amd.com/gpu.vram: 48G
    amd.com/gpu.compute-memory-partition: cpx_nps4
    amd.com/gpu.compute-partitioning-supported: "true"
spec:
  taints: [{key: amd.com/gpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "192", memory: 2Ti, amd.com/cpx_nps4: "64"}
  allocatable: {cpu: "191", memory: 2Ti, amd.com/cpx_nps4: "64"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // The 2019 labeller (value-in-key under beta., no product name) on MI210s.
    (
        "amd-mi210-legacy",
        r#"
metadata:
  name: amd-mi210-legacy
  labels:
    beta.amd.com/gpu.family.AI: "4"
    beta.amd.com/gpu.device-id.740f: "4"
    beta.amd.com/gpu.vram.64G: "4"
    beta.amd.com/gpu.cu-count.104: "4"
    beta.amd.com/gpu.simd-count.416: "4"
status:
  capacity: {cpu: "64", memory: 512Gi, amd.com/gpu: "4"}
  allocatable: {cpu: "63", memory: 512Gi, amd.com/gpu: "4"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
];

pub(crate) fn fleet() -> Vec<Node> {
    NODES
        .iter()
        .map(|(_, yaml)| super::tests::node(yaml))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::super::tests::{group, node, pins};
    use super::super::{Inventory, SharingMode, read_node};
    use super::*;

    fn read(name: &str) -> super::super::NodeInventory {
        let (_, yaml) = NODES.iter().find(|(n, _)| *n == name).expect("fixture");
        read_node(&node(yaml))
    }

    #[test]
    fn the_fleet_reads_without_warnings() {
        let inv = Inventory::from_nodes(&fleet());
        for n in inv.nodes.values() {
            assert!(n.warnings.is_empty(), "{}: {:?}", n.name, n.warnings);
            assert!(n.has_accelerators(), "{}", n.name);
        }
    }

    #[test]
    fn amd_single_naming_cpx_node_is_partitions_not_whole() {
        let n = read("amd-mi300x-cpx-single");
        let g = group(&n, "amd.com/gpu");
        assert_eq!(g.variant.sharing, SharingMode::Partition);
        assert_eq!(g.variant.partition_profile.as_deref(), Some("cpx_nps4"));
        assert_eq!(g.capacity, 64);
        assert_eq!(
            g.pin_labels,
            pins(&[
                ("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM"),
                ("amd.com/gpu.compute-memory-partition", "cpx_nps4"),
            ])
        );
        let spx = read("amd-mi300x-spx");
        let g = group(&spx, "amd.com/gpu");
        assert_eq!(g.variant.sharing, SharingMode::Whole);
        assert_eq!(
            g.pin_labels.get("amd.com/gpu.compute-memory-partition"),
            Some(&"spx_nps1".to_string())
        );
    }

    #[test]
    fn amd_mixed_naming_pins_the_partition() {
        let n = read("amd-mi300x-cpx-mixed");
        let g = group(&n, "amd.com/cpx_nps4");
        assert_eq!(g.variant.sharing, SharingMode::Partition);
        assert_eq!(
            g.pin_labels.get("amd.com/gpu.compute-memory-partition"),
            Some(&"cpx_nps4".to_string())
        );
    }

    #[test]
    fn amd_legacy_value_in_key_labels_are_read() {
        let n = read("amd-mi210-legacy");
        let g = group(&n, "amd.com/gpu");
        assert_eq!(g.variant.model, "AMD_Instinct_MI210");
        assert_eq!(g.variant.sharing, SharingMode::Whole);
        assert_eq!(g.memory_mib, Some(64 * 1024));
        assert_eq!(g.architecture.as_deref(), Some("cdna2"));
        assert_eq!(
            g.pin_labels,
            pins(&[("beta.amd.com/gpu.device-id.740f", "4")])
        );
    }

    /// A partition-capable MI300X counted as amd.com/gpu by a labeller that wrote no
    /// partition label (the 2024 product-name labeller, or the 2019 one) may be 64 CPX
    /// partitions: never read as whole GPUs.
    #[test]
    fn amd_mi300x_without_partition_label_is_not_whole() {
        for labels in [
            "{amd.com/gpu.product-name: AMD_Instinct_MI300X_OAM, amd.com/gpu.vram: 24G}",
            "{beta.amd.com/gpu.device-id.74a1: \"64\", beta.amd.com/gpu.vram.24G: \"64\"}",
        ] {
            let n = read_node(&node(&format!(
                "metadata: {{name: x, labels: {labels}}}\nstatus: {{capacity: {{amd.com/gpu: \"64\"}}, allocatable: {{amd.com/gpu: \"64\"}}}}"
            )));
            assert!(n.groups.is_empty(), "{labels}: {:?}", n.groups);
            // Listed as unclassified, with the adapter's reason; never CPU-only.
            assert!(n.has_accelerators());
            assert_eq!(n.unclassified.len(), 1, "{:?}", n.unclassified);
            assert_eq!(n.unclassified[0].source, "amd.com/gpu");
            assert_eq!(n.unclassified[0].count, 64);
            assert!(
                n.unclassified[0].reason.contains("partition"),
                "{}",
                n.unclassified[0].reason
            );
            assert!(
                n.warnings
                    .iter()
                    .any(|w| w.contains("amd.com/gpu.compute-memory-partition")),
                "{:?}",
                n.warnings
            );
        }
    }

    #[test]
    fn nvidia_whole_flavor_pins_exclusive_replicas() {
        let whole = read("nv-a100-whole");
        assert_eq!(
            group(&whole, "nvidia.com/gpu").pin_labels,
            pins(&[
                ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
                ("nvidia.com/gpu.replicas", "1"),
            ])
        );
        // The all-MIG node advertises no whole GPU and carries replicas 0.
        let mig = read("nv-a100-mig-mixed");
        assert!(
            mig.groups
                .iter()
                .all(|g| g.variant.resource_name != "nvidia.com/gpu")
        );
        let g = group(&mig, "nvidia.com/mig-1g.10gb");
        assert_eq!(g.variant.sharing, SharingMode::Partition);
        assert_eq!(g.variant.model, "NVIDIA-A100-SXM4-80GB");
        assert_eq!(
            g.pin_labels,
            pins(&[
                (
                    "nvidia.com/mig-1g.10gb.product",
                    "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
                ),
                ("nvidia.com/mig-1g.10gb.replicas", "1"),
            ])
        );
    }

    #[test]
    fn nvidia_renamed_time_share_pins_its_strategy() {
        let n = read("nv-h100-ts-renamed");
        let g = group(&n, "nvidia.com/gpu.shared");
        assert_eq!(g.variant.sharing, SharingMode::TimeShare);
        assert_eq!(g.variant.model, "NVIDIA-H100-80GB-HBM3");
        assert_eq!(
            g.pin_labels,
            pins(&[
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
                ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
            ])
        );
    }

    #[test]
    fn nvidia_mig_with_time_slicing_is_time_share_not_partition() {
        let single = read("nv-a100-mig-single-shared");
        let g = group(&single, "nvidia.com/gpu");
        assert_eq!(g.variant.sharing, SharingMode::TimeShare);
        assert_eq!(g.variant.model, "NVIDIA-A100-SXM4-40GB");
        assert_eq!(g.variant.partition_profile.as_deref(), Some("1g.5gb"));
        let mixed = read("nv-a100-mig-mixed-shared");
        let g = group(&mixed, "nvidia.com/mig-1g.10gb");
        assert_eq!(g.variant.sharing, SharingMode::TimeShare);
        assert_eq!(g.variant.partition_profile.as_deref(), Some("1g.10gb"));
        // Renamed replicas of a MIG slice: `nvidia.com/mig-<profile>.shared`.
        let renamed = read_node(&node(
            r#"
metadata:
  name: renamed
  labels:
    nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB
    nvidia.com/mig.strategy: mixed
    nvidia.com/mig-1g.10gb.product: NVIDIA-A100-SXM4-80GB-MIG-1g.10gb
    nvidia.com/mig-1g.10gb.replicas: "4"
    nvidia.com/mig-1g.10gb.sharing-strategy: time-slicing
status:
  capacity: {nvidia.com/mig-1g.10gb.shared: "224"}
  allocatable: {nvidia.com/mig-1g.10gb.shared: "224"}
"#,
        ));
        let g = group(&renamed, "nvidia.com/mig-1g.10gb.shared");
        assert_eq!(g.variant.sharing, SharingMode::TimeShare);
        assert_eq!(g.variant.partition_profile.as_deref(), Some("1g.10gb"));
        assert_eq!(
            g.pin_labels.get("nvidia.com/mig-1g.10gb.sharing-strategy"),
            Some(&"time-slicing".to_string())
        );
    }
}
