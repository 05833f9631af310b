//! The credit ledger end to end: `kaccel run` with `ledger.enabled` against the
//! real kube-apiserver + Kueue, with a real SQLite file and a real PostgreSQL
//! server (started from `e2e/postgres.sh` on a port and in a folder of its own).
//!
//! Workloads are created directly (there is no job controller) and finished by
//! adding a `Finished` condition to their status, as a job integration would.
//! Rates are 3600 credits per device-hour, so one device-second costs exactly one
//! credit and every figure below is exact.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use kaccel::api::{AcceleratorClass, CreditBudget};
use kube::Client;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::controller::{Controller, ensure_example_nodes, free_port, wait_for};
use crate::support::{self, Cleanup, kueue};

pub const WAIT: Duration = Duration::from_secs(60);
pub const CHECK: &str = "kaccel-credits";
pub const FINALIZER: &str = "kaccel.io/credits";
pub const MICROS: i64 = 1_000_000;
const KACCEL: &str = env!("CARGO_BIN_EXE_kaccel");

// ---------------------------------------------------------------------------
// PostgreSQL: a server of the tests' own, stopped and deleted on drop.

struct Postgres {
    cache: PathBuf,
    port: u16,
}

impl Postgres {
    /// A fresh (wiped) server folder for `port`; nothing is started yet.
    fn new(port: u16) -> Postgres {
        let pg = Postgres {
            cache: PathBuf::from(format!("/var/tmp/kaccel-e2e-ledger-pg-{port}")),
            port,
        };
        // A server left over from an interrupted run: stop it, start from nothing.
        if pg.cache.exists() {
            let _ = pg.script("stop");
            let _ = std::fs::remove_dir_all(&pg.cache);
        }
        pg
    }

    fn url(&self) -> String {
        format!("postgres://kaccel@127.0.0.1:{}/kaccel", self.port)
    }

    fn script(&self, verb: &str) -> Result<Output> {
        let out = Command::new("bash")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/postgres.sh"))
            .arg(verb)
            .env("KACCEL_E2E_CACHE", &self.cache)
            .env("KACCEL_PG_PORT", self.port.to_string())
            .output()
            .with_context(|| format!("running e2e/postgres.sh {verb}"))?;
        ensure!(
            out.status.success(),
            "e2e/postgres.sh {verb} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(out)
    }

    fn start(&self) -> Result<String> {
        let out = self.script("start")?;
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        ensure!(url == self.url(), "postgres.sh start printed {url:?}");
        Ok(url)
    }

    fn stop(&self) -> Result<()> {
        self.script("stop").map(|_| ())
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Err(e) = self.stop() {
            eprintln!("stopping the test PostgreSQL: {e}");
        }
        let _ = std::fs::remove_dir_all(&self.cache);
    }
}

// ---------------------------------------------------------------------------
// Objects.

pub fn ledger_config(root: &str, store: &str) -> String {
    format!(
        "rootCohort: {root}\nleaderElection:\n  enabled: false\nwatchResourceSlices: false\n\
         debounceMs: 100\nmaxDelayMs: 500\nledger:\n  enabled: true\n  store: {store}\n  \
         budgetIntervalSeconds: 2\n  retryAfterSeconds: 3\n  postIntervalSeconds: 60\n"
    )
}

pub fn class_ar() -> ApiResource {
    ApiResource::erase::<AcceleratorClass>(&())
}

pub fn budget_ar() -> ApiResource {
    ApiResource::erase::<CreditBudget>(&())
}

pub fn h100_class(name: &str) -> Value {
    json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": name },
        "spec": { "sharing": "Whole", "selector": { "vendors": ["nvidia"], "minMemoryMiB": 80000 },
                  "credits": { "perDeviceHour": "3600" } }
    })
}

pub fn budget(name: &str, team: &str, ns: &str, class: &str, per_period: &str) -> Value {
    json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": { "name": name },
        "spec": {
            "team": team, "namespaces": [ns],
            "classes": [{ "name": class, "guaranteedDevices": 8 }],
            "credits": { "perPeriod": per_period, "period": { "start": "2026-12-01T00:00:00Z", "days": 30 } }
        }
    })
}

/// One pod, one GPU, at most `secs` seconds.
pub fn workload(ns: &str, name: &str, queue: &str, secs: u32) -> Value {
    device_workload(ns, name, queue, "nvidia.com/gpu", 1, Some(secs))
}

/// One pod asking for `units` of the device `resource` (one CPU and 1 GiB each),
/// at most `secs` seconds (none: the budget's default horizon prices it).
pub fn device_workload(
    ns: &str,
    name: &str,
    queue: &str,
    resource: &str,
    units: u32,
    secs: Option<u32>,
) -> Value {
    let mut w = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "queueName": queue,
            "podSets": [{ "name": "main", "count": 1,
            "template": { "spec": { "restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": { "cpu": units.to_string(), "memory": format!("{units}Gi"), resource: units.to_string() },
                               "limits": { resource: units.to_string() } } }] } } }] }
    });
    if let Some(secs) = secs {
        w["spec"]["maximumExecutionTimeSeconds"] = json!(secs);
    }
    w
}

/// A team of its own for one test: a namespace, an H100 class at one credit per
/// device-second, a budget granting `per_period` credits, and a SQLite ledger
/// path; the Kueue objects kaccel writes for them are cleaned up too.
pub struct LedgerTeam {
    /// A folder of the test's own (the SQLite file lives there).
    pub dir: PathBuf,
    pub store_url: String,
    pub root: String,
    pub class: String,
    pub team: String,
    pub ns: String,
    /// The budget's ClusterQueue for the class.
    pub cq: String,
}

pub async fn h100_team(
    client: &Client,
    cleanup: &mut Cleanup,
    id: &str,
    per_period: &str,
) -> Result<LedgerTeam> {
    let dir = std::env::temp_dir().join(format!("kaccel-e2e-{id}"));
    std::fs::create_dir_all(&dir)?;
    let t = LedgerTeam {
        store_url: format!("sqlite:{}", dir.join("ledger.db").display()),
        dir,
        root: format!("root-{id}"),
        class: format!("h100-{id}"),
        team: format!("team-{id}"),
        ns: format!("ns-{id}"),
        cq: format!("team-{id}-h100-{id}"),
    };
    support::namespace(client, &t.ns).await?;
    cleanup.add_namespace(&t.ns);
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &class_ar());
    support::create(&classes, h100_class(&t.class)).await?;
    cleanup.add(None, class_ar(), &t.class);
    let budgets: Api<DynamicObject> = Api::all_with(client.clone(), &budget_ar());
    support::create(
        &budgets,
        budget(&t.team, "e2e", &t.ns, &t.class, per_period),
    )
    .await?;
    cleanup.add(None, budget_ar(), &t.team);
    cleanup.add(None, kueue("Cohort"), &t.root);
    cleanup.add(None, kueue("Cohort"), &format!("{}-{}", t.root, t.team));
    cleanup.add(None, kueue("ClusterQueue"), &t.cq);
    cleanup.add(Some(&t.ns), kueue("LocalQueue"), &t.class);
    Ok(t)
}

/// kaccel's entry in `status.admissionChecks`.
pub fn credit_check(wl: &Value) -> Option<&Value> {
    wl.pointer("/status/admissionChecks")?
        .as_array()?
        .iter()
        .find(|c| c["name"] == CHECK)
}

