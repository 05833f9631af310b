//! The watch caches a reconcile reads, and the event stream that marks the world dirty.

use std::collections::BTreeMap;

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use super::diff::{Kind, ObjectRef};
use super::{Config, Error, managed_resource};
use crate::api::{AcceleratorClass, CreditBudget};
use crate::k8s::labels::{MANAGED_BY, MANAGED_BY_LABEL};

/// The watch caches the reconcile reads.
#[derive(Clone)]
pub(super) struct Caches {
    pub(super) nodes: Store<Node>,
    pub(super) slices: Option<Store<ResourceSlice>>,
    pub(super) classes: Store<AcceleratorClass>,
    pub(super) budgets: Store<CreditBudget>,
    pub(super) kueue: BTreeMap<Kind, Store<DynamicObject>>,
    /// Kueue's configuration ConfigMap (`kueue.configMap`).
    pub(super) kueue_config_map: Option<Store<ConfigMap>>,
    /// Every ClusterQueue, kept as its labels and covered resources only: the
    /// ones kaccel does not own are checked against Kueue's transformations.
    pub(super) all_cluster_queues: Store<DynamicObject>,
    /// DeviceTaintRules are served and watched: kaccel may take single DRA devices out.
    pub(super) device_taint_rules: bool,
}

pub(super) type Events = BoxStream<'static, Result<(), watcher::Error>>;

fn watch_typed<K>(api: Api<K>, config: watcher::Config) -> (Store<K>, Events)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    watch_slimmed(api, config, |_| {})
}

/// A watch cache of objects with managedFields (large, never read) and what
/// `slim` removes dropped before they are stored.
fn watch_slimmed<K>(
    api: Api<K>,
    config: watcher::Config,
    slim: impl Fn(&mut K) + Send + Sync + 'static,
) -> (Store<K>, Events)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let events = watcher(api, config)
        .default_backoff()
        .modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            slim(o);
        })
        .reflect(writer)
        .map(|e| e.map(|_| ()))
        .boxed();
    (store, events)
}

/// ResourceClaims, for who holds each DRA device: only their allocation and the
/// pods they are reserved for are kept (the spec and device statuses are dropped),
/// and their changes never wake the planner. Run the events to keep the store
/// current.
pub(super) fn watch_claims(client: &Client) -> (Store<ResourceClaim>, Events) {
    watch_slimmed(
        Api::<ResourceClaim>::all(client.clone()),
        Default::default(),
        |c: &mut ResourceClaim| {
            c.spec = Default::default();
            c.metadata.annotations = None;
            c.metadata.labels = None;
            if let Some(status) = c.status.as_mut() {
                status.devices = None;
                if let Some(a) = status.allocation.as_mut() {
                    a.node_selector = None;
                    if let Some(d) = a.devices.as_mut() {
                        d.config = None;
                    }
                }
            }
        },
    )
}

/// What kubelets report that the inventory and health loop never read: the
/// node's container images (up to 50 names and sizes each, the largest part of
/// a real Node), attached volumes and the kubelet's config source.
fn slim_node(node: &mut Node) {
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
    }
}

/// Every ClusterQueue, slimmed to its labels and `spec.resourceGroups[].coveredResources`
/// (Kueue rewrites a queue's status on every admission: none of it is kept), and
/// an event only when a queue's covered resources change.
fn watch_covered_resources(client: &Client) -> (Store<DynamicObject>, Events) {
    let ar = crate::k8s::resources::kueue(Kind::ClusterQueue.as_str());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let writer = reflector::store::Writer::new(ar);
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(slim_cluster_queue)
        .reflect(writer)
        .applied_objects()
        .predicate_filter(
            |q: &DynamicObject| {
                use std::hash::{Hash, Hasher};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                covered_resources(q).hash(&mut hasher);
                Some(hasher.finish())
            },
            Default::default(),
        )
        .map(|e| e.map(|_| ()))
        .boxed();
    (store, events)
}

/// Keeps a ClusterQueue's name, labels and covered resources.
fn slim_cluster_queue(q: &mut DynamicObject) {
    let covered: Vec<Value> = covered_resources(q).into_iter().map(Value::from).collect();
    q.metadata.managed_fields = None;
    q.metadata.annotations = None;
    q.metadata.owner_references = None;
    q.data = serde_json::json!({"spec": {"resourceGroups": [{"coveredResources": covered}]}});
}

/// The resources a ClusterQueue covers, over all its resource groups, sorted.
pub(super) fn covered_resources(q: &DynamicObject) -> std::collections::BTreeSet<String> {
    q.data
        .pointer("/spec/resourceGroups")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|g| g.get("coveredResources").and_then(Value::as_array))
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_string))
        .collect()
}

