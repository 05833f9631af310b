//! Health as a trend, against the real control plane: scripted dcgm-exporters whose
//! series change over time (windows scaled down to seconds), `kaccel run` judging
//! them by its trend rules, Kueue quota and Node cordons on the real API server.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::Pod;
use kaccel::api::AcceleratorClass;
use kube::api::{DeleteParams, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use serde_json::json;

use crate::controller::wait_for;
use crate::health::{
    Answer, FakeExporter, Setup, class_devices, dcgm_source, h100_nodes, inventory_at,
    inventory_with_health, node_state, settled, spare_h100, with_health_policy,
};
use crate::support;

/// The default rules' shapes, with windows of seconds instead of minutes and hours.
const RULES: &str = "    trendRules:
      - {name: correctable-ecc-rising, signal: eccCorrectable, function: increase, windowSeconds: 24, threshold: 50, status: Degraded}
      - {name: sustained-heat, signal: temperature, function: durationAbove, above: 85, windowSeconds: 12, threshold: 8, status: Degraded}
      - {name: repeated-resets, signal: resets, function: count, windowSeconds: 60, threshold: 3, status: Failed}
";

/// One scripted GPU.
#[derive(Clone, Copy)]
struct Gpu {
    temperature: f64,
    correctable_ecc: u64,
    recovery_action: u8,
    /// Index into [`Script::pods`] of the pod the exporter says holds it.
    pod: Option<usize>,
}

const CALM: Gpu = Gpu {
    temperature: 41.0,
    correctable_ecc: 0,
    recovery_action: 0,
    pod: None,
};

/// dcgm-exporter's text for `gpus` on `node`, in Kubernetes mode, with the fields
/// the trend rules read (names, types and help as its counters CSV has them).
fn dcgm(node: &str, gpus: &[Gpu], pods: &[(String, String)]) -> String {
    let labels = |i: usize, g: &Gpu| {
        let (ns, pod, container) = match g.pod {
            Some(p) => (pods[p].0.as_str(), pods[p].1.as_str(), "main"),
            None => ("", "", ""),
        };
        format!(
            "gpu=\"{i}\",UUID=\"GPU-{node}-{i:04}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\",DCGM_FI_DRIVER_VERSION=\"550.54.15\",container=\"{container}\",namespace=\"{ns}\",pod=\"{pod}\"",
            0x18 + i
        )
    };
    let mut s = String::new();
    let mut metric = |name: &str, kind: &str, help: &str, value: &dyn Fn(&Gpu) -> String| {
        s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
        for (i, g) in gpus.iter().enumerate() {
            s.push_str(&format!("{name}{{{}}} {}\n", labels(i, g), value(g)));
        }
    };
    metric(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        &|g| g.temperature.to_string(),
    );
    metric(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "counter",
        "Total number of single-bit volatile ECC errors.",
        &|g| g.correctable_ecc.to_string(),
    );
    metric(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "counter",
        "Total number of double-bit volatile ECC errors.",
        &|_| "0".into(),
    );
    metric(
        "DCGM_FI_DEV_XID_ERRORS",
        "gauge",
        "Value of the last XID error encountered.",
        &|_| "0".into(),
    );
    metric(
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "gauge",
        "GPU recovery action.",
        &|g| g.recovery_action.to_string(),
    );
    s
}

/// The scripted state of the exporters: one row of GPUs per H100 node, and the
/// GPUs whose correctable ECC count keeps rising.
struct Script {
    nodes: Vec<(String, Vec<Gpu>)>,
    rising: Vec<(usize, usize)>,
    /// (namespace, pod) the exporters attribute GPUs to.
    pods: Vec<(String, String)>,
}

type Shared = Arc<Mutex<Script>>;

impl Script {
    /// Publish the script every 300 ms (the rising counts +6 each time, i.e.
    /// 20 a second) until the returned handle is dropped.
    fn start(s: &Setup, setup: impl FnOnce(&mut Script)) -> (Shared, AbortOnDrop) {
        let mut script = Script {
            nodes: h100_nodes()
                .into_iter()
                .map(|(n, gpus)| (n, vec![CALM; gpus as usize]))
                .collect(),
            rising: vec![],
            pods: vec![],
        };
        setup(&mut script);
        let shared = Arc::new(Mutex::new(script));
        let exporters: Vec<FakeExporter> = s.exporters.iter().map(|(_, e)| e.clone()).collect();
        let script = shared.clone();
        let task = tokio::spawn(async move {
            loop {
                {
                    let mut sc = script.lock().unwrap();
                    for (n, g) in sc.rising.clone() {
                        sc.nodes[n].1[g].correctable_ecc += 6;
                    }
                    for ((node, gpus), exporter) in sc.nodes.iter().zip(&exporters) {
                        exporter.set(Answer::Metrics(dcgm(node, gpus, &sc.pods)));
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        (shared, AbortOnDrop(task))
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The device's entry in `kaccel inventory --health-from` (the controller's /devices).
async fn device(s: &Setup, node: &str, gpu: usize) -> Result<Value> {
    let inv = inventory_with_health(s).await?;
    let id = format!("GPU-{node}-{gpu:04}");
    Ok(inv["deviceHealth"]["devices"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["device"] == id.as_str())
        .cloned()
        .unwrap_or_default())
}

async fn degraded_message(client: &Client, class: &str) -> Result<String> {
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let c = serde_json::to_value(classes.get(class).await?)?;
    Ok(c["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == "Degraded")
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string())
}

/// Apply `tick` to the script every half second until `done` returns Some, or
/// fail after `limit`.
async fn drive<T>(
    what: &str,
    script: &Shared,
    limit: Duration,
    mut tick: impl FnMut(&mut Script, u32),
    mut done: impl AsyncFnMut() -> Result<Option<T>>,
) -> Result<T> {
    let started = Instant::now();
    let mut step = 0;
    loop {
        tick(&mut script.lock().unwrap(), step);
        if let Some(t) = done().await? {
            eprintln!("{what}: {} ms", started.elapsed().as_millis());
            return Ok(t);
        }
        anyhow::ensure!(started.elapsed() < limit, "timed out waiting for {what}");
        step += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test]
async fn trends_take_cards_out_that_no_single_scrape_would() {
    with_health_policy(2, RULES, trends).await;
}

async fn trends(client: &Client, s: &Setup) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    // GPU 0 of node 0 has a high but flat correctable count.
    let (script, _publishing) = Script::start(s, |sc| {
        sc.nodes[0].1[0].correctable_ecc = 90_000;
    });
    let (n0, n1) = {
        let sc = script.lock().unwrap();
        (sc.nodes[0].0.clone(), sc.nodes[1].0.clone())
    };
    let spare_before = settled(client, s).await?;
    let limit = Duration::from_secs(40);

    // 1. GPU 1's correctable ECC count climbs 20 a second (and keeps climbing):
    //    past 50 within the 24 s window -> Degraded, one device out of quota. GPU 0
    //    stays Healthy.
    let spare_ecc = drive(
        "rising correctable ECC -> quota",
        &script,
        limit,
        |sc, _| sc.rising = vec![(0, 1)],
        async || {
            Ok(spare_h100(client, &s.root)
                .await?
                .filter(|q| *q < spare_before))
        },
    )
    .await?;
    anyhow::ensure!(
        spare_ecc == spare_before - 1,
        "one GPU out: {spare_before} -> {spare_ecc}"
    );
    let rising = device(s, &n0, 1).await?;
    anyhow::ensure!(
        rising["effectiveStatus"] == "Degraded"
            && rising["verdicts"][0]["rule"] == "correctable-ecc-rising"
            && rising["verdicts"][0]["fields"][0] == "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        "the rising GPU and its verdict: {rising}"
    );
    let flat = device(s, &n0, 0).await?;
    anyhow::ensure!(
        flat["effectiveStatus"] == "Healthy",
        "90000 but flat stays Healthy: {flat}"
    );
    let message = degraded_message(client, &s.class).await?;
    anyhow::ensure!(
        message.contains("health trend rules holding: correctable-ecc-rising (1 node)"),
        "class Degraded condition: {message}"
    );

    // 2. One hot sample on GPU 2 (92 °C for one second): Warning at most, never
    //    Degraded, quota unchanged.
    script.lock().unwrap().nodes[0].1[2].temperature = 92.0;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    script.lock().unwrap().nodes[0].1[2].temperature = 41.0;
    let watch_until = Instant::now() + Duration::from_secs(6);
    while Instant::now() < watch_until {
        let hot = device(s, &n0, 2).await?;
        anyhow::ensure!(
            hot["effectiveStatus"] != "Degraded",
            "one hot sample degraded the GPU: {hot}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    anyhow::ensure!(
        spare_h100(client, &s.root).await? == Some(spare_ecc),
        "one hot sample moved the quota"
    );

    // 3. Heat that lasts (scaled: 8 of 12 s above 85 °C) -> Degraded, one more out.
    let spare_heat = drive(
        "sustained heat -> quota",
        &script,
        limit,
        |sc, _| sc.nodes[0].1[2].temperature = 92.0,
        async || {
            Ok(spare_h100(client, &s.root)
                .await?
                .filter(|q| *q < spare_ecc))
        },
    )
    .await?;
    anyhow::ensure!(spare_heat == spare_ecc - 1, "{spare_ecc} -> {spare_heat}");
    let hot = device(s, &n0, 2).await?;
    anyhow::ensure!(
        hot["verdicts"][0]["rule"] == "sustained-heat",
        "the hot GPU's verdict: {hot}"
    );
    let (cordoned0, _) = node_state(&nodes, &n0).await?;
    anyhow::ensure!(!cordoned0, "Degraded GPUs never cordon their node");

    // 4. GPU 0 of node 1 asks for a reset three times (recovery action 0 -> 1,
    //    each held 1.5 s): repeated-resets -> Failed -> the node is cordoned.
    let gpus1 = script.lock().unwrap().nodes[1].1.len() as u64;
    drive(
        "three resets -> cordon",
        &script,
        limit,
        |sc, step| sc.nodes[1].1[0].recovery_action = ((step / 3) % 2) as u8,
        async || Ok(node_state(&nodes, &n1).await?.0.then_some(())),
    )
    .await?;
    let reset = device(s, &n1, 0).await?;
    anyhow::ensure!(
        reset["effectiveStatus"] == "Failed"
            && reset["verdicts"][0]["rule"] == "repeated-resets"
            && reset["verdicts"][0]["fields"][0] == "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        "the resetting GPU: {reset}"
    );
    let spare_reset = wait_for("node 1's GPUs out of quota", limit, || async {
        Ok(spare_h100(client, &s.root)
            .await?
            .filter(|q| *q + gpus1 <= spare_heat))
    })
    .await?;
    eprintln!(
        "MEASURE trends: quota {spare_before} -> {spare_ecc} (ECC) -> {spare_heat} (heat) -> {spare_reset} (resets, node cordoned)"
    );
    let d = class_devices(&Api::all(client.clone()), &s.class).await?;
    anyhow::ensure!(d.failed >= 1 && d.degraded >= 2, "class devices: {d:?}");
    who_holds_a_gpu(client, s, &script, &n0).await
}

/// 5. A Job in the class's queue, admitted by Kueue, its pod made by the Job
///    controller; the exporter attributes GPU 4 of node 0 to that pod: `kaccel
///    inventory` shows the pod, its Workload, ClusterQueue and team.
async fn who_holds_a_gpu(client: &Client, s: &Setup, script: &Shared, n0: &str) -> Result<()> {
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &s.ns, &support::job_ar());
    support::create(
        &jobs,
        support::gpu_job(&s.ns, "finetune", &s.class, "nvidia.com/gpu", 1),
    )
    .await?;
    let result = async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &s.ns);
        let pod = support::job_pod(&pods, "finetune", Duration::from_secs(60)).await?;
        let workload = pod
            .annotations()
            .get("kueue.x-k8s.io/workload")
            .cloned()
            .unwrap_or_default();
        let queue = pod
            .labels()
            .get("kueue.x-k8s.io/cluster-queue-name")
            .cloned()
            .unwrap_or_default();
        anyhow::ensure!(
            !workload.is_empty(),
            "Kueue's annotation on the pod: {:?}",
            pod.metadata
        );
        {
            let mut sc = script.lock().unwrap();
            sc.pods = vec![(s.ns.clone(), pod.name_any())];
            sc.nodes[0].1[4].pod = Some(0);
        }
        let holder = wait_for(
            "GPU 4's holder resolved",
            Duration::from_secs(30),
            || async {
                let d = device(s, n0, 4).await?;
                Ok((d["holder"]["workload"].is_string()).then(|| d["holder"].clone()))
            },
        )
        .await?;
        let cqs: Api<DynamicObject> =
            Api::all_with(client.clone(), &support::kueue("ClusterQueue"));
        let team = cqs
            .get(&queue)
            .await?
            .labels()
            .get("kaccel.io/team")
            .cloned()
            .unwrap_or_default();
        anyhow::ensure!(
            !team.is_empty()
                && holder["namespace"] == s.ns.as_str()
                && holder["pod"] == pod.name_any().as_str()
                && holder["container"] == "main"
                && holder["workload"] == workload.as_str()
                && holder["clusterQueue"] == queue.as_str()
                && holder["team"] == team.as_str(),
            "GPU 4's holder: {holder} (pod's Workload {workload}, queue {queue}, team {team})"
        );
        // The table view names it too.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kaccel"))
            .args([
                "inventory",
                "--health-from",
                &format!("http://127.0.0.1:{}", s.controller.port),
            ])
            .output()
            .await?;
        let table = String::from_utf8_lossy(&out.stdout);
        anyhow::ensure!(
            table.contains(&format!("{}/{} wl={workload}", s.ns, pod.name_any())),
            "kaccel inventory table:\n{table}"
        );
        Ok(())
    }
    .await;
    // The Job goes first (while it exists, Kueue would make it a new Workload),
    // then its Workload: there is no garbage collector here, and an admitted
    // Workload left behind would hold quota in later tests' ClusterQueues.
    support::delete_job(&jobs, "finetune").await?;
    let workloads: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &s.ns, &support::kueue("Workload"));
    for w in workloads.list(&ListParams::default()).await?.items {
        let name = w.name_any();
        let _ = workloads.delete(&name, &DeleteParams::background()).await;
        wait_for(
            "the Job's Workload deleted",
            Duration::from_secs(30),
            || async { Ok(workloads.get_opt(&name).await?.is_none().then_some(())) },
        )
        .await?;
    }
    result
}

#[tokio::test]
async fn the_ledger_names_the_gpus_a_job_held() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    crate::ledger::with_env!("hold", |env| ledger_devices(&mut env, &store).await);
}

/// A Job charged by the ledger; the exporter of its node attributes two GPUs to
/// its pod; when its Workload finishes, the settlement's entries name those GPUs,
/// and `kaccel ledger export` carries them.
async fn ledger_devices(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    let client = env.client.clone();
    let (class, ns) = (format!("h100-{}", env.id), format!("ns-{}", env.id));
    env.class(&class).await?;
    env.budget(&format!("b-{}", env.id), "vision", &ns, &class, "1000000")
        .await?;
    let (node, gpus) = h100_nodes().remove(0);
    let mut row = vec![CALM; gpus as usize];
    let exporter = FakeExporter::start(Answer::Metrics(dcgm(&node, &row, &[]))).await;
    let port = exporter.port;
    env.start_with(store, |config| {
        format!("{config}health:\n  sources:\n{}", dcgm_source(&node, port))
    });
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    support::create(
        &jobs,
        support::gpu_job(&ns, "finetune", &class, "nvidia.com/gpu", 2),
    )
    .await?;
    let result = async {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let wait = Duration::from_secs(60);
        let pod = support::job_pod(&pods, "finetune", wait).await?;
        let workload = pod
            .annotations()
            .get("kueue.x-k8s.io/workload")
            .cloned()
            .unwrap_or_default();
        env.track_workload(&ns, &workload);
        // The exporter says GPUs 2 and 5 run that pod.
        let held = [(ns.clone(), pod.name_any())];
        row[2].pod = Some(0);
        row[5].pod = Some(0);
        exporter.set(Answer::Metrics(dcgm(&node, &row, &held)));
        let port = env.controller().port;
        wait_for(
            "the GPUs' holder resolved",
            Duration::from_secs(30),
            || async {
                // Not answering yet reads as not resolved yet.
                let inv = inventory_at(port).await.unwrap_or_default();
                let resolved = inv["deviceHealth"]["devices"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|d| d["holder"]["workload"] == workload.as_str())
                    .count();
                Ok((resolved == 2).then_some(()))
            },
        )
        .await?;
        let workloads = env.workloads(&ns);
        let wl = workloads.get(&workload).await?;
        let uid = wl.metadata.uid.clone().unwrap_or_default();
        crate::ledger::finish(&workloads, &workload).await?;
        let expected = vec![format!("GPU-{node}-0002"), format!("GPU-{node}-0005")];
        let settled = crate::ledger::posts_of(store, &uid, wait).await?;
        for post in &settled {
            anyhow::ensure!(
                post["devices"] == json!(expected),
                "the Post names the GPUs the pod held: {post}"
            );
        }
        // One card's story: who held it (the ledger), its health now.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kaccel"))
            .args([
                "inventory",
                "--device",
                &expected[0],
                "--health-from",
                &format!("http://127.0.0.1:{port}"),
                "--store",
                store,
                "-o",
                "json",
            ])
            .output()
            .await?;
        let card: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| String::from_utf8_lossy(&out.stderr).to_string())?;
        anyhow::ensure!(
            card["holders"][0]["workload"] == workload.as_str()
                && card["holders"][0]["team"] == "vision"
                && card["holders"][0]["workloadUid"] == uid.as_str()
                && card["health"]["device"] == expected[0].as_str(),
            "kaccel inventory --device: {card}"
        );
        // The CSV export has them in its devices column.
        let csv = crate::ledger::export_table(store, "csv", &[])?;
        let joined = expected.join(" ");
        anyhow::ensure!(
            csv.iter().any(|row| row["kind"].as_deref() == Some("Post")
                && row["devices"].as_deref() == Some(joined.as_str())),
            "CSV export: {csv:?}"
        );
        Ok(())
    }
    .await;
    support::delete_job(&jobs, "finetune").await?;
    result
}