pub fn check_message(wl: &Value) -> String {
    credit_check(wl)
        .and_then(|c| c["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

pub fn admitted(wl: &Value) -> bool {
    support::is_true(wl, "Admitted") && credit_check(wl).is_some_and(|c| c["state"] == "Ready")
}

pub fn has_finalizer(wl: &Value) -> bool {
    wl.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

pub fn seconds(t: &str) -> Result<i64> {
    Ok(t.parse::<jiff::Timestamp>()
        .with_context(|| format!("timestamp {t:?}"))?
        .as_second())
}

/// `lastTransitionTime` of a condition, in Unix seconds.
pub fn transition(wl: &Value, type_: &str) -> Result<i64> {
    let c = support::condition(wl, type_).with_context(|| format!("no {type_} condition"))?;
    seconds(c["lastTransitionTime"].as_str().unwrap_or_default())
}

/// The Post entries of the Workload with `uid`, once its settlement wrote any
/// (at most `wait`).
pub async fn posts_of(store: &str, uid: &str, wait: Duration) -> Result<Vec<Value>> {
    crate::controller::wait_for("the settlement", wait, || async {
        let posts: Vec<Value> = export(store, None)?
            .into_iter()
            .filter(|e| e["workloadUid"] == uid && e["kind"] == "Post")
            .collect();
        Ok((!posts.is_empty()).then_some(posts))
    })
    .await
}

/// Finishes a Workload as a job integration would (there is none here): the
/// `Finished` condition, stamped now; returns that time in Unix seconds.
pub async fn finish(api: &Api<DynamicObject>, name: &str) -> Result<i64> {
    Ok(finish_returning(api, name).await?.0)
}

/// [`finish`], also returning the Workload as the write left it (what Kueue had
/// written before the Finished landed is in it).
pub async fn finish_returning(api: &Api<DynamicObject>, name: &str) -> Result<(i64, Value)> {
    let now = jiff::Timestamp::now();
    let ts = jiff::Timestamp::from_second(now.as_second())?;
    let patch = json!([{ "op": "add", "path": "/status/conditions/-", "value": {
        "type": "Finished", "status": "True", "reason": "Succeeded", "message": "done",
        "lastTransitionTime": ts.to_string() } }]);
    let written = api
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(patch)?),
        )
        .await
        .with_context(|| format!("finishing Workload {name}"))?;
    Ok((ts.as_second(), serde_json::to_value(&written)?))
}

/// Adds the top-up `name` of `credits` to a budget.
pub async fn top_up(
    budgets: &Api<DynamicObject>,
    budget: &str,
    name: &str,
    credits: &str,
) -> Result<()> {
    budgets
        .patch(
            budget,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"credits": {"topUps": [
                {"name": name, "credits": credits, "reason": "e2e top-up"}]}}})),
        )
        .await
        .with_context(|| format!("topping up budget {budget}"))?;
    Ok(())
}

/// A budget's status figure (decimal string), "" when absent.
pub fn figure(b: &Value, field: &str) -> String {
    b["status"][field].as_str().unwrap_or_default().to_string()
}

pub fn figures(b: &Value) -> [String; 4] {
    ["granted", "reserved", "spent", "remaining"].map(|f| figure(b, f))
}

pub fn expect(granted: i64, reserved: i64, spent: i64) -> [String; 4] {
    [granted, reserved, spent, granted - reserved - spent].map(|v| v.to_string())
}

pub async fn wait_figures(
    budgets: &Api<DynamicObject>,
    name: &str,
    want: [String; 4],
) -> Result<Value> {
    support::wait_until(
        budgets,
        name,
        &format!("granted/reserved/spent/remaining = {want:?}"),
        WAIT,
        |b| figures(b) == want,
    )
    .await
}

// ---------------------------------------------------------------------------
// The ledger through the binary.

pub fn kaccel(args: &[&str]) -> Result<Output> {
    Command::new(KACCEL)
        .args(args)
        .env_remove("KACCEL_LEDGER_STORE")
        .output()
        .context("running kaccel")
}

/// Every entry of `budget` (all budgets when None), via `kaccel ledger export --format json`.
pub fn export(store: &str, budget: Option<&str>) -> Result<Vec<Value>> {
    let out = kaccel(&[
        "ledger",
        "export",
        "--store",
        store,
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2030-01-01T00:00:00Z",
        "--format",
        "json",
    ])?;
    ensure!(
        out.status.success(),
        "ledger export failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut entries = Vec::new();
    for line in String::from_utf8(out.stdout)?.lines() {
        let v: Value = serde_json::from_str(line).with_context(|| format!("export line {line}"))?;
        if budget.is_none_or(|b| v["budget"] == b) {
            entries.push(v);
        }
    }
    Ok(entries)
}

type Table = Vec<BTreeMap<String, Option<String>>>;

/// `kaccel ledger export --format FORMAT` of the whole store, read back as rows.
pub fn export_table(store: &str, format: &str, extra: &[&str]) -> Result<Table> {
    let mut args = vec![
        "ledger",
        "export",
        "--store",
        store,
        "--from",
        "2026-01-01T00:00:00Z",
        "--to",
        "2030-01-01T00:00:00Z",
        "--format",
        format,
    ];
    args.extend(extra);
    let out = kaccel(&args)?;
    ensure!(
        out.status.success(),
        "ledger export --format {format} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    kaccel::ledger::export::read_csv_table(&String::from_utf8(out.stdout)?)
        .context("a row of the export is not as wide as its header")
}

/// A cell as an exact decimal scaled to `scale` places (0 for NULL).
fn scaled(row: &BTreeMap<String, Option<String>>, col: &str, scale: u32) -> Result<i128> {
    let Some(v) = row.get(col).with_context(|| format!("no column {col}"))? else {
        return Ok(0);
    };
    let (units, s) = kaccel::ledger::export::parse_decimal(v)
        .with_context(|| format!("{col} {v:?} is not a decimal"))?;
    ensure!(s <= scale, "{col} {v:?} has more than {scale} places");
    Ok(units * 10i128.pow(scale - s))
}

/// The finance exports of a run against the ledger: per team and flavor, the FOCUS
/// BilledCost (at 0.25 USD a credit) sums to exactly the posted credits, the
/// plain CSV's signed deltas to the budget's balances, every usage row's ListCost
/// is ListUnitPrice x PricingQuantity, and W1's consumed device-seconds are the
/// seconds Kueue admitted it for.
fn finance_matches_ledger(
    store: &str,
    teams: &[(&str, &str)],
    w1_uid: &str,
    w1_seconds: i64,
) -> Result<()> {
    // The JSON export first: its newest id bounds the others, so posts the
    // controller appends meanwhile are left out of the comparison.
    let entries = export(store, None)?;
    let last = entries
        .iter()
        .filter_map(|e| e["id"].as_i64())
        .max()
        .unwrap_or(0);
    let price_args = ["--currency", "USD", "--credit-price", "0.25"];
    let mut focus_args = price_args.to_vec();
    focus_args.extend(["--provider", "e2e platform"]);
    let seen = |col: &'static str| {
        move |r: &BTreeMap<String, Option<String>>| {
            r.get(col)
                .cloned()
                .flatten()
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|id| id <= last)
        }
    };
    let focus: Table = export_table(store, "focus", &focus_args)?
        .into_iter()
        .filter(seen("x_LedgerEntryId"))
        .collect();
    let csv: Table = export_table(store, "csv", &price_args)?
        .into_iter()
        .filter(seen("id"))
        .collect();
    let cell = |r: &BTreeMap<String, Option<String>>, c: &str| r.get(c).cloned().flatten();
    for (team, budget) in teams {
        let mine: Vec<&Value> = entries.iter().filter(|e| e["budget"] == *budget).collect();
        let mut posted = BTreeMap::<String, i128>::new();
        for e in mine.iter().filter(|e| e["kind"] == "Post") {
            *posted
                .entry(e["flavor"].as_str().unwrap_or_default().into())
                .or_default() += i128::from(e["credits"].as_i64().unwrap_or_default());
        }
        let rows: Vec<_> = focus
            .iter()
            .filter(|r| cell(r, "SubAccountId").as_deref() == Some(*budget))
            .collect();
        ensure!(
            rows.len() == mine.iter().filter(|e| e["kind"] == "Post").count(),
            "budget {budget}: {} FOCUS rows for its posts",
            rows.len()
        );
        let mut billed = BTreeMap::<String, i128>::new();
        for r in &rows {
            ensure!(
                cell(r, "BillingAccountId").as_deref() == Some(*team),
                "{r:?}"
            );
            ensure!(
                cell(r, "ProviderName").as_deref() == Some("e2e platform"),
                "{r:?}"
            );
            ensure!(
                cell(r, "ChargeCategory").as_deref() == Some("Usage"),
                "{r:?}"
            );
            ensure!(
                cell(r, "PricingCurrencyListUnitPrice").as_deref() == Some("3600"),
                "{r:?}"
            );
            // Prices at scale 12, quantities at 6: the product at 18.
            let product = scaled(r, "ListUnitPrice", 12)? * scaled(r, "PricingQuantity", 6)?;
            ensure!(product == scaled(r, "ListCost", 18)?, "ListCost: {r:?}");
            ensure!(
                product == scaled(r, "ContractedCost", 18)?,
                "ContractedCost: {r:?}"
            );
            *billed
                .entry(cell(r, "x_Flavor").unwrap_or_default())
                .or_default() += scaled(r, "BilledCost", 12)?;
        }
        let posted_cost: BTreeMap<String, i128> = posted
            .iter()
            .map(|(f, micros)| (f.clone(), micros * 250_000))
            .collect();
        ensure!(
            billed == posted_cost,
            "budget {budget}: FOCUS BilledCost per flavor {billed:?} is not the posted credits x 0.25 {posted_cost:?}"
        );
        // Plain CSV: the signed deltas sum to the balances of the same entries.
        let sums = kind_sums(&mine.iter().map(|e| (*e).clone()).collect::<Vec<_>>());
        let k = |kind: &str| i128::from(sums.get(kind).copied().unwrap_or(0));
        let want = [
            ("grantedDelta", k("Grant") - k("Expiry")),
            ("reservedDelta", k("Reserve") - k("Post") - k("Void")),
            ("spentDelta", k("Post") + k("Correction")),
        ];
        for (col, want) in want {
            let mut got = 0;
            for r in csv
                .iter()
                .filter(|r| cell(r, "budget").as_deref() == Some(*budget))
            {
                got += scaled(r, col, 6)?;
            }
            ensure!(
                got == want,
                "budget {budget}: CSV {col} sums to {got}, the ledger to {want}"
            );
        }
    }
    // W1 ran on one device for exactly the seconds Kueue admitted it.
    let w1: Vec<_> = focus
        .iter()
        .filter(|r| cell(r, "ResourceId").as_deref() == Some(w1_uid))
        .collect();
    let mut consumed = 0;
    let mut billed = 0;
    for r in &w1 {
        ensure!(
            cell(r, "ConsumedUnit").as_deref() == Some("Device-Seconds"),
            "{r:?}"
        );
        consumed += scaled(r, "ConsumedQuantity", 0)?;
        billed += scaled(r, "BilledCost", 12)?;
    }
    ensure!(
        consumed == i128::from(w1_seconds),
        "W1 consumed {consumed} device-seconds in FOCUS, Kueue admitted it for {w1_seconds} s"
    );
    ensure!(
        billed == i128::from(w1_seconds) * 250_000_000_000,
        "W1 billed {billed}"
    );
    eprintln!(
        "finance: {} FOCUS rows, {} CSV rows match the ledger per team and flavor",
        focus.len(),
        csv.len()
    );
    Ok(())
}

