//! Topology objects, flavors' `topologyName`, blocks per class level, and the
//! budget condition, planned from Nodes labelled as the vendors label them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{
    AcceleratorClass, HardwareSelector, HealthCounts, SharingMode, TopologyRequirement,
};
use crate::inventory::Inventory;
use crate::plan::tests::{budget, class};
use crate::plan::{Plan, PlanInput, plan};

const H100: &str = "NVIDIA-H100-80GB-HBM3";
const B200: &str = "NVIDIA-B200";
const ZONE: &str = "topology.kubernetes.io/zone";
const RACK: &str = "topology.kaccel.io/rack";
const HOST: &str = "kubernetes.io/hostname";

/// A node as GPU feature discovery and the device plugin label it, with
/// `topology` labels on top (its hostname label is always set, as the kubelet does).
fn gpu_node(name: &str, product: &str, count: u32, topology: &[(&str, &str)]) -> Node {
    let mut labels = json!({
        HOST: name,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": count.to_string(),
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
    });
    for (k, v) in topology {
        labels[*k] = json!(v);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": count.to_string()},
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": count.to_string()},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("a Node")
}

/// Planner options with Topology Aware Scheduling on (it is off by default).
fn tas() -> PlanOptions {
    PlanOptions {
        topology_aware_scheduling: true,
        ..Default::default()
    }
}

fn training(level: Option<TopologyLevel>) -> AcceleratorClass {
    let mut c = class(
        "large-training",
        SharingMode::Whole,
        HardwareSelector::default(),
    );
    c.spec.topology = level.map(|level| TopologyRequirement { level });
    c
}

fn plan_with(
    classes: &[AcceleratorClass],
    budgets: &[crate::api::CreditBudget],
    nodes: &[Node],
    health: &HealthSnapshot,
    options: &PlanOptions,
) -> Plan {
    let inventory = Inventory::from_nodes_and_slices(nodes, &[]);
    plan(&PlanInput {
        classes,
        budgets,
        inventory: &inventory,
        health,
        options,
    })
}

/// Two racks in one zone: rack-a holds two 8-GPU nodes, rack-b one.
fn two_racks() -> Vec<Node> {
    vec![
        gpu_node("a1", H100, 8, &[(ZONE, "z1"), (RACK, "rack-a")]),
        gpu_node("a2", H100, 8, &[(ZONE, "z1"), (RACK, "rack-a")]),
        gpu_node("b1", H100, 8, &[(ZONE, "z1"), (RACK, "rack-b")]),
    ]
}

fn condition<'a>(conditions: &'a [DesiredCondition], type_: &str) -> &'a DesiredCondition {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} in {conditions:?}"))
}

#[test]
fn nodes_with_zone_and_rack_form_one_topology_the_flavor_names() {
    let plan = plan_with(
        &[training(None)],
        &[],
        &two_racks(),
        &HealthSnapshot::default(),
        &tas(),
    );
    assert_eq!(plan.topologies.len(), 1);
    let topology = &plan.topologies[0];
    let levels = topology.level_labels();
    assert_eq!(levels, [ZONE, RACK, HOST]);
    let name = topology.metadata.name.as_deref().unwrap();
    assert!(name.starts_with("kaccel-zone-rack-host-"), "{name}");
    assert_eq!(
        topology.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        "kaccel"
    );
    assert_eq!(plan.resource_flavors.len(), 1);
    let flavor = &plan.resource_flavors[0];
    assert_eq!(flavor.spec.topology_name.as_deref(), Some(name));
    assert!(!flavor.spec.node_labels.is_empty(), "Kueue requires them");
    // The planned object is what Kueue's API takes.
    let object = serde_json::to_value(topology).unwrap();
    assert_eq!(object["apiVersion"], "kueue.x-k8s.io/v1beta2");
    assert_eq!(object["kind"], "Topology");
    assert_eq!(object["spec"]["levels"][1]["nodeLabel"], RACK);
    // A class with no level still sees the flavor's topology, without blocks.
    let shown = plan.classes["large-training"].flavors[0]
        .topology
        .clone()
        .unwrap();
    assert_eq!((shown.name.as_str(), shown.blocks), (name, None));
    assert!(
        !plan.classes["large-training"]
            .conditions
            .iter()
            .any(|c| c.type_ == TOPOLOGY_CONDITION)
    );
}

