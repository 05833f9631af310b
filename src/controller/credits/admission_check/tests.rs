//! The check's pure decisions: the renewal rule a budget sets, and the message once credits are reserved.

use super::*;
use crate::api::AdmissionPolicy;
use crate::ledger::admission::{RateInfo, ReservationLine};
use crate::ledger::charge::ChargeOwner;
use crate::ledger::lifecycle::RecordedLine;
use crate::ledger::pricing::Rate;

const FINALIZER: &str = "kaccel.io/credits";

fn policy(when_renewal_short: Option<RenewalShortPolicy>) -> AdmissionPolicy {
    AdmissionPolicy {
        when_renewal_short,
        ..AdmissionPolicy::default()
    }
}

#[test]
fn only_overdraft_with_a_parsed_limit_renews_into_an_overdraft() {
    let limit = Some(Credits::from_micros(500_000_000));
    let overdraft = renewal_rule(&policy(Some(RenewalShortPolicy::Overdraft)), limit);
    assert!(overdraft.allow_overdraft);
    assert_eq!(overdraft.overdraft_limit, Credits::from_micros(500_000_000));
    // Overdraft whose limit did not parse (the budget is Invalid): stop, never an unbounded overdraft.
    let unparsed = renewal_rule(&policy(Some(RenewalShortPolicy::Overdraft)), None);
    assert!(!unparsed.allow_overdraft);
    assert_eq!(unparsed.overdraft_limit, Credits::ZERO);
    // Stop, or no rule at all: a limit alone allows nothing.
    for when in [Some(RenewalShortPolicy::Stop), None] {
        let rule = renewal_rule(&policy(when), limit);
        assert!(!rule.allow_overdraft, "{when:?}");
    }
}

fn recorded(flavor: &str, rate_card: &str) -> RecordedLine {
    RecordedLine {
        flavor: flavor.into(),
        resource: "nvidia.com/gpu".into(),
        device_units: 1,
        class: "large-training".into(),
        model: "H100".into(),
        rate: 3_600_000_000,
        rate_card: rate_card.into(),
    }
}

fn workload(maximum_execution_seconds: Option<u64>) -> Workload {
    let mut w = Workload::default();
    w.metadata.namespace = Some("vision".into());
    w.metadata.name = Some("train".into());
    w.spec.maximum_execution_time_seconds = maximum_execution_seconds.map(Value::from);
    w
}

fn note_for(w: &Workload) -> String {
    let record = ReservationRecord {
        admission: 1,
        budget: "vision".into(),
        team: "vision".into(),
        cluster_queue: "vision-large-training".into(),
        admitted_at: 1_000,
        horizon_seconds: 100,
        lines: vec![
            recorded("h100-b", "rc-2"),
            recorded("h100-a", "rc-1"),
            recorded("h100-c", "rc-2"),
        ],
    };
    // 2 devices at 3600 credits per device-hour for a 100 s term: 200 credits.
    let charge = Charge {
        owner: ChargeOwner {
            budget: "vision".into(),
            team: "vision".into(),
            namespace: "vision".into(),
            workload: "train".into(),
            workload_uid: "uid".into(),
            admission: 1,
        },
        admitted_at: 1_000,
        term_seconds: 100,
        lines: vec![ReservationLine {
            usage: FlavorUsage {
                flavor: "h100-a".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 2,
            },
            rate: RateInfo {
                class: "large-training".into(),
                model: "H100".into(),
                rate: Rate(3_600_000_000),
                rate_card: "rc-1".into(),
            },
            credits: Credits::ZERO,
        }],
        devices: vec![],
        cluster: String::new(),
    };
    ready_note(&record, &charge, w)
}

#[test]
fn the_ready_note_names_credits_budget_span_and_each_rate_card_once() {
    let renewed = note_for(&workload(None));
    assert_eq!(
        renewed,
        format!(
            "reserved {} credits of budget vision for the first 100s, renewed every 100s while it runs (rate card rc-1, rc-2)",
            format_micros(200_000_000)
        )
    );
    // Kueue stops a Workload with a maximum execution time at its horizon: never renewed.
    let bounded = note_for(&workload(Some(100)));
    assert!(bounded.contains("for up to 100s (rate card"), "{bounded}");
    assert!(!bounded.contains("renewed"), "{bounded}");
    // The same inputs, the same words: a replay writes nothing.
    assert_eq!(note_for(&workload(None)), renewed);
}

#[test]
fn namespace_and_name_of_a_workload_default_to_empty() {
    assert_eq!(namespace_and_name(&workload(None)), ("vision", "train"));
    assert_eq!(namespace_and_name(&Workload::default()), ("", ""));
}

