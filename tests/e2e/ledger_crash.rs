//! Crash safety of the credit ledger: `kaccel run` is SIGKILLed at random points
//! (and restarted each time) while 200 Workloads go through admission, eviction,
//! re-admission and completion. Once it runs undisturbed, the ledger must hold
//! exactly what a run without kills records for the same Kueue history.
//!
//! The same run with the control plane failing instead: kube-apiserver, etcd and
//! the Kueue manager SIGKILLed and restarted (`e2e/cluster.sh restart`) while one
//! kaccel runs on, never restarted. After each restart a probe Workload measures
//! the recovery: from the component serving again to the probe admitted through
//! kaccel's credit check (kaccel's watches resumed, Kueue and kaccel both acting).

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use kaccel::inventory::synthetic::SplitMix64;
use kaccel::ledger::store::{LedgerStore, Store};
use kaccel::ledger::{EntryKind, Rate, cumulative};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::{Controller, ensure_example_nodes, free_port, wait_for};
use crate::ledger::{self, FINALIZER, LedgerTeam, h100_team, ledger_config};
use crate::support::{self, Cleanup, condition, is_true, kueue};

/// Reads `kaccel_leader` and `kaccel_writes_total` from two replicas every
/// 200 ms on a thread of its own, until stopped.
struct LeaderSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Leadership>,
}

#[derive(Debug, Default)]
struct Leadership {
    samples: u32,
    /// Samples in which each replica reported leading.
    led: [u32; 2],
    /// Samples in which both did.
    both: u32,
    /// Writes the standby counted while it had never led.
    standby_writes_unled: u64,
    /// Whether each replica led at the last sample.
    last: [bool; 2],
}

impl LeaderSampler {
    fn start(ports: [u16; 2]) -> LeaderSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut seen = Leadership::default();
            let mut standby_led = false;
            while !stopped.load(Ordering::Relaxed) {
                let read = |port: u16| -> (bool, u64) {
                    let text = crate::controller::http_metrics(port).unwrap_or_default();
                    let value = |name: &str| -> u64 {
                        text.lines()
                            .find_map(|l| {
                                l.strip_prefix(name)?.strip_prefix(' ')?.parse::<f64>().ok()
                            })
                            .unwrap_or(0.0) as u64
                    };
                    (
                        value("kaccel_leader") == 1,
                        crate::controller::metric_sum(&text, "kaccel_writes_total"),
                    )
                };
                let (first, _) = read(ports[0]);
                let (second, standby_writes) = read(ports[1]);
                standby_led |= second;
                if !standby_led {
                    seen.standby_writes_unled = seen.standby_writes_unled.max(standby_writes);
                }
                seen.samples += 1;
                seen.led[0] += u32::from(first);
                seen.led[1] += u32::from(second);
                seen.both += u32::from(first && second);
                seen.last = [first, second];
                std::thread::sleep(Duration::from_millis(200));
            }
            seen
        });
        LeaderSampler { stop, thread }
    }

    fn stop(self) -> Leadership {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or_default()
    }
}

const WORKLOADS: usize = 200;
const BATCH: usize = 20;
/// At most this many Workloads in flight (created, not yet finished).
const IN_FLIGHT: usize = 40;
/// Kills at least this many times (`KACCEL_E2E_CRASH_KILLS`, 0 = a control run
/// without kills, which checks the expected figures themselves).
const MIN_KILLS: u32 = 30;
/// 3600 credits per device-hour = 1 credit per device-second, in micro-credits.
const RATE: Rate = Rate(3_600_000_000);

