//! Stage 4, measure flavors: each flavor's health counts and healthy, schedulable capacity.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{HealthCounts, SharingMode};
use crate::health::HealthSnapshot;
use crate::inventory::NodeInventory;

use super::flavors::{FlavorAcc, FlavorKey};
use super::{CPU, FlavorReport, PlanOptions};

/// One report per named flavor, keyed by name. Quota fields (`granted`, `spare`)
/// stay 0 until the quota stage.
pub(super) fn measure(
    flavors: &BTreeMap<FlavorKey, FlavorAcc>,
    flavor_names: &BTreeMap<FlavorKey, String>,
    nodes: &[&NodeInventory],
    health: &HealthSnapshot,
    options: &PlanOptions,
) -> BTreeMap<String, FlavorReport> {
    flavors
        .iter()
        .map(|(key, acc)| {
            let name = flavor_names[key].clone();
            let report = flavor_report(&name, key, acc, nodes, health, options);
            (name, report)
        })
        .collect()
}

/// One flavor: what it is, where its devices are, their health, and how many of
/// them new pods could use (its CPU and memory are counted alongside).
fn flavor_report(
    name: &str,
    key: &FlavorKey,
    acc: &FlavorAcc,
    nodes: &[&NodeInventory],
    health: &HealthSnapshot,
    options: &PlanOptions,
) -> FlavorReport {
    let mut report = FlavorReport {
        name: name.to_string(),
        vendor: key.variant.as_ref().map(|v| v.vendor),
        model: key
            .variant
            .as_ref()
            .map(|v| v.model.clone())
            .unwrap_or_else(|| "cpu".into()),
        sharing: key
            .variant
            .as_ref()
            .map(|v| v.sharing)
            .unwrap_or(SharingMode::CpuOnly),
        partition_profile: key
            .variant
            .as_ref()
            .and_then(|v| v.partition_profile.clone()),
        // A DRA-only flavor's devices are counted by Kueue as the class resource
        // (claims of its DeviceClass through Kueue's mapping, class-level requests
        // as themselves), not as the driver's class (see kueue_counting).
        resource_name: match &key.variant {
            Some(v) if crate::inventory::is_dra_device_class(&v.resource_name) => {
                crate::api::CLASS_RESOURCE.to_string()
            }
            Some(v) => v.resource_name.clone(),
            None => CPU.into(),
        },
        device_resource_name: key
            .variant
            .as_ref()
            .map(|v| v.resource_name.clone())
            .unwrap_or_else(|| CPU.into()),
        node_labels: key.node_labels(),
        tolerated_taint_keys: acc.tolerated.iter().cloned().collect(),
        classes: acc.classes.clone(),
        ..Default::default()
    };
    // A flavor's members come signature by signature, so not in name order:
    // sorted once and built in bulk, not searched for at each insert.
    let mut node_names: Vec<&str> = Vec::with_capacity(acc.members.len());
    for &(ni, gi) in &acc.members {
        let node = nodes[ni];
        node_names.push(&node.name);
        let schedulable = schedulable(node, &acc.tolerated);
        match gi {
            Some(gi) => {
                let group = &node.groups[gi];
                let counts = health.counts_for(node, group);
                report.devices.add(&counts);
                for rule in health.trend_rules_for(&node.name, &group.variant.resource_name) {
                    *report.trend_rules.entry(rule.clone()).or_default() += 1;
                }
                if schedulable {
                    report.healthy_capacity += usable(&counts, group.allocatable, options);
                    // The node's CPU and memory are shared by its device groups in
                    // proportion to their device counts.
                    let node_devices: u64 = node.groups.iter().map(|g| u64::from(g.capacity)).sum();
                    let share = |total: u64| -> u64 {
                        if node_devices == 0 {
                            0
                        } else {
                            (u128::from(total) * u128::from(group.capacity)
                                / u128::from(node_devices)) as u64
                        }
                    };
                    report.cpu_millis += share(node.cpu_millis);
                    report.memory_bytes += share(node.memory_bytes);
                }
            }
            None => {
                let cores = (node.cpu_millis / 1000) as u32;
                if node.ready == Some(true) {
                    report.devices.healthy += cores;
                } else {
                    report.devices.unknown += cores;
                }
                if schedulable {
                    report.healthy_capacity += u64::from(cores);
                    report.cpu_millis += u64::from(cores) * 1000;
                    report.memory_bytes += node.memory_bytes;
                }
            }
        }
    }
    node_names.sort_unstable();
    node_names.dedup();
    report.nodes = node_names.into_iter().map(str::to_string).collect();
    let total = u64::from(report.devices.total());
    let warning = u64::from(report.devices.warning);
    report.demoted =
        warning > 0 && warning * 100 >= u64::from(options.demote_warning_percent) * total.max(1);
    report
}

