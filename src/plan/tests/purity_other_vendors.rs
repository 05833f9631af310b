//! The purity check and invariant 1 per variant on the Huawei, AWS, Intel and Google
//! fleet (`crate::inventory::vendor_fleet_other`, DRA ResourceSlices included), alone
//! and mixed with the synthetic and NVIDIA/AMD fleets.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use proptest::prelude::*;

use super::*;
use crate::api::HardwareSelector;
use crate::inventory::synthetic::generate_fleet;
use crate::inventory::vendor_fleet_nvidia_amd::{self as vendor_fleet, NODES};
use crate::inventory::vendor_fleet_other as other_fleet;

/// Classes for the Huawei / AWS / DRA fleet: whole devices of every vendor, Ascend
/// 4-core vNPUs, NeuronCores; each granted generously.
fn other_fleet_classes(
    selectors: &[(&str, BTreeMap<String, String>)],
) -> (Vec<AcceleratorClass>, Vec<CreditBudget>) {
    let sel = |profile: Option<&str>, name: &str| HardwareSelector {
        partition_profile: profile.map(str::to_string),
        node_labels: selectors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| l.clone())
            .unwrap_or_default(),
        ..Default::default()
    };
    let classes = vec![
        class("whole", SharingMode::Whole, sel(None, "whole")),
        class(
            "vnpu-4c",
            SharingMode::Partition,
            sel(Some("4c"), "vnpu-4c"),
        ),
        class(
            "neuroncores",
            SharingMode::Partition,
            sel(Some("neuroncore"), "neuroncores"),
        ),
    ];
    let budgets = vec![budget(
        "team",
        &["team"],
        &[
            ("whole", 10_000),
            ("vnpu-4c", 10_000),
            ("neuroncores", 10_000),
        ],
    )];
    (classes, budgets)
}

/// Ascend, issue case (b): a first-generation 910 node without accelerator-type beside
/// an Atlas A3 node. The device plugin's servertype (`Ascend910-32` vs
/// `Ascend910A3-20`) is pinned, so both flavors are pure; without it (an older plugin)
/// the 910 flavor would select the A3 node and is refused, naming the labels that tell
/// them apart.
#[test]
fn ascend_first_generation_beside_a3() {
    let (classes, budgets) = other_fleet_classes(&[]);
    let health = HealthSnapshot::default();
    let nodes = vec![
        other_fleet::node("ascend910-servertype"),
        other_fleet::node("ascend910a3"),
    ];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let first_gen = plan
        .resource_flavors
        .iter()
        .find(|f| plan.flavors[f.metadata.name.as_ref().unwrap()].model == "Ascend910")
        .expect("a first-generation 910 flavor");
    assert_eq!(
        first_gen
            .spec
            .node_labels
            .get("servertype")
            .map(String::as_str),
        Some("Ascend910-32")
    );

    let mut bare = other_fleet::node("ascend910-servertype");
    bare.metadata.labels.as_mut().unwrap().remove("servertype");
    let nodes = vec![bare, other_fleet::node("ascend910a3")];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let refused: Vec<&ImpureFlavor> = plan
        .impure_flavors
        .iter()
        .filter(|i| i.variant.model == "Ascend910")
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", refused_messages(&plan));
    assert_eq!(refused[0].foreign_nodes, ["ascend910a3"]);
    let message = refused[0].message();
    assert!(
        message.contains("accelerator-type") && message.contains("servertype"),
        "{message}"
    );
    // The A3 flavor is pinned by its accelerator-type: still emitted.
    assert!(plan.flavors.values().any(|r| r.model == "Ascend910A3"));
}