/// `kaccel ledger verify`: (success, stderr).
pub fn verify(store: &str) -> Result<(bool, String)> {
    let out = kaccel(&["ledger", "verify", "--store", store])?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

/// `kaccel ledger verify --cluster` (KUBECONFIG): (success, stderr), asked again
/// for up to 20 s until it gives `want`. Kueue writes ClusterQueue usage a moment
/// after it admits, so one snapshot can lag either way.
pub async fn verify_cluster(store: &str, want: bool) -> Result<(bool, String)> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = kaccel(&["ledger", "verify", "--store", store, "--cluster"])?;
        let report = String::from_utf8_lossy(&out.stderr).into_owned();
        if out.status.success() == want || Instant::now() > deadline {
            return Ok((out.status.success(), report));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Sum of micro-credits per kind.
pub fn kind_sums(entries: &[Value]) -> BTreeMap<String, i64> {
    let mut sums = BTreeMap::new();
    for e in entries {
        *sums
            .entry(e["kind"].as_str().unwrap_or_default().to_string())
            .or_insert(0) += e["credits"].as_i64().unwrap_or_default();
    }
    sums
}

/// (granted, reserved, spent, remaining) from the entries' sums, as the status
/// writes them (exact decimals); fails on kinds these tests never cause (expiry,
/// corrections).
pub fn balances(entries: &[Value]) -> Result<[String; 4]> {
    let s = kind_sums(entries);
    let get = |k: &str| i128::from(s.get(k).copied().unwrap_or(0));
    for k in s.keys() {
        ensure!(
            ["Grant", "Reserve", "Post", "Void"].contains(&k.as_str()),
            "unexpected entry kind {k}: {s:?}"
        );
    }
    let (granted, reserved, spent) = (
        get("Grant"),
        get("Reserve") - get("Post") - get("Void"),
        get("Post"),
    );
    Ok([granted, reserved, spent, granted - reserved - spent]
        .map(kaccel::ledger::entry::format_micros))
}

/// The entries of one Workload (by uid): kind -> micro-credits, one entry per kind.
pub fn workload_entries(entries: &[Value], uid: &str) -> BTreeMap<String, i64> {
    kind_sums(
        &entries
            .iter()
            .filter(|e| e["workloadUid"] == uid)
            .cloned()
            .collect::<Vec<_>>(),
    )
}

// ---------------------------------------------------------------------------
// One test's cluster objects and controller.

pub struct Env {
    pub client: Client,
    pub id: String,
    pub root: String,
    pub cleanup: Cleanup,
    workloads: Vec<(String, String)>,
    controller: Option<Controller>,
    pub budgets: Api<DynamicObject>,
    pub cqs: Api<DynamicObject>,
}

impl Env {
    pub async fn new(prefix: &str) -> Result<Env> {
        let client = support::client().await;
        ensure_example_nodes(&client).await?;
        let id = support::unique(prefix);
        let mut cleanup = Cleanup::default();
        // kaccel writes the AdmissionCheck; the cluster is left as found.
        cleanup.add(None, kueue("AdmissionCheck"), CHECK);
        let root = format!("root-{id}");
        cleanup.add(None, kueue("Cohort"), &root);
        Ok(Env {
            budgets: Api::all_with(client.clone(), &budget_ar()),
            cqs: Api::all_with(client.clone(), &kueue("ClusterQueue")),
            client,
            id,
            root,
            cleanup,
            workloads: Vec::new(),
            controller: None,
        })
    }

    pub fn start(&mut self, store: &str) {
        self.controller = Some(Controller::start(
            &format!("ledger-{}", self.id),
            free_port(),
            &ledger_config(&self.root, store),
        ));
    }

    /// Starts kaccel with its ledger on `store` and `edit` applied to the config.
    pub fn start_with(&mut self, store: &str, edit: impl FnOnce(String) -> String) {
        self.controller = Some(Controller::start(
            &format!("ledger-{}", self.id),
            free_port(),
            &edit(ledger_config(&self.root, store)),
        ));
    }

    pub fn controller(&mut self) -> &mut Controller {
        self.controller.as_mut().expect("controller started")
    }

    pub async fn class(&mut self, name: &str) -> Result<()> {
        self.create_class(h100_class(name)).await
    }

    /// Any AcceleratorClass (JSON), deleted by the cleanup.
    pub async fn create_class(&mut self, class: Value) -> Result<()> {
        let api = Api::all_with(self.client.clone(), &class_ar());
        let created = support::create(&api, class).await?;
        self.cleanup
            .add(None, class_ar(), &created.metadata.name.unwrap_or_default());
        Ok(())
    }

    /// A namespace and a budget for `class` there; the Kueue objects kaccel
    /// writes for it are deleted by the cleanup too.
    pub async fn budget(
        &mut self,
        name: &str,
        team: &str,
        ns: &str,
        class: &str,
        per_period: &str,
    ) -> Result<()> {
        self.create_budget(budget(name, team, ns, class, per_period))
            .await
    }

    /// Any CreditBudget (JSON) with its namespaces; the budget, the namespaces and
    /// the Kueue objects kaccel writes for it are deleted by the cleanup.
    pub async fn create_budget(&mut self, budget: Value) -> Result<()> {
        let name = budget["metadata"]["name"]
            .as_str()
            .context("budget without a name")?
            .to_string();
        let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
        let namespaces: Vec<String> = budget["spec"]["namespaces"]
            .as_array()
            .into_iter()
            .flatten()
            .map(text)
            .collect();
        let classes: Vec<String> = budget["spec"]["classes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| text(&c["name"]))
            .collect();
        for ns in &namespaces {
            support::namespace(&self.client, ns).await?;
            self.cleanup.add_namespace(ns);
        }
        support::create(&self.budgets, budget).await?;
        self.cleanup.add(None, budget_ar(), &name);
        self.cleanup
            .add(None, kueue("Cohort"), &format!("{}-{name}", self.root));
        // A class that does not exist (the tests name those missing-*) gets no queues.
        for class in classes.iter().filter(|c| !c.starts_with("missing-")) {
            self.cleanup
                .add(None, kueue("ClusterQueue"), &format!("{name}-{class}"));
            for ns in &namespaces {
                self.cleanup.add(Some(ns), kueue("LocalQueue"), class);
            }
        }
        Ok(())
    }

    pub fn workloads(&self, ns: &str) -> Api<DynamicObject> {
        Api::namespaced_with(self.client.clone(), ns, &kueue("Workload"))
    }

    pub async fn workload(
        &mut self,
        ns: &str,
        name: &str,
        queue: &str,
        secs: u32,
    ) -> Result<Value> {
        self.create_workload(workload(ns, name, queue, secs)).await
    }

    /// A Workload someone else created (Kueue, for a Job), deleted (and settled)
    /// by the teardown like the test's own.
    pub fn track_workload(&mut self, ns: &str, name: &str) {
        self.workloads.push((ns.to_string(), name.to_string()));
    }

    /// Any Workload (JSON), deleted (and settled) by the teardown.
    pub async fn create_workload(&mut self, wl: Value) -> Result<Value> {
        let ns = wl["metadata"]["namespace"]
            .as_str()
            .context("Workload without a namespace")?
            .to_string();
        let created = support::create(&self.workloads(&ns), wl).await?;
        self.workloads
            .push((ns, created.metadata.name.clone().unwrap_or_default()));
        Ok(serde_json::to_value(created)?)
    }

    /// Deletes the Workloads while kaccel still runs (it settles them and drops
    /// its finalizer), stops kaccel, then deletes everything else.
    pub async fn teardown(mut self) {
        let dp = DeleteParams::background();
        for (ns, name) in &self.workloads {
            let _ = self.workloads(ns).delete(name, &dp).await;
        }
        for (ns, name) in &self.workloads {
            let api = self.workloads(ns);
            let gone = wait_for(
                &format!("Workload {ns}/{name} deleted"),
                Duration::from_secs(20),
                || async { Ok(api.get_opt(name).await?.is_none().then_some(())) },
            )
            .await;
            if gone.is_err() {
                // Only when a test failed with settlement impossible (the store
                // down): leave no object the namespace cannot lose.
                eprintln!("cleanup: Workload {ns}/{name} kept its finalizer; removing it");
                let _ = api
                    .patch(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
                    )
                    .await;
            }
        }
        if let Some(c) = self.controller.as_ref() {
            eprintln!("--- kaccel log tail ---\n{}", c.log_tail());
        }
        self.controller = None;
        self.cleanup.run(&self.client).await;
    }
}

/// Runs `body` with a fresh `Env`, always tearing it down.
macro_rules! with_env {
    ($prefix:expr, |$env:ident| $body:expr) => {{
        let _guard = $crate::support::serial().await;
        let mut $env = $crate::ledger::Env::new($prefix).await.unwrap();
        // A failed assertion must not skip the teardown: later tests share the cluster.
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(async {
            let r: anyhow::Result<()> = $body;
            r
        }))
        .await;
        $env.teardown().await;
        match result {
            Ok(r) => r.unwrap(),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }};
}
pub(crate) use with_env;

// ---------------------------------------------------------------------------
// 1. A small budget, start to end, on both stores.

#[tokio::test]
async fn small_budget_flow_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("lsq", |env| small_budget_flow(&mut env, &store).await);
}

#[tokio::test]
async fn small_budget_flow_postgres() {
    let pg = Postgres::new(25611);
    let store = pg.start().unwrap();
    with_env!("lpg", |env| small_budget_flow(&mut env, &store).await);
    drop(pg);
}

async fn small_budget_flow(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (budget, team, ns) = (
        format!("vision-{id}"),
        format!("vis-team-{id}"),
        format!("vis-{id}"),
    );
    env.class(&class).await?;
    env.budget(&budget, &team, &ns, &class, "100").await?;
    env.start(store);
    let started = Instant::now();

    wait_figures(&env.budgets, &budget, expect(100, 0, 0)).await?;
    let b = env.budgets.get(&budget).await?.data;
    assert!(
        b["status"]["periodStart"]
            .as_str()
            .is_some_and(|s| s.starts_with("2026-12-01")),
        "{b}"
    );

    // W1 gets 60 credits reserved (60 s x 1 device x 1 credit/s).
    let wl = env.workloads(&ns);
    env.workload(&ns, "w1", &class, 60).await?;
    let w1 = support::wait_until(
        &wl,
        "w1",
        "admitted with the credit check Ready",
        WAIT,
        admitted,
    )
    .await?;
    let msg = check_message(&w1);
    assert!(
        msg.starts_with(&format!(
            "reserved 60 credits of budget {budget} for up to 60s"
        )),
        "{msg}"
    );
    assert!(has_finalizer(&w1), "{w1}");
    wait_figures(&env.budgets, &budget, expect(100, 60, 0)).await?;
    // The priced lines, written with the finalizer before the Reserve entry.
    let record: Value = serde_json::from_str(
        w1["metadata"]["annotations"]["kaccel.io/credit-reservation"]
            .as_str()
            .unwrap_or_default(),
    )?;
    assert_eq!(
        (
            &record["admission"],
            &record["budget"],
            &record["horizonSeconds"]
        ),
        (&json!(1), &json!(budget), &json!(60)),
        "{record}"
    );
    assert_eq!(record["lines"][0]["deviceUnits"], 1, "{record}");
    // Removed by hand while the reservation is open: kaccel rebuilds the record
    // from the Reserve entries and writes it back, the same, so W1 is still
    // settled in full below.
    let written = w1["metadata"]["annotations"]["kaccel.io/credit-reservation"].clone();
    wl.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "remove", "path": "/metadata/annotations/kaccel.io~1credit-reservation"}
        ]))?),
    )
    .await?;
    let rebuilt = support::wait_until(&wl, "w1", "the record rebuilt from the ledger", WAIT, |o| {
        o.pointer("/metadata/annotations/kaccel.io~1credit-reservation")
            .is_some()
    })
    .await?;
    assert_eq!(
        rebuilt["metadata"]["annotations"]["kaccel.io/credit-reservation"], written,
        "the rebuilt record differs from the one written at admission"
    );

    // W2 needs 60 of the 40 left: it waits, and says why.
    env.workload(&ns, "w2", &class, 60).await?;
    let w2 = support::wait_until(&wl, "w2", "credit check message", WAIT, |o| {
        check_message(o).contains("credits left")
    })
    .await?;
    let msg = check_message(&w2);
    assert!(
        msg.starts_with(&format!(
            "team {team} has 40 credits left; this workload needs up to 60 ("
        )),
        "{msg}"
    );
    assert!(msg.contains("3600/device-hour"), "{msg}");
    // Priced, it carries the finalizer and record already (written before the
    // budget is looked at), with no Reserve entry behind them yet.
    assert!(has_finalizer(&w2), "{w2}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let w2 = support::get_json(&wl, "w2").await?;
    assert!(
        !support::is_true(&w2, "Admitted"),
        "W2 admitted without credits: {w2}"
    );

    // W1 ends: it is charged exactly its run time, the rest is released, and W2 goes in.
    let reserved_at = transition(&w1, "QuotaReserved")?;
    let finished_at = finish(&wl, "w1").await?;
    let spent = finished_at - reserved_at;
    assert!((3..60).contains(&spent), "W1 ran {spent}s");
    support::wait_until(&wl, "w1", "finalizer removed", WAIT, |o| !has_finalizer(o)).await?;
    let w2 = support::wait_until(&wl, "w2", "admitted after W1 settled", WAIT, admitted).await?;
    assert!(check_message(&w2).starts_with(&format!("reserved 60 credits of budget {budget}")));
    let b = wait_figures(&env.budgets, &budget, expect(100, 60, spent)).await?;
    // Burn rate: what was posted in the last 24 h, per hour (micro-credit exact);
    // exhaustion is projected from it, ceil(remaining / burn) after the start of
    // the hour (so the status does not change at every pass).
    let burn = spent * MICROS / 24;
    assert_eq!(
        b["status"]["burnRatePerHour"],
        kaccel::ledger::entry::format_micros(i128::from(burn)).as_str(),
        "{}",
        b["status"]
    );
    let projected = b["status"]["projectedExhaustion"]
        .as_str()
        .context("projectedExhaustion set while burning")?;
    let remaining = (40 - spent) * MICROS;
    let ahead = (remaining * 3600 + burn - 1) / burn;
    let projected = seconds(projected)?;
    let hour = |t: i64| t - t.rem_euclid(3600);
    ensure!(
        [hour(finished_at), hour(finished_at + 120)].contains(&(projected - ahead)),
        "projected exhaustion {projected} is not {ahead} s after the hour of {finished_at}"
    );

    let w1_uid = w1["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let entries = export(store, Some(&budget))?;
    let mine = workload_entries(&entries, &w1_uid);
    assert_eq!(
        mine,
        BTreeMap::from([
            ("Reserve".to_string(), 60 * MICROS),
            ("Post".to_string(), spent * MICROS),
            ("Void".to_string(), (60 - spent) * MICROS),
        ]),
        "W1's entries"
    );

    // Exhaustion: a budget that one reservation empties is held, and a top-up frees it.
    let (ex, ex_team, ex_ns) = (
        format!("ex-{id}"),
        format!("ex-team-{id}"),
        format!("ex-{id}"),
    );
    env.budget(&ex, &ex_team, &ex_ns, &class, "60").await?;
    let ex_cq = format!("{ex}-{class}");
    wait_figures(&env.budgets, &ex, expect(60, 0, 0)).await?;
    let exwl = env.workloads(&ex_ns);
    env.workload(&ex_ns, "w3", &class, 60).await?;
    support::wait_until(&exwl, "w3", "admitted", WAIT, admitted).await?;
    let b = wait_figures(&env.budgets, &ex, expect(60, 60, 0)).await?;
    let b = support::wait_until(&env.budgets, &ex, "Exhausted=True", WAIT, |b| {
        support::is_true(b, "Exhausted")
    })
    .await
    .with_context(|| format!("budget at 0: {}", b["status"]))?;
    eprintln!(
        "exhausted: {}",
        support::condition(&b, "Exhausted").unwrap()
    );
    support::wait_until(&env.cqs, &ex_cq, "stopPolicy Hold", WAIT, |cq| {
        cq["spec"]["stopPolicy"] == "Hold"
    })
    .await?;
    env.workload(&ex_ns, "w4", &class, 60).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let w4 = support::get_json(&exwl, "w4").await?;
    assert!(
        !support::is_true(&w4, "QuotaReserved") && !support::is_true(&w4, "Admitted"),
        "W4 admitted on a held queue: {w4}"
    );
    let w4_uid = w4["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    assert!(workload_entries(&export(store, Some(&ex))?, &w4_uid).is_empty());

    top_up(&env.budgets, &ex, "more", "200").await?;
    support::wait_until(&env.cqs, &ex_cq, "Hold lifted", WAIT, |cq| {
        cq["spec"]["stopPolicy"].is_null() || cq["spec"]["stopPolicy"] == "None"
    })
    .await?;
    support::wait_until(&exwl, "w4", "admitted after the top-up", WAIT, admitted).await?;
    let b = wait_figures(&env.budgets, &ex, expect(260, 120, 0)).await?;
    assert!(!support::is_true(&b, "Exhausted"), "{}", b["status"]);

    // The ledger agrees with itself, with Kueue (open reservations of W2, W3, W4
    // against the Workloads holding quota and the ClusterQueues' usage) and with
    // every status figure, exactly.
    let (ok, report) = verify_cluster(store, true).await?;
    assert!(ok, "ledger verify --cluster failed:\n{report}");
    assert!(report.contains("(3 open)"), "{report}");
    assert!(report.contains("ledger verify: OK"), "{report}");
    let all = export(store, None)?;
    for name in [&budget, &ex] {
        let b = env.budgets.get(name).await?.data;
        let mine: Vec<Value> = all
            .iter()
            .filter(|e| e["budget"] == name.as_str())
            .cloned()
            .collect();
        assert_eq!(
            balances(&mine)?,
            figures(&b),
            "budget {name}: entries {:?}",
            kind_sums(&mine)
        );
    }
    let ex_grants: Vec<i64> = all
        .iter()
        .filter(|e| e["budget"] == ex.as_str() && e["kind"] == "Grant")
        .map(|e| e["credits"].as_i64().unwrap_or_default() / MICROS)
        .collect();
    assert_eq!(ex_grants.iter().sum::<i64>(), 260, "{ex_grants:?}");
    assert!(ex_grants.contains(&200), "top-up grant: {ex_grants:?}");
    finance_matches_ledger(store, &[(&team, &budget), (&ex_team, &ex)], &w1_uid, spent)?;
    eprintln!("small budget flow on {store}: {:?}", started.elapsed());
    Ok(())
}

// ---------------------------------------------------------------------------
// 2. Bad input is refused or reported, and changes nothing.

#[tokio::test]
async fn bad_input_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let store = format!("sqlite:{}", path.display());
    with_env!("lbad", |env| bad_input(&mut env, &store, &path).await);
}

pub fn sqlite(path: &std::path::Path, sql: &str) -> Result<String> {
    let out = Command::new("sqlite3")
        .arg(path)
        .arg(sql)
        .output()
        .context("running sqlite3")?;
    ensure!(
        out.status.success(),
        "sqlite3 {sql}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

async fn bad_input(env: &mut Env, store: &str, path: &std::path::Path) -> Result<()> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (budget, team, ns) = (
        format!("bad-{id}"),
        format!("bad-team-{id}"),
        format!("bad-{id}"),
    );
    env.class(&class).await?;
    env.budget(&budget, &team, &ns, &class, "100").await?;
    env.start(store);
    wait_figures(&env.budgets, &budget, expect(100, 0, 0)).await?;
    let wl = env.workloads(&ns);
    env.workload(&ns, "w1", &class, 60).await?;
    let w1 = support::wait_until(&wl, "w1", "admitted", WAIT, admitted).await?;
    let before_status = wait_figures(&env.budgets, &budget, expect(100, 60, 0)).await?;
    let before = export(store, None)?;

    // A negative top-up: the API server refuses it, naming the field.
    let err = env
        .budgets
        .patch(
            &budget,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"credits": {"topUps": [
                {"name": "minus", "credits": "-50", "reason": "e2e"}]}}})),
        )
        .await
        .expect_err("a negative top-up is refused");
    let text = err.to_string();
    assert!(text.contains("spec.credits.topUps"), "{text}");
    let spec = env.budgets.get(&budget).await?.data;
    assert!(
        spec["spec"]["credits"]["topUps"].is_null(),
        "{}",
        spec["spec"]
    );

    // A budget naming a class that does not exist: a condition naming it, its
    // grant as usual, nothing else.
    let (ghost, ghost_ns, missing) = (
        format!("ghost-{id}"),
        format!("ghost-{id}"),
        format!("missing-{id}"),
    );
    env.budget(
        &ghost,
        &format!("ghost-team-{id}"),
        &ghost_ns,
        &missing,
        "100",
    )
    .await?;
    let g = support::wait_until(&env.budgets, &ghost, "ClassNotFound", WAIT, |b| {
        support::is_true(b, "ClassNotFound")
    })
    .await?;
    let c = support::condition(&g, "ClassNotFound").unwrap();
    assert!(
        c["message"].as_str().unwrap_or_default().contains(&missing),
        "{c}"
    );
    wait_figures(&env.budgets, &ghost, expect(100, 0, 0)).await?;
    assert!(
        env.cqs
            .get_opt(&format!("{ghost}-{missing}"))
            .await?
            .is_none()
    );
    let ghost_entries = export(store, Some(&ghost))?;
    assert_eq!(
        kind_sums(&ghost_entries),
        BTreeMap::from([("Grant".to_string(), 100 * MICROS)])
    );

    // Nothing else changed: same entries (plus the ghost's grant), same figures.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after: Vec<Value> = export(store, None)?
        .into_iter()
        .filter(|e| e["budget"] != ghost.as_str())
        .collect();
    assert_eq!(after, before, "the ledger changed");
    let now = env.budgets.get(&budget).await?.data;
    assert_eq!(figures(&now), figures(&before_status));
    let (ok, report) = verify(store)?;
    assert!(ok, "{report}");

    // A corrupted row: verify and export name it; kaccel reports it and lives on.
    let w1_uid = w1["metadata"]["uid"].as_str().unwrap_or_default();
    let row = sqlite(
        path,
        &format!("SELECT id FROM entries WHERE kind = 'Reserve' AND workload_uid = '{w1_uid}'"),
    )?;
    let row: i64 = row.parse().with_context(|| format!("row id {row:?}"))?;
    sqlite(
        path,
        &format!("UPDATE entries SET kind = 'Bogus' WHERE id = {row}"),
    )?;
    let (ok, report) = verify(store)?;
    assert!(!ok, "verify passed on a corrupted ledger:\n{report}");
    assert!(
        report.contains(&format!("row id {row}")) && report.contains("column kind"),
        "{report}"
    );
    let err = export(store, None).expect_err("export of a corrupted ledger fails");
    assert!(
        format!("{err:#}").contains(&format!("row id {row}")),
        "{err:#}"
    );

    // Balances come from the totals each append keeps (schema 5), not from
    // the rows; the Workload's own reconcile reads its entries and names the
    // row. Any change to W1 (Kueue writes its status often) brings it.
    wl.patch(
        "w1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {"e2e.kaccel.io/poke": "corrupted"}}})),
    )
    .await?;
    let log = env.controller().log.clone();
    let seen = wait_for(
        "kaccel logs the corrupted row",
        Duration::from_secs(20),
        || async {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            // The column and the value are named on every path.
            Ok(text
                .lines()
                .find(|l| {
                    l.contains("corrupted ledger row id") && l.contains("column kind: \"Bogus\"")
                })
                .map(str::to_string))
        },
    )
    .await?;
    eprintln!("kaccel: {seen}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        env.controller().is_running(),
        "kaccel exited on a corrupted row:\n{}",
        env.controller().log_tail()
    );
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        !text.contains("panicked"),
        "kaccel panicked:\n{}",
        env.controller().log_tail()
    );

    // Repaired, the ledger verifies again and kaccel settles as usual.
    sqlite(
        path,
        &format!("UPDATE entries SET kind = 'Reserve' WHERE id = {row}"),
    )?;
    let (ok, report) = verify(store)?;
    assert!(ok, "{report}");
    Ok(())
}

