//! `kaccel run` against the real kube-apiserver + Kueue: the binary is started as a
//! child process, exactly as an operator would run it out of cluster.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::{AcceleratorClass, CreditBudget};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(60);

/// A running `kaccel run`, killed (SIGKILL) when dropped.
pub struct Controller {
    child: Child,
    pub port: u16,
    pub log: std::path::PathBuf,
}

impl Controller {
    pub fn start(name: &str, port: u16, config: &str) -> Controller {
        let dir = std::env::temp_dir().join(format!("kaccel-e2e-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config_path = dir.join("config.yaml");
        std::fs::write(&config_path, config).unwrap();
        let log = dir.join("kaccel.log");
        let out = std::fs::File::create(&log).unwrap();
        // KACCEL_E2E_BIN: another build of kaccel (a measurement comparing two).
        let bin = std::env::var_os("KACCEL_E2E_BIN")
            .unwrap_or_else(|| env!("CARGO_BIN_EXE_kaccel").into());
        let child = Command::new(bin)
            .args(["run", "--config"])
            .arg(&config_path)
            .args(["--http-address", &format!("127.0.0.1:{port}")])
            .env("HOSTNAME", name)
            // Its own ServiceAccount and the manifests' RBAC, never the admin's.
            .env("KUBECONFIG", crate::support::controller_kubeconfig())
            // KACCEL_E2E_RUST_LOG: more of kaccel's log (a measurement tracing
            // its slow re-plans: `info,kube=warn,kaccel::replan=debug`).
            .env(
                "RUST_LOG",
                std::env::var("KACCEL_E2E_RUST_LOG").unwrap_or_else(|_| "info,kube=warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("kaccel starts");
        Controller { child, port, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Its exit status, once it has exited.
    pub fn try_exit(&mut self) -> std::io::Result<Option<std::process::ExitStatus>> {
        self.child.try_wait()
    }

    /// Whether the process is still alive (it has not exited).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn metrics(&self) -> Option<String> {
        http_get(self.port, "/metrics")
    }

    /// Sum of `kaccel_writes_total` over all kinds and verbs.
    pub fn writes(&self) -> Option<u64> {
        Some(metric_sum(&self.metrics()?, "kaccel_writes_total"))
    }

    pub fn is_leader(&self) -> bool {
        self.metrics()
            .is_some_and(|m| metric_sum(&m, "kaccel_leader") == 1)
    }

    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The /metrics text of a kaccel on `port` (None while it does not answer).
pub fn http_metrics(port: u16) -> Option<String> {
    http_get(port, "/metrics")
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut body = String::new();
    stream.read_to_string(&mut body).ok()?;
    body.starts_with("HTTP/1.1 200").then_some(body)
}

pub fn metric_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .map(|v| v as u64)
        .sum()
}

fn config(root_cohort: &str, leader: Option<(&str, u64)>) -> String {
    let le = match leader {
        Some((lease, secs)) => format!(
            "leaderElection:\n  enabled: true\n  leaseName: {lease}\n  leaseNamespace: kaccel-system\n  leaseDurationSeconds: {secs}\n  renewGraceSeconds: 2\n"
        ),
        None => "leaderElection:\n  enabled: false\n".into(),
    };
    format!(
        "rootCohort: {root_cohort}\ndebounceMs: 100\nmaxDelayMs: 500\nwatchResourceSlices: false\n{le}"
    )
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub async fn ensure_example_nodes(client: &Client) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for doc in serde_yaml::Deserializer::from_str(include_str!("../../examples/nodes.yaml")) {
        let node: Node = serde::Deserialize::deserialize(doc)?;
        if nodes.get_opt(&node.name_any()).await?.is_none() {
            // A Node's status is kept on create (there is no kubelet here).
            nodes
                .create(&PostParams::default(), &node)
                .await
                .context("creating example node")?;
        }
    }
    Ok(())
}

pub fn class_from_example(example: &str, name: &str) -> AcceleratorClass {
    let text = include_str!("../../examples/classes.yaml");
    for doc in serde_yaml::Deserializer::from_str(text) {
        let mut class: AcceleratorClass = serde::Deserialize::deserialize(doc).unwrap();
        if class.name_any() == example {
            class.metadata.name = Some(name.into());
            return class;
        }
    }
    panic!("no example class {example}");
}

/// Create `class`, a fresh namespace and a budget `team-<id>` there guaranteeing
/// `guaranteed` devices of the class; all deleted by `cleanup`. Returns the
/// namespace and the budget name.
pub async fn class_with_budget(
    client: &Client,
    cleanup: &mut Cleanup,
    id: &str,
    class: &AcceleratorClass,
    guaranteed: u32,
) -> Result<(String, String)> {
    let name = class.name_any();
    Api::<AcceleratorClass>::all(client.clone())
        .create(&PostParams::default(), class)
        .await?;
    cleanup.add(None, ApiResource::erase::<AcceleratorClass>(&()), &name);
    let ns = format!("ns-{id}");
    support::namespace(client, &ns).await?;
    cleanup.add_namespace(&ns);
    let team = format!("team-{id}");
    Api::<CreditBudget>::all(client.clone())
        .create(
            &PostParams::default(),
            &budget(&team, &ns, &[(&name, guaranteed)]),
        )
        .await?;
    cleanup.add(None, ApiResource::erase::<CreditBudget>(&()), &team);
    Ok((ns, team))
}

/// What kaccel plans for a class and the budget [`class_with_budget`] grants it,
/// under the root Cohort `root-<id>` the test's controller is started with.
pub struct Planned {
    pub ns: String,
    /// The CreditBudget (`team-<id>`).
    pub budget: String,
    pub root: String,
    pub cluster_queue: String,
}

/// [`class_with_budget`], with the Cohorts, ClusterQueue and LocalQueue kaccel
/// writes for them deleted by `cleanup` too.
pub async fn class_with_queues(
    client: &Client,
    cleanup: &mut Cleanup,
    id: &str,
    class: &AcceleratorClass,
    guaranteed: u32,
) -> Result<Planned> {
    let (ns, team) = class_with_budget(client, cleanup, id, class, guaranteed).await?;
    let root = format!("root-{id}");
    let class_name = class.name_any();
    let cluster_queue = format!("{team}-{class_name}");
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
    cleanup.add(None, kueue("ClusterQueue"), &cluster_queue);
    cleanup.add(Some(&ns), kueue("LocalQueue"), &class_name);
    Ok(Planned {
        ns,
        budget: team,
        root,
        cluster_queue,
    })
}

fn budget(name: &str, namespace: &str, grants: &[(&str, u32)]) -> CreditBudget {
    serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": { "name": name },
        "spec": {
            "team": "e2e", "namespaces": [namespace],
            "classes": grants.iter().map(|(c, n)| json!({"name": c, "guaranteedDevices": n})).collect::<Vec<_>>(),
            "credits": { "perPeriod": "1000", "period": { "start": "2026-12-01T00:00:00Z", "days": 30 } }
        }
    }))
    .unwrap()
}

fn gpu_workload(ns: &str, name: &str, queue: &str, count: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "queueName": queue, "podSets": [{ "name": "main", "count": count,
            "template": { "spec": { "restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": { "requests": { "cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8" },
                               "limits": { "nvidia.com/gpu": "8" } } }] } } }] }
    })
}

