//! Splitting healthy capacity into nominal quotas (invariant 1).
//!
//! Each (budget, class) asks for its guaranteed amount and walks the class's
//! flavors in preference order. At preference level k every unmet demand asks its
//! k-th flavor; a flavor that cannot serve all askers at a level is shared in
//! proportion to what each still needs (largest remainder, ties by name), and the
//! rest spills to the next level. By construction the total granted on a flavor
//! never exceeds its capacity, and the result depends only on the input.
//!
//! Stage 7 of the planner, [`split`], runs [`allocate`] over the budgets' demands
//! and records the result on the flavor and budget reports.

use std::collections::BTreeMap;

use crate::api::{self, DesiredCondition};

use super::{BudgetReport, FlavorReport};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Demand {
    pub budget: String,
    pub class: String,
    pub amount: u64,
    /// Flavor names in preference order.
    pub flavors: Vec<String>,
}

/// Returns, for each demand (same order), the amount granted per flavor.
pub fn allocate(
    demands: &[Demand],
    capacity: &BTreeMap<String, u64>,
) -> Vec<BTreeMap<String, u64>> {
    let mut remaining_capacity = capacity.clone();
    let mut unmet: Vec<u64> = demands.iter().map(|d| d.amount).collect();
    let mut granted: Vec<BTreeMap<String, u64>> = vec![BTreeMap::new(); demands.len()];
    let levels = demands.iter().map(|d| d.flavors.len()).max().unwrap_or(0);

    for level in 0..levels {
        // flavor -> demand indices asking it at this level
        let mut askers: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
        for (i, d) in demands.iter().enumerate() {
            if unmet[i] > 0
                && let Some(f) = d.flavors.get(level)
            {
                askers.entry(f.as_str()).or_default().push(i);
            }
        }
        for (flavor, idx) in askers {
            let available = remaining_capacity.get(flavor).copied().unwrap_or(0);
            if available == 0 {
                continue;
            }
            let asked: u128 = idx.iter().map(|&i| u128::from(unmet[i])).sum();
            let shares: Vec<(usize, u64)> = if asked <= u128::from(available) {
                idx.iter().map(|&i| (i, unmet[i])).collect()
            } else {
                proportional(&idx, &unmet, available, asked, demands)
            };
            let mut used = 0u64;
            for (i, share) in shares {
                if share == 0 {
                    continue;
                }
                *granted[i].entry(flavor.to_string()).or_default() += share;
                unmet[i] -= share;
                used += share;
            }
            remaining_capacity.insert(flavor.to_string(), available - used);
        }
    }
    granted
}

fn proportional(
    idx: &[usize],
    unmet: &[u64],
    available: u64,
    asked: u128,
    demands: &[Demand],
) -> Vec<(usize, u64)> {
    let mut shares: Vec<(usize, u64, u128)> = idx
        .iter()
        .map(|&i| {
            let exact = u128::from(unmet[i]) * u128::from(available);
            let floor = (exact / asked) as u64;
            (i, floor, exact % asked)
        })
        .collect();
    let mut left = available - shares.iter().map(|s| s.1).sum::<u64>();
    let mut order: Vec<usize> = (0..shares.len()).collect();
    order.sort_by(|&a, &b| {
        let (ia, ib) = (shares[a].0, shares[b].0);
        shares[b]
            .2
            .cmp(&shares[a].2)
            .then_with(|| demands[ia].budget.cmp(&demands[ib].budget))
            .then_with(|| demands[ia].class.cmp(&demands[ib].class))
    });
    for k in order {
        if left == 0 {
            break;
        }
        let (i, floor, _) = shares[k];
        if floor < unmet[i] {
            shares[k].1 += 1;
            left -= 1;
        }
    }
    shares.into_iter().map(|(i, s, _)| (i, s)).collect()
}

