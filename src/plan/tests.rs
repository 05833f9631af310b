//! Planner tests: examples, the invariants as properties over random fleets, and
//! the conflict cases. The invariant checks read the generated Kueue objects and
//! recount capacity from the inventory independently of the planner's own report.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use proptest::prelude::*;

use super::*;
use crate::api::{
    self, AcceleratorClassSpec, ClassGrant, CreditAllowance, CreditBudgetSpec, CreditRate,
    HardwareSelector, Period, Pooling,
};
use crate::inventory::synthetic::generate_fleet;

pub(super) fn class(
    name: &str,
    sharing: SharingMode,
    selector: HardwareSelector,
) -> AcceleratorClass {
    AcceleratorClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: AcceleratorClassSpec {
            description: None,
            sharing,
            selector,
            pooling: Pooling::default(),
            preference: vec![],
            credits: CreditRate {
                per_device_hour: "1".into(),
                model_overrides: vec![],
            },
        },
        status: None,
    }
}

pub(super) fn budget(name: &str, namespaces: &[&str], grants: &[(&str, u32)]) -> CreditBudget {
    CreditBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CreditBudgetSpec {
            team: name.into(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            classes: grants
                .iter()
                .map(|(c, n)| ClassGrant {
                    name: c.to_string(),
                    guaranteed_devices: *n,
                })
                .collect(),
            credits: CreditAllowance {
                per_period: "3000".into(),
                period: Period {
                    start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::from_second(1_764_547_200).unwrap(),
                    ),
                    days: 30,
                },
                top_ups: Vec::new(),
            },
            fair_share_weight: None,
            on_exhaustion: ExhaustionPolicy::Hold,
            allow_borrowing: true,
            admission: Default::default(),
        },
        status: None,
    }
}

pub(super) fn run(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[Node],
    health: &HealthSnapshot,
) -> (Plan, Inventory) {
    let inventory = Inventory::from_nodes(nodes);
    let options = PlanOptions::default();
    let plan = plan(&PlanInput {
        classes,
        budgets,
        inventory: &inventory,
        health,
        options: &options,
    });
    (plan, inventory)
}

fn examples() -> (Vec<AcceleratorClass>, Vec<CreditBudget>, Vec<Node>) {
    let loaded = crate::testkit::examples();
    (loaded.classes, loaded.budgets, loaded.nodes)
}

pub(super) fn qty(q: &Quantity) -> u64 {
    q.0.parse()
        .unwrap_or_else(|_| panic!("device quantity {q:?} is not an integer"))
}

/// Nominal quota of each (flavor, device resource) over every ClusterQueue and the
/// root Cohort.
pub(super) fn device_quota(plan: &Plan) -> BTreeMap<(String, String), u64> {
    let mut quota: BTreeMap<(String, String), u64> = BTreeMap::new();
    let groups = plan
        .cluster_queues
        .iter()
        .flat_map(|q| q.spec.resource_groups.iter())
        .chain(
            plan.cohorts
                .iter()
                .flat_map(|c| c.spec.resource_groups.iter()),
        );
    for rg in groups {
        for f in &rg.flavors {
            for r in &f.resources {
                if r.name != "cpu" && r.name != "memory" {
                    *quota.entry((f.name.clone(), r.name.clone())).or_default() +=
                        qty(&r.nominal_quota);
                }
            }
        }
    }
    quota
}

/// The flavor's nodeLabels select the node.
pub(super) fn selects(flavor: &ResourceFlavor, node: &NodeInventory) -> bool {
    flavor
        .spec
        .node_labels
        .iter()
        .all(|(k, v)| node.labels.get(k) == Some(v))
}

/// New pods of the flavor could land on the node: Ready, not cordoned, and no
/// NoSchedule/NoExecute taint the flavor does not tolerate.
pub(super) fn open_to(flavor: &ResourceFlavor, node: &NodeInventory) -> bool {
    let tolerated: Vec<&str> = flavor
        .spec
        .tolerations
        .iter()
        .filter_map(|t| t.key.as_deref())
        .collect();
    let tainted = node.taints.iter().any(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute")
            && !tolerated.contains(&t.key.as_str())
    });
    node.accepts_new_pods() && !tainted
}

