//! What Kueue does with the objects kaccel writes, end to end: `kaccel run` with
//! the ledger on (SQLite) against the real kube-apiserver + Kueue, short
//! intervals. Cohort borrowing and reclaim, fair sharing by team weight, drift
//! between the ledger and Kueue, partition / time-share / whole-card flavors with
//! their own rates, and `HoldAndDrain` at exhaustion.
//!
//! Workloads are created directly; the test does what a job integration would:
//! it finishes them (`Finished`) and releases the quota of evicted ones
//! (`support::release_quota`). Figures are asserted per Workload and per flavor
//! through `kaccel ledger export`/`verify`, and against Kueue's status.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kube::api::{Api, DynamicObject};
use serde_json::{Value, json};

use crate::controller::{cq_flavors, metric_sum, wait_for};
use crate::ledger::{
    Env, MICROS, WAIT, admitted, balances, check_message, device_workload, expect, export, figures,
    finish, kind_sums, sqlite, top_up, transition, verify, verify_cluster, wait_figures, with_env,
    workload_entries,
};
use crate::support::{self, condition, is_true};

/// kaccel's budget pass interval in these tests (`ledger_config`).
const BUDGET_INTERVAL: Duration = Duration::from_secs(2);

/// Runs `body(&mut env, store)` on a SQLite ledger of its own.
macro_rules! on_sqlite {
    ($prefix:expr, $body:ident) => {{
        let dir = tempfile::tempdir().unwrap();
        let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
        with_env!($prefix, |env| $body(&mut env, &store).await);
    }};
}

/// A CreditBudget: `classes` as (name, guaranteed devices), `extra` merged into
/// the spec (weights, exhaustion and admission policies).
fn budget(name: &str, ns: &str, classes: &[(&str, u32)], per_period: &str, extra: Value) -> Value {
    let mut b = json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": { "name": name },
        "spec": {
            "team": "e2e", "namespaces": [ns],
            "classes": classes.iter().map(|(c, g)| json!({"name": c, "guaranteedDevices": g})).collect::<Vec<_>>(),
            "credits": { "perPeriod": per_period, "period": { "start": "2026-12-01T00:00:00Z", "days": 30 } }
        }
    });
    if let (Some(spec), Some(more)) = (b["spec"].as_object_mut(), extra.as_object()) {
        spec.extend(more.clone());
    }
    b
}

fn class(name: &str, sharing: &str, selector: Value, per_device_hour: &str) -> Value {
    json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": name },
        "spec": { "sharing": sharing, "selector": selector,
                  "credits": { "perDeviceHour": per_device_hour } }
    })
}

