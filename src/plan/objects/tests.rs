//! Tests of the built objects: priced queues match the labels, team weights, CPU quotas.

use proptest::prelude::*;

use super::*;
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::inventory::synthetic::generate_fleet;
use crate::plan::tests::{arb_budgets, arb_classes, arb_health, budget, run};
use crate::plan::{Plan, PlanInput, plan};

/// What the controller derives today (`controller::priced_queues`), restated:
/// the planned ClusterQueues' budget and class labels, plus the queue of every
/// grant whose class is invalid.
fn priced_from_labels(
    planned: &Plan,
    budgets: &[CreditBudget],
) -> BTreeMap<String, (String, String)> {
    let mut queues: BTreeMap<String, (String, String)> = planned
        .cluster_queues
        .iter()
        .filter_map(|q| {
            let labels = q.metadata.labels.as_ref()?;
            Some((
                q.metadata.name.clone()?,
                (
                    labels.get(BUDGET_LABEL)?.clone(),
                    labels.get(CLASS_LABEL)?.clone(),
                ),
            ))
        })
        .collect();
    for budget in budgets {
        let name = budget.name_any();
        for grant in &budget.spec.classes {
            if planned.classes.get(&grant.name).is_some_and(|c| !c.valid) {
                queues
                    .entry(cluster_queue_name(&name, &grant.name))
                    .or_insert_with(|| (name.clone(), grant.name.clone()));
            }
        }
    }
    queues
}

#[test]
fn priced_queues_of_the_examples_are_the_label_derived_map() {
    let loaded = crate::testkit::examples();
    let (planned, _) = run(
        &loaded.classes,
        &loaded.budgets,
        &loaded.nodes,
        &HealthSnapshot::default(),
    );
    assert_eq!(planned.priced_queues.len(), planned.cluster_queues.len());
    assert_eq!(
        planned.priced_queues,
        priced_from_labels(&planned, &loaded.budgets)
    );
}

