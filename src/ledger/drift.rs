//! The ledger against Kueue, as a pure comparison (used by the controller every
//! budget pass and by `kaccel ledger verify --kubeconfig`):
//! - every open reservation belongs to a Workload that still exists;
//! - every Workload Kueue counts in a kaccel ClusterQueue whose credit check is
//!   Ready has an open reservation (admission without a charge);
//! - per (ClusterQueue, flavor), the device units of open reservations plus
//!   those of Workloads still waiting on the check equal Kueue's
//!   `status.flavorsReservation` for accelerator resources.

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};

use super::admission::{reserved_devices, usage_from_workload};
use super::lifecycle::{check_state, counted_by_kueue, record_of};
use super::store::OpenReservation;
use crate::kueue::ClusterQueueReservations;
use crate::kueue::workload::Workload;

/// One disagreement between the ledger and Kueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    pub budget: String,
    pub message: String,
    /// Set when the finding is an open reservation whose Workload is gone: the
    /// controller closes it (with a Void that says why) once the finding persists.
    pub orphan: Option<OpenReservation>,
}

/// Compares `open` reservations with `workloads` (all namespaces) and
/// `cluster_queues`. `queue_budgets` maps each kaccel ClusterQueue to its budget;
/// other queues are not the ledger's business. `check` is the AdmissionCheck name.
pub fn compare<W: Borrow<Workload>>(
    open: &[OpenReservation],
    workloads: &[W],
    cluster_queues: &[ClusterQueueReservations],
    queue_budgets: &BTreeMap<String, String>,
    check: &str,
) -> Vec<Finding> {
    let mut findings = Vec::new();
    let by_uid: BTreeMap<&str, &Workload> = workloads
        .iter()
        .map(Borrow::borrow)
        .map(|w: &Workload| (w.metadata.uid.as_deref().unwrap_or_default(), w))
        .filter(|(uid, _)| !uid.is_empty())
        .collect();
    let mut ledger_units: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut open_uids: BTreeSet<&str> = BTreeSet::new();
    for r in open {
        let e = &r.reserve.entry;
        open_uids.insert(e.workload_uid.as_str());
        let Some(w) = by_uid.get(e.workload_uid.as_str()) else {
            findings.push(Finding {
                budget: e.budget.clone(),
                message: format!(
                    "reservation {} of Workload {}/{} is open but the Workload is gone",
                    e.key, e.namespace, e.workload
                ),
                orphan: Some(r.clone()),
            });
            continue;
        };
        // One open reservation per line: its flavor and units are on the entry;
        // the ClusterQueue comes from the record, or, while the record is not
        // written yet (it follows the check's answer), from the quota the
        // Workload holds.
        let cluster_queue = match record_of(w) {
            Ok(Some(rec)) => (rec.admission == e.admission).then_some(rec.cluster_queue),
            Ok(None) => w.cluster_queue().map(str::to_string),
            Err(_) => None,
        };
        if let Some(cluster_queue) = cluster_queue
            && counted_by_kueue(w)
        {
            *ledger_units
                .entry((cluster_queue, e.flavor.clone()))
                .or_default() += e.device_units;
        }
    }
    let mut waiting_units: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (uid, w) in &by_uid {
        let Some((state, _)) = check_state(w, check) else {
            continue;
        };
        if !counted_by_kueue(w) || open_uids.contains(uid) {
            continue;
        }
        let cq = w.cluster_queue().unwrap_or_default();
        let usage = usage_from_workload(w).unwrap_or_default();
        for u in &usage {
            *waiting_units
                .entry((cq.to_string(), u.flavor.clone()))
                .or_default() += u.device_units;
        }
        if state == "Ready"
            && !usage.is_empty()
            && let Some(budget) = queue_budgets.get(cq)
        {
            findings.push(Finding {
                budget: budget.clone(),
                message: format!(
                    "Workload {}/{} holds quota in {cq} with the credit check Ready but has no open reservation",
                    w.metadata.namespace.as_deref().unwrap_or_default(),
                    w.metadata.name.as_deref().unwrap_or_default(),
                ),
                orphan: None,
            });
        }
    }
    for cq in cluster_queues {
        let cq_name = cq.metadata.name.as_str();
        let Some(budget) = queue_budgets.get(cq_name) else {
            continue;
        };
        let mut kueue_units: BTreeMap<String, u64> = BTreeMap::new();
        for flavor in cq.flavors_reservation() {
            // One device, one count (the class resource counts the vendor names too).
            *kueue_units.entry(flavor.name.clone()).or_default() += reserved_devices(flavor);
        }
        // Flavors either side knows of: one missing on one side counts as zero there.
        let flavors: BTreeSet<String> = kueue_units
            .keys()
            .cloned()
            .chain(
                ledger_units
                    .keys()
                    .chain(waiting_units.keys())
                    .filter(|(q, _)| q == cq_name)
                    .map(|(_, f)| f.clone()),
            )
            .collect();
        for flavor in flavors {
            let key = (cq_name.to_string(), flavor.clone());
            let kueue = kueue_units.get(&flavor).copied().unwrap_or(0);
            let charged = ledger_units.get(&key).copied().unwrap_or(0);
            let waiting = waiting_units.get(&key).copied().unwrap_or(0);
            if kueue != charged + waiting {
                findings.push(Finding {
                    budget: budget.clone(),
                    message: format!(
                        "ClusterQueue {cq_name} flavor {flavor}: Kueue holds {kueue} device(s), the ledger has open reservations for {charged} (+{waiting} awaiting the check)"
                    ),
                    orphan: None,
                });
            }
        }
    }
    findings
}

