//! MultiKueue worker clusters in the plan: a class whose devices sit in a worker
//! kaccel cannot read now says so (`WorkerUnreachable`), while those devices
//! stay capacity as Unknown (a network partition alone removes no quota,
//! invariant 6; the inventory marks them, see
//! [`crate::inventory::index::worker_union`]).

use std::collections::BTreeMap;

use crate::api::DesiredCondition;

use super::{ClassReport, FlavorReport, PlanOptions};

/// The class condition naming the unreachable worker clusters its devices are in.
pub const WORKER_CONDITION: &str = "WorkerUnreachable";

/// Sets `WorkerUnreachable` on each valid class with devices in a worker
/// cluster (True naming the unreachable ones, False when every such worker
/// answers). Classes with no worker devices, and plans without workers, get none.
pub(super) fn classes(
    class_reports: &mut BTreeMap<String, ClassReport>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
    options: &PlanOptions,
) {
    if options.multikueue_check.is_none() {
        return;
    }
    // Worker -> nodes, per flavor, counted once per flavor (classes share
    // flavors; a worker's Node key says its cluster, see `worker_of`).
    let per_flavor: BTreeMap<&str, BTreeMap<&str, usize>> = flavor_reports
        .iter()
        .map(|(name, flavor)| {
            let mut by_worker: BTreeMap<&str, usize> = BTreeMap::new();
            for node in &flavor.nodes {
                if let Some(cluster) = crate::inventory::worker_of(node) {
                    *by_worker.entry(cluster).or_default() += 1;
                }
            }
            (name.as_str(), by_worker)
        })
        .collect();
    for report in class_reports.values_mut() {
        if !report.valid {
            continue;
        }
        // Worker -> this class's nodes there (summed over its flavors).
        let mut nodes_by_worker: BTreeMap<&str, usize> = BTreeMap::new();
        for flavor in &report.flavors {
            for (cluster, nodes) in per_flavor.get(flavor.name.as_str()).into_iter().flatten() {
                *nodes_by_worker.entry(cluster).or_default() += nodes;
            }
        }
        if nodes_by_worker.is_empty() {
            continue;
        }
        let unreachable: Vec<String> = nodes_by_worker
            .iter()
            .filter_map(|(worker, nodes)| {
                let why = options.unreachable_workers.get(*worker)?;
                Some(format!("{worker} ({nodes} nodes; {why})"))
            })
            .collect();
        let condition = if unreachable.is_empty() {
            DesiredCondition::new(
                WORKER_CONDITION,
                false,
                "WorkersReachable",
                format!(
                    "kaccel reads the nodes of every worker cluster this class has devices in: {}",
                    nodes_by_worker
                        .keys()
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        } else {
            DesiredCondition::new(
                WORKER_CONDITION,
                true,
                "ClusterUnreachable",
                format!(
                    "kaccel cannot read these worker clusters: {}. Their devices count as Unknown (still capacity: quota is not cut for an unreachable cluster alone) until it reads them again; Kueue's MultiKueue dispatches nothing there while its MultiKueueCluster is not Active",
                    unreachable.join("; ")
                ),
            )
        };
        report.conditions.push(condition);
    }
}

#[cfg(test)]
mod tests;
