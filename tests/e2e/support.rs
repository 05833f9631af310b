//! Shared helpers for the end-to-end suite: the client, Kueue's v1beta2 kinds as
//! dynamic objects, unique names, polling with deadlines and best-effort cleanup.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, Config};
use serde_json::{Value, json};

pub const KUEUE_GROUP: &str = "kueue.x-k8s.io";
pub const KUEUE_VERSION: &str = "v1beta2";

/// Connects with the kubeconfig named by `KUBECONFIG`, and checks that the
/// API server answers and serves Kueue's v1beta2 API.
///
/// Panics with an explanation when it cannot: the suite must never pass
/// without having talked to a real cluster.
pub async fn client() -> Client {
    let path = std::env::var("KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "KUBECONFIG is not set. The e2e suite needs a kube-apiserver with Kueue ({KUEUE_GROUP}/{KUEUE_VERSION}): \
             run `e2e/test.sh`, or `e2e/cluster.sh up && eval \"$(e2e/cluster.sh env)\"` before \
             `cargo test --features e2e --test e2e`, or point KUBECONFIG at a cluster with Kueue installed"
        )
    });
    let kubeconfig = Kubeconfig::read_from(&path)
        .unwrap_or_else(|e| panic!("cannot read the kubeconfig KUBECONFIG={path}: {e}"));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("invalid kubeconfig KUBECONFIG={path}: {e}"));
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .unwrap_or_else(|e| panic!("cannot build a client for {server} (KUBECONFIG={path}): {e}"));
    let version = client.apiserver_version().await.unwrap_or_else(|e| {
        panic!("the API server {server} (KUBECONFIG={path}) is unreachable: {e}. Is the cluster up? (e2e/cluster.sh status)")
    });
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    if let Err(e) = cqs.list(&ListParams::default().limit(1)).await {
        panic!(
            "the API server {server} ({}) does not serve {KUEUE_GROUP}/{KUEUE_VERSION} ClusterQueues: {e}. \
             Is Kueue v0.17+ installed?",
            version.git_version
        );
    }
    client
}

/// `ApiResource` of a Kueue v1beta2 kind (plural derived from the kind).
/// The kubeconfig every `kaccel run` of the suite uses: kaccel's ServiceAccount
/// with the RBAC of manifests/ and a TokenRequest token, written by
/// `e2e/cluster.sh up` (or `identity`). The tests' own client stays the admin.
pub fn controller_kubeconfig() -> String {
    std::env::var("KACCEL_E2E_CONTROLLER_KUBECONFIG").unwrap_or_else(|_| {
        panic!(
            "KACCEL_E2E_CONTROLLER_KUBECONFIG is unset: eval \"$(e2e/cluster.sh env)\" (or run \
             `e2e/cluster.sh identity` against a cluster it did not start): kaccel runs under \
             its own ServiceAccount in every e2e test"
        )
    })
}

pub fn kueue(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(KUEUE_GROUP, KUEUE_VERSION, kind))
}

/// A name suffix unique to this test process and call, DNS-1123 safe.
pub fn unique(prefix: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "{prefix}-{:x}-{:x}-{n}",
        (nanos / 1_000_000) % 0xff_ffff,
        std::process::id() % 0xffff
    )
}

/// Builds a `DynamicObject` from JSON (which must carry apiVersion and kind).
pub fn object(value: Value) -> DynamicObject {
    serde_json::from_value(value).expect("test object is a valid DynamicObject")
}

/// Creates a Kueue object, with context in the error.
pub async fn create(api: &Api<DynamicObject>, obj: Value) -> Result<DynamicObject> {
    let obj = object(obj);
    let name = obj.metadata.name.clone().unwrap_or_default();
    api.create(&PostParams::default(), &obj)
        .await
        .with_context(|| format!("creating {:?} {name}", obj.types.as_ref().map(|t| &t.kind)))
}

/// The whole object as JSON (metadata, spec, status).
pub async fn get_json(api: &Api<DynamicObject>, name: &str) -> Result<Value> {
    let obj = api
        .get(name)
        .await
        .with_context(|| format!("getting {name}"))?;
    Ok(serde_json::to_value(obj)?)
}

/// The condition of `type_` in `status.conditions`, if any.
pub fn condition<'a>(obj: &'a Value, type_: &str) -> Option<&'a Value> {
    obj.pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)
}

/// Whether condition `type_` has status `"True"`.
pub fn is_true(obj: &Value, type_: &str) -> bool {
    condition(obj, type_).is_some_and(|c| c["status"] == "True")
}

