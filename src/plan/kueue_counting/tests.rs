//! Tests of what Kueue's configuration must say for class-level requests: the
//! printed transformations, the condition that checks them, and the foreign
//! ClusterQueues they block.

use std::collections::{BTreeMap, BTreeSet};

use super::*;
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::kueue::config::Configuration;
use crate::plan::{Plan, PlanInput, PlanOptions, plan};

fn observed(yaml: &str) -> ObservedConfiguration {
    ObservedConfiguration {
        source: "ConfigMap kueue-system/kueue-manager-config".into(),
        read: Configuration::parse("t", yaml).map_err(|e| e.reason),
        gate_on_command_line: false,
    }
}

fn examples_planned(
    config: Option<ObservedConfiguration>,
    foreign: BTreeMap<String, BTreeSet<String>>,
) -> Plan {
    let loaded = crate::testkit::examples();
    let inventory = Inventory::from_nodes(&loaded.nodes);
    let options = PlanOptions {
        kueue_configuration: config,
        foreign_cluster_queues: foreign,
        ..Default::default()
    };
    plan(&PlanInput {
        classes: &loaded.classes,
        budgets: &loaded.budgets,
        inventory: &inventory,
        health: &HealthSnapshot::default(),
        options: &options,
    })
}

fn condition<'a>(plan: &'a Plan, class: &str, type_: &str) -> Option<&'a DesiredCondition> {
    plan.classes[class]
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
}

fn snippet_of(planned: &Plan) -> String {
    configuration_snippet(
        &mappings(&planned.device_classes),
        &transformations(&planned.flavors),
    )
}

#[test]
fn the_printed_snippet_transforms_every_vendor_resource_once_and_satisfies_the_check() {
    let bare = examples_planned(None, BTreeMap::new());
    // Without a configuration read, the planner says nothing about Kueue.
    assert!(condition(&bare, "large-training", api::KUEUE_COUNTS_CLASS_REQUESTS).is_none());
    let inputs: Vec<String> = transformations(&bare.flavors)
        .into_iter()
        .map(|t| t.input)
        .collect();
    // Every device-plugin resource of the examples, each once; no CPU pool.
    for r in [
        "amd.com/gpu",
        "nvidia.com/gpu",
        "nvidia.com/mig-1g.10gb",
        "habana.ai/gaudi",
    ] {
        assert!(inputs.iter().any(|i| i == r), "{r} missing from {inputs:?}");
    }
    assert!(!inputs.iter().any(|i| i == "cpu"));
    let unique: BTreeSet<&String> = inputs.iter().collect();
    assert_eq!(unique.len(), inputs.len());

    let snippet = snippet_of(&bare);
    assert!(
        snippet.contains(
            "  - input: nvidia.com/gpu\n    strategy: Retain\n    outputs:\n      kaccel.io/accelerator: \"1\"\n"
        ),
        "{snippet}"
    );
    let pasted = examples_planned(
        Some(observed(&format!(
            "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n{snippet}"
        ))),
        BTreeMap::new(),
    );
    for class in [
        "large-training",
        "inference",
        "shared-inference",
        "standard-training",
    ] {
        let c = condition(&pasted, class, api::KUEUE_COUNTS_CLASS_REQUESTS).expect(class);
        assert!(c.status, "{class}: {c:?}");
        assert_eq!(c.reason, "Transformed");
        let blocked = condition(&pasted, class, api::FOREIGN_QUEUES_BLOCKED).expect(class);
        assert!(!blocked.status, "{class}: {blocked:?}");
    }
    // A CPU-only class has no devices to count.
    assert!(condition(&pasted, "development-cpu", api::KUEUE_COUNTS_CLASS_REQUESTS).is_none());
}

#[test]
fn a_missing_or_wrong_transformation_is_named_with_the_fix() {
    let config = observed(
        "resources:\n  transformations:\n  - input: nvidia.com/gpu\n    strategy: Replace\n    outputs:\n      kaccel.io/accelerator: \"1\"\n",
    );
    let planned = examples_planned(Some(config), BTreeMap::new());
    let c = condition(&planned, "large-training", api::KUEUE_COUNTS_CLASS_REQUESTS).unwrap();
    assert!(!c.status);
    assert_eq!(c.reason, "TransformationMissing");
    for needle in [
        "the transformation of nvidia.com/gpu must keep it (strategy Retain)",
        "add resources.transformations entry {input: amd.com/gpu, strategy: Retain, outputs: {kaccel.io/accelerator: \"1\"}}",
        "kaccel plan --kueue-config",
    ] {
        assert!(
            c.message.contains(needle),
            "{needle:?} not in {}",
            c.message
        );
    }
    let unreadable = ObservedConfiguration {
        read: Err("not found".into()),
        ..observed("")
    };
    let planned = examples_planned(Some(unreadable), BTreeMap::new());
    let c = condition(&planned, "inference", api::KUEUE_COUNTS_CLASS_REQUESTS).unwrap();
    assert_eq!(
        (c.status, c.reason.as_str()),
        (false, "KueueConfigurationUnreadable")
    );
}

#[test]
fn a_foreign_queue_covering_a_transformed_resource_but_not_the_class_resource_is_reported() {
    let covers = |rs: &[&str]| rs.iter().map(|r| r.to_string()).collect::<BTreeSet<_>>();
    let foreign = BTreeMap::from([
        (
            "legacy-gpus".to_string(),
            covers(&["cpu", "memory", "nvidia.com/gpu"]),
        ),
        (
            "migrated".to_string(),
            covers(&["cpu", "nvidia.com/gpu", "kaccel.io/accelerator"]),
        ),
        ("cpu-batch".to_string(), covers(&["cpu", "memory"])),
    ]);
    let bare = examples_planned(None, BTreeMap::new());
    let config = observed(&snippet_of(&bare));
    let planned = examples_planned(Some(config), foreign.clone());
    assert_eq!(
        planned.blocked_queues,
        BTreeMap::from([(
            "legacy-gpus".to_string(),
            vec!["nvidia.com/gpu".to_string()]
        )])
    );
    let c = condition(&planned, "inference", api::FOREIGN_QUEUES_BLOCKED).unwrap();
    assert!(c.status);
    assert!(
        c.message.contains("legacy-gpus (nvidia.com/gpu)"),
        "{}",
        c.message
    );
    // A class without NVIDIA whole GPUs is not concerned.
    let c = condition(&planned, "standard-training", api::FOREIGN_QUEUES_BLOCKED).unwrap();
    assert!(!c.status, "{c:?}");
    // What Kueue transforms decides: with no transformation, nothing is blocked.
    let planned = examples_planned(Some(observed("kind: Configuration\n")), foreign);
    assert!(planned.blocked_queues.is_empty());
}
