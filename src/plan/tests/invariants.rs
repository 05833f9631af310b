//! The invariants as properties over random fleets: capacity, determinism, purity, constraints.

use proptest::prelude::*;

use super::*;

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
                if !node.labels.carries_all(&flavor.spec.node_labels) { continue; }
                for g in node.groups.iter().filter(|g| g.variant.resource_name == report.device_resource_name) {
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
                        for g in inventory.nodes[node].groups.iter().filter(|g| g.variant.resource_name == fr.device_resource_name && g.variant.model == fr.model) {
                            prop_assert!(g.memory_mib.is_some_and(|m| m >= min), "{} MiB in class needing {}", g.memory_mib.unwrap_or(0), min);
                        }
                    }
                }
            }
        }
    }
}
