//! kaccel at fleet scale (a measurement, not a test: `bash e2e/bench-controller.sh`).
//!
//! The script loads the synthetic Nodes (`kaccel generate-fleet`: 6 vendors, about
//! 8 devices a node) and W inactive Workloads, and waits until Kueue is done with
//! them; this adds 50 classes and 200 budgets (400 namespaces) and one fake
//! dcgm-exporter on loopback per NVIDIA node, up to 500 (polled every 5 s, the
//! default), starts `kaccel run` (release, SQLite ledger on) and prints MEASURE
//! lines:
//! - start -> every planned ClusterQueue written; memory once settled;
//! - a quiet minute: kaccel's writes and re-plans, each exporter's polls and the
//!   longest gap between two polls of one exporter;
//! - Node label changes (an H100 node relabelled as an L40S one and back, as GPU
//!   feature discovery does after a card swap) and device health changes (one GPU
//!   of an exporter's node turns failed): change -> the root Cohort's quota
//!   written (seen on a watch), p50 / p99 / max, each label change also split at
//!   the moment the bench's own Node watch saw it (the control plane's delivery,
//!   then kaccel's part); kaccel's CPU, re-plans and Node reads per change; the
//!   most memory kaccel held while they ran, and after.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::{AcceleratorClass, CreditBudget, synthetic};
use kube::api::{
    Api, DynamicObject, ListParams, PartialObjectMeta, Patch, PatchParams, PostParams,
};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::{Controller, free_port, metric_sum};
use crate::health::{Answer, FakeExporter, dcgm_of};
use crate::support::{self, kueue, percentile};

const ROOT: &str = "fleet-root";
const INTERVAL_SECONDS: u64 = 5;

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn summary(mut ms: Vec<f64>) -> String {
    if ms.is_empty() {
        return "no changes".into();
    }
    ms.sort_by(f64::total_cmp);
    format!(
        "p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (n = {})",
        percentile(&ms, 50.0),
        percentile(&ms, 99.0),
        ms.last().copied().unwrap_or(f64::NAN),
        ms.len()
    )
}

/// utime + stime of a process, in milliseconds (clock ticks of 10 ms).
/// kaccel's reconcile stages in the order they run.
const STAGES: [&str; 7] = [
    "pending", "observe", "plan", "diff", "apply", "nodes", "status",
];

