//! MultiKueue with two real control planes: kaccel runs in the manager, reads
//! the worker's Nodes through the kubeconfig Secret Kueue uses, plans quota over
//! them, and the manager's Kueue dispatches a Job to the worker's Kueue. The
//! ledger charges once, in the manager, naming the worker; a worker whose API
//! server is down keeps its quota with its devices Unknown and is named; its
//! ResourceSlices add its DRA devices.
//!
//! The worker is the second control plane `e2e/test.sh` starts (`e2e/worker.sh
//! up`; KACCEL_E2E_WORKER_KUBECONFIG and KACCEL_E2E_WORKER_RUN).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::controller::{cq_flavors, wait_for, wait_obj};
use crate::ledger::{self, with_env};
use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(90);

/// The worker's admin kubeconfig and run folder, from `e2e/worker.sh env`;
/// None only against another cluster (`KACCEL_E2E_KUBECONFIG`) given no worker.
fn worker_env() -> Option<(String, String)> {
    let Ok(kubeconfig) = std::env::var("KACCEL_E2E_WORKER_KUBECONFIG") else {
        if std::env::var_os("KACCEL_E2E_KUBECONFIG").is_some() {
            return None;
        }
        panic!(
            "KACCEL_E2E_WORKER_KUBECONFIG: start the worker control plane first: \
             e2e/worker.sh up && eval \"$(e2e/worker.sh env)\" (e2e/test.sh does both)"
        );
    };
    let run = std::env::var("KACCEL_E2E_WORKER_RUN").expect("KACCEL_E2E_WORKER_RUN");
    Some((kubeconfig, run))
}

async fn worker_client(kubeconfig: &str) -> Result<Client> {
    let text = std::fs::read_to_string(kubeconfig).with_context(|| kubeconfig.to_string())?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&text)?,
        &Default::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// `e2e/worker.sh kill|start kube-apiserver`: the worker's API server down, or back.
fn worker_apiserver(action: &str, run: &str) -> Result<()> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/worker.sh");
    let out = std::process::Command::new("bash")
        .args([script, action, "kube-apiserver"])
        .env("KACCEL_E2E_WORKER_RUN", run)
        .output()?;
    ensure!(
        out.status.success(),
        "e2e/worker.sh {action} kube-apiserver: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// A 4-GPU H100 node as GPU feature discovery labels it, model unique to the run.
fn h100_node(name: &str, model: &str) -> Node {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    support::ready_node(
        name,
        json!({"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
               "nvidia.com/gpu.product": model, "nvidia.com/gpu.memory": "81559",
               "nvidia.com/gpu.count": "4", "nvidia.com/gpu.family": "hopper"}),
        json!({"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "4"}),
        &now,
    )
}

/// What the worker's platform team sets up (kaccel writes nothing there): the
/// namespace, a flavor for its H100 nodes, a ClusterQueue without MultiKueue,
/// and a LocalQueue named as the manager's (MultiKueue copies the Workload's
/// queueName verbatim).
async fn worker_queues(
    worker: &Client,
    cleanup: &mut Cleanup,
    id: &str,
    ns: &str,
    queue: &str,
    model: &str,
) -> Result<String> {
    support::namespace(worker, ns).await?;
    cleanup.add_namespace(ns);
    let flavor = format!("{id}-h100");
    let cq = format!("{id}-worker");
    let apply = |ar: ApiResource, ns: Option<&str>, obj: Value| {
        let api: Api<DynamicObject> = match ns {
            Some(ns) => Api::namespaced_with(worker.clone(), ns, &ar),
            None => Api::all_with(worker.clone(), &ar),
        };
        async move { support::create(&api, obj).await }
    };
    apply(
        kueue("ResourceFlavor"),
        None,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
               "metadata": {"name": flavor},
               "spec": {"nodeLabels": {"nvidia.com/gpu.product": model}}}),
    )
    .await?;
    cleanup.add(None, kueue("ResourceFlavor"), &flavor);
    // The harness's Kueue counts nvidia.com/gpu as kaccel.io/accelerator too.
    apply(
        kueue("ClusterQueue"),
        None,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
               "metadata": {"name": cq},
               "spec": {"namespaceSelector": {}, "resourceGroups": [{
                   "coveredResources": ["cpu", "memory", "nvidia.com/gpu", "kaccel.io/accelerator"],
                   "flavors": [{"name": flavor, "resources": [
                       {"name": "cpu", "nominalQuota": "128"},
                       {"name": "memory", "nominalQuota": "1Ti"},
                       {"name": "nvidia.com/gpu", "nominalQuota": "8"},
                       {"name": "kaccel.io/accelerator", "nominalQuota": "8"}]}]}]}}),
    )
    .await?;
    cleanup.add(None, kueue("ClusterQueue"), &cq);
    apply(
        kueue("LocalQueue"),
        Some(ns),
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": queue, "namespace": ns},
               "spec": {"clusterQueue": cq}}),
    )
    .await?;
    cleanup.add(Some(ns), kueue("LocalQueue"), queue);
    Ok(flavor)
}

