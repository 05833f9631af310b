//! What to do to Nodes for device health: taint a node whose devices are all out,
//! cordon one with a failed device, undo both after recovery — only what kaccel did
//! itself (invariant 5), and never more than a share of a flavor's nodes at once.
//! Pure: the controller applies the result.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::FlavorReport;
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;

/// NoSchedule taint kaccel puts on a node whose accelerators are all out.
pub const UNHEALTHY_TAINT: &str = "kaccel.io/unhealthy";
/// Set when kaccel added its taint (to its node mark, `true` for the default
/// installation: [`crate::k8s::instance::node_mark`]); it removes only taints
/// carrying its own mark.
pub const TAINTED_ANNOTATION: &str = "kaccel.io/tainted";
/// Set (to its node mark) when kaccel cordoned a schedulable node; it uncordons
/// only those.
pub const CORDONED_ANNOTATION: &str = "kaccel.io/cordoned";
/// Why kaccel took a node out: a repair request for whoever fixes hardware.
pub const REPAIR_ANNOTATION: &str = "kaccel.io/repair-request";

#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct NodeActionPolicy {
    /// Taint (NoSchedule) nodes whose accelerators are all Degraded or Failed.
    pub taint: bool,
    /// Cordon nodes with a Failed accelerator.
    pub cordon_on_failed: bool,
    /// Most of a flavor's nodes automation may hold out at once, percent.
    pub max_share_percent: u32,
    /// ... but at least this many nodes (a 4-node flavor at 20% would otherwise allow none).
    pub min_nodes: u32,
    /// When kaccel cordons a node for a Failed accelerator, evict the admitted Kueue
    /// Workloads whose pods run there (deactivate them), and requeue them (activate
    /// again) once Kueue has evicted them, so they are admitted on healthy capacity.
    pub evict_workloads_on_failed: bool,
    /// How long a Workload is warned before kaccel deactivates it (seconds): a
    /// `kaccel.io/EvictionScheduled` condition on it and an Event, so a job that
    /// checkpoints can save first. 0 deactivates at once. Cancelled if the node is
    /// back in service before then.
    pub eviction_grace_seconds: u32,
    /// Take a failed device a DRA driver alone publishes out with a DeviceTaintRule
    /// (resource.k8s.io/v1alpha3, where served) instead of cordoning its node.
    pub device_taint_rules: bool,
    /// The effect of those rules: NoSchedule, or NoExecute to also evict its pods.
    pub device_taint_effect: super::device_quarantine::DeviceTaintEffect,
    /// Take Degraded DRA devices out too (by default only Failed ones).
    pub device_taint_on_degraded: bool,
}

