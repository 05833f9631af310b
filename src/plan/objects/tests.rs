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