/// Polls `name` until `pred` holds on it, or fails after `timeout` showing the
/// last state seen.
pub async fn wait_until(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = Instant::now() + timeout;
    loop {
        let obj = get_json(api, name).await?;
        if pred(&obj) {
            return Ok(obj);
        }
        if Instant::now() > deadline {
            bail!(
                "timed out after {timeout:?} waiting for {name}: {what}; last status: {}",
                serde_json::to_string_pretty(&obj["status"]).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What Kueue's job reconciler does once the job of an Evicted Workload has
/// stopped (there is no job here, so the test does it): QuotaReserved=False,
/// Admitted=False, admission cleared, and Requeued with the eviction's reason —
/// True only after a preemption or a node failure, as Kueue v0.17 sets it; other
/// evictions (a stopped ClusterQueue, a deactivation) wait for Kueue to requeue
/// them. A replace with the object's resourceVersion, so a concurrent write makes
/// it fail (409, not an error); the caller tries again at its next look.
pub async fn release_quota(wls: &Api<DynamicObject>, name: &str, obj: &Value) -> Result<()> {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let evicted = condition(obj, "Evicted").cloned().unwrap_or_default();
    let requeued =
        ["Preempted", "NodeFailures"].contains(&evicted["reason"].as_str().unwrap_or_default());
    let mut v = obj.clone();
    let conditions = v["status"]["conditions"]
        .as_array_mut()
        .context("conditions")?;
    conditions.retain(|c| c["type"] != "Requeued");
    for c in conditions.iter_mut() {
        let (status, reason, message) = match c["type"].as_str() {
            Some("QuotaReserved") => ("False", "Pending", evicted["message"].clone()),
            Some("Admitted") => (
                "False",
                "NoReservation",
                json!("The workload has no reservation"),
            ),
            _ => continue,
        };
        c["status"] = json!(status);
        c["reason"] = json!(reason);
        c["message"] = message;
        c["lastTransitionTime"] = json!(now);
    }
    conditions.push(json!({
        "type": "Requeued", "status": if requeued { "True" } else { "False" },
        "reason": evicted["reason"].clone(), "message": evicted["message"].clone(),
        "lastTransitionTime": now,
    }));
    if let Some(status) = v["status"].as_object_mut() {
        status.remove("admission");
    }
    match wls
        .replace_status(name, &PostParams::default(), &object(v))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e).with_context(|| format!("releasing the quota of {name}")),
    }
}

/// Creates `role` in kaccel-system and binds it to kaccel's ServiceAccount
/// (`kaccel-system/kaccel`) under the same name, as an overlay of the manifests
/// would; both are deleted by the cleanup.
pub async fn grant_kaccel(
    client: &Client,
    cleanup: &mut Cleanup,
    role: &k8s_openapi::api::rbac::v1::Role,
) -> Result<()> {
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let name = role
        .metadata
        .name
        .clone()
        .context("a Role without a name")?;
    Api::<Role>::namespaced(client.clone(), "kaccel-system")
        .create(&PostParams::default(), role)
        .await?;
    cleanup.add(
        Some("kaccel-system"),
        ApiResource::erase::<Role>(&()),
        &name,
    );
    let binding: RoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": "kaccel-system"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": "kaccel", "namespace": "kaccel-system"}]
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), "kaccel-system")
        .create(&PostParams::default(), &binding)
        .await?;
    cleanup.add(
        Some("kaccel-system"),
        ApiResource::erase::<RoleBinding>(&()),
        &name,
    );
    Ok(())
}

/// A namespace for one test, deleted by [`Cleanup::run`].
pub async fn namespace(client: &Client, name: &str) -> Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name, "labels": { "kaccel.dev/e2e": "true" } }
    }))?;
    api.create(&PostParams::default(), &ns)
        .await
        .with_context(|| format!("creating namespace {name}"))?;
    Ok(())
}

/// Objects a test created, deleted in reverse order whatever the test outcome.
/// There is no kube-controller-manager in the local harness, so namespaces
/// stay Terminating; objects inside are deleted explicitly first.
#[derive(Default)]
pub struct Cleanup {
    items: Vec<(Option<String>, ApiResource, String)>,
    namespaces: Vec<String>,
}

impl Cleanup {
    pub fn add(&mut self, ns: Option<&str>, ar: ApiResource, name: &str) {
        self.items
            .push((ns.map(str::to_owned), ar, name.to_owned()));
    }

    /// Deleted after everything added so far (e.g. a flavor after its queues).
    pub fn add_last(&mut self, ns: Option<&str>, ar: ApiResource, name: &str) {
        self.items
            .insert(0, (ns.map(str::to_owned), ar, name.to_owned()));
    }