impl Default for NodeActionPolicy {
    fn default() -> Self {
        NodeActionPolicy {
            taint: true,
            cordon_on_failed: true,
            max_share_percent: 20,
            min_nodes: 1,
            evict_workloads_on_failed: false,
            eviction_grace_seconds: 60,
            device_taint_rules: true,
            device_taint_effect: Default::default(),
            device_taint_on_degraded: false,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum NodeAction {
    Taint { node: String, reason: String },
    Untaint { node: String },
    Cordon { node: String, reason: String },
    Uncordon { node: String },
}

impl NodeAction {
    pub fn node(&self) -> &str {
        match self {
            NodeAction::Taint { node, .. }
            | NodeAction::Untaint { node }
            | NodeAction::Cordon { node, .. }
            | NodeAction::Uncordon { node } => node,
        }
    }
}

/// A node automation would have taken out, held back by the share limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeldBack {
    pub node: String,
    pub flavor: String,
    pub allowed: u32,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeActions {
    pub actions: Vec<NodeAction>,
    pub held_back: Vec<HeldBack>,
}

/// Decide node actions from device health. `taken_out_per_device` counts, per
/// (node, device resource), the devices DeviceTaintRules already take out (see
/// [`super::device_quarantine`]): those need no cordon.
pub fn node_actions(
    inventory: &Inventory,
    health: &HealthSnapshot,
    flavors: &BTreeMap<String, FlavorReport>,
    policy: &NodeActionPolicy,
    taken_out_per_device: &super::device_quarantine::TakenOutPerDevice,
    instance: &str,
) -> NodeActions {
    let mut out = NodeActions::default();
    // Flavors of each node, and how many of each flavor's nodes kaccel holds out.
    let mut node_flavors: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for f in flavors.values() {
        for n in &f.nodes {
            node_flavors
                .entry(n.as_str())
                .or_default()
                .push(f.name.as_str());
        }
    }
    let allowed = |f: &FlavorReport| -> u32 {
        let n = f.nodes.len() as u32;
        (n * policy.max_share_percent / 100)
            .max(policy.min_nodes)
            .min(n)
    };
    let mut held_out: BTreeMap<&str, u32> = BTreeMap::new();
    let mut candidates: Vec<(bool, &str, NodeAction)> = Vec::new();
    let mut stays_out: BTreeSet<&str> = BTreeSet::new();

    for node in inventory.nodes.values() {
        // A MultiKueue worker's Nodes are read, never changed: its own
        // platform team (and health loop) acts on them.
        if node.groups.is_empty() || node.worker_cluster().is_some() {
            continue;
        }
        // Its own marks only (another installation's are not its to undo).
        let mark = crate::k8s::instance::node_mark(instance);
        let annotated = |k: &str| node.annotations.get(k).map(String::as_str) == Some(mark);
        let has_taint = node.taints.iter().any(|t| t.key == UNHEALTHY_TAINT);
        let ours_tainted = has_taint && annotated(TAINTED_ANNOTATION);
        let ours_cordoned = node.unschedulable && annotated(CORDONED_ANNOTATION);
        // Only this installation's nodes: those its flavors count, and those it
        // took out itself (undone once healthy, even after their class went).
        if !node_flavors.contains_key(node.name.as_str()) && !ours_tainted && !ours_cordoned {
            continue;
        }
        let mut all_out = true;
        let mut failed = false;
        // Devices nothing fresh speaks for (a silent source, a NotReady node, or
        // kaccel just restarted and has not heard from the source yet).
        let mut silent = false;
        let mut reasons = Vec::new();
        for g in &node.groups {
            let c = health.counts_for(node, g);
            silent |= c.unknown > 0;
            if c.degraded + c.failed < g.capacity || g.capacity == 0 {
                all_out = false;
            }
            let per_device = taken_out_per_device
                .get(&node.name)
                .and_then(|by_resource| by_resource.get(&g.variant.resource_name))
                .copied()
                .unwrap_or(0);
            let failed_here = c.failed.saturating_sub(per_device);
            if failed_here > 0 {
                failed = true;
                reasons.push(format!("{failed_here} {} failed", g.variant.resource_name));
            } else if c.degraded > 0 {
                reasons.push(format!(
                    "{} {} degraded",
                    c.degraded, g.variant.resource_name
                ));
            }
        }
        // Unknown never undoes an action (invariant 6): kaccel's own annotation is
        // the evidence it acted for a bad device; only fresh readings that show the
        // node's devices healthy (held for the hold-down) may take it back.
        let want_taint = policy.taint && (all_out || (silent && ours_tainted));
        let want_cordon = policy.cordon_on_failed && (failed || (silent && ours_cordoned));
        let reason = reasons.join(", ");

        if ours_tainted && !want_taint {
            out.actions.push(NodeAction::Untaint {
                node: node.name.clone(),
            });
        }
        if ours_cordoned && !want_cordon {
            out.actions.push(NodeAction::Uncordon {
                node: node.name.clone(),
            });
        }
        let already_out = (ours_tainted && want_taint) || (ours_cordoned && want_cordon);
        if already_out {
            stays_out.insert(node.name.as_str());
        }
        if want_taint && !has_taint {
            candidates.push((
                failed,
                node.name.as_str(),
                NodeAction::Taint {
                    node: node.name.clone(),
                    reason: reason.clone(),
                },
            ));
        }
        // A node someone else cordoned is left as it is: kaccel would not know
        // whether it may uncordon it later.
        if want_cordon && !node.unschedulable {
            candidates.push((
                failed,
                node.name.as_str(),
                NodeAction::Cordon {
                    node: node.name.clone(),
                    reason,
                },
            ));
        }
    }
    for n in &stays_out {
        for f in node_flavors.get(n).into_iter().flatten() {
            *held_out.entry(f).or_default() += 1;
        }
    }
    // Failed nodes first, then by name, so the share goes where it matters most
    // and the choice is stable.
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)).then(a.2.cmp(&b.2)));
    let mut admitted: BTreeSet<&str> = BTreeSet::new();
    for (_, node, action) in candidates {
        let node_fs = node_flavors.get(node).cloned().unwrap_or_default();
        let counts_new = !stays_out.contains(node) && !admitted.contains(node);
        let blocked = node_fs.iter().find(|f| {
            counts_new && held_out.get(*f).copied().unwrap_or(0) + 1 > allowed(&flavors[**f])
        });
        match blocked {
            Some(f) => out.held_back.push(HeldBack {
                node: node.to_string(),
                flavor: f.to_string(),
                allowed: allowed(&flavors[*f]),
                reason: match &action {
                    NodeAction::Taint { reason, .. } | NodeAction::Cordon { reason, .. } => {
                        reason.clone()
                    }
                    _ => String::new(),
                },
            }),
            None => {
                if counts_new {
                    for f in &node_fs {
                        *held_out.entry(f).or_default() += 1;
                    }
                    admitted.insert(node);
                }
                out.actions.push(action);
            }
        }
    }
    out.actions.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HealthCounts;
    use crate::plan::{PlanInput, PlanOptions, plan};
    use k8s_openapi::api::core::v1::{Node, Taint};

