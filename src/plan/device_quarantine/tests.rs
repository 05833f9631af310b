//! Device quarantine on DRA-only fleets as NVIDIA's DRA driver publishes them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use proptest::prelude::*;
use serde_json::json;

use super::*;
use crate::api::{HealthCounts, SharingMode};
use crate::health::HealthSnapshot;
use crate::plan::nodes::{NodeAction, node_actions};
use crate::plan::tests::{budget, class, run_with_slices};

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kaccel.io/accelerator.model": "NVIDIA-H100-80GB-HBM3",
        }},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi"},
            "allocatable": {"cpu": "64", "memory": "512Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .unwrap()
}

/// Eight GPUs as NVIDIA's DRA driver publishes them (`deviceinfo.go`): uuid,
/// productName, pcieBusID; the pool is the node.
fn slice(node: &str) -> ResourceSlice {
    let devices: Vec<serde_json::Value> = (0..8)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": format!("GPU-{node}-{i:04}")},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "pcieBusID": {"string": format!("0000:{:02x}:00.0", 0x18 + i)},
                "driverVersion": {"version": "550.54.15"},
            }, "capacity": {"memory": {"value": "81559Mi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices},
    }))
    .unwrap()
}

struct Fleet {
    inventory: Inventory,
    flavors: BTreeMap<String, FlavorReport>,
}

fn fleet(nodes: &[&str]) -> Fleet {
    let node_objects: Vec<Node> = nodes.iter().map(|n| node(n)).collect();
    let slices: Vec<ResourceSlice> = nodes.iter().map(|n| slice(n)).collect();
    let mut h100 = class("h100", SharingMode::Whole, Default::default());
    h100.spec.selector.vendors = vec![crate::api::Vendor::Nvidia];
    let budgets = [budget("team", &["team"], &[("h100", 8)])];
    let (plan, inventory) = run_with_slices(
        &[h100],
        &budgets,
        &node_objects,
        &slices,
        &HealthSnapshot::default(),
    );
    Fleet {
        inventory,
        flavors: plan.flavors,
    }
}

fn reading(node: &str, gpu: u32, status: DeviceStatus) -> DeviceHealth {
    DeviceHealth {
        node: node.into(),
        uuid: Some(format!("GPU-{node}-{gpu:04}")),
        pci_address: Some(format!("00000000:{:02X}:00.0", 0x18 + gpu)),
        status,
        fresh: true,
        reasons: vec!["XID 79".into()],
    }
}

fn decide_with(
    f: &Fleet,
    health: &[DeviceHealth],
    live: &[DeviceTaintRule],
    policy: &NodeActionPolicy,
) -> Quarantine {
    let live: BTreeMap<String, DeviceTaintRule> = live
        .iter()
        .map(|r| (r.metadata.name.clone().unwrap(), r.clone()))
        .collect();
    decide(&f.inventory, health, &f.flavors, &live, policy, "kaccel")
}

fn selected(rule: &DeviceTaintRule) -> (String, String, String) {
    let s = rule.spec.device_selector.as_ref().unwrap();
    (
        s.driver.clone().unwrap(),
        s.pool.clone().unwrap(),
        s.device.clone().unwrap(),
    )
}