#[test]
fn a_class_level_shows_its_blocks_and_failed_or_cordoned_devices_count_against_theirs() {
    let classes = [training(Some(TopologyLevel::Rack))];
    let nodes = two_racks();
    let options = tas();
    let healthy = plan_with(&classes, &[], &nodes, &HealthSnapshot::default(), &options);
    let shown = healthy.classes["large-training"].flavors[0]
        .topology
        .clone()
        .unwrap();
    assert_eq!(shown.level_label.as_deref(), Some(RACK));
    assert_eq!((shown.blocks, shown.largest_block), (Some(2), Some(16)));
    let c = condition(
        &healthy.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!((c.status, c.reason.as_str()), (false, "LevelLabelled"));
    assert!(
        c.message
            .contains("podset-required-topology: topology.kaccel.io/rack")
            && c.message.contains("the fullest holds 16 healthy devices"),
        "{}",
        c.message
    );

    // Three failed GPUs on a1: rack-a keeps 13, still the fullest.
    let mut health = HealthSnapshot::default();
    health.set(
        "a1",
        "nvidia.com/gpu",
        HealthCounts {
            healthy: 5,
            failed: 3,
            ..Default::default()
        },
    );
    let sick = plan_with(&classes, &[], &nodes, &health, &options);
    let shown = sick.classes["large-training"].flavors[0]
        .topology
        .clone()
        .unwrap();
    assert_eq!((shown.blocks, shown.largest_block), (Some(2), Some(13)));

    // a2 cordoned as well: rack-a holds 5, rack-b's 8 is now the fullest.
    let mut cordoned = nodes.clone();
    cordoned[1].spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        unschedulable: Some(true),
        ..Default::default()
    });
    let both = plan_with(&classes, &[], &cordoned, &health, &options);
    let shown = both.classes["large-training"].flavors[0]
        .topology
        .clone()
        .unwrap();
    assert_eq!((shown.blocks, shown.largest_block), (Some(2), Some(8)));
}

#[test]
fn racks_of_the_same_name_in_two_zones_are_two_blocks() {
    let nodes = [
        gpu_node("a1", H100, 8, &[(ZONE, "z1"), (RACK, "r1")]),
        gpu_node("b1", H100, 8, &[(ZONE, "z2"), (RACK, "r1")]),
    ];
    let plan = plan_with(
        &[training(Some(TopologyLevel::Rack))],
        &[],
        &nodes,
        &HealthSnapshot::default(),
        &tas(),
    );
    let shown = plan.classes["large-training"].flavors[0]
        .topology
        .clone()
        .unwrap();
    assert_eq!((shown.blocks, shown.largest_block), (Some(2), Some(8)));
}

#[test]
fn a_node_without_the_rack_label_leaves_the_level_out_and_the_class_is_told() {
    let mut nodes = two_racks();
    nodes.push(gpu_node("c1", H100, 8, &[(ZONE, "z1")]));
    let plan = plan_with(
        &[training(Some(TopologyLevel::Rack))],
        &[],
        &nodes,
        &HealthSnapshot::default(),
        &tas(),
    );
    let levels = plan.topologies[0].level_labels();
    assert_eq!(levels, [ZONE, HOST], "only what every node carries");
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!((c.status, c.reason.as_str()), (true, "LevelNotLabelled"));
    assert!(
        c.message.contains("topology.kaccel.io/rack")
            && c.message.contains("topology.k8s.aws/network-node-layer-3"),
        "names the labels to add: {}",
        c.message
    );
}

