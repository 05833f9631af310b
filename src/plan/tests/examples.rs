//! The example fleet: every class and budget planned, queues wired to cohorts and flavors.

use super::*;

#[test]
fn example_fleet_plans_every_class_and_budget() {
    let (classes, budgets, nodes) = examples();
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    for (name, report) in &plan.classes {
        assert!(report.valid, "{name}: {:?}", report.errors);
        assert!(!report.flavors.is_empty(), "{name} resolved to no flavor");
        assert_eq!(report.conditions[0].type_, api::READY);
        assert!(
            report.conditions[0].status,
            "{name} not ready: {:?}",
            report.conditions[0]
        );
    }
    // One ClusterQueue per (budget, class), one LocalQueue per namespace and class.
    let expected_queues: usize = budgets.iter().map(|b| b.spec.classes.len()).sum();
    assert_eq!(plan.cluster_queues.len(), expected_queues);
    let expected_local: usize = budgets
        .iter()
        .map(|b| b.spec.classes.len() * b.spec.namespaces.len())
        .sum();
    assert_eq!(plan.local_queues.len(), expected_local);
    assert_quota_within_healthy_capacity(&plan, &inventory, &HealthSnapshot::default(), true);

    // Large training wants >= 80 GB whole devices: L40S (48 GB) must not be there,
    // and the preference order puts H100 first.
    let large = &plan.classes["large-training"];
    assert!(large.flavors.iter().all(|f| !f.model.contains("L40S")));
    assert!(
        large.flavors[0].model.contains("H100"),
        "{:?}",
        large.flavors
    );
    // Inference needs compute capability 8.9: A100 (8.0) is excluded.
    assert!(
        plan.classes["inference"]
            .flavors
            .iter()
            .all(|f| !f.model.contains("A100"))
    );
}

#[test]
fn queues_are_wired_to_cohorts_namespaces_and_flavors() {
    let (classes, budgets, nodes) = examples();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let cq = plan
        .cluster_queues
        .iter()
        .find(|q| q.metadata.name.as_deref() == Some("vision-large-training"))
        .expect("vision-large-training exists");
    assert_eq!(cq.spec.cohort_name.as_deref(), Some("kaccel-vision"));
    let ns = &cq
        .spec
        .namespace_selector
        .as_ref()
        .unwrap()
        .match_expressions
        .as_ref()
        .unwrap()[0];
    assert_eq!(
        ns.values.as_ref().unwrap(),
        &vec!["vision-research".to_string(), "vision-prod".to_string()]
    );
    let rg = &cq.spec.resource_groups[0];
    assert!(rg.covered_resources.contains(&"nvidia.com/gpu".to_string()));
    assert!(rg.covered_resources.contains(&"amd.com/gpu".to_string()));
    assert!(
        rg.covered_resources
            .ends_with(&["cpu".to_string(), "memory".to_string()])
    );
    for f in &rg.flavors {
        assert_eq!(
            f.resources.len(),
            rg.covered_resources.len(),
            "Kueue requires every covered resource per flavor"
        );
    }
    let team = plan
        .cohorts
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some("kaccel-vision"))
        .unwrap();
    assert_eq!(team.spec.parent_name.as_deref(), Some("kaccel"));
    assert!(team.spec.fair_sharing.as_ref().unwrap().weight.is_some());
    // A lent guarantee comes back: every queue may reclaim within its cohort.
    for q in &plan.cluster_queues {
        let preemption = q.spec.preemption.as_ref().expect("preemption set");
        assert_eq!(preemption.reclaim_within_cohort.as_deref(), Some("Any"));
    }
    let lq = plan
        .local_queues
        .iter()
        .find(|q| {
            q.metadata.namespace.as_deref() == Some("vision-prod")
                && q.metadata.name.as_deref() == Some("inference")
        })
        .unwrap();
    assert_eq!(lq.spec.cluster_queue, "vision-inference");
    for obj in &plan.resource_flavors {
        assert_eq!(
            obj.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
            crate::k8s::instance::DEFAULT_INSTANCE
        );
    }
    // No AdmissionCheck unless the ledger is on: an unanswered check blocks admission.
    assert!(
        plan.cluster_queues
            .iter()
            .all(|q| q.spec.admission_checks_strategy.is_none())
    );
}

/// The examples carry no `kaccel.io/instance`: the default installation serves
/// them all; another serves none and knows each class as the default's; a
/// labelled class and budget go to their installation only.
#[test]
fn each_installation_is_served_its_own_classes_and_budgets() {
    use crate::k8s::instance::{DEFAULT_INSTANCE, INSTANCE_LABEL};
    let mut loaded = crate::testkit::examples();
    let all = served_by(DEFAULT_INSTANCE, &loaded.classes, &loaded.budgets);
    assert_eq!(all.classes.len(), loaded.classes.len());
    assert_eq!(all.budgets.len(), loaded.budgets.len());
    assert!(all.classes_elsewhere.is_empty());
    let other = served_by("team-b", &loaded.classes, &loaded.budgets);
    assert!(other.classes.is_empty() && other.budgets.is_empty());
    assert_eq!(other.classes_elsewhere.len(), loaded.classes.len());
    assert!(
        other
            .classes_elsewhere
            .values()
            .all(|i| i == DEFAULT_INSTANCE)
    );

    let b_label = crate::testkit::labels(&[(INSTANCE_LABEL, "team-b")]);
    loaded.classes[0].metadata.labels = Some(b_label.clone());
    loaded.budgets[0].metadata.labels = Some(b_label);
    let b_class = name_of(&loaded.classes[0].metadata);
    let default = served_by(DEFAULT_INSTANCE, &loaded.classes, &loaded.budgets);
    let team_b = served_by("team-b", &loaded.classes, &loaded.budgets);
    assert_eq!(default.classes_elsewhere[&b_class], "team-b");
    assert_eq!(default.classes.len() + 1, loaded.classes.len());
    assert_eq!(default.budgets.len() + 1, loaded.budgets.len());
    assert_eq!(team_b.classes.len(), 1);
    assert_eq!(team_b.budgets.len(), 1);
    assert_eq!(team_b.classes_elsewhere.len() + 1, loaded.classes.len());
}
