//! Kueue MultiKueue, from the manager cluster: Kueue's MultiKueue objects for the
//! configured workers (`multiKueue.workers`), and a read-only watch of each
//! worker's Nodes through the kubeconfig Secret Kueue uses.
//!
//! A worker that cannot be read keeps its last-read Nodes, with their devices
//! Unknown (see [`crate::inventory::index::worker_union`]): capacity, so a
//! network partition alone cuts no quota (invariant 6).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use super::config::{MultiKueue, Worker};
use super::metrics::Metrics;
use super::watches::WatchBackoff;
use crate::inventory::Inventory;
use crate::inventory::index::NodeIndex;
use crate::k8s::labels::MANAGED_BY_LABEL;

/// Kueue's controller name for MultiKueue AdmissionChecks.
pub const MULTIKUEUE_CONTROLLER: &str = "kueue.x-k8s.io/multikueue";

/// How long a worker whose Secret is missing or unusable waits before kaccel
/// reads the Secret again.
const SECRET_RETRY: Duration = Duration::from_secs(5);

/// How often a worker's API server is asked for its version, and how long it
/// may take to answer before the worker counts as unreachable.
const PROBE_INTERVAL: Duration = Duration::from_secs(5);
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);

/// Kueue's objects for the configured workers, in the order they are written: a
/// MultiKueueCluster per worker, the MultiKueueConfig listing them, and the
/// AdmissionCheck naming that config.
pub fn objects(config: &MultiKueue, instance: &str) -> Vec<(&'static str, Value)> {
    let api_version = crate::k8s::resources::kueue_api_version();
    let labels = json!({ MANAGED_BY_LABEL: instance });
    let mut out: Vec<(&'static str, Value)> = config
        .workers
        .iter()
        .map(|w| {
            (
                "MultiKueueCluster",
                json!({
                    "apiVersion": api_version,
                    "kind": "MultiKueueCluster",
                    "metadata": {"name": w.name, "labels": labels},
                    "spec": {"clusterSource": {"kubeConfig": {
                        "location": w.kubeconfig_secret,
                        "locationType": "Secret",
                    }}},
                }),
            )
        })
        .collect();
    let name = &config.admission_check_name;
    out.push((
        "MultiKueueConfig",
        json!({
            "apiVersion": api_version,
            "kind": "MultiKueueConfig",
            "metadata": {"name": name, "labels": labels},
            "spec": {"clusters": config.workers.iter().map(|w| w.name.as_str()).collect::<Vec<_>>()},
        }),
    ));
    out.push((
        "AdmissionCheck",
        json!({
            "apiVersion": api_version,
            "kind": "AdmissionCheck",
            "metadata": {"name": name, "labels": labels},
            "spec": {
                "controllerName": MULTIKUEUE_CONTROLLER,
                "parameters": {"apiGroup": crate::k8s::resources::KUEUE_GROUP, "kind": "MultiKueueConfig", "name": name},
            },
        }),
    ));
    out
}

/// Writes [`objects`] (server-side apply), then deletes the MultiKueueClusters
/// this installation wrote for workers no longer configured. Retried until it
/// succeeds: without them Kueue dispatches nothing.
pub(super) async fn write_objects(
    client: Client,
    config: MultiKueue,
    instance: String,
    field_manager: String,
) {
    let mut backoff = WatchBackoff::default();
    loop {
        match try_write_objects(&client, &config, &instance, &field_manager).await {
            Ok(()) => return,
            Err(e) => {
                let wait = backoff
                    .next()
                    .unwrap_or(Duration::from_secs(5))
                    .max(Duration::from_secs(1));
                tracing::warn!(error = %e, retry_in = ?wait, "cannot write Kueue's MultiKueue objects");
                tokio::time::sleep(wait).await;
            }
        }
    }
}

async fn try_write_objects(
    client: &Client,
    config: &MultiKueue,
    instance: &str,
    field_manager: &str,
) -> Result<(), kube::Error> {
    let params = PatchParams::apply(field_manager).force();
    for (kind, object) in objects(config, instance) {
        let api: Api<DynamicObject> =
            Api::all_with(client.clone(), &crate::k8s::resources::kueue(kind));
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        api.patch(&name, &params, &Patch::Apply(&object)).await?;
    }
    let clusters: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &crate::k8s::resources::kueue("MultiKueueCluster"),
    );
    let ours = clusters
        .list(&ListParams::default().labels(&crate::k8s::instance::managed_selector(instance)))
        .await?;
    for gone in ours
        .items
        .iter()
        .filter(|c| !config.workers.iter().any(|w| w.name == c.name_any()))
    {
        tracing::info!(cluster = %gone.name_any(), "deleting the MultiKueueCluster of a worker no longer configured");
        clusters
            .delete(&gone.name_any(), &DeleteParams::default())
            .await?;
    }
    Ok(())
}

