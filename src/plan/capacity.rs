//! Stage 4, measure flavors: each flavor's report with its health counts and healthy, schedulable capacity.

use std::collections::{BTreeMap, BTreeSet};

use crate::api::SharingMode;
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
        resource_name: key
            .variant
            .as_ref()
            .map(|v| v.resource_name.clone())
            .unwrap_or_else(|| CPU.into()),
        node_labels: key.node_labels(),
        tolerated_taint_keys: acc.tolerated.iter().cloned().collect(),
        classes: acc.classes.clone(),
        ..Default::default()
    };
    for &(ni, gi) in &acc.members {
        let node = nodes[ni];
        report.nodes.insert(node.name.clone());
        let schedulable = node.accepts_new_pods() && !blocking_taint(node, &acc.tolerated);
        match gi {
            Some(gi) => {
                let group = &node.groups[gi];
                let counts = health.counts_for(node, group);
                report.devices.add(&counts);
                if schedulable {
                    let usable = counts.healthy
                        + counts.warning
                        + if options.unknown_counts_as_capacity {
                            counts.unknown
                        } else {
                            0
                        };
                    report.healthy_capacity += u64::from(usable.min(group.allocatable));
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
    let total = u64::from(report.devices.total());
    let warning = u64::from(report.devices.warning);
    report.demoted =
        warning > 0 && warning * 100 >= u64::from(options.demote_warning_percent) * total.max(1);
    report
}

/// A NoSchedule/NoExecute taint the flavor does not tolerate keeps new pods off.
fn blocking_taint(node: &NodeInventory, tolerated: &BTreeSet<String>) -> bool {
    node.taints.iter().any(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerated.contains(&t.key)
    })
}