#[test]
fn one_failed_gpu_gets_one_rule_for_exactly_it_and_its_node_is_not_cordoned() {
    let f = fleet(&["a", "b"]);
    let health = [
        reading("a", 3, DeviceStatus::Failed),
        reading("a", 4, DeviceStatus::Healthy),
        reading("b", 3, DeviceStatus::Warning),
    ];
    let q = decide_with(&f, &health, &[], &NodeActionPolicy::default());
    assert_eq!(q.rules.len(), 1, "{:?}", q.rules);
    let rule = &q.rules[0];
    assert_eq!(
        selected(rule),
        ("gpu.nvidia.com".into(), "a".into(), "gpu-3".into())
    );
    assert_eq!(rule.spec.taint.key, UNHEALTHY_TAINT);
    assert_eq!(rule.spec.taint.effect, "NoSchedule");
    assert_eq!(rule.spec.taint.value.as_deref(), Some("Failed"));
    let meta = &rule.metadata;
    assert_eq!(
        meta.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        crate::k8s::instance::DEFAULT_INSTANCE
    );
    assert_eq!(meta.labels.as_ref().unwrap()[NODE_LABEL], "a");
    assert_eq!(
        meta.annotations.as_ref().unwrap()[REASON_ANNOTATION],
        "Failed: XID 79"
    );
    assert_eq!(
        q.covered,
        BTreeMap::from([(
            "a".to_string(),
            BTreeMap::from([("gpu.nvidia.com".to_string(), 1)])
        )])
    );
    // The node's failed GPU is counted (quota drops by one) but needs no cordon.
    let mut snapshot = HealthSnapshot::default();
    snapshot.set(
        "a",
        "gpu.nvidia.com",
        HealthCounts {
            healthy: 7,
            failed: 1,
            ..Default::default()
        },
    );
    let policy = NodeActionPolicy::default();
    let with_rule = node_actions(
        &f.inventory,
        &snapshot,
        &f.flavors,
        &policy,
        &q.covered,
        "kaccel",
    );
    assert!(with_rule.actions.is_empty(), "{:?}", with_rule.actions);
    let without = node_actions(
        &f.inventory,
        &snapshot,
        &f.flavors,
        &policy,
        &BTreeMap::new(),
        "kaccel",
    );
    assert!(
        matches!(&without.actions[..], [NodeAction::Cordon { node, .. }] if node == "a"),
        "{:?}",
        without.actions
    );
}

#[test]
fn unknown_never_takes_a_device_out_and_silence_never_brings_one_back() {
    let f = fleet(&["a"]);
    let policy = NodeActionPolicy::default();
    let mut silent = reading("a", 3, DeviceStatus::Unknown);
    silent.fresh = false;
    assert!(
        decide_with(&f, std::slice::from_ref(&silent), &[], &policy)
            .rules
            .is_empty()
    );
    assert!(decide_with(&f, &[], &[], &policy).rules.is_empty());

    let taken = decide_with(&f, &[reading("a", 3, DeviceStatus::Failed)], &[], &policy).rules;
    // As the API server stores it: with timeAdded, a resourceVersion and the
    // applied hash.
    let mut live = taken[0].clone();
    live.spec.taint.time_added = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        Default::default(),
    ));
    live.metadata
        .annotations
        .get_or_insert_default()
        .insert("kaccel.io/applied-hash".into(), "0123".into());
    live.metadata.resource_version = Some("42".into());
    // The exporter went silent, or stopped reporting the device: the rule stays
    // exactly as written (no write).
    for health in [vec![silent.clone()], vec![]] {
        let kept = decide_with(&f, &health, std::slice::from_ref(&live), &policy);
        assert_eq!(kept.rules, taken, "{health:?}");
        assert_eq!(
            kept.covered.values().flat_map(|m| m.values()).sum::<u32>(),
            1
        );
    }
    // A fresh healthy reading (after the tracker's hold-down) removes it.
    let recovered = decide_with(
        &f,
        &[reading("a", 3, DeviceStatus::Healthy)],
        &[live],
        &policy,
    );
    assert!(recovered.rules.is_empty());
}

#[test]
fn degraded_devices_go_out_only_when_the_policy_says_so_with_its_effect() {
    let f = fleet(&["a"]);
    let health = [reading("a", 1, DeviceStatus::Degraded)];
    let mut policy = NodeActionPolicy::default();
    assert!(decide_with(&f, &health, &[], &policy).rules.is_empty());
    policy.device_taint_on_degraded = true;
    policy.device_taint_effect = DeviceTaintEffect::NoExecute;
    let q = decide_with(&f, &health, &[], &policy);
    assert_eq!(q.rules.len(), 1);
    assert_eq!(q.rules[0].spec.taint.effect, "NoExecute");
    policy.device_taint_rules = false;
    assert_eq!(
        decide_with(&f, &health, &[], &policy),
        Quarantine::default()
    );
}