fn class_condition<'a>(class: &'a Value, type_: &str) -> Option<&'a Value> {
    support::condition(class, type_)
}

fn nominal_gpus(cq: &Value) -> Option<i64> {
    cq["spec"]["resourceGroups"]
        .as_array()?
        .iter()
        .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .find(|r| r["name"] == "nvidia.com/gpu")
        .and_then(|r| {
            r["nominalQuota"]
                .as_str()
                .or(r["nominalQuota"].as_i64().map(|_| ""))
        })
        .map(|q| q.parse().unwrap_or(-1))
}

/// The manager's side of a worker: its kubeconfig in a Secret where Kueue (and
/// kaccel) read it, a Role granting kaccel `get` on that Secret by name (as
/// manifests/multikueue/ does), and the MultiKueue objects kaccel will write
/// registered for cleanup. Returns the Secret's name.
async fn manager_side(
    env: &mut ledger::Env,
    kubeconfig: &str,
    cluster: &str,
    check: &str,
) -> Result<String> {
    let client = env.client.clone();
    let secret_name = format!("{}-kubeconfig", env.id);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kueue-system");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": secret_name, "namespace": "kueue-system"},
        "stringData": {"kubeconfig": std::fs::read_to_string(kubeconfig)?},
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    env.cleanup.add(
        Some("kueue-system"),
        ApiResource::erase::<Secret>(&()),
        &secret_name,
    );
    let role_ar = ApiResource::erase::<k8s_openapi::api::rbac::v1::Role>(&());
    let binding_ar = ApiResource::erase::<k8s_openapi::api::rbac::v1::RoleBinding>(&());
    let grant = format!("kaccel-read-{secret_name}");
    let rbac = |ar: &ApiResource| -> Api<DynamicObject> {
        Api::namespaced_with(client.clone(), "kueue-system", ar)
    };
    support::create(
        &rbac(&role_ar),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
               "metadata": {"name": grant, "namespace": "kueue-system"},
               "rules": [{"apiGroups": [""], "resources": ["secrets"],
                          "resourceNames": [secret_name], "verbs": ["get"]}]}),
    )
    .await?;
    env.cleanup.add(Some("kueue-system"), role_ar, &grant);
    support::create(
        &rbac(&binding_ar),
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": grant, "namespace": "kueue-system"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": grant},
               "subjects": [{"kind": "ServiceAccount", "name": "kaccel", "namespace": "kaccel-system"}]}),
    )
    .await?;
    env.cleanup.add(Some("kueue-system"), binding_ar, &grant);
    env.cleanup.add(None, kueue("MultiKueueCluster"), cluster);
    env.cleanup.add(None, kueue("MultiKueueConfig"), check);
    env.cleanup.add(None, kueue("AdmissionCheck"), check);
    Ok(secret_name)
}