/// Invariant 1, recounted from scratch: for each flavor, the nominal quota of its
/// resource across every ClusterQueue and the root Cohort is at most the healthy,
/// schedulable devices on nodes carrying all of the flavor's node labels.
fn assert_quota_within_healthy_capacity(
    plan: &Plan,
    inventory: &Inventory,
    health: &HealthSnapshot,
    unknown_counts: bool,
) {
    let quota = device_quota(plan);
    for flavor in &plan.resource_flavors {
        let fname = flavor.metadata.name.clone().unwrap();
        for ((qf, resource), amount) in &quota {
            if *qf != fname {
                continue;
            }
            let mut healthy = 0u64;
            for node in inventory.nodes.values() {
                if !selects(flavor, node) || !open_to(flavor, node) {
                    continue;
                }
                for g in node
                    .groups
                    .iter()
                    .filter(|g| &g.variant.resource_name == resource)
                {
                    let c = health.counts_for(node, g);
                    let usable = c.healthy + c.warning + if unknown_counts { c.unknown } else { 0 };
                    healthy += u64::from(usable.min(g.allocatable));
                }
            }
            assert!(
                *amount <= healthy,
                "flavor {fname}: quota {amount} of {resource} exceeds healthy capacity {healthy}"
            );
        }
    }
}

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
            MANAGED_BY
        );
    }
    // No AdmissionCheck unless the ledger is on: an unanswered check blocks admission.
    assert!(
        plan.cluster_queues
            .iter()
            .all(|q| q.spec.admission_checks_strategy.is_none())
    );
}

#[test]
fn failed_devices_shrink_quota_and_warnings_demote_a_flavor() {
    let (classes, budgets, nodes) = examples();
    let (healthy_plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = healthy_plan.flavors[h100].healthy_capacity;

    let mut health = HealthSnapshot::default();
    let h100_nodes: Vec<&String> = healthy_plan.flavors[h100].nodes.iter().collect();
    health.set(
        h100_nodes[0],
        "nvidia.com/gpu",
        HealthCounts {
            healthy: 5,
            failed: 3,
            ..Default::default()
        },
    );
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    assert!(plan.flavors[h100].healthy_capacity < before);
    assert!(plan.flavors[h100].granted <= plan.flavors[h100].healthy_capacity);
    assert_quota_within_healthy_capacity(&plan, &inventory, &health, true);
    let large = &plan.classes["large-training"];
    assert!(
        large
            .conditions
            .iter()
            .any(|c| c.type_ == api::DEGRADED && c.status)
    );

    // Every H100 node warns: H100 moves behind MI300X in every class using it.
    let mut health = HealthSnapshot::default();
    for n in &h100_nodes {
        health.set(
            n,
            "nvidia.com/gpu",
            HealthCounts {
                healthy: 4,
                warning: 4,
                ..Default::default()
            },
        );
    }
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    let large = &plan.classes["large-training"];
    assert_ne!(large.flavors[0].name, h100);
    assert!(
        large
            .flavors
            .iter()
            .find(|f| f.name == h100)
            .unwrap()
            .demoted
    );
    let cq = plan
        .cluster_queues
        .iter()
        .find(|q| q.metadata.name.as_deref() == Some("vision-large-training"))
        .unwrap();
    assert_ne!(cq.spec.resource_groups[0].flavors[0].name, h100);
}

#[test]
fn unknown_health_keeps_capacity_but_is_visible() {
    let (classes, budgets, nodes) = examples();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = plan.flavors[h100].healthy_capacity;
    let mut health = HealthSnapshot::default();
    for n in &plan.flavors[h100].nodes {
        health.set(
            n,
            "nvidia.com/gpu",
            HealthCounts {
                unknown: 8,
                ..Default::default()
            },
        );
    }
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    assert_eq!(
        plan.flavors[h100].healthy_capacity, before,
        "a dead exporter must not drain quota"
    );
    assert!(plan.flavors[h100].devices.unknown >= 31);
}

#[test]
fn cordoned_and_not_ready_nodes_leave_capacity() {
    let (classes, budgets, mut nodes) = examples();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = plan.flavors[h100].healthy_capacity;
    let target = plan.flavors[h100].nodes.iter().next().unwrap().clone();
    let node = nodes
        .iter_mut()
        .find(|n| n.metadata.name.as_ref() == Some(&target))
        .unwrap();
    node.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    assert!(plan.flavors[h100].healthy_capacity < before);
    assert_quota_within_healthy_capacity(&plan, &inventory, &HealthSnapshot::default(), true);
}

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

// ---- properties over random fleets ----

fn vendor_subset(bits: u8) -> Vec<Vendor> {
    Vendor::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, v)| *v)
        .collect()
}