    fn fleet() -> (Vec<Node>, Vec<crate::api::AcceleratorClass>) {
        let loaded = crate::testkit::examples();
        (loaded.nodes, loaded.classes)
    }

    fn decide(
        nodes: &[Node],
        classes: &[crate::api::AcceleratorClass],
        health: &HealthSnapshot,
    ) -> NodeActions {
        decide_as(
            crate::k8s::instance::DEFAULT_INSTANCE,
            nodes,
            classes,
            health,
        )
    }

    /// As the installation `instance` serving `classes` decides.
    fn decide_as(
        instance: &str,
        nodes: &[Node],
        classes: &[crate::api::AcceleratorClass],
        health: &HealthSnapshot,
    ) -> NodeActions {
        let inventory = Inventory::from_nodes(nodes);
        let planned = plan(&PlanInput {
            classes,
            budgets: &[],
            inventory: &inventory,
            health,
            options: &PlanOptions::default(),
        });
        node_actions(
            &inventory,
            health,
            &planned.flavors,
            &NodeActionPolicy::default(),
            &BTreeMap::new(),
            instance,
        )
    }

    #[test]
    fn an_installation_acts_only_on_its_classes_nodes_and_undoes_only_its_own_marks() {
        let (mut nodes, classes) = fleet();
        let h100 = h100_nodes(&nodes);
        // Installation b serves only large-training (H100 and MI300X nodes).
        let b_classes: Vec<_> = classes
            .iter()
            .filter(|c| c.metadata.name.as_deref() == Some("large-training"))
            .cloned()
            .collect();
        let mut health = HealthSnapshot::default();
        for node in [h100[0].as_str(), "gpu-l40s-01"] {
            let resource = "nvidia.com/gpu";
            health.set(
                node,
                resource,
                HealthCounts {
                    healthy: 7,
                    failed: 1,
                    ..Default::default()
                },
            );
        }
        let cordoned = |d: &NodeActions| -> Vec<String> {
            d.actions
                .iter()
                .filter(|a| matches!(a, NodeAction::Cordon { .. }))
                .map(|a| a.node().to_string())
                .collect()
        };
        // The L40S node is no class of b's: b leaves it to whoever serves it.
        assert_eq!(
            cordoned(&decide_as("kaccel-b", &nodes, &b_classes, &health)),
            [h100[0].clone()]
        );
        assert_eq!(
            cordoned(&decide(&nodes, &classes, &health)),
            [h100[0].clone(), "gpu-l40s-01".to_string()]
        );
        // b cordoned h100[1] and the default installation h100[2]; both healthy.
        for n in nodes.iter_mut() {
            let name = n.metadata.name.clone().unwrap();
            let mark = if name == h100[1] {
                "kaccel-b"
            } else if name == h100[2] {
                "true"
            } else {
                continue;
            };
            n.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
            n.metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(CORDONED_ANNOTATION.into(), mark.into());
        }
        let healthy = HealthSnapshot::default();
        assert_eq!(
            decide_as("kaccel-b", &nodes, &b_classes, &healthy).actions,
            [NodeAction::Uncordon {
                node: h100[1].clone()
            }]
        );
        assert_eq!(
            decide(&nodes, &classes, &healthy).actions,
            [NodeAction::Uncordon {
                node: h100[2].clone()
            }]
        );
        // b's mark stays b's to undo even after b's class is gone.
        assert_eq!(
            decide_as("kaccel-b", &nodes, &[], &healthy).actions,
            [NodeAction::Uncordon {
                node: h100[1].clone()
            }]
        );
    }