// ---------------------------------------------------------------------------
// 3. PostgreSQL away at start and mid-run: nothing is lost.

#[tokio::test]
async fn unreachable_postgres_at_start_and_mid_run_loses_nothing() {
    let pg = Postgres::new(25612);
    with_env!("lun", |env| unreachable_postgres(&mut env, &pg).await);
    drop(pg);
}

async fn unreachable_postgres(env: &mut Env, pg: &Postgres) -> Result<()> {
    let id = env.id.clone();
    let store = pg.url();
    let class = format!("h100-{id}");
    let (budget, team, ns) = (
        format!("un-{id}"),
        format!("un-team-{id}"),
        format!("un-{id}"),
    );
    env.class(&class).await?;
    env.budget(&budget, &team, &ns, &class, "100").await?;

    // No server: the AdmissionCheck is inactive and says which store.
    env.start(&store);
    let checks: Api<DynamicObject> = Api::all_with(env.client.clone(), &kueue("AdmissionCheck"));
    let port = format!("127.0.0.1:{}", pg.port);
    let ac = wait_for(
        "AdmissionCheck Active=False naming the store",
        WAIT,
        || async {
            let Some(ac) = checks.get_opt(CHECK).await? else {
                return Ok(None);
            };
            let ac = serde_json::to_value(ac)?;
            let found = support::condition(&ac, "Active").is_some_and(|c| {
                c["status"] == "False" && c["message"].as_str().unwrap_or_default().contains(&port)
            });
            Ok(found.then_some(ac))
        },
    )
    .await?;
    eprintln!("store down: {}", support::condition(&ac, "Active").unwrap());
    let wl = env.workloads(&ns);
    env.workload(&ns, "w1", &class, 60).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let w1 = support::get_json(&wl, "w1").await?;
    assert!(
        !support::is_true(&w1, "Admitted"),
        "admitted without a ledger: {w1}"
    );

    // The server comes: the check turns Active and W1 goes in.
    pg.start()?;
    wait_for("AdmissionCheck Active=True", WAIT, || async {
        let ac = serde_json::to_value(checks.get(CHECK).await?)?;
        Ok(support::condition(&ac, "Active")
            .is_some_and(|c| c["status"] == "True")
            .then_some(()))
    })
    .await?;
    let w1 =
        support::wait_until(&wl, "w1", "admitted once the store answers", WAIT, admitted).await?;
    wait_figures(&env.budgets, &budget, expect(100, 60, 0)).await?;

    // The server goes mid-run; W1 ends: its settlement cannot be written, so the
    // finalizer stays.
    pg.stop()?;
    // Let W1 run a few seconds, so its charge is not zero.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let reserved_at = transition(&w1, "QuotaReserved")?;
    let finished_at = finish(&wl, "w1").await?;
    let spent = finished_at - reserved_at;
    assert!(spent >= 3, "W1 ran {spent} s");
    tokio::time::sleep(Duration::from_secs(8)).await;
    let w1 = support::get_json(&wl, "w1").await?;
    assert!(
        has_finalizer(&w1),
        "finalizer dropped while the ledger was away: {w1}"
    );
    assert!(
        env.controller().is_running(),
        "{}",
        env.controller().log_tail()
    );

    // The server is back: the settlement is written, the finalizer goes, the
    // charge is what a run without the outage gives.
    pg.start()?;
    support::wait_until(&wl, "w1", "settled: finalizer removed", WAIT, |o| {
        !has_finalizer(o)
    })
    .await?;
    wait_figures(&env.budgets, &budget, expect(100, 0, spent)).await?;
    let uid = w1["metadata"]["uid"].as_str().unwrap_or_default();
    let entries = export(&store, Some(&budget))?;
    assert_eq!(
        workload_entries(&entries, uid),
        BTreeMap::from([
            ("Reserve".to_string(), 60 * MICROS),
            ("Post".to_string(), spent * MICROS),
            ("Void".to_string(), (60 - spent) * MICROS),
        ]),
        "W1's entries"
    );
    let (ok, report) = verify(&store)?;
    assert!(ok, "{report}");
    let b = env.budgets.get(&budget).await?.data;
    assert_eq!(balances(&entries)?, figures(&b));
    Ok(())
}

