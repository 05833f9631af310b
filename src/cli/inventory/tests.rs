//! Tests of `kaccel inventory`: the table and JSON, allocation per flavor, unreadable sources.

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

use super::*;
use crate::kueue::workload::Workload;

const FLEET: &str = include_str!("../../../examples/nodes.yaml");

fn fleet() -> Inventory {
    let nodes: Vec<Node> = serde_yaml::Deserializer::from_str(FLEET)
        .filter_map(|d| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(d).ok()?;
            (v.get("kind")?.as_str()? == "Node")
                .then(|| serde_yaml::from_value(v).expect("example Node parses"))
        })
        .collect();
    Inventory::from_nodes(&nodes)
}

fn h100_flavor() -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
        "metadata": {"name": "h100"},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
    })
}

fn workload(name: &str, flavor: &str, gpus: &str, conditions: &[(&str, &str)]) -> Workload {
    serde_json::from_value(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": "team"},
        "status": {
            "conditions": conditions.iter().map(|(t, s)| json!({"type": t, "status": s})).collect::<Vec<_>>(),
            "admission": {"clusterQueue": "cq", "podSetAssignments": [{
                "name": "main",
                "flavors": {"nvidia.com/gpu": flavor, "cpu": "cpu-flavor"},
                "resourceUsage": {"nvidia.com/gpu": gpus, "cpu": "16"}
            }]}
        }
    }))
    .expect("a Workload")
}

#[test]
fn table_lists_every_group_with_health_and_counts() {
    let inv = fleet();
    let expected_groups = inv.groups().count();
    let report = InventoryReport::new("examples/nodes.yaml".into(), inv, Allocation::default());
    let text = render(&report);
    let header = text
        .lines()
        .find(|l| l.starts_with("NODE"))
        .expect("header row");
    for column in [
        "VENDOR",
        "MODEL",
        "SHARING",
        "PROFILE",
        "RESOURCE",
        "CAPACITY",
        "ALLOCATABLE",
        "HEALTHY",
        "DEGRADED",
        "UNKNOWN",
    ] {
        assert!(header.contains(column), "{column} missing: {header}");
    }
    let rows: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("NODE"))
        .skip(1)
        .take_while(|l| !l.is_empty())
        .collect();
    assert_eq!(rows.len(), expected_groups, "{text}");
    // gpu-h100-04: one GPU withdrawn by the device plugin -> 8 / 7, 7 healthy, 1 degraded.
    let h100_04: Vec<&str> = rows
        .iter()
        .find(|r| r.starts_with("gpu-h100-04 "))
        .expect("gpu-h100-04 row")
        .split_whitespace()
        .collect();
    assert_eq!(
        h100_04,
        [
            "gpu-h100-04",
            "Ready",
            "nvidia",
            "NVIDIA-H100-80GB-HBM3",
            "Whole",
            "-",
            "nvidia.com/gpu",
            "8",
            "7",
            "7",
            "0",
            "1",
            "0",
            "0"
        ]
    );
    // Columns line up: every row is as wide as the header or narrower only by
    // trailing cells, and the numeric columns end at the same offset.
    let end = header.len();
    assert!(rows.iter().all(|r| r.len() == end), "ragged table:\n{text}");
}

#[test]
fn partitions_show_their_profile() {
    let report = InventoryReport::new("f".into(), fleet(), Allocation::default());
    let text = render(&report);
    let partition_rows: Vec<&str> = text.lines().filter(|l| l.contains(" Partition ")).collect();
    assert!(!partition_rows.is_empty(), "{text}");
    for row in partition_rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_ne!(cells[5], "-", "a partition row without a profile: {row}");
    }
}

