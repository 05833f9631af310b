//! Workload churn for the memory soak (a load generator, not a test): Workloads
//! created at a constant rate into a kaccel-managed LocalQueue, each admitted
//! through the credit check, marked Finished, then deleted (kaccel settles it
//! and releases its finalizer). Run by `e2e/bench-memory.sh --soak`, which runs
//! kaccel itself and samples its memory while this runs.
//!
//! Environment: `KACCEL_CHURN_NAMESPACE` and `KACCEL_CHURN_QUEUE` (a LocalQueue
//! with the credit check), `KACCEL_CHURN_RATE` (Workloads per second, default
//! 10), `KACCEL_CHURN_SECONDS` (default 600).
//!
//! One watch over the churn's Workloads tells each life when its Workload is
//! admitted and when it is gone. Polling each one instead (4 GETs a second per
//! Workload in flight) loaded the API server in proportion to the backlog, so a
//! slow minute of Kueue's became a collapse.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use serde_json::json;
use tokio::sync::oneshot;

use crate::ledger;
use crate::support::{self, is_true, kueue};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[derive(Default)]
struct Counts {
    created: AtomicU64,
    admitted: AtomicU64,
    deleted: AtomicU64,
    failed: AtomicU64,
}

/// Load generator: `cargo test --features e2e --test e2e workload_churn -- --ignored --nocapture`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "load generator: run through e2e/bench-memory.sh --soak"]
async fn workload_churn() {
    let namespace: String = env_or("KACCEL_CHURN_NAMESPACE", "vision-research".to_string());
    let queue: String = env_or("KACCEL_CHURN_QUEUE", "large-training".to_string());
    let rate: f64 = env_or("KACCEL_CHURN_RATE", 10.0);
    let seconds: u64 = env_or("KACCEL_CHURN_SECONDS", 600);
    let client = support::client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &kueue("Workload"));
    let counts = Arc::new(Counts::default());
    let waiters = Arc::new(Waiters::default());
    let (listed_tx, listed) = oneshot::channel();
    tokio::spawn(watch_lives(api.clone(), waiters.clone(), listed_tx));
    listed.await.expect("the churn's watch lists");
    let started = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    let mut tasks = tokio::task::JoinSet::new();
    let mut i: u64 = 0;
    while started.elapsed() < Duration::from_secs(seconds) {
        tick.tick().await;
        let name = format!("churn-{}-{i:07}", std::process::id());
        i += 1;
        let (api, queue, task_counts) = (api.clone(), queue.clone(), counts.clone());
        let waiters = waiters.clone();
        tasks.spawn(async move {
            if let Err(e) = one_life(&api, &waiters, &name, &queue, &task_counts).await {
                task_counts.failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("churn {name}: {e:#}");
            }
        });
        while tasks.try_join_next().is_some() {}
        if i.is_multiple_of(600) {
            report(&counts, started);
        }
    }
    while tasks.join_next().await.is_some() {}
    report(&counts, started);
    let failed = counts.failed.load(Ordering::Relaxed);
    assert_eq!(failed, 0, "{failed} Workloads did not complete their life");
}

fn report(counts: &Counts, started: Instant) {
    println!(
        "MEASURE churn t={}s created={} admitted={} deleted={} failed={}",
        started.elapsed().as_secs(),
        counts.created.load(Ordering::Relaxed),
        counts.admitted.load(Ordering::Relaxed),
        counts.deleted.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
    );
}

/// Who waits for what, by Workload name: the watch completes each wait once.
#[derive(Default)]
struct Waiters {
    admitted: Mutex<HashMap<String, oneshot::Sender<()>>>,
    gone: Mutex<HashMap<String, oneshot::Sender<()>>>,
}

impl Waiters {
    fn wait(
        map: &Mutex<HashMap<String, oneshot::Sender<()>>>,
        name: &str,
    ) -> oneshot::Receiver<()> {
        let (tx, rx) = oneshot::channel();
        map.lock().unwrap().insert(name.to_string(), tx);
        rx
    }

    fn complete(map: &Mutex<HashMap<String, oneshot::Sender<()>>>, name: &str) {
        if let Some(tx) = map.lock().unwrap().remove(name) {
            let _ = tx.send(());
        }
    }
}