/// The label Kueue's MultiKueue puts on the copies it creates in a worker.
pub const MULTIKUEUE_ORIGIN_LABEL: &str = "kueue.x-k8s.io/multikueue-origin";

/// Compares the ledger with a MultiKueue worker's own Kueue: each manager
/// Workload dispatched to `worker` (`status.clusterName`) with open
/// reservations must be admitted there (MultiKueue's copy: same namespace and
/// name, the origin label) holding the same devices, and the worker holds no
/// dispatched Workload the ledger does not charge. `manager` are the manager's
/// Workloads, `remote` the worker's.
pub fn compare_worker<M: Borrow<Workload>, R: Borrow<Workload>>(
    worker: &str,
    open: &[OpenReservation],
    manager: &[M],
    remote: &[R],
) -> Vec<Finding> {
    let key = |w: &Workload| {
        format!(
            "{}/{}",
            w.metadata.namespace.as_deref().unwrap_or_default(),
            w.metadata.name.as_deref().unwrap_or_default()
        )
    };
    let dispatched: BTreeMap<&str, &Workload> = manager
        .iter()
        .map(Borrow::borrow)
        .filter(|w: &&Workload| w.cluster_name() == worker && counted_by_kueue(w))
        .filter_map(|w| Some((w.metadata.uid.as_deref()?, w)))
        .collect();
    // namespace/name -> (budget, devices the ledger holds open).
    let mut charged: BTreeMap<String, (String, u64)> = BTreeMap::new();
    for r in open {
        let e = &r.reserve.entry;
        if let Some(w) = dispatched.get(e.workload_uid.as_str()) {
            let entry = charged
                .entry(key(w))
                .or_insert_with(|| (e.budget.clone(), 0));
            entry.1 += e.device_units;
        }
    }
    let admitted: BTreeMap<String, u64> = remote
        .iter()
        .map(Borrow::borrow)
        .filter(|w: &&Workload| {
            w.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key(MULTIKUEUE_ORIGIN_LABEL))
                && counted_by_kueue(w)
        })
        .map(|w| {
            let units = usage_from_workload(w)
                .unwrap_or_default()
                .iter()
                .map(|u| u.device_units)
                .sum();
            (key(w), units)
        })
        .collect();
    let mut findings = Vec::new();
    for (name, (budget, units)) in &charged {
        match admitted.get(name) {
            Some(held) if held == units => {}
            Some(held) => findings.push(Finding {
                budget: budget.clone(),
                message: format!(
                    "worker {worker}: Workload {name} holds {held} device(s) there, the ledger has open reservations for {units}"
                ),
                orphan: None,
            }),
            None => findings.push(Finding {
                budget: budget.clone(),
                message: format!(
                    "worker {worker}: Workload {name} is charged as running there ({units} device(s)) but the worker's Kueue does not admit it"
                ),
                orphan: None,
            }),
        }
    }
    for (name, held) in &admitted {
        if !charged.contains_key(name) {
            findings.push(Finding {
                budget: String::new(),
                message: format!(
                    "worker {worker}: Kueue there admits Workload {name} ({held} device(s)) that the ledger charges no open reservation for as dispatched there"
                ),
                orphan: None,
            });
        }
    }
    findings
}

