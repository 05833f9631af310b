//! Planning over MultiKueue workers: their Nodes pooled, an unreachable one's
//! devices Unknown but still capacity, the class told which worker it is, and
//! every ClusterQueue dispatching through MultiKueue after the credit check.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde_json::json;

use super::*;
use crate::api::{HardwareSelector, HealthCounts, SharingMode};
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::inventory::index::{NodeIndex, worker_union};
use crate::plan::tests::{budget, class};
use crate::plan::{Plan, PlanInput, plan};

/// A GPU node as GPU feature discovery and the device plugin label it.
fn gpu_node(name: &str, count: u32) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.count": count.to_string(),
        }},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": count.to_string()},
            "allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": count.to_string()},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("a Node")
}

/// A worker's Node index after a full list of `nodes`.
fn worker(name: &str, nodes: &[Node]) -> (String, Arc<Inventory>) {
    let mut index = NodeIndex::for_worker(name);
    index.begin_relist();
    for n in nodes {
        index.relisted(n);
    }
    index.end_relist();
    (name.to_string(), index.snapshot())
}

fn multikueue() -> PlanOptions {
    PlanOptions {
        admission_check: Some("kaccel-credits".into()),
        multikueue_check: Some("kaccel-multikueue".into()),
        ..Default::default()
    }
}

/// Two workers whose nodes share a name (each cluster names its own).
fn two_workers() -> Vec<(String, Arc<Inventory>)> {
    vec![
        worker("worker-a", &[gpu_node("gpu-1", 8), gpu_node("gpu-2", 8)]),
        worker("worker-b", &[gpu_node("gpu-1", 8)]),
    ]
}

fn plan_over(unreachable: &BTreeMap<String, String>, options: &PlanOptions) -> Plan {
    let workers = two_workers();
    let inventory = worker_union(
        workers.iter().map(|(n, i)| (n.as_str(), i.clone())),
        unreachable,
    );
    plan(&PlanInput {
        classes: &[class(
            "h100",
            SharingMode::Whole,
            HardwareSelector::default(),
        )],
        budgets: &[budget("vision", &["vision"], &[("h100", 16)])],
        inventory: &inventory,
        health: &HealthSnapshot::default(),
        options: &PlanOptions {
            unreachable_workers: unreachable.clone(),
            ..options.clone()
        },
    })
}

fn worker_condition(plan: &Plan) -> Option<&crate::api::DesiredCondition> {
    plan.classes["h100"]
        .conditions
        .iter()
        .find(|c| c.type_ == WORKER_CONDITION)
}

#[test]
fn the_workers_nodes_are_pooled_under_their_cluster_and_name() {
    let workers = two_workers();
    let union = worker_union(
        workers.iter().map(|(n, i)| (n.as_str(), i.clone())),
        &BTreeMap::new(),
    );
    let keys: Vec<&str> = union.nodes.keys().map(String::as_str).collect();
    assert_eq!(keys, ["worker-a/gpu-1", "worker-a/gpu-2", "worker-b/gpu-1"]);
    assert_eq!(
        union.nodes["worker-b/gpu-1"].worker_cluster(),
        Some("worker-b")
    );
    let plan = plan_over(&BTreeMap::new(), &multikueue());
    let flavor = plan.flavors.values().next().expect("one flavor");
    assert_eq!(
        flavor.healthy_capacity, 24,
        "three 8-GPU nodes in two clusters"
    );
    let condition = worker_condition(&plan).expect("a class with worker devices says where");
    assert!(!condition.status);
    assert_eq!(condition.reason, "WorkersReachable");
    assert!(
        condition.message.contains("worker-a, worker-b"),
        "{}",
        condition.message
    );
}

#[test]
fn an_unreachable_worker_keeps_its_quota_its_devices_unknown_and_is_named() {
    let reachable = plan_over(&BTreeMap::new(), &multikueue());
    let unreachable = BTreeMap::from([("worker-a".to_string(), "connection refused".to_string())]);
    let lost = plan_over(&unreachable, &multikueue());
    // Invariant 6: Unknown counts as capacity, so the quota Kueue holds is the same.
    let specs = |p: &Plan| {
        serde_json::to_value(p.cluster_queues.iter().map(|q| &q.spec).collect::<Vec<_>>()).unwrap()
    };
    assert_eq!(specs(&lost), specs(&reachable));
    assert!(
        specs(&lost).to_string().contains("\"nominalQuota\":\"16\""),
        "{}",
        specs(&lost)
    );
    let flavor = lost.flavors.values().next().expect("one flavor");
    assert_eq!(
        flavor.devices,
        HealthCounts {
            healthy: 8,
            unknown: 16,
            ..Default::default()
        }
    );
    let condition = worker_condition(&lost).expect("condition");
    assert!(condition.status);
    assert_eq!(condition.reason, "ClusterUnreachable");
    assert!(
        condition
            .message
            .contains("worker-a (2 nodes; connection refused)"),
        "{}",
        condition.message
    );
    assert!(
        !condition.message.contains("worker-b ("),
        "{}",
        condition.message
    );
}

#[test]
fn every_cluster_queue_dispatches_through_multikueue_after_the_credit_check() {
    let plan = plan_over(&BTreeMap::new(), &multikueue());
    assert!(!plan.cluster_queues.is_empty());
    for cq in &plan.cluster_queues {
        let checks: Vec<&str> = cq
            .spec
            .admission_checks_strategy
            .as_ref()
            .expect("checks")
            .admission_checks
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(checks, ["kaccel-credits", "kaccel-multikueue"]);
    }
    // Without workers: no MultiKueue check and no worker condition.
    let single = plan_over(
        &BTreeMap::new(),
        &PlanOptions {
            multikueue_check: None,
            ..multikueue()
        },
    );
    let checks = &single.cluster_queues[0]
        .spec
        .admission_checks_strategy
        .as_ref()
        .expect("the credit check")
        .admission_checks;
    assert_eq!(checks.len(), 1);
    assert!(worker_condition(&single).is_none());
}

#[test]
fn a_worker_node_deleted_leaves_by_its_own_name() {
    let mut index = NodeIndex::for_worker("worker-a");
    index.begin_relist();
    index.relisted(&gpu_node("gpu-1", 8));
    index.end_relist();
    assert!(index.snapshot().nodes.contains_key("worker-a/gpu-1"));
    assert!(!index.upsert(&gpu_node("gpu-1", 8)), "unchanged");
    assert!(index.remove("gpu-1"));
    assert!(index.snapshot().nodes.is_empty());
}
