//! Property tests: no Node panics read_node, synthetic fleets read cleanly.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use proptest::prelude::*;

use super::*;

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
                prop_assert_eq!(n.labels.get(k), Some(v.as_str()));
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
