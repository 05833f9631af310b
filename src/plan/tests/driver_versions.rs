//! A class's minimum driver version against a fleet mid-rollout: the flavor's
//! `nodeLabels` must keep the class's pods off the nodes whose driver the planner
//! did not count, for every class that shares the hardware. Nodes are labelled as
//! NVIDIA's GPU feature discovery and AMD's node labeller label them
//! (NVIDIA/k8s-device-plugin `internal/lm/nvml.go`: `nvidia.com/cuda.driver-version.
//! {major,minor,revision,full}` and the deprecated `nvidia.com/cuda.driver.{major,
//! minor,rev}`; ROCm/k8s-device-plugin `cmd/k8s-node-labeller`: `amd.com/gpu.driver-version`).

use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;

use super::*;
use crate::api::HardwareSelector;

/// An 8 x H100 node whose driver version GFD labels one of three ways: the full
/// label (current GFD), the major/minor/revision labels only, or the deprecated
/// names; `None` writes no driver label at all.
fn h100(name: &str, driver: Option<&str>, spelling: u8) -> Node {
    let mut labels = serde_json::json!({
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
    });
    if let Some(v) = driver {
        let parts: Vec<&str> = v.split('.').collect();
        let (major, minor, rev) = (parts[0], parts[1], parts.get(2).copied().unwrap_or("0"));
        let set = |labels: &mut serde_json::Value, k: &str, v: &str| {
            labels[k] = serde_json::Value::String(v.to_string())
        };
        match spelling % 3 {
            0 => {
                set(&mut labels, "nvidia.com/cuda.driver-version.full", v);
                set(&mut labels, "nvidia.com/cuda.driver-version.major", major);
            }
            1 => {
                set(&mut labels, "nvidia.com/cuda.driver-version.major", major);
                set(&mut labels, "nvidia.com/cuda.driver-version.minor", minor);
                set(&mut labels, "nvidia.com/cuda.driver-version.revision", rev);
            }
            _ => {
                set(&mut labels, "nvidia.com/cuda.driver.major", major);
                set(&mut labels, "nvidia.com/cuda.driver.minor", minor);
                set(&mut labels, "nvidia.com/cuda.driver.rev", rev);
            }
        }
    }
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": {"cpu": "192", "memory": "2Ti", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "191", "memory": "2Ti", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("a Node")
}

fn min_driver(name: &str, version: Option<&str>) -> AcceleratorClass {
    class(
        name,
        SharingMode::Whole,
        HardwareSelector {
            min_driver_version: version.map(str::to_string),
            ..Default::default()
        },
    )
}

/// The ResourceFlavors of a class, as planned.
fn flavors_of<'a>(plan: &'a Plan, class: &str) -> Vec<&'a ResourceFlavor> {
    plan.classes[class]
        .flavors
        .iter()
        .map(|f| {
            plan.resource_flavors
                .iter()
                .find(|rf| rf.metadata.name.as_deref() == Some(f.name.as_str()))
                .expect("an emitted flavor")
        })
        .collect()
}

fn conditions(plan: &Plan, class: &str) -> Vec<String> {
    plan.classes[class]
        .conditions
        .iter()
        .map(|c| format!("{}: {}", c.type_, c.message))
        .collect()
}

#[test]
fn a_minimum_driver_version_pins_the_flavor_to_the_nodes_that_meet_it() {
    let nodes = [
        h100("new-a", Some("550.54.15"), 0),
        h100("new-b", Some("550.54.15"), 0),
        h100("old", Some("535.104.5"), 2),
    ];
    let classes = [min_driver("train", Some("550")), min_driver("any", None)];
    let budgets = [budget("team", &["team"], &[("train", 16), ("any", 24)])];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let old = &inventory.nodes["old"];
    let train = flavors_of(&plan, "train");
    assert_eq!(train.len(), 1, "{:?}", plan.classes["train"].flavors);
    assert!(
        !selects(train[0], old),
        "train's flavor selects the 535 node: {:?}",
        train[0].spec.node_labels
    );
    assert_eq!(
        train[0]
            .spec
            .node_labels
            .get("nvidia.com/cuda.driver-version.full")
            .map(String::as_str),
        Some("550.54.15")
    );
    assert_eq!(
        train[0].metadata.name.as_deref(),
        Some("nvidia-h100-80gb-hbm3-550-54-15")
    );
    // The class without a minimum shares that flavor and gets one for the old
    // node: no pooling conflict, all 24 GPUs.
    let any = flavors_of(&plan, "any");
    assert_eq!(any.len(), 2);
    assert!(
        any.iter()
            .any(|f| f.metadata.name == train[0].metadata.name)
    );
    assert!(any.iter().any(|f| selects(f, old)));
    assert!(
        conditions(&plan, "any")
            .iter()
            .all(|c| !c.contains("Conflict")),
        "{:?}",
        conditions(&plan, "any")
    );
    assert!(
        conditions(&plan, "train")
            .iter()
            .all(|c| !c.contains("Conflict"))
    );
    let quota = quota_per_flavor(&plan);
    assert_eq!(quota[train[0].metadata.name.as_deref().unwrap()], 16);
    assert_eq!(quota.values().sum::<u64>(), 24);
}