#[test]
fn allocation_sums_admitted_unfinished_workloads_per_flavor() {
    let inv = fleet();
    let workloads = [
        workload(
            "a",
            "h100",
            "8",
            &[("QuotaReserved", "True"), ("Admitted", "True")],
        ),
        workload("b", "h100", "4", &[("Admitted", "True")]),
        // Pending, finished, and quota-only workloads hold nothing.
        workload("c", "h100", "8", &[("QuotaReserved", "False")]),
        workload(
            "d",
            "h100",
            "8",
            &[("Admitted", "True"), ("Finished", "True")],
        ),
        workload(
            "e",
            "h100",
            "8",
            &[("QuotaReserved", "True"), ("Admitted", "False")],
        ),
        // A flavor that is gone still shows what it holds.
        workload("f", "gone", "2", &[("Admitted", "True")]),
    ];
    let a = allocation(
        &inv,
        &KueueObjects {
            flavors: vec![h100_flavor()],
            cluster_queues: vec![],
            workloads: workloads.to_vec(),
        },
    );
    assert!(a.unavailable.is_none());
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    let h100 = a
        .flavors
        .iter()
        .find(|f| f.flavor == "h100" && f.resource_name == "nvidia.com/gpu")
        .expect("h100 row");
    assert_eq!((h100.allocated, h100.workloads), (12, 2));
    assert_eq!(h100.variants.len(), 1);
    assert_eq!(h100.variants[0].model, "NVIDIA-H100-80GB-HBM3");
    let h100_groups: Vec<_> = inv
        .groups()
        .filter(|(_, g)| g.variant == h100.variants[0])
        .collect();
    assert_eq!(h100.nodes as usize, h100_groups.len());
    assert_eq!(
        h100.capacity,
        h100_groups
            .iter()
            .map(|(_, g)| u64::from(g.capacity))
            .sum::<u64>()
    );
    let gone = a
        .flavors
        .iter()
        .find(|f| f.flavor == "gone")
        .expect("gone row");
    assert_eq!((gone.allocated, gone.capacity), (2, 0));
    assert!(gone.variants.is_empty());
    // cpu is not a device.
    assert!(a.flavors.iter().all(|f| f.resource_name != "cpu"));

    let report = InventoryReport::new("cluster".into(), inv, a);
    let text = render(&report);
    let row = text
        .lines()
        .find(|l| l.starts_with("h100 "))
        .expect("h100 allocation row");
    assert!(row.contains("nvidia NVIDIA-H100-80GB-HBM3 Whole"), "{row}");
    let last_two: Vec<&str> = row.split_whitespace().rev().take(2).collect();
    assert_eq!(last_two, ["2", "12"], "ALLOCATED 12, WORKLOADS 2: {row}");
}

#[test]
fn idle_rows_come_from_cluster_queue_quotas_only() {
    let mig_whole = json!({
        "metadata": {"name": "a100"},
        "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
    });
    let cq = json!({
        "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{
            "coveredResources": ["cpu", "nvidia.com/gpu", "amd.com/gpu"],
            "flavors": [{"name": "a100", "resources": [
                {"name": "cpu", "nominalQuota": "8"},
                {"name": "nvidia.com/gpu", "nominalQuota": "4"},
                {"name": "amd.com/gpu", "nominalQuota": "0"}
            ]}]
        }]}
    });
    let a = allocation(
        &fleet(),
        &KueueObjects {
            flavors: vec![mig_whole, h100_flavor()],
            cluster_queues: vec![cq],
            workloads: vec![],
        },
    );
    // The MIG partitions on the same nodes are not this flavor's, nor is the
    // zero amd.com/gpu quota Kueue makes the group list; h100 has no quota
    // anywhere and no workload, so no row.
    let rows: Vec<(&str, &str, u64, u64)> = a
        .flavors
        .iter()
        .map(|f| {
            (
                f.flavor.as_str(),
                f.resource_name.as_str(),
                f.capacity,
                f.allocated,
            )
        })
        .collect();
    assert_eq!(rows, [("a100", "nvidia.com/gpu", 4, 0)]);
}

#[test]
fn bad_quantities_are_warnings_not_panics() {
    let a = allocation(
        &fleet(),
        &KueueObjects {
            flavors: vec![h100_flavor()],
            cluster_queues: vec![],
            workloads: vec![workload("x", "h100", "1.5", &[("Admitted", "True")])],
        },
    );
    assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
    assert!(a.warnings[0].contains("team/x"), "{:?}", a.warnings);
}

#[test]
fn unavailable_allocation_says_so() {
    let report = InventoryReport::new(
        "cluster".into(),
        fleet(),
        Allocation {
            unavailable: Some("source unavailable: cannot list Kueue Workloads".into()),
            ..Default::default()
        },
    );
    let text = render(&report);
    assert!(
        text.contains("allocation source unavailable: cannot list Kueue Workloads"),
        "{text}"
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["allocation"]["flavors"], json!([]));
    assert!(json["allocation"]["unavailable"].is_string());
}