/// Like `support::wait_until`, but a missing object is "not yet" rather than an error:
/// the controller creates these.
pub async fn wait_obj(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    wait_for(&format!("{name}: {what}"), WAIT, || async {
        Ok(api
            .get_opt(name)
            .await?
            .map(|o| serde_json::to_value(o).unwrap_or_default())
            .filter(|v| pred(v)))
    })
    .await
}

pub fn cq_flavors(cq: &Value) -> Vec<String> {
    cq["spec"]["resourceGroups"][0]["flavors"]
        .as_array()
        .map(|fs| {
            fs.iter()
                .filter_map(|f| f["name"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await? {
            return Ok(v);
        }
        if Instant::now() > deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn class_condition(
    api: &Api<AcceleratorClass>,
    name: &str,
    type_: &str,
) -> Result<Option<(String, String, String)>> {
    let class = api.get(name).await?;
    Ok(class
        .status
        .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == type_))
        .map(|c| (c.status, c.reason, c.message)))
}

#[tokio::test]
async fn controller_writes_kueue_objects_and_keeps_them_true() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = lifecycle(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn lifecycle(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    ensure_example_nodes(client).await?;
    let id = support::unique("c");
    let (lt, inf, bad) = (format!("lt-{id}"), format!("inf-{id}"), format!("bad-{id}"));
    let (team, bad_team, ns) = (
        format!("team-{id}"),
        format!("badteam-{id}"),
        format!("ns-{id}"),
    );
    support::namespace(client, &ns).await?;
    cleanup.add_namespace(&ns);
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let budgets: Api<CreditBudget> = Api::all(client.clone());
    let class_ar = ApiResource::erase::<AcceleratorClass>(&());
    let budget_ar = ApiResource::erase::<CreditBudget>(&());
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue"));

    // A ClusterQueue kaccel did not write: it must never be touched.
    let unrelated = format!("unrelated-{id}");
    support::create(
        &cqs,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": unrelated}, "spec": {"namespaceSelector": {}}}),
    )
    .await?;
    cleanup.add(None, kueue("ClusterQueue"), &unrelated);
    let unrelated_generation = cqs.get(&unrelated).await?.metadata.generation;

    classes
        .create(
            &PostParams::default(),
            &class_from_example("large-training", &lt),
        )
        .await?;
    cleanup.add(None, class_ar.clone(), &lt);
    budgets
        .create(
            &PostParams::default(),
            &budget(&team, &ns, &[(&lt, 8), (&inf, 2)]),
        )
        .await?;
    cleanup.add(None, budget_ar.clone(), &team);

    let root = format!("root-{id}");
    let port = free_port();
    let mut controller = Controller::start(&format!("ctl-{id}"), port, &config(&root, None));
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));

    let lt_cq = format!("{team}-{lt}");
    let inf_cq = format!("{team}-{inf}");
    let result = async {
        // The class and budget become a Cohort, a ClusterQueue and a LocalQueue.
        wait_obj(&cqs, &lt_cq, "Active", |o| support::is_true(o, "Active")).await?;
        let lq = wait_obj(&lqs, &lt, "exists", |_| true).await?;
        assert_eq!(lq["spec"]["clusterQueue"], lt_cq.as_str());
        let ready = wait_for("class Ready", WAIT, || async {
            Ok(class_condition(&classes, &lt, "Ready").await?.filter(|c| c.0 == "True"))
        }).await?;
        eprintln!("class {lt} Ready: {}", ready.2);
        let status = classes.get(&lt).await?.status.unwrap();
        assert!(status.flavors[0].name.contains("h100"), "{:?}", status.flavors);
        // The budget's status is written right after the class's, in the same pass.
        wait_for("budget ClassNotFound naming the missing class", WAIT, || async {
            Ok(budgets.get(&team).await?.status.filter(|s| {
                s.conditions.iter().any(|c| c.type_ == "ClassNotFound" && c.message.contains(&inf))
            }))
        }).await?;

        // Time from applying a class to its Kueue objects existing (the budget
        // already names it).
        let applied = Instant::now();
        classes.create(&PostParams::default(), &class_from_example("inference", &inf)).await?;
        cleanup.add(None, class_ar.clone(), &inf);
        wait_for("inference ClusterQueue", WAIT, || async { Ok(cqs.get_opt(&inf_cq).await?) }).await?;
        wait_for("inference LocalQueue", WAIT, || async { Ok(lqs.get_opt(&inf).await?) }).await?;
        eprintln!("MEASURE class applied -> ClusterQueue and LocalQueue exist: {} ms", applied.elapsed().as_millis());

        // Kueue admits onto the class's first flavor; beyond quota waits.
        let wl: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
        support::create(&wl, gpu_workload(&ns, "fits", &lt, 1)).await?;
        cleanup.add(Some(&ns), kueue("Workload"), "fits");
        let admitted = support::wait_until(&wl, "fits", "QuotaReserved", WAIT, |o| support::is_true(o, "QuotaReserved")).await?;
        let flavor = admitted["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"].as_str().unwrap_or_default().to_string();
        assert!(flavor.contains("h100"), "admitted on {flavor}");
        support::create(&wl, gpu_workload(&ns, "too-big", &lt, 8)).await?;
        cleanup.add(Some(&ns), kueue("Workload"), "too-big");
        support::wait_until(&wl, "too-big", "QuotaReserved=False", WAIT, |o| {
            support::condition(o, "QuotaReserved").is_some_and(|c| c["status"] == "False")
        }).await?;

        // Raising the memory floor above 80 GB drops H100 from the class.
        let h100 = cq_flavors(&cqs.get(&lt_cq).await?.data_json()).into_iter().find(|f| f.contains("h100")).unwrap();
        classes.patch(&lt, &PatchParams::default(), &Patch::Merge(json!({"spec": {"selector": {"minMemoryMiB": 100000}}}))).await?;
        wait_for("H100 gone from the queue", WAIT, || async {
            let flavors = cq_flavors(&cqs.get(&lt_cq).await?.data_json());
            Ok((!flavors.contains(&h100) && !flavors.is_empty()).then_some(()))
        }).await?;

        // A hand edit of a queue kaccel owns is put back.
        let before = cqs.get(&inf_cq).await?.data_json()["spec"]["resourceGroups"][0]["flavors"][0]["resources"].clone();
        cqs.patch(&inf_cq, &PatchParams::default(), &Patch::Json::<()>(serde_json::from_value(json!([
            {"op": "replace", "path": "/spec/resourceGroups/0/flavors/0/resources/0/nominalQuota", "value": "99"}
        ]))?)).await?;
        let restored = Instant::now();
        wait_for("hand edit reverted", WAIT, || async {
            let now = cqs.get(&inf_cq).await?.data_json()["spec"]["resourceGroups"][0]["flavors"][0]["resources"].clone();
            Ok((now == before).then_some(()))
        }).await?;
        eprintln!("MEASURE hand edit reverted in {} ms", restored.elapsed().as_millis());

        // A class with a mistake CEL cannot see: Invalid, named field, no Kueue objects.
        let mut invalid = class_from_example("development-cpu", &bad);
        invalid.spec.selector.node_labels.insert("kaccel.io/pool".into(), "not valid!".into());
        classes.create(&PostParams::default(), &invalid).await?;
        cleanup.add(None, class_ar.clone(), &bad);
        budgets.create(&PostParams::default(), &budget(&bad_team, &ns, &[(&bad, 1)])).await?;
        cleanup.add(None, budget_ar.clone(), &bad_team);
        let cond = wait_for("Invalid condition", WAIT, || async {
            Ok(class_condition(&classes, &bad, "Invalid").await?.filter(|c| c.0 == "True"))
        }).await?;
        assert!(cond.2.contains("spec.selector.nodeLabels[kaccel.io/pool]"), "{}", cond.2);
        let budget_cond = wait_for("ClassInvalid on the budget", WAIT, || async {
            Ok(budgets.get(&bad_team).await?.status.and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "ClassInvalid")))
        }).await?;
        assert!(budget_cond.message.contains(&bad));
        let labelled = cqs.list(&ListParams::default().labels(&format!("kaccel.io/class={bad}"))).await?;
        assert!(labelled.items.is_empty(), "a queue was written for an invalid class");

        // A budget naming a namespace that does not exist: a condition, not an
        // error loop; the LocalQueue appears once the namespace does.
        let ghost = format!("ghost-{id}");
        let ghost_ns = format!("later-{id}");
        budgets
            .create(&PostParams::default(), &budget(&ghost, &ghost_ns, &[(&lt, 0)]))
            .await?;
        cleanup.add(None, budget_ar.clone(), &ghost);
        let missing = wait_for("NamespaceMissing", WAIT, || async {
            Ok(budgets
                .get(&ghost)
                .await?
                .status
                .and_then(|s| s.conditions.into_iter().find(|c| c.type_ == "NamespaceMissing" && c.status == "True")))
        })
        .await?;
        assert!(missing.message.contains(&ghost_ns), "{}", missing.message);
        support::namespace(client, &ghost_ns).await?;
        cleanup.add_namespace(&ghost_ns);
        let ghost_lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ghost_ns, &kueue("LocalQueue"));
        wait_obj(&ghost_lqs, &lt, "created once the namespace exists", |_| true).await?;
        cleanup.add(Some(&ghost_ns), kueue("LocalQueue"), &lt);
        cleanup.add(None, kueue("ClusterQueue"), &format!("{ghost}-{lt}"));
        cleanup.add(None, kueue("Cohort"), &format!("{root}-{ghost}"));

        // Deleting a class removes what it created.
        classes.delete(&inf, &DeleteParams::default()).await?;
        wait_for("inference queue removed", WAIT, || async {
            Ok((cqs.get_opt(&inf_cq).await?.is_none() && lqs.get_opt(&inf).await?.is_none()).then_some(()))
        }).await?;

        // The unrelated ClusterQueue was never written by kaccel: same spec
        // generation, and no field of it is managed by kaccel (Kueue's own status
        // updates move its resourceVersion, so that is not the measure).
        let after = cqs.get(&unrelated).await?;
        assert_eq!(after.metadata.generation, unrelated_generation);
        let managers: Vec<String> = after
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .filter_map(|m| m.manager.clone())
            .collect();
        assert!(!managers.iter().any(|m| m.starts_with("kaccel")), "{managers:?}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- kaccel log:\n{}", controller.log_tail());
    }
    controller.kill();
    // What the controller created (it is gone now, so clean up by label).
    for kind in ["LocalQueue", "ClusterQueue"] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
        for o in api
            .list(
                &ListParams::default().labels(&format!("kaccel.io/budget in ({team},{bad_team})")),
            )
            .await?
            .items
        {
            cleanup.add(o.metadata.namespace.as_deref(), kueue(kind), &o.name_any());
        }
    }
    result
}

