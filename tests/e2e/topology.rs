//! Topology Aware Scheduling from the labels kaccel reads: kaccel writes the Kueue
//! Topology and the flavor's `topologyName`, Kueue's own TAS places a PodSet that
//! requires one rack, and a failed GPU counts against its rack.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::{AcceleratorClass, TopologyLevel};
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::controller::{Controller, Planned, class_from_example, class_with_queues, free_port};
use crate::health::{Answer, FakeExporter, dcgm_of, dcgm_source, node_state, uncordon_all};
use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(60);
const RACK: &str = "topology.kaccel.io/rack";

/// A GPU node as GPU feature discovery labels an H200 (model made unique to this
/// run, so other tests' flavors stay apart), in `zone` and `rack`. It also
/// advertises `kaccel.io/accelerator` (4): the harness's Kueue counts
/// `nvidia.com/gpu` as the class resource too (a `Retain` transformation), and
/// Kueue v0.17's TAS checks the transformed requests against node allocatable
/// when it reserves (`flavorassigner.ComputeTASNetUsage`; kueue#12005), so a
/// node without it never fits. README "Topology" says so.
fn h200_node(name: &str, model: &str, zone: &str, rack: &str) -> Node {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    support::ready_node(
        name,
        json!({"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
               "nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": "143771",
               "nvidia.com/gpu.count": "4", "nvidia.com/gpu.family": "hopper",
               "topology.kubernetes.io/zone": zone, RACK: rack}),
        json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "4",
               "kaccel.io/accelerator": "4"}),
        &now,
    )
}

/// `pods` pods of 4 GPUs each that must all land in one rack.
fn rack_workload(ns: &str, name: &str, queue: &str, pods: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "queueName": queue, "podSets": [{ "name": "main", "count": pods,
            "topologyRequest": { "required": RACK },
            "template": { "spec": { "restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": { "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "4" },
                               "limits": { "nvidia.com/gpu": "4" } } }] } } }] }
    })
}

fn admitted(w: &Value) -> bool {
    support::is_true(w, "Admitted")
}

/// The nodes Kueue's TAS assigned the Workload's one PodSet to. Kueue v0.17
/// writes only the lowest level (hostnames), compressed as a shared value or a
/// prefix + roots + suffix per domain.
fn assigned_nodes(w: &Value) -> Vec<String> {
    let assignment = &w["status"]["admission"]["podSetAssignments"][0]["topologyAssignment"];
    let Some(host_level) = assignment["levels"]
        .as_array()
        .and_then(|l| l.iter().position(|l| l == "kubernetes.io/hostname"))
    else {
        return Vec::new();
    };
    let mut nodes = Vec::new();
    for slice in assignment["slices"].as_array().into_iter().flatten() {
        let values = &slice["valuesPerLevel"][host_level];
        if let Some(one) = values["universal"].as_str() {
            nodes.push(one.to_string());
        }
        let individual = &values["individual"];
        let (prefix, suffix) = (
            individual["prefix"].as_str().unwrap_or_default(),
            individual["suffix"].as_str().unwrap_or_default(),
        );
        for root in individual["roots"].as_array().into_iter().flatten() {
            nodes.push(format!(
                "{prefix}{}{suffix}",
                root.as_str().unwrap_or_default()
            ));
        }
    }
    nodes.sort();
    nodes
}

