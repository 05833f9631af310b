//! Tests of admission decisions: usage per flavor, bad quantities, reserve/wait/reject, messages.

use super::*;
use crate::api::CreditRate;
use crate::ledger::EntryKind;
use proptest::prelude::*;
use serde_json::json;

fn typed(v: &Value) -> Workload {
    serde_json::from_value(v.clone()).expect("a Workload")
}

fn workload() -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": "job-train-7f2c", "namespace": "vision", "uid": "0b6e-uid"},
        "spec": {
            "queueName": "vision",
            "maximumExecutionTimeSeconds": 7200,
            "podSets": [
                {"name": "launcher", "count": 1},
                {"name": "workers", "count": 4},
                {"name": "notebook", "count": 2}
            ]
        },
        "status": {
            "conditions": [{"type": "QuotaReserved", "status": "True",
                            "lastTransitionTime": "2025-01-01T00:00:00Z"}],
            "admission": {
                "clusterQueue": "kaccel-vision",
                "podSetAssignments": [
                    {"name": "launcher", "count": 1,
                     "flavors": {"cpu": "cpu-pool", "memory": "cpu-pool"},
                     "resourceUsage": {"cpu": "2", "memory": "4Gi"}},
                    {"name": "workers", "count": 4,
                     "flavors": {"cpu": "h100-pool", "memory": "h100-pool",
                                 "nvidia.com/mig-1g.10gb": "nvidia-h100-80gb-hbm3-mig-1g.10gb"},
                     "resourceUsage": {"cpu": "32", "memory": "256Gi",
                                       "nvidia.com/mig-1g.10gb": "8",
                                       "ephemeral-storage": "10Gi", "pods": "4"}},
                    {"name": "notebook", "count": 2,
                     "flavors": {"nvidia.com/gpu": "nvidia-a10g-SHARED"},
                     "resourceUsage": {"nvidia.com/gpu": "2", "hugepages-2Mi": "0"}}
                ]
            },
            "schedulingStats": {"evictions": [
                {"reason": "Preempted", "underlyingCause": "", "count": 2},
                {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 1}
            ]}
        }
    })
}

#[test]
fn usage_reads_totals_per_flavor_and_skips_core_resources() {
    let u = usage_from_workload(&typed(&workload())).unwrap();
    assert_eq!(
        u,
        vec![
            FlavorUsage {
                flavor: "nvidia-a10g-SHARED".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 2,
            },
            FlavorUsage {
                flavor: "nvidia-h100-80gb-hbm3-mig-1g.10gb".into(),
                resource: "nvidia.com/mig-1g.10gb".into(),
                device_units: 8,
            },
        ]
    );
    assert_eq!(admission_number(&typed(&workload())).unwrap(), 4);
    assert_eq!(horizon_seconds(&typed(&workload()), 3600), 7200);
    assert_eq!(admission_number(&typed(&json!({"status": {}}))).unwrap(), 1);
    assert_eq!(horizon_seconds(&typed(&json!({})), 3600), 3600);
}

#[test]
fn bad_quantities_name_the_pod_set_and_resource() {
    for bad in ["0.5", "500m", "lots", "-1"] {
        let mut w = workload();
        w["status"]["admission"]["podSetAssignments"][1]["resourceUsage"]["nvidia.com/mig-1g.10gb"] =
            json!(bad);
        let e = usage_from_workload(&typed(&w)).unwrap_err().to_string();
        assert!(e.contains("workers") && e.contains("mig-1g.10gb"), "{e}");
    }
    let mut w = workload();
    w["status"]["admission"]["podSetAssignments"][2]["flavors"] = json!({});
    assert!(matches!(
        usage_from_workload(&typed(&w)),
        Err(AdmissionError::NoFlavor { .. })
    ));
    assert_eq!(
        usage_from_workload(&typed(&json!({"status": {}}))),
        Err(AdmissionError::NotAdmitted)
    );
    let mut w = workload();
    w["status"]["schedulingStats"]["evictions"][0]["count"] = json!(-1);
    assert!(admission_number(&typed(&w)).is_err());
}