trait DataJson {
    fn data_json(&self) -> Value;
}

impl DataJson for DynamicObject {
    fn data_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or_default()
    }
}

/// Invariant 4, measured by counting: kaccel's own write counter, the generation of
/// every Kueue object it manages (spec changes only; Kueue's status updates do not
/// count) and the resourceVersion of its classes and budgets (only kaccel writes
/// their status) must not move while nothing changes.
#[tokio::test]
async fn quiet_cluster_gets_zero_writes() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = quiet(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn quiet(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let window: u64 = std::env::var("KACCEL_E2E_QUIET_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    ensure_example_nodes(client).await?;
    let id = support::unique("q");
    let ns = format!("ns-{id}");
    support::namespace(client, &ns).await?;
    cleanup.add_namespace(&ns);
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let budgets: Api<CreditBudget> = Api::all(client.clone());
    let mut names = Vec::new();
    for example in [
        "large-training",
        "inference",
        "shared-inference",
        "development-cpu",
    ] {
        let name = format!("{example}-{id}");
        classes
            .create(&PostParams::default(), &class_from_example(example, &name))
            .await?;
        cleanup.add(None, ApiResource::erase::<AcceleratorClass>(&()), &name);
        names.push(name);
    }
    let team = format!("team-{id}");
    let grants: Vec<(&str, u32)> = names.iter().map(|n| (n.as_str(), 2)).collect();
    budgets
        .create(&PostParams::default(), &budget(&team, &ns, &grants))
        .await?;
    cleanup.add(None, ApiResource::erase::<CreditBudget>(&()), &team);

    let root = format!("root-{id}");
    let controller = Controller::start(&format!("quiet-{id}"), free_port(), &config(&root, None));
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    for n in &names {
        let cq = format!("{team}-{n}");
        wait_obj(&cqs, &cq, "Active", |o| support::is_true(o, "Active"))
            .await
            .with_context(|| format!("--- kaccel log:\n{}", controller.log_tail()))?;
        cleanup.add(None, kueue("ClusterQueue"), &cq);
        cleanup.add(Some(&ns), kueue("LocalQueue"), n);
    }
    // Let the first round settle (statuses written, events of our own writes seen).
    tokio::time::sleep(Duration::from_secs(3)).await;

    let snapshot = || async {
        let mut seen: Vec<(String, String)> = Vec::new();
        for kind in ["ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue"] {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
            for o in api
                .list(&ListParams::default().labels("app.kubernetes.io/managed-by=kaccel"))
                .await?
                .items
            {
                seen.push((
                    format!("{kind} {}", o.name_any()),
                    o.metadata.generation.unwrap_or(0).to_string(),
                ));
            }
        }
        for c in classes.list(&ListParams::default()).await?.items {
            seen.push((
                format!("class {}", c.name_any()),
                c.resource_version().unwrap_or_default(),
            ));
        }
        for b in budgets.list(&ListParams::default()).await?.items {
            seen.push((
                format!("budget {}", b.name_any()),
                b.resource_version().unwrap_or_default(),
            ));
        }
        seen.sort();
        Ok::<_, anyhow::Error>(seen)
    };
    let writes_before = controller.writes().context("metrics")?;
    let objects_before = snapshot().await?;
    tokio::time::sleep(Duration::from_secs(window)).await;
    let writes_after = controller.writes().context("metrics")?;
    let objects_after = snapshot().await?;
    eprintln!(
        "MEASURE quiet window {window}s: kaccel writes {writes_before} -> {writes_after}; {} objects watched, changed: {:?}",
        objects_before.len(),
        objects_before
            .iter()
            .zip(&objects_after)
            .filter(|(a, b)| a != b)
            .collect::<Vec<_>>()
    );
    if writes_after != writes_before || objects_after != objects_before {
        bail!(
            "kaccel wrote during a quiet period\n--- kaccel log:\n{}",
            controller.log_tail()
        );
    }

    // A flapping node label (100 updates in a burst) is debounced into few plans,
    // and since the plan does not change, into zero writes.
    let nodes: Api<Node> = Api::all(client.clone());
    let reconciles = |m: &str| metric_sum(m, "kaccel_reconciles_total");
    let before_metrics = controller.metrics().context("metrics")?;
    let before = reconciles(&before_metrics);
    let flapped = "gpu-h100-01";
    for i in 0..100 {
        nodes
            .patch(
                flapped,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"labels": {"e2e.kaccel.io/flap": (i % 2).to_string()}}}),
                ),
            )
            .await?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    nodes
        .patch(
            flapped,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"e2e.kaccel.io/flap": null}}})),
        )
        .await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_metrics = controller.metrics().context("metrics")?;
    let plans = reconciles(&after_metrics) - before;
    let writes = metric_sum(&after_metrics, "kaccel_writes_total") - writes_after;
    eprintln!("MEASURE 101 node label updates -> {plans} reconcile(s), {writes} write(s)");
    if writes != 0 || plans > 20 {
        bail!("a flapping label cost {plans} reconciles and {writes} writes");
    }
    // Each of those re-plans timed its stages up to the writes.
    for stage in ["pending", "observe", "plan", "diff", "apply"] {
        let runs = |m: &str| {
            metric_sum(
                m,
                &format!("kaccel_reconcile_stage_seconds_count{{stage=\"{stage}\"}}"),
            )
        };
        let timed = runs(&after_metrics) - runs(&before_metrics);
        if timed != plans {
            bail!("{plans} re-plans, but the {stage} stage was timed {timed} times");
        }
    }
    Ok(())
}

