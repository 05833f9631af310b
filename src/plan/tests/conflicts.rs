//! Conflicts become conditions: bad references, unpriceable rates, clashing pools, exhausted budgets.

use super::*;

#[test]
fn bad_references_become_conditions_not_panics() {
    let (mut classes, mut budgets, nodes) = examples();
    budgets.push(budget(
        "ghost",
        &["ghost-ns"],
        &[("does-not-exist", 4), ("inference", 1)],
    ));
    let created = |secs| {
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(secs).unwrap(),
        ))
    };
    for b in budgets.iter_mut() {
        b.metadata.creation_timestamp = created(1_700_000_000);
    }
    // Alphabetically first, but created later: it must not take vision's namespace.
    let mut squatter = budget("squatter", &["vision-prod"], &[("inference", 1)]);
    squatter.metadata.creation_timestamp = created(1_800_000_000);
    budgets.push(squatter);
    let mut bad = class(
        "bad-partition",
        SharingMode::Partition,
        HardwareSelector::default(),
    );
    bad.spec.credits.per_device_hour = "-1".into();
    classes.push(bad);
    classes.push(class(
        "impossible",
        SharingMode::Whole,
        HardwareSelector {
            min_memory_mib: Some(10_000_000),
            ..Default::default()
        },
    ));
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());

    let ghost = &plan.budgets["ghost"];
    assert!(
        ghost
            .conditions
            .iter()
            .any(|c| c.type_ == "ClassNotFound" && c.message.contains("does-not-exist"))
    );
    assert!(
        plan.cluster_queues
            .iter()
            .any(|q| q.metadata.name.as_deref() == Some("ghost-inference"))
    );
    assert!(!plan.cluster_queues.iter().any(|q| {
        q.metadata
            .name
            .as_deref()
            .unwrap()
            .contains("does-not-exist")
    }));

    let squatter = &plan.budgets["squatter"];
    assert!(
        squatter
            .conditions
            .iter()
            .any(|c| c.type_ == api::CONFLICT && c.message.contains("vision-prod"))
    );
    assert!(
        !plan
            .local_queues
            .iter()
            .any(|q| q.metadata.labels.as_ref().unwrap()[BUDGET_LABEL] == "squatter")
    );

    let bad = &plan.classes["bad-partition"];
    assert!(!bad.valid);
    let invalid = bad
        .conditions
        .iter()
        .find(|c| c.type_ == api::INVALID)
        .unwrap();
    assert!(invalid.message.contains("spec.selector.partitionProfile"));
    assert!(invalid.message.contains("spec.credits.perDeviceHour"));

    let impossible = &plan.classes["impossible"];
    let nmh = impossible
        .conditions
        .iter()
        .find(|c| c.type_ == api::NO_MATCHING_HARDWARE)
        .unwrap();
    assert!(nmh.message.contains("minMemoryMiB"), "{}", nmh.message);
}

#[test]
fn a_rate_the_ledger_cannot_price_makes_the_class_invalid() {
    let (mut classes, budgets, nodes) = examples();
    let target = classes[0].metadata.name.clone().unwrap();
    // Passes the old CEL rule (12 integer digits) and parses as credits, but a year
    // of one device would not fit the ledger: Invalid, never priced.
    classes[0].spec.credits.per_device_hour = "999999999999".into();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let report = &plan.classes[&target];
    assert!(!report.valid);
    let invalid = report
        .conditions
        .iter()
        .find(|c| c.type_ == api::INVALID && c.status)
        .expect("an Invalid condition");
    assert!(
        invalid.message.contains("spec.credits.perDeviceHour")
            && invalid.message.contains("largest rate, 999999999.999999")
            && invalid.message.contains("use a smaller credit unit"),
        "{}",
        invalid.message
    );
    assert!(
        !plan
            .cluster_queues
            .iter()
            .any(|q| { q.metadata.labels.as_ref().unwrap()[CLASS_LABEL] == target }),
        "no ClusterQueue prices with an unusable rate"
    );
}

#[test]
fn classes_pooling_the_same_hardware_differently_conflict() {
    let (_, _, nodes) = examples();
    let sel = HardwareSelector {
        models: vec!["*H100*".into()],
        ..Default::default()
    };
    let a = class("a-plain", SharingMode::Whole, sel.clone());
    let mut b = class("b-zoned", SharingMode::Whole, sel);
    b.spec.pooling.split_by = vec!["topology.kubernetes.io/zone".into()];
    let (plan, inventory) = run(
        &[a, b],
        &[budget("t", &["t"], &[("a-plain", 8), ("b-zoned", 8)])],
        &nodes,
        &HealthSnapshot::default(),
    );
    let conflict = plan.classes["b-zoned"]
        .conditions
        .iter()
        .find(|c| c.type_ == api::CONFLICT)
        .expect("conflict");
    assert!(conflict.message.contains("a-plain"));
    assert_quota_within_healthy_capacity(&plan, &inventory, &HealthSnapshot::default(), true);
}

#[test]
fn exhausted_budget_holds_its_queues_and_admission_check_is_referenced() {
    let (classes, budgets, nodes) = examples();
    let inventory = Inventory::from_nodes(&nodes);
    let options = PlanOptions {
        admission_check: Some("kaccel-credits".into()),
        held_budgets: BTreeMap::from([("vision".to_string(), ExhaustionPolicy::HoldAndDrain)]),
        ..Default::default()
    };
    let health = HealthSnapshot::default();
    let plan = plan(&PlanInput {
        classes: &classes,
        budgets: &budgets,
        inventory: &inventory,
        health: &health,
        options: &options,
    });
    for q in &plan.cluster_queues {
        let budget = &q.metadata.labels.as_ref().unwrap()[BUDGET_LABEL];
        let want = if budget == "vision" {
            "HoldAndDrain"
        } else {
            "None"
        };
        assert_eq!(q.spec.stop_policy.as_deref(), Some(want));
        assert_eq!(
            q.spec
                .admission_checks_strategy
                .as_ref()
                .unwrap()
                .admission_checks[0]
                .name,
            "kaccel-credits"
        );
    }
    assert!(
        plan.budgets["vision"]
            .conditions
            .iter()
            .any(|c| c.type_ == api::EXHAUSTED && c.status)
    );
}
