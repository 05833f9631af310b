//! Devices whose model no node label names are in no flavor (only the vendor's
//! presence label would pin them, pooling every unlabelled model), and the classes
//! that could have pooled them say so (`UnlabelledModels`); a device-plugin flavor
//! that pins no label at all is refused (`unpinned`). Labels as the vendors' own
//! software writes them: NFD's PCI label for Habana (`pci-1da3.present`, as the
//! Gaudi operators configure NFD), the GPU Operator's `nvidia.com/gpu.present`.

use k8s_openapi::api::core::v1::Node;

use super::*;

fn node(name: &str, labels: &[(&str, &str)], resources: &[(&str, &str)]) -> Node {
    let labels: serde_json::Map<String, serde_json::Value> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .chain([("kubernetes.io/hostname".to_string(), name.into())])
        .collect();
    let resources: serde_json::Map<String, serde_json::Value> = resources
        .iter()
        .map(|(k, v)| (k.to_string(), (*v).into()))
        .chain([
            ("cpu".to_string(), "96".into()),
            ("memory".to_string(), "1Ti".into()),
        ])
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": resources, "allocatable": resources,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .unwrap()
}

const GAUDI_PRESENT: (&str, &str) = ("feature.node.kubernetes.io/pci-1da3.present", "true");
const NVIDIA_PRESENT: (&str, &str) = ("nvidia.com/gpu.present", "true");

fn unlabelled_gaudi(name: &str) -> Node {
    node(name, &[GAUDI_PRESENT], &[("habana.ai/gaudi", "8")])
}

fn cpu_node(name: &str) -> Node {
    node(name, &[], &[])
}

/// "whole" (any vendor), "nvidia-only" and "intel-only".
fn classes() -> (Vec<AcceleratorClass>, Vec<CreditBudget>) {
    let only = |vendor: Vendor| HardwareSelector {
        vendors: vec![vendor],
        ..Default::default()
    };
    (
        vec![
            class("whole", SharingMode::Whole, Default::default()),
            class("nvidia-only", SharingMode::Whole, only(Vendor::Nvidia)),
            class("intel-only", SharingMode::Whole, only(Vendor::Intel)),
        ],
        vec![budget(
            "team",
            &["team"],
            &[("whole", 1), ("nvidia-only", 1), ("intel-only", 1)],
        )],
    )
}

fn condition<'a>(plan: &'a Plan, class: &str, type_: &str) -> &'a DesiredCondition {
    plan.classes[class]
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| {
            panic!(
                "{class} has no {type_}: {:?}",
                plan.classes[class].conditions
            )
        })
}

#[test]
fn unlabelled_gaudi_cards_are_in_no_flavor_and_the_classes_that_could_pool_them_say_so() {
    let (classes, budgets) = classes();
    let nodes = vec![
        unlabelled_gaudi("gaudi-a"),
        unlabelled_gaudi("gaudi-b"),
        node(
            "h100",
            &[
                NVIDIA_PRESENT,
                ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"),
            ],
            &[("nvidia.com/gpu", "8")],
        ),
        cpu_node("cpu-1"),
    ];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    // No flavor selects a Gaudi node: none pins the presence label alone.
    for flavor in &plan.resource_flavors {
        assert!(!selects(flavor, &inventory.nodes["gaudi-a"]), "{flavor:?}");
        assert!(!flavor.spec.node_labels.is_empty(), "{flavor:?}");
    }
    for class in ["whole", "intel-only"] {
        let identified = condition(&plan, class, api::UNLABELLED_MODELS);
        assert!(identified.status, "{class}");
        assert_eq!(identified.reason, "NoModelLabel");
        assert!(
            identified
                .message
                .contains("16 habana.ai/gaudi on 2 node(s) (gaudi-a, gaudi-b)")
                && identified.message.contains(crate::inventory::MODEL_LABEL),
            "{}",
            identified.message
        );
    }
    // A class of another vendor could not have pooled them.
    let nvidia = condition(&plan, "nvidia-only", api::UNLABELLED_MODELS);
    assert!(!nvidia.status, "{}", nvidia.message);
    // Labelled, the same cards are a flavor and every class's models are named.
    let labelled: Vec<Node> = nodes
        .iter()
        .map(|n| {
            let mut n = n.clone();
            if n.metadata.name.as_deref().unwrap().starts_with("gaudi") {
                n.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert("habana.ai/device.type".into(), "GAUDI2".into());
            }
            n
        })
        .collect();
    let (plan, inventory) = run(&classes, &budgets, &labelled, &HealthSnapshot::default());
    assert!(
        plan.resource_flavors
            .iter()
            .any(|f| selects(f, &inventory.nodes["gaudi-a"]))
    );
    for class in ["whole", "intel-only", "nvidia-only"] {
        assert!(
            !condition(&plan, class, api::UNLABELLED_MODELS).status,
            "{class}"
        );
    }
}

/// The backstop: a device-plugin flavor whose adapter pinned no label (none does
/// today; a new adapter could) selects any node, so it is refused and reported.
#[test]
fn a_device_flavor_that_pins_no_label_is_refused() {
    let (classes, budgets) = classes();
    let gaudi = |name: &str| {
        node(
            name,
            &[GAUDI_PRESENT, ("habana.ai/device.type", "GAUDI2")],
            &[("habana.ai/gaudi", "8")],
        )
    };
    // Only Gaudi nodes: with empty nodeLabels the flavor would look pure here,
    // and select the CPU node that joins next.
    let mut inventory = Inventory::from_nodes(&[gaudi("gaudi-a"), gaudi("gaudi-b")]);
    for node in inventory.nodes.values_mut() {
        for group in &mut std::sync::Arc::make_mut(node).groups {
            assert!(!group.pin_labels.is_empty(), "the adapter pins GAUDI2");
            group.pin_labels.clear();
        }
    }
    let health = HealthSnapshot::default();
    let options = PlanOptions::default();
    let plan = plan(&PlanInput {
        classes: &classes,
        budgets: &budgets,
        inventory: &inventory,
        health: &health,
        options: &options,
    });
    assert!(
        plan.resource_flavors
            .iter()
            .all(|f| !f.spec.node_labels.is_empty()),
        "{:?}",
        plan.resource_flavors
    );
    let refused: Vec<_> = plan.impure_flavors.iter().filter(|i| i.unpinned).collect();
    assert_eq!(refused.len(), 1, "{:?}", plan.impure_flavors);
    assert_eq!(refused[0].variant.model, "Gaudi2");
    let conflict = condition(&plan, "intel-only", api::CONFLICT);
    assert!(conflict.status);
    assert!(
        conflict.message.contains("would pin nothing")
            && conflict.message.contains(crate::inventory::MODEL_LABEL),
        "{}",
        conflict.message
    );
}