fn uid(wl: &Value) -> String {
    wl["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// The flavor Kueue admitted the Workload's device `resource` onto.
fn admitted_flavor(wl: &Value, resource: &str) -> String {
    wl.pointer("/status/admission/podSetAssignments/0/flavors")
        .and_then(|f| f.get(resource))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Nominal quota of `resource` for `flavor` in a ClusterQueue spec (0 if absent).
fn nominal(cq: &Value, flavor: &str, resource: &str) -> u64 {
    cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
        .filter(|f| f["name"] == flavor)
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .filter(|r| r["name"] == resource)
        .filter_map(|r| r["nominalQuota"].as_str()?.parse::<u64>().ok())
        .sum()
}

/// Device units Kueue holds for a ClusterQueue (`status.flavorsReservation`), per flavor.
fn reserved_units(cq: &Value, resource: &str) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for f in cq["status"]["flavorsReservation"]
        .as_array()
        .into_iter()
        .flatten()
    {
        for r in f["resources"].as_array().into_iter().flatten() {
            if r["name"] == resource
                && let Some(n) = r["total"].as_str().and_then(|t| t.parse::<u64>().ok())
                && n > 0
            {
                *out.entry(f["name"].as_str().unwrap_or_default().to_string())
                    .or_default() += n;
            }
        }
    }
    out
}

/// Whether Kueue holds quota for the Workload right now.
fn holds_quota(wl: &Value) -> bool {
    is_true(wl, "QuotaReserved")
}

/// Micro-credits of `kind` entries per flavor, from an export.
fn per_flavor(entries: &[Value], kind: &str) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for e in entries.iter().filter(|e| e["kind"] == kind) {
        *out.entry(e["flavor"].as_str().unwrap_or_default().to_string())
            .or_default() += e["credits"].as_i64().unwrap_or_default();
    }
    out
}

/// `kaccel ledger verify --cluster` passes; returns its report.
async fn ledger_agrees_with_kueue(store: &str) -> Result<String> {
    let (ok, report) = verify_cluster(store, true).await?;
    ensure!(ok, "ledger verify --cluster failed:\n{report}");
    Ok(report)
}

/// The budget's status figures equal what its entries add up to.
/// The budget's status shows what its entries add up to. The status is written by
/// the budget pass (woken by appends, at most once a second, and every
/// `budgetIntervalSeconds`), so it may trail the last append by a pass: it must
/// catch up within WAIT, entries and status read again each time.
async fn figures_match_entries(env: &Env, store: &str, name: &str) -> Result<()> {
    let deadline = Instant::now() + WAIT;
    loop {
        let entries: Vec<Value> = export(store, Some(name))?;
        let b = env.budgets.get(name).await?.data;
        if balances(&entries)? == figures(&b) {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "budget {name}: status {:?}, entries {:?} after {WAIT:?}",
            figures(&b),
            kind_sums(&entries)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---------------------------------------------------------------------------
// Drift: the ledger loses an entry behind kaccel's back.

#[tokio::test]
async fn drift_between_ledger_and_kueue_is_reported() {
    on_sqlite!("kdrift", drift);
}

async fn drift(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (name, ns) = (format!("drift-{id}"), format!("drift-{id}"));
    env.class(&class).await?;
    env.create_budget(budget(&name, &ns, &[(&class, 8)], "1000", json!({})))
        .await?;
    env.start(store);
    let wls = env.workloads(&ns);
    env.workload(&ns, "w1", &class, 60).await?;
    let w1 = support::wait_until(&wls, "w1", "admitted", WAIT, admitted).await?;
    wait_figures(&env.budgets, &name, expect(1000, 60, 0)).await?;
    let in_sync = |b: &Value| condition(b, "LedgerInSync").is_some_and(|c| c["status"] == "True");
    support::wait_until(&env.budgets, &name, "LedgerInSync=True", WAIT, in_sync).await?;
    ledger_agrees_with_kueue(store).await?;

    // The Reserve entry of W1 disappears from the store (kept aside to put back).
    let db = std::path::PathBuf::from(store.strip_prefix("sqlite:").context("a SQLite store")?);
    let aside = db.with_file_name("aside.db");
    let row = sqlite(
        &db,
        &format!(
            "SELECT id FROM entries WHERE kind = 'Reserve' AND workload_uid = '{}'",
            uid(&w1)
        ),
    )?;
    ensure!(
        !row.is_empty() && !row.contains('\n'),
        "Reserve rows of W1: {row:?}"
    );
    sqlite(
        &db,
        &format!(
            "ATTACH '{}' AS aside; CREATE TABLE aside.saved AS SELECT * FROM entries WHERE id = {row}; \
             DELETE FROM entries WHERE id = {row};",
            aside.display()
        ),
    )?;
    let removed = Instant::now();
    let b = support::wait_until(&env.budgets, &name, "LedgerInSync=False", WAIT, |b| {
        condition(b, "LedgerInSync").is_some_and(|c| c["status"] == "False")
    })
    .await?;
    let detected = removed.elapsed();
    let c = condition(&b, "LedgerInSync").unwrap();
    let message = c["message"].as_str().unwrap_or_default();
    eprintln!(
        "MEASURE drift (Reserve entry removed) -> LedgerInSync=False in {} ms (budget pass every {} s): {message}",
        detected.as_millis(),
        BUDGET_INTERVAL.as_secs()
    );
    ensure!(c["reason"] == "Drift", "{c}");
    ensure!(message.contains(&format!("Workload {ns}/w1")), "{message}");
    // A finding must persist over two passes before kaccel reports it (Kueue's
    // status can lag a pass), so detection takes up to two intervals, plus the write.
    ensure!(
        detected <= BUDGET_INTERVAL * 2 + Duration::from_secs(3),
        "drift reported after {detected:?}"
    );
    let controller = env.controller();
    let drift_metric = wait_for("kaccel_ledger_drift > 0", WAIT, || async {
        let text = controller.metrics().unwrap_or_default();
        let mine: String = text
            .lines()
            .filter(|l| l.contains(&format!("budget=\"{name}\"")))
            .map(|l| format!("{l}\n"))
            .collect();
        let n = metric_sum(&mine, "kaccel_ledger_drift");
        Ok((n > 0).then_some(n))
    })
    .await?;
    eprintln!("kaccel_ledger_drift{{budget={name}}} = {drift_metric}");
    let (ok, report) = verify_cluster(store, false).await?;
    ensure!(
        !ok,
        "ledger verify --cluster passed on a drifted ledger:\n{report}"
    );
    ensure!(report.contains(&format!("Workload {ns}/w1")), "{report}");
    // The store finds it too: its totals (kept by each append) no longer
    // match its entries, by W1's reservation.
    let (ok, report) = verify(store)?;
    ensure!(
        !ok,
        "ledger verify passed without W1's Reserve entry:\n{report}"
    );
    ensure!(
        report.contains(&format!("budget {name}: entries add up to"))
            && report.contains("reserved 60"),
        "{report}"
    );

    // Put back, the ledger is in sync again.
    sqlite(
        &db,
        &format!(
            "ATTACH '{}' AS aside; INSERT INTO entries SELECT * FROM aside.saved;",
            aside.display()
        ),
    )?;
    support::wait_until(
        &env.budgets,
        &name,
        "LedgerInSync=True again",
        WAIT,
        in_sync,
    )
    .await?;
    ledger_agrees_with_kueue(store).await?;

    // kaccel's finalizer removed by hand, then W1 finishes: kaccel caches a
    // finished Workload without its finalizer as identity only, so the budget
    // pass finds the reservation open and settles it from the API server's
    // copy (charged up to the Finished time), never leaving it open.
    wls.patch(
        "w1",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    finish(&wls, "w1").await?;
    let settled = format!(
        "SELECT COUNT(*) FROM entries WHERE kind = 'Void' AND workload_uid = '{}'",
        uid(&w1)
    );
    wait_for("W1 settled by the budget pass", WAIT, || async {
        Ok((sqlite(&db, &settled)?.trim() != "0").then_some(()))
    })
    .await?;
    support::wait_until(
        &env.budgets,
        &name,
        "LedgerInSync=True after settling",
        WAIT,
        in_sync,
    )
    .await?;
    ledger_agrees_with_kueue(store).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Partition, time-share and whole-card Workloads on their own flavors and rates.

#[tokio::test]
async fn partition_timeshare_and_whole_cards_have_their_own_flavors_and_rates() {
    on_sqlite!("kshare", sharing_modes);
}

async fn sharing_modes(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let (whole, part, ts) = (
        format!("whole-{id}"),
        format!("mig-{id}"),
        format!("ts-{id}"),
    );
    // Rates per device-hour: 1, 0.1 and 0.01 credit per device-second.
    env.class(&whole).await?;
    env.create_class(class(
        &part,
        "Partition",
        json!({"vendors": ["nvidia"], "partitionProfile": "1g.10gb"}),
        "360",
    ))
    .await?;
    env.create_class(class(
        &ts,
        "TimeShare",
        json!({"vendors": ["nvidia"]}),
        "36",
    ))
    .await?;
    let (name, ns) = (format!("share-{id}"), format!("share-{id}"));
    env.create_budget(budget(
        &name,
        &ns,
        &[(&whole, 2), (&part, 4), (&ts, 4)],
        "100000",
        json!({}),
    ))
    .await?;
    env.start(store);
    wait_figures(&env.budgets, &name, expect(100_000, 0, 0)).await?;
    let cq_of = |class: &str| format!("{name}-{class}");
    let mut flavors = BTreeMap::new();
    for c in [&whole, &part, &ts] {
        let cq = support::wait_until(&env.cqs, &cq_of(c), "Active", WAIT, |q| {
            is_true(q, "Active")
        })
        .await?;
        flavors.insert(
            c.clone(),
            cq_flavors(&cq).into_iter().collect::<BTreeSet<_>>(),
        );
    }
    eprintln!("flavors per class: {flavors:?}");
    ensure!(
        flavors[&whole].is_disjoint(&flavors[&part])
            && flavors[&whole].is_disjoint(&flavors[&ts])
            && flavors[&part].is_disjoint(&flavors[&ts]),
        "classes share a flavor: {flavors:?}"
    );

    // (Workload, class, resource, units, credits reserved for 60 s)
    let mig = "nvidia.com/mig-1g.10gb";
    let gpu = "nvidia.com/gpu";
    let cases = [
        ("p", &part, mig, 2u32, 12 * MICROS),
        ("t", &ts, gpu, 1, 600_000),
        ("w", &whole, gpu, 1, 60 * MICROS),
    ];
    let wls = env.workloads(&ns);
    for (w, c, resource, units, _) in &cases {
        env.create_workload(device_workload(&ns, w, c, resource, *units, Some(60)))
            .await?;
    }
    // A partition asked for on the whole-card queue: nothing there can hold it.
    env.create_workload(device_workload(&ns, "p-on-whole", &whole, mig, 1, Some(60)))
        .await?;
    let mut admitted_at = BTreeMap::new();
    let mut uids = BTreeMap::new();
    for (w, c, resource, units, reserve) in &cases {
        let wl = support::wait_until(&wls, w, "admitted", WAIT, admitted).await?;
        let flavor = admitted_flavor(&wl, resource);
        ensure!(
            flavors[*c].contains(&flavor),
            "{w} admitted on {flavor}, not a flavor of {c}: {flavors:?}"
        );
        let msg = check_message(&wl);
        ensure!(
            msg.starts_with(&format!(
                "reserved {} credits of budget {name}",
                kaccel::ledger::entry::format_micros(i128::from(*reserve))
            )),
            "{w}: {msg}"
        );
        let entries = export(store, Some(&name))?;
        let mine: Vec<Value> = entries
            .iter()
            .filter(|e| e["workloadUid"] == uid(&wl).as_str())
            .cloned()
            .collect();
        ensure!(
            per_flavor(&mine, "Reserve") == BTreeMap::from([(flavor.clone(), *reserve)]),
            "{w} ({units} x {resource} on {flavor}): {mine:?}"
        );
        admitted_at.insert(*w, transition(&wl, "QuotaReserved")?);
        uids.insert(*w, uid(&wl));
    }
    // Kueue counts each on its own queue and flavor, in its own units (its
    // ClusterQueue status follows the admission a moment later).
    for (w, c, resource, units, _) in &cases {
        let wl = support::get_json(&wls, w).await?;
        let want = BTreeMap::from([(admitted_flavor(&wl, resource), u64::from(*units))]);
        support::wait_until(
            &env.cqs,
            &cq_of(c),
            &format!("Kueue holds {want:?}"),
            WAIT,
            |cq| reserved_units(cq, resource) == want,
        )
        .await?;
    }
    let stray = support::get_json(&wls, "p-on-whole").await?;
    ensure!(
        !holds_quota(&stray),
        "a partition request got whole-card quota: {}",
        stray["status"]
    );
    ensure!(workload_entries(&export(store, Some(&name))?, &uid(&stray)).is_empty());
    let whole_cq = support::get_json(&env.cqs, &cq_of(&whole)).await?;
    ensure!(
        reserved_units(&whole_cq, mig).is_empty(),
        "{}",
        whole_cq["status"]
    );

    // Each is charged its run time at its own rate (micro-credits per second:
    // 2 partitions x 0.1, 1 replica x 0.01, 1 card x 1).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let per_second = BTreeMap::from([("p", 200_000i64), ("t", 10_000), ("w", MICROS)]);
    let mut expected_spent = 0;
    for (w, ..) in &cases {
        let ran = finish(&wls, w).await? - admitted_at[w];
        let want = per_second[w] * ran;
        expected_spent += want;
        let posted = wait_for(&format!("{w} settled"), WAIT, || async {
            let sums = workload_entries(&export(store, None)?, &uids[w]);
            Ok(sums
                .contains_key("Void")
                .then(|| sums.get("Post").copied().unwrap_or(0)))
        })
        .await?;
        ensure!(
            posted == want,
            "{w} ran {ran} s: posted {posted}, want {want}"
        );
    }
    eprintln!(
        "MEASURE sharing modes: spent {} credits over 3 flavors",
        kaccel::ledger::entry::format_micros(i128::from(expected_spent))
    );
    ledger_agrees_with_kueue(store).await?;
    figures_match_entries(env, store, &name).await
}

// ---------------------------------------------------------------------------
// HoldAndDrain at exhaustion, and back with a top-up.

#[tokio::test]
async fn hold_and_drain_stops_running_work_until_a_top_up() {
    on_sqlite!("kdrain", drain);
}

async fn drain(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (name, ns) = (format!("drain-{id}"), format!("drain-{id}"));
    env.class(&class).await?;
    // 20 credits; Workloads without a maximum run time are priced over 10 s.
    env.create_budget(budget(
        &name,
        &ns,
        &[(&class, 8)],
        "20",
        json!({"onExhaustion": "HoldAndDrain", "admission": {"defaultHorizonSeconds": 10}}),
    ))
    .await?;
    let cq = format!("{name}-{class}");
    env.start(store);
    wait_figures(&env.budgets, &name, expect(20, 0, 0)).await?;
    let wls = env.workloads(&ns);
    for w in ["w1", "w2"] {
        env.create_workload(device_workload(&ns, w, &class, "nvidia.com/gpu", 1, None))
            .await?;
    }
    let mut admitted_at = BTreeMap::new();
    for w in ["w1", "w2"] {
        let o = support::wait_until(&wls, w, "admitted", WAIT, admitted).await?;
        admitted_at.insert(w, transition(&o, "QuotaReserved")?);
    }
    wait_figures(&env.budgets, &name, expect(20, 20, 0)).await?;
    // Reservations alone do not drain: the queue runs on, W3 waits for credits.
    env.create_workload(device_workload(
        &ns,
        "w3",
        &class,
        "nvidia.com/gpu",
        1,
        None,
    ))
    .await?;
    support::wait_until(&wls, "w3", "waiting for credits", WAIT, |o| {
        check_message(o).contains("credits left")
    })
    .await?;
    let q = support::get_json(&env.cqs, &cq).await?;
    ensure!(q["spec"]["stopPolicy"] == "None", "{}", q["spec"]);

    // Their renewals are not covered; under HoldAndDrain they run on, and at the
    // end of the 10 s term both are posted in full: spent = granted, drained.
    let b = wait_figures(&env.budgets, &name, expect(20, 0, 20)).await?;
    let drained_at = Instant::now();
    support::wait_until(&env.cqs, &cq, "stopPolicy HoldAndDrain", WAIT, |q| {
        q["spec"]["stopPolicy"] == "HoldAndDrain"
    })
    .await
    .with_context(|| format!("budget: {}", b["status"]))?;
    for w in ["w1", "w2"] {
        let evicted = support::wait_until(&wls, w, "evicted by Kueue", WAIT, |o| {
            condition(o, "Evicted").is_some_and(|c| c["status"] == "True")
        })
        .await?;
        let c = condition(&evicted, "Evicted").unwrap();
        ensure!(c["reason"] == "ClusterQueueStopped", "{w}: {c}");
        // The job stops (there is none here: the test releases the quota).
        support::release_quota(&wls, w, &evicted).await?;
    }
    eprintln!(
        "MEASURE spent = granted -> HoldAndDrain and both running Workloads evicted in {} ms",
        drained_at.elapsed().as_millis()
    );
    let w3 = support::wait_until(&wls, "w3", "quota released by the stop", WAIT, |o| {
        !holds_quota(o)
    })
    .await?;
    ensure!(!is_true(&w3, "Admitted"), "{}", w3["status"]);
    env.create_workload(device_workload(
        &ns,
        "w4",
        &class,
        "nvidia.com/gpu",
        1,
        None,
    ))
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    for w in ["w1", "w2", "w3", "w4"] {
        let o = support::get_json(&wls, w).await?;
        ensure!(
            !holds_quota(&o),
            "{w} holds quota on a drained queue: {}",
            o["status"]
        );
    }
    // W1 and W2 paid every second Kueue counted them: their 10 s term (posted
    // when it ended, which spent the grant and drained the queue) and the moment
    // until their quota was released after the eviction (an overrun), no more.
    let entries = export(store, Some(&name))?;
    let mut spent = 0;
    for w in ["w1", "w2"] {
        let o = support::get_json(&wls, w).await?;
        let sums = workload_entries(&entries, &uid(&o));
        ensure!(!holds_quota(&o), "{w}: {}", o["status"]);
        let held = transition(&o, "QuotaReserved")? - admitted_at[w];
        let posted = sums.get("Post").copied().unwrap_or(0);
        ensure!(
            held >= 10 && posted == held * MICROS,
            "{w} held {held}s: {sums:?}"
        );
        ensure!(
            sums.get("Reserve").copied().unwrap_or(0)
                == posted + sums.get("Void").copied().unwrap_or(0),
            "{w}: {sums:?}"
        );
        spent += held;
    }

    // A top-up: the queue starts again, all four are admitted.
    let topped = Instant::now();
    top_up(&env.budgets, &name, "more", "100").await?;
    support::wait_until(&env.cqs, &cq, "stopPolicy None", WAIT, |q| {
        q["spec"]["stopPolicy"] == "None"
    })
    .await?;
    for w in ["w1", "w2", "w3", "w4"] {
        support::wait_until(&wls, w, "admitted after the top-up", WAIT, admitted).await?;
    }
    eprintln!(
        "MEASURE top-up -> 4 Workloads admitted in {} ms",
        topped.elapsed().as_millis()
    );
    wait_figures(&env.budgets, &name, expect(120, 40, spent)).await?;
    let report = ledger_agrees_with_kueue(store).await?;
    ensure!(report.contains("(4 open)"), "{report}");
    figures_match_entries(env, store, &name).await
}

// ---------------------------------------------------------------------------
// Cohort borrowing: a busy team uses an idle team's guarantee.

/// Two teams on one class, 8-GPU Workloads (so only the 8-GPU H100 nodes fit).
struct Teams {
    class: String,
    busy: (String, String),
    idle: (String, String),
}

async fn two_teams(env: &mut Env, store: &str, busy_extra: Value) -> Result<Teams> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    env.class(&class).await?;
    let busy = (format!("busy-{id}"), format!("busy-{id}"));
    let idle = (format!("idle-{id}"), format!("idle-{id}"));
    env.create_budget(budget(
        &busy.0,
        &busy.1,
        &[(&class, 8)],
        "1000000",
        busy_extra,
    ))
    .await?;
    env.create_budget(budget(
        &idle.0,
        &idle.1,
        &[(&class, 8)],
        "1000000",
        json!({}),
    ))
    .await?;
    env.start(store);
    for (b, _) in [&busy, &idle] {
        wait_figures(&env.budgets, b, expect(1_000_000, 0, 0)).await?;
    }
    Ok(Teams { class, busy, idle })
}

/// Device units of `resource` in the Workload's admission.
fn admitted_units(wl: &Value, resource: &str) -> u64 {
    wl.pointer("/status/admission/podSetAssignments/0/resourceUsage")
        .and_then(|u| u.get(resource))
        .and_then(Value::as_str)
        .and_then(|q| q.parse().ok())
        .unwrap_or(0)
}

/// The busy team takes every device the class has: 8-GPU Workloads until one
/// waits, then 1-GPU ones (a Workload that cannot be admitted is deleted).
/// Returns the devices it holds per flavor, once Kueue's status shows them.
async fn fill(env: &mut Env, t: &Teams) -> Result<BTreeMap<String, u64>> {
    let gpu = "nvidia.com/gpu";
    let (busy, busy_ns) = &t.busy;
    let wls = env.workloads(busy_ns);
    let mut held: BTreeMap<String, u64> = BTreeMap::new();
    let mut n = 0;
    for units in [8, 1] {
        loop {
            let w = format!("b{n:02}");
            n += 1;
            ensure!(n < 60, "the cohort never filled");
            env.create_workload(device_workload(
                busy_ns,
                &w,
                &t.class,
                gpu,
                units,
                Some(600),
            ))
            .await?;
            // Waiting for quota, not for its queues: Kueue says `Inadmissible`
            // while the LocalQueue or ClusterQueue is missing or inactive in its
            // cache (just after kaccel created them), which is no full cohort.
            let o = support::wait_until(&wls, &w, "admitted or waiting for quota", WAIT, |o| {
                admitted(o)
                    || condition(o, "QuotaReserved")
                        .is_some_and(|c| c["status"] == "False" && c["reason"] != "Inadmissible")
            })
            .await?;
            if !admitted(&o) {
                wls.delete(&w, &Default::default()).await?;
                break;
            }
            *held.entry(admitted_flavor(&o, gpu)).or_default() += admitted_units(&o, gpu);
        }
    }
    let cq = format!("{busy}-{}", t.class);
    support::wait_until(&env.cqs, &cq, &format!("Kueue holds {held:?}"), WAIT, |q| {
        reserved_units(q, gpu) == held
    })
    .await?;
    eprintln!(
        "MEASURE cohort: the busy team holds {held:?} in {} Workloads",
        n - 2
    );
    Ok(held)
}

/// Nominal quota per flavor of (the busy team, the idle team, the root's spare).
async fn quotas(env: &Env, t: &Teams, flavor: &str) -> Result<(u64, u64, u64)> {
    let gpu = "nvidia.com/gpu";
    let busy = support::get_json(&env.cqs, &format!("{}-{}", t.busy.0, t.class)).await?;
    let idle = support::get_json(&env.cqs, &format!("{}-{}", t.idle.0, t.class)).await?;
    let cohorts = Api::<DynamicObject>::all_with(env.client.clone(), &support::kueue("Cohort"));
    let root = support::get_json(&cohorts, &env.root).await?;
    Ok((
        nominal(&busy, flavor, gpu),
        nominal(&idle, flavor, gpu),
        nominal(&root, flavor, gpu),
    ))
}

const H100: &str = "nvidia-h100-80gb-hbm3";

#[tokio::test]
async fn busy_team_borrows_the_idle_teams_quota() {
    on_sqlite!("kborrow", borrow);
}

async fn borrow(env: &mut Env, store: &str) -> Result<()> {
    let t = two_teams(env, store, json!({})).await?;
    let held = fill(env, &t).await?;
    let (busy_nominal, idle_nominal, spare) = quotas(env, &t, H100).await?;
    let on_h100 = held.get(H100).copied().unwrap_or(0);
    ensure!(idle_nominal > 0, "the idle team has no quota on {H100}");
    // The flavor's quota is split among the busy team's nominal, the idle
    // team's and the root's spare: holding more than nominal + spare means the
    // busy team uses the idle team's guarantee.
    ensure!(
        on_h100 > busy_nominal + spare,
        "the busy team holds {on_h100} x {H100}: no more than its nominal {busy_nominal} + the spare {spare}"
    );
    eprintln!(
        "MEASURE borrowing: the busy team holds {on_h100} x {H100} (nominal {busy_nominal}, root spare {spare}): {} of the idle team's {idle_nominal}",
        on_h100 - busy_nominal - spare
    );
    // Borrowed devices are priced like the team's own: 600 s each, per flavor.
    let reserved = per_flavor(&export(store, Some(&t.busy.0))?, "Reserve");
    let want: BTreeMap<String, i64> = held
        .iter()
        .map(|(f, n)| (f.clone(), i64::try_from(*n).unwrap_or(0) * 600 * MICROS))
        .collect();
    ensure!(reserved == want, "reserved {reserved:?}, want {want:?}");
    ensure!(
        export(store, Some(&t.idle.0))?
            .iter()
            .all(|e| e["kind"] == "Grant"),
        "the idle team was charged"
    );
    ledger_agrees_with_kueue(store).await?;
    for b in [&t.busy.0, &t.idle.0] {
        figures_match_entries(env, store, b).await?;
    }
    Ok(())
}

/// When the idle team submits within its guarantee, Kueue takes the lent devices
/// back by preempting borrowers (kaccel's queues say `reclaimWithinCohort: Any`;
/// Kueue's default, `Never`, would leave the idle team waiting until the
/// borrower finishes), and the ledger refunds the preempted Workloads
/// (`refundPreemption: true`).
#[tokio::test]
async fn idle_team_reclaims_its_guarantee_and_the_preempted_work_is_refunded() {
    on_sqlite!("kreclaim", reclaim);
}

async fn reclaim(env: &mut Env, store: &str) -> Result<()> {
    let t = two_teams(env, store, json!({"admission": {"refundPreemption": true}})).await?;
    fill(env, &t).await?;
    let (_, idle_nominal, _) = quotas(env, &t, H100).await?;
    let units = u32::try_from(idle_nominal.min(8))?;
    ensure!(units > 0, "the idle team has no quota on {H100}");
    let idle_cq = support::get_json(&env.cqs, &format!("{}-{}", t.idle.0, t.class)).await?;
    eprintln!("idle queue preemption: {}", idle_cq["spec"]["preemption"]);
    let (_, idle_ns) = &t.idle;
    let idle_wls = env.workloads(idle_ns);
    env.create_workload(device_workload(
        idle_ns,
        "i0",
        &t.class,
        "nvidia.com/gpu",
        units,
        Some(600),
    ))
    .await?;
    let submitted = Instant::now();
    let busy_wls = env.workloads(&t.busy.1);
    // Kueue preempts borrowers; their jobs stop (the test releases the quota).
    // victim -> (units, admitted at)
    let mut victims: BTreeMap<String, (u64, i64)> = BTreeMap::new();
    loop {
        for o in busy_wls.list(&Default::default()).await?.items {
            let v = serde_json::to_value(&o)?;
            let name = o.metadata.name.clone().unwrap_or_default();
            if condition(&v, "Evicted")
                .is_some_and(|c| c["status"] == "True" && c["reason"] == "Preempted")
                && holds_quota(&v)
            {
                victims.insert(
                    name.clone(),
                    (
                        admitted_units(&v, "nvidia.com/gpu"),
                        transition(&v, "QuotaReserved")?,
                    ),
                );
                support::release_quota(&busy_wls, &name, &v).await?;
            }
        }
        if admitted(&support::get_json(&idle_wls, "i0").await?) {
            break;
        }
        ensure!(
            submitted.elapsed() < Duration::from_secs(30),
            "the idle team's {units} x {H100} within its guarantee not admitted after 30 s; preempted: {victims:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "MEASURE idle team submits -> {} borrower Workload(s) preempted and its own admitted in {} ms",
        victims.len(),
        submitted.elapsed().as_millis()
    );
    ensure!(!victims.is_empty(), "admitted without preempting anyone");
    // Each victim pays nothing for its preempted run: charged, then refunded.
    for (name, (units, admitted_at)) in &victims {
        let wl = support::get_json(&busy_wls, name).await?;
        let entries = wait_for(&format!("{name} settled"), WAIT, || async {
            let mine: Vec<Value> = export(store, Some(&t.busy.0))?
                .into_iter()
                .filter(|e| e["workloadUid"] == uid(&wl).as_str() && e["admission"] == 1)
                .collect();
            Ok(mine.iter().any(|e| e["kind"] == "Void").then_some(mine))
        })
        .await?;
        let sums = kind_sums(&entries);
        let released = transition(&wl, "Evicted")
            .ok()
            .filter(|e| *e >= *admitted_at);
        let post = sums.get("Post").copied().unwrap_or(0);
        if post == 0 && released == Some(*admitted_at) {
            // Preempted within the second it was admitted: no whole second was
            // used, so nothing is posted, the reservation is voided whole and
            // there is nothing to refund.
            ensure!(
                sums.get("Void") == sums.get("Reserve") && !sums.contains_key("Correction"),
                "{name}: preempted in its first second: {sums:?}"
            );
            continue;
        }
        ensure!(
            post > 0 && post % (i64::try_from(*units)? * MICROS) == 0,
            "{name}: {units} devices from {admitted_at} (evicted {released:?}): {sums:?}"
        );
        ensure!(sums.get("Correction") == Some(&-post), "{name}: {sums:?}");
    }
    ledger_agrees_with_kueue(store).await?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Fair sharing: weights 1 and 3 on one flavor.

#[tokio::test]
async fn fair_sharing_converges_to_the_team_weights() {
    on_sqlite!("kfair", fair);
}

async fn fair(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    env.class(&class).await?;
    // Nothing guaranteed: both borrow everything from the root Cohort, and the
    // team weights alone decide who gets a freed slot.
    let teams = [(format!("light-{id}"), 1u64), (format!("heavy-{id}"), 3)];
    for (t, weight) in &teams {
        env.create_budget(budget(
            t,
            t,
            &[(&class, 0)],
            "1000000",
            json!({"fairShareWeight": weight.to_string()}),
        ))
        .await?;
    }
    env.start(store);
    for (t, _) in &teams {
        wait_figures(&env.budgets, t, expect(1_000_000, 0, 0)).await?;
    }
    let gpu = "nvidia.com/gpu";
    // 4 GPUs each: the class's 35 devices (31 healthy H100, 4 A100) make 8 slots.
    const UNITS: u32 = 4;
    let units = UNITS as usize;
    let mut next = [0u32; 2];
    let mut submit = async |env: &mut Env, team: usize| -> Result<()> {
        let name = format!("w{:02}", next[team]);
        next[team] += 1;
        let ns = &teams[team].0;
        env.create_workload(device_workload(ns, &name, &class, gpu, UNITS, Some(600)))
            .await
            .map(|_| ())
    };
    for _ in 0..8 {
        for team in 0..2 {
            submit(env, team).await?;
        }
    }
    // (team, name, QuotaReserved time) of every admitted, unfinished Workload.
    let running = |env: &Env| {
        let apis: Vec<Api<DynamicObject>> = teams.iter().map(|(t, _)| env.workloads(t)).collect();
        async move {
            let mut out = Vec::new();
            for (team, api) in apis.iter().enumerate() {
                for o in api.list(&Default::default()).await?.items {
                    let v = serde_json::to_value(&o)?;
                    // Evicted (a fair-sharing preemption, where Kueue may
                    // preempt): the job stops, the quota goes.
                    if is_true(&v, "Evicted") && holds_quota(&v) {
                        support::release_quota(
                            api,
                            &o.metadata.name.clone().unwrap_or_default(),
                            &v,
                        )
                        .await?;
                        continue;
                    }
                    if admitted(&v) && !is_true(&v, "Evicted") && !is_true(&v, "Finished") {
                        out.push((
                            team,
                            o.metadata.name.clone().unwrap_or_default(),
                            transition(&v, "QuotaReserved")?,
                        ));
                    }
                }
            }
            out.sort_by_key(|(team, name, at)| (*at, *team, name.clone()));
            anyhow::Ok(out)
        }
    };
    // The class is full once admissions stop (no change for 3 s).
    let mut slots = 0;
    let mut stable_since = Instant::now();
    let filling = Instant::now();
    while stable_since.elapsed() < Duration::from_secs(3) {
        ensure!(filling.elapsed() < WAIT, "admissions never settled");
        let now = running(env).await?.len();
        if now != slots {
            (slots, stable_since) = (now, Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    ensure!(slots >= 4, "only {slots} {UNITS}-GPU Workloads fit");
    let mut shares = Vec::new();
    let started = Instant::now();
    for round in 0..10 {
        let now = running(env).await?;
        let count = |team| now.iter().filter(|(t, ..)| *t == team).count() * units;
        shares.push((count(0), count(1)));
        eprintln!(
            "round {round}: light {} devices, heavy {} devices",
            count(0),
            count(1)
        );
        // The oldest ends and its team submits another: the split holds.
        // (Kueue reaches it by preempting the team above its weighted share:
        // kaccel's queues reclaim within their cohort. Without that, measured
        // on the same churn, the split stayed 16:16.)
        let (team, name, _) = now.first().cloned().context("nothing running")?;
        finish(&env.workloads(&teams[team].0), &name).await?;
        submit(env, team).await?;
        wait_for("the freed slot taken", WAIT, || async {
            Ok((running(env).await?.len() == slots).then_some(()))
        })
        .await?;
    }
    let (light, heavy) = *shares.last().unwrap();
    eprintln!(
        "MEASURE fair sharing weights 1:3 on {slots} slots -> admitted devices {light}:{heavy} (ratio {:.2}) after {} rounds in {} ms; history {shares:?}",
        heavy as f64 / light.max(1) as f64,
        shares.len(),
        started.elapsed().as_millis()
    );
    // Converged: the last rounds all hold the 1:3 split (as near as the slots allow).
    let tail = &shares[shares.len() - 3..];
    let fair_light = (slots * units / 4) / units * units;
    ensure!(
        tail.iter().all(|(l, _)| *l == fair_light),
        "not 1:3 after {} rounds: {shares:?}",
        shares.len()
    );
    ledger_agrees_with_kueue(store).await?;
    Ok(())
}
