//! Fixtures and builders for tests, in one place: the shipped examples, the example
//! fleet's inventory, and hand-built devices and nodes. Not part of kaccel's API
//! (hidden from its docs); public only so the e2e tests and benchmarks share it.
//!
//! Fixtures copied from what vendors publish live beside their adapters
//! (`inventory::vendor_fleet_*`), with the source of each label named there.

use std::sync::LazyLock;

use crate::cli::load::{Loaded, load_text};
use crate::inventory::Inventory;

pub mod devices;

/// A label (or annotation) map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The example fleet, classes and budgets shipped in `examples/`, compiled in, so
/// tests and benchmarks use exactly what the README shows.
pub fn examples() -> Loaded {
    let mut loaded = Loaded::default();
    let mut errors = Vec::new();
    for (file, text) in [
        (
            "examples/classes.yaml",
            include_str!("../../examples/classes.yaml"),
        ),
        (
            "examples/budgets.yaml",
            include_str!("../../examples/budgets.yaml"),
        ),
        (
            "examples/nodes.yaml",
            include_str!("../../examples/nodes.yaml"),
        ),
    ] {
        load_text(file.as_ref(), text, &mut loaded, &mut errors);
    }
    assert!(
        errors.is_empty(),
        "the shipped examples are invalid: {errors:?}"
    );
    loaded
}

/// The example fleet's inventory, parsed once (property tests ask often).
pub fn example_inventory() -> &'static Inventory {
    static FLEET: LazyLock<Inventory> = LazyLock::new(|| Inventory::from_nodes(&examples().nodes));
    &FLEET
}

/// The plan of the shipped examples: every class and budget, the example fleet,
/// no health readings, default options.
pub fn example_plan() -> crate::plan::Plan {
    example_plan_with(&Default::default())
}

/// [`example_plan`] with other planner options.
pub fn example_plan_with(options: &crate::plan::PlanOptions) -> crate::plan::Plan {
    let loaded = examples();
    crate::plan::plan(&crate::plan::PlanInput {
        classes: &loaded.classes,
        budgets: &loaded.budgets,
        inventory: &Inventory::from_nodes(&loaded.nodes),
        health: &Default::default(),
        options,
    })
}

/// A Workload `name` (namespace `team`) Kueue admitted with one podSet of
/// `count` pods on `flavor`: every resource of `usage` (resource -> quantity,
/// the podSet's total) assigned to that flavor, `Admitted` and `QuotaReserved` True.
pub fn admitted_on(
    name: &str,
    flavor: &str,
    count: u64,
    usage: serde_json::Value,
) -> crate::kueue::workload::Workload {
    let flavors: serde_json::Map<String, serde_json::Value> = usage
        .as_object()
        .expect("usage is a resource -> quantity map")
        .keys()
        .map(|r| (r.clone(), serde_json::json!(flavor)))
        .collect();
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": "team", "uid": format!("uid-{name}")},
        "spec": {"queueName": "q", "podSets": [{"name": "main", "count": count}]},
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True"},
                           {"type": "Admitted", "status": "True"}],
            "admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "main", "count": count, "flavors": flavors, "resourceUsage": usage}
            ]}
        }
    }))
    .expect("an admitted Workload")
}
