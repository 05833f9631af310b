//! What kaccel does to nodes for health: taint, cordon, evict and requeue Workloads, with Events.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use k8s_openapi::api::core::v1::{Node, ObjectReference, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::reconcile::Reconciler;
use super::{Error, api_err, metrics};
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::kueue::workload::Workload;
use crate::plan::Plan;
use crate::plan::nodes::{
    CORDONED_ANNOTATION, HeldBack, NodeAction, NodeActions, REPAIR_ANNOTATION, TAINTED_ANNOTATION,
    UNHEALTHY_TAINT, node_actions,
};

impl Reconciler {
    /// Decides and takes the node actions for `health`; a failed write is kept in
    /// `first_error`. The decision goes on to the status stage.
    pub(super) async fn act_on_nodes(
        &self,
        inventory: &Inventory,
        health: &HealthSnapshot,
        planned: &Plan,
        taken_out_per_device: &crate::plan::device_quarantine::TakenOutPerDevice,
        first_error: &mut Option<Error>,
    ) -> NodeActions {
        let decided = node_actions(
            inventory,
            health,
            &planned.flavors,
            &self.config.health.actions,
            taken_out_per_device,
        );
        self.metrics
            .node_actions_held_back
            .set(decided.held_back.len() as i64);
        for action in &decided.actions {
            if let Err(e) = self.apply_node(action).await {
                first_error.get_or_insert(e);
            }
        }
        // Held-back actions: an Event once per node when it starts being held back
        // (not on every reconcile: a persisting fault must not cost writes).
        let newly_held = {
            let mut last = self.held_back.lock().expect("held-back lock");
            newly_held(&mut last, &decided.held_back)
        };
        for held in newly_held {
            tracing::warn!(node = %held.node, flavor = %held.flavor, allowed = held.allowed, reason = %held.reason, "node action held back by the share limit");
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(held.node.clone()),
                ..Default::default()
            };
            self.publish(
                &reference,
                EventType::Warning,
                "AutomationLimited",
                &format!(
                    "not taken out despite {}: flavor {} already has {} node(s) held out by kaccel (maxSharePercent)",
                    held.reason, held.flavor, held.allowed
                ),
            )
            .await;
        }
        decided
    }

    /// Workloads kaccel evicted go back to their queues once Kueue evicted them.
    pub(super) async fn requeue_evicted_workloads(&self) -> Result<(), Error> {
        if self.requeue_pending.load(Ordering::Relaxed) {
            let (requeued, waiting) = requeue_evicted(&self.client)
                .await
                .map_err(api_err("requeueing evicted Workloads"))?;
            for w in &requeued {
                self.metrics.write("Workload", "requeue");
                tracing::info!(workload = %w, "requeued after eviction");
            }
            self.requeue_pending.store(waiting > 0, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn apply_node(&self, action: &NodeAction) -> Result<(), Error> {
        let (verb, event_reason, type_, note) = describe(action);
        apply_node_action(&self.client, action)
            .await
            .map_err(api_err(format!("{verb} node {}", action.node())))?;
        if let NodeAction::Cordon { node, reason } = action
            && self.config.health.actions.evict_workloads_on_failed
        {
            let evicted = evict_workloads_on(&self.client, node, reason)
                .await
                .map_err(api_err(format!("evicting Workloads from node {node}")))?;
            if !evicted.is_empty() {
                self.metrics.write("Workload", "evict");
                self.requeue_pending.store(true, Ordering::Relaxed);
                tracing::warn!(%node, workloads = ?evicted, "evicted Workloads from a node with a failed accelerator");
                let reference = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                };
                self.publish(
                    &reference,
                    EventType::Warning,
                    "KaccelEvictedWorkloads",
                    &format!("evicted for requeue: {}", evicted.join(", ")),
                )
                .await;
            }
        }
        self.metrics.write("Node", verb);
        self.metrics
            .node_actions
            .get_or_create(&metrics::ActionLabel {
                action: verb.into(),
            })
            .inc();
        tracing::info!(node = %action.node(), verb, "node action");
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(action.node().to_string()),
            ..Default::default()
        };
        self.publish(&reference, type_, event_reason, &note).await;
        Ok(())
    }
}