async fn watch_lives(api: Api<DynamicObject>, waiters: Arc<Waiters>, listed: oneshot::Sender<()>) {
    let mut listed = Some(listed);
    let config = watcher::Config::default().labels("bench.kaccel.io/churn=yes");
    let mut events = watcher(api, config).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(w) | watcher::Event::InitApply(w)) => {
                let v = serde_json::to_value(&w).unwrap_or_default();
                if through_the_check(&v) {
                    Waiters::complete(&waiters.admitted, &w.metadata.name.unwrap_or_default());
                }
            }
            Ok(watcher::Event::Delete(w)) => {
                Waiters::complete(&waiters.gone, &w.metadata.name.unwrap_or_default());
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(tx) = listed.take() {
                    let _ = tx.send(());
                }
            }
            Ok(watcher::Event::Init) => {}
            // The watcher re-lists by itself after an error.
            Err(e) => eprintln!("churn watch: {e}"),
        }
    }
}

/// Through the credit check: kaccel reserved the credits and set its check Ready
/// on the quota Kueue reserved. Kueue's own Admitted flag follows from its
/// workload reconciler, which lags by minutes while it works through a fresh
/// history of 20,000 Workloads on 2 cores: waiting for it would measure Kueue.
fn through_the_check(v: &serde_json::Value) -> bool {
    is_true(v, "Admitted") || (is_true(v, "QuotaReserved") && check_ready(v))
}

/// Waits for the watch to complete `wait`; at the deadline, asks the API server
/// once (`settled`), in case the watch missed the event across a re-list.
async fn wait_or_ask<F, Fut>(wait: oneshot::Receiver<()>, settled: F) -> Result<()>
where
    F: FnOnce() -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    match tokio::time::timeout(Duration::from_secs(120), wait).await {
        Ok(Ok(())) => Ok(()),
        _ => settled().await,
    }
}

/// Create -> Admitted (through the credit check) -> Finished -> deleted and gone.
async fn one_life(
    api: &Api<DynamicObject>,
    waiters: &Waiters,
    name: &str,
    queue: &str,
    counts: &Counts,
) -> Result<()> {
    let ns = api.namespace().unwrap_or_default().to_string();
    let mut w = ledger::workload(&ns, name, queue, 600);
    w["metadata"]["labels"] = json!({"bench.kaccel.io/churn": "yes"});
    let w: DynamicObject = serde_json::from_value(w)?;
    let admitted = Waiters::wait(&waiters.admitted, name);
    api.create(&PostParams::default(), &w)
        .await
        .context("create")?;
    counts.created.fetch_add(1, Ordering::Relaxed);
    wait_or_ask(admitted, || async {
        let now = serde_json::to_value(api.get(name).await.context("get")?)?;
        if !through_the_check(&now) {
            bail!("not admitted within 120 s: {}", now["status"]);
        }
        Ok(())
    })
    .await?;
    counts.admitted.fetch_add(1, Ordering::Relaxed);
    let finished = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": ns},
        "status": {"conditions": [{
            "type": "Finished", "status": "True", "reason": "Succeeded",
            "message": "churn", "lastTransitionTime": jiff::Timestamp::now().round(jiff::Unit::Second)?.to_string(),
        }]},
    });
    api.patch_status(
        name,
        &PatchParams::apply("kaccel-bench-churn").force(),
        &Patch::Apply(&finished),
    )
    .await
    .context("mark Finished")?;
    let gone = Waiters::wait(&waiters.gone, name);
    api.delete(name, &DeleteParams::default())
        .await
        .context("delete")?;
    wait_or_ask(gone, || async {
        if api.get_opt(name).await.context("get")?.is_some() {
            bail!("still there 120 s after deletion (kaccel's finalizer not released)");
        }
        Ok(())
    })
    .await?;
    counts.deleted.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// kaccel's credit check on the Workload is Ready.
fn check_ready(v: &serde_json::Value) -> bool {
    v.pointer("/status/admissionChecks")
        .and_then(serde_json::Value::as_array)
        .is_some_and(|checks| {
            checks
                .iter()
                .any(|c| c["name"] == ledger::CHECK && c["state"] == "Ready")
        })
}