/// Whether new pods of a flavor tolerating `tolerated` may land on `node`.
pub(super) fn schedulable(node: &NodeInventory, tolerated: &BTreeSet<String>) -> bool {
    node.accepts_new_pods() && !blocking_taint(node, tolerated)
}

/// Devices of a group on a schedulable node that count as capacity: not known
/// to be broken (Unknown too, unless configured otherwise; invariant 6), and no
/// more than the node offers.
pub(super) fn usable(counts: &HealthCounts, allocatable: u32, options: &PlanOptions) -> u64 {
    let usable = counts.healthy
        + counts.warning
        + if options.unknown_counts_as_capacity {
            counts.unknown
        } else {
            0
        };
    u64::from(usable.min(allocatable))
}

/// A NoSchedule/NoExecute taint the flavor does not tolerate keeps new pods off.
fn blocking_taint(node: &NodeInventory, tolerated: &BTreeSet<String>) -> bool {
    node.taints.iter().any(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerated.contains(&t.key)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::devices::{PRODUCT_LABEL, gpus, node, whole_gpu};

    const H100: &str = "NVIDIA-H100-80GB-HBM3";

    /// One flavor holding the single GPU group of each node.
    fn measure_one(
        nodes: &[NodeInventory],
        health: &HealthSnapshot,
        options: &PlanOptions,
    ) -> FlavorReport {
        let key = FlavorKey {
            variant: Some(whole_gpu(H100)),
            pins: BTreeMap::from([(PRODUCT_LABEL.to_string(), H100.to_string())]),
            extra: BTreeMap::new(),
        };
        let acc = FlavorAcc {
            members: (0..nodes.len()).map(|i| (i, Some(0))).collect(),
            ..Default::default()
        };
        let names = BTreeMap::from([(key.clone(), "h100".to_string())]);
        let flavors = BTreeMap::from([(key, acc)]);
        let nodes: Vec<&NodeInventory> = nodes.iter().collect();
        let mut reports = measure(&flavors, &names, &nodes, health, options);
        assert_eq!(reports.len(), 1);
        reports.remove("h100").expect("keyed by name")
    }

    #[test]
    fn only_usable_devices_on_open_nodes_are_healthy_capacity() {
        let mut cordoned = node("b-cordoned", &[], vec![gpus(H100, 8)]);
        cordoned.unschedulable = true;
        let mut silent = node("c-silent", &[], vec![gpus(H100, 8)]);
        silent.ready = None;
        let nodes = [node("a-sick", &[], vec![gpus(H100, 8)]), cordoned, silent];
        let mut health = HealthSnapshot::default();
        health.set(
            "a-sick",
            "nvidia.com/gpu",
            HealthCounts {
                healthy: 5,
                warning: 1,
                failed: 2,
                ..Default::default()
            },
        );

        let report = measure_one(&nodes, &health, &PlanOptions::default());
        // a-sick: 5 healthy + 1 warning; c-silent: 8 unknown, still capacity.
        assert_eq!(report.healthy_capacity, 6 + 8);
        assert_eq!(
            report.devices,
            HealthCounts {
                healthy: 5 + 8,
                warning: 1,
                failed: 2,
                unknown: 8,
                ..Default::default()
            }
        );
        assert_eq!(report.nodes.len(), 3);
        // All of a node's CPU goes with its only device group.
        assert_eq!(report.cpu_millis, 2 * 64_000);

        let strict = PlanOptions {
            unknown_counts_as_capacity: false,
            ..Default::default()
        };
        assert_eq!(measure_one(&nodes, &health, &strict).healthy_capacity, 6);
    }

    #[test]
    fn a_warning_share_at_the_threshold_demotes_the_flavor() {
        let nodes = [node("gpu", &[], vec![gpus(H100, 10)])];
        let mut health = HealthSnapshot::default();
        health.set(
            "gpu",
            "nvidia.com/gpu",
            HealthCounts {
                healthy: 9,
                warning: 1,
                ..Default::default()
            },
        );
        let at = |percent| PlanOptions {
            demote_warning_percent: percent,
            ..Default::default()
        };
        assert!(measure_one(&nodes, &health, &at(10)).demoted);
        assert!(!measure_one(&nodes, &health, &at(11)).demoted);
    }
}