#[test]
fn the_share_limit_counts_held_rules_first_and_holds_the_rest_back() {
    // 16 GPUs, 20%: three at once.
    let f = fleet(&["a", "b"]);
    let policy = NodeActionPolicy::default();
    let first = decide_with(&f, &[reading("b", 7, DeviceStatus::Failed)], &[], &policy).rules;
    let health: Vec<DeviceHealth> = (0..4)
        .map(|i| reading("a", i, DeviceStatus::Failed))
        .chain([reading("b", 7, DeviceStatus::Failed)])
        .collect();
    let q = decide_with(&f, &health, &first, &policy);
    let devices: Vec<(String, String, String)> = q.rules.iter().map(selected).collect();
    assert_eq!(q.rules.len(), 3, "{devices:?}");
    assert!(devices.contains(&("gpu.nvidia.com".into(), "b".into(), "gpu-7".into())));
    assert_eq!(q.held_back.len(), 2, "{:?}", q.held_back);
    assert!(q.held_back.iter().all(|h| h.allowed == 3));
    assert!(
        q.held_back[0].node.starts_with("a (device gpu-"),
        "{:?}",
        q.held_back
    );
}

#[test]
fn a_pci_address_matches_when_the_exporter_gives_no_uuid() {
    let f = fleet(&["a"]);
    let mut r = reading("a", 5, DeviceStatus::Failed);
    r.uuid = None;
    let q = decide_with(&f, &[r], &[], &NodeActionPolicy::default());
    let devices: Vec<(String, String, String)> = q.rules.iter().map(selected).collect();
    assert_eq!(
        devices,
        [("gpu.nvidia.com".into(), "a".into(), "gpu-5".into())]
    );
}

#[test]
fn a_device_the_device_plugin_also_offers_is_left_to_the_cordon() {
    // The example fleet's H100 nodes run the device plugin: no DRA-only group.
    let loaded = crate::testkit::examples();
    let inventory = Inventory::from_nodes(&loaded.nodes);
    let planned = crate::plan::plan(&crate::plan::PlanInput {
        classes: &loaded.classes,
        budgets: &[],
        inventory: &inventory,
        health: &HealthSnapshot::default(),
        options: &Default::default(),
    });
    let node = inventory
        .nodes
        .values()
        .find(|n| n.name.starts_with("gpu-h100"))
        .unwrap();
    let q = decide(
        &inventory,
        &[DeviceHealth {
            node: node.name.clone(),
            uuid: Some("GPU-1".into()),
            pci_address: None,
            status: DeviceStatus::Failed,
            fresh: true,
            reasons: vec![],
        }],
        &planned.flavors,
        &BTreeMap::new(),
        &NodeActionPolicy::default(),
        "kaccel",
    );
    assert_eq!(q, Quarantine::default());
}

proptest! {
    #[test]
    fn rule_names_are_valid_and_distinct_per_device(
        driver in "[a-z][a-z0-9.]{0,40}[a-z]",
        pool in "[A-Za-z0-9][A-Za-z0-9./_-]{0,300}",
        device in "[a-z0-9][a-z0-9_-]{0,70}",
    ) {
        let record = crate::testkit::devices::dra_device(&device, &driver, &pool);
        let name = rule_name(&record);
        prop_assert!(crate::k8s::names::valid_dns_subdomain(&name), "{}", name);
        prop_assert!(name.starts_with("kaccel-"), "{}", name);
        let mut other = record.clone();
        other.name.push('x');
        prop_assert_ne!(rule_name(&other), name);
    }
}