pub(super) async fn start_watches(
    client: &Client,
    config: &Config,
) -> Result<(Caches, Events), Error> {
    let managed = watcher::Config::default().labels(&format!("{MANAGED_BY_LABEL}={MANAGED_BY}"));
    let (nodes, nodes_events) = watch_slimmed(
        Api::<Node>::all(client.clone()),
        Default::default(),
        slim_node,
    );
    let (classes, class_events) = watch_typed(
        Api::<AcceleratorClass>::all(client.clone()),
        Default::default(),
    );
    let (budgets, budget_events) =
        watch_typed(Api::<CreditBudget>::all(client.clone()), Default::default());
    let mut streams: Vec<Events> = vec![nodes_events, class_events, budget_events];

    let slices = if config.watch_resource_slices {
        let api = Api::<ResourceSlice>::all(client.clone());
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => {
                let (store, events) = watch_typed(api, Default::default());
                streams.push(events);
                Some(store)
            }
            Err(e) => {
                tracing::info!(error = %e, "resource.k8s.io/v1 ResourceSlices not served; DRA devices are not read");
                None
            }
        }
    } else {
        None
    };

    // Kueue's Configuration says whether it counts kaccel's DeviceClasses and each
    // vendor resource as the class resource. Field-selected on the name: the Role
    // grants that one ConfigMap.
    let kueue_config_map = match config.kueue.config_map_ref() {
        Some((namespace, name)) => {
            let (store, events) = watch_typed(
                Api::<ConfigMap>::namespaced(client.clone(), namespace),
                watcher::Config::default().fields(&format!("metadata.name={name}")),
            );
            streams.push(events);
            Some(store)
        }
        _ => None,
    };

    let (all_cluster_queues, cluster_queue_events) = watch_covered_resources(client);
    streams.push(cluster_queue_events);

    let mut kueue = BTreeMap::new();
    let mut device_taint_rules = false;
    for kind in Kind::ALL {
        let ar = managed_resource(kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let mut writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
        let served = match kind {
            Kind::DeviceClass => slices.is_some(),
            // Served only with resource.k8s.io/v1alpha3 on (Kubernetes 1.35): probe.
            Kind::DeviceTaintRule => {
                slices.is_some()
                    && config.health.actions.device_taint_rules
                    && api.list(&ListParams::default().limit(1)).await.is_ok()
            }
            _ => true,
        };
        if kind == Kind::DeviceTaintRule {
            device_taint_rules = served;
        }
        if kind == Kind::DeviceTaintRule
            && !served
            && slices.is_some()
            && config.health.actions.device_taint_rules
        {
            tracing::info!(
                "resource.k8s.io/v1alpha3 DeviceTaintRules not served; a failed DRA device cordons its node instead"
            );
        }
        if !served {
            // No ResourceSlices read (so no DRA-only flavor, DeviceClass or device
            // rule to write), or DeviceTaintRules not served: an empty cache,
            // ready at once, and no watch.
            writer.apply_watcher_event(&watcher::Event::Init);
            writer.apply_watcher_event(&watcher::Event::InitDone);
            kueue.insert(kind, store);
            continue;
        }
        let events = watcher(api, managed.clone())
            .default_backoff()
            .modify(|o: &mut DynamicObject| o.metadata.managed_fields = None)
            .reflect(writer)
            .map(|e| e.map(|_| ()))
            .boxed();
        streams.push(events);
        kueue.insert(kind, store);
    }
    Ok((
        Caches {
            nodes,
            slices,
            classes,
            budgets,
            kueue,
            kueue_config_map,
            all_cluster_queues,
            device_taint_rules,
        },
        stream::select_all(streams).boxed(),
    ))
}

impl Caches {
    pub(super) async fn wait_until_ready(&self) {
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.classes.wait_until_ready().await;
        let _ = self.budgets.wait_until_ready().await;
        if let Some(s) = &self.slices {
            let _ = s.wait_until_ready().await;
        }
        for store in self.kueue.values() {
            let _ = store.wait_until_ready().await;
        }
        if let Some(store) = &self.kueue_config_map {
            // Not readable (no RBAC, no namespace) never syncs: the check then
            // reports it missing rather than holding the controller back.
            let _ =
                tokio::time::timeout(std::time::Duration::from_secs(10), store.wait_until_ready())
                    .await;
        }
    }

    pub(super) fn live_objects(&self) -> BTreeMap<ObjectRef, Value> {
        let mut live = BTreeMap::new();
        for (kind, store) in &self.kueue {
            for obj in store.state() {
                let value = serde_json::to_value(obj.as_ref()).expect("objects serialise");
                live.insert(
                    ObjectRef {
                        kind: *kind,
                        namespace: obj.metadata.namespace.clone(),
                        name: obj.name_any(),
                    },
                    value,
                );
            }
        }
        live
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_node_keeps_what_the_inventory_reads_and_drops_its_images() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]},
            "status": {
                "allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                "conditions": [{"type": "Ready", "status": "True"}],
                "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
                "volumesInUse": ["kubernetes.io/csi/x"],
                "volumesAttached": [{"name": "kubernetes.io/csi/x", "devicePath": ""}]
            }
        }))
        .unwrap();
        let kept = node.clone();
        slim_node(&mut node);
        let status = node.status.as_ref().unwrap();
        assert!(status.images.is_none() && status.volumes_in_use.is_none());
        assert!(status.volumes_attached.is_none());
        let before = kept.status.as_ref().unwrap();
        assert_eq!(status.allocatable, before.allocatable);
        assert_eq!(status.capacity, before.capacity);
        assert_eq!(status.conditions, before.conditions);
        assert_eq!(node.metadata, kept.metadata);
        assert_eq!(node.spec, kept.spec);
    }

    #[test]
    fn a_cached_node_drops_the_kubelet_config_source_and_a_bare_node_is_left_alone() {
        let mut node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "gpu-1"},
            "status": {"config": {"error": "kubelet config checkpoint is invalid"}}
        }))
        .unwrap();
        slim_node(&mut node);
        assert!(node.status.as_ref().unwrap().config.is_none());
        let mut bare = Node::default();
        slim_node(&mut bare);
        assert_eq!(bare, Node::default());
    }
}
