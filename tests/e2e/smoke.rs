//! Smoke test of the harness itself: Kueue admits a Workload onto a flavor
//! within quota, and keeps a Workload that exceeds the quota pending.

use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use kube::Client;
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

use crate::support::{self, Cleanup, condition, is_true, kueue, unique};

const GPU: &str = "nvidia.com/gpu";
const ADMIT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a Workload beyond the quota must stay unadmitted.
const PENDING_HOLD: Duration = Duration::from_secs(5);

fn workload(name: &str, ns: &str, queue: &str, gpus: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": {
            "queueName": queue,
            "podSets": [{
                "name": "main",
                "count": 1,
                "template": { "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "train",
                        "image": "registry.k8s.io/pause:3.10",
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

#[tokio::test]
async fn workload_within_quota_is_admitted_and_excess_waits() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = admit_then_pend(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    if let Err(e) = result {
        panic!("{e:#}");
    }
}

async fn admit_then_pend(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = unique("smoke");
    let (flavor, cq, ns, lq) = (
        format!("h100-{id}"),
        format!("cq-{id}"),
        format!("ns-{id}"),
        "team-a".to_owned(),
    );

    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    support::create(
        &flavors,
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": { "name": flavor },
            "spec": { "nodeLabels": { "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" } }
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
                        { "name": "cpu", "nominalQuota": "64" },
                        { "name": "memory", "nominalQuota": "512Gi" },
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

    // 1. Eight GPUs fit the quota exactly: admitted onto the H100 flavor.
    let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
    support::create(&wls, workload("fits", &ns, &lq, 8)).await?;
    cleanup.add(Some(&ns), kueue("Workload"), "fits");
    let admitted = support::wait_until(
        &wls,
        "fits",
        "QuotaReserved and Admitted",
        ADMIT_TIMEOUT,
        |o| is_true(o, "QuotaReserved") && is_true(o, "Admitted"),
    )
    .await?;
    let admission = &admitted["status"]["admission"];
    ensure!(
        admission["clusterQueue"] == cq.as_str(),
        "admitted to the wrong ClusterQueue: {admission}"
    );
    let assignment = &admission["podSetAssignments"][0];
    ensure!(
        assignment["name"] == "main",
        "unexpected podSetAssignments: {admission}"
    );
    ensure!(
        assignment["flavors"][GPU] == flavor.as_str(),
        "GPU not assigned to {flavor}: {admission}"
    );
    ensure!(
        assignment["resourceUsage"][GPU] == "8",
        "GPU usage is not 8: {admission}"
    );

    // 2. One more GPU exceeds the remaining quota (0): stays pending, with a reason.
    support::create(&wls, workload("too-much", &ns, &lq, 1)).await?;
    cleanup.add(Some(&ns), kueue("Workload"), "too-much");
    let pending = support::wait_until(
        &wls,
        "too-much",
        "QuotaReserved=False with a reason",
        ADMIT_TIMEOUT,
        |o| {
            condition(o, "QuotaReserved")
                .is_some_and(|c| c["status"] == "False" && c["reason"].is_string())
        },
    )
    .await?;
    let reason = condition(&pending, "QuotaReserved")
        .cloned()
        .unwrap_or_default();
    eprintln!(
        "pending workload: reason={} message={}",
        reason["reason"], reason["message"]
    );
    let hold_until = Instant::now() + PENDING_HOLD;
    while Instant::now() < hold_until {
        let o = support::get_json(&wls, "too-much").await?;
        ensure!(
            !is_true(&o, "QuotaReserved") && o.pointer("/status/admission").is_none(),
            "a workload beyond the quota was admitted: {}",
            o["status"]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
