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
            &self.config.instance,
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

    /// Deactivate the warned Workloads whose grace period ended; cancel the warnings
    /// of those whose node is back.
    pub(super) async fn deactivate_due_workloads(&self) -> Result<(), Error> {
        if !self.evictions_pending.load(Ordering::Relaxed) {
            return Ok(());
        }
        // Listing every Workload is not free: at most every EVICTION_CHECK_SECONDS.
        let now = super::health_poller::now_seconds();
        {
            let mut next = self
                .next_eviction_check
                .lock()
                .expect("eviction check lock");
            if now < *next {
                return Ok(());
            }
            *next = now + EVICTION_CHECK_SECONDS;
        }
        let due = deactivate_due(&self.client, now, &self.config.instance)
            .await
            .map_err(api_err(
                "evicting Workloads at the end of their grace period",
            ))?;
        for (ns, name, uid) in &due.cancelled {
            tracing::info!(workload = %format!("{ns}/{name}"), "eviction cancelled");
            self.publish(
                &workload_reference(ns, name, uid),
                EventType::Normal,
                "EvictionCancelled",
                "the node is back in service (or the Workload no longer runs there): not evicted",
            )
            .await;
        }
        self.evicted(None, &due.evicted).await;
        self.evictions_pending
            .store(due.waiting > 0, Ordering::Relaxed);
        Ok(())
    }

    /// Record Workloads deactivated for eviction: metrics, the requeue to come,
    /// an Event on each (and on the node, when known).
    async fn evicted(&self, node: Option<&str>, evicted: &[WorkloadRef]) {
        if evicted.is_empty() {
            return;
        }
        self.metrics.write("Workload", "evict");
        self.requeue_pending.store(true, Ordering::Relaxed);
        let names: Vec<String> = evicted
            .iter()
            .map(|(ns, n, _)| format!("{ns}/{n}"))
            .collect();
        tracing::warn!(node = node.unwrap_or("-"), workloads = ?names, "evicted Workloads from a node with a failed accelerator");
        for (ns, name, uid) in evicted {
            self.publish(
                &workload_reference(ns, name, uid),
                EventType::Warning,
                "KaccelEvicted",
                "deactivated for eviction from a node with a failed accelerator; requeued once Kueue released it",
            )
            .await;
        }
        if let Some(node) = node {
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..Default::default()
            };
            self.publish(
                &reference,
                EventType::Warning,
                "KaccelEvictedWorkloads",
                &format!("evicted for requeue: {}", names.join(", ")),
            )
            .await;
        }
    }

    /// Workloads kaccel evicted go back to their queues once Kueue evicted them.
    pub(super) async fn requeue_evicted_workloads(&self) -> Result<(), Error> {
        if self.requeue_pending.load(Ordering::Relaxed) {
            let (requeued, waiting) = requeue_evicted(&self.client, &self.config.instance)
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
        let devices = match action {
            NodeAction::Cordon { node, .. } => {
                let tracker = self.health.lock().expect("tracker lock");
                repair_devices(&tracker, node, super::health_poller::now_seconds())
            }
            _ => vec![],
        };
        apply_node_action(&self.client, action, &devices, &self.config.instance)
            .await
            .map_err(api_err(format!("{verb} node {}", action.node())))?;
        if let NodeAction::Cordon { node, reason } = action
            && self.config.health.actions.evict_workloads_on_failed
        {
            let grace = self.config.health.actions.eviction_grace_seconds;
            let done = evict_workloads_on(&self.client, node, reason, grace, &self.config.instance)
                .await
                .map_err(api_err(format!("evicting Workloads from node {node}")))?;
            if !done.scheduled.is_empty() {
                self.evictions_pending.store(true, Ordering::Relaxed);
                tracing::warn!(%node, workloads = ?done.scheduled, grace, "Workloads on a node with a failed accelerator warned of eviction");
                for (ns, name, uid) in &done.scheduled {
                    self.metrics.write("Workload", "warn-eviction");
                    self.publish(
                        &workload_reference(ns, name, uid),
                        EventType::Warning,
                        "EvictionScheduled",
                        &format!(
                            "{node}: {reason}; kaccel deactivates this Workload in {grace}s (Kueue evicts and requeues it) unless the node is back in service first"
                        ),
                    )
                    .await;
                }
            }
            self.evicted(Some(node), &done.evicted).await;
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
/// The cards a repair request names: every device of `node` that counts out
/// (Failed or Degraded), with what identifies it and why.
pub fn repair_devices(
    tracker: &crate::health::policy::Tracker,
    node: &str,
    now: i64,
) -> Vec<Value> {
    tracker
        .devices
        .values()
        .filter(|d| d.node == node)
        .filter(|d| crate::health::policy::keeps_out(d.effective_status(&tracker.sources, now)))
        .map(|d| {
            let labels = &d.reading.raw_labels;
            let serial = ["serial_number", "Serial", "serial", "DCGM_FI_DEV_SERIAL"]
                .iter()
                .find_map(|k| labels.get(k).filter(|v| !v.is_empty()));
            // First seen: when it last turned bad.
            let first_seen = d
                .transitions
                .iter()
                .rev()
                .find(|t| crate::health::policy::keeps_out(t.to))
                .map_or(d.observed_at, |t| t.at);
            json!({
                "device": d.reading.uuid.as_deref().unwrap_or(&d.device),
                "serial": serial,
                "status": format!("{:?}", d.status),
                "fault": d.reasons.join("; "),
                "firstSeen": crate::k8s::time::rfc3339(first_seen),
            })
        })
        .collect()
}

/// Take one node action. A cordon writes the repair request: why, since when,
/// and the cards at fault (`devices`, from [`repair_devices`]).
pub async fn apply_node_action(
    client: &Client,
    action: &NodeAction,
    devices: &[Value],
    instance: &str,
) -> Result<(), kube::Error> {
    let mark = crate::k8s::instance::node_mark(instance);
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
            annotations.insert(TAINTED_ANNOTATION.into(), mark.into());
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Untaint { .. } => {
            taints.retain(|t| t.key != UNHEALTHY_TAINT);
            annotations.remove(TAINTED_ANNOTATION);
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Cordon { reason, .. } => {
            annotations.insert(CORDONED_ANNOTATION.into(), mark.into());
            annotations.insert(
                REPAIR_ANNOTATION.into(),
                json!({
                    "node": action.node(),
                    "reason": reason,
                    "since": k8s_openapi::jiff::Timestamp::now().to_string(),
                    "by": instance,
                    "devices": devices,
                })
                .to_string(),
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
/// On a Workload kaccel deactivated and will activate again once Kueue evicted it;
/// its value is the installation's node mark (`true` for the default instance).
pub const REQUEUE_ANNOTATION: &str = "kaccel.io/requeue";

/// How often warned Workloads are looked at (their deadlines, their nodes).
const EVICTION_CHECK_SECONDS: i64 = 2;

/// On a Workload kaccel will deactivate: when (RFC 3339), unless the node is back.
pub const EVICT_AT_ANNOTATION: &str = "kaccel.io/evict-at";
/// ... and why: `<node>: <reason>`.
pub const EVICT_FOR_ANNOTATION: &str = "kaccel.io/evict-for";
/// The condition a warned Workload carries (a job can watch for it and checkpoint).
pub const EVICTION_CONDITION: &str = "kaccel.io/EvictionScheduled";

/// A Workload kaccel acted on: (namespace, name, uid).
pub type WorkloadRef = (String, String, String);

/// What [`evict_workloads_on`] did.
#[derive(Debug, Default)]
pub struct Evictions {
    /// Deactivated now (no grace).
    pub evicted: Vec<WorkloadRef>,
    /// Warned: deactivated after the grace period unless the node comes back.
    pub scheduled: Vec<WorkloadRef>,
}

/// Evict the admitted Workloads whose pods run on `node`: a pod belongs to the
/// Workload that owns it or its controller (Job, JobSet, ...). Kueue does the
/// eviction when kaccel deactivates the Workload (`spec.active: false`). With a
/// grace period, each is first warned ([`EVICTION_CONDITION`], annotations with the
/// time); [`deactivate_due`] deactivates it when the time comes.
pub async fn evict_workloads_on(
    client: &Client,
    node: &str,
    reason: &str,
    grace_seconds: u32,
    instance: &str,
) -> Result<Evictions, kube::Error> {
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
    let mut done = Evictions::default();
    let why = format!("{node}: {reason}");
    for (ns, uids) in owners {
        let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
        for wl in workloads.list(&ListParams::default()).await?.items {
            let owned = wl.owner_references().iter().any(|o| uids.contains(&o.uid));
            let admitted = wl.status.admission.is_some();
            if !(owned && admitted && wl.active()) {
                continue;
            }
            let name = wl.name_any();
            let id = (ns.clone(), name.clone(), wl.uid().unwrap_or_default());
            if grace_seconds == 0 {
                deactivate(&workloads, &name, &why, instance).await?;
                done.evicted.push(id);
                continue;
            }
            if wl.annotation(EVICT_AT_ANNOTATION).is_some() {
                continue; // already warned
            }
            let at = k8s_openapi::jiff::Timestamp::from_second(
                super::health_poller::now_seconds() + i64::from(grace_seconds),
            )
            .unwrap_or_default();
            let patch = json!({"metadata": {"annotations": {
                EVICT_AT_ANNOTATION: at.to_string(),
                EVICT_FOR_ANNOTATION: why,
            }}});
            workloads
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            set_eviction_condition(
                &workloads,
                &name,
                true,
                "AcceleratorFailed",
                &format!("{why}; kaccel deactivates this Workload at {at} (Kueue evicts and requeues it) unless the node is back in service first: save a checkpoint now"),
            )
            .await?;
            done.scheduled.push(id);
        }
    }
    Ok(done)
}

/// Deactivate a Workload for eviction (Kueue evicts it; the installation whose
/// mark the requeue annotation carries activates it again).
async fn deactivate(
    workloads: &Api<Workload>,
    name: &str,
    why: &str,
    instance: &str,
) -> Result<(), kube::Error> {
    let patch = json!({
        "metadata": {"annotations": {
            EVICTED_FOR_ANNOTATION: why,
            REQUEUE_ANNOTATION: crate::k8s::instance::node_mark(instance),
            EVICT_AT_ANNOTATION: null,
            EVICT_FOR_ANNOTATION: null,
        }},
        "spec": {"active": false},
    });
    workloads
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// kaccel's own condition on a Workload, by server-side apply of that one entry of
/// `status.conditions` (a list keyed by type: Kueue's conditions are left alone).
async fn set_eviction_condition(
    workloads: &Api<Workload>,
    name: &str,
    status: bool,
    reason: &str,
    message: &str,
) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::from_second(super::health_poller::now_seconds())
        .unwrap_or_default();
    let patch = json!({
        "apiVersion": crate::k8s::resources::kueue_api_version(),
        "kind": "Workload",
        "status": {"conditions": [{
            "type": EVICTION_CONDITION,
            "status": if status { "True" } else { "False" },
            "reason": reason,
            "message": message.chars().take(1000).collect::<String>(),
            "lastTransitionTime": now.to_string(),
        }]},
    });
    workloads
        .patch_status(
            name,
            &PatchParams::apply("kaccel-health").force(),
            &Patch::Apply(&patch),
        )
        .await?;
    Ok(())
}

/// What [`deactivate_due`] found.
#[derive(Debug, Default)]
pub struct DueEvictions {
    pub evicted: Vec<WorkloadRef>,
    /// Warned, but the node is back in service (or the Workload is gone from it).
    pub cancelled: Vec<WorkloadRef>,
    /// Still within their grace period.
    pub waiting: usize,
}

/// Deactivate the warned Workloads whose time has come; cancel the warning of
/// those whose node kaccel no longer holds out, or that finished or lost their
/// admission meanwhile.
pub async fn deactivate_due(
    client: &Client,
    now: i64,
    instance: &str,
) -> Result<DueEvictions, kube::Error> {
    use kube::api::ListParams;
    let all: Api<Workload> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let mut out = DueEvictions::default();
    let mut held_out_nodes: std::collections::BTreeMap<String, (bool, bool)> = Default::default();
    for wl in all.list(&ListParams::default()).await?.items {
        let (Some(at), Some(why)) = (
            wl.annotation(EVICT_AT_ANNOTATION),
            wl.annotation(EVICT_FOR_ANNOTATION),
        ) else {
            continue;
        };
        let ns = wl.namespace().unwrap_or_default();
        let name = wl.name_any();
        let id = (ns.clone(), name.clone(), wl.uid().unwrap_or_default());
        let workloads: Api<Workload> = Api::namespaced(client.clone(), &ns);
        let node = why.split(": ").next().unwrap_or_default();
        // Several Workloads on one node: read the node once per pass. A node
        // another installation cordoned is that installation's to act on.
        let (held_out, theirs) = match held_out_nodes.get(node) {
            Some(held) => *held,
            None => {
                let mark = nodes.get_opt(node).await?.and_then(|n| {
                    n.annotations()
                        .get(CORDONED_ANNOTATION)
                        .map(|m| crate::k8s::instance::node_mark_owner(m).to_string())
                });
                let held = (mark.is_some(), mark.is_some_and(|owner| owner != instance));
                held_out_nodes.insert(node.to_string(), held);
                held
            }
        };
        if theirs {
            continue;
        }
        let still_running = wl.status.admission.is_some() && wl.active() && !wl.is_true("Finished");
        if !(held_out && still_running) {
            let patch = json!({"metadata": {"annotations": {
                EVICT_AT_ANNOTATION: null, EVICT_FOR_ANNOTATION: null,
            }}});
            workloads
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            if still_running {
                set_eviction_condition(
                    &workloads,
                    &name,
                    false,
                    "NodeBackInService",
                    &format!("{node} is back in service: no eviction"),
                )
                .await?;
            }
            out.cancelled.push(id);
            continue;
        }
        // Unreadable (edited by hand): due now.
        let due = at
            .parse::<k8s_openapi::jiff::Timestamp>()
            .map(|t| t.as_second())
            .unwrap_or(0);
        if now < due {
            out.waiting += 1;
            continue;
        }
        deactivate(&workloads, &name, why, instance).await?;
        set_eviction_condition(
            &workloads,
            &name,
            true,
            "Evicted",
            &format!("{why}; deactivated for eviction, requeued once Kueue released it"),
        )
        .await?;
        out.evicted.push(id);
    }
    Ok(out)
}

/// Activate again the Workloads kaccel deactivated, once Kueue has evicted them
/// (their admission is gone): they queue for healthy capacity like any other.
pub async fn requeue_evicted(
    client: &Client,
    instance: &str,
) -> Result<(Vec<String>, usize), kube::Error> {
    use kube::api::ListParams;
    let workloads: Api<Workload> = Api::all(client.clone());
    let mut requeued = Vec::new();
    let mut waiting = 0;
    let mark = crate::k8s::instance::node_mark(instance);
    for wl in workloads.list(&ListParams::default()).await?.items {
        if wl.annotations().get(REQUEUE_ANNOTATION).map(String::as_str) != Some(mark) {
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

fn workload_reference(namespace: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some(crate::k8s::resources::kueue_api_version()),
        kind: Some("Workload".into()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid: Some(uid.to_string()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repair_request_names_each_card_out_with_its_fault_and_since_when() {
        use crate::health::policy::Policy;
        use crate::health::policy::testing::{NODE, SOURCE, gpus, watched};
        let mut t = watched();
        let policy = Policy::default();
        t.observe(SOURCE, gpus(&[0, 1, 2, 3], &[], &[]), 1000, &policy);
        t.observe(SOURCE, gpus(&[0, 1, 2, 3], &[3], &[1]), 1010, &policy);
        t.observe(SOURCE, gpus(&[0, 1, 2, 3], &[3], &[1]), 1020, &policy);
        let devices = repair_devices(&t, NODE, 1020);
        let named: Vec<&str> = devices
            .iter()
            .filter_map(|d| d["device"].as_str())
            .collect();
        assert_eq!(
            named,
            ["1", "3"],
            "the hot and the failed card, not the others"
        );
        let failed = &devices[1];
        assert_eq!(failed["status"], "Failed");
        assert!(
            failed["fault"]
                .as_str()
                .unwrap()
                .contains("uncorrectable ECC")
        );
        assert_eq!(failed["firstSeen"], crate::k8s::time::rfc3339(1010));
        assert!(repair_devices(&t, "another-node", 1020).is_empty());
    }

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