/// Whether kaccel reads a worker now.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Reach {
    /// Not read yet since start.
    Connecting,
    Reachable,
    /// The last attempt failed: why.
    Unreachable(String),
}

/// One worker's Nodes, ResourceSlices, and whether they are current.
#[derive(Clone)]
struct WorkerCache {
    name: String,
    index: Arc<Mutex<NodeIndex>>,
    /// Its ResourceSlices by name, each naming its node `<cluster>/<node>` as
    /// the index keys it ([`worker_slice`]); empty where DRA is not served.
    slices: Arc<Mutex<SliceCache>>,
    reach: Arc<Mutex<Reach>>,
}

/// A worker's ResourceSlices as their watch delivers them.
#[derive(Default)]
struct SliceCache {
    current: BTreeMap<String, Arc<ResourceSlice>>,
    /// Slices of a re-list under way (they replace `current` when it ends).
    relist: Option<BTreeMap<String, Arc<ResourceSlice>>>,
}

impl SliceCache {
    /// Applies one watch event; true when the slices changed.
    fn apply(&mut self, event: watcher::Event<ResourceSlice>) -> bool {
        match event {
            watcher::Event::Init => {
                self.relist = Some(BTreeMap::new());
                false
            }
            watcher::Event::InitApply(slice) => {
                let target = self.relist.as_mut().unwrap_or(&mut self.current);
                target.insert(slice.name_any(), Arc::new(slice));
                false
            }
            watcher::Event::InitDone => {
                if let Some(relisted) = self.relist.take() {
                    self.current = relisted;
                }
                true
            }
            watcher::Event::Apply(slice) => {
                let slice = Arc::new(slice);
                self.current.insert(slice.name_any(), slice.clone()) != Some(slice)
            }
            watcher::Event::Delete(slice) => self.current.remove(&slice.name_any()).is_some(),
        }
    }
}

/// A worker's ResourceSlice as the pooled inventory reads it: its node named
/// `<cluster>/<node>` (the worker's key for that Node), no managed fields.
pub(crate) fn worker_slice(cluster: &str, slice: &mut ResourceSlice) {
    slice.metadata.managed_fields = None;
    if let Some(node) = slice.spec.node_name.as_mut() {
        *node = crate::inventory::worker_key(cluster, node);
    }
}

/// Every worker's Node watch, as the reconcile reads them.
#[derive(Clone, Default)]
pub(super) struct Workers {
    workers: Vec<WorkerCache>,
}

impl Workers {
    /// Whether MultiKueue workers are configured (then only their Nodes are planned).
    pub(super) fn enabled(&self) -> bool {
        !self.workers.is_empty()
    }

    /// The workers kaccel cannot read now, and why (one whose Nodes were not
    /// all read yet since start is "not read yet").
    pub(super) fn unreachable(&self) -> BTreeMap<String, String> {
        self.workers
            .iter()
            .filter_map(|w| {
                let synced = w.index.lock().expect("worker index lock").is_synced();
                match &*w.reach.lock().expect("reach lock") {
                    Reach::Reachable if synced => None,
                    Reach::Reachable | Reach::Connecting => {
                        Some((w.name.clone(), "not read yet since kaccel started".into()))
                    }
                    Reach::Unreachable(why) => Some((w.name.clone(), why.clone())),
                }
            })
            .collect()
    }