// ---------------------------------------------------------------------------
// 4. Every admitted second is charged: reservations renew term by term, and a
//    renewal the budget cannot cover stops the Workload or overdraws, per policy.

/// `budget`'s `spec.admission` set to `admission` (a merge patch).
async fn set_admission(env: &Env, budget: &str, admission: Value) -> Result<()> {
    env.budgets
        .patch(
            budget,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"admission": admission}})),
        )
        .await
        .with_context(|| format!("setting spec.admission of {budget}"))?;
    Ok(())
}

impl Env {
    /// A Workload with no `maximumExecutionTimeSeconds`: its reservation is
    /// renewed every horizon of its budget while it runs.
    async fn open_ended_workload(&mut self, ns: &str, name: &str, queue: &str) -> Result<Value> {
        let mut w = workload(ns, name, queue, 1);
        w["spec"]
            .as_object_mut()
            .context("workload spec")?
            .remove("maximumExecutionTimeSeconds");
        let created = support::create(&self.workloads(ns), w).await?;
        self.workloads.push((ns.to_string(), name.to_string()));
        Ok(serde_json::to_value(created)?)
    }
}

/// The Workload's uid and its entries of `kind` (from the JSON export).
fn entries_of<'a>(entries: &'a [Value], uid: &str, kind: &str) -> Vec<&'a Value> {
    entries
        .iter()
        .filter(|e| e["workloadUid"] == uid && e["kind"] == kind)
        .collect()
}