#[test]
fn hostnames_alone_make_no_topology() {
    let nodes = [gpu_node("a1", H100, 8, &[])];
    let plan = plan_with(
        &[training(None)],
        &[],
        &nodes,
        &HealthSnapshot::default(),
        &tas(),
    );
    assert!(plan.topologies.is_empty());
    assert_eq!(plan.resource_flavors[0].spec.topology_name, None);
}

#[test]
fn gke_and_eks_label_schemes_form_two_topologies_and_the_class_names_both_labels() {
    // GKE's reserved-block labels on the H100 nodes, EKS's network layers on the B200s.
    let gke = |name: &str, block: &str| {
        gpu_node(
            name,
            H100,
            8,
            &[
                (ZONE, "us-central1-a"),
                ("cloud.google.com/gce-topology-block", block),
                ("cloud.google.com/gce-topology-subblock", "sb-1"),
                ("cloud.google.com/gce-topology-host", name),
            ],
        )
    };
    let eks = |name: &str, layer1: &str| {
        gpu_node(
            name,
            B200,
            8,
            &[
                (ZONE, "us-east-1a"),
                ("topology.k8s.aws/network-node-layer-1", layer1),
                ("topology.k8s.aws/network-node-layer-2", "nn-2"),
                ("topology.k8s.aws/network-node-layer-3", "nn-3"),
            ],
        )
    };
    let nodes = [
        gke("g1", "blk-1"),
        gke("g2", "blk-1"),
        gke("g3", "blk-2"),
        eks("e1", "nn-e50490a237cb0f01a"),
    ];
    let plan = plan_with(
        &[training(Some(TopologyLevel::Block))],
        &[],
        &nodes,
        &HealthSnapshot::default(),
        &tas(),
    );
    assert_eq!(plan.topologies.len(), 2);
    let names: Vec<&str> = plan
        .topologies
        .iter()
        .map(|t| t.metadata.name.as_deref().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("kaccel-zone-block-subblock-physicalhost-host-"))
    );
    assert!(
        names
            .iter()
            .any(|n| n.starts_with("kaccel-zone-block-subblock-rack-host-"))
    );
    let report = &plan.classes["large-training"];
    let blocks: BTreeMap<&str, (Option<&str>, Option<u64>)> = report
        .flavors
        .iter()
        .map(|f| {
            let t = f.topology.as_ref().unwrap();
            (
                f.model.as_str(),
                (t.level_label.as_deref(), t.largest_block),
            )
        })
        .collect();
    assert_eq!(
        blocks[H100],
        (Some("cloud.google.com/gce-topology-block"), Some(16))
    );
    assert_eq!(
        blocks[B200],
        (Some("topology.k8s.aws/network-node-layer-1"), Some(8))
    );
    let c = condition(&report.conditions, TOPOLOGY_CONDITION);
    assert!(!c.status, "{c:?}");
    assert!(
        c.message.contains(
            "cloud.google.com/gce-topology-block or topology.k8s.aws/network-node-layer-1"
        ),
        "{}",
        c.message
    );
}

#[test]
fn a_guarantee_larger_than_every_block_is_told_and_one_that_fits_is_not() {
    let classes = [training(Some(TopologyLevel::Rack))];
    let nodes = two_racks();
    let health = HealthSnapshot::default();
    let options = tas();
    let plan = plan_with(
        &classes,
        &[
            budget("big", &["big"], &[("large-training", 20)]),
            budget("small", &["small"], &[("large-training", 4)]),
        ],
        &nodes,
        &health,
        &options,
    );
    let big = condition(&plan.budgets["big"].conditions, GUARANTEE_SPANS_BLOCKS);
    assert_eq!(
        (big.status, big.reason.as_str()),
        (true, "GuaranteeExceedsBlock")
    );
    assert!(
        big.message
            .contains("20 large-training devices fits in no single rack")
            && big.message.contains("holds 16"),
        "{}",
        big.message
    );
    // The team's queues still work: Ready is about them.
    assert!(condition(&plan.budgets["big"].conditions, crate::api::READY).status);
    let small = condition(&plan.budgets["small"].conditions, GUARANTEE_SPANS_BLOCKS);
    assert_eq!(
        (small.status, small.reason.as_str()),
        (false, "FitsInBlock")
    );

    // Without a level there is nothing to fit.
    let plan = plan_with(
        &[training(None)],
        &[budget("big", &["big"], &[("large-training", 20)])],
        &nodes,
        &health,
        &options,
    );
    assert!(
        !plan.budgets["big"]
            .conditions
            .iter()
            .any(|c| c.type_ == GUARANTEE_SPANS_BLOCKS)
    );
}