    /// Some worker's first read is under way (not failed): planning now would
    /// plan without its Nodes and cut its quota for a moment. Each first read
    /// ends in a full list or an error, and either wakes the planner.
    pub(super) fn first_read_pending(&self) -> bool {
        self.workers.iter().any(|w| {
            !w.index.lock().expect("worker index lock").is_synced()
                && !matches!(*w.reach.lock().expect("reach lock"), Reach::Unreachable(_))
        })
    }

    /// The workers' Nodes, with the devices their ResourceSlices publish, as one
    /// inventory (see [`worker_union`](crate::inventory::index::worker_union)).
    pub(super) fn inventory(&self, unreachable: &BTreeMap<String, String>) -> Inventory {
        let parts: Vec<(&str, Arc<Inventory>)> = self
            .workers
            .iter()
            .map(|w| {
                let nodes = w.index.lock().expect("worker index lock").snapshot();
                let slices = w.slices.lock().expect("worker slices lock");
                let inventory = if slices.current.is_empty() {
                    nodes
                } else {
                    Arc::new(nodes.with_slices(slices.current.values().map(|s| &**s)))
                };
                (w.name.as_str(), inventory)
            })
            .collect();
        crate::inventory::index::worker_union(parts, unreachable)
    }

    /// Sets the per-worker gauges.
    pub(super) fn export_metrics(&self, metrics: &Metrics, unreachable: &BTreeMap<String, String>) {
        for w in &self.workers {
            let labels = super::metrics::WorkerLabels {
                cluster: w.name.clone(),
            };
            metrics
                .worker_cluster_reachable
                .get_or_create(&labels)
                .set(i64::from(!unreachable.contains_key(&w.name)));
            let nodes = w
                .index
                .lock()
                .expect("worker index lock")
                .snapshot()
                .nodes
                .len();
            metrics
                .worker_cluster_nodes
                .get_or_create(&labels)
                .set(i64::try_from(nodes).unwrap_or(i64::MAX));
        }
    }
}

/// Starts a Node (and ResourceSlice) watch per configured worker; each wakes the planner through
/// `wake` when what the inventory reads changed or the worker's reachability did.
pub(super) fn watch_workers(
    client: &Client,
    config: &MultiKueue,
    wake: tokio::sync::mpsc::UnboundedSender<()>,
) -> Workers {
    let workers: Vec<WorkerCache> = config
        .workers
        .iter()
        .map(|w| WorkerCache {
            name: w.name.clone(),
            index: Arc::new(Mutex::new(NodeIndex::for_worker(&w.name))),
            slices: Default::default(),
            reach: Arc::new(Mutex::new(Reach::Connecting)),
        })
        .collect();
    for (worker, cache) in config.workers.iter().zip(&workers) {
        tokio::spawn(watch_worker(
            client.clone(),
            config.kueue_namespace.clone(),
            worker.clone(),
            cache.clone(),
            wake.clone(),
        ));
    }
    Workers { workers }
}

impl WorkerCache {
    /// Records the reachability; true when it changed.
    fn set_reach(&self, reach: Reach) -> bool {
        let mut current = self.reach.lock().expect("reach lock");
        if *current == reach {
            return false;
        }
        match &reach {
            Reach::Unreachable(why) => {
                tracing::warn!(worker = %self.name, error = %why, "MultiKueue worker unreachable: its devices count as Unknown")
            }
            Reach::Reachable => tracing::info!(worker = %self.name, "MultiKueue worker reachable"),
            Reach::Connecting => {}
        }
        *current = reach;
        true
    }
}