/// A settled Workload as the cache holds it: kaccel's finalizer between two of
/// other controllers', and its reservation record.
fn settled(record: &str) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {
            "name": "w", "namespace": "ns", "resourceVersion": "41",
            "finalizers": ["kueue.x-k8s.io/resource-in-use", FINALIZER, "example.com/audit"],
            "annotations": {RESERVATION_ANNOTATION: record, "team": "vision"},
        },
        "status": {"conditions": [{"type": "Finished", "status": "True"}]},
    })
}

fn apply(patch: &Value, mut target: Value) -> Result<Value, json_patch::PatchError> {
    let patch: json_patch::Patch = serde_json::from_value(patch.clone()).unwrap();
    json_patch::patch(&mut target, &patch)?;
    Ok(target)
}

#[test]
fn release_removes_only_kaccels_finalizer_and_record() {
    let read: Workload = serde_json::from_value(settled("{\"budget\":\"b\"}")).unwrap();
    let patch = release_patch(&read, FINALIZER).expect("kaccel's finalizer is on it");
    // Kueue wrote the status since the read (a new resourceVersion): still applies.
    let mut now = settled("{\"budget\":\"b\"}");
    now["metadata"]["resourceVersion"] = json!("57");
    now["status"]["conditions"][0]["message"] = json!("written again by Kueue");
    let released = apply(&patch, now).expect("a status write is no conflict");
    assert_eq!(
        released["metadata"]["finalizers"],
        json!(["kueue.x-k8s.io/resource-in-use", "example.com/audit"])
    );
    assert_eq!(
        released["metadata"]["annotations"],
        json!({"team": "vision"})
    );
    assert_eq!(
        released["status"]["conditions"][0]["message"],
        "written again by Kueue"
    );
}

#[test]
fn release_fails_on_a_real_conflict() {
    let read: Workload = serde_json::from_value(settled("{\"budget\":\"b\"}")).unwrap();
    let patch = release_patch(&read, FINALIZER).unwrap();
    // The list moved: Kueue dropped its finalizer, ours is now first. Removing
    // position 1 would drop another controller's.
    let mut moved = settled("{\"budget\":\"b\"}");
    moved["metadata"]["finalizers"] = json!([FINALIZER, "example.com/audit"]);
    assert!(apply(&patch, moved).is_err());
    // A new admission was recorded after the read: its record and finalizer stay.
    let readmitted = settled("{\"budget\":\"b\",\"admission\":2}");
    assert!(apply(&patch, readmitted).is_err());
    // Nothing to release without the finalizer.
    let mut gone = settled("{}");
    gone["metadata"]["finalizers"] = json!(["example.com/audit", "kaccel.io/credits-team-b"]);
    let gone: Workload = serde_json::from_value(gone).unwrap();
    assert!(release_patch(&gone, FINALIZER).is_none());
    // Another installation releases only its own.
    let theirs = release_patch(&gone, "kaccel.io/credits-team-b").unwrap();
    assert_eq!(theirs[0]["path"], "/metadata/finalizers/1");
}