/// A leader that can no longer renew its Lease (here: its Role loses `patch` on
/// it, as when the API server stays unreachable) stops and exits before the
/// Lease expires, so a standby taking the expired Lease never leads beside it.
#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down_before_its_lease_expires() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = unrenewable(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn unrenewable(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::api::rbac::v1::Role;
    let id = support::unique("renew");
    let lease = format!("kaccel-{id}");
    // The manifests' `create` on Leases covers any name; get and patch on this
    // one come from a Role of the test's own.
    let role = |verbs: &[&str]| -> Result<Role> {
        Ok(serde_json::from_value(json!({
            "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": lease, "namespace": "kaccel-system"},
            "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                       "resourceNames": [lease], "verbs": verbs}]
        }))?)
    };
    support::grant_kaccel(client, cleanup, &role(&["get", "patch"])?).await?;
    let roles: Api<Role> = Api::namespaced(client.clone(), "kaccel-system");
    cleanup.add(
        Some("kaccel-system"),
        ApiResource::erase::<Lease>(&()),
        &lease,
    );
    let lease_seconds = 6;
    let root = format!("root-{id}");
    cleanup.add(None, kueue("Cohort"), &root);
    let mut leader = Controller::start(
        &format!("renew-{id}"),
        free_port(),
        &config(&root, Some((&lease, lease_seconds))),
    );
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kaccel-system");
    let result = async {
        wait_for("kaccel leads", WAIT, || async {
            Ok(leader.is_leader().then_some(()))
        })
        .await?;
        // Renewals work: the Lease's renewTime moves.
        let renewed = |l: Lease| l.spec.and_then(|s| s.renew_time).map(|t| t.0);
        let first = renewed(leases.get(&lease).await?).context("renewTime")?;
        wait_for("a renewal", WAIT, || async {
            Ok(renewed(leases.get(&lease).await?).filter(|t| *t > first))
        })
        .await?;
        // Its Role loses patch: no renewal goes through from now on.
        roles
            .replace(&lease, &PostParams::default(), &role(&["get"])?)
            .await?;
        let last = renewed(leases.get(&lease).await?).context("renewTime")?;
        // It stops writing (kaccel_leader 0, or no answer once it exited)
        // before the Lease expires, then exits non-zero.
        let deadline = Instant::now() + Duration::from_secs(lease_seconds * 3);
        while leads(leader.port) {
            ensure!(
                Instant::now() < deadline,
                "kaccel still leads {}s after its Lease stopped being renewed",
                lease_seconds * 3
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let at = k8s_openapi::jiff::Timestamp::now();
        let exited = loop {
            if let Some(status) = leader.try_exit()? {
                break status;
            }
            ensure!(Instant::now() < deadline, "kaccel stepped down but did not exit");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // The Lease is not renewed after the last renewal this test saw, or
        // one in flight when patch was taken away.
        let held = renewed(leases.get(&lease).await?).context("renewTime")?;
        let expires = held
            .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(
                lease_seconds as i64,
            ))
            .context("expiry")?;
        eprintln!(
            "MEASURE Lease last renewed {held} (seen {last}); kaccel stopped leading {} ms before it expired",
            (expires.as_millisecond() - at.as_millisecond())
        );
        ensure!(
            !exited.success(),
            "kaccel exited with {exited} after losing its Lease"
        );
        ensure!(
            at < expires,
            "kaccel still led when its Lease expired ({at} >= {expires})"
        );
        let log = std::fs::read_to_string(&leader.log).unwrap_or_default();
        ensure!(
            log.contains("the Lease was not renewed in time: stepping down"),
            "log: {}",
            leader.log_tail()
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("--- kaccel log ---\n{}", leader.log_tail());
    }
    result
}

/// Whether the kaccel on `port` reports leading (`kaccel_leader 1`).
fn leads(port: u16) -> bool {
    http_metrics(port).is_some_and(|text| {
        text.lines().any(|l| {
            l.strip_prefix("kaccel_leader ")
                .is_some_and(|v| v.trim() == "1")
        })
    })
}

/// Two replicas: only the Lease holder writes; killing it hands over.
#[tokio::test]
async fn leader_election_hands_over_after_the_leader_dies() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = leader(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn leader(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    ensure_example_nodes(client).await?;
    let id = support::unique("l");
    // The Lease manifests/role.yaml lets kaccel hold; a holder left by an earlier
    // run would only delay the election by its lease duration.
    let lease = "kaccel-controller".to_string();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), "kaccel-system");
    if leases.get_opt(&lease).await?.is_some() {
        leases.delete(&lease, &Default::default()).await?;
    }
    let lease_seconds = 6;
    let root = format!("root-{id}");
    let cfg = config(&root, Some((&lease, lease_seconds)));
    cleanup.add(None, kueue("Cohort"), &root);
    let mut a = Controller::start(&format!("a-{id}"), free_port(), &cfg);
    let mut b = Controller::start(&format!("b-{id}"), free_port(), &cfg);

    let (leader_is_a, _) = wait_for("one leader", WAIT, || async {
        Ok(match (a.is_leader(), b.is_leader()) {
            (true, false) => Some((true, ())),
            (false, true) => Some((false, ())),
            (true, true) => bail!("both replicas lead"),
            _ => None,
        })
    })
    .await?;
    let (leader, follower) = if leader_is_a {
        (&mut a, &mut b)
    } else {
        (&mut b, &mut a)
    };

    // Give the leader something to write; the follower must write nothing.
    let ns = format!("ns-{id}");
    support::namespace(client, &ns).await?;
    cleanup.add_namespace(&ns);
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let budgets: Api<CreditBudget> = Api::all(client.clone());
    let class = format!("inf-{id}");
    classes
        .create(
            &PostParams::default(),
            &class_from_example("inference", &class),
        )
        .await?;
    cleanup.add(None, ApiResource::erase::<AcceleratorClass>(&()), &class);
    let team = format!("team-{id}");
    budgets
        .create(&PostParams::default(), &budget(&team, &ns, &[(&class, 1)]))
        .await?;
    cleanup.add(None, ApiResource::erase::<CreditBudget>(&()), &team);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let cq = format!("{team}-{class}");
    cleanup.add(None, kueue("ClusterQueue"), &cq);
    cleanup.add(Some(&ns), kueue("LocalQueue"), &class);
    wait_obj(&cqs, &cq, "exists", |_| true).await?;
    assert!(leader.writes().unwrap_or(0) > 0, "the leader wrote nothing");
    assert_eq!(follower.writes(), Some(0), "the follower wrote");

    // SIGKILL: the Lease is not released, so the follower waits for it to expire.
    let killed = Instant::now();
    leader.kill();
    wait_for(
        "the follower to take over",
        Duration::from_secs(lease_seconds * 4),
        || async { Ok(follower.is_leader().then_some(())) },
    )
    .await?;
    let handover = killed.elapsed();
    eprintln!(
        "MEASURE leader SIGKILLed -> follower leads in {} ms (lease {lease_seconds}s)",
        handover.as_millis()
    );

    // The new leader acts: a second budget gets its queue.
    let team2 = format!("team2-{id}");
    let ns2 = format!("ns2-{id}");
    support::namespace(client, &ns2).await?;
    cleanup.add_namespace(&ns2);
    budgets
        .create(
            &PostParams::default(),
            &budget(&team2, &ns2, &[(&class, 1)]),
        )
        .await?;
    cleanup.add(None, ApiResource::erase::<CreditBudget>(&()), &team2);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team2}"));
    let cq2 = format!("{team2}-{class}");
    cleanup.add(None, kueue("ClusterQueue"), &cq2);
    cleanup.add(Some(&ns2), kueue("LocalQueue"), &class);
    wait_obj(&cqs, &cq2, "exists", |_| true)
        .await
        .with_context(|| {
            format!(
                "new leader did not write\n--- log:\n{}",
                follower.log_tail()
            )
        })?;
    follower.kill();
    Ok(())
}