    pub fn add_namespace(&mut self, name: &str) {
        self.namespaces.push(name.to_owned());
    }

    pub async fn run(self, client: &Client) {
        let dp = DeleteParams::background();
        for (ns, ar, name) in self.items.into_iter().rev() {
            let api: Api<DynamicObject> = match &ns {
                Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
                None => Api::all_with(client.clone(), &ar),
            };
            if let Err(e) = api.delete(&name, &dp).await {
                eprintln!("cleanup: deleting {} {name}: {e}", ar.kind);
            }
        }
        let api: Api<Namespace> = Api::all(client.clone());
        for ns in self.namespaces {
            if let Err(e) = api.delete(&ns, &dp).await {
                eprintln!("cleanup: deleting namespace {ns}: {e}");
            }
        }
    }
}

/// The tests share one cluster, and a running `kaccel run` manages every class,
/// budget and kaccel-labelled Kueue object in it: one test at a time, whatever
/// `--test-threads` says. Hold the guard for the whole test.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// batch/v1 Jobs, for `Api::namespaced_with`.
pub fn job_ar() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::batch::v1::Job>(&())
}

/// A suspended one-pod Job in Kueue's LocalQueue `queue` whose container `main`
/// asks for `count` of `resource` (and 1 CPU, 1 GiB): Kueue admits and resumes it,
/// and the Job controller makes its pod (there is no scheduler or kubelet here).
pub fn gpu_job(ns: &str, name: &str, queue: &str, resource: &str, count: u32) -> Value {
    json!({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"kueue.x-k8s.io/queue-name": queue}},
        "spec": {"parallelism": 1, "completions": 1, "suspend": true,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{
                "name": "main", "image": "ghcr.io/acme/train:cuda",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi", resource: count.to_string()},
                              "limits": {resource: count.to_string()}}}]}}}
    })
}

/// The pod the Job controller made for Job `job` (after Kueue resumed the Job).
pub async fn job_pod<K>(pods: &Api<K>, job: &str, wait: Duration) -> Result<K>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    crate::controller::wait_for(&format!("the pod of Job {job}"), wait, || async {
        let list = pods
            .list(&ListParams::default().labels(&format!("batch.kubernetes.io/job-name={job}")))
            .await?;
        Ok(list.items.into_iter().next())
    })
    .await
}

/// Deletes a Job and waits until it is gone. A test deletes its Jobs before their
/// Workloads: while a Job exists, Kueue makes it a new Workload.
pub async fn delete_job(jobs: &Api<DynamicObject>, name: &str) -> Result<()> {
    let _ = jobs.delete(name, &DeleteParams::background()).await;
    crate::controller::wait_for(
        &format!("Job {name} deleted"),
        Duration::from_secs(30),
        || async { Ok(jobs.get_opt(name).await?.is_none().then_some(())) },
    )
    .await
}

/// The note of the first Event in `ns` about `kind`/`name` (any kind when None)
/// with `reason`, waited for up to `timeout`.
pub async fn event_note(
    client: &kube::Client,
    ns: &str,
    kind: Option<&str>,
    name: &str,
    reason: &str,
    timeout: std::time::Duration,
) -> anyhow::Result<String> {
    use k8s_openapi::api::events::v1::Event;
    let events: kube::Api<Event> = kube::Api::namespaced(client.clone(), ns);
    crate::controller::wait_for(
        &format!("the {reason} Event of {name}"),
        timeout,
        || async {
            let found = events
                .list(&Default::default())
                .await?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason)
                        && e.regarding.as_ref().is_some_and(|r| {
                            r.name.as_deref() == Some(name)
                                && kind.is_none_or(|k| r.kind.as_deref() == Some(k))
                        })
                });
            Ok(found.and_then(|e| e.note))
        },
    )
    .await
}

/// A Ready Node as a kubelet reports it, with `labels` and `capacity` (also its
/// allocatable); the Ready condition's times are `heartbeat`.
pub fn ready_node(
    name: &str,
    labels: Value,
    capacity: Value,
    heartbeat: &str,
) -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": labels},
        "status": {
            "capacity": capacity, "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": heartbeat, "lastTransitionTime": heartbeat}],
        },
    }))
    .expect("a Node")
}

/// Percentile (nearest rank) of sorted figures; panics on none.
pub fn percentile<T: Copy>(sorted: &[T], p: f64) -> T {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    sorted[rank.min(sorted.len()) - 1]
}