fn rates(u: &FlavorUsage) -> Option<RateInfo> {
    let (model, r) = match u.resource.as_str() {
        "nvidia.com/gpu" => ("nvidia-a10g", "1.5"),
        "nvidia.com/mig-1g.10gb" => ("nvidia-h100-80gb-hbm3-mig-1g.10gb", "0.25"),
        _ => return None,
    };
    let spec = CreditRate {
        per_device_hour: r.into(),
        model_overrides: vec![],
    };
    Some(RateInfo {
        class: "gpu".into(),
        model: model.into(),
        rate: ClassRates::parse(&spec, Some(1)).ok()?.for_model(model),
        rate_card: ClassRates::parse(&spec, Some(1))
            .ok()?
            .rate_card()
            .to_string(),
    })
}

fn budget(remaining_credits: u64) -> BudgetView {
    let mut balances = Balances::default();
    balances.apply(EntryKind::Grant, Credits::whole(remaining_credits).0 as i64);
    BudgetView {
        budget: "vision".into(),
        team: "vision".into(),
        balances,
    }
}

fn view() -> WorkloadView {
    WorkloadView {
        namespace: "vision".into(),
        name: "job-train-7f2c".into(),
        uid: "0b6e-uid".into(),
        admission: 4,
        admitted_at: 1_735_689_600,
        now: 1_735_689_601,
        cluster: String::new(),
    }
}

#[test]
fn decide_reserves_waits_and_rejects() {
    let u = usage_from_workload(&typed(&workload())).unwrap();
    let res = reservation(&u, &rates, horizon_seconds(&typed(&workload()), 3600)).unwrap();
    // 2 x 1.5 x 2h + 8 x 0.25 x 2h = 6 + 4 = 10 credits.
    assert_eq!(res.total, Credits::whole(10));
    match decide(&budget(10), &view(), &res) {
        Decision::Reserve { entries } => {
            // One Reserve per line, each with its own flavor, units and rate.
            let lines: Vec<_> = entries
                .iter()
                .map(|e| (e.flavor.as_str(), e.device_units, e.credits, e.rate))
                .collect();
            assert_eq!(
                lines,
                vec![
                    ("nvidia-a10g-SHARED", 2, 6_000_000, 1_500_000),
                    ("nvidia-h100-80gb-hbm3-mig-1g.10gb", 8, 4_000_000, 250_000),
                ]
            );
            for e in &entries {
                assert_eq!(
                    e.key,
                    format!(
                        "reserve/vision/0b6e-uid/4/1735689600/{}/{}",
                        e.flavor, e.resource
                    )
                );
                assert_eq!(e.end - e.start, 7200);
                assert!(!e.flavor.contains('+') && !e.class.contains('+'));
                e.validate().unwrap();
            }
        }
        d => panic!("{d:?}"),
    }
    match decide(&budget(3), &view(), &res) {
        Decision::Wait { message } => assert_eq!(
            message,
            "team vision has 3 credits left; this workload needs up to 10 \
             (2 x nvidia-a10g for 2h at 1.5/device-hour + \
             8 x nvidia-h100-80gb-hbm3-mig-1g.10gb for 2h at 0.25/device-hour)"
        ),
        d => panic!("{d:?}"),
    }
    let mut u2 = u.clone();
    u2.push(FlavorUsage {
        flavor: "mi300x".into(),
        resource: "amd.com/gpu".into(),
        device_units: 1,
    });
    match decide(
        &budget(100),
        &view(),
        &reservation(&u2, &rates, 3600).unwrap(),
    ) {
        Decision::Reject { message } => {
            assert!(message.contains("amd.com/gpu") && message.contains("mi300x"))
        }
        d => panic!("{d:?}"),
    }
    assert_eq!(
        decide(
            &budget(0),
            &view(),
            &reservation(&[], &rates, 3600).unwrap()
        ),
        Decision::Reserve { entries: vec![] }
    );
}