/// The metric verb, Event reason, Event type and Event note of a node action.
fn describe(action: &NodeAction) -> (&'static str, &'static str, EventType, String) {
    match action {
        NodeAction::Taint { reason, .. } => (
            "taint",
            "KaccelTainted",
            EventType::Warning,
            format!("tainted {UNHEALTHY_TAINT}:NoSchedule: all accelerators out ({reason})"),
        ),
        NodeAction::Untaint { .. } => (
            "untaint",
            "KaccelUntainted",
            EventType::Normal,
            "removed kaccel's taint: accelerators healthy again".to_string(),
        ),
        NodeAction::Cordon { reason, .. } => (
            "cordon",
            "KaccelCordoned",
            EventType::Warning,
            format!("cordoned for a failed accelerator ({reason}); repair requested"),
        ),
        NodeAction::Uncordon { .. } => (
            "uncordon",
            "KaccelUncordoned",
            EventType::Normal,
            "uncordoned: the accelerators kaccel cordoned for are healthy again".to_string(),
        ),
    }
}

/// The nodes in `held_back` that were not held back at the last reconcile
/// (`last`, which becomes this reconcile's set).
fn newly_held(last: &mut BTreeSet<String>, held_back: &[HeldBack]) -> Vec<HeldBack> {
    let now_held: BTreeSet<String> = held_back.iter().map(|h| h.node.clone()).collect();
    let newly = held_back
        .iter()
        .filter(|h| !last.contains(&h.node))
        .cloned()
        .collect();
    *last = now_held;
    newly
}