    fn h100_nodes(nodes: &[Node]) -> Vec<String> {
        nodes
            .iter()
            .filter(|n| n.metadata.name.as_ref().unwrap().starts_with("gpu-h100"))
            .map(|n| n.metadata.name.clone().unwrap())
            .collect()
    }

    #[test]
    fn failed_device_cordons_all_out_taints() {
        let (nodes, classes) = fleet();
        let h100 = h100_nodes(&nodes);
        let mut health = HealthSnapshot::default();
        health.set(
            &h100[1],
            "nvidia.com/gpu",
            HealthCounts {
                healthy: 7,
                failed: 1,
                ..Default::default()
            },
        );
        let d = decide(&nodes, &classes, &health);
        assert_eq!(
            d.actions,
            vec![NodeAction::Cordon {
                node: h100[1].clone(),
                reason: "1 nvidia.com/gpu failed".into()
            }]
        );

        let mut health = HealthSnapshot::default();
        health.set(
            &h100[1],
            "nvidia.com/gpu",
            HealthCounts {
                degraded: 8,
                ..Default::default()
            },
        );
        let d = decide(&nodes, &classes, &health);
        assert!(matches!(&d.actions[..], [NodeAction::Taint { node, .. }] if *node == h100[1]));
    }

    #[test]
    fn unknown_health_takes_no_action() {
        let (nodes, classes) = fleet();
        let mut health = HealthSnapshot::default();
        for n in h100_nodes(&nodes) {
            health.set(
                &n,
                "nvidia.com/gpu",
                HealthCounts {
                    unknown: 8,
                    ..Default::default()
                },
            );
        }
        assert_eq!(decide(&nodes, &classes, &health), NodeActions::default());
    }

    #[test]
    fn share_limit_holds_back_the_rest() {
        let (nodes, classes) = fleet();
        let h100 = h100_nodes(&nodes);
        let mut health = HealthSnapshot::default();
        for n in &h100[..3] {
            health.set(
                n,
                "nvidia.com/gpu",
                HealthCounts {
                    healthy: 7,
                    failed: 1,
                    ..Default::default()
                },
            );
        }
        let d = decide(&nodes, &classes, &health);
        // 4 H100 nodes at 20% (minimum 1): one cordon, two held back.
        assert_eq!(d.actions.len(), 1, "{:?}", d.actions);
        assert_eq!(d.held_back.len(), 2);
        assert!(d.held_back.iter().all(|h| h.allowed == 1));
    }

    #[test]
    fn only_undoes_what_kaccel_did() {
        let (mut nodes, classes) = fleet();
        let h100 = h100_nodes(&nodes);
        // Someone else cordoned node 0 and put a kaccel-looking taint on node 1
        // without kaccel's annotation; kaccel cordoned node 2 and tainted node 3.
        for n in nodes.iter_mut() {
            let name = n.metadata.name.clone().unwrap();
            let spec = n.spec.get_or_insert_with(Default::default);
            let taint = Taint {
                key: UNHEALTHY_TAINT.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            };
            let ann = n.metadata.annotations.get_or_insert_with(Default::default);
            if name == h100[0] {
                spec.unschedulable = Some(true);
            } else if name == h100[1] {
                spec.taints.get_or_insert_with(Vec::new).push(taint);
            } else if name == h100[2] {
                spec.unschedulable = Some(true);
                ann.insert(CORDONED_ANNOTATION.into(), "true".into());
            } else if name == h100[3] {
                spec.taints.get_or_insert_with(Vec::new).push(taint);
                ann.insert(TAINTED_ANNOTATION.into(), "true".into());
            }
        }
        // All healthy now: kaccel undoes its own two actions only.
        let d = decide(&nodes, &classes, &HealthSnapshot::default());
        assert_eq!(
            d.actions,
            vec![
                NodeAction::Untaint {
                    node: h100[3].clone()
                },
                NodeAction::Uncordon {
                    node: h100[2].clone()
                }
            ]
        );
    }