/// Each reconcile stage's (seconds, count) so far, from kaccel's metrics text.
fn stage_totals(metrics: &str) -> BTreeMap<String, (f64, f64)> {
    let mut totals: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("kaccel_reconcile_stage_seconds_") else {
            continue;
        };
        let (is_sum, rest) = match (
            rest.strip_prefix("sum{stage=\""),
            rest.strip_prefix("count{stage=\""),
        ) {
            (Some(r), _) => (true, r),
            (_, Some(r)) => (false, r),
            _ => continue,
        };
        let Some((stage, value)) = rest.split_once("\"} ") else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let entry = totals.entry(stage.to_string()).or_default();
        if is_sum {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    totals
}

/// Mean milliseconds per reconcile of each stage between two metric readings.
fn stage_means(before: &str, after: &str) -> String {
    let (before, after) = (stage_totals(before), stage_totals(after));
    STAGES
        .iter()
        .map(|stage| {
            let (s0, c0) = before.get(*stage).copied().unwrap_or_default();
            let (s1, c1) = after.get(*stage).copied().unwrap_or_default();
            let runs = c1 - c0;
            let mean = if runs > 0.0 {
                (s1 - s0) * 1000.0 / runs
            } else {
                0.0
            };
            format!("{stage} {mean:.1}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn cpu_ms(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at state (3).
    let after = stat.rsplit_once(") ").map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum())
        .unwrap_or(0);
    ticks * 10
}

/// A `/proc/PID/status` figure in KiB.
fn status_kib(pid: u32, name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find(|l| l.starts_with(name))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

fn memory(pid: u32) -> String {
    let field = |name: &str| status_kib(pid, name).map_or(f64::NAN, |kib| kib as f64 / 1024.0);
    // Anonymous memory is the heap and stacks; file-backed is the binary's
    // pages in use, which the kernel may drop and read again.
    format!(
        "VmRSS {:.1} MiB (anonymous {:.1}, file {:.1}), peak VmHWM {:.1} MiB",
        field("VmRSS:"),
        field("RssAnon:"),
        field("RssFile:"),
        field("VmHWM:")
    )
}

/// The root Cohort's spec as a watch delivers it, and the one seen last.
struct CohortWatch {
    rx: tokio::sync::mpsc::UnboundedReceiver<(Instant, Value)>,
    current: Value,
}

impl CohortWatch {
    /// Takes what the watch delivered so far: the last one is current.
    fn drain(&mut self) {
        while let Ok((_, spec)) = self.rx.try_recv() {
            self.current = spec;
        }
    }

    /// When the spec next differs from the current one (which it becomes).
    async fn next_change(&mut self, what: &str) -> Result<Instant> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some((at, spec))) if spec != self.current => {
                    self.current = spec;
                    return Ok(at);
                }
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the Cohort watch ended"),
                Err(_) => bail!("the root Cohort did not change within 30 s after {what}"),
            }
        }
    }

    /// Takes the changes that follow within `quiet` of each other.
    async fn settle(&mut self, quiet: Duration) {
        while let Ok(Some((_, spec))) = tokio::time::timeout(quiet, self.rx.recv()).await {
            self.current = spec;
        }
    }
}

/// Nodes as the bench's own watch delivers them: when the control plane handed a
/// label change on (kaccel's watch is served from the same watch cache), so each
/// change's time splits into the control plane's delivery and kaccel's part after
/// it, in the same run.
struct NodeWatch {
    /// (seen, Node name) for each Node seen carrying every label of `wanted`.
    rx: tokio::sync::mpsc::UnboundedReceiver<(Instant, String)>,
}

impl NodeWatch {
    fn start(client: &Client, wanted: BTreeMap<String, String>) -> Self {
        // Metadata only: the labels are all it reads.
        let nodes: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let watch = watcher(nodes, watcher::Config::default()).applied_objects();
        tokio::spawn(async move {
            let mut watch = std::pin::pin!(watch);
            while let Some(Ok(node)) = watch.next().await {
                let labels = node.labels();
                if wanted.iter().all(|(k, v)| labels.get(k) == Some(v))
                    && tx.send((Instant::now(), node.name_any())).is_err()
                {
                    return;
                }
            }
        });
        NodeWatch { rx }
    }

    /// Forgets what was delivered so far (the initial list, earlier changes).
    fn drain(&mut self) {
        while self.rx.try_recv().is_ok() {}
    }

    /// When `name` was first seen with the wanted labels.
    async fn seen(&mut self, name: &str) -> Result<Instant> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some((at, seen))) if seen == name => return Ok(at),
                Ok(Some(_)) => continue,
                Ok(None) => bail!("the Node watch ended"),
                Err(_) => bail!("Node {name}'s new labels were not seen within 30 s"),
            }
        }
    }
}

#[tokio::test]
#[ignore = "a measurement: bash e2e/bench-controller.sh"]
async fn controller_at_fleet_scale() {
    let _guard = support::serial().await;
    let client = support::client().await;
    bench(&client).await.unwrap();
}

