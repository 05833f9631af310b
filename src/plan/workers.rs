//! MultiKueue worker clusters in the plan: a class whose devices sit in a worker
//! kaccel cannot read now says so (`WorkerUnreachable`), while those devices
//! stay capacity as Unknown (a network partition alone removes no quota,
//! invariant 6; the inventory marks them, see
//! [`crate::inventory::index::worker_union`]).

use std::collections::BTreeMap;

use crate::api::DesiredCondition;
use crate::inventory::NodeInventory;

use super::{ClassReport, FlavorReport, PlanOptions};

/// The class condition naming the unreachable worker clusters its devices are in.
pub const WORKER_CONDITION: &str = "WorkerUnreachable";

/// Sets `WorkerUnreachable` on each valid class with devices in a worker
/// cluster (True naming the unreachable ones, False when every such worker
/// answers). Classes with no worker devices, and plans without workers, get none.
pub(super) fn classes(
    class_reports: &mut BTreeMap<String, ClassReport>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
    nodes: &BTreeMap<String, std::sync::Arc<NodeInventory>>,
    options: &PlanOptions,
) {
    if options.multikueue_check.is_none() {
        return;
    }
    for report in class_reports.values_mut() {
        if !report.valid {
            continue;
        }
        // Worker -> this class's nodes there (a node in two flavors counts once).
        let mut nodes_by_worker: BTreeMap<&str, std::collections::BTreeSet<&str>> = BTreeMap::new();
        for flavor in &report.flavors {
            let Some(flavor) = flavor_reports.get(&flavor.name) else {
                continue;
            };
            for name in &flavor.nodes {
                if let Some(cluster) = nodes.get(name).and_then(|n| n.cluster.as_deref()) {
                    nodes_by_worker
                        .entry(cluster)
                        .or_default()
                        .insert(name.as_str());
                }
            }
        }
        if nodes_by_worker.is_empty() {
            continue;
        }
        let unreachable: Vec<String> = nodes_by_worker
            .iter()
            .filter_map(|(worker, nodes)| {
                let why = options.unreachable_workers.get(*worker)?;
                Some(format!("{worker} ({} nodes; {why})", nodes.len()))
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