/// Stage 7: grants each demand its share of the flavors' healthy capacity, records
/// it on the budget's report (`grants`, and a `QuotaShortfall` condition when less
/// than guaranteed fits) and on the flavor reports (`granted`, `spare`).
pub(super) fn split(
    demands: &[Demand],
    flavor_reports: &mut BTreeMap<String, FlavorReport>,
    budget_reports: &mut BTreeMap<String, BudgetReport>,
) {
    let capacity: BTreeMap<String, u64> = flavor_reports
        .iter()
        .map(|(n, r)| (n.clone(), r.healthy_capacity))
        .collect();
    let granted = allocate(demands, &capacity);
    for (demand, grant) in demands.iter().zip(&granted) {
        let report = budget_reports
            .get_mut(&demand.budget)
            .expect("budget report");
        let total: u64 = grant.values().sum();
        for (flavor, amount) in grant {
            report
                .grants
                .insert((demand.class.clone(), flavor.clone()), *amount);
            flavor_reports.get_mut(flavor).expect("flavor").granted += amount;
        }
        if total < demand.amount {
            report.conditions.push(DesiredCondition::new(
                api::QUOTA_SHORTFALL,
                true,
                "NotEnoughHealthyCapacity",
                format!(
                    "class {}: {} of {} guaranteed devices fit in healthy capacity; the quota is lowered so Kueue never admits onto broken or missing hardware",
                    demand.class, total, demand.amount
                ),
            ));
        }
    }
    for r in flavor_reports.values_mut() {
        r.spare = r.healthy_capacity - r.granted;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn d(budget: &str, amount: u64, flavors: &[&str]) -> Demand {
        Demand {
            budget: budget.into(),
            class: "c".into(),
            amount,
            flavors: flavors.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn split_records_grants_shortfall_and_spare() {
        let flavor = |capacity| FlavorReport {
            healthy_capacity: capacity,
            ..Default::default()
        };
        let mut flavor_reports = BTreeMap::from([
            ("f1".to_string(), flavor(4)),
            ("f2".to_string(), flavor(2)),
            ("idle".to_string(), flavor(5)),
        ]);
        let mut budget_reports = BTreeMap::from([("team".to_string(), BudgetReport::default())]);
        let mut demand = d("team", 8, &["f1", "f2"]);
        demand.class = "gpu".into();

        split(&[demand], &mut flavor_reports, &mut budget_reports);

        let report = &budget_reports["team"];
        let grants: Vec<((&str, &str), u64)> = report
            .grants
            .iter()
            .map(|((c, f), n)| ((c.as_str(), f.as_str()), *n))
            .collect();
        assert_eq!(grants, [(("gpu", "f1"), 4), (("gpu", "f2"), 2)]);
        assert_eq!(report.conditions.len(), 1);
        assert_eq!(report.conditions[0].type_, api::QUOTA_SHORTFALL);
        assert!(
            report.conditions[0]
                .message
                .starts_with("class gpu: 6 of 8 guaranteed devices")
        );
        let granted_spare: Vec<(u64, u64)> = flavor_reports
            .values()
            .map(|r| (r.granted, r.spare))
            .collect();
        // f1, f2, idle in name order.
        assert_eq!(granted_spare, [(4, 0), (2, 0), (0, 5)]);
    }

    #[test]
    fn spills_to_next_preference() {
        let cap = BTreeMap::from([("a".to_string(), 4), ("b".to_string(), 10)]);
        let g = allocate(&[d("t1", 6, &["a", "b"])], &cap);
        assert_eq!(g[0]["a"], 4);
        assert_eq!(g[0]["b"], 2);
    }

    #[test]
    fn oversubscribed_flavor_is_shared_proportionally() {
        let cap = BTreeMap::from([("a".to_string(), 10)]);
        let g = allocate(&[d("t1", 10, &["a"]), d("t2", 5, &["a"])], &cap);
        assert_eq!(g[0]["a"] + g[1]["a"], 10);
        assert_eq!(g[0]["a"], 7); // 6.67 -> 6 + largest remainder
        assert_eq!(g[1]["a"], 3);
    }

    proptest! {
        #[test]
        fn never_exceeds_capacity_nor_demand(
            caps in proptest::collection::vec(0u64..50, 1..6),
            raw in proptest::collection::vec((0u64..60, proptest::collection::vec(0usize..6, 0..4)), 0..12),
        ) {
            let capacity: BTreeMap<String, u64> = caps.iter().enumerate().map(|(i, c)| (format!("f{i}"), *c)).collect();
            let demands: Vec<Demand> = raw.iter().enumerate().map(|(i, (amount, fl))| {
                let mut flavors: Vec<String> = fl.iter().map(|f| format!("f{}", f % caps.len())).collect();
                flavors.dedup();
                Demand { budget: format!("b{i}"), class: "c".into(), amount: *amount, flavors }
            }).collect();
            let granted = allocate(&demands, &capacity);
            for (f, cap) in &capacity {
                let total: u64 = granted.iter().map(|g| g.get(f).copied().unwrap_or(0)).sum();
                prop_assert!(total <= *cap);
            }
            for (d, g) in demands.iter().zip(&granted) {
                prop_assert!(g.values().sum::<u64>() <= d.amount);
            }
            // Nothing left idle that an unmet demand could have used.
            for (d, g) in demands.iter().zip(&granted) {
                if g.values().sum::<u64>() < d.amount {
                    for f in &d.flavors {
                        let total: u64 = granted.iter().map(|g| g.get(f).copied().unwrap_or(0)).sum();
                        prop_assert_eq!(total, capacity[f]);
                    }
                }
            }
            prop_assert_eq!(allocate(&demands, &capacity), granted);
        }
    }
}