prop_compose! {
    fn arb_class(i: usize)(
        sharing in prop_oneof![Just(SharingMode::Whole), Just(SharingMode::Partition), Just(SharingMode::TimeShare), Just(SharingMode::CpuOnly)],
        vendors in any::<u8>(),
        min_memory in prop_oneof![Just(None), Just(Some(16_000u64)), Just(Some(40_000)), Just(Some(80_000))],
        profile in prop_oneof![Just("1g.10gb"), Just("3g.40gb"), Just("cpx_nps4"), Just("4c"), Just("neuroncore")],
        split in prop::bool::weighted(0.2),
        prefer_amd in any::<bool>(),
    ) -> AcceleratorClass {
        let sel = match sharing {
            SharingMode::CpuOnly => HardwareSelector::default(),
            _ => HardwareSelector {
                vendors: vendor_subset(vendors),
                min_memory_mib: if sharing == SharingMode::Whole { min_memory } else { None },
                partition_profile: (sharing == SharingMode::Partition).then(|| profile.to_string()),
                ..Default::default()
            },
        };
        let mut c = class(&format!("class-{i}"), sharing, sel);
        if split { c.spec.pooling.split_by = vec!["topology.kubernetes.io/zone".into()]; }
        if prefer_amd { c.spec.preference = vec!["*MI300X*".into()]; }
        c
    }
}

pub(super) fn arb_classes() -> impl Strategy<Value = Vec<AcceleratorClass>> {
    (1usize..7).prop_flat_map(|n| (0..n).map(arb_class).collect::<Vec<_>>())
}

pub(super) fn arb_budgets(classes: usize) -> impl Strategy<Value = Vec<CreditBudget>> {
    prop::collection::vec(
        prop::collection::vec((0..classes + 1, 0u32..120), 1..5),
        1..6,
    )
    .prop_map(|budgets| {
        budgets
            .into_iter()
            .enumerate()
            .map(|(i, grants)| {
                let mut seen = std::collections::BTreeSet::new();
                let grants: Vec<(String, u32)> = grants
                    .into_iter()
                    .filter(|(c, _)| seen.insert(*c))
                    .map(|(c, n)| (format!("class-{c}"), n)) // class-{classes} does not exist
                    .collect();
                let refs: Vec<(&str, u32)> = grants.iter().map(|(c, n)| (c.as_str(), *n)).collect();
                budget(&format!("team-{i}"), &[&format!("ns-{i}")], &refs)
            })
            .collect()
    })
}

pub(super) fn arb_health(nodes: &[Node], seed: u64) -> HealthSnapshot {
    let inventory = Inventory::from_nodes(nodes);
    let mut health = HealthSnapshot::default();
    let mut x = seed | 1;
    for (node, group) in inventory.groups() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(3) {
            let cap = group.capacity;
            let failed = (x >> 8) as u32 % (cap + 1);
            let warning = (x >> 16) as u32 % (cap - failed + 1);
            let unknown = (x >> 24) as u32 % (cap - failed - warning + 1);
            health.set(
                &node.name,
                &group.variant.resource_name,
                HealthCounts {
                    healthy: cap - failed - warning - unknown,
                    warning,
                    failed,
                    unknown,
                    ..Default::default()
                },
            );
        }
    }
    health
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn invariants_hold_on_random_fleets(
        (classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        fleet_size in 5usize..60,
        seed in any::<u64>(),
        unknown_counts in any::<bool>(),
    ) {
        let nodes = generate_fleet(fleet_size, seed);
        let health = arb_health(&nodes, seed);
        let inventory = Inventory::from_nodes(&nodes);
        let options = PlanOptions { unknown_counts_as_capacity: unknown_counts, ..Default::default() };
        let input = PlanInput { classes: &classes, budgets: &budgets, inventory: &inventory, health: &health, options: &options };
        let first = plan(&input);

        // Invariant 1.
        assert_quota_within_healthy_capacity(&first, &inventory, &health, unknown_counts);

        // Determinism: same input, and the same input in another order, give
        // byte-identical objects.
        let again = plan(&input);
        prop_assert_eq!(crate::cli::plan_yaml(&first), crate::cli::plan_yaml(&again));
        let mut rev_classes = classes.clone(); rev_classes.reverse();
        let mut rev_budgets = budgets.clone(); rev_budgets.reverse();
        let mut rev_nodes = nodes.clone(); rev_nodes.reverse();
        let rev_inventory = Inventory::from_nodes(&rev_nodes);
        let reordered = plan(&PlanInput { classes: &rev_classes, budgets: &rev_budgets, inventory: &rev_inventory, health: &health, options: &options });
        prop_assert_eq!(crate::cli::plan_yaml(&first), crate::cli::plan_yaml(&reordered));

        for flavor in &first.resource_flavors {
            let name = flavor.metadata.name.clone().unwrap();
            let report = &first.flavors[&name];
            // Whole devices, partitions and time-share never share a flavor: every
            // device group on a node the flavor selects, with the flavor's resource,
            // has the flavor's sharing mode.
            for node in inventory.nodes.values() {
                if !flavor.spec.node_labels.iter().all(|(k, v)| node.labels.get(k) == Some(v)) { continue; }
                for g in node.groups.iter().filter(|g| g.variant.resource_name == report.resource_name) {
                    prop_assert_eq!(g.variant.sharing, report.sharing, "flavor {} mixes sharing modes", name);
                    prop_assert_eq!(&g.variant.model, &report.model, "flavor {} mixes models", name);
                }
            }
        }

        // A model never lands in a class whose hard constraint it fails.
        for c in &classes {
            let report = &first.classes[c.metadata.name.as_ref().unwrap()];
            for f in &report.flavors {
                prop_assert_eq!(&f.sharing, &c.spec.sharing.to_string());
                if c.spec.sharing == SharingMode::CpuOnly { continue; }
                let fr = &first.flavors[&f.name];
                let vendor = fr.vendor.unwrap();
                prop_assert!(c.spec.selector.vendors.is_empty() || c.spec.selector.vendors.contains(&vendor));
                if let Some(p) = &c.spec.selector.partition_profile {
                    prop_assert_eq!(fr.partition_profile.as_ref(), Some(p));
                }
                if let Some(min) = c.spec.selector.min_memory_mib {
                    for node in &fr.nodes {
                        for g in inventory.nodes[node].groups.iter().filter(|g| g.variant.resource_name == fr.resource_name && g.variant.model == fr.model) {
                            prop_assert!(g.memory_mib.is_some_and(|m| m >= min), "{} MiB in class needing {}", g.memory_mib.unwrap_or(0), min);
                        }
                    }
                }
            }
        }
    }
}