#[tokio::test]
async fn a_podset_requiring_one_rack_is_admitted_only_where_a_rack_has_healthy_room() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let mut controller = None;
    let result = rack_placement(&client, &mut cleanup, &mut controller).await;
    if result.is_err()
        && let Some(c) = &controller
    {
        eprintln!("kaccel log:\n{}", c.log_tail());
    }
    drop(controller);
    uncordon_all(&client).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn rack_placement(
    client: &Client,
    cleanup: &mut Cleanup,
    controller: &mut Option<Controller>,
) -> Result<()> {
    let id = support::unique("tas");
    let model = format!("NVIDIA-H200-{}", id.to_uppercase());
    let (zone, rack_a, rack_b) = (
        format!("zone-{id}"),
        format!("rack-a-{id}"),
        format!("rack-b-{id}"),
    );
    // rack-a: two 4-GPU nodes; rack-b: one.
    let layout = [
        (format!("{id}-a1"), rack_a.clone()),
        (format!("{id}-a2"), rack_a.clone()),
        (format!("{id}-b1"), rack_b.clone()),
    ];
    let nodes: Api<Node> = Api::all(client.clone());
    for (name, rack) in &layout {
        nodes
            .create(
                &PostParams::default(),
                &h200_node(name, &model, &zone, rack),
            )
            .await
            .context("creating node")?;
        cleanup.add(None, ApiResource::erase::<Node>(&()), name);
    }

    // The example large-training class (level rack), on this run's H200s only.
    let class_name = format!("rack-{id}");
    let mut class = class_from_example("large-training", &class_name);
    ensure!(
        class.spec.topology.as_ref().map(|t| t.level) == Some(TopologyLevel::Rack),
        "the example class asks for one rack"
    );
    class.spec.selector.models = vec![model.clone()];
    let Planned {
        ns,
        root,
        cluster_queue,
        ..
    } = class_with_queues(client, cleanup, &id, &class, 12).await?;

    let mut exporters = Vec::new();
    let mut sources = String::new();
    for (name, _) in &layout {
        let e = FakeExporter::start(Answer::Metrics(dcgm_of(name, "NVIDIA H200", 4, &[]))).await;
        sources.push_str(&dcgm_source(name, e.port));
        exporters.push(e);
    }
    *controller = Some(Controller::start(
        &format!("tas-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 50\nmaxDelayMs: 300\nwatchResourceSlices: false\nleaderElection:\n  enabled: false\nplanner:\n  topologyAwareScheduling: true\nhealth:\n  policy:\n    holdDownSeconds: 2\n  sources:\n{sources}"
        ),
    ));

    // kaccel writes the Topology and names it on the flavor; the class shows
    // the rack label and its racks.
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let deadline = std::time::Instant::now() + WAIT;
    let flavor_topology = loop {
        let c = classes.get(&class_name).await?;
        let shown = c
            .status
            .as_ref()
            .and_then(|s| s.flavors.first())
            .and_then(|f| Some((f.name.clone(), f.topology.clone()?)));
        if let Some((flavor, t)) = shown
            && t.largest_block == Some(8)
        {
            break (flavor, t);
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "class status never showed the racks: {:?}",
            c.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (flavor, shown) = flavor_topology;
    cleanup.add(None, kueue("ResourceFlavor"), &flavor);
    cleanup.add_last(None, kueue("Topology"), &shown.name);
    assert_eq!(shown.level_label.as_deref(), Some(RACK));
    assert_eq!(shown.blocks, Some(2));
    let status = classes.get(&class_name).await?.status.context("status")?;
    let mismatch = status
        .conditions
        .iter()
        .find(|c| c.type_ == "TopologyMismatch")
        .context("TopologyMismatch condition")?;
    assert_eq!(
        (mismatch.status.as_str(), mismatch.reason.as_str()),
        ("False", "LevelLabelled"),
        "{}",
        mismatch.message
    );
    let topologies: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("Topology"));
    let topology = support::get_json(&topologies, &shown.name).await?;
    let levels: Vec<&str> = topology["spec"]["levels"]
        .as_array()
        .context("levels")?
        .iter()
        .filter_map(|l| l["nodeLabel"].as_str())
        .collect();
    assert_eq!(
        levels,
        [
            "topology.kubernetes.io/zone",
            RACK,
            "kubernetes.io/hostname"
        ]
    );
    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    let rf = support::get_json(&flavors, &flavor).await?;
    assert_eq!(rf["spec"]["topologyName"], shown.name.as_str());

    // Eight GPUs in one rack: only rack-a has them.
    let workloads: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
    support::create(&workloads, rack_workload(&ns, "eight-1", &class_name, 2)).await?;
    let w = support::wait_until(&workloads, "eight-1", "admitted", WAIT, admitted).await?;
    assert_eq!(
        assigned_nodes(&w),
        [layout[0].0.clone(), layout[1].0.clone()],
        "rack-a: {w}"
    );
    crate::ledger::finish(&workloads, "eight-1").await?;
    workloads.delete("eight-1", &Default::default()).await?;

    // Two GPUs of a1 fail: kaccel cordons a1, so rack-a has four healthy GPUs
    // left and the next eight-GPU Workload waits, while four GPUs still fit.
    exporters[0].set(Answer::Metrics(dcgm_of(
        &layout[0].0,
        "NVIDIA H200",
        4,
        &[0, 1],
    )));
    let deadline = std::time::Instant::now() + WAIT;
    while !node_state(&nodes, &layout[0].0).await?.0 {
        ensure!(std::time::Instant::now() < deadline, "a1 never cordoned");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let c = classes.get(&class_name).await?;
        let largest = c
            .status
            .as_ref()
            .and_then(|s| s.flavors.first())
            .and_then(|f| f.topology.as_ref()?.largest_block);
        if largest == Some(4) {
            break;
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "largest rack never fell to 4: {largest:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Quota is not what holds it: 8 healthy GPUs are guaranteed and none is in use.
    let metrics = controller
        .as_ref()
        .and_then(Controller::metrics)
        .context("kaccel's /metrics")?;
    let series =
        format!("kaccel_class_largest_block{{class=\"{class_name}\",flavor=\"{flavor}\"}} 4");
    ensure!(
        metrics.lines().any(|l| l == series),
        "no {series} in /metrics"
    );
    support::create(&workloads, rack_workload(&ns, "eight-2", &class_name, 2)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = support::get_json(&workloads, "eight-2").await?;
    ensure!(
        !admitted(&waiting),
        "an eight-GPU rack Workload was admitted with no rack holding eight healthy GPUs: {waiting}"
    );
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let cq = support::get_json(&queues, &cluster_queue).await?;
    let gpu_quota: u64 = cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .filter(|r| r["name"] == "nvidia.com/gpu")
        .filter_map(|r| r["nominalQuota"].as_str()?.parse::<u64>().ok())
        .sum();
    ensure!(gpu_quota >= 8, "quota would hold it too: {gpu_quota}");
    let reason = waiting["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "QuotaReserved")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string();
    ensure!(
        reason.to_lowercase().contains("topology"),
        "Kueue's reason names the topology: {reason}"
    );
    eprintln!("eight-2 waits: {reason}");
    // Four GPUs in one rack still fit.
    support::create(&workloads, rack_workload(&ns, "four", &class_name, 1)).await?;
    let w = support::wait_until(&workloads, "four", "admitted", WAIT, admitted).await?;
    let placed = assigned_nodes(&w);
    ensure!(
        placed == [layout[1].0.clone()] || placed == [layout[2].0.clone()],
        "one healthy node, placed by TAS: {w}"
    );
    crate::ledger::finish(&workloads, "four").await?;
    workloads.delete("four", &Default::default()).await?;

    // The GPUs come back: a1 is uncordoned and the waiting Workload gets rack-a.
    exporters[0].set(Answer::Metrics(dcgm_of(
        &layout[0].0,
        "NVIDIA H200",
        4,
        &[],
    )));
    let w = support::wait_until(
        &workloads,
        "eight-2",
        "admitted after repair",
        WAIT,
        admitted,
    )
    .await?;
    assert_eq!(
        assigned_nodes(&w),
        [layout[0].0.clone(), layout[1].0.clone()],
        "rack-a again"
    );
    crate::ledger::finish(&workloads, "eight-2").await?;
    workloads.delete("eight-2", &Default::default()).await?;
    Ok(())
}

/// Racks labelled after a flavor got its Topology: Kueue refuses to change a
/// flavor's `topologyName` (the API server says so to anyone who tries), so
/// kaccel does not try; it says why in a Warning Event and keeps writing
/// everything else.
#[tokio::test]
async fn racks_labelled_after_a_flavor_got_its_topology_are_reported_and_nothing_else_stops() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let mut controller = None;
    let result = late_racks(&client, &mut cleanup, &mut controller).await;
    if result.is_err()
        && let Some(c) = &controller
    {
        eprintln!("kaccel log:\n{}", c.log_tail());
    }
    drop(controller);
    cleanup.run(&client).await;
    result.unwrap();
}

async fn late_racks(
    client: &Client,
    cleanup: &mut Cleanup,
    controller: &mut Option<Controller>,
) -> Result<()> {
    let id = support::unique("late");
    let model = format!("NVIDIA-H200-{}", id.to_uppercase());
    let zone = format!("zone-{id}");
    let names = [format!("{id}-n1"), format!("{id}-n2")];
    let nodes: Api<Node> = Api::all(client.clone());
    for name in &names {
        let mut node = h200_node(name, &model, &zone, "unused");
        // Zone and hostname only: no rack label yet.
        node.metadata.labels.as_mut().unwrap().remove(RACK);
        nodes.create(&PostParams::default(), &node).await?;
        cleanup.add(None, ApiResource::erase::<Node>(&()), name);
    }
    let class_name = format!("late-{id}");
    let mut class = class_from_example("large-training", &class_name);
    class.spec.selector.models = vec![model.clone()];
    class.spec.topology = None;
    let Planned {
        budget,
        root,
        cluster_queue,
        ..
    } = class_with_queues(client, cleanup, &id, &class, 4).await?;
    *controller = Some(Controller::start(
        &format!("late-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 50\nmaxDelayMs: 300\nwatchResourceSlices: false\nleaderElection:\n  enabled: false\nplanner:\n  topologyAwareScheduling: true\n"
        ),
    ));

    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    let deadline = std::time::Instant::now() + WAIT;
    let flavor = loop {
        let c = classes.get(&class_name).await?;
        if let Some(f) = c.status.as_ref().and_then(|s| s.flavors.first())
            && flavors.get_opt(&f.name).await?.is_some()
        {
            break f.name.clone();
        }
        ensure!(
            std::time::Instant::now() < deadline,
            "no flavor: {:?}",
            c.status
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    cleanup.add(None, kueue("ResourceFlavor"), &flavor);
    let first = support::wait_until(&flavors, &flavor, "a topology", WAIT, |f| {
        f["spec"]["topologyName"].is_string()
    })
    .await?["spec"]["topologyName"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    cleanup.add_last(None, kueue("Topology"), &first);
    ensure!(first.starts_with("kaccel-zone-host-"), "{first}");

    // The premise, from the API server itself: the change is refused.
    let refused = flavors
        .patch(
            &flavor,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"topologyName": "kaccel-other"}})),
        )
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(s)) if s.code == 422 && s.message.contains("immutable")),
        "Kueue let topologyName change: {refused:?}"
    );

    // Racks appear on every node: kaccel now plans zone > rack > hostname.
    for name in &names {
        nodes
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(
                    json!({"metadata": {"labels": {RACK: format!("rack-{id}")}}}),
                ),
            )
            .await?;
    }
    let note = support::event_note(
        client,
        "default",
        Some("ResourceFlavor"),
        &flavor,
        "ChangeRefused",
        WAIT,
    )
    .await?;
    ensure!(
        note.contains("topologyName") && note.contains(&first),
        "the Event names the field and the Topology kept: {note}"
    );
    let topologies: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("Topology"));
    for t in topologies.list(&Default::default()).await?.items {
        let name = t.metadata.name.clone().unwrap_or_default();
        if name.starts_with("kaccel-zone-rack-host-") {
            cleanup.add_last(None, kueue("Topology"), &name);
        }
    }
    let kept = support::get_json(&flavors, &flavor).await?;
    ensure!(kept["spec"]["topologyName"] == first.as_str(), "{kept}");

    // Everything else is still written: a larger guarantee reaches the queue.
    Api::<kaccel::api::CreditBudget>::all(client.clone())
        .patch(
            &budget,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({"spec": {"classes": [{"name": class_name, "guaranteedDevices": 6}]}}),
            ),
        )
        .await?;
    let queues: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    support::wait_until(&queues, &cluster_queue, "6 GPUs of quota", WAIT, |q| {
        q["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|r| r["name"] == "nvidia.com/gpu" && r["nominalQuota"] == "6")
    })
    .await?;
    Ok(())
}