#[test]
fn turned_off_no_topology_is_written_and_a_class_with_a_level_is_told_how_to_turn_it_on() {
    let options = PlanOptions::default();
    assert!(!options.topology_aware_scheduling, "off unless asked for");
    let plan = plan_with(
        &[training(Some(TopologyLevel::Rack))],
        &[],
        &two_racks(),
        &HealthSnapshot::default(),
        &options,
    );
    assert!(plan.topologies.is_empty());
    assert_eq!(plan.resource_flavors[0].spec.topology_name, None);
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!((c.status, c.reason.as_str()), (true, "TopologyDisabled"));
    assert!(c.message.contains("planner.topologyAwareScheduling"));
}

#[test]
fn a_class_mixing_flavors_with_and_without_topology_is_told_which_take_what() {
    let nodes = [
        gpu_node("a1", H100, 8, &[(ZONE, "z1"), (RACK, "rack-a")]),
        gpu_node("b1", B200, 8, &[]),
    ];
    let plan = plan_with(
        &[training(None)],
        &[],
        &nodes,
        &HealthSnapshot::default(),
        &tas(),
    );
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!((c.status, c.reason.as_str()), (true, "MixedTopology"));
}

#[test]
fn topology_names_keep_their_hash_however_long_the_instance() {
    let levels = [(ZONE, TopologyLevel::Zone), (HOST, TopologyLevel::Host)];
    let short = topology_name("kaccel", &levels);
    let long = topology_name(&"x".repeat(80), &levels);
    assert!(long.len() <= 63, "{long}");
    assert_eq!(short[short.len() - 8..], long[long.len() - 8..]);
}

proptest! {
    /// Over random racks, labels and failures: every flavor with a topology
    /// selects only nodes that carry each of its levels (Kueue would not see
    /// the others), no block holds more than the flavor's healthy capacity, and
    /// the blocks together hold exactly that capacity.
    #[test]
    fn blocks_partition_the_healthy_capacity_of_fully_labelled_flavors(
        layout in prop::collection::vec((0u8..3, any::<bool>(), 0u32..=8, any::<bool>()), 1..12),
    ) {
        let nodes: Vec<Node> = layout
            .iter()
            .enumerate()
            .map(|(i, &(rack, labelled, _, _))| {
                let rack = format!("rack-{rack}");
                let topology: Vec<(&str, &str)> = if labelled {
                    vec![(ZONE, "z1"), (RACK, rack.as_str())]
                } else {
                    vec![(ZONE, "z1")]
                };
                gpu_node(&format!("n{i}"), H100, 8, &topology)
            })
            .collect();
        let mut health = HealthSnapshot::default();
        for (i, &(_, _, failed, _)) in layout.iter().enumerate() {
            health.set(
                &format!("n{i}"),
                "nvidia.com/gpu",
                HealthCounts { healthy: 8 - failed, failed, ..Default::default() },
            );
        }
        let mut nodes = nodes;
        for (node, &(_, _, _, cordoned)) in nodes.iter_mut().zip(&layout) {
            if cordoned {
                node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
                    unschedulable: Some(true),
                    ..Default::default()
                });
            }
        }
        let plan = plan_with(
            &[training(Some(TopologyLevel::Rack))],
            &[],
            &nodes,
            &health,
            &tas(),
        );
        let inventory = Inventory::from_nodes_and_slices(&nodes, &[]);
        for flavor in &plan.resource_flavors {
            let Some(topology) = &flavor.spec.topology_name else { continue };
            let levels = &plan
                .topologies
                .iter()
                .find(|t| t.metadata.name.as_deref() == Some(topology.as_str()))
                .expect("the named Topology is planned")
                .spec
                .levels;
            for node in inventory.nodes.values() {
                if crate::plan::tests::selects(flavor, node) {
                    for level in levels {
                        prop_assert!(node.labels.contains_key(&level.node_label));
                    }
                }
            }
        }
        let all_labelled = layout.iter().all(|&(_, labelled, _, _)| labelled);
        let shown = plan.classes["large-training"].flavors[0].topology.clone().unwrap();
        let capacity = plan.flavors[&plan.classes["large-training"].flavors[0].name].healthy_capacity;
        prop_assert_eq!(shown.level_label.is_some(), all_labelled);
        if let Some(largest) = shown.largest_block {
            prop_assert!(largest <= capacity);
            // Recount by hand: the healthy GPUs of open nodes per rack.
            let mut by_rack: BTreeMap<u8, u64> = BTreeMap::new();
            for &(rack, _, failed, cordoned) in &layout {
                *by_rack.entry(rack).or_default() += if cordoned { 0 } else { u64::from(8 - failed) };
            }
            prop_assert_eq!(by_rack.values().sum::<u64>(), capacity);
            prop_assert_eq!(Some(largest), by_rack.values().copied().max());
            prop_assert_eq!(shown.blocks, Some(by_rack.len() as u32));
        }
    }
}