#[tokio::test]
async fn a_planned_name_held_by_another_manager_is_a_conflict_and_left_alone() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = name_taken(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn name_taken(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    ensure_example_nodes(client).await?;
    let id = support::unique("nt");
    let class = format!("lt-{id}");
    let team = format!("team-{id}");
    let cq_name = format!("{team}-{class}");
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    // Someone else's ClusterQueue under the name kaccel will plan, created first.
    let foreign = support::object(json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": { "name": cq_name, "labels": { "app.kubernetes.io/managed-by": "terraform" } },
        "spec": { "namespaceSelector": {} }
    }));
    let params = PostParams {
        field_manager: Some("terraform".into()),
        ..Default::default()
    };
    let before = serde_json::to_value(cqs.create(&params, &foreign).await?)?;
    cleanup.add(None, kueue("ClusterQueue"), &cq_name);
    let (ns, _) = class_with_budget(
        client,
        cleanup,
        &id,
        &class_from_example("large-training", &class),
        0,
    )
    .await?;
    let budgets: Api<CreditBudget> = Api::all(client.clone());
    let lqs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue"));

    let root = format!("root-{id}");
    let mut controller = Controller::start(&format!("ctl-{id}"), free_port(), &config(&root, None));
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
    let result = async {
        let conditions = wait_for("budget Conflict naming the ClusterQueue", WAIT, || async {
            Ok(budgets
                .get(&team)
                .await?
                .status
                .map(|s| s.conditions)
                .filter(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Conflict" && c.status == "True")
                }))
        })
        .await?;
        let conflict = conditions.iter().find(|c| c.type_ == "Conflict").unwrap();
        assert!(
            conflict
                .message
                .contains(&format!("ClusterQueue {cq_name}"))
                && conflict.message.contains("managed by terraform"),
            "{}",
            conflict.message
        );
        let ready = conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        assert_eq!(ready.status, "False", "{ready:?}");
        // The other object is untouched, and no LocalQueue points the team at it.
        // (Kueue writes its status, so the resourceVersion moves: compare what
        // kaccel would write, and who wrote.)
        let after = support::get_json(&cqs, &cq_name).await?;
        assert_eq!(after["spec"], before["spec"]);
        assert_eq!(after["metadata"]["labels"], before["metadata"]["labels"]);
        let writers: Vec<&str> = after["metadata"]["managedFields"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["manager"].as_str())
            .collect();
        assert!(
            !writers.contains(&"kaccel"),
            "kaccel wrote the other ClusterQueue: {writers:?}"
        );
        assert!(
            lqs.get_opt(&class).await?.is_none(),
            "a LocalQueue was written onto the other ClusterQueue"
        );

        // Once the name is free, kaccel creates its own and the conflict clears.
        cqs.delete(&cq_name, &DeleteParams::default()).await?;
        wait_obj(&cqs, &cq_name, "kaccel's own", |o| {
            o["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kaccel"
        })
        .await?;
        wait_for("Conflict cleared", WAIT, || async {
            Ok(budgets.get(&team).await?.status.filter(|s| {
                !s.conditions
                    .iter()
                    .any(|c| c.type_ == "Conflict" && c.status == "True")
            }))
        })
        .await?;
        wait_obj(&lqs, &class, "exists", |_| true).await?;
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    controller.kill();
    result
}