/// Reads the worker's Nodes and ResourceSlices for as long as kaccel runs: a
/// failed watch or probe marks the worker unreachable (what was read is kept),
/// the next event or answered probe reachable again.
async fn watch_worker(
    client: Client,
    namespace: String,
    worker: Worker,
    cache: WorkerCache,
    wake: tokio::sync::mpsc::UnboundedSender<()>,
) {
    loop {
        let worker_client = match crate::k8s::remote::client_from_secret(
            &client,
            &namespace,
            &worker.kubeconfig_secret,
        )
        .await
        {
            Ok(c) => c,
            Err(why) => {
                if cache.set_reach(Reach::Unreachable(why)) {
                    let _ = wake.send(());
                }
                tokio::time::sleep(SECRET_RETRY).await;
                continue;
            }
        };
        let mut events = watcher(Api::<Node>::all(worker_client.clone()), Default::default())
            .backoff(WatchBackoff::default())
            .boxed();
        // Its DRA devices, where it serves resource.k8s.io/v1 ResourceSlices.
        let slice_api = Api::<ResourceSlice>::all(worker_client.clone());
        let mut slice_events = match slice_api.list(&ListParams::default().limit(1)).await {
            Ok(_) => {
                let cluster = worker.name.clone();
                watcher(slice_api, Default::default())
                    .backoff(WatchBackoff::default())
                    .modify(move |s| worker_slice(&cluster, s))
                    .boxed()
            }
            // The server answered: not served (no DRA there) or not allowed.
            Err(kube::Error::Api(status)) => {
                tracing::info!(worker = %worker.name, error = %status.message, code = status.code, "the worker's ResourceSlices are not read; its DRA devices are not counted");
                futures::stream::pending().boxed()
            }
            // It did not answer: try the whole connection again.
            Err(e) => {
                if cache.set_reach(Reach::Unreachable(e.to_string())) {
                    let _ = wake.send(());
                }
                tokio::time::sleep(SECRET_RETRY).await;
                continue;
            }
        };
        // A watch over a connection that went silent (a partition, a frozen
        // API server) sees no error for minutes: a probe notices within
        // PROBE_INTERVAL + PROBE_TIMEOUT.
        let mut probe = tokio::time::interval(PROBE_INTERVAL);
        probe.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let changed = tokio::select! {
                event = events.next() => match event {
                    Some(Ok(e)) => {
                        let reach_changed = cache.set_reach(Reach::Reachable);
                        let nodes_changed = super::watches::apply_node_event(
                            &mut cache.index.lock().expect("worker index lock"),
                            &e,
                        );
                        reach_changed || nodes_changed
                    }
                    // The server answered (an expired resource version after
                    // a compaction or a restart): the watcher re-lists.
                    Some(Err(watcher::Error::WatchError(_))) => false,
                    Some(Err(e)) => cache.set_reach(Reach::Unreachable(e.to_string())),
                    None => break,
                },
                event = slice_events.next() => match event {
                    Some(Ok(e)) => cache.slices.lock().expect("worker slices lock").apply(e),
                    Some(Err(watcher::Error::WatchError(_))) | None => false,
                    Some(Err(e)) => cache.set_reach(Reach::Unreachable(e.to_string())),
                },
                _ = probe.tick() => {
                    match tokio::time::timeout(PROBE_TIMEOUT, worker_client.apiserver_version()).await {
                        // The watch re-lists within a second of the
                        // server's return; until then the Nodes last read stand.
                        Ok(Ok(_)) => cache.set_reach(Reach::Reachable),
                        Ok(Err(e)) => cache.set_reach(Reach::Unreachable(e.to_string())),
                        Err(_) => cache.set_reach(Reach::Unreachable(format!(
                            "no answer within {} s",
                            PROBE_TIMEOUT.as_secs()
                        ))),
                    }
                }
            };
            if changed && wake.send(()).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MultiKueue {
        MultiKueue {
            workers: vec![
                Worker {
                    name: "worker-a".into(),
                    kubeconfig_secret: "worker-a-kubeconfig".into(),
                },
                Worker {
                    name: "worker-b".into(),
                    kubeconfig_secret: "b-secret".into(),
                },
            ],
            kueue_namespace: "kueue-system".into(),
            admission_check_name: "kaccel-multikueue".into(),
        }
    }

    /// A DRA node as NVIDIA's DRA driver leaves it (model label, no device
    /// resource) and its ResourceSlice of 8 GPUs (`deviceinfo.go` attributes).
    fn dra_node_and_slice(node: &str) -> (Node, ResourceSlice) {
        let node_object = serde_json::from_value(json!({
            "metadata": {"name": node, "labels": {
                "kubernetes.io/hostname": node,
                "kaccel.io/accelerator.model": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"capacity": {"cpu": "64", "memory": "512Gi"},
                       "allocatable": {"cpu": "64", "memory": "512Gi"},
                       "conditions": [{"type": "Ready", "status": "True"}]},
        }))
        .unwrap();
        let devices: Vec<Value> = (0..8)
            .map(|i| {
                json!({"name": format!("gpu-{i}"), "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{node}-{i:04}")},
                    "productName": {"string": "NVIDIA H100 80GB HBM3"},
                    "driverVersion": {"version": "550.54.15"},
                }, "capacity": {"memory": {"value": "81559Mi"}}})
            })
            .collect();
        let slice = serde_json::from_value(json!({
            "metadata": {"name": format!("{node}-gpu.nvidia.com")},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices},
        }))
        .unwrap();
        (node_object, slice)
    }

    #[test]
    fn a_workers_resource_slices_publish_devices_on_its_own_nodes() {
        let (node, mut slice) = dra_node_and_slice("gpu-1");
        let mut index = NodeIndex::for_worker("worker-a");
        index.begin_relist();
        index.relisted(&node);
        index.end_relist();
        worker_slice("worker-a", &mut slice);
        assert_eq!(slice.spec.node_name.as_deref(), Some("worker-a/gpu-1"));
        let mut slices = SliceCache::default();
        assert!(!slices.apply(watcher::Event::Init));
        assert!(!slices.apply(watcher::Event::InitApply(slice.clone())));
        assert!(slices.current.is_empty(), "a re-list lands whole");
        assert!(slices.apply(watcher::Event::InitDone));
        assert!(
            !slices.apply(watcher::Event::Apply(slice.clone())),
            "unchanged"
        );
        let pooled = index
            .snapshot()
            .with_slices(slices.current.values().map(|s| &**s));
        let gpus: u32 = pooled.nodes["worker-a/gpu-1"]
            .groups
            .iter()
            .filter(|g| g.is_dra_only())
            .map(|g| g.capacity)
            .sum();
        assert_eq!(gpus, 8, "{:?}", pooled.nodes["worker-a/gpu-1"].groups);
        assert!(slices.apply(watcher::Event::Delete(slice)));
        assert!(slices.current.is_empty());
    }

    #[test]
    fn one_cluster_per_worker_one_config_listing_them_one_check_naming_it() {
        let objects = objects(&config(), "kaccel");
        let kinds: Vec<&str> = objects.iter().map(|(k, _)| *k).collect();
        assert_eq!(
            kinds,
            [
                "MultiKueueCluster",
                "MultiKueueCluster",
                "MultiKueueConfig",
                "AdmissionCheck"
            ]
        );
        // Kueue v1beta2: the kubeconfig source is under spec.clusterSource, a
        // Secret in Kueue's namespace.
        assert_eq!(
            objects[1].1["spec"]["clusterSource"]["kubeConfig"],
            json!({"location": "b-secret", "locationType": "Secret"})
        );
        assert_eq!(objects[1].1["metadata"]["name"], "worker-b");
        assert_eq!(
            objects[2].1["spec"]["clusters"],
            json!(["worker-a", "worker-b"])
        );
        let check = &objects[3].1;
        assert_eq!(check["spec"]["controllerName"], MULTIKUEUE_CONTROLLER);
        assert_eq!(
            check["spec"]["parameters"],
            json!({"apiGroup": "kueue.x-k8s.io", "kind": "MultiKueueConfig", "name": "kaccel-multikueue"})
        );
        for (_, o) in &objects {
            assert_eq!(o["metadata"]["labels"][MANAGED_BY_LABEL], "kaccel");
            assert_eq!(o["apiVersion"], "kueue.x-k8s.io/v1beta2");
        }
    }
}