/// kaccel's config with the ledger on `store` and `cluster` as its one worker.
fn with_worker(config: String, cluster: &str, secret: &str, check: &str) -> String {
    format!(
        "{config}multiKueue:\n  workers:\n  - name: {cluster}\n    kubeconfigSecret: {secret}\n  admissionCheckName: {check}\n"
    )
}

#[tokio::test]
async fn a_job_in_the_manager_runs_in_the_worker_is_charged_once_there_and_survives_the_worker_going_down()
 {
    run("mk", Scenario::DispatchAndLoseTheWorker).await;
}

/// A scenario with a SQLite ledger of its own, in a test environment named
/// `prefix`.
async fn run(prefix: &str, scenario: Scenario) {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!(prefix, |env| on_worker(&mut env, &store, scenario).await);
}

/// The two scenarios, run by [`on_worker`].
enum Scenario {
    DispatchAndLoseTheWorker,
    WorkerDownAtStart,
}

/// Runs `scenario` against the worker control plane (skipped, saying so, only
/// against another cluster given no worker); whatever happens, the worker's API
/// server serves the next test and the worker's objects are deleted.
async fn on_worker(env: &mut ledger::Env, store: &str, scenario: Scenario) -> Result<()> {
    let Some((kubeconfig, run)) = worker_env() else {
        eprintln!(
            "SKIPPED: no MultiKueue worker beside KACCEL_E2E_KUBECONFIG (set KACCEL_E2E_WORKER_KUBECONFIG and KACCEL_E2E_WORKER_RUN)"
        );
        return Ok(());
    };
    let worker = worker_client(&kubeconfig).await?;
    let mut worker_cleanup = Cleanup::default();
    let result = match scenario {
        Scenario::DispatchAndLoseTheWorker => {
            dispatch(env, store, &worker, &mut worker_cleanup, &kubeconfig, &run).await
        }
        Scenario::WorkerDownAtStart => {
            late_worker(env, store, &worker, &mut worker_cleanup, &kubeconfig, &run).await
        }
    };
    if result.is_err() {
        let _ = worker_apiserver("start", &run);
    }
    worker_cleanup.run(&worker).await;
    result
}

