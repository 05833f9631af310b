//! Admission latency the credit AdmissionCheck adds (a measurement, not a test):
//! the same Workloads, interleaved, into a kaccel-managed ClusterQueue (with the
//! check, SQLite ledger) and into a plain ClusterQueue of the test's own (no
//! check). Latency = create request sent -> Admitted=True first seen on a watch,
//! in milliseconds. Run by `e2e/bench-ledger.sh`.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kaccel::ledger::store::{LedgerStore, Store};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::controller::{Controller, ensure_example_nodes, free_port, wait_for};
use crate::ledger::{self, LedgerTeam, h100_team};
use crate::support::{self, Cleanup, is_true, kueue, percentile};

/// Workloads in flight per queue at a time (well inside either queue's quota).
const WAVE: usize = 4;

fn workload(ns: &str, name: &str, queue: &str, label: &str) -> serde_json::Value {
    let mut w = ledger::workload(ns, name, queue, 600);
    w["metadata"]["labels"] = json!({ "e2e.kaccel.io/bench": label });
    w
}

fn metric_lines(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_owned)
        .collect()
}

/// Measurement: `cargo test --features e2e --test e2e admission_latency -- --ignored --nocapture`
/// (N from `KACCEL_BENCH_WORKLOADS`, default 200 per queue).
#[tokio::test]
#[ignore = "measurement: run through e2e/bench-ledger.sh"]
async fn admission_latency_with_and_without_the_credit_check() {
    let _guard = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = bench(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn bench(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let n: usize = std::env::var("KACCEL_BENCH_WORKLOADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    // Burst: every Workload created at once (KACCEL_BENCH_BURST=1), instead of
    // a few in flight per queue.
    let burst = std::env::var("KACCEL_BENCH_BURST").is_ok_and(|v| !v.is_empty() && v != "0");
    ensure_example_nodes(client).await?;
    let id = support::unique("lb");
    // A burst needs room for all of them at once in both queues: one more
    // (fake) H100 node carrying that many devices, and a guarantee that large.
    let big_node = format!("bench-h100-{id}");
    if burst {
        let nodes: Api<Node> = Api::all(client.clone());
        let mut node = nodes.get("gpu-h100-01").await?;
        node.metadata = ObjectMeta {
            name: Some(big_node.clone()),
            labels: node.metadata.labels.map(|mut labels| {
                labels.insert("kubernetes.io/hostname".into(), big_node.clone());
                labels.insert("nvidia.com/gpu.count".into(), n.to_string());
                labels
            }),
            ..ObjectMeta::default()
        };
        if let Some(status) = node.status.as_mut() {
            let amounts = BTreeMap::from([
                ("cpu".to_string(), Quantity(format!("{}", n + 8))),
                ("memory".to_string(), Quantity(format!("{}Gi", n + 8))),
                ("pods".to_string(), Quantity(format!("{}", n + 8))),
                ("nvidia.com/gpu".to_string(), Quantity(n.to_string())),
            ]);
            status.capacity = Some(amounts.clone());
            status.allocatable = Some(amounts);
        }
        nodes.create(&PostParams::default(), &node).await?;
    }
    let remove_node = |client: Client, name: String| async move {
        let nodes: Api<Node> = Api::all(client);
        let _ = nodes.delete(&name, &DeleteParams::default()).await;
    };
    let LedgerTeam {
        dir,
        store_url,
        root,
        class,
        ns,
        cq: checked_cq,
        ..
    } = h100_team(client, cleanup, &id, "1000000000").await?;
    if burst {
        let budgets: Api<DynamicObject> = Api::all_with(client.clone(), &ledger::budget_ar());
        let patch = json!({"spec": {"classes": [{"name": class, "guaranteedDevices": n}]}});
        budgets
            .patch(
                &format!("team-{id}"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
    }
    let plain = format!("plain-{id}");

    // The plain queue: not kaccel's (no managed-by label), no admission checks;
    // room for all of them at once.
    let room = n.max(1000);
    let rfs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    support::create(
        &rfs,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": plain}, "spec": {}}),
    )
    .await?;
    cleanup.add(None, kueue("ResourceFlavor"), &plain);
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    support::create(
        &cqs,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
               "metadata": {"name": plain},
               "spec": {"namespaceSelector": {}, "resourceGroups": [{
                   // The harness's Kueue also counts nvidia.com/gpu as kaccel.io/accelerator.
                   "coveredResources": ["cpu", "memory", "nvidia.com/gpu", "kaccel.io/accelerator"],
                   "flavors": [{"name": plain, "resources": [
                       {"name": "cpu", "nominalQuota": room.to_string()},
                       {"name": "memory", "nominalQuota": format!("{room}Gi")},
                       {"name": "nvidia.com/gpu", "nominalQuota": room.to_string()},
                       {"name": "kaccel.io/accelerator", "nominalQuota": room.to_string()}]}]}]}}),
    )
    .await?;
    cleanup.add(None, kueue("ClusterQueue"), &plain);
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue"));
    support::create(
        &lqs,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": plain, "namespace": ns},
               "spec": {"clusterQueue": plain}}),
    )
    .await?;
    cleanup.add(Some(&ns), kueue("LocalQueue"), &plain);

    // The Workload webhook as shipped (manifests/webhook.yaml), registered for
    // the bench's namespace, so kaccel's Workloads carry the finalizer from
    // their creation (both queues' Workloads are sent to it);
    // KACCEL_BENCH_WORKLOAD_WEBHOOK=0 measures without it (the check writes
    // the finalizer and record before it answers).
    let workload_webhook =
        std::env::var("KACCEL_BENCH_WORKLOAD_WEBHOOK").map_or(true, |v| v != "0");
    let webhook = if workload_webhook {
        Some(
            crate::class_requests::TestWebhook::register_hooks(
                client,
                cleanup,
                &ns,
                &[crate::class_requests::WORKLOAD_HOOK],
            )
            .await?,
        )
    } else {
        None
    };
    println!("MEASURE Workload webhook registered: {workload_webhook}");
    let controller = Controller::start(
        &id,
        free_port(),
        &format!(
            "rootCohort: {root}\nleaderElection: {{enabled: false}}\nwatchResourceSlices: false\n\
             debounceMs: 100\nmaxDelayMs: 500\nledger:\n  enabled: true\n  store: {store_url}\n  \
             budgetIntervalSeconds: 2\n  retryAfterSeconds: 3\n  postIntervalSeconds: 60\n{}",
            webhook.as_ref().map_or("", |w| w.config.as_str())
        ),
    );
    if let Some(webhook) = &webhook {
        webhook.wait_for_ca_bundle(client).await?;
        // Measured only once kaccel's caches know the queue.
        let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
        let probe = workload(&ns, "probe", &class, &id);
        crate::class_requests::wait_for_workload_finalizer(&wls, &probe).await?;
    }
    for cq in [&checked_cq, &plain] {
        wait_for("ClusterQueue Active", Duration::from_secs(60), || async {
            Ok(cqs
                .get_opt(cq)
                .await?
                .map(|o| serde_json::to_value(o).unwrap_or_default())
                .filter(|o| is_true(o, "Active"))
                .map(|_| ()))
        })
        .await
        .with_context(|| format!("{cq}\n--- kaccel log:\n{}", controller.log_tail()))?;
    }
    let checked_has_check =
        serde_json::to_value(cqs.get(&checked_cq).await?)?["spec"]["admissionChecksStrategy"]
            .to_string();
    println!("MEASURE kaccel queue {checked_cq} admissionChecksStrategy: {checked_has_check}");

    // Watch: the first time each Workload is seen Admitted=True.
    let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
    let seen: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    // Where the checked ones spend it: first seen with quota reserved, with
    // kaccel's check Ready, and (in `seen`) Admitted.
    let phases: Arc<Mutex<HashMap<String, [Option<Instant>; 2]>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let phases = phases.clone();
        let stream = watcher(
            wls.clone(),
            watcher::Config::default().labels(&format!("e2e.kaccel.io/bench={id}")),
        )
        .applied_objects();
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                let Ok(obj) = ev else { continue };
                let v = serde_json::to_value(&obj).unwrap_or_default();
                let now = Instant::now();
                {
                    let mut phases = phases.lock().unwrap();
                    let p = phases.entry(obj.name_any()).or_default();
                    if is_true(&v, "QuotaReserved") {
                        p[0].get_or_insert(now);
                    }
                    if ledger::credit_check(&v).is_some_and(|c| c["state"] == "Ready") {
                        p[1].get_or_insert(now);
                    }
                }
                if is_true(&v, "Admitted") {
                    seen.lock()
                        .unwrap()
                        .entry(obj.name_any())
                        .or_insert_with(Instant::now);
                }
            }
        })
    };
    // Let the watch start before the first create.
    tokio::time::sleep(Duration::from_secs(1)).await;

    let began = Instant::now();
    let mut created: HashMap<String, (bool, Instant)> = HashMap::new();
    let mut names = Vec::new();
    // A wave of pairs (one Workload per queue) is created, admitted and
    // finished before the next; a burst is one wave of all of them, created
    // with as many requests in flight as the client takes.
    let (wave_size, in_flight, wait) = if burst {
        (n, 64, Duration::from_secs(600))
    } else {
        (WAVE, 1, Duration::from_secs(60))
    };
    let mut i = 0;
    while i < n {
        let specs: Vec<(String, bool)> = (i..(i + wave_size).min(n))
            .flat_map(|k| {
                // Alternate which queue goes first within a pair.
                let order = if k % 2 == 0 {
                    [true, false]
                } else {
                    [false, true]
                };
                order.map(|checked| {
                    let name = format!("{}-{:03}", if checked { "c" } else { "p" }, k);
                    (name, checked)
                })
            })
            .collect();
        let results: Vec<Result<(String, bool, Instant)>> = futures::stream::iter(specs)
            .map(|(name, checked)| {
                let wls = wls.clone();
                let queue = if checked {
                    class.clone()
                } else {
                    plain.clone()
                };
                let obj = support::object(workload(&ns, &name, &queue, &id));
                async move {
                    let t = Instant::now();
                    wls.create(&PostParams::default(), &obj).await?;
                    Ok((name, checked, t))
                }
            })
            .buffered(in_flight)
            .collect()
            .await;
        let mut wave = Vec::new();
        for r in results {
            let (name, checked, t) = r?;
            created.insert(name.clone(), (checked, t));
            wave.push(name);
        }
        if burst {
            println!(
                "MEASURE burst: {} Workloads created in {:.1} s",
                wave.len(),
                began.elapsed().as_secs_f64()
            );
        }
        i += wave_size;
        wait_for("the wave admitted", wait, || async {
            let s = seen.lock().unwrap();
            Ok(wave.iter().all(|w| s.contains_key(w)).then_some(()))
        })
        .await
        .with_context(|| format!("--- kaccel log:\n{}", controller.log_tail()))?;
        for w in &wave {
            ledger::finish(&wls, w).await?;
        }
        names.extend(wave);
    }
    let elapsed = began.elapsed();
    watch.abort();

    let seen = seen.lock().unwrap().clone();
    let mut checked_ms = Vec::new();
    let mut plain_ms = Vec::new();
    for (name, (checked, t)) in &created {
        let ms = seen[name].duration_since(*t).as_micros();
        if *checked {
            checked_ms.push(ms);
        } else {
            plain_ms.push(ms);
        }
    }
    checked_ms.sort();
    plain_ms.sort();
    // Admissions per second of each queue: its Workloads over the time from the
    // first create to the last admission.
    let rate = |checked: bool| {
        let mine = created.iter().filter(|(_, (c, _))| *c == checked);
        let first = mine.clone().map(|(_, (_, t))| *t).min();
        let last = mine.map(|(name, _)| seen[name]).max();
        match (first, last) {
            (Some(first), Some(last)) => n as f64 / last.duration_since(first).as_secs_f64(),
            _ => 0.0,
        }
    };
    let ms = |us: u128| us as f64 / 1000.0;
    let mean = |v: &[u128]| v.iter().sum::<u128>() as f64 / v.len() as f64 / 1000.0;
    if burst {
        println!(
            "MEASURE {n} Workloads per queue, all created at once, interleaved; {:.1} s",
            elapsed.as_secs_f64()
        );
    } else {
        println!(
            "MEASURE {n} Workloads per queue, {WAVE} per queue in flight, interleaved; {:.1} s",
            elapsed.as_secs_f64()
        );
    }
    for (what, v) in [
        ("with the credit check   ", &checked_ms),
        ("without (plain queue)   ", &plain_ms),
    ] {
        println!(
            "MEASURE {what}: p50 {:.1} ms, p90 {:.1} ms, p99 {:.1} ms, mean {:.1} ms, min {:.1} ms, max {:.1} ms",
            ms(percentile(v, 50.0)),
            ms(percentile(v, 90.0)),
            ms(percentile(v, 99.0)),
            mean(v),
            ms(v[0]),
            ms(v[v.len() - 1]),
        );
    }
    println!(
        "MEASURE added by the check: p50 +{:.1} ms, p99 +{:.1} ms, mean +{:.1} ms",
        ms(percentile(&checked_ms, 50.0)) - ms(percentile(&plain_ms, 50.0)),
        ms(percentile(&checked_ms, 99.0)) - ms(percentile(&plain_ms, 99.0)),
        mean(&checked_ms) - mean(&plain_ms),
    );
    // The checked Workloads' path in phases (each as first seen on the watch).
    let phases = phases.lock().unwrap().clone();
    let mut to_reserved = Vec::new();
    let mut to_ready = Vec::new();
    let mut to_admitted = Vec::new();
    for (name, (checked, t)) in &created {
        let (Some([Some(reserved), Some(ready)]), true) = (phases.get(name), *checked) else {
            continue;
        };
        to_reserved.push(reserved.duration_since(*t).as_micros());
        to_ready.push(ready.duration_since(*reserved).as_micros());
        to_admitted.push(seen[name].duration_since(*ready).as_micros());
    }
    for (what, v) in [
        ("create -> QuotaReserved", &mut to_reserved),
        ("QuotaReserved -> check Ready", &mut to_ready),
        ("check Ready -> Admitted", &mut to_admitted),
    ] {
        v.sort();
        if !v.is_empty() {
            println!(
                "MEASURE phase of the checked ones, {what}: p50 {:.1} ms, p99 {:.1} ms, mean {:.1} ms",
                ms(percentile(v, 50.0)),
                ms(percentile(v, 99.0)),
                mean(v)
            );
        }
    }
    let (with_rate, without_rate) = (rate(true), rate(false));
    println!(
        "MEASURE admissions per second: with the check {with_rate:.1}/s, without {without_rate:.1}/s, ratio {:.2}x",
        with_rate / without_rate
    );

    // Settle, then the ledger figures.
    let store = Store::open(&store_url).await?;
    wait_for("settled", Duration::from_secs(60), || async {
        let left = wls
            .list(&ListParams::default().labels(&format!("e2e.kaccel.io/bench={id}")))
            .await?
            .items
            .iter()
            .filter(|w| !w.finalizers().is_empty())
            .count();
        let open = store.open_reservations().await?.len();
        Ok((left == 0 && open == 0).then_some(()))
    })
    .await?;
    let metrics = controller.metrics().unwrap_or_default();
    for line in metric_lines(&metrics, "kaccel_ledger_entries")
        .into_iter()
        .chain(metric_lines(
            &metrics,
            "kaccel_admission_check_latency_seconds_sum",
        ))
        .chain(metric_lines(
            &metrics,
            "kaccel_admission_check_latency_seconds_count",
        ))
        .chain(metric_lines(&metrics, "kaccel_admission_check_decisions"))
        .chain(metric_lines(
            &metrics,
            "kaccel_admission_check_answered_unlisted",
        ))
        .chain(
            metric_lines(&metrics, "kaccel_writes_total")
                .into_iter()
                .filter(|l| l.contains("kind=\"Workload\"")),
        )
        .chain(
            metric_lines(&metrics, "kaccel_admission_check_stage_seconds")
                .into_iter()
                .filter(|l| l.contains("_sum") || l.contains("_count")),
        )
    {
        println!("MEASURE metric {line}");
    }
    let report = kaccel::ledger::verify(&store).await?;
    println!(
        "MEASURE ledger: {} entries, {} reservations, {} open, verify {}",
        report.entries,
        report.reservations,
        report.open_reservations,
        if report.ok() { "ok" } else { "FAILED" }
    );
    // Append speed of this SQLite file (synchronous=FULL): re-appending the
    // existing entries is idempotent (duplicates), so time fresh inserts on a copy.
    let copy = dir.join("append-bench.db");
    let bench_store = Store::open(&format!("sqlite:{}", copy.display())).await?;
    let mut entries = Vec::new();
    for name in &names {
        let uid = serde_json::to_value(wls.get(name).await?)?["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for s in store.entries_for_workload(&uid).await? {
            entries.push(s.entry);
        }
    }
    let mut appends = Vec::new();
    for e in &entries {
        let t = Instant::now();
        bench_store.append(std::slice::from_ref(e)).await?;
        appends.push(t.elapsed().as_micros());
    }
    appends.sort();
    if !appends.is_empty() {
        println!(
            "MEASURE SQLite append of one entry ({} appends, synchronous=FULL): p50 {:.2} ms, p99 {:.2} ms",
            appends.len(),
            ms(percentile(&appends, 50.0)),
            ms(percentile(&appends, 99.0)),
        );
    }
    ensure!(report.ok(), "verify: {:?}", report.problems);
    for name in &names {
        wls.delete(name, &DeleteParams::background()).await?;
    }
    drop(controller);
    if burst {
        remove_node(client.clone(), big_node).await;
    }
    Ok(())
}
