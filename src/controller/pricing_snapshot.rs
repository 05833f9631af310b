//! The ledger's pricing inputs from each plan, including which ClusterQueue charges which budget.

use kube::ResourceExt;

use super::credits;
use crate::api::CreditBudget;
use crate::plan::Plan;

/// The ledger's pricing inputs from one plan.
pub(super) fn pricing_snapshot(
    planned: &Plan,
    budgets: &[CreditBudget],
) -> credits::PricingSnapshot {
    credits::PricingSnapshot {
        ready: true,
        flavor_models: planned
            .flavors
            .iter()
            .map(|(name, f)| (name.clone(), f.model.clone()))
            .collect(),
        dra_flavors: planned
            .flavors
            .iter()
            .filter(|(_, f)| crate::plan::kueue_counting::is_dra_flavor(f))
            .map(|(name, _)| name.clone())
            .collect(),
        // Rates and amounts as the planner parsed them: never re-read here.
        classes: planned
            .classes
            .iter()
            .filter_map(|(name, report)| Some((name.clone(), report.rates.clone()?)))
            .collect(),
        devices_per_pod: planned
            .classes
            .iter()
            .filter(|(_, report)| !report.devices_per_pod.is_empty())
            .map(|(name, report)| (name.clone(), report.devices_per_pod.clone()))
            .collect(),
        budget_amounts: planned
            .budgets
            .iter()
            .filter_map(|(name, report)| Some((name.clone(), report.amounts.clone()?)))
            .collect(),
        budget_errors: planned
            .budgets
            .iter()
            .filter(|(_, report)| report.amounts.is_none())
            .map(|(name, report)| (name.clone(), report.errors.clone()))
            .collect(),
        // ClusterQueue -> (budget, class), as the planner assigned them: the planned
        // queues, and those of grants whose class turned invalid (Workloads holding
        // quota there still get the class's own error as their answer).
        queues: planned.priced_queues.clone(),
        budgets: budgets
            .iter()
            .map(|b| (b.name_any(), b.spec.clone()))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use crate::api::AcceleratorClass;
    use std::collections::BTreeMap;

    use super::*;
    use crate::inventory::Inventory;
    use crate::plan::{PlanInput, plan};

    #[test]
    fn workloads_in_the_queue_of_a_class_turned_invalid_still_get_an_answer() {
        let loaded = crate::testkit::examples();
        let (mut classes, budgets) = (loaded.classes, loaded.budgets);
        let inventory = Inventory::from_nodes(&loaded.nodes);
        let budget = &budgets[0];
        let class = budget.spec.classes[0].name.clone();
        let queue = crate::plan::cluster_queue_name(&budget.name_any(), &class);
        let input = |classes: &[AcceleratorClass]| {
            plan(&PlanInput {
                classes,
                budgets: &budgets,
                inventory: &inventory,
                health: &Default::default(),
                options: &Default::default(),
            })
        };
        let planned = input(&classes);
        assert!(
            planned
                .cluster_queues
                .iter()
                .any(|q| q.metadata.name.as_deref() == Some(queue.as_str())),
            "cluster_queue_name is the planner's name"
        );
        let valid = &planned.priced_queues;
        assert_eq!(valid[&queue], (budget.name_any(), class.clone()));

        let bad = classes.iter_mut().find(|c| c.name_any() == class).unwrap();
        bad.spec.credits.per_device_hour = "abc".into();
        let planned = input(&classes);
        assert!(
            !planned
                .cluster_queues
                .iter()
                .any(|q| q.metadata.name.as_deref() == Some(queue.as_str()))
        );
        assert_eq!(planned.priced_queues[&queue], (budget.name_any(), class));
    }

    fn example_plan(classes: &[AcceleratorClass], budgets: &[CreditBudget]) -> Plan {
        let loaded = crate::testkit::examples();
        plan(&PlanInput {
            classes,
            budgets,
            inventory: &Inventory::from_nodes(&loaded.nodes),
            health: &Default::default(),
            options: &Default::default(),
        })
    }

    #[test]
    fn the_ledger_is_told_every_flavors_model_class_rate_and_budget() {
        let loaded = crate::testkit::examples();
        let mut classes = loaded.classes.clone();
        classes[0].metadata.generation = Some(7);
        let planned = example_plan(&classes, &loaded.budgets);
        let snapshot = pricing_snapshot(&planned, &loaded.budgets);
        assert!(snapshot.ready);
        assert!(!planned.flavors.is_empty());
        assert_eq!(
            snapshot.flavor_models,
            planned
                .flavors
                .iter()
                .map(|(n, f)| (n.clone(), f.model.clone()))
                .collect::<BTreeMap<_, _>>()
        );
        assert_eq!(snapshot.classes.len(), classes.len());
        assert_eq!(
            snapshot.classes[&classes[0].name_any()],
            crate::api::rates::ClassRates::parse(&classes[0].spec.credits, Some(7))
        );
        assert_eq!(snapshot.budget_amounts.len(), loaded.budgets.len());
        assert!(snapshot.budget_errors.is_empty());
        assert!(!snapshot.queues.is_empty());
        assert_eq!(snapshot.queues, planned.priced_queues);
        assert_eq!(snapshot.budgets.len(), loaded.budgets.len());
        for b in &loaded.budgets {
            assert_eq!(snapshot.budgets[&b.name_any()], b.spec);
        }
    }

    /// What the budget loop showed as the ledger's error before budgets were
    /// parsed once (a bad perPeriod, a bad top-up) it still shows: the planner's
    /// field errors, with their fixes, and no amounts to grant from.
    #[test]
    fn an_invalid_budget_has_its_field_errors_and_no_amounts() {
        let loaded = crate::testkit::examples();
        let mut budgets = loaded.budgets.clone();
        budgets[0].spec.credits.per_period = "lots".into();
        budgets[0].spec.credits.top_ups = vec![crate::api::TopUp {
            name: "extra".into(),
            credits: "0".into(),
            reason: None,
        }];
        let name = budgets[0].name_any();
        let planned = example_plan(&loaded.classes, &budgets);
        let snapshot = pricing_snapshot(&planned, &budgets);
        assert!(!snapshot.budget_amounts.contains_key(&name));
        assert!(snapshot.budgets.contains_key(&name), "still looked at");
        assert_eq!(snapshot.budget_amounts.len(), budgets.len() - 1);
        assert_eq!(snapshot.budget_errors.len(), 1);
        let fields: Vec<&str> = snapshot.budget_errors[&name]
            .iter()
            .map(|e| e.field.as_str())
            .collect();
        assert_eq!(
            fields,
            ["spec.credits.perPeriod", "spec.credits.topUps[0].credits"]
        );
        let message = snapshot.budget_problem(&name);
        for needle in [
            &format!("CreditBudget {name} is invalid"),
            "grants it nothing",
            "spec.credits.perPeriod: \"lots\" is not a credit amount: write a non-negative decimal",
            "spec.credits.topUps[0].credits: \"0\" must be a positive decimal",
            "lower perPeriod",
        ] {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
        let unknown = snapshot.budget_problem("nobody");
        assert!(unknown.contains("not been parsed"), "{unknown}");
    }

    #[test]
    fn a_grant_of_a_class_that_does_not_exist_is_not_priced() {
        let loaded = crate::testkit::examples();
        let budget = &loaded.budgets[0];
        let class = budget.spec.classes[0].name.clone();
        let queue = crate::plan::cluster_queue_name(&budget.name_any(), &class);
        let classes: Vec<AcceleratorClass> = loaded
            .classes
            .iter()
            .filter(|c| c.name_any() != class)
            .cloned()
            .collect();
        let planned = example_plan(&classes, &loaded.budgets);
        assert!(!planned.classes.contains_key(&class));
        assert!(!planned.priced_queues.contains_key(&queue));
    }
}