#[test]
fn the_placement_note_names_the_flavor_model_and_the_fuller_flavors_tried_first() {
    let cq = json!({
        "spec": {"resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "amd.com/gpu", "kaccel.io/accelerator", "cpu"],
            "flavors": [
                {"name": "nvidia-h100", "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": "16"}, {"name": "amd.com/gpu", "nominalQuota": "0"},
                    {"name": "kaccel.io/accelerator", "nominalQuota": "16"}, {"name": "cpu", "nominalQuota": "64"}]},
                {"name": "amd-mi300x", "resources": [
                    {"name": "nvidia.com/gpu", "nominalQuota": "0"}, {"name": "amd.com/gpu", "nominalQuota": "8"},
                    {"name": "kaccel.io/accelerator", "nominalQuota": "8"}, {"name": "cpu", "nominalQuota": "64"}]}]}]},
        "status": {"flavorsReservation": [
            // 8 by nvidia.com/gpu (also 8 of the class resource) + 8 by the class name.
            {"name": "nvidia-h100", "resources": [
                {"name": "nvidia.com/gpu", "total": "8"}, {"name": "kaccel.io/accelerator", "total": "16"},
                {"name": "cpu", "total": "32"}]}]}
    });
    let models = BTreeMap::from([
        (
            "nvidia-h100".to_string(),
            "NVIDIA-H100-80GB-HBM3".to_string(),
        ),
        (
            "amd-mi300x".to_string(),
            "AMD_Instinct_MI300X_OAM".to_string(),
        ),
    ]);
    let none = BTreeMap::new();
    let on = |flavor: &str| {
        vec![FlavorUsage {
            flavor: flavor.into(),
            resource: "kaccel.io/accelerator".into(),
            device_units: 8,
        }]
    };
    assert_eq!(
        placement_note(
            "large-training",
            &on("amd-mi300x"),
            &models,
            Some(&cq),
            || none.clone()
        )
        .unwrap(),
        "large-training: on amd-mi300x (AMD_Instinct_MI300X_OAM); nvidia-h100 full: 16/16 in use"
    );
    assert_eq!(
        placement_note(
            "large-training",
            &on("nvidia-h100"),
            &models,
            Some(&cq),
            || none.clone()
        )
        .unwrap(),
        "large-training: on nvidia-h100 (NVIDIA-H100-80GB-HBM3), its first preference"
    );
    assert_eq!(
        placement_note("large-training", &on("amd-mi300x"), &models, None, || none
            .clone())
        .unwrap(),
        "large-training: on amd-mi300x (AMD_Instinct_MI300X_OAM)"
    );
    assert_eq!(
        placement_note("large-training", &[], &models, Some(&cq), || none.clone()),
        None
    );
    // On the first preference nothing was passed over: the open Workloads are
    // not scanned.
    assert!(
        placement_note(
            "large-training",
            &on("nvidia-h100"),
            &models,
            Some(&cq),
            || { panic!("scanned the open Workloads for a first-preference placement") }
        )
        .is_some()
    );
    // Kueue's count in the ClusterQueue's status lags its admissions: what
    // kaccel saw admitted in the queue is used when it is more.
    let mut lagging = cq.clone();
    lagging["status"]["flavorsReservation"] = json!([]);
    let held = BTreeMap::from([("nvidia-h100".to_string(), 16u64)]);
    assert_eq!(
        placement_note(
            "large-training",
            &on("amd-mi300x"),
            &models,
            Some(&lagging),
            || held.clone()
        )
        .unwrap(),
        "large-training: on amd-mi300x (AMD_Instinct_MI300X_OAM); nvidia-h100 full: 16/16 in use"
    );
    assert_eq!(
        placement_note(
            "large-training",
            &on("amd-mi300x"),
            &models,
            Some(&lagging),
            || none.clone()
        )
        .unwrap(),
        "large-training: on amd-mi300x (AMD_Instinct_MI300X_OAM); nvidia-h100 had no room for it (0/16 in use in this queue)"
    );
}

fn record(admission: u32, rate_card: &str) -> ReservationRecord {
    ReservationRecord {
        admission,
        budget: "vision".into(),
        team: "vision".into(),
        cluster_queue: "vision-large-training".into(),
        admitted_at: 1_000,
        horizon_seconds: 100,
        lines: vec![recorded("h100-a", rate_card)],
    }
}

#[test]
fn the_record_goes_first_unless_the_webhooks_finalizer_is_on_with_no_record() {
    let now = record(1, "rc-1");
    // No finalizer yet (no Workload webhook): finalizer and record first, as before.
    assert!(needs_record_first(false, None, &now));
    assert!(needs_record_first(false, Some(&now), &now));
    // The webhook's finalizer, no record: the entry first, the record after Admitted.
    assert!(!needs_record_first(true, None, &now));
    // The same record already there (a Workload that waited): nothing to write.
    assert!(!needs_record_first(true, Some(&now), &now));
    // Another price, or an earlier admission's record: rewritten before the
    // entry, or the next reconcile would read it back and charge the wrong lines.
    assert!(needs_record_first(true, Some(&record(1, "rc-2")), &now));
    assert!(needs_record_first(true, Some(&record(0, "rc-1")), &now));
}

#[test]
fn the_check_is_asked_while_pending_or_before_kueue_lists_it_on_a_charged_workload() {
    let calls = || true;
    assert_eq!(
        open_question(Some(("Pending", "waiting")), false, true, calls),
        Some("waiting")
    );
    // Answered already, whatever else holds.
    for state in ["Ready", "Retry", "Rejected"] {
        assert_eq!(open_question(Some((state, "m")), true, true, calls), None);
    }
    // Not listed yet: asked only of a charged Workload holding quota in a
    // queue that calls for the check.
    assert_eq!(open_question(None, true, true, calls), Some(""));
    assert_eq!(open_question(None, false, true, calls), None);
    assert_eq!(open_question(None, true, false, calls), None);
    assert_eq!(open_question(None, true, true, || false), None);
    // The queue is read only when the rest holds.
    let unread = || -> bool { panic!("the queue was read") };
    assert_eq!(open_question(None, false, true, unread), None);
    assert_eq!(
        open_question(Some(("Ready", "m")), true, true, unread),
        None
    );
}