/// A CPU-only class without node labels: its flavor is pinned to `kaccel.io/pool=cpu`
/// (never empty nodeLabels, which select every node), its quota counts only labelled
/// nodes with no accelerator of any kind — not an accelerator node kaccel cannot
/// classify — and an accelerator node carrying the pool label is reported.
#[test]
fn cpu_pool_counts_only_accelerator_free_nodes_it_selects() {
    let node = |name: &str, labels: &str, extra: &str, cpu: u32| -> Node {
        serde_yaml::from_str(&format!(
            r#"
metadata: {{name: {name}, labels: {{{labels}}}}}
status:
  capacity: {{cpu: "{cpu}", memory: 64Gi{extra}}}
  allocatable: {{cpu: "{cpu}", memory: 64Gi{extra}}}
  conditions: [{{type: Ready, status: "True"}}]
"#
        ))
        .unwrap()
    };
    let nodes = vec![
        node("cpu-labelled", "kaccel.io/pool: cpu", "", 32),
        node("cpu-unlabelled", "", "", 16),
        // Qualcomm Cloud AI 100 (`qualcomm.com/qaic`): no kaccel adapter reads it.
        node(
            "qaic-01",
            "kaccel.io/pool: cpu",
            ", qualcomm.com/qaic: \"8\"",
            64,
        ),
        // GPU Feature Discovery labels, device plugin not (yet) advertising GPUs.
        node("gpu-no-plugin", "nvidia.com/gpu.present: \"true\"", "", 48),
    ];
    let cpu = class("cpu", SharingMode::CpuOnly, HardwareSelector::default());
    let (plan, inventory) = run(
        &[cpu],
        &[budget("t", &["t"], &[("cpu", 8)])],
        &nodes,
        &HealthSnapshot::default(),
    );
    assert_eq!(inventory.unclassified().count(), 2);
    let flavor = plan
        .flavors
        .values()
        .find(|f| f.classes.contains("cpu"))
        .expect("CPU flavor");
    assert_eq!(
        flavor.node_labels,
        BTreeMap::from([(CPU_POOL_LABEL.to_string(), CPU_POOL_VALUE.to_string())])
    );
    assert_eq!(
        flavor.nodes.iter().map(String::as_str).collect::<Vec<_>>(),
        vec!["cpu-labelled"]
    );
    assert_eq!(flavor.healthy_capacity, 32);
    let rf = plan
        .resource_flavors
        .iter()
        .find(|rf| rf.metadata.name.as_deref() == Some(flavor.name.as_str()))
        .unwrap();
    assert_eq!(rf.spec.node_labels, flavor.node_labels);
    let conflict = plan.classes["cpu"]
        .conditions
        .iter()
        .find(|c| c.type_ == api::CONFLICT)
        .expect("the pool label on an accelerator node is reported");
    assert!(conflict.message.contains("qaic-01"), "{}", conflict.message);
    assert!(!conflict.message.contains("cpu-labelled"));
}