#[test]
fn message_example_from_the_issue() {
    let usage = [FlavorUsage {
        flavor: "h100".into(),
        resource: "nvidia.com/gpu".into(),
        device_units: 4,
    }];
    let r = |_: &FlavorUsage| {
        Some(RateInfo {
            class: "gpu".into(),
            model: "nvidia-h100-80gb-hbm3".into(),
            rate: Rate(100_000_000),
            rate_card: "rc-x".into(),
        })
    };
    let res = reservation(&usage, &r, 3600).unwrap();
    match decide(&budget(120), &view(), &res) {
        Decision::Wait { message } => assert_eq!(
            message,
            "team vision has 120 credits left; this workload needs up to 400 \
             (4 x nvidia-h100-80gb-hbm3 for 1h at 100/device-hour)"
        ),
        d => panic!("{d:?}"),
    }
}

proptest! {
    #[test]
    fn decide_never_reserves_more_than_remaining(rate in 0u64..1_000_000_000, units in 0u64..1000,
            horizon in 0u64..1_000_000, granted in 0i64..1_000_000_000_000, spent in 0i64..1_000_000_000_000) {
        let usage = [FlavorUsage { flavor: "f".into(), resource: "nvidia.com/gpu".into(), device_units: units }];
        let r = move |_: &FlavorUsage| Some(RateInfo { class: "c".into(), model: "m".into(), rate: Rate(rate), rate_card: "rc".into() });
        let res = reservation(&usage, &r, horizon).unwrap();
        let mut balances = Balances::default();
        balances.apply(EntryKind::Grant, granted);
        balances.apply(EntryKind::Correction, spent);
        let b = BudgetView { budget: "b".into(), team: "t".into(), balances };
        match decide(&b, &view(), &res) {
            Decision::Reserve { entries } => {
                let sum: i128 = entries.iter().map(|e| i128::from(e.credits)).sum();
                prop_assert!(sum <= balances.remaining());
            }
            Decision::Wait { message } => {
                prop_assert!(i128::from(res.total.0) > balances.remaining());
                prop_assert!(message.contains("credits left"));
            }
            Decision::Reject { .. } => prop_assert!(false, "priced usage rejected"),
        }
    }
}

/// A one-podSet admission of `count` pods on flavor `h100` with this usage.
fn admitted_on_h100(count: u64, usage: Value) -> Workload {
    crate::testkit::admitted_on("w", "h100", count, usage)
}

fn units_by_resource(w: &Workload) -> Vec<(String, u64)> {
    usage_from_workload(w)
        .unwrap()
        .into_iter()
        .map(|u| (u.resource, u.device_units))
        .collect()
}

#[test]
fn a_device_asked_for_by_its_vendor_name_is_counted_once_though_kueue_also_counts_it_as_the_class_resource()
 {
    // Kueue's Retain transformation: nvidia.com/gpu 4 is also kaccel.io/accelerator 4.
    let w = admitted_on_h100(
        1,
        json!({"nvidia.com/gpu": "4", "kaccel.io/accelerator": "4"}),
    );
    assert_eq!(units_by_resource(&w), [("nvidia.com/gpu".into(), 4)]);
    // Asked for by the class name only.
    let w = admitted_on_h100(2, json!({"kaccel.io/accelerator": "16"}));
    assert_eq!(
        units_by_resource(&w),
        [("kaccel.io/accelerator".into(), 16)]
    );
    // Both names in one pod, transformed: 4 vendor + 4 neutral = 8 counted as the class.
    let w = admitted_on_h100(
        1,
        json!({"nvidia.com/gpu": "4", "kaccel.io/accelerator": "8"}),
    );
    assert_eq!(
        units_by_resource(&w),
        [
            ("kaccel.io/accelerator".into(), 4),
            ("nvidia.com/gpu".into(), 4)
        ]
    );
    let sets = pod_set_usage(&w).unwrap();
    assert_eq!((sets[0].pods, sets[0].devices()), (1, 8));
    // Without the transformation (Kueue misconfigured, which kaccel reports) the
    // larger of the two is charged: never the sum of one device's two names.
    let w = admitted_on_h100(
        1,
        json!({"nvidia.com/gpu": "4", "kaccel.io/accelerator": "2"}),
    );
    assert_eq!(units_by_resource(&w), [("nvidia.com/gpu".into(), 4)]);
}