/// Uniform in `[lo, hi]`.
fn range(rng: &mut SplitMix64, lo: u64, hi: u64) -> u64 {
    lo + rng.below(hi - lo + 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    Evicting,
    Finishing,
    Done,
}

/// One admission as Kueue recorded it: QuotaReserved=True time, and the end when
/// it came from a quota release (a finished admission ends at Finished).
#[derive(Clone, Debug, Default)]
struct Admission {
    start: i64,
    released: Option<i64>,
    evicted: Option<i64>,
}

struct Tracked {
    name: String,
    horizon: u64,
    hold: Duration,
    evict_once: bool,
    phase: Phase,
    due: Instant,
    admissions: Vec<Admission>,
    uid: String,
    finished: Option<i64>,
    /// Kueue's deactivation (maximumExecutionTimeSeconds) was already on the
    /// Workload when the test's Finished landed: its eviction time. The test
    /// stamps Finished with the second it prepared the write, so that Finished
    /// can read earlier than an eviction written before it.
    finished_after_eviction: Option<i64>,
    /// The Workload's conditions at the end (for the report of a mismatch).
    conditions: Value,
    /// A probe created after a restart: when Kueue reserved its quota, when it
    /// was admitted (kaccel's check Ready).
    probe: Option<(Restarted, Option<Instant>, Option<Instant>)>,
}

/// What the fault injector does while the Workloads are driven.
#[derive(Clone, Debug)]
enum Faults {
    /// SIGKILL kaccel (and start it again) at least this many times.
    KillKaccel(u32),
    /// Restart these control-plane components in this order; kaccel runs on.
    Restart(Vec<&'static str>),
}

/// One control-plane restart: which component, when it was killed and when it
/// served again (`cluster.sh restart` returned).
#[derive(Clone, Copy, Debug)]
struct Restarted {
    component: &'static str,
    killed_at: Instant,
    ready_at: Instant,
}

/// `KACCEL_E2E_FAULTS` as "component:count,..." (e.g. the long form
/// "kube-apiserver:10,etcd:3,kueue:5"), interleaved: one of each in turn.
fn restart_plan(spec: &str) -> Result<Vec<&'static str>> {
    let mut counts: Vec<(&'static str, u32)> = Vec::new();
    for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
        let (name, count) = part.trim().split_once(':').unwrap_or((part.trim(), "1"));
        let component = ["kube-apiserver", "etcd", "kueue"]
            .into_iter()
            .find(|c| *c == name)
            .with_context(|| {
                format!("KACCEL_E2E_FAULTS: {name:?} is not kube-apiserver, etcd or kueue")
            })?;
        counts.push((
            component,
            count.parse().context("KACCEL_E2E_FAULTS: a count")?,
        ));
    }
    let mut plan = Vec::new();
    while counts.iter().any(|(_, n)| *n > 0) {
        for (component, n) in counts.iter_mut().filter(|(_, n)| *n > 0) {
            plan.push(*component);
            *n -= 1;
        }
    }
    Ok(plan)
}

fn time_of(obj: &Value, type_: &str) -> Option<i64> {
    let t = condition(obj, type_)?["lastTransitionTime"].as_str()?;
    t.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .map(|t| t.as_second())
}

fn is_false(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "False")
}

fn workload(ns: &str, name: &str, queue: &str, label: &str, horizon: u64) -> Value {
    let secs = u32::try_from(horizon).expect("test horizons are small");
    let mut w = ledger::workload(ns, name, queue, secs);
    w["metadata"]["labels"] = json!({ "e2e.kaccel.io/crash": label });
    w
}

#[tokio::test]
async fn sigkill_during_200_workloads_loses_nothing() {
    let min_kills: u32 = std::env::var("KACCEL_E2E_CRASH_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(MIN_KILLS);
    faulted_run("crash", Faults::KillKaccel(min_kills)).await;
}

/// The fast form runs in the suite; `e2e/faults.sh` runs the long form
/// (`KACCEL_E2E_FAULTS=kube-apiserver:10,etcd:3,kueue:5`).
#[tokio::test]
async fn control_plane_restarts_lose_nothing() {
    let spec = std::env::var("KACCEL_E2E_FAULTS")
        .unwrap_or_else(|_| "kube-apiserver:2,etcd:1,kueue:1".into());
    let plan = restart_plan(&spec).unwrap();
    faulted_run("cpfault", Faults::Restart(plan)).await;
}

async fn faulted_run(prefix: &str, faults: Faults) {
    let _guard = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let id = support::unique(prefix);
    let result = crash(&client, &mut cleanup, &id, faults).await;
    if result.is_err() {
        // Whatever is left (a finalizer may keep some: kaccel is gone now).
        let wls: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &format!("ns-{id}"), &kueue("Workload"));
        let _ = wls
            .delete_collection(
                &DeleteParams::background(),
                &ListParams::default().labels(&format!("e2e.kaccel.io/crash={id}")),
            )
            .await;
    }
    cleanup.run(&client).await;
    result.unwrap();
}

/// The test's price of `[from, to)`: every admitted second at [`RATE`] for one
/// device, however long past the horizon (no clip).
fn price_of(from: i64, to: i64) -> Result<i64> {
    let seconds = u64::try_from((to - from).max(0))?;
    Ok(i64::try_from(cumulative(RATE, 1, seconds)?.0)?)
}