// ---------------------------------------------------------------------------
// A minimum driver version mid-rollout: the class's pods never reach the old driver.

/// An 8-GPU node labelled as NVIDIA's GPU feature discovery labels it, with the
/// driver version `driver` (`nvidia.com/cuda.driver-version.*`).
fn gfd_node(name: &str, product: &str, driver: &str) -> Node {
    let major = driver.split('.').next().unwrap_or_default();
    support::ready_node(
        name,
        json!({
            "kubernetes.io/hostname": name,
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": product,
            "nvidia.com/gpu.count": "8",
            "nvidia.com/gpu.replicas": "1",
            "nvidia.com/gpu.memory": "81559",
            "nvidia.com/gpu.family": "hopper",
            "nvidia.com/cuda.driver-version.full": driver,
            "nvidia.com/cuda.driver-version.major": major,
        }),
        json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}),
        "2026-12-01T00:00:00Z",
    )
}

#[tokio::test]
async fn a_minimum_driver_version_keeps_the_classs_pods_off_older_drivers() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = driver_rollout_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn driver_rollout_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = support::unique("drv");
    // A product only this test's nodes carry, so no other class pools them.
    let product = format!("NVIDIA-E2E-{}", id.to_uppercase());
    let nodes: Api<Node> = Api::all(client.clone());
    let (new, old) = (format!("drv-new-{id}"), format!("drv-old-{id}"));
    for (name, driver) in [(&new, "550.54.15"), (&old, "535.104.05")] {
        nodes
            .create(&PostParams::default(), &gfd_node(name, &product, driver))
            .await?;
        cleanup.add(None, ApiResource::erase::<Node>(&()), name);
    }
    let class_name = format!("drv-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole", "selector": {"models": [product], "minDriverVersion": "550"},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned { ns, root, .. } = class_with_queues(client, cleanup, &id, &class, 8).await?;
    let controller = Controller::start(
        &format!("ctl-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nleaderElection:\n  enabled: false\n"
        ),
    );
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let mut pod_name = String::new();
    let mut workload = String::new();
    let result = async {
        let classes: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::erase::<AcceleratorClass>(&()));
        let status = wait_obj(&classes, &class_name, "one flavor resolved", |c| {
            c["status"]["flavors"].as_array().is_some_and(|f| f.len() == 1)
        })
        .await?;
        let flavor = status["status"]["flavors"][0]["name"].as_str().unwrap_or_default().to_string();
        cleanup.add(None, kueue("ResourceFlavor"), &flavor);
        let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
        let rf = wait_obj(&flavors, &flavor, "written", |_| true).await?;
        let labels = &rf["spec"]["nodeLabels"];
        ensure!(
            labels["nvidia.com/cuda.driver-version.full"] == "550.54.15",
            "{flavor}'s nodeLabels do not pin the driver: {labels}"
        );
        // A Job of the class: Kueue admits it onto that flavor and injects its
        // nodeLabels; kube-scheduler can only bind it to the 550 node.
        let mut job = support::gpu_job(&ns, "train", &class_name, "nvidia.com/gpu", 8);
        job["spec"]["template"]["spec"]["schedulerName"] = json!("kaccel-e2e-scheduler");
        support::create(&jobs, job).await?;
        let pod = support::job_pod(&pods, "train", WAIT).await?;
        pod_name = pod.name_any();
        workload = pod.annotations().get("kueue.x-k8s.io/workload").cloned().unwrap_or_default();
        let selector = pod.spec.as_ref().and_then(|s| s.node_selector.clone()).unwrap_or_default();
        ensure!(
            selector.get("nvidia.com/cuda.driver-version.full").map(String::as_str) == Some("550.54.15"),
            "the pod's nodeSelector does not pin the driver: {selector:?}"
        );
        let bound = wait_for("kube-scheduler binds the pod", WAIT, || async {
            Ok(pods.get(&pod_name).await?.spec.and_then(|s| s.node_name))
        })
        .await?;
        ensure!(bound == new, "the pod was bound to {bound}, not the 550 node {new}");
        eprintln!("MEASURE minDriverVersion 550 over a 550 and a 535 node: flavor {flavor} pins {labels}; the Job's pod bound to {bound}");
        Ok(())
    }
    .await;
    support::delete_job(&jobs, "train").await?;
    if !pod_name.is_empty() {
        let _ = pods
            .delete(
                &pod_name,
                &DeleteParams {
                    grace_period_seconds: Some(0),
                    ..Default::default()
                },
            )
            .await;
    }
    if !workload.is_empty() {
        let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
        let _ = wls.delete(&workload, &DeleteParams::default()).await;
    }
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

