//! `kaccel inventory` against the real API server: two Nodes created with their
//! status, a Workload admitted onto a flavor that selects one of them, then the
//! built binary's `inventory -o json` (and the table) must show both Nodes'
//! device groups, their health and the flavor's allocation.

use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::support::{self, Cleanup, is_true, kueue, unique};

const GPU: &str = "nvidia.com/gpu";
const ADMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// A simulated NVIDIA node. 16 GiB GPUs: below every memory floor of the example
/// classes, so a `kaccel run` that other tests start at the same time plans
/// nothing on these nodes (and their quiet-cluster check sees no writes).
fn node(name: &str, model: &str, capacity: u32, allocatable: u32) -> Result<Node> {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    Ok(serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kaccel.dev/e2e": "true",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": model,
            "nvidia.com/gpu.memory": "16384",
            "nvidia.com/gpu.count": capacity.to_string(),
        }},
        "status": {
            "capacity": { "cpu": "32", "memory": "256Gi", "pods": "110", GPU: capacity.to_string() },
            "allocatable": { "cpu": "32", "memory": "256Gi", "pods": "110", GPU: allocatable.to_string() },
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "KubeletReady",
                "message": "simulated", "lastHeartbeatTime": now, "lastTransitionTime": now
            }]
        }
    }))?)
}

fn workload(name: &str, ns: &str, queue: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "queueName": queue,
            "podSets": [{
                "name": "main", "count": 1,
                "template": { "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {
                            "requests": { "cpu": "1", "memory": "1Gi", GPU: gpus.to_string() },
                            "limits": { GPU: gpus.to_string() }
                        }
                    }]
                }}
            }]
        }
    })
}

fn kaccel_inventory(args: &[&str]) -> Result<String> {
    let out = Command::new(env!("CARGO_BIN_EXE_kaccel"))
        .arg("inventory")
        .args(args)
        .output()
        .context("running kaccel inventory")?;
    ensure!(
        out.status.success(),
        "kaccel inventory {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

#[tokio::test]
async fn inventory_shows_nodes_health_and_allocation_per_flavor() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = inventory(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

async fn inventory(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = unique("inv");
    let (node_a, node_b) = (format!("a-{id}"), format!("b-{id}"));
    let (model_a, model_b) = (format!("E2E-A-{id}"), format!("E2E-B-{id}"));
    let (flavor, cq, ns, lq) = (
        format!("f-{id}"),
        format!("cq-{id}"),
        format!("ns-{id}"),
        "team".to_owned(),
    );

    // Nodes: created with their status in one POST each, as a kubelet registers.
    let nodes: Api<Node> = Api::all(client.clone());
    let node_ar = ApiResource::erase::<Node>(&());
    for (name, model, capacity, allocatable) in
        [(&node_a, &model_a, 8, 8), (&node_b, &model_b, 4, 3)]
    {
        nodes
            .create(
                &PostParams::default(),
                &node(name, model, capacity, allocatable)?,
            )
            .await
            .with_context(|| format!("creating Node {name}"))?;
        cleanup.add(None, node_ar.clone(), name);
    }

    // A flavor for model A with quota, and a Workload admitted onto it.
    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    support::create(
        &flavors,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": { "name": flavor },
            "spec": { "nodeLabels": { "nvidia.com/gpu.product": model_a } }
        }),
    )
    .await?;
    cleanup.add(None, kueue("ResourceFlavor"), &flavor);
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    support::create(
        &cqs,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": { "name": cq },
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [{
                    // The harness's Kueue also counts nvidia.com/gpu as
                    // kaccel.io/accelerator: a queue must cover both (README).
                    "coveredResources": ["cpu", "memory", GPU, "kaccel.io/accelerator"],
                    "flavors": [{ "name": flavor, "resources": [
                        { "name": "cpu", "nominalQuota": "32" },
                        { "name": "memory", "nominalQuota": "256Gi" },
                        { "name": GPU, "nominalQuota": "8" },
                        { "name": "kaccel.io/accelerator", "nominalQuota": "8" }
                    ]}]
                }]
            }
        }),
    )
    .await?;
    cleanup.add(None, kueue("ClusterQueue"), &cq);
    support::wait_until(&cqs, &cq, "ClusterQueue Active", ADMIT_TIMEOUT, |o| {
        is_true(o, "Active")
    })
    .await?;
    support::namespace(client, &ns).await?;
    cleanup.add_namespace(&ns);
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue"));
    support::create(
        &lqs,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
            "metadata": { "name": lq, "namespace": ns },
            "spec": { "clusterQueue": cq }
        }),
    )
    .await?;
    cleanup.add(Some(&ns), kueue("LocalQueue"), &lq);
    let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
    support::create(&wls, workload("job", &ns, &lq, 2)).await?;
    cleanup.add(Some(&ns), kueue("Workload"), "job");
    support::wait_until(&wls, "job", "Admitted", ADMIT_TIMEOUT, |o| {
        is_true(o, "Admitted")
    })
    .await?;

    // JSON: the inventory model, health and allocation.
    let stdout = kaccel_inventory(&["-o", "json"])?;
    let report: Value = serde_json::from_str(&stdout).context("inventory -o json is JSON")?;
    for (name, model, capacity, allocatable) in
        [(&node_a, &model_a, 8, 8), (&node_b, &model_b, 4, 3)]
    {
        let groups = report["nodes"][name.as_str()]["groups"]
            .as_array()
            .with_context(|| format!("Node {name} missing from inventory: {stdout}"))?;
        ensure!(groups.len() == 1, "{name}: groups {groups:?}");
        let g = &groups[0];
        ensure!(
            g["variant"]["vendor"] == "nvidia"
                && g["variant"]["model"] == model.as_str()
                && g["variant"]["sharing"] == "Whole"
                && g["variant"]["resourceName"] == GPU
                && g["capacity"] == capacity
                && g["allocatable"] == allocatable
                && g["memoryMib"] == 16384,
            "{name}: unexpected group {g}"
        );
    }
    let health_b = &report["health"][node_b.as_str()][GPU];
    ensure!(
        health_b["healthy"] == 3 && health_b["degraded"] == 1,
        "{node_b}: one GPU withdrawn by the device plugin must be Degraded: {health_b}"
    );
    ensure!(
        report["allocation"]["unavailable"].is_null(),
        "allocation unavailable: {}",
        report["allocation"]
    );
    let row = report["allocation"]["flavors"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|f| f["flavor"] == flavor.as_str() && f["resourceName"] == GPU)
        .with_context(|| format!("no allocation row for {flavor}: {}", report["allocation"]))?;
    ensure!(
        row["allocated"] == 2
            && row["workloads"] == 1
            && row["capacity"] == 8
            && row["nodes"] == 1
            && row["variants"][0]["model"] == model_a.as_str(),
        "allocation of {flavor}: {row}"
    );

    // The table names both nodes and the flavor's allocation.
    let table = kaccel_inventory(&[])?;
    for name in [&node_a, &node_b] {
        ensure!(
            table.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name} missing from the table:\n{table}"
        );
    }
    let flavor_row = table
        .lines()
        .find(|l| l.starts_with(&format!("{flavor} ")))
        .with_context(|| format!("{flavor} missing from the table:\n{table}"))?;
    let tail: Vec<&str> = flavor_row.split_whitespace().rev().take(2).collect();
    ensure!(tail == ["1", "2"], "ALLOCATED 2, WORKLOADS 1: {flavor_row}");
    Ok(())
}