#[test]
fn the_queues_of_an_invalid_class_stay_priced() {
    let mut loaded = crate::testkit::examples();
    let target = loaded.budgets[0].spec.classes[0].name.clone();
    let owner = loaded.budgets[0].name_any();
    let class = loaded
        .classes
        .iter_mut()
        .find(|c| c.name_any() == target)
        .expect("the granted class exists");
    class.spec.credits.per_device_hour = "abc".into();
    // An invalid budget's grants of the invalid class are priced too.
    let mut invalid_budget = budget("zz-invalid", &["zz"], &[(target.as_str(), 1)]);
    invalid_budget.spec.fair_share_weight = Some("-1".into());
    loaded.budgets.push(invalid_budget);

    let (planned, _) = run(
        &loaded.classes,
        &loaded.budgets,
        &loaded.nodes,
        &HealthSnapshot::default(),
    );
    let queue = cluster_queue_name(&owner, &target);
    assert!(
        !planned
            .cluster_queues
            .iter()
            .any(|q| q.metadata.name.as_deref() == Some(queue.as_str()))
    );
    assert_eq!(planned.priced_queues[&queue], (owner, target.clone()));
    assert_eq!(
        planned.priced_queues[&cluster_queue_name("zz-invalid", &target)],
        ("zz-invalid".to_string(), target)
    );
    assert_eq!(
        planned.priced_queues,
        priced_from_labels(&planned, &loaded.budgets)
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn priced_queues_of_random_fleets_are_the_label_derived_map(
        (mut classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        fleet_size in 5usize..40,
        seed in any::<u64>(),
        invalid in any::<prop::sample::Index>(),
    ) {
        // One class the ledger cannot price, so invalid grants are covered too.
        let broken = invalid.index(classes.len());
        classes[broken].spec.credits.per_device_hour = "-1".into();
        let nodes = generate_fleet(fleet_size, seed);
        let health = arb_health(&nodes, seed);
        let inventory = Inventory::from_nodes(&nodes);
        let options = PlanOptions::default();
        let planned = plan(&PlanInput {
            classes: &classes,
            budgets: &budgets,
            inventory: &inventory,
            health: &health,
            options: &options,
        });
        prop_assert_eq!(&planned.priced_queues, &priced_from_labels(&planned, &budgets));
    }
}

#[test]
fn team_weight_is_explicit_or_credits_per_day() {
    let mut team = budget("team", &["ns"], &[("gpu", 1)]);
    // 3000 credits over 30 days.
    let weight = |spec: &api::CreditBudgetSpec| {
        let amounts = crate::api::parsed::parse_budget(spec).expect("a valid budget");
        team_weight(&amounts, spec.credits.period.days)
    };
    assert_eq!(weight(&team.spec), Quantity("100000m".into()));
    team.spec.fair_share_weight = Some("2.5".into());
    assert_eq!(weight(&team.spec), Quantity("2500m".into()));
}

#[test]
fn cpu_quotas_are_whole_cores_when_they_can_be() {
    assert_eq!(cpu_quantity(64_000), Quantity("64".into()));
    assert_eq!(cpu_quantity(1_500), Quantity("1500m".into()));
}

#[test]
fn per_device_rates_keep_eight_significant_bits_and_round_down() {
    // 24 cores a device, exactly: kept.
    assert_eq!(per_device(192_000, 8), 24_000);
    // The fleet average a little above it lands on the same step.
    assert_eq!(per_device(192_238 * 800, 8 * 800), 24_000);
    assert_eq!(per_device(192_239 * 800, 8 * 800), 24_000);
    // 256 GiB a device is a power of two: kept.
    assert_eq!(per_device(2 << 40, 8), 256 << 30);
    // Small rates are exact.
    assert_eq!(per_device(3_400, 1), 3_400);
    assert_eq!(per_device(255, 1), 255);
    assert_eq!(per_device(0, 8), 0);
    assert_eq!(per_device(1_000, 0), 0);
}

proptest::proptest! {
    /// Never above the exact rate, and less than 0.4 % below it.
    #[test]
    fn per_device_is_within_a_step_below_the_exact_rate(total in 0u64..1 << 50, devices in 1u64..100_000) {
        let exact = total / devices;
        let rounded = per_device(total, devices);
        proptest::prop_assert!(rounded <= exact);
        proptest::prop_assert!((exact - rounded) as f64 <= exact as f64 / 256.0);
    }
}

/// The plan of `classes`, `budgets` and `nodes`, given what the last plan left
/// (a fresh [`crate::plan::plan`] without it).
fn plan_carried(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[k8s_openapi::api::core::v1::Node],
    carried: Option<&mut crate::plan::Carried>,
) -> Plan {
    let input = PlanInput {
        classes,
        budgets,
        inventory: &Inventory::from_nodes(nodes),
        health: &HealthSnapshot::default(),
        options: &PlanOptions::default(),
    };
    match carried {
        Some(carried) => crate::plan::plan_carrying(&input, carried),
        None => crate::plan::plan(&input),
    }
}

/// The plan of `classes`, `budgets` and `nodes`, given `kept` LocalQueues.
fn plan_of(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[k8s_openapi::api::core::v1::Node],
    kept: Option<&LocalQueues>,
) -> Plan {
    let mut carried = kept.map(|kept| crate::plan::Carried {
        local_queues: kept.clone(),
        ..Default::default()
    });
    plan_carried(classes, budgets, nodes, carried.as_mut())
}

fn json_of(planned: &Plan) -> serde_json::Value {
    serde_json::to_value(planned).expect("a plan serialises")
}

#[test]
fn a_node_change_reuses_the_local_queues_a_budget_change_builds_them() {
    let loaded = crate::testkit::examples();
    let (classes, mut budgets, mut nodes) = (loaded.classes, loaded.budgets, loaded.nodes);
    for (i, b) in budgets.iter_mut().enumerate() {
        b.metadata.uid = Some(format!("uid-{i}")); // owner references too
    }
    let before = plan_of(&classes, &budgets, &nodes, None);
    assert!(!before.local_queues.is_empty());

    // A Node relabelled (its GPUs gone): quota moves, the queues do not.
    let node = nodes
        .iter_mut()
        .find(|n| n.labels().keys().any(|k| k.starts_with("nvidia.com/")))
        .expect("an NVIDIA node in the examples");
    node.labels_mut()
        .retain(|k, _| !k.starts_with("nvidia.com/"));
    let reused = plan_of(&classes, &budgets, &nodes, Some(&before.local_queues));
    assert!(reused.local_queues.shared_with(&before.local_queues));
    assert_eq!(
        json_of(&reused),
        json_of(&plan_of(&classes, &budgets, &nodes, None))
    );

    // Each input a queue is built from, changed: built again, as a fresh plan has it.
    type Edit = (&'static str, fn(&mut CreditBudget));
    let edits: [Edit; 4] = [
        ("namespace", |b| {
            b.spec.namespaces = vec!["elsewhere".into()]
        }),
        ("team label", |b| b.spec.team = "another-team".into()),
        ("owner", |b| b.metadata.uid = Some("uid-recreated".into())),
        ("grants", |b| b.spec.classes.truncate(0)),
    ];
    for (what, edit) in edits {
        let mut changed = budgets.clone();
        edit(&mut changed[0]);
        let replanned = plan_of(&classes, &changed, &nodes, Some(&before.local_queues));
        assert!(
            !replanned.local_queues.shared_with(&before.local_queues),
            "{what} changed, the queues reused"
        );
        assert_eq!(
            json_of(&replanned),
            json_of(&plan_of(&classes, &changed, &nodes, None)),
            "{what} changed"
        );
    }

    // Queues edited after planning are never reused, even unchanged.
    let mut edited = before.local_queues.clone();
    edited.make_mut();
    let replanned = plan_of(&classes, &budgets, &nodes, Some(&edited));
    assert!(!replanned.local_queues.shared_with(&edited));
    assert_eq!(
        json_of(&replanned),
        json_of(&plan_of(&classes, &budgets, &nodes, None))
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Carrying what the last plan left (its LocalQueues, its purity verdicts)
    /// never changes a plan, whatever changed since; and with the budgets and
    /// classes unchanged the queues are reused whenever the same are called for.
    #[test]
    fn what_a_plan_carries_never_changes_the_next(
        (classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        fleet_size in 5usize..30,
        (seed_before, seed_after) in (any::<u64>(), any::<u64>()),
        edit in 0u8..8,
        which in any::<prop::sample::Index>(),
        with_uids in any::<bool>(),
    ) {
        let mut budgets = budgets;
        if with_uids {
            for (i, b) in budgets.iter_mut().enumerate() {
                b.metadata.uid = Some(format!("uid-{i}"));
            }
        }
        let mut carried = crate::plan::Carried::default();
        let before = plan_carried(&classes, &budgets, &generate_fleet(fleet_size, seed_before), Some(&mut carried));
        let (mut classes_after, mut budgets_after) = (classes.clone(), budgets.clone());
        let b = which.index(budgets_after.len());
        match edit {
            1 => budgets_after[b].metadata.uid = Some("uid-new".into()),
            2 => budgets_after[b].spec.team = "team-renamed".into(),
            3 => budgets_after[b].spec.namespaces = vec!["ns-moved".into()],
            4 => budgets_after[b].spec.classes.truncate(1),
            5 => {
                let c = which.index(classes_after.len());
                classes_after[c].spec.credits.per_device_hour = "-1".into();
            }
            6 => budgets_after.reverse(),
            7 => budgets_after[b].metadata.name = Some("team-renamed".into()),
            _ => {}
        }
        let nodes_after = generate_fleet(fleet_size, seed_after);
        let reused = plan_carried(&classes_after, &budgets_after, &nodes_after, Some(&mut carried));
        let fresh = plan_of(&classes_after, &budgets_after, &nodes_after, None);
        prop_assert_eq!(json_of(&reused), json_of(&fresh));
        prop_assert_eq!(&reused.impure_flavors, &fresh.impure_flavors);
        prop_assert_eq!(&reused.classes, &fresh.classes);
        if edit == 0 && serde_json::to_value(&*fresh.local_queues).ok()
            == serde_json::to_value(&*before.local_queues).ok()
        {
            prop_assert!(reused.local_queues.shared_with(&before.local_queues));
        }
    }
}