/// What the Workload `uid` was charged: its Posts, less the usage posted past
/// an end Kueue stamped before kaccel saw it, which the settlement refunds with
/// a `posted-past-end` Correction (a deactivation Kueue stamps late in one
/// second, and kaccel's Post at the next second before the Workload shows it).
fn charged(entries: &[Value], uid: &str) -> i64 {
    let refunds: Vec<&Value> = entries_of(entries, uid, "Correction")
        .into_iter()
        .filter(|e| {
            e["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with(kaccel::ledger::charge::POSTED_PAST_END))
        })
        .collect();
    sum_credits(&entries_of(entries, uid, "Post")) + sum_credits(&refunds)
}

fn sum_credits(entries: &[&Value]) -> i64 {
    entries
        .iter()
        .map(|e| e["credits"].as_i64().unwrap_or(0))
        .sum()
}

fn uid_of(w: &Value) -> String {
    w["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[tokio::test]
async fn a_workload_held_for_three_and_a_half_horizons_is_charged_in_full() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("lrn", |env| renewal_charges_in_full(&mut env, &store).await);
}

async fn renewal_charges_in_full(env: &mut Env, store: &str) -> Result<()> {
    const HORIZON: i64 = 4;
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (budget, ns) = (format!("renew-{id}"), format!("renew-{id}"));
    env.class(&class).await?;
    env.budget(&budget, &format!("renew-team-{id}"), &ns, &class, "1000")
        .await?;
    set_admission(env, &budget, json!({"defaultHorizonSeconds": HORIZON})).await?;
    env.start(store);
    wait_figures(&env.budgets, &budget, expect(1000, 0, 0)).await?;

    let wl = env.workloads(&ns);
    env.open_ended_workload(&ns, "long", &class).await?;
    let w = support::wait_until(&wl, "long", "admitted", WAIT, admitted).await?;
    let note = check_message(&w);
    assert!(
        note.starts_with(&format!(
            "reserved 4 credits of budget {budget} for the first 4s, renewed every 4s"
        )),
        "{note}"
    );
    let admitted_at = transition(&w, "QuotaReserved")?;
    // Hold it for 3.5 horizons (14 s), then finish.
    let hold_until = admitted_at + 7 * HORIZON / 2;
    while jiff::Timestamp::now().as_second() < hold_until {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let finished_at = finish(&wl, "long").await?;
    support::wait_until(&wl, "long", "settled (finalizer removed)", WAIT, |o| {
        !has_finalizer(o)
    })
    .await?;
    let held = finished_at - admitted_at;
    assert!(held >= 7 * HORIZON / 2, "held {held}s");

    let entries = export(store, Some(&budget))?;
    let uid = uid_of(&w);
    let reserves = entries_of(&entries, &uid, "Reserve");
    let posts = entries_of(&entries, &uid, "Post");
    let voids = entries_of(&entries, &uid, "Void");
    // Rate x units x admitted seconds, no clip at the horizon.
    assert_eq!(
        sum_credits(&posts),
        held * MICROS,
        "posted for {held}s: {posts:#?}"
    );
    let terms = reserves.len() as i64;
    assert!(
        terms >= (held + HORIZON - 1) / HORIZON,
        "{terms} terms for {held}s: {reserves:#?}"
    );
    assert!(
        reserves.iter().skip(1).all(|r| r["reason"]
            .as_str()
            .is_some_and(|s| s.starts_with("renewal") || s.starts_with("overrun"))),
        "{reserves:#?}"
    );
    assert!(
        reserves.iter().any(|r| r["reason"]
            .as_str()
            .is_some_and(|s| s.starts_with("renewal"))),
        "no renewal before the term ran out: {reserves:#?}"
    );
    assert_eq!(voids.len(), 1, "{voids:#?}");
    assert_eq!(
        sum_credits(&reserves),
        sum_credits(&posts) + sum_credits(&voids)
    );
    let b = wait_figures(&env.budgets, &budget, expect(1000, 0, held)).await?;
    assert_eq!(balances(&entries)?, figures(&b));
    let (ok, report) = verify(store)?;
    assert!(ok, "{report}");
    eprintln!(
        "renewal: held {held}s over {terms} terms of {HORIZON}s, charged {} credits",
        sum_credits(&posts) / MICROS
    );
    Ok(())
}

#[tokio::test]
async fn a_renewal_the_budget_cannot_cover_stops_or_overdraws_per_policy() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("lst", |env| renewal_short(&mut env, &store).await);
}

/// Kueue's eviction time of a deactivated Workload (the end of its charge).
fn evicted_at(w: &Value) -> Result<i64> {
    transition(w, "Evicted")
}

async fn renewal_short(env: &mut Env, store: &str) -> Result<()> {
    const HORIZON: i64 = 4;
    let id = env.id.clone();
    let class = format!("h100-{id}");
    env.class(&class).await?;
    // Two teams with 10 credits and 4 s terms (4 credits each): the first term
    // and one renewal fit (8), the next does not.
    let (stop, stop_ns) = (format!("stop-{id}"), format!("stop-{id}"));
    let (over, over_ns) = (format!("over-{id}"), format!("over-{id}"));
    env.budget(&stop, &format!("stop-team-{id}"), &stop_ns, &class, "10")
        .await?;
    env.budget(&over, &format!("over-team-{id}"), &over_ns, &class, "10")
        .await?;
    set_admission(env, &stop, json!({"defaultHorizonSeconds": HORIZON})).await?;
    // Overdraft down to 3 below zero: one more renewal (-2), not two (-6).
    set_admission(
        env,
        &over,
        json!({"defaultHorizonSeconds": HORIZON, "whenRenewalShort": "Overdraft", "overdraftLimit": "3"}),
    )
    .await?;
    env.start(store);
    wait_figures(&env.budgets, &stop, expect(10, 0, 0)).await?;
    wait_figures(&env.budgets, &over, expect(10, 0, 0)).await?;
    env.open_ended_workload(&stop_ns, "w", &class).await?;
    env.open_ended_workload(&over_ns, "w", &class).await?;

    // The overdrawn team: status shows it below zero, with a condition.
    let b = support::wait_until(&env.budgets, &over, "Overdrawn=True", WAIT, |b| {
        support::is_true(b, "Overdrawn")
    })
    .await?;
    let overdrawn = support::condition(&b, "Overdrawn").unwrap();
    assert!(
        overdrawn["message"]
            .as_str()
            .is_some_and(|m| m.contains("remaining credits are -")),
        "{overdrawn}"
    );

    for (budget, ns, short_by) in [
        (&stop, &stop_ns, "short by 2"),
        (&over, &over_ns, "short by 3"),
    ] {
        let wl = env.workloads(ns);
        // Stopped through Kueue, saying why.
        let w = support::wait_until(&wl, "w", "deactivated for want of credits", WAIT, |o| {
            o["spec"]["active"] == false
        })
        .await?;
        let why = w["metadata"]["annotations"]["kaccel.io/stopped-for-credits"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            why.contains(&format!("budget {budget}")) && why.contains(short_by),
            "{budget}: {why}"
        );
        let events: Api<k8s_openapi::api::core::v1::Event> =
            Api::namespaced(env.client.clone(), ns);
        let found = wait_for("a CreditsExhausted Event", WAIT, || async {
            let list = events
                .list(&kube::api::ListParams::default().fields("involvedObject.name=w"))
                .await?;
            Ok(list
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some("CreditsExhausted")))
        })
        .await?;
        assert!(
            found
                .message
                .as_deref()
                .is_some_and(|m| m.contains(short_by)),
            "{found:?}"
        );
        // Kueue evicts it; the ledger settles at the eviction, every second charged.
        let w = support::wait_until(&wl, "w", "evicted", WAIT, |o| {
            support::is_true(o, "Evicted")
        })
        .await?;
        let uid = uid_of(&w);
        let entries = wait_for("the settlement", WAIT, || async {
            let entries = export(store, Some(budget))?;
            Ok((!entries_of(&entries, &uid, "Void").is_empty()).then_some(entries))
        })
        .await?;
        let held = evicted_at(&w)? - transition(&w, "QuotaReserved")?;
        let charged_credits = charged(&entries, &uid);
        assert_eq!(charged_credits, held * MICROS, "{budget}: held {held}s");
        let reserves = entries_of(&entries, &uid, "Reserve");
        let overdrafts = reserves
            .iter()
            .filter(|r| {
                r["reason"]
                    .as_str()
                    .is_some_and(|s| s.contains("overdraft"))
            })
            .count();
        assert_eq!(
            overdrafts,
            usize::from(budget == &over),
            "{budget}: {reserves:#?}"
        );
        eprintln!(
            "{budget}: stopped after {held}s, {} terms, {} credits charged",
            reserves.len(),
            charged_credits / MICROS
        );
    }
    let (ok, report) = verify(store)?;
    assert!(ok, "{report}");
    Ok(())
}

// ---------------------------------------------------------------------------
// An eviction kaccel never saw.

/// Kueue's reservation write landed while an API server restart lost its
/// answer, and Kueue wrote the reservation again, stamped later, with no
/// eviction (the crash test's w026: kaccel read it as a re-admission, settled
/// the first 2 s and charged nothing after). The test writes the second stamp
/// as Kueue did: the admission goes on, once, charged from Kueue's new time.
#[tokio::test]
async fn a_reservation_kueue_stamps_again_is_one_admission_from_the_new_time() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("restamp", |env| restamped(&mut env, &store).await);
}

