//! Admission latency the credit AdmissionCheck adds (a measurement, not a test):
//! the same Workloads, interleaved, into a kaccel-managed ClusterQueue (with the
//! check, SQLite ledger) and into a plain ClusterQueue of the test's own (no
//! check). Latency = create request sent -> Admitted=True first seen on a watch,
//! in milliseconds. Run by `e2e/bench-ledger.sh`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use futures::StreamExt;
use kaccel::ledger::store::{LedgerStore, Store};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::controller::{Controller, ensure_example_nodes, free_port, wait_for};
use crate::ledger::{self, LedgerTeam, h100_team};
use crate::support::{self, Cleanup, is_true, kueue};

/// Workloads in flight per queue at a time (well inside either queue's quota).
const WAVE: usize = 4;

fn percentile(sorted: &[u128], p: f64) -> u128 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}

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
    ensure_example_nodes(client).await?;
    let id = support::unique("lb");
    let LedgerTeam {
        dir,
        store_url,
        root,
        class,
        ns,
        cq: checked_cq,
        ..
    } = h100_team(client, cleanup, &id, "1000000").await?;
    let plain = format!("plain-{id}");

    // The plain queue: not kaccel's (no managed-by label), no admission checks.
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
                       {"name": "cpu", "nominalQuota": "1000"},
                       {"name": "memory", "nominalQuota": "1000Gi"},
                       {"name": "nvidia.com/gpu", "nominalQuota": "1000"},
                       {"name": "kaccel.io/accelerator", "nominalQuota": "1000"}]}]}]}}),
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

    let controller = Controller::start(
        &id,
        free_port(),
        &format!(
            "rootCohort: {root}\nleaderElection: {{enabled: false}}\nwatchResourceSlices: false\n\
             debounceMs: 100\nmaxDelayMs: 500\nledger:\n  enabled: true\n  store: {store_url}\n  \
             budgetIntervalSeconds: 2\n  retryAfterSeconds: 3\n  postIntervalSeconds: 60\n"
        ),
    );
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
    let watch = {
        let seen = seen.clone();
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
    let mut i = 0;
    while i < n {
        let mut wave = Vec::new();
        for k in 0..WAVE.min(n - i) {
            // Alternate which queue goes first within a pair.
            let order = if (i + k) % 2 == 0 {
                [true, false]
            } else {
                [false, true]
            };
            for checked in order {
                let name = format!("{}-{:03}", if checked { "c" } else { "p" }, i + k);
                let queue = if checked { &class } else { &plain };
                let obj = support::object(workload(&ns, &name, queue, &id));
                let t = Instant::now();
                wls.create(&PostParams::default(), &obj).await?;
                created.insert(name.clone(), (checked, t));
                wave.push(name.clone());
                names.push(name);
            }
        }
        i += WAVE;
        wait_for("the wave admitted", Duration::from_secs(60), || async {
            let s = seen.lock().unwrap();
            Ok(wave.iter().all(|w| s.contains_key(w)).then_some(()))
        })
        .await
        .with_context(|| format!("--- kaccel log:\n{}", controller.log_tail()))?;
        for w in &wave {
            ledger::finish(&wls, w).await?;
        }
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
    let ms = |us: u128| us as f64 / 1000.0;
    let mean = |v: &[u128]| v.iter().sum::<u128>() as f64 / v.len() as f64 / 1000.0;
    println!(
        "MEASURE {n} Workloads per queue, {WAVE} per queue in flight, interleaved; {:.1} s",
        elapsed.as_secs_f64()
    );
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
    Ok(())
}
