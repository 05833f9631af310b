//! The credit check's finalizer on a Workload as it is created, as pure
//! functions (the I/O is in `controller::pod_webhook`, which serves both hooks).
//!
//! Why at creation: the finalizer must be on a Workload before its first Reserve
//! entry is appended (once the entry exists, the Workload must not go away
//! unsettled). Written by kaccel when Kueue reserves quota, it was one API write
//! on the admission's critical path, before the check could be set Ready. Put on
//! by the API server as the Workload is created, it costs no write at all, and
//! the reservation record follows once Kueue has admitted the Workload.
//!
//! Which Workloads: those whose LocalQueue (`spec.queueName` in the Workload's
//! namespace) sends them to a ClusterQueue this installation owns that carries
//! its credit check. Any other is left alone: nobody would release the
//! finalizer of a Workload kaccel never charges.

use serde_json::{Value, json};

/// Whether the Workload being created in `namespace` goes to a ClusterQueue
/// this installation charges: `cluster_queue_of(namespace, local_queue)` names
/// the LocalQueue's ClusterQueue (none: no such LocalQueue seen), and
/// `charges(cluster_queue)` says whether that queue carries kaccel's check.
/// One created inactive (`spec.active: false`, job history or a suspended
/// submission) is not: it may never run, and the finalizer would hold it and
/// keep it in the credit check's cache; should it run, the check writes the
/// finalizer when Kueue reserves quota.
pub fn charged(
    workload: &Value,
    namespace: &str,
    cluster_queue_of: impl Fn(&str, &str) -> Option<String>,
    charges: impl Fn(&str) -> bool,
) -> bool {
    if workload["spec"]["active"] == Value::Bool(false) {
        return false;
    }
    workload["spec"]["queueName"]
        .as_str()
        .filter(|q| !q.is_empty())
        .and_then(|q| cluster_queue_of(namespace, q))
        .is_some_and(|cq| charges(&cq))
}

/// The JSON patch (RFC 6902) that adds `finalizer` to `workload`'s
/// `metadata.finalizers`; empty when it is there already.
pub fn add_finalizer(workload: &Value, finalizer: &str) -> Vec<Value> {
    match workload["metadata"]["finalizers"].as_array() {
        Some(list) if list.iter().any(|f| f == finalizer) => Vec::new(),
        Some(_) => vec![json!({"op": "add", "path": "/metadata/finalizers/-", "value": finalizer})],
        None => vec![json!({"op": "add", "path": "/metadata/finalizers", "value": [finalizer]})],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::webhook::tests::applied as apply;

    const FINALIZER: &str = "kaccel.io/credits";

    #[test]
    fn the_finalizer_is_added_once_beside_any_other() {
        let bare = json!({"metadata": {"name": "w"}});
        assert_eq!(
            apply(&bare, &add_finalizer(&bare, FINALIZER))["metadata"]["finalizers"],
            json!([FINALIZER])
        );
        let kueues = json!({"metadata": {"finalizers": ["kueue.x-k8s.io/resource-in-use"]}});
        assert_eq!(
            apply(&kueues, &add_finalizer(&kueues, FINALIZER))["metadata"]["finalizers"],
            json!(["kueue.x-k8s.io/resource-in-use", FINALIZER])
        );
        let ours = json!({"metadata": {"finalizers": [FINALIZER]}});
        assert!(add_finalizer(&ours, FINALIZER).is_empty());
    }

    #[test]
    fn only_workloads_bound_for_a_charged_queue_are_charged() {
        let queues = |ns: &str, lq: &str| match (ns, lq) {
            ("vision", "h100") => Some("vision-h100".to_string()),
            ("vision", "cpu") => Some("plain".to_string()),
            _ => None,
        };
        let charges = |cq: &str| cq == "vision-h100";
        let to = |queue: Value| json!({"spec": {"queueName": queue}});
        assert!(charged(&to(json!("h100")), "vision", queues, charges));
        let active = |active: bool| json!({"spec": {"queueName": "h100", "active": active}});
        assert!(charged(&active(true), "vision", queues, charges));
        assert!(!charged(&active(false), "vision", queues, charges));
        // A queue without kaccel's check, another namespace's LocalQueue of the
        // same name, a LocalQueue not seen (yet), and no queue at all.
        assert!(!charged(&to(json!("cpu")), "vision", queues, charges));
        assert!(!charged(&to(json!("h100")), "audio", queues, charges));
        assert!(!charged(&to(json!("missing")), "vision", queues, charges));
        assert!(!charged(&to(json!("")), "vision", queues, charges));
        assert!(!charged(&json!({"spec": {}}), "vision", queues, charges));
    }
}