/// One Workload of one H100 class on a budget of 1,000,000 credits, kaccel
/// running on `store`, admitted.
struct OneAdmitted {
    budget: String,
    name: String,
    uid: String,
    wls: Api<DynamicObject>,
    /// When Kueue reserved its quota.
    start: i64,
}

async fn one_admitted(env: &mut Env, store: &str, tag: &str) -> Result<OneAdmitted> {
    let id = env.id.clone();
    let class = format!("h100-{id}");
    let (budget, ns) = (format!("{tag}b-{id}"), format!("{tag}n-{id}"));
    env.class(&class).await?;
    env.budget(&budget, &format!("team-{tag}"), &ns, &class, "1000000")
        .await?;
    env.start(store);
    let name = format!("w-{id}");
    let wl = env.workload(&ns, &name, &class, 3600).await?;
    let wls = env.workloads(&ns);
    let first = crate::controller::wait_obj(&wls, &name, "admitted", admitted).await?;
    Ok(OneAdmitted {
        budget,
        uid: uid_of(&wl),
        start: transition(&first, "QuotaReserved")?,
        name,
        wls,
    })
}

async fn restamped(env: &mut Env, store: &str) -> Result<()> {
    let OneAdmitted {
        budget,
        name,
        uid,
        wls,
        start,
    } = one_admitted(env, store, "r").await?;
    // Later than the first stamp, well before the first post (60 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restamp = start + 2;
    let stamp = jiff::Timestamp::from_second(restamp)?
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    wait_for("QuotaReserved stamped again", WAIT, || async {
        let mut w = support::get_json(&wls, &name).await?;
        let conditions = w["status"]["conditions"]
            .as_array_mut()
            .context("conditions")?;
        for c in conditions
            .iter_mut()
            .filter(|c| c["type"] == "QuotaReserved")
        {
            c["lastTransitionTime"] = json!(stamp);
        }
        match wls
            .replace_status(&name, &Default::default(), &support::object(w))
            .await
        {
            Ok(_) => Ok(Some(())),
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(None),
            Err(e) => Err(e.into()),
        }
    })
    .await?;
    // kaccel moves its record to the new time; nothing is settled.
    let record_at = |w: &Value| {
        w["metadata"]["annotations"]["kaccel.io/credit-reservation"]
            .as_str()
            .and_then(|r| serde_json::from_str::<Value>(r).ok())
            .and_then(|r| r["admittedAt"].as_i64())
    };
    let moved = crate::controller::wait_obj(&wls, &name, "the record at the new time", |w| {
        record_at(w) == Some(restamp)
    })
    .await?;
    ensure!(
        admitted(&moved) && has_finalizer(&moved),
        "still admitted and charged: {moved}"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let finished_at = finish(&wls, &name).await?;
    support::wait_until(&wls, &name, "settled (finalizer removed)", WAIT, |o| {
        !has_finalizer(o)
    })
    .await?;

    let entries = export(store, Some(&budget))?;
    let mine: Vec<&Value> = entries
        .iter()
        .filter(|e| e["workloadUid"] == uid.as_str())
        .collect();
    ensure!(
        !mine.is_empty() && mine.iter().all(|e| e["admission"] == 1),
        "one admission: {mine:#?}"
    );
    let posts = entries_of(&entries, &uid, "Post");
    let reserves = entries_of(&entries, &uid, "Reserve");
    let voids = entries_of(&entries, &uid, "Void");
    eprintln!(
        "MEASURE reserved at {start}, stamped again at {restamp}, finished {finished_at}: posted {} credits",
        sum_credits(&posts) / MICROS
    );
    ensure!(
        sum_credits(&posts) == (finished_at - restamp) * MICROS,
        "posted {} µcredits; Kueue's stamp says {} s, the first {} s: {posts:#?}",
        sum_credits(&posts),
        finished_at - restamp,
        finished_at - start
    );
    ensure!(voids.len() == 1, "{voids:#?}");
    ensure!(
        sum_credits(&reserves) == sum_credits(&posts) + sum_credits(&voids),
        "{reserves:#?} {posts:#?} {voids:#?}"
    );
    let (ok, report) = verify(store)?;
    ensure!(ok, "{report}");
    Ok(())
}

/// kaccel is down while Kueue evicts a charged Workload (a deactivation), the
/// quota is released and the Workload is admitted again: Kueue rewrites the
/// Evicted condition at the re-admission, but it wrote the eviction's time on
/// kaccel's check when it reset it to Pending. Back up, kaccel settles the first
/// admission at the eviction, to the second, not at the re-admission.
#[tokio::test]
async fn an_eviction_kaccel_did_not_see_is_charged_to_the_eviction() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("unseen", |env| unseen_eviction(&mut env, &store).await);
}