async fn bench(client: &Client) -> Result<()> {
    let classes_wanted = env_or("KACCEL_BENCH_CLASSES", 50);
    let budgets_wanted = env_or("KACCEL_BENCH_BUDGETS", 200);
    let exporters_wanted = env_or("KACCEL_BENCH_EXPORTERS", 500);
    let changes = env_or("KACCEL_BENCH_CHANGES", 50);
    let quiet_seconds = env_or("KACCEL_BENCH_QUIET_SECONDS", 60) as u64;

    let nodes_api: Api<Node> = Api::all(client.clone());
    let nodes = nodes_api.list(&ListParams::default()).await?.items;
    let by_label = |key: &str, value: &str| -> Vec<Node> {
        nodes
            .iter()
            .filter(|n| n.labels().get(key).map(String::as_str) == Some(value))
            .cloned()
            .collect()
    };
    const PRODUCT: &str = "nvidia.com/gpu.product";
    let h100 = by_label(PRODUCT, "NVIDIA-H100-80GB-HBM3");
    let l40s = by_label(PRODUCT, "NVIDIA-L40S");
    if h100.len() < 2 * changes || l40s.is_empty() {
        bail!(
            "the fleet has {} H100 and {} L40S nodes: load more Nodes",
            h100.len(),
            l40s.len()
        );
    }
    println!("MEASURE fleet: {} Nodes", nodes.len());

    // Classes, budgets and their namespaces.
    let classes = synthetic::classes(classes_wanted);
    let budgets = synthetic::budgets(budgets_wanted, classes_wanted);
    let namespaces: Vec<String> = budgets
        .iter()
        .flat_map(|b| b.spec.namespaces.clone())
        .collect();
    let existing: Vec<String> = Api::<k8s_openapi::api::core::v1::Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    futures::stream::iter(namespaces.iter().filter(|n| !existing.contains(n)))
        .map(|ns| support::namespace(client, ns))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let post = PostParams::default();
    let class_api: Api<AcceleratorClass> = Api::all(client.clone());
    futures::stream::iter(classes.iter())
        .map(|c| class_api.create(&post, c))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let budget_api: Api<CreditBudget> = Api::all(client.clone());
    futures::stream::iter(budgets.iter())
        .map(|b| budget_api.create(&post, b))
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    println!(
        "MEASURE objects: {} classes, {} budgets, {} namespaces",
        classes.len(),
        budgets.len(),
        namespaces.len()
    );

    // One exporter per NVIDIA whole-GPU node (H100s not relabelled below, then L40S).
    let watched: Vec<(String, String)> = h100[2 * changes..]
        .iter()
        .chain(l40s.iter())
        .take(exporters_wanted)
        .map(|n| {
            let model = n.labels()[PRODUCT].replace('-', " ");
            (n.name_any(), model)
        })
        .collect();
    let mut exporters = Vec::new();
    for (node, model) in &watched {
        let exporter = FakeExporter::start(Answer::Metrics(dcgm_of(node, model, 8, &[]))).await;
        exporters.push(exporter);
    }
    let mut config = format!(
        "rootCohort: {ROOT}\nleaderElection:\n  enabled: false\nwatchResourceSlices: false\n\
         ledger:\n  enabled: true\n  store: sqlite://{}/ledger.db\n\
         health:\n  sources:\n",
        std::env::temp_dir()
            .join(format!("kaccel-fleet-bench-{}", std::process::id()))
            .display()
    );
    for ((node, _), exporter) in watched.iter().zip(&exporters) {
        config.push_str(&format!(
            "  - name: dcgm-{node}\n    kind: dcgm-exporter\n    url: http://127.0.0.1:{}/metrics\n    node: {node}\n    intervalSeconds: {INTERVAL_SECONDS}\n",
            exporter.port
        ));
    }
    std::fs::create_dir_all(
        std::env::temp_dir().join(format!("kaccel-fleet-bench-{}", std::process::id())),
    )?;
    println!(
        "MEASURE exporters: {} on loopback, polled every {INTERVAL_SECONDS} s",
        exporters.len()
    );

    // The root Cohort, as kaccel writes it, seen on a watch.
    let (cohort_tx, cohort_rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Value)>();
    let cohorts: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("Cohort"));
    let watch = watcher(
        cohorts.clone(),
        watcher::Config::default().fields(&format!("metadata.name={ROOT}")),
    )
    .applied_objects();
    tokio::spawn(async move {
        let mut watch = std::pin::pin!(watch);
        while let Some(Ok(cohort)) = watch.next().await {
            let spec = cohort.data.get("spec").cloned().unwrap_or(Value::Null);
            if cohort_tx.send((Instant::now(), spec)).is_err() {
                return;
            }
        }
    });

    // The Nodes, on a watch of the bench's own, listed now: its first list (5,000
    // Nodes' metadata) is long done before the quiet minute and the changes.
    let l40s_labels: BTreeMap<String, String> = l40s[0]
        .labels()
        .iter()
        .filter(|(k, _)| k.starts_with("nvidia.com/"))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut node_watch = NodeWatch::start(client, l40s_labels.clone());
    node_watch.seen(&l40s[0].name_any()).await?;

    let port = free_port();
    let started = Instant::now();
    let mut kaccel = Controller::start("fleet-bench", port, &config);
    let pid = kaccel.pid();
    let cluster_queues: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let want = budgets.iter().map(|b| b.spec.classes.len()).sum::<usize>();
    let written = loop {
        let n = cluster_queues
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=kaccel"))
            .await?
            .items
            .len();
        if n >= want {
            break started.elapsed();
        }
        if !kaccel.is_running() {
            bail!("kaccel exited; its log:\n{}", kaccel.log_tail());
        }
        if started.elapsed() > Duration::from_secs(300) {
            bail!(
                "{n} of {want} ClusterQueues after 5 minutes; kaccel log:\n{}",
                kaccel.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    println!(
        "MEASURE start -> all {want} ClusterQueues written: {:.1} s",
        written.as_secs_f64()
    );

    // Settled: no write for 10 s (the health's first polls, node actions, budget
    // status), at most 3 minutes.
    let mut last = kaccel.writes().unwrap_or(0);
    let mut calm_since = Instant::now();
    let settle_start = Instant::now();
    while calm_since.elapsed() < Duration::from_secs(10)
        && settle_start.elapsed() < Duration::from_secs(180)
    {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = kaccel.writes().unwrap_or(0);
        if now != last {
            last = now;
            calm_since = Instant::now();
        }
    }
    // Past the allocator's trim (every 30 s).
    tokio::time::sleep(Duration::from_secs(35)).await;
    println!("MEASURE memory settled: {}", memory(pid));

    // A quiet minute.
    let metrics = kaccel.metrics().context("metrics")?;
    let (writes0, replans0) = (
        metric_sum(&metrics, "kaccel_writes_total"),
        metric_sum(&metrics, "kaccel_reconciles_total"),
    );
    let errors0 = metric_sum(&metrics, "kaccel_health_source_errors_total");
    let cpu0 = cpu_ms(pid);
    let window_start = Instant::now();
    tokio::time::sleep(Duration::from_secs(quiet_seconds)).await;
    let window_end = Instant::now();
    let metrics = kaccel.metrics().context("metrics")?;
    let (mut fewest, mut most, mut longest_gap, mut missed) = (usize::MAX, 0, Duration::ZERO, 0);
    for exporter in &exporters {
        let times: Vec<Instant> = exporter
            .requests
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|t| *t >= window_start && *t <= window_end)
            .collect();
        fewest = fewest.min(times.len());
        most = most.max(times.len());
        let mut edges = vec![window_start];
        edges.extend(times);
        edges.push(window_end);
        for pair in edges.windows(2) {
            let gap = pair[1] - pair[0];
            longest_gap = longest_gap.max(gap);
            // A poll is missed when no request came within 1.5 intervals.
            if gap > Duration::from_millis(INTERVAL_SECONDS * 1500) {
                missed += 1;
            }
        }
    }
    println!(
        "MEASURE quiet {quiet_seconds} s: {} writes, {} re-plans, kaccel CPU {} ms; polls per exporter {fewest}..{most} (every {INTERVAL_SECONDS} s: {} expected), longest gap {:.2} s, missed polls {missed}, source errors {}",
        metric_sum(&metrics, "kaccel_writes_total") - writes0,
        metric_sum(&metrics, "kaccel_reconciles_total") - replans0,
        cpu_ms(pid) - cpu0,
        quiet_seconds / INTERVAL_SECONDS,
        longest_gap.as_secs_f64(),
        metric_sum(&metrics, "kaccel_health_source_errors_total") - errors0,
    );

    let mut cohort = CohortWatch {
        rx: cohort_rx,
        current: Value::Null,
    };
    cohort.drain();
    if cohort.current.is_null() {
        bail!("no root Cohort {ROOT} seen");
    }

    // The most memory kaccel held while the changes below ran (sampled every 100 ms).
    let most_rss_kib = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let sampler = {
        let most = most_rss_kib.clone();
        tokio::spawn(async move {
            loop {
                if let Some(kib) = status_kib(pid, "VmRSS:") {
                    most.fetch_max(kib, std::sync::atomic::Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };

    // Node label changes: an H100 node gets an L40S node's GPU labels, then the
    // next one; the nodes relabelled before keep them (each change moves 8 devices).
    node_watch.drain();
    let (cpu0, reads0, replans0, stages0) = {
        let m = kaccel.metrics().context("metrics")?;
        (
            cpu_ms(pid),
            metric_sum(&m, "kaccel_inventory_node_reads"),
            metric_sum(&m, "kaccel_reconciles_total"),
            m,
        )
    };
    // KACCEL_BENCH_PERF=FILE: a CPU profile of kaccel over the label changes.
    let perf = std::env::var("KACCEL_BENCH_PERF").ok().map(|file| {
        std::process::Command::new("perf")
            .args([
                "record",
                "-F",
                "299",
                "--call-graph",
                "dwarf,16384",
                "-o",
                &file,
            ])
            .args(["-p", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("perf starts")
    });
    let mut label_ms = Vec::new();
    let mut delivered_ms = Vec::new();
    let mut after_delivery_ms = Vec::new();
    // Each change's time to quota, what it was and when: the slowest are printed
    // with kaccel's log, whose `kaccel::replan` lines (KACCEL_E2E_RUST_LOG) say
    // which stage held them.
    let mut traced: Vec<(f64, String)> = Vec::new();
    for node in h100.iter().take(changes) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let patch = json!({"metadata": {"labels": l40s_labels}});
        let sent = Instant::now();
        let sent_at = jiff::Timestamp::now();
        nodes_api
            .patch(
                &node.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await?;
        let at = cohort
            .next_change(&format!("relabelling {}", node.name_any()))
            .await?;
        let delivered = node_watch.seen(&node.name_any()).await?;
        let ms = (at - sent).as_secs_f64() * 1000.0;
        let delivery = delivered.saturating_duration_since(sent).as_secs_f64() * 1000.0;
        label_ms.push(ms);
        delivered_ms.push(delivery);
        after_delivery_ms.push(at.saturating_duration_since(delivered).as_secs_f64() * 1000.0);
        traced.push((
            ms,
            format!(
                "{} relabelled at {sent_at}, on the bench's Node watch after {delivery:.1} ms",
                node.name_any()
            ),
        ));
    }
    if let Some(mut perf) = perf {
        let _ = std::process::Command::new("kill")
            .args(["-INT", &perf.id().to_string()])
            .status();
        let _ = perf.wait();
    }
    let m = kaccel.metrics().context("metrics")?;
    println!(
        "MEASURE Node label change -> root Cohort quota written: {}",
        summary(label_ms.clone())
    );
    println!(
        "MEASURE Node label change -> seen on the bench's own Node watch (the control plane's delivery, same run): {}",
        summary(delivered_ms)
    );
    println!(
        "MEASURE Node label change, seen on the bench's watch -> root Cohort quota written (kaccel's part, its write included): {}",
        summary(after_delivery_ms)
    );
    println!(
        "MEASURE per label change: kaccel CPU {:.1} ms, {:.2} re-plans, {:.2} Nodes read",
        (cpu_ms(pid) - cpu0) as f64 / changes as f64,
        (metric_sum(&m, "kaccel_reconciles_total") - replans0) as f64 / changes as f64,
        (metric_sum(&m, "kaccel_inventory_node_reads") - reads0) as f64 / changes as f64,
    );
    println!(
        "MEASURE per label change, kaccel's reconcile stages (mean ms per re-plan; a change reaches its quota after pending..apply): {}",
        stage_means(&stages0, &m)
    );

    // Health changes: one GPU of an exporter's node turns failed (a double-bit
    // ECC error), measured from the first poll that read it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    cohort.drain();
    let (cpu0, replans0, stages0) = {
        let m = kaccel.metrics().context("metrics")?;
        (cpu_ms(pid), metric_sum(&m, "kaccel_reconciles_total"), m)
    };
    let mut health_ms = Vec::new();
    for ((node, model), exporter) in watched.iter().zip(&exporters).take(changes) {
        exporter.set(Answer::Metrics(dcgm_of(node, model, 8, &[0])));
        // A Cohort change seen before the exporter served the failure is not
        // this failure's (the previous one's cordon landing after the settle
        // below, on a small fleet): wait on for the one after it.
        let (at, polled) = loop {
            let at = cohort.next_change(&format!("{node}'s GPU failed")).await?;
            let served = *exporter.first_served.lock().unwrap();
            if let Some(polled) = served.filter(|polled| at >= *polled) {
                break (at, polled);
            }
        };
        let ms = (at - polled).as_secs_f64() * 1000.0;
        health_ms.push(ms);
        let polled_at = jiff::Timestamp::now()
            - jiff::SignedDuration::try_from(polled.elapsed()).unwrap_or_default();
        traced.push((ms, format!("{node}'s GPU failed, polled at {polled_at}")));
        // The failed GPU's node may be cordoned or tainted next (a second quota
        // change for the same failure): let it land before the next change.
        cohort.settle(Duration::from_millis(1500)).await;
    }
    let m = kaccel.metrics().context("metrics")?;
    println!(
        "MEASURE device health change (first poll that read it) -> root Cohort quota written: {}",
        summary(health_ms.clone())
    );
    println!(
        "MEASURE per health change: kaccel CPU {:.1} ms, {:.2} re-plans",
        (cpu_ms(pid) - cpu0) as f64 / changes as f64,
        (metric_sum(&m, "kaccel_reconciles_total") - replans0) as f64 / changes as f64,
    );
    println!(
        "MEASURE per health change, kaccel's reconcile stages (mean ms per re-plan): {}",
        stage_means(&stages0, &m)
    );
    let mut all = label_ms;
    all.extend(health_ms);
    println!("MEASURE all changes -> quota written: {}", summary(all));
    traced.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (ms, what) in traced.iter().take(3) {
        println!("MEASURE slow change: {ms:.1} ms, {what}");
    }
    println!("MEASURE kaccel's log: {}", kaccel.log.display());
    sampler.abort();
    println!(
        "MEASURE memory during the changes: most VmRSS {:.1} MiB",
        most_rss_kib.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1024.0
    );
    // Past the trim that follows the last re-plan.
    tokio::time::sleep(Duration::from_secs(2)).await;
    println!("MEASURE memory at the end: {}", memory(pid));
    for line in m.lines().filter(|l| {
        l.starts_with("kaccel_reconcile_duration_seconds_sum")
            || l.starts_with("kaccel_reconcile_duration_seconds_count")
            || l.starts_with("kaccel_allocator_trim_seconds_sum")
            || l.starts_with("kaccel_allocator_trim_seconds_count")
            || l.starts_with("kaccel_writes_total")
    }) {
        println!("MEASURE metric {line}");
    }
    Ok(())
}