#[test]
fn a_fleet_on_one_side_of_the_minimum_is_not_split() {
    // Every node meets it: the flavor keeps its plain name and labels.
    let nodes = [
        h100("a", Some("550.54.15"), 0),
        h100("b", Some("560.35.3"), 1),
    ];
    let classes = [min_driver("train", Some("550"))];
    let budgets = [budget("team", &["team"], &[("train", 16)])];
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let names: Vec<_> = plan
        .resource_flavors
        .iter()
        .filter_map(|f| f.metadata.name.clone())
        .collect();
    assert_eq!(names, ["nvidia-h100-80gb-hbm3"]);
    // None meets it: nothing is pooled, and the others' flavors are not split for it.
    let classes = [min_driver("new", Some("570")), min_driver("any", None)];
    let budgets = [budget("team", &["team"], &[("new", 1), ("any", 16)])];
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    assert!(plan.classes["new"].flavors.is_empty());
    let names: Vec<_> = plan
        .resource_flavors
        .iter()
        .filter_map(|f| f.metadata.name.clone())
        .collect();
    assert_eq!(names, ["nvidia-h100-80gb-hbm3"]);
}

#[test]
fn a_node_whose_driver_is_on_no_label_is_left_out_of_a_split_variant() {
    // The unlabelled node fails the minimum (its version cannot be verified), and
    // the class without one cannot pin it by version either: it is left out of the
    // split variant (as a node lacking a pooling.splitBy label is), never selected
    // by a flavor whose other nodes the class counts.
    let nodes = [
        h100("new", Some("550.54.15"), 0),
        h100("old", Some("535.104.5"), 1),
        h100("bare", None, 0),
    ];
    let classes = [min_driver("train", Some("550")), min_driver("any", None)];
    let budgets = [budget("team", &["team"], &[("train", 8), ("any", 16)])];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let bare = &inventory.nodes["bare"];
    for class in ["train", "any"] {
        for f in flavors_of(&plan, class) {
            assert!(!selects(f, bare), "{class}: {:?}", f.spec.node_labels);
        }
    }
    assert_eq!(flavors_of(&plan, "any").len(), 2);
    assert_eq!(quota_per_flavor(&plan).values().sum::<u64>(), 16);
}

#[test]
fn amds_driver_version_label_pins_the_flavor_too() {
    // The ROCm labeller's SPX node (amd.com/gpu.driver-version 6.10.5) and a copy
    // of it one driver behind.
    let new = crate::inventory::vendor_fleet_nvidia_amd::fleet()
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some("amd-mi300x-spx"))
        .expect("fixture");
    let mut old = new.clone();
    old.metadata.name = Some("amd-mi300x-spx-old".into());
    old.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("amd.com/gpu.driver-version".into(), "6.8.5".into());
    let classes = [
        min_driver("rocm-6-10", Some("6.10")),
        min_driver("any", None),
    ];
    let budgets = [budget("team", &["team"], &[("rocm-6-10", 8), ("any", 16)])];
    let nodes = [new, old];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let flavors = flavors_of(&plan, "rocm-6-10");
    assert_eq!(flavors.len(), 1);
    assert_eq!(
        flavors[0]
            .spec
            .node_labels
            .get("amd.com/gpu.driver-version")
            .map(String::as_str),
        Some("6.10.5")
    );
    assert!(!selects(flavors[0], &inventory.nodes["amd-mi300x-spx-old"]));
    assert_eq!(flavors_of(&plan, "any").len(), 2);
    assert_eq!(quota_per_flavor(&plan).values().sum::<u64>(), 16);
}

proptest! {
    /// Whatever the versions, their spellings and the minimum: every flavor of the
    /// constrained class selects only nodes whose driver meets it, and invariant 1
    /// holds for every flavor.
    #[test]
    fn a_class_flavor_never_selects_an_older_driver(
        versions in prop::collection::vec((prop::option::of(0usize..4), 0u8..3), 1..7),
        minimum in 0usize..4,
    ) {
        const VERSIONS: [&str; 4] = ["535.104.5", "550.54.15", "550.90.7", "560.35.3"];
        let nodes: Vec<Node> = versions
            .iter()
            .enumerate()
            .map(|(i, (v, spelling))| h100(&format!("n{i}"), v.map(|v| VERSIONS[v]), *spelling))
            .collect();
        let min = VERSIONS[minimum];
        let classes = [min_driver("train", Some(min)), min_driver("any", None)];
        let budgets = [budget("team", &["team"], &[("train", 1000), ("any", 1000)])];
        let health = HealthSnapshot::default();
        let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
        for f in flavors_of(&plan, "train") {
            for node in inventory.nodes.values().filter(|n| selects(f, n)) {
                for g in &node.groups {
                    let ok = g.driver_version.as_deref().and_then(|v| crate::k8s::names::version_at_least(v, min));
                    prop_assert_eq!(ok, Some(true), "{} selects {} ({:?})", f.metadata.name.clone().unwrap_or_default(), node.name, g.driver_version);
                }
            }
        }
        assert_quota_within_healthy_capacity(&plan, &inventory, &health, true);
        prop_assert!(conditions(&plan, "any").iter().all(|c| !c.contains("PoolingConflict")));
    }
}