async fn unseen_eviction(env: &mut Env, store: &str) -> Result<()> {
    let OneAdmitted {
        name,
        uid,
        wls,
        start,
        ..
    } = one_admitted(env, store, "u").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    // kaccel goes away; the Workload is deactivated, evicted, its quota
    // released (the job controller's part), then activated and admitted again.
    env.controller().kill();
    let active = |on: bool| json!({"spec": {"active": on}});
    wls.patch(&name, &PatchParams::default(), &Patch::Merge(active(false)))
        .await?;
    let evicted =
        crate::controller::wait_obj(&wls, &name, "evicted", |w| support::is_true(w, "Evicted"))
            .await?;
    let eviction = transition(&evicted, "Evicted")?;
    wait_for("quota released", WAIT, || async {
        let w = support::get_json(&wls, &name).await?;
        if support::is_true(&w, "QuotaReserved") {
            support::release_quota(&wls, &name, &w).await?;
            return Ok(None);
        }
        Ok(Some(()))
    })
    .await?;
    // Clearly later than the eviction, so the two ends cannot be confused.
    tokio::time::sleep(Duration::from_secs(2)).await;
    wls.patch(&name, &PatchParams::default(), &Patch::Merge(active(true)))
        .await?;
    let again = crate::controller::wait_obj(&wls, &name, "quota reserved again", |w| {
        support::is_true(w, "QuotaReserved")
            && transition(w, "QuotaReserved").is_ok_and(|t| t > eviction)
    })
    .await?;
    let readmitted = transition(&again, "QuotaReserved")?;
    ensure!(
        readmitted >= eviction + 2,
        "re-admitted at {readmitted}, evicted at {eviction}"
    );
    let check = credit_check(&again).context("kaccel's check")?;
    ensure!(
        check["state"] == "Pending"
            && check["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("Reset to Pending after eviction")),
        "kaccel's check as Kueue left it: {check}"
    );

    // kaccel back: the first admission ends at the eviction.
    env.start(store);
    crate::controller::wait_obj(&wls, &name, "admitted again by kaccel", admitted).await?;
    let posts: Vec<Value> = posts_of(store, &uid, WAIT)
        .await?
        .into_iter()
        .filter(|e| e["admission"] == 1)
        .collect();
    let posted: i64 = posts
        .iter()
        .map(|e| e["credits"].as_i64().unwrap_or(0))
        .sum();
    let reasons: Vec<&str> = posts.iter().filter_map(|e| e["reason"].as_str()).collect();
    eprintln!(
        "MEASURE admitted {start}, evicted {eviction}, re-admitted {readmitted}: admission 1 posted {} credits ({reasons:?})",
        posted / MICROS
    );
    ensure!(
        posted == (eviction - start) * MICROS,
        "admission 1 posted {posted} µcredits; Kueue counted {} s (to the eviction), {} s to the re-admission; {reasons:?}",
        eviction - start,
        readmitted - start
    );
    ensure!(
        reasons
            .iter()
            .any(|r| r.starts_with("usage until evicted, then re-admitted")),
        "{reasons:?}"
    );
    Ok(())
}