/// Ascend, issue case (a): static vNPU nodes carry exactly the labels of whole-NPU
/// nodes of the same chip (the device plugin writes no label saying a template
/// exists), so the 4c flavor would select the whole-only node: refused, naming the
/// fix. With the platform team's own label selected by each class, both are pure.
#[test]
fn ascend_vnpu_beside_whole_npus() {
    let health = HealthSnapshot::default();
    let nodes = vec![
        other_fleet::node("ascend910b3-whole"),
        other_fleet::node("ascend910b3-vnpu"),
    ];
    let (classes, budgets) = other_fleet_classes(&[]);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let refused: Vec<&ImpureFlavor> = plan
        .impure_flavors
        .iter()
        .filter(|i| i.variant.partition_profile.as_deref() == Some("4c"))
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", refused_messages(&plan));
    assert_eq!(refused[0].foreign_nodes, ["ascend910b3-whole"]);
    let message = refused[0].message();
    assert!(
        message.contains("static vNPU") && message.contains("spec.selector.nodeLabels"),
        "{message}"
    );
    assert!(plan.classes["vnpu-4c"].flavors.is_empty());
    assert!(
        plan.classes["vnpu-4c"]
            .conditions
            .iter()
            .any(|c| c.reason == "ImpureFlavor" && c.message.contains("static vNPU"))
    );

    // The fix the message names.
    let mut nodes = nodes;
    for (node, mode) in nodes.iter_mut().zip(["whole", "vnpu"]) {
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("npu-mode".into(), mode.into());
    }
    let label = |v: &str| BTreeMap::from([("npu-mode".to_string(), v.to_string())]);
    let (classes, budgets) =
        other_fleet_classes(&[("vnpu-4c", label("vnpu")), ("whole", label("whole"))]);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let vnpu = &plan.classes["vnpu-4c"].flavors;
    assert_eq!(vnpu.len(), 1);
    assert_eq!(plan.flavors[&vnpu[0].name].healthy_capacity, 20);
}