async fn crash(client: &Client, cleanup: &mut Cleanup, id: &str, faults: Faults) -> Result<()> {
    let began = Instant::now();
    let seed: u64 = std::env::var("KACCEL_E2E_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    println!("ledger_crash: seed {seed} (rerun with KACCEL_E2E_CRASH_SEED={seed})");
    let mut rng = SplitMix64(seed);
    ensure_example_nodes(client).await?;

    let LedgerTeam {
        store_url,
        root,
        class,
        team,
        ns,
        cq,
        ..
    } = h100_team(client, cleanup, id, "1000000").await?;

    // Control-plane faults: two replicas under leader election (the Lease the
    // manifests grant), so the lease is held through the faults too; a Lease
    // left by an earlier test would only delay the first election.
    let leader_elected = matches!(faults, Faults::Restart(_));
    let mut cfg = ledger_config(&root, &store_url);
    if leader_elected {
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
            Api::namespaced(client.clone(), "kaccel-system");
        if leases.get_opt("kaccel-controller").await?.is_some() {
            leases
                .delete("kaccel-controller", &DeleteParams::default())
                .await?;
        }
        cfg = cfg.replace(
            "leaderElection:\n  enabled: false\n",
            "leaderElection:\n  enabled: true\n  leaseName: kaccel-controller\n  leaseNamespace: kaccel-system\n",
        );
        ensure!(cfg.contains("enabled: true"), "config: {cfg}");
    }
    let restarts = Arc::new(AtomicU32::new(0));
    let start_one = {
        let id = id.to_string();
        let restarts = restarts.clone();
        let cfg = cfg.clone();
        move || {
            let n = restarts.fetch_add(1, Ordering::Relaxed);
            Controller::start(&format!("{id}-{n}"), free_port(), &cfg)
        }
    };
    let controller = Arc::new(Mutex::new(Some(start_one())));

    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let log_tail = |c: &Arc<Mutex<Option<Controller>>>| {
        c.lock()
            .unwrap()
            .as_ref()
            .map(|c| c.log_tail())
            .unwrap_or_default()
    };
    wait_for(
        "the ClusterQueue Active",
        Duration::from_secs(60),
        || async {
            Ok(cqs
                .get_opt(&cq)
                .await?
                .map(|o| serde_json::to_value(o).unwrap_or_default())
                .filter(|o| is_true(o, "Active"))
                .map(|_| ()))
        },
    )
    .await
    .with_context(|| format!("--- kaccel log:\n{}", log_tail(&controller)))?;
    // The standby, once the first replica leads: it must stay a standby (write
    // nothing) unless the leader lets the Lease go, and never lead beside it.
    let standby =
        leader_elected.then(|| Controller::start(&format!("{id}-standby"), free_port(), &cfg));
    let leaders = standby.as_ref().map(|standby| {
        let first = controller.lock().unwrap().as_ref().map(|c| c.port);
        LeaderSampler::start([first.unwrap_or_default(), standby.port])
    });

    // The killer: SIGKILL at random points, restart at once, until told to stop;
    // or the control plane's components, one after the other, kaccel untouched.
    let min_kills = match &faults {
        Faults::KillKaccel(n) => *n,
        Faults::Restart(plan) => plan.len() as u32,
    };
    let stop = Arc::new(AtomicBool::new(min_kills == 0));
    let kills = Arc::new(AtomicU32::new(0));
    let (restarted_tx, mut restarted_rx) = tokio::sync::mpsc::unbounded_channel::<Restarted>();
    let restart_error: Arc<Mutex<Option<String>>> = Arc::default();
    // Probes admitted so far: the next restart waits for the last one, so each
    // recovery is measured on its own, not stacked behind the next restart.
    let probes_admitted = Arc::new(AtomicU32::new(0));
    let killer = {
        let probes_admitted = probes_admitted.clone();
        let stop = stop.clone();
        let kills = kills.clone();
        let controller = controller.clone();
        let mut rng = SplitMix64(rng.next_u64());
        let start_one = start_one.clone();
        let faults = faults.clone();
        let restart_error = restart_error.clone();
        tokio::spawn(async move {
            match faults {
                Faults::KillKaccel(_) => {
                    while !stop.load(Ordering::Relaxed) {
                        tokio::time::sleep(Duration::from_millis(range(&mut rng, 1000, 4000)))
                            .await;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let mut c = controller.lock().unwrap();
                        if let Some(mut old) = c.take() {
                            old.kill();
                        }
                        kills.fetch_add(1, Ordering::Relaxed);
                        *c = Some(start_one());
                    }
                }
                Faults::Restart(plan) => {
                    for (done, component) in plan.into_iter().enumerate() {
                        let recovered = Instant::now() + Duration::from_secs(120);
                        while probes_admitted.load(Ordering::Relaxed) < done as u32
                            && Instant::now() < recovered
                            && !stop.load(Ordering::Relaxed)
                        {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        tokio::time::sleep(Duration::from_millis(range(&mut rng, 1500, 4000)))
                            .await;
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let killed_at = Instant::now();
                        let out = tokio::process::Command::new("bash")
                            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/cluster.sh"))
                            .args(["restart", component])
                            .output()
                            .await;
                        match out {
                            Ok(out) if out.status.success() => {
                                // The probe request first: the driver ends once
                                // every restart is counted and its probe is done.
                                let _ = restarted_tx.send(Restarted {
                                    component,
                                    killed_at,
                                    ready_at: Instant::now(),
                                });
                                kills.fetch_add(1, Ordering::Relaxed);
                            }
                            other => {
                                *restart_error.lock().unwrap() =
                                    Some(format!("cluster.sh restart {component}: {other:?}"));
                                break;
                            }
                        }
                    }
                }
            }
        })
    };
    if matches!(faults, Faults::Restart(_)) {
        ensure!(
            std::env::var_os("KACCEL_E2E_RUN").is_some(),
            "KACCEL_E2E_RUN is unset: the control-plane restarts need the run folder of the cluster (e2e/test.sh exports it)"
        );
    }

    let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
    let mut tracked: Vec<Tracked> = Vec::new();
    let driven = drive(
        &wls,
        &ns,
        &class,
        id,
        &mut rng,
        &mut tracked,
        &kills,
        min_kills,
        &mut restarted_rx,
        &restart_error,
        &probes_admitted,
        // Nothing moves while Kueue itself recovers from an API server restart:
        // after several in a row its client's backoff grew to tens of seconds
        // (the long form saw a new Workload untouched by Kueue for over a minute).
        match faults {
            Faults::KillKaccel(_) => Duration::from_secs(60),
            Faults::Restart(_) => Duration::from_secs(240),
        },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    let _ = killer.await;
    let kills = kills.load(Ordering::Relaxed);
    driven.with_context(|| format!("--- kaccel log:\n{}", log_tail(&controller)))?;
    if matches!(faults, Faults::Restart(_)) {
        let c = controller.lock().unwrap();
        ensure!(
            restarts.load(Ordering::Relaxed) == 1,
            "kaccel was started again during control-plane faults"
        );
        ensure!(c.is_some(), "kaccel is gone after the control-plane faults");
    }
    if let Some(leaders) = leaders {
        let seen = leaders.stop();
        println!(
            "ledger_crash: leadership over {} samples: first replica led {}, standby led {}, both at once {}, standby writes while not leading {}",
            seen.samples, seen.led[0], seen.led[1], seen.both, seen.standby_writes_unled
        );
        ensure!(
            seen.both == 0,
            "two leaders at once in {} samples",
            seen.both
        );
        ensure!(
            seen.standby_writes_unled == 0,
            "the standby wrote {} time(s) while not leading",
            seen.standby_writes_unled
        );
        ensure!(seen.led[0] + seen.led[1] > 0, "no leader seen");
        // Whichever replica leads at the end, one does: a leader that stepped
        // down was replaced, and nothing was restarted.
        ensure!(
            seen.last[0] || seen.last[1],
            "no replica leads after the faults"
        );
    }
    let driven_at = began.elapsed();

    // Undisturbed now: settled means no finalizer left and no open reservation.
    let store = Store::open(&store_url).await?;
    let label = format!("e2e.kaccel.io/crash={id}");
    wait_for("settled", Duration::from_secs(90), || async {
        let left = wls
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .iter()
            .filter(|w| w.finalizers().iter().any(|f| f == FINALIZER))
            .count();
        let open = store
            .open_reservations()
            .await?
            .iter()
            .filter(|r| r.reserve.entry.budget == team)
            .count();
        Ok((left == 0 && open == 0).then_some(()))
    })
    .await
    .with_context(|| format!("--- kaccel log:\n{}", log_tail(&controller)))?;
    // The ledger agrees with Kueue's own counts (nothing open, no usage left).
    let (agrees, report) = ledger::verify_cluster(&store_url, true).await?;
    ensure!(agrees, "kaccel ledger verify --cluster: {report}");
    drop(standby);

    // The expected figures, from Kueue's conditions, before the Workloads go.
    // Per admission: the price, and another the test cannot rule out (below).
    let mut expected: HashMap<String, Vec<(i64, Option<i64>, i64)>> = HashMap::new();
    let mut mismatched_eviction_times = 0;
    for t in &mut tracked {
        let obj = support::get_json(&wls, &t.name).await?;
        t.conditions = obj["status"]["conditions"].clone();
        t.uid = obj["metadata"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        t.finished = time_of(&obj, "Finished");
        let finished = t.finished.context("a driven Workload without Finished")?;
        let deactivated_at = (obj["spec"]["active"] == false && is_true(&obj, "Evicted"))
            .then(|| time_of(&obj, "Evicted"))
            .flatten()
            .filter(|e| t.admissions.last().is_some_and(|a| *e >= a.start));
        let n = t.admissions.len();
        let mut prices = Vec::new();
        for (i, a) in t.admissions.iter().enumerate() {
            // A deactivated admission's charge ends at its eviction (Kueue drops
            // it from its usage then), a finished one at Finished.
            let end = match (a.evicted, a.released) {
                (Some(e), _) => e,
                (None, Some(r)) => r,
                // Kueue deactivated it at its maximumExecutionTimeSeconds while it
                // still held quota (no job integration releases it here): Kueue
                // stopped counting it at that eviction.
                (None, None) if i + 1 == n && deactivated_at.is_some() => {
                    deactivated_at.unwrap_or(finished).min(finished)
                }
                (None, None) if i + 1 == n => finished,
                (None, None) => bail!("{}: admission {} has no end", t.name, i + 1),
            };
            if a.evicted.is_some_and(|e| Some(e) != a.released) {
                mismatched_eviction_times += 1;
            }
            let price_until = |end: i64| price_of(a.start, end);
            // The test's Finished landed after Kueue's deactivation but reads a
            // second earlier (it is stamped when the write is prepared): kaccel
            // that settled at the eviction it saw first charged until the
            // eviction, which is what Kueue counted, and one that saw both
            // charged until Finished. Either is right; nothing else is.
            let also = match (deactivated_at, t.finished_after_eviction) {
                (Some(d), Some(e)) if i + 1 == n && d == e && end < d => Some(price_until(d)?),
                _ => None,
            };
            prices.push((price_until(end)?, also, end));
        }
        expected.insert(t.uid.clone(), prices);
    }

    // Delete the Workloads (no finalizer left, so they go at once).
    for t in &tracked {
        wls.delete(&t.name, &DeleteParams::background()).await?;
    }
    wait_for("Workloads gone", Duration::from_secs(30), || async {
        Ok(wls
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await?;
    // A little time for kaccel to see the deletions (it must write nothing more).
    tokio::time::sleep(Duration::from_secs(2)).await;

    // The ledger.
    let report = kaccel::ledger::verify(&store).await?;
    ensure!(report.ok(), "verify found problems: {:#?}", report.problems);
    let open: Vec<_> = store
        .open_reservations()
        .await?
        .into_iter()
        .filter(|r| r.reserve.entry.budget == team)
        .collect();
    ensure!(open.is_empty(), "open reservations: {open:#?}");
    let mut entries_total = 0usize;
    let mut admissions_total = 0usize;
    let mut expected_total: i128 = 0;
    let mut errors = Vec::new();
    let mut unseen_evictions = 0u32;
    let mut raced_finishes = 0u32;
    let mut restamped = 0u32;
    for t in &tracked {
        let entries = store.entries_for_workload(&t.uid).await?;
        entries_total += entries.len();
        let prices = &expected[&t.uid];
        admissions_total += prices.len();
        let mut per: BTreeMap<u32, (u32, u32, i64, u32)> = BTreeMap::new();
        for s in &entries {
            let e = &s.entry;
            if e.budget != team {
                errors.push(format!(
                    "{}: entry {} of budget {}",
                    t.name, e.key, e.budget
                ));
                continue;
            }
            let slot = per.entry(e.admission).or_default();
            match e.kind {
                EntryKind::Reserve => slot.0 += 1,
                EntryKind::Void => slot.1 += 1,
                EntryKind::Post => {
                    slot.2 += e.credits;
                    slot.3 += 1;
                }
                // Usage posted before kaccel saw an end Kueue stamped earlier,
                // refunded at the settlement.
                EntryKind::Correction
                    if e.reason
                        .starts_with(kaccel::ledger::charge::POSTED_PAST_END) =>
                {
                    slot.2 += e.credits;
                }
                other => errors.push(format!("{}: unexpected {other} entry {}", t.name, e.key)),
            }
        }
        let want: Vec<u32> = (1..=prices.len() as u32).collect();
        let got: Vec<u32> = per.keys().copied().collect();
        if got != want {
            errors.push(format!(
                "{}: ledger admissions {got:?}, Kueue admissions {want:?} ({:?})",
                t.name, t.admissions
            ));
            continue;
        }
        for (a, (price, also, end)) in want.iter().zip(prices) {
            let (reserves, voids, posted, posts) = per[a];
            // An eviction kaccel never saw (its watch down, or the API server's
            // watch cache re-initialising after an etcd or API server restart,
            // while Kueue evicted the Workload and admitted it again, rewriting
            // the Evicted condition) still ends at the eviction: Kueue wrote its
            // time on kaccel's check when it reset it to Pending. Every eviction
            // here is a deactivation, where that is what Kueue counts, so every
            // charge is exact.
            if entries.iter().any(|s| {
                s.entry.admission == *a
                    && s.entry
                        .reason
                        .starts_with("usage until evicted, then re-admitted")
            }) {
                unseen_evictions += 1;
            }
            // Kueue wrote this admission's reservation again, later, after kaccel
            // had posted usage from the time it first showed (Kueue's write
            // landed, its answer lost to an API server restart): the charge keeps
            // that first time (`kaccel::ledger::lifecycle::rebased`); before any
            // post it moves to Kueue's new time, the one priced above.
            let from_first_stamp = entries
                .iter()
                .filter(|s| s.entry.admission == *a && s.entry.kind == EntryKind::Post)
                .map(|s| s.entry.start)
                .min()
                .filter(|first| *first < t.admissions[*a as usize - 1].start)
                .map(|first| price_of(first, *end))
                .transpose()?;
            // One Reserve per reservation term (an admission held past its
            // horizon has its overrun reserved), one Void for its one line.
            let price = if also == &Some(posted) {
                raced_finishes += 1;
                posted
            } else if from_first_stamp == Some(posted) {
                restamped += 1;
                posted
            } else {
                *price
            };
            if reserves < 1 || voids != 1 || posted != price {
                let ledger: Vec<String> = entries
                    .iter()
                    .filter(|s| s.entry.admission == *a)
                    .map(|s| {
                        let e = &s.entry;
                        format!(
                            "{} [{}, {}) {} {:?}",
                            e.kind, e.start, e.end, e.credits, e.reason
                        )
                    })
                    .collect();
                errors.push(format!(
                    "{}: entries {ledger:?}; conditions {}",
                    t.name, t.conditions
                ));
                errors.push(format!(
                    "{} admission {a} (horizon {} s, {:?}, finished {:?}): {reserves} Reserve, {voids} Void, \
                     {posts} Post(s) adding up to {posted} µcredits; expected {price}",
                    t.name,
                    t.horizon,
                    t.admissions[*a as usize - 1],
                    t.finished
                ));
            }
            expected_total += i128::from(price);
        }
    }
    let sums = store.kind_sums(Some(&team)).await?;
    // Spent: posts and the refunds of usage posted past an end.
    let spent = sums
        .get(&team)
        .map(|s| kaccel::ledger::Balances::from_sums(s).spent)
        .unwrap_or(0);
    let evicted = tracked.iter().filter(|t| t.admissions.len() > 1).count();
    println!(
        "ledger_crash: {kills} SIGKILLs ({} starts), {} Workloads ({evicted} evicted and re-admitted), \
         {admissions_total} admissions, {entries_total} Workload entries ({} in the store), \
         {} credits spent (expected {}), quota released in another second than the eviction on {mismatched_eviction_times} admission(s), \
         {raced_finishes} settled at a deactivation the test's Finished landed after; \
         {restamped} charged from a reservation time Kueue wrote again; \
         driven in {:.1} s, total {:.1} s",
        restarts.load(Ordering::Relaxed),
        tracked.len(),
        report.entries,
        kaccel::ledger::entry::format_micros(spent),
        kaccel::ledger::entry::format_micros(expected_total),
        driven_at.as_secs_f64(),
        began.elapsed().as_secs_f64(),
    );
    ensure!(
        errors.is_empty(),
        "{} mismatch(es):\n{}",
        errors.len(),
        errors.join("\n")
    );
    println!(
        "MEASURE evictions kaccel never saw (Kueue evicted and re-admitted while its watch was down), ended at the eviction Kueue wrote on kaccel's check: {unseen_evictions}"
    );
    ensure!(
        spent == expected_total,
        "spent {spent} µcredits, expected {expected_total}"
    );
    // Per probe: (component, serving again -> quota reserved by Kueue, -> admitted
    // through kaccel's check, kill -> admitted).
    let probes: Vec<(&str, Duration, Duration, Duration)> = tracked
        .iter()
        .filter_map(|t| t.probe)
        .map(|(r, reserved, admitted)| {
            let (reserved, admitted) = (reserved?, admitted?);
            Some((
                r.component,
                reserved.saturating_duration_since(r.ready_at),
                admitted - r.ready_at,
                admitted - r.killed_at,
            ))
        })
        .collect::<Option<_>>()
        .context("a probe Workload never admitted")?;
    for component in ["kube-apiserver", "etcd", "kueue"] {
        let of = |pick: fn(&(&str, Duration, Duration, Duration)) -> Duration| {
            let mut v: Vec<Duration> = probes
                .iter()
                .filter(|p| p.0 == component)
                .map(pick)
                .collect();
            v.sort();
            v
        };
        let (reserved, admitted, outage) = (of(|p| p.1), of(|p| p.2), of(|p| p.3));
        if admitted.is_empty() {
            continue;
        }
        // p50: the lower median; max: the worst restart.
        let show = |v: &[Duration]| {
            format!(
                "p50 {} ms / max {} ms",
                v[(v.len() - 1) / 2].as_millis(),
                v[v.len() - 1].as_millis()
            )
        };
        println!(
            "MEASURE {component} restarted {} time(s): serving again -> a new Workload's quota reserved by Kueue {}, -> admitted through kaccel's check {}; kill -> admitted {}",
            admitted.len(),
            show(&reserved),
            show(&admitted),
            show(&outage),
        );
    }
    ensure!(
        tracked.len() == WORKLOADS + probes.len(),
        "{} Workloads driven ({} probes)",
        tracked.len(),
        probes.len()
    );
    ensure!(kills >= min_kills, "only {kills} kills");
    if let Some(mut c) = controller.lock().unwrap().take() {
        c.kill();
    }
    Ok(())
}

/// Creates the Workloads in batches and drives each through its life; returns
/// once every one is Finished and at least `min_kills` kills happened.
#[allow(clippy::too_many_arguments)]
async fn drive(
    wls: &Api<DynamicObject>,
    ns: &str,
    queue: &str,
    label: &str,
    rng: &mut SplitMix64,
    tracked: &mut Vec<Tracked>,
    kills: &AtomicU32,
    min_kills: u32,
    restarted: &mut tokio::sync::mpsc::UnboundedReceiver<Restarted>,
    restart_error: &Mutex<Option<String>>,
    probes_admitted: &AtomicU32,
    stall_limit: Duration,
) -> Result<()> {
    // Each control-plane restart stalls everything for a few seconds.
    let deadline =
        Instant::now() + Duration::from_secs(200) + Duration::from_secs(30) * min_kills.min(40);
    let mut last_progress = Instant::now();
    // While the API server (or Kueue's webhooks) is down a call fails: the loop
    // retries it on its next pass, the state it drives from being unchanged.
    let mut failing_since: Option<Instant> = None;
    let mut pending_probes: Vec<Restarted> = Vec::new();
    let mut probes = 0usize;
    loop {
        if let Some(error) = restart_error.lock().unwrap().clone() {
            bail!("{error}");
        }
        while let Ok(r) = restarted.try_recv() {
            pending_probes.push(r);
        }
        // A probe per restart: admitted only once Kueue and kaccel both act again.
        while let Some(r) = pending_probes.first().copied() {
            let name = format!("p{probes:02}-{}", r.component);
            let Some(mut probe) =
                create_tracked(wls, (ns, queue, label), name, 600, Duration::ZERO, false).await
            else {
                break;
            };
            probe.probe = Some((r, None, None));
            pending_probes.remove(0);
            probes += 1;
            tracked.push(probe);
        }
        // New batch while few are in flight.
        let in_flight = tracked.iter().filter(|t| t.phase != Phase::Done).count();
        let regular = tracked.iter().filter(|t| t.probe.is_none()).count();
        if regular < WORKLOADS && in_flight + BATCH <= IN_FLIGHT {
            for _ in 0..BATCH.min(WORKLOADS - regular) {
                let i = tracked.iter().filter(|t| t.probe.is_none()).count();
                let name = format!("w{i:03}");
                // Horizons: some far, some a few seconds (renewed or overrun, or
                // ended by Kueue's maximumExecutionTimeSeconds).
                let evict_once = i % 5 == 4;
                let horizon = if evict_once {
                    600
                } else {
                    [2, 3, 4, 6, 600][range(rng, 0, 4) as usize]
                };
                let hold = Duration::from_millis(range(rng, 0, 4500));
                let Some(created) =
                    create_tracked(wls, (ns, queue, label), name, horizon, hold, evict_once).await
                else {
                    break;
                };
                tracked.push(created);
            }
        }
        let listed = wls
            .list(&ListParams::default().labels(&format!("e2e.kaccel.io/crash={label}")))
            .await;
        let objects: HashMap<String, Value> = match listed {
            Ok(list) => {
                failing_since = None;
                list.items
                    .into_iter()
                    .map(|o| (o.name_any(), serde_json::to_value(o).unwrap_or_default()))
                    .collect()
            }
            Err(e) => {
                let since = *failing_since.get_or_insert_with(Instant::now);
                ensure!(
                    since.elapsed() < Duration::from_secs(120),
                    "the API server has not answered for 2 minutes: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
                continue;
            }
        };
        let now = Instant::now();
        for t in tracked.iter_mut() {
            let Some(obj) = objects.get(&t.name) else {
                continue;
            };
            let before = t.phase;
            match t.phase {
                Phase::Queued => {
                    if let Some((_, reserved @ None, _)) = &mut t.probe
                        && is_true(obj, "QuotaReserved")
                    {
                        *reserved = Some(now);
                    }
                    if is_true(obj, "QuotaReserved") && is_true(obj, "Admitted") {
                        let start = time_of(obj, "QuotaReserved").context("QuotaReserved time")?;
                        t.admissions.push(Admission {
                            start,
                            ..Default::default()
                        });
                        t.phase = Phase::Running;
                        t.due = now + t.hold;
                        if let Some((_, reserved, admitted)) = &mut t.probe {
                            reserved.get_or_insert(now);
                            *admitted = Some(now);
                            probes_admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Phase::Running => {
                    if is_true(obj, "Finished") {
                        // A finish whose answer was lost to a restart (the write
                        // went through): writing it again would be refused.
                        t.phase = Phase::Finishing;
                    } else if is_false(obj, "QuotaReserved") {
                        // Kueue ended it (maximumExecutionTimeSeconds): the quota
                        // release ends the admission; finish it for the finalizer.
                        if ledger::finish(wls, &t.name).await.is_err() {
                            continue;
                        }
                        let a = t.admissions.last_mut().unwrap();
                        a.released = time_of(obj, "QuotaReserved");
                        a.evicted = time_of(obj, "Evicted");
                        t.phase = Phase::Finishing;
                    } else if now >= t.due {
                        if t.evict_once && t.admissions.len() == 1 {
                            if !set_active(wls, &t.name, false).await {
                                continue;
                            }
                            t.phase = Phase::Evicting;
                        } else {
                            let Ok((_, written)) = ledger::finish_returning(wls, &t.name).await
                            else {
                                continue;
                            };
                            t.finished_after_eviction = (written["spec"]["active"] == false
                                && is_true(&written, "Evicted"))
                            .then(|| time_of(&written, "Evicted"))
                            .flatten();
                            t.phase = Phase::Finishing;
                        }
                    }
                }
                Phase::Evicting => {
                    if is_true(obj, "Evicted") && is_true(obj, "QuotaReserved") {
                        // There is no job controller here: do its part of an
                        // eviction (the job stopped, so the quota is released).
                        let _ = support::release_quota(wls, &t.name, obj).await;
                    } else if is_false(obj, "QuotaReserved") {
                        if !set_active(wls, &t.name, true).await {
                            continue;
                        }
                        let a = t.admissions.last_mut().unwrap();
                        a.released = time_of(obj, "QuotaReserved");
                        a.evicted = time_of(obj, "Evicted");
                        t.phase = Phase::Queued;
                    }
                }
                Phase::Finishing => {
                    if is_true(obj, "Finished") {
                        t.phase = Phase::Done;
                    }
                }
                Phase::Done => {}
            }
            if t.phase != before {
                last_progress = now;
            }
        }
        let done = tracked.iter().filter(|t| t.phase == Phase::Done).count();
        if done == WORKLOADS + probes
            && pending_probes.is_empty()
            && kills.load(Ordering::Relaxed) >= min_kills
        {
            return Ok(());
        }
        if Instant::now() > deadline || last_progress.elapsed() > stall_limit {
            let stuck: Vec<String> = tracked
                .iter()
                .filter(|t| t.phase != Phase::Done)
                .take(5)
                .map(|t| {
                    format!(
                        "{} {:?}: {}",
                        t.name,
                        t.phase,
                        objects
                            .get(&t.name)
                            .map(|o| o["status"].to_string())
                            .unwrap_or_default()
                    )
                })
                .collect();
            bail!(
                "{done}/{WORKLOADS} Workloads (+ {probes} probes) done ({} created, {} kills or restarts) when time ran out; stuck:\n{}",
                tracked.len(),
                kills.load(Ordering::Relaxed),
                stuck.join("\n")
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Deactivates or reactivates a Workload; false when the API server did not take
/// it (down mid-restart): the driver tries again on its next pass.
async fn set_active(wls: &Api<DynamicObject>, name: &str, active: bool) -> bool {
    wls.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"active": active}})),
    )
    .await
    .is_ok()
}

/// Creates Workload `name` in `(namespace, queue, label)` and its tracking entry;
/// None when the API server did not take it (the driver tries again next pass).
/// A create whose answer was lost comes back as AlreadyExists: it was created.
async fn create_tracked(
    wls: &Api<DynamicObject>,
    (ns, queue, label): (&str, &str, &str),
    name: String,
    horizon: u64,
    hold: Duration,
    evict_once: bool,
) -> Option<Tracked> {
    let obj = workload(ns, &name, queue, label, horizon);
    match wls
        .create(&PostParams::default(), &support::object(obj))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(_) => return None,
    }
    Some(Tracked {
        name,
        horizon,
        hold,
        evict_once,
        phase: Phase::Queued,
        due: Instant::now(),
        admissions: Vec::new(),
        uid: String::new(),
        finished: None,
        finished_after_eviction: None,
        conditions: Value::Null,
        probe: None,
    })
}