#[test]
fn a_pod_count_the_class_does_not_allow_names_the_pod_set_and_count() {
    let sets = |count: u64, usage: Value| pod_set_usage(&admitted_on_h100(count, usage)).unwrap();
    let eight_each = sets(2, json!({"kaccel.io/accelerator": "16"}));
    assert_eq!(disallowed_devices_per_pod(&eight_each, &[8]), None);
    assert_eq!(disallowed_devices_per_pod(&eight_each, &[]), None);
    assert_eq!(
        disallowed_devices_per_pod(&eight_each, &[1, 4]),
        Some(("main".into(), "8".into()))
    );
    // Three per pod, asked for by the vendor name (Kueue also counts it as the class).
    let three = sets(
        1,
        json!({"nvidia.com/gpu": "3", "kaccel.io/accelerator": "3"}),
    );
    assert_eq!(
        disallowed_devices_per_pod(&three, &[8]),
        Some(("main".into(), "3".into()))
    );
    let uneven = sets(2, json!({"kaccel.io/accelerator": "9"}));
    let (_, why) = disallowed_devices_per_pod(&uneven, &[8]).unwrap();
    assert!(why.contains("9 over 2 pod(s)"), "{why}");
    // A podSet without devices (a launcher) is not held to the count.
    let launcher = sets(1, json!({"cpu": "2"}));
    assert_eq!(disallowed_devices_per_pod(&launcher, &[8]), None);
    assert_eq!(describe_counts(&[8]), "8");
    assert_eq!(describe_counts(&[1, 2, 4]), "1, 2 or 4");
}

proptest! {
    /// However a flavor's devices are asked for (vendor name, class name, both),
    /// with Kueue's Retain transformation the ledger counts each device once: the
    /// charged units are exactly the devices the pods use.
    #[test]
    fn the_ledger_counts_each_device_once_under_the_retain_transformation(
        vendor in 0u32..64, neutral in 0u32..64
    ) {
        let mut usage = serde_json::Map::new();
        if vendor > 0 {
            usage.insert("nvidia.com/gpu".into(), json!(vendor.to_string()));
        }
        if vendor + neutral > 0 {
            usage.insert("kaccel.io/accelerator".into(), json!((vendor + neutral).to_string()));
        }
        let w = admitted_on_h100(1, Value::Object(usage));
        let charged: u64 = usage_from_workload(&w).unwrap().iter().map(|u| u.device_units).sum();
        prop_assert_eq!(charged, u64::from(vendor + neutral));
    }
}