/// Neuron views on a partly labelled fleet: the view is pinned where the label names
/// it, so the `device`-labelled and `core`-labelled flavors are pure; the device flavor
/// of the unlabelled node cannot exclude the core node (nodeLabels cannot require a
/// label's absence) and is refused, naming the label to set. Labelled throughout, the
/// fleet plans with no refusal.
#[test]
fn neuron_views_on_a_partly_labelled_fleet() {
    let health = HealthSnapshot::default();
    let (classes, budgets) = other_fleet_classes(&[]);
    let nodes: Vec<Node> = ["trn1-unlabelled", "trn1-device", "trn1-core"]
        .iter()
        .map(|n| other_fleet::node(n))
        .collect();
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    assert_eq!(
        plan.impure_flavors.len(),
        1,
        "{:?}",
        refused_messages(&plan)
    );
    let refused = &plan.impure_flavors[0];
    assert_eq!(refused.variant.resource_name, "aws.amazon.com/neuron");
    assert!(!refused.node_labels.contains_key("kaccel.io/neuron.view"));
    assert_eq!(refused.foreign_nodes, ["trn1-core"]);
    assert!(
        refused.message().contains("kaccel.io/neuron.view=device"),
        "{}",
        refused.message()
    );
    let views: Vec<Option<&str>> = plan
        .resource_flavors
        .iter()
        .filter(|f| plan.flavors[f.metadata.name.as_ref().unwrap()].vendor == Some(Vendor::Aws))
        .map(|f| {
            f.spec
                .node_labels
                .get("kaccel.io/neuron.view")
                .map(String::as_str)
        })
        .collect();
    assert_eq!(views.len(), 2, "{views:?}");
    assert!(views.contains(&Some("device")) && views.contains(&Some("core")));

    let labelled: Vec<Node> = nodes[1..].to_vec();
    let (plan, inventory) = run(&classes, &budgets, &labelled, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let cores = &plan.classes["neuroncores"].flavors;
    assert_eq!(cores.len(), 1);
    assert_eq!(plan.flavors[&cores[0].name].healthy_capacity, 32);
}

/// DRA-only flavors are checked against the nodes publishing their DeviceClass: an
/// unpinned Gaudi2 flavor would also select the Gaudi3 node (same DeviceClass) and is
/// refused, naming the label that pins it; the TPU and Intel GPU nodes (other classes)
/// do not count against it. Pinned, every flavor is emitted.
#[test]
fn dra_flavors_are_pure_per_device_class() {
    let health = HealthSnapshot::default();
    let (classes, budgets) = other_fleet_classes(&[]);
    let names = ["gaudi2-dra", "gaudi3-dra", "max1550-dra", "tpu-v6e-dra"];
    let mut nodes: Vec<Node> = names.iter().map(|n| other_fleet::node(n)).collect();
    let slices: Vec<ResourceSlice> = names
        .iter()
        .flat_map(|n| other_fleet::slices_of(n))
        .collect();
    let (plan, inventory) = run_with_slices(&classes, &budgets, &nodes, &slices, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    assert_eq!(
        plan.impure_flavors.len(),
        1,
        "{:?}",
        refused_messages(&plan)
    );
    let refused = &plan.impure_flavors[0];
    assert_eq!(refused.variant.model, "Gaudi2");
    assert_eq!(refused.foreign_nodes, ["gaudi3-dra"]);
    assert!(
        refused
            .message()
            .contains("kaccel.io/accelerator.model=Gaudi2"),
        "{}",
        refused.message()
    );
    let emitted: BTreeMap<&str, u64> = plan
        .flavors
        .values()
        .map(|r| (r.model.as_str(), r.healthy_capacity))
        .collect();
    assert_eq!(
        emitted,
        BTreeMap::from([("Gaudi3", 2), ("Max_1550", 2), ("tpu-v6e-slice", 4)])
    );

    nodes[0]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(crate::inventory::MODEL_LABEL.into(), "Gaudi2".into());
    let (plan, inventory) = run_with_slices(&classes, &budgets, &nodes, &slices, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let gaudi2 = plan
        .flavors
        .values()
        .find(|r| r.model == "Gaudi2")
        .expect("Gaudi2 flavor");
    // 7 Gaudi2 published, one unhealthy (healthy: false); the Unknown one is not a Gaudi2.
    assert_eq!(gaudi2.healthy_capacity, 6);
}

/// Labels the other fleet's nodes may lose (an older device plugin, a platform team
/// that labelled only some nodes).
const OTHER_DROPPABLE: [&str; 5] = [
    "servertype",
    "accelerator-type",
    "kaccel.io/neuron.view",
    "kaccel.io/accelerator.model",
    "gpu.intel.com/product",
];

fn arb_fleet_with_dra() -> impl Strategy<Value = (Vec<Node>, Vec<ResourceSlice>)> {
    (
        0usize..20,
        any::<u64>(),
        prop::collection::vec((0..other_fleet::NODES.len(), any::<u8>()), 0..16),
        prop::collection::vec((0..NODES.len(), any::<u8>()), 0..6),
    )
        .prop_map(|(synthetic, seed, picks, nv_amd)| {
            let mut nodes = generate_fleet(synthetic, seed);
            let mut slices = Vec::new();
            for (i, (pick, drops)) in picks.into_iter().enumerate() {
                let name = other_fleet::NODES[pick].0;
                let (mut node, node_slices) = other_fleet::renamed(name, &format!("{name}-{i}"));
                if let Some(labels) = node.metadata.labels.as_mut() {
                    for (bit, key) in OTHER_DROPPABLE.iter().enumerate() {
                        if drops & (1 << bit) != 0 && drops >> 5 == 0 {
                            labels.remove(*key);
                        }
                    }
                }
                // Now and then a driver's slices are not there (yet).
                if drops != 0xff {
                    slices.extend(node_slices);
                }
                nodes.push(node);
            }
            let vendor = vendor_fleet::fleet();
            for (i, (pick, _)) in nv_amd.into_iter().enumerate() {
                let mut node = vendor[pick].clone();
                node.metadata.name =
                    Some(format!("{}-v{i}", node.metadata.name.as_deref().unwrap()));
                nodes.push(node);
            }
            (nodes, slices)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// The Huawei, AWS and DRA schemes (with labels randomly missing) mixed with the
    /// synthetic and NVIDIA/AMD fleets, random classes, budgets and health: emitted
    /// flavors are pure (DRA-only ones over their DeviceClass), quota stays within
    /// each variant, and every refusal is reported.
    #[test]
    fn dra_and_other_vendor_flavors_are_pure(
        (classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        (nodes, slices) in arb_fleet_with_dra(),
        seed in any::<u64>(),
    ) {
        let health = arb_health(&nodes, seed);
        let mut all_classes = classes;
        let (extra, extra_budgets) = other_fleet_classes(&[]);
        all_classes.extend(extra);
        let mut all_budgets = budgets;
        all_budgets.extend(extra_budgets);
        let (plan, inventory) = run_with_slices(&all_classes, &all_budgets, &nodes, &slices, &health);
        assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
        // Unclassified devices are never a variant's capacity nor CPU capacity.
        for (node, _) in inventory.unclassified() {
            prop_assert!(node.has_accelerators());
        }
    }
}