/// Apply one node action. The patch is guarded by the resourceVersion just read:
/// a concurrent change makes it fail and the next reconcile decides again. Only
/// kaccel's own taint key and annotations are touched.
pub async fn apply_node_action(client: &Client, action: &NodeAction) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let node = api.get(action.node()).await?;
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut annotations = node.annotations().clone();
    let mut ops: Vec<Value> = vec![json!({
        "op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version()
    })];
    match action {
        NodeAction::Taint { .. } => {
            taints.push(Taint {
                key: UNHEALTHY_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
            annotations.insert(TAINTED_ANNOTATION.into(), "true".into());
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Untaint { .. } => {
            taints.retain(|t| t.key != UNHEALTHY_TAINT);
            annotations.remove(TAINTED_ANNOTATION);
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Cordon { reason, .. } => {
            annotations.insert(CORDONED_ANNOTATION.into(), "true".into());
            annotations.insert(
                REPAIR_ANNOTATION.into(),
                json!({"reason": reason, "since": k8s_openapi::jiff::Timestamp::now().to_string(), "by": "kaccel"}).to_string(),
            );
            ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": true}));
        }
        NodeAction::Uncordon { .. } => {
            annotations.remove(CORDONED_ANNOTATION);
            annotations.remove(REPAIR_ANNOTATION);
            ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": false}));
        }
    }
    ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": annotations}));
    // Annotations are written as a whole map (no JSON-pointer escaping of keys);
    // the resourceVersion test makes that safe against concurrent writers.
    let patch = serde_json::from_value(Value::Array(ops)).expect("a valid JSON patch");
    api.patch(
        action.node(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await?;
    Ok(())
}

use crate::k8s::labels::EVICTED_FOR_ANNOTATION;
/// On a Workload kaccel deactivated and will activate again once Kueue evicted it.
pub const REQUEUE_ANNOTATION: &str = "kaccel.io/requeue";

/// Evict the admitted Workloads whose pods run on `node`: a pod belongs to the
/// Workload that owns it or its controller (Job, JobSet, ...). Kueue does the
/// eviction when kaccel deactivates the Workload (`spec.active: false`).
pub async fn evict_workloads_on(
    client: &Client,
    node: &str,
    reason: &str,
) -> Result<Vec<String>, kube::Error> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::ListParams;
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut owners: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for pod in &on_node.items {
        let ns = pod.namespace().unwrap_or_default();
        let set = owners.entry(ns).or_default();
        set.extend(pod.metadata.uid.clone());
        set.extend(pod.owner_references().iter().map(|o| o.uid.clone()));
    }
    let mut evicted = Vec::new();
    for (ns, uids) in owners {
        let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
        for wl in workloads.list(&ListParams::default()).await?.items {
            let owned = wl.owner_references().iter().any(|o| uids.contains(&o.uid));
            let admitted = wl.status.admission.is_some();
            if !(owned && admitted && wl.active()) {
                continue;
            }
            let name = wl.name_any();
            let patch = json!({
                "metadata": {"annotations": {
                    EVICTED_FOR_ANNOTATION: format!("{node}: {reason}"),
                    REQUEUE_ANNOTATION: "true",
                }},
                "spec": {"active": false},
            });
            workloads
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            evicted.push(format!("{ns}/{name}"));
        }
    }
    Ok(evicted)
}

/// Activate again the Workloads kaccel deactivated, once Kueue has evicted them
/// (their admission is gone): they queue for healthy capacity like any other.
pub async fn requeue_evicted(client: &Client) -> Result<(Vec<String>, usize), kube::Error> {
    use kube::api::ListParams;
    let workloads: Api<Workload> = Api::all(client.clone());
    let mut requeued = Vec::new();
    let mut waiting = 0;
    for wl in workloads.list(&ListParams::default()).await?.items {
        if wl.annotations().get(REQUEUE_ANNOTATION).map(String::as_str) != Some("true") {
            continue;
        }
        if wl.status.admission.is_some() {
            waiting += 1; // Kueue has not evicted it yet
            continue;
        }
        let ns = wl.namespace().unwrap_or_default();
        let api: Api<Workload> = Api::namespaced(client.clone(), &ns);
        let patch = json!({
            "metadata": {"annotations": {REQUEUE_ANNOTATION: null}},
            "spec": {"active": true},
        });
        api.patch(
            &wl.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        requeued.push(format!("{ns}/{}", wl.name_any()));
    }
    Ok((requeued, waiting))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(node: &str) -> HeldBack {
        HeldBack {
            node: node.into(),
            flavor: "h100".into(),
            allowed: 1,
            reason: "gpu 3 failed".into(),
        }
    }

    #[test]
    fn a_node_held_back_is_announced_once_until_it_is_released() {
        let mut last = BTreeSet::from(["n1".to_string()]);
        let newly = newly_held(&mut last, &[held("n1"), held("n2")]);
        assert_eq!(newly, vec![held("n2")]);
        assert_eq!(last, BTreeSet::from(["n1".to_string(), "n2".to_string()]));
        // Still held: no new Event.
        assert!(newly_held(&mut last, &[held("n2")]).is_empty());
        assert_eq!(last, BTreeSet::from(["n2".to_string()]));
        // Released, then held back again: announced again.
        assert_eq!(newly_held(&mut last, &[held("n1")]), vec![held("n1")]);
        assert!(newly_held(&mut last, &[]).is_empty());
        assert!(last.is_empty());
    }

    #[test]
    fn each_node_action_has_its_verb_event_and_severity() {
        let node = || "gpu-1".to_string();
        let reason = || "gpu 3 failed (XID 79)".to_string();
        let taint = describe(&NodeAction::Taint {
            node: node(),
            reason: reason(),
        });
        assert_eq!(
            (taint.0, taint.1, taint.2),
            ("taint", "KaccelTainted", EventType::Warning)
        );
        assert!(
            taint.3.contains(UNHEALTHY_TAINT) && taint.3.contains("gpu 3 failed (XID 79)"),
            "{}",
            taint.3
        );
        let cordon = describe(&NodeAction::Cordon {
            node: node(),
            reason: reason(),
        });
        assert_eq!(
            (cordon.0, cordon.1, cordon.2),
            ("cordon", "KaccelCordoned", EventType::Warning)
        );
        assert!(cordon.3.contains("gpu 3 failed (XID 79)"), "{}", cordon.3);
        let untaint = describe(&NodeAction::Untaint { node: node() });
        assert_eq!(
            (untaint.0, untaint.1, untaint.2),
            ("untaint", "KaccelUntainted", EventType::Normal)
        );
        let uncordon = describe(&NodeAction::Uncordon { node: node() });
        assert_eq!(
            (uncordon.0, uncordon.1, uncordon.2),
            ("uncordon", "KaccelUncordoned", EventType::Normal)
        );
    }
}