#[test]
fn json_carries_the_model_health_and_allocation() {
    let report = InventoryReport::new("f".into(), fleet(), Allocation::default());
    let json = serde_json::to_value(&report).unwrap();
    let node = &json["nodes"]["gpu-h100-04"];
    assert_eq!(
        node["groups"][0]["variant"]["resourceName"],
        "nvidia.com/gpu"
    );
    assert_eq!(node["groups"][0]["allocatable"], 7);
    assert_eq!(
        json["health"]["gpu-h100-04"]["nvidia.com/gpu"]["degraded"],
        1
    );
    assert!(json["allocation"].is_object());
}

/// The inventory lists what `kaccel plan -o summary` lists as unclassified: node,
/// source, count and reason, beside the classified groups.
#[test]
fn unclassified_devices_are_listed() {
    let nodes: Vec<Node> = [
        // No adapter reads qualcomm.com/qaic.
        "metadata: {name: qaic-01}\nstatus: {capacity: {cpu: \"64\", qualcomm.com/qaic: \"8\"}, allocatable: {cpu: \"64\", qualcomm.com/qaic: \"8\"}}",
        // GPU feature discovery's presence label, but no device plugin.
        "metadata: {name: nv-no-plugin, labels: {nvidia.com/gpu.present: \"true\"}}\nstatus: {capacity: {cpu: \"64\"}, allocatable: {cpu: \"64\"}}",
    ]
    .iter()
    .map(|y| serde_yaml::from_str(y).unwrap())
    .collect();
    let inv = Inventory::from_nodes(&nodes);
    let report = InventoryReport::new("f".into(), inv, Allocation::default());
    let text = render(&report);
    assert!(
        text.contains("No accelerator kaccel can classify on any Node."),
        "{text}"
    );
    assert!(
        text.contains("Unclassified: 9 accelerator device(s)"),
        "{text}"
    );
    let row = |node: &str| -> Vec<&str> {
        text.lines()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("no row for {node}:\n{text}"))
            .split_whitespace()
            .collect()
    };
    assert_eq!(row("qaic-01 ")[1..3], ["qualcomm.com/qaic", "8"]);
    assert!(row("qaic-01 ").contains(&"adapter"), "{text}");
    assert_eq!(
        row("nv-no-plugin ")[1..3],
        ["nvidia.com/gpu.present=true", "0"]
    );
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        json["nodes"]["qaic-01"]["unclassified"][0]["source"],
        "qualcomm.com/qaic"
    );
}

#[test]
fn empty_fleet_says_so() {
    let report = InventoryReport::new("f".into(), Inventory::default(), Allocation::default());
    assert!(render(&report).contains("No accelerators found on any Node."));
}