/// The ClusterQueue -> budget map of kaccel's ClusterQueues (their labels).
pub fn queue_budgets(cluster_queues: &[ClusterQueueReservations]) -> BTreeMap<String, String> {
    cluster_queues
        .iter()
        .filter_map(|q| {
            let budget = q.label(crate::k8s::labels::BUDGET_LABEL)?;
            Some((q.metadata.name.clone(), budget.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::{Entry, EntryKind};
    use crate::ledger::lifecycle::{RESERVATION_ANNOTATION, RecordedLine, ReservationRecord};
    use crate::ledger::store::StoredEntry;
    use serde_json::{Value, json};

    const CHECK: &str = "kaccel-credits";

    fn reserve(uid: &str, units: u64) -> OpenReservation {
        reserve_on(uid, "h100", units)
    }

    fn reserve_on(uid: &str, flavor: &str, units: u64) -> OpenReservation {
        let mut r = OpenReservation {
            reserve: StoredEntry {
                id: 1,
                entry: Entry {
                    key: String::new(),
                    kind: EntryKind::Reserve,
                    budget: "vision".into(),
                    team: "vision".into(),
                    namespace: "ns".into(),
                    workload: format!("w-{uid}"),
                    workload_uid: uid.into(),
                    admission: 1,
                    class: "h100".into(),
                    flavor: flavor.into(),
                    resource: "nvidia.com/gpu".into(),
                    device_units: units,
                    start: 0,
                    end: 3600,
                    credits: 10,
                    rate_card: "rc".into(),
                    reason: String::new(),
                    created_at: 0,
                    rate: 1,
                    devices: vec![],
                    cluster: String::new(),
                },
            },
            reserved: 10,
            reserved_until: 3600,
            posted: 0,
            posted_until: 0,
        };
        r.reserve.entry.key = r.reserve.entry.derived_key().unwrap();
        r
    }

    fn workload(uid: &str, units: u64, check: &str, recorded: bool) -> Value {
        let mut w = json!({
            "metadata": {"name": format!("w-{uid}"), "namespace": "ns", "uid": uid, "annotations": {}},
            "spec": {"active": true},
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
                "admission": {"clusterQueue": "vision-h100", "podSetAssignments": [{
                    "name": "main", "flavors": {"nvidia.com/gpu": "h100"},
                    "resourceUsage": {"nvidia.com/gpu": units.to_string()}}]},
                "admissionChecks": [{"name": CHECK, "state": check}],
            }
        });
        if recorded {
            let rec = ReservationRecord {
                admission: 1,
                budget: "vision".into(),
                team: "vision".into(),
                cluster_queue: "vision-h100".into(),
                admitted_at: 0,
                horizon_seconds: 3600,
                lines: vec![RecordedLine {
                    flavor: "h100".into(),
                    resource: "nvidia.com/gpu".into(),
                    device_units: units,
                    class: "h100".into(),
                    model: "H100".into(),
                    rate: 1,
                    rate_card: "rc".into(),
                }],
            };
            w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!(rec.to_annotation());
        }
        w
    }

    fn queue(units: u64) -> Value {
        json!({
            "metadata": {"name": "vision-h100", "labels": {crate::k8s::labels::BUDGET_LABEL: "vision"}},
            "status": {"flavorsReservation": [{"name": "h100", "resources": [
                {"name": "nvidia.com/gpu", "total": units.to_string()},
                {"name": "cpu", "total": "96"}]}]}
        })
    }

    /// A ClusterQueue as the budget pass reads it from the managed cache's text.
    fn read(q: Value) -> ClusterQueueReservations {
        serde_json::from_str(&q.to_string()).expect("a ClusterQueue")
    }

    fn typed(v: &Value) -> Workload {
        serde_json::from_value(v.clone()).expect("a Workload")
    }

    fn run(open: &[OpenReservation], workloads: &[Value], units: u64) -> Vec<String> {
        let queues = [read(queue(units))];
        let workloads: Vec<Workload> = workloads.iter().map(typed).collect();
        compare(open, &workloads, &queues, &queue_budgets(&queues), CHECK)
            .into_iter()
            .map(|f| f.message)
            .collect()
    }

    /// The manager's Workload `uid` dispatched to `worker`, and the worker's
    /// copy (MultiKueue's origin label, no credit check there) holding `units`
    /// on the worker's own flavor.
    fn dispatched(uid: &str, units: u64, worker: &str) -> (Workload, Workload) {
        let mut manager = workload(uid, units, "Ready", true);
        manager["status"]["clusterName"] = json!(worker);
        let mut copy = workload(uid, units, "Ready", false);
        copy["metadata"]["uid"] = json!(format!("remote-{uid}"));
        copy["metadata"]["labels"] = json!({MULTIKUEUE_ORIGIN_LABEL: "multikueue"});
        copy["status"]["admissionChecks"] = json!([]);
        copy["status"]["admission"]["podSetAssignments"][0]["flavors"] =
            json!({"nvidia.com/gpu": "worker-h100"});
        (typed(&manager), typed(&copy))
    }

    #[test]
    fn a_worker_agrees_when_it_admits_what_the_ledger_charges_as_dispatched_there() {
        let (m1, r1) = dispatched("u1", 2, "worker-a");
        let (m2, r2) = dispatched("u2", 4, "worker-b");
        let open = [reserve("u1", 2), reserve("u2", 4)];
        let manager = [m1.clone(), m2.clone()];
        assert!(compare_worker("worker-a", &open, &manager, std::slice::from_ref(&r1)).is_empty());
        assert!(compare_worker("worker-b", &open, &manager, std::slice::from_ref(&r2)).is_empty());
        // Lost there: charged as running in worker-a, but it admits nothing.
        let lost = compare_worker("worker-a", &open, &manager, &[] as &[Workload]);
        assert_eq!(lost.len(), 1);
        assert!(
            lost[0]
                .message
                .contains("ns/w-u1 is charged as running there (2 device(s))"),
            "{}",
            lost[0].message
        );
        assert_eq!(lost[0].budget, "vision");
        // A different count there.
        let (_, r1_more) = dispatched("u1", 3, "worker-a");
        let more = compare_worker("worker-a", &open, &manager, &[r1_more]);
        assert!(
            more[0]
                .message
                .contains("holds 3 device(s) there, the ledger has open reservations for 2"),
            "{}",
            more[0].message
        );
        // Admitted there with nothing charged: the copy of a Workload the ledger
        // closed, or one dispatched to another worker.
        let uncharged = compare_worker(
            "worker-a",
            &[reserve("u2", 4)],
            &manager,
            std::slice::from_ref(&r1),
        );
        assert_eq!(uncharged.len(), 1);
        assert!(
            uncharged[0]
                .message
                .contains("admits Workload ns/w-u1 (2 device(s))"),
            "{}",
            uncharged[0].message
        );
        // Workloads without the origin label are the worker's own, not the ledger's.
        let mut local = r1;
        local.metadata.labels = None;
        assert_eq!(
            compare_worker("worker-a", &open, &manager, &[local]).len(),
            1
        );
    }

    #[test]
    fn in_sync_when_reservations_and_waiting_work_add_up_to_kueue() {
        let open = [reserve("a", 2)];
        let workloads = [
            workload("a", 2, "Ready", true),
            workload("b", 4, "Pending", false),
        ];
        assert_eq!(run(&open, &workloads, 6), Vec::<String>::new());
    }

    #[test]
    fn a_reservation_whose_record_is_not_written_yet_counts_where_the_quota_is() {
        // The record follows the check's answer: between the two the open
        // reservation counts in the ClusterQueue the Workload holds quota in.
        let open = [reserve("a", 2)];
        assert_eq!(
            run(&open, &[workload("a", 2, "Ready", false)], 2),
            Vec::<String>::new()
        );
        // A record of another admission is not this reservation's.
        let mut w = workload("a", 2, "Ready", true);
        let mut rec = record_of(&typed(&w)).unwrap().unwrap();
        rec.admission = 2;
        w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!(rec.to_annotation());
        let found = run(&open, &[w], 2);
        assert!(
            found[0].contains("Kueue holds 2 device(s), the ledger has open reservations for 0"),
            "{found:?}"
        );
    }

    #[test]
    fn a_multi_flavor_admission_counts_each_line_once() {
        // One admission on two flavors: two open lines, each counted on its flavor.
        let mut w = workload("a", 2, "Ready", true);
        let mut rec = record_of(&typed(&w)).unwrap().unwrap();
        let mut second = rec.lines[0].clone();
        second.flavor = "a100".into();
        second.device_units = 3;
        rec.lines.push(second);
        w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!(rec.to_annotation());
        w["status"]["admission"]["podSetAssignments"] = json!([
            {"name": "main", "flavors": {"nvidia.com/gpu": "h100"}, "resourceUsage": {"nvidia.com/gpu": "2"}},
            {"name": "extra", "flavors": {"nvidia.com/gpu": "a100"}, "resourceUsage": {"nvidia.com/gpu": "3"}},
        ]);
        let mut q = queue(2);
        q["status"]["flavorsReservation"]
            .as_array_mut()
            .unwrap()
            .push(json!({"name": "a100", "resources": [{"name": "nvidia.com/gpu", "total": "3"}]}));
        let open = [reserve_on("a", "h100", 2), reserve_on("a", "a100", 3)];
        let queues = [read(q)];
        let found = compare(&open, &[typed(&w)], &queues, &queue_budgets(&queues), CHECK);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_unit_count_mismatch_is_named() {
        let open = [reserve("a", 2)];
        let workloads = [workload("a", 2, "Ready", true)];
        let found = run(&open, &workloads, 3);
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("Kueue holds 3 device(s), the ledger has open reservations for 2"),
            "{found:?}"
        );
    }

    #[test]
    fn orphaned_reservations_and_uncharged_admissions_are_found() {
        let found = {
            let queues = [read(queue(2))];
            compare(
                &[reserve("gone", 1)],
                &[typed(&workload("a", 2, "Ready", true))],
                &queues,
                &queue_budgets(&queues),
                CHECK,
            )
        };
        let orphan = found
            .iter()
            .find(|f| f.orphan.is_some())
            .expect("orphan found");
        assert!(orphan.message.contains("w-gone") && orphan.message.contains("gone"));
        assert!(
            found
                .iter()
                .any(|f| f.message.contains("ns/w-a") && f.message.contains("no open reservation")),
            "{found:?}"
        );
    }

    #[test]
    fn deactivated_and_finished_work_is_not_counted() {
        let mut deactivated = workload("a", 2, "Pending", false);
        deactivated["spec"]["active"] = json!(false);
        deactivated["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Evicted", "status": "True", "lastTransitionTime": "2026-12-01T00:01:00Z"}));
        let mut finished = workload("b", 4, "Ready", false);
        finished["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:01:00Z"}));
        assert_eq!(run(&[], &[deactivated, finished], 0), Vec::<String>::new());
    }

    /// The budget pass reads whole managed ClusterQueues (spec and all): the
    /// spec is skipped, each flavor counts its devices once (the class resource
    /// counts the vendor's too), and a queue Kueue has not written a status for
    /// yet holds nothing.
    #[test]
    fn a_whole_cluster_queue_is_read_for_its_reservations_only() {
        let mut q = queue(0);
        q["spec"] = json!({"resourceGroups": [{"coveredResources": ["nvidia.com/gpu"],
            "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]});
        q["status"]["flavorsReservation"] = json!([{"name": "h100", "resources": [
            {"name": crate::api::CLASS_RESOURCE, "total": "4"},
            {"name": "nvidia.com/gpu", "total": "4"},
            {"name": "memory", "total": "512Gi"}]}]);
        let read_q = read(q.clone());
        assert_eq!(read_q.metadata.name, "vision-h100");
        assert_eq!(
            read_q.label(crate::k8s::labels::BUDGET_LABEL),
            Some("vision")
        );
        let open = [reserve("a", 4)];
        let workloads = [typed(&workload("a", 4, "Ready", true))];
        let queues = [read_q];
        let found = compare(&open, &workloads, &queues, &queue_budgets(&queues), CHECK);
        assert!(found.is_empty(), "{found:?}");

        q["status"] = Value::Null;
        let queues = [read(q)];
        assert!(queues[0].flavors_reservation().is_empty());
        let found = compare(&open, &workloads, &queues, &queue_budgets(&queues), CHECK);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].message.contains("Kueue holds 0 device(s)"),
            "{found:?}"
        );
    }

    #[test]
    fn queues_without_a_budget_label_are_ignored() {
        let mut q = queue(5);
        q["metadata"]["labels"] = json!({});
        let queues = [read(q)];
        assert!(
            compare(
                &[],
                &[] as &[Workload],
                &queues,
                &queue_budgets(&queues),
                CHECK
            )
            .is_empty()
        );
    }
}