#[test]
fn a_pod_asking_by_the_class_name_and_a_vendor_name_together_is_found_and_others_are_not() {
    let with = |containers: Value| {
        typed(&json!({
            "spec": {"queueName": "q", "podSets": [
                {"name": "launcher", "count": 1, "template": {"spec": {"containers": [
                    {"name": "l", "resources": {"requests": {"cpu": "1"}}}]}}},
                {"name": "workers", "count": 2, "template": {"spec": containers}}
            ]}
        }))
    };
    let both_in_one_container = with(json!({"containers": [{"name": "w", "resources": {
        "requests": {"kaccel.io/accelerator": "4", "nvidia.com/gpu": "4"},
        "limits": {"kaccel.io/accelerator": "4", "nvidia.com/gpu": "4"}}}]}));
    assert_eq!(
        asks_by_two_names(&both_in_one_container),
        Some(("workers", "nvidia.com/gpu"))
    );
    // Two containers of one pod add up: the same collision.
    let split = with(json!({"containers": [
        {"name": "a", "resources": {"limits": {"kaccel.io/accelerator": "4"}}},
        {"name": "b", "resources": {"limits": {"amd.com/gpu": "4"}}}]}));
    assert_eq!(asks_by_two_names(&split), Some(("workers", "amd.com/gpu")));
    let class_only = with(json!({"containers": [{"name": "w", "resources": {
        "limits": {"kaccel.io/accelerator": "8", "cpu": "8", "memory": "64Gi"}}}]}));
    assert_eq!(asks_by_two_names(&class_only), None);
    let vendor_only = with(json!({"containers": [{"name": "w", "resources": {
        "limits": {"nvidia.com/gpu": "8"}}}]}));
    assert_eq!(asks_by_two_names(&vendor_only), None);
    // The cache keeps the names through slimming.
    let mut slim = both_in_one_container.clone();
    slim.slim("kaccel.io/", is_accelerator_resource);
    assert_eq!(
        asks_by_two_names(&slim),
        Some(("workers", "nvidia.com/gpu"))
    );
}

/// A claim of one flavor's DeviceClass is counted as the class resource, so
/// Kueue may place it on another flavor of the class: found, with both flavors;
/// a claim on its own flavor, a claim of a DeviceClass that is not kaccel's, and
/// a podSet without claims are not.
#[test]
fn a_claim_placed_on_another_flavor_than_its_device_classs_is_found() {
    let admitted_on = |flavor: &str| {
        typed(&json!({
            "spec": {"queueName": "q", "podSets": [
                {"name": "launcher", "count": 1, "template": {"spec": {"containers": [
                    {"name": "l", "resources": {"requests": {"cpu": "1"}}}]}}},
                {"name": "workers", "count": 2, "template": {"spec": {
                    "containers": [{"name": "w", "resources": {"claims": [{"name": "gpus"}]}}],
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "mi300x-x4"}]}}}
            ]},
            "status": {"admission": {"clusterQueue": "cq", "podSetAssignments": [
                {"name": "launcher", "count": 1, "flavors": {"cpu": "cpu-pool"}},
                {"name": "workers", "count": 2, "flavors": {"kaccel.io/accelerator": flavor},
                 "resourceUsage": {"kaccel.io/accelerator": "8"}}]}}
        }))
    };
    let templates = BTreeMap::from([(
        "mi300x-x4".to_string(),
        vec!["amd-mi300x.kaccel.io".to_string()],
    )]);
    let w = admitted_on("nvidia-h100");
    assert_eq!(w.spec.pod_sets[1].claim_templates, ["mi300x-x4"]);
    assert_eq!(
        misplaced_claim(&w, &templates),
        Some(MisplacedClaim {
            pod_set: "workers".into(),
            template: "mi300x-x4".into(),
            device_class: "amd-mi300x.kaccel.io".into(),
            claim_flavor: "amd-mi300x".into(),
            assigned_flavor: "nvidia-h100".into(),
        })
    );
    // The cache keeps the templates through slimming.
    let mut slim = w.clone();
    slim.slim("kaccel.io/", is_accelerator_resource);
    assert!(misplaced_claim(&slim, &templates).is_some());
    assert_eq!(
        misplaced_claim(&admitted_on("amd-mi300x"), &templates),
        None
    );
    let foreign = BTreeMap::from([("mi300x-x4".to_string(), vec!["gpu.amd.com".to_string()])]);
    assert_eq!(misplaced_claim(&w, &foreign), None);
    assert_eq!(misplaced_claim(&w, &BTreeMap::new()), None);
    assert!(w.spec.pod_sets[0].claim_templates.is_empty());
}