/// Each device a DRA driver publishes gets a row: its identity (driver, pool,
/// device name: what a DeviceTaintRule selects) and what it says of itself.
#[test]
fn table_lists_each_dra_device_with_its_identity() {
    let node: Node = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "dra-a", "labels": {"kaccel.io/accelerator.model": "NVIDIA-H100-80GB-HBM3"}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi"}, "conditions": [{"type": "Ready", "status": "True"}]},
    }))
    .unwrap();
    let gpu = |i: u32, healthy: bool| {
        let mut d = json!({
            "name": format!("gpu-{i}"),
            "attributes": {
                "type": {"string": "gpu"}, "uuid": {"string": format!("GPU-{i}")},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "driverVersion": {"version": "550.54.15"},
                "pcieBusID": {"string": format!("0000:0{i}:00.0")},
            },
            "capacity": {"memory": {"value": "81559Mi"}},
        });
        if !healthy {
            d["taints"] = json!([{"key": "example.com/xid", "effect": "NoSchedule"}]);
        }
        d
    };
    let slice: k8s_openapi::api::resource::v1::ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "dra-a-gpu"},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": "dra-a",
                 "pool": {"name": "dra-a-pool", "generation": 1, "resourceSliceCount": 1},
                 "devices": [gpu(0, true), gpu(1, false)]},
    }))
    .unwrap();
    let inv = Inventory::from_nodes_and_slices(&[node], &[slice]);
    let mut report = InventoryReport::new("fleet.yaml".into(), inv, Allocation::default());
    // kaccel holds a rule on gpu-0 (as the API server returns it).
    report.taint_rules = vec![
        HeldTaintRule::of(&serde_json::from_value(json!({
            "metadata": {"name": "kaccel-gpu-nvidia-com-dra-a-pool-gpu-0-1234abcd",
                         "annotations": {"kaccel.io/reason": "Failed: XID 79"}},
            "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "dra-a-pool", "device": "gpu-0"},
                     "taint": {"key": "kaccel.io/unhealthy", "value": "Failed", "effect": "NoSchedule",
                               "timeAdded": "2026-12-04T00:00:00Z"}},
        })).unwrap())
        .unwrap(),
    ];
    // A pod holds gpu-1 through its claim (as kube-scheduler leaves the claim).
    let claim: k8s_openapi::api::resource::v1::ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": "train-0-gpus-x7k2p", "namespace": "ml"},
        "spec": {},
        "status": {"allocation": {"devices": {"results": [
                       {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "dra-a-pool", "device": "gpu-1"}]}},
                   "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "u1"}]},
    }))
    .unwrap();
    report.claimed = crate::inventory::holders::claimed_devices([&claim])
        .into_values()
        .collect();
    let text = render(&report);
    assert!(text.contains("DRA devices (2)"), "{text}");
    let row = |device: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with("dra-a") && l.contains(&format!(" {device} ")))
            .unwrap_or_else(|| panic!("no row for {device}: {text}"))
            .split("  ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect()
    };
    assert_eq!(
        row("gpu-0"),
        [
            "dra-a",
            "gpu.nvidia.com",
            "dra-a-pool",
            "gpu-0",
            "NVIDIA-H100-80GB-HBM3",
            "GPU-0",
            "0000:00:00.0",
            "81559 MiB",
            "550.54.15",
            "no (kaccel's taint rule)",
            "kaccel-gpu-nvidia-com-dra-a-pool-gpu-0-1234abcd (NoSchedule: Failed: XID 79)",
            "-"
        ]
    );
    let gpu1 = row("gpu-1");
    assert_eq!(gpu1[gpu1.len() - 3], "no (tainted or unhealthy)");
    assert_eq!(gpu1[gpu1.len() - 2], "-");
    assert_eq!(
        gpu1.last().unwrap(),
        "ml/train-0 (claim train-0-gpus-x7k2p)"
    );
    // The JSON carries the same identity.
    let json = serde_json::to_value(&report).unwrap();
    let devices = &json["nodes"]["dra-a"]["groups"][0]["devices"];
    assert_eq!(devices[0]["driver"], "gpu.nvidia.com");
    assert_eq!(devices[0]["pool"], "dra-a-pool");
    assert_eq!(devices[0]["driverVersion"], "550.54.15");
    assert_eq!(json["claimed"][0]["pods"], json!(["train-0"]));
    assert_eq!(json["claimed"][0]["id"]["device"], "gpu-1");
}

#[test]
fn devices_asked_for_by_the_class_resource_count_once_on_the_flavors_own_row() {
    let inv = fleet();
    let admitted = |name: &str, usage: Value| crate::testkit::admitted_on(name, "h100", 1, usage);
    let cq = json!({
        "metadata": {"name": "cq"},
        "spec": {"resourceGroups": [{
            "coveredResources": ["nvidia.com/gpu", "kaccel.io/accelerator"],
            "flavors": [{"name": "h100", "resources": [
                {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                {"name": "kaccel.io/accelerator", "nominalQuota": "16"}
            ]}]
        }]}
    });
    let a = allocation(
        &inv,
        &KueueObjects {
            flavors: vec![h100_flavor()],
            cluster_queues: vec![cq],
            workloads: vec![
                // Kueue's Retain transformation: 4 vendor units are 4 class units too.
                admitted(
                    "vendor",
                    json!({"nvidia.com/gpu": "4", "kaccel.io/accelerator": "4"}),
                ),
                admitted("class", json!({"kaccel.io/accelerator": "8"})),
            ],
        },
    );
    assert!(a.warnings.is_empty(), "{:?}", a.warnings);
    assert!(
        a.flavors
            .iter()
            .all(|f| f.resource_name != "kaccel.io/accelerator"),
        "the class resource is no device of its own: {:?}",
        a.flavors
    );
    let h100 = a
        .flavors
        .iter()
        .find(|f| f.flavor == "h100")
        .expect("h100 row");
    assert_eq!(
        (h100.resource_name.as_str(), h100.allocated, h100.workloads),
        ("nvidia.com/gpu", 12, 2)
    );
}