    /// What the controller's node actions do to the Node objects.
    fn apply_actions(nodes: &mut [Node], actions: &[NodeAction]) {
        for action in actions {
            let node = nodes
                .iter_mut()
                .find(|n| n.metadata.name.as_deref() == Some(action.node()))
                .expect("the acted-on node");
            let spec = node.spec.get_or_insert_with(Default::default);
            let ann = node
                .metadata
                .annotations
                .get_or_insert_with(Default::default);
            let taints = spec.taints.get_or_insert_with(Vec::new);
            match action {
                NodeAction::Taint { .. } => {
                    taints.push(Taint {
                        key: UNHEALTHY_TAINT.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    });
                    ann.insert(TAINTED_ANNOTATION.into(), "true".into());
                }
                NodeAction::Untaint { .. } => {
                    taints.retain(|t| t.key != UNHEALTHY_TAINT);
                    ann.remove(TAINTED_ANNOTATION);
                }
                NodeAction::Cordon { .. } => {
                    spec.unschedulable = Some(true);
                    ann.insert(CORDONED_ANNOTATION.into(), "true".into());
                }
                NodeAction::Uncordon { .. } => {
                    spec.unschedulable = Some(false);
                    ann.remove(CORDONED_ANNOTATION);
                }
            }
        }
    }

    #[test]
    fn a_silent_source_never_undoes_a_cordon_or_taint_even_after_a_restart() {
        let (mut nodes, classes) = fleet();
        let h100 = h100_nodes(&nodes);
        let mut failed = HealthSnapshot::default();
        failed.set(
            &h100[0],
            "nvidia.com/gpu",
            HealthCounts {
                failed: 8,
                ..Default::default()
            },
        );
        let acted = decide(&nodes, &classes, &failed).actions;
        assert_eq!(acted.len(), 2, "cordon and taint: {acted:?}");
        apply_actions(&mut nodes, &acted);
        // kaccel restarts and its exporter is down: nothing fresh about the node.
        let mut silent = HealthSnapshot::default();
        silent.set(
            &h100[0],
            "nvidia.com/gpu",
            HealthCounts {
                unknown: 8,
                ..Default::default()
            },
        );
        assert_eq!(decide(&nodes, &classes, &silent), NodeActions::default());
        // Fresh healthy readings (after the hold-down) take both back.
        let d = decide(&nodes, &classes, &HealthSnapshot::default());
        assert_eq!(
            d.actions,
            vec![
                NodeAction::Untaint {
                    node: h100[0].clone()
                },
                NodeAction::Uncordon {
                    node: h100[0].clone()
                }
            ]
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// No sequence of silent polls (unreachable, stale, an answer without the bad
        /// devices, the source removed, kaccel restarted) starts or undoes a node
        /// action: whatever fresh readings made kaccel do stays done.
        #[test]
        fn silence_never_uncordons_or_untaints(
            failed in proptest::collection::btree_set(0u32..8, 0..3),
            degraded in proptest::collection::btree_set(0u32..8, 0..9),
            events in proptest::collection::vec((0u8..5, 1i64..100), 1..10),
        ) {
            use crate::health::policy::Policy;
            use crate::health::policy::testing::{self, NODE, SOURCE, gpus, watched};
            let (mut nodes, classes) = fleet();
            let policy = Policy::default();
            let all: Vec<u32> = (0..8).collect();
            let failed: Vec<u32> = failed.into_iter().collect();
            let degraded: Vec<u32> = degraded.into_iter().collect();
            let mut tracker = watched();
            tracker.observe(SOURCE, gpus(&all, &failed, &degraded), 100, &policy);
            let first = decide(&nodes, &classes, &tracker.snapshot(testing::fleet(), 100));
            apply_actions(&mut nodes, &first.actions);
            let mut now = 100;
            let mut restarted = false;
            let silenced: Vec<u32> = failed.iter().chain(&degraded).copied().collect();
            for (event, dt) in events {
                now += dt;
                match event {
                    // The exporter pod goes away. Not after a restart: then nothing
                    // is left that says the node had a source (a known limit: the
                    // group falls back to the Node's own view).
                    3 if restarted => {}
                    0..=3 => testing::silent_poll(&mut tracker, event, now, &silenced),
                    _ => {
                        // Restart: only kaccel's annotations on the Node remember.
                        tracker = watched();
                        restarted = true;
                    }
                }
                let d = decide(&nodes, &classes, &tracker.snapshot(testing::fleet(), now));
                proptest::prop_assert!(
                    d.actions.iter().all(|a| a.node() != NODE),
                    "after event {event} at {now}: {:?} (first: {:?})",
                    d.actions,
                    first.actions
                );
            }
        }
    }
}