// ---------------------------------------------------------------------------
// Cards no label names the model of: in no flavor, and the class says so.

/// An 8-card Gaudi node before gaudi-feature-discovery ran: only NFD's PCI label for
/// Habana's vendor id, as the Gaudi operators configure NFD (`pci-1da3.present`).
fn unlabelled_gaudi_node(name: &str) -> Node {
    support::ready_node(
        name,
        json!({
            "kubernetes.io/hostname": name,
            "feature.node.kubernetes.io/pci-1da3.present": "true",
        }),
        json!({"cpu": "96", "memory": "1Ti", "pods": "110", "habana.ai/gaudi": "8"}),
        "2026-12-01T00:00:00Z",
    )
}

#[tokio::test]
async fn cards_no_label_names_the_model_of_are_in_no_flavor_and_the_class_says_so() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = unlabelled_models_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn unlabelled_models_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = support::unique("unl");
    let nodes: Api<Node> = Api::all(client.clone());
    let names = [format!("unl-a-{id}"), format!("unl-b-{id}")];
    for name in &names {
        nodes
            .create(&PostParams::default(), &unlabelled_gaudi_node(name))
            .await?;
        cleanup.add(None, ApiResource::erase::<Node>(&()), name);
    }
    let class_name = format!("unl-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole", "selector": {"vendors": ["intel"], "models": ["Gaudi2"]},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned { root, .. } = class_with_queues(client, cleanup, &id, &class, 8).await?;
    let controller = Controller::start(
        &format!("ctl-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nleaderElection:\n  enabled: false\n"
        ),
    );
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    let result = async {
        let (_, reason, message) = wait_for("UnlabelledModels=True naming both nodes", WAIT, || async {
            Ok(class_condition(&classes, &class_name, "UnlabelledModels")
                .await?
                .filter(|(status, _, m)| status == "True" && names.iter().all(|n| m.contains(n.as_str()))))
        })
        .await?;
        ensure!(reason == "NoModelLabel", "reason {reason}: {message}");
        ensure!(
            message.contains("16 habana.ai/gaudi on 2 node(s)") && message.contains("kaccel.io/accelerator.model"),
            "{message}"
        );
        // No flavor kaccel wrote selects them: none pins nothing, none pins only
        // the PCI presence label.
        let node_labels = nodes.get(&names[0]).await?.labels().clone();
        for rf in flavors
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=kaccel"))
            .await?
        {
            let pins: serde_json::Map<String, Value> = rf.data["spec"]["nodeLabels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            ensure!(!pins.is_empty(), "flavor {} pins no node label", rf.name_any());
            ensure!(
                !pins.iter().all(|(k, v)| node_labels.get(k).map(String::as_str) == v.as_str()),
                "flavor {} ({pins:?}) selects an unlabelled Gaudi node",
                rf.name_any()
            );
        }
        // gaudi-feature-discovery runs: the cards are Gaudi2, in a flavor pinned by
        // the device type, and the condition clears.
        for name in &names {
            let patch = json!({"metadata": {"labels": {"habana.ai/device.type": "GAUDI2"}}});
            nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        }
        wait_for("UnlabelledModels=False", WAIT, || async {
            Ok(class_condition(&classes, &class_name, "UnlabelledModels")
                .await?
                .filter(|(status, _, _)| status == "False"))
        })
        .await?;
        let status = classes.get(&class_name).await?.status.context("a status")?;
        let flavor = status
            .flavors
            .first()
            .context("the class resolved a flavor for the labelled cards")?
            .name
            .clone();
        cleanup.add(None, kueue("ResourceFlavor"), &flavor);
        let rf = wait_obj(&flavors, &flavor, "written", |_| true).await?;
        ensure!(
            rf["spec"]["nodeLabels"]["habana.ai/device.type"] == "GAUDI2",
            "{flavor} is not pinned by the device type: {}",
            rf["spec"]["nodeLabels"]
        );
        eprintln!("MEASURE unlabelled Gaudi cards: in no flavor, class condition {message:?}; labelled: flavor {flavor} pins {}", rf["spec"]["nodeLabels"]);
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

/// dcgm-exporter's answer for `node`'s GPUs, each with the VBIOS version it
/// reports (`DCGM_FI_DEV_VBIOS_VERSION`, a label field in dcgm-exporter's CSV).
fn dcgm_with_vbios(node: &str, vbios: &[&str]) -> String {
    crate::health::dcgm(node, vbios.len() as u32, &[])
        .lines()
        .map(|line| {
            let gpu = vbios
                .iter()
                .enumerate()
                .find(|(i, _)| line.contains(&format!("{{gpu=\"{i}\",")));
            match gpu {
                Some((_, v)) => line.replacen(
                    "DCGM_FI_DRIVER_VERSION=\"550.54.15\"",
                    &format!(
                        "DCGM_FI_DRIVER_VERSION=\"550.54.15\",DCGM_FI_DEV_VBIOS_VERSION=\"{v}\""
                    ),
                    1,
                ),
                None => line.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[tokio::test]
async fn a_firmware_allow_list_takes_a_variant_only_when_every_card_reports_an_allowed_version() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = firmware_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

/// Two GFD nodes of one product; their dcgm-exporters report each card's VBIOS.
/// Two cards of node b on an old VBIOS: the class (allow-list of the new one)
/// gets no flavor and says which version on which node; once the exporter
/// reports them updated, the class gets the variant and its quota.
async fn firmware_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    use crate::health::{Answer, FakeExporter};
    const GOOD: &str = "96.00.89.00.01";
    const OLD: &str = "96.00.5A.00.01";
    let id = support::unique("fw");
    let product = format!("NVIDIA-E2E-{}", id.to_uppercase());
    let nodes: Api<Node> = Api::all(client.clone());
    let (a, b) = (format!("fw-a-{id}"), format!("fw-b-{id}"));
    for name in [&a, &b] {
        nodes
            .create(
                &PostParams::default(),
                &gfd_node(name, &product, "550.54.15"),
            )
            .await?;
        cleanup.add(None, ApiResource::erase::<Node>(&()), name);
    }
    let exporter_a = FakeExporter::start(Answer::Metrics(dcgm_with_vbios(&a, &[GOOD; 8]))).await;
    let mixed = [GOOD, GOOD, GOOD, GOOD, GOOD, GOOD, OLD, OLD];
    let exporter_b = FakeExporter::start(Answer::Metrics(dcgm_with_vbios(&b, &mixed))).await;
    let class_name = format!("fw-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole", "selector": {"models": [product], "firmwareVersions": [GOOD]},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned {
        root,
        cluster_queue,
        ..
    } = class_with_queues(client, cleanup, &id, &class, 16).await?;
    let source = |node: &str, port: u16| {
        format!(
            "    - {{name: dcgm-{node}, kind: dcgm-exporter, url: \"http://127.0.0.1:{port}/metrics\", node: {node}, intervalSeconds: 1, staleAfterSeconds: 5, timeoutSeconds: 1}}\n"
        )
    };
    let config = format!(
        "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nleaderElection:\n  enabled: false\nhealth:\n  sources:\n{}{}",
        source(&a, exporter_a.port),
        source(&b, exporter_b.port)
    );
    let mut controller = Controller::start(&format!("ctl-{id}"), free_port(), &config);
    let result = async {
        let classes: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::erase::<AcceleratorClass>(&()));
        let refused = wait_obj(&classes, &class_name, "refused, naming the old VBIOS", |c| {
            support::condition(c, "NoMatchingHardware").is_some_and(|c| {
                c["status"] == "True"
                    && c["message"].as_str().is_some_and(|m| m.contains(&format!("firmware {OLD} on {b}")))
            })
        })
        .await;
        let refused = match refused {
            Ok(v) => v,
            Err(e) => bail!("{e}: {}", classes.get(&class_name).await?.data["status"]),
        };
        ensure!(
            refused["status"]["flavors"].as_array().is_none_or(|f| f.is_empty()),
            "a flavor despite cards on {OLD}: {}",
            refused["status"]
        );
        // The two cards are updated: the variant is the class's, both nodes' 16.
        exporter_b.set(Answer::Metrics(dcgm_with_vbios(&b, &[GOOD; 8])));
        let taken = wait_obj(&classes, &class_name, "one flavor once every card complies", |c| {
            c["status"]["flavors"].as_array().is_some_and(|f| f.len() == 1)
        })
        .await?;
        let flavor = taken["status"]["flavors"][0]["name"].as_str().unwrap_or_default().to_string();
        cleanup.add(None, kueue("ResourceFlavor"), &flavor);
        let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
        wait_obj(&cqs, &cluster_queue, "16 in quota", |q| {
            q["spec"]["resourceGroups"][0]["flavors"]
                .to_string()
                .contains("\"nominalQuota\":\"16\"")
        })
        .await?;
        // A restart plans from the exporters' first answers, not from cards it
        // has not read yet: the ClusterQueue is never written in between (the
        // flavor would be gone for the first poll's seconds).
        let generation = |q: &Value| q["metadata"]["generation"].as_i64().unwrap_or_default();
        let before = generation(&support::get_json(&cqs, &cluster_queue).await?);
        // Exporters that take 700 ms to answer (within the 1 s timeout): the new
        // kaccel's caches sync well before their first answers.
        exporter_a.set(Answer::Slow(dcgm_with_vbios(&a, &[GOOD; 8]), 700));
        exporter_b.set(Answer::Slow(dcgm_with_vbios(&b, &[GOOD; 8]), 700));
        controller.kill();
        controller = Controller::start(&format!("ctl2-{id}"), free_port(), &config);
        // Its caches sync and its exporters answer within a second or two.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let after = support::get_json(&cqs, &cluster_queue).await?;
        ensure!(
            generation(&after) == before,
            "the restart rewrote the ClusterQueue (generation {before} -> {}): {}",
            generation(&after),
            after["spec"]
        );
        let message = support::condition(&refused, "NoMatchingHardware")
            .map(|c| c["message"].to_string())
            .unwrap_or_default();
        eprintln!("MEASURE firmware allow-list [{GOOD}]: refused while 2 cards of {b} reported {OLD} ({message}); flavor {flavor} with 16 in quota once they reported {GOOD}; a restart left the ClusterQueue at generation {before}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}