/// Kueue's configuration as the e2e harness has it: `nvidia.com/gpu` also
/// counted as the class resource (a `Retain` transformation).
fn transforming_gpus() -> crate::kueue::config::ObservedConfiguration {
    let yaml = r#"
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
resources:
  transformations:
  - input: nvidia.com/gpu
    strategy: Retain
    outputs:
      kaccel.io/accelerator: "1"
"#;
    crate::kueue::config::ObservedConfiguration {
        source: "ConfigMap kueue-system/kueue-manager-config".into(),
        read: crate::kueue::config::Configuration::parse("t", yaml).map_err(|e| e.reason),
        gate_on_command_line: false,
    }
}

#[test]
fn nodes_without_the_class_resource_under_a_transformation_are_named_before_anything_else() {
    let options = PlanOptions {
        kueue_configuration: Some(transforming_gpus()),
        ..tas()
    };
    let classes = [training(Some(TopologyLevel::Rack))];
    let plan = plan_with(
        &classes,
        &[],
        &two_racks(),
        &HealthSnapshot::default(),
        &options,
    );
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!(
        (c.status, c.reason.as_str()),
        (true, "ClassResourceNotAdvertised")
    );
    assert!(
        c.message
            .contains("nvidia.com/gpu as kaccel.io/accelerator; nodes a1, a2, b1")
            && c.message.contains("status.capacity"),
        "{}",
        c.message
    );

    // Nodes that advertise it (their device count) are placeable: the level is what is said.
    let advertised: Vec<Node> = two_racks()
        .into_iter()
        .map(|mut n| {
            let status = n.status.as_mut().unwrap();
            for list in [status.capacity.as_mut(), status.allocatable.as_mut()]
                .into_iter()
                .flatten()
            {
                list.insert(
                    "kaccel.io/accelerator".into(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
                );
            }
            n
        })
        .collect();
    let plan = plan_with(
        &classes,
        &[],
        &advertised,
        &HealthSnapshot::default(),
        &options,
    );
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!((c.status, c.reason.as_str()), (false, "LevelLabelled"));

    // Without the transformation nothing is asked of the nodes.
    let plan = plan_with(
        &classes,
        &[],
        &two_racks(),
        &HealthSnapshot::default(),
        &tas(),
    );
    let c = condition(
        &plan.classes["large-training"].conditions,
        TOPOLOGY_CONDITION,
    );
    assert_eq!(c.reason, "LevelLabelled");
}