async fn dispatch(
    env: &mut ledger::Env,
    store: &str,
    worker: &Client,
    worker_cleanup: &mut Cleanup,
    kubeconfig: &str,
    run: &str,
) -> Result<()> {
    let id = env.id.clone();
    let client = env.client.clone();
    let cluster = format!("w-{id}");
    let model = format!("NVIDIA-H100-80GB-HBM3-{}", id.to_uppercase());
    let (class, budget, ns) = (format!("h100-{id}"), format!("b-{id}"), format!("ns-{id}"));
    let check = format!("{id}-mk");

    // The worker: two 4-GPU nodes and its own queues.
    let nodes: Api<Node> = Api::all(worker.clone());
    for n in ["gpu-1", "gpu-2"] {
        let name = format!("{id}-{n}");
        nodes
            .create(&PostParams::default(), &h100_node(&name, &model))
            .await?;
        worker_cleanup.add(None, ApiResource::erase::<Node>(&()), &name);
    }
    let worker_flavor = worker_queues(worker, worker_cleanup, &id, &ns, &class, &model).await?;

    let secret_name = manager_side(env, kubeconfig, &cluster, &check).await?;

    env.create_class(ledger::h100_class(&class)).await?;
    env.budget(&budget, "vision", &ns, &class, "100000").await?;
    env.start_with(store, |config| {
        with_worker(config, &cluster, &secret_name, &check)
    });

    // kaccel wrote Kueue's MultiKueue objects, and Kueue connected to the worker.
    let mk_clusters: Api<DynamicObject> =
        Api::all_with(client.clone(), &kueue("MultiKueueCluster"));
    wait_obj(
        &mk_clusters,
        &cluster,
        "Active (Kueue reaches the worker)",
        |c| support::is_true(c, "Active"),
    )
    .await?;
    // The manager's quota is the worker's 8 GPUs (the manager has no such node),
    // behind the credit check, then MultiKueue.
    let cq_name = format!("{budget}-{class}");
    let cq = wait_obj(
        &env.cqs,
        &cq_name,
        "8 GPUs of the worker, MultiKueue, Active",
        |cq| nominal_gpus(cq) == Some(8) && support::is_true(cq, "Active"),
    )
    .await?;
    let checks: Vec<&str> = cq["spec"]["admissionChecksStrategy"]["admissionChecks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str())
        .collect();
    ensure!(checks == ["kaccel-credits", check.as_str()], "{checks:?}");
    let manager_flavor = cq_flavors(&cq).first().cloned().context("a flavor")?;
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &ledger::class_ar());
    wait_obj(
        &classes,
        &class,
        "WorkerUnreachable=False, 8 healthy",
        |c| {
            class_condition(c, "WorkerUnreachable").is_some_and(|w| w["status"] == "False")
                && c["status"]["devices"]["healthy"] == 8
        },
    )
    .await?;

    // A Job submitted in the manager: Kueue's webhook hands it to MultiKueue.
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    let job = format!("train-{id}");
    support::create(
        &jobs,
        support::gpu_job(&ns, &job, &class, "nvidia.com/gpu", 2),
    )
    .await?;
    let created = jobs.get(&job).await?;
    ensure!(
        created.data["spec"]["managedBy"] == "kueue.x-k8s.io/multikueue",
        "Kueue's Job webhook sets managedBy for a queue with MultiKueue: {}",
        created.data["spec"]
    );
    let workloads = env.workloads(&ns);
    let wl = wait_for(
        "the manager's Workload dispatched to the worker",
        WAIT,
        || async {
            let list = workloads.list(&Default::default()).await?;
            Ok(list.items.into_iter().find_map(|w| {
                let v = serde_json::to_value(&w).ok()?;
                (v["status"]["clusterName"] == cluster.as_str() && support::is_true(&v, "Admitted"))
                    .then_some(v)
            }))
        },
    )
    .await?;
    let wl_name = wl["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let uid = wl["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    env.track_workload(&ns, &wl_name);
    ensure!(
        wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"]
            == manager_flavor.as_str(),
        "the manager's quota is on kaccel's flavor: {}",
        wl["status"]["admission"]
    );
    // The worker's Kueue admitted its copy on the worker's flavor.
    let remote: Api<DynamicObject> = Api::namespaced_with(worker.clone(), &ns, &kueue("Workload"));
    let copy = wait_obj(&remote, &wl_name, "admitted in the worker", |w| {
        support::is_true(w, "Admitted")
    })
    .await?;
    ensure!(
        copy["status"]["admission"]["podSetAssignments"][0]["flavors"]["nvidia.com/gpu"]
            == worker_flavor.as_str(),
        "{}",
        copy["status"]["admission"]
    );

    // Charged once, in the manager: one Reserve line for the admission.
    let entries = ledger::export(store, Some(&budget))?;
    let reserves: Vec<&Value> = entries
        .iter()
        .filter(|e| e["workloadUid"] == uid.as_str() && e["kind"] == "Reserve")
        .collect();
    ensure!(reserves.len() == 1, "one Reserve: {reserves:?}");
    ensure!(reserves[0]["deviceUnits"] == 2 && reserves[0]["flavor"] == manager_flavor.as_str());
    // Both clusters' Kueue agree with the ledger: the manager's quota and the
    // worker's admitted copy.
    let (in_sync, report) = ledger::verify_cluster(store, true).await?;
    ensure!(in_sync, "ledger verify --cluster: {report}");

    // The worker's API server goes down: its devices turn Unknown, the quota
    // stays, the class names the cluster, the metric says 0.
    worker_apiserver("kill", run)?;
    let lost = wait_obj(
        &classes,
        &class,
        "WorkerUnreachable=True naming the worker",
        |c| {
            class_condition(c, "WorkerUnreachable").is_some_and(|w| {
                w["status"] == "True"
                    && w["message"].as_str().unwrap_or_default().contains(&cluster)
            })
        },
    )
    .await?;
    ensure!(
        lost["status"]["devices"]["unknown"] == 8 && lost["status"]["devices"]["healthy"] == 0,
        "{}",
        lost["status"]["devices"]
    );
    let cq = env.cqs.get(&cq_name).await?;
    ensure!(
        nominal_gpus(&serde_json::to_value(&cq)?) == Some(8),
        "no quota cut for a partition alone"
    );
    let port = env.controller().port;
    let metrics = crate::controller::http_metrics(port).context("metrics")?;
    ensure!(
        metrics.contains(&format!(
            "kaccel_worker_cluster_reachable{{cluster=\"{cluster}\"}} 0"
        )),
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("worker_cluster"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // The ledger cannot be checked against a worker it cannot read: verify says so.
    let (in_sync, report) = ledger::verify_cluster(store, false).await?;
    ensure!(
        !in_sync && report.contains(&format!("worker {cluster}: cannot compare")),
        "{report}"
    );
    // Still admitted in the manager while the worker is away.
    let still = support::get_json(&workloads, &wl_name).await?;
    ensure!(support::is_true(&still, "Admitted"), "{}", still["status"]);

    // Back: converges with nothing lost or doubled.
    worker_apiserver("start", run)?;
    wait_obj(
        &classes,
        &class,
        "WorkerUnreachable=False, 8 healthy again",
        |c| {
            class_condition(c, "WorkerUnreachable").is_some_and(|w| w["status"] == "False")
                && c["status"]["devices"]["healthy"] == 8
        },
    )
    .await?;
    wait_obj(&mk_clusters, &cluster, "Active again", |c| {
        support::is_true(c, "Active")
    })
    .await?;

    // Finished in the worker: the manager's Workload finishes and is settled once,
    // naming the worker.
    ledger::finish(&remote, &wl_name).await?;
    wait_obj(&workloads, &wl_name, "Finished in the manager", |w| {
        support::is_true(w, "Finished")
    })
    .await?;
    let posts = ledger::posts_of(store, &uid, WAIT).await?;
    ensure!(
        posts.iter().all(|p| p["cluster"] == cluster.as_str()),
        "every Post names the worker: {posts:?}"
    );
    let entries = ledger::export(store, Some(&budget))?;
    let of_workload: Vec<&Value> = entries
        .iter()
        .filter(|e| e["workloadUid"] == uid.as_str())
        .collect();
    let reserves = of_workload
        .iter()
        .filter(|e| e["kind"] == "Reserve")
        .count();
    ensure!(
        reserves == 1,
        "still one Reserve after the outage: {of_workload:?}"
    );
    let focus = ledger::export_table(store, "focus", &[])?;
    let rows: Vec<_> = focus
        .iter()
        .filter(|r| r.get("ResourceId").cloned().flatten().as_deref() == Some(uid.as_str()))
        .collect();
    ensure!(!rows.is_empty(), "FOCUS rows of the Workload");
    ensure!(
        rows.iter()
            .all(|r| r.get("x_Cluster").cloned().flatten().as_deref() == Some(cluster.as_str())),
        "every FOCUS row names the worker: {rows:?}"
    );
    let (in_sync, report) = ledger::verify_cluster(store, true).await?;
    ensure!(
        in_sync,
        "ledger verify --cluster after the settlement: {report}"
    );
    support::delete_job(&jobs, &job).await?;

    // A DRA node of the worker (its ResourceSlice as NVIDIA's driver publishes
    // it) adds its 8 GPUs to the class, as a flavor of its own.
    let dra_model = format!("NVIDIA-H100-DRA-{}", id.to_uppercase());
    crate::dra::publish(
        worker,
        worker_cleanup,
        &format!("{id}-dra-1"),
        &dra_model,
        crate::dra::nvidia_slice(&format!("{id}-dra-1"), "NVIDIA H100 80GB HBM3"),
    )
    .await?;
    let with_dra = wait_obj(&classes, &class, "16 healthy, a second flavor", |c| {
        c["status"]["devices"]["healthy"] == 16
            && c["status"]["flavors"]
                .as_array()
                .is_some_and(|f| f.len() == 2)
    })
    .await?;
    for flavor in with_dra["status"]["flavors"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = flavor["name"].as_str().unwrap_or_default();
        if name != manager_flavor {
            crate::dra::clean_flavor(&mut env.cleanup, name);
        }
    }
    Ok(())
}

#[tokio::test]
async fn a_worker_down_when_kaccel_starts_is_read_once_it_answers() {
    run("mkd", Scenario::WorkerDownAtStart).await;
}

/// The worker's API server is down when kaccel starts: the class names it and
/// counts none of its devices (nothing was read to keep); once it answers, its
/// Nodes and ResourceSlices are read and the quota appears.
async fn late_worker(
    env: &mut ledger::Env,
    store: &str,
    worker: &Client,
    worker_cleanup: &mut Cleanup,
    kubeconfig: &str,
    run: &str,
) -> Result<()> {
    let id = env.id.clone();
    let cluster = format!("w-{id}");
    let check = format!("{id}-mk");
    let (class, budget, ns) = (format!("h100-{id}"), format!("b-{id}"), format!("ns-{id}"));
    let model = format!("NVIDIA-H100-80GB-HBM3-{}", id.to_uppercase());
    let name = format!("{id}-gpu-1");
    Api::<Node>::all(worker.clone())
        .create(&PostParams::default(), &h100_node(&name, &model))
        .await?;
    worker_cleanup.add(None, ApiResource::erase::<Node>(&()), &name);
    let dra = format!("{id}-dra-1");
    crate::dra::publish(
        worker,
        worker_cleanup,
        &dra,
        &format!("NVIDIA-H100-DRA-{}", id.to_uppercase()),
        crate::dra::nvidia_slice(&dra, "NVIDIA H100 80GB HBM3"),
    )
    .await?;
    let secret_name = manager_side(env, kubeconfig, &cluster, &check).await?;
    env.create_class(ledger::h100_class(&class)).await?;
    env.budget(&budget, "vision", &ns, &class, "100000").await?;

    worker_apiserver("kill", run)?;
    env.start_with(store, |config| {
        with_worker(config, &cluster, &secret_name, &check)
    });
    let classes: Api<DynamicObject> = Api::all_with(env.client.clone(), &ledger::class_ar());
    let down = wait_obj(
        &classes,
        &class,
        "no devices while the worker is down",
        |c| c["status"]["observedGeneration"].is_i64() && c["status"]["devices"]["healthy"] == 0,
    )
    .await?;
    ensure!(
        down["status"]["devices"]["unknown"] == 0,
        "nothing read, nothing to keep: {}",
        down["status"]["devices"]
    );
    worker_apiserver("start", run)?;
    let up = wait_obj(
        &classes,
        &class,
        "the worker's 4 + 8 GPUs, WorkerUnreachable=False",
        |c| {
            c["status"]["devices"]["healthy"] == 12
                && class_condition(c, "WorkerUnreachable").is_some_and(|w| w["status"] == "False")
        },
    )
    .await?;
    for flavor in up["status"]["flavors"].as_array().into_iter().flatten() {
        crate::dra::clean_flavor(
            &mut env.cleanup,
            flavor["name"].as_str().unwrap_or_default(),
        );
    }
    let cq_name = format!("{budget}-{class}");
    wait_obj(
        &env.cqs,
        &cq_name,
        "the guarantee of 8 on the worker's devices",
        |cq| {
            cq["spec"]["resourceGroups"]
                .as_array()
                .is_some_and(|g| !g.is_empty())
        },
    )
    .await?;
    Ok(())
}
