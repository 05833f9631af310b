//! The watch caches a reconcile reads, and the event stream that marks the world dirty.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Node};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, DynamicObject, ListParams};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use super::diff::{Kind, ObjectRef};
use super::managed_cache::{ManagedCache, managed_cache};
use super::{Config, Error, managed_resource};
use crate::api::{AcceleratorClass, CreditBudget};
use crate::inventory::Inventory;
use crate::inventory::index::NodeIndex;
use crate::k8s::instance;

/// The watch caches the reconcile reads.
#[derive(Clone)]
pub(super) struct Caches {
    pub(super) nodes: NodeCache,
    pub(super) slices: Option<Store<ResourceSlice>>,
    pub(super) classes: Store<AcceleratorClass>,
    pub(super) budgets: Store<CreditBudget>,
    pub(super) kueue: BTreeMap<Kind, ManagedCache>,
    /// Kueue's configuration ConfigMap (`kueue.configMap`).
    pub(super) kueue_config_map: Option<Store<ConfigMap>>,
    /// Every ClusterQueue, kept as its labels and covered resources only: the
    /// ones kaccel does not own are checked against Kueue's transformations.
    pub(super) all_cluster_queues: Store<DynamicObject>,
    /// DeviceTaintRules are served and watched: kaccel may take single DRA devices out.
    pub(super) device_taint_rules: bool,
}

pub(super) type Events = BoxStream<'static, Result<(), watcher::Error>>;

/// Wake-ups for the reconcile loop, after [`driven`] read the events (and logged
/// their errors).
pub(super) type WakeUps = BoxStream<'static, ()>;

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
    watch_waking_on(api, config, slim, None)
}

/// A watch cache (as [`watch_slimmed`]) whose events wake the planner only when
/// `relevant` of an object changed, it was deleted, or a re-list finished (every
/// event wakes it when `relevant` is None: kinds whose spec changes do not move
/// their generation, as a ConfigMap's data). The
/// store still holds every update: a status write, a kubelet's heartbeat or an
/// admission counted in a ClusterQueue's status is kept without a re-plan
/// (each costs a full one otherwise, several a second on a busy fleet).
fn watch_waking_on<K>(
    api: Api<K>,
    config: watcher::Config,
    slim: impl Fn(&mut K) + Send + Sync + 'static,
    relevant: Option<fn(&K) -> u64>,
) -> (Store<K>, Events)
where
    K: Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone + Send + Sync,
{
    let (store, writer) = reflector::store();
    let mut seen = WakeFilter::default();
    let events = watcher(api, config)
        .backoff(WatchBackoff::default())
        .modify(move |o: &mut K| {
            o.meta_mut().managed_fields = None;
            slim(o);
        })
        .reflect(writer)
        .filter_map(move |event| {
            let wake = match (&event, relevant) {
                (Ok(e), Some(relevant)) => seen.wakes(e, relevant),
                _ => true,
            };
            std::future::ready(wake.then(|| event.map(|_| ())))
        })
        .boxed();
    (store, events)
}

/// What the planner read of each object when it last woke for it, hashed, by
/// namespace/name. An object first seen in a re-list is not hashed (the re-list's
/// end wakes the planner for all of them); its first update then always wakes.
#[derive(Default)]
struct WakeFilter {
    seen: std::collections::HashMap<String, u64>,
}

impl WakeFilter {
    fn wakes<K: Resource>(&mut self, event: &watcher::Event<K>, relevant: fn(&K) -> u64) -> bool {
        let key = |o: &K| {
            let meta = o.meta();
            format!(
                "{}/{}",
                meta.namespace.as_deref().unwrap_or_default(),
                meta.name.as_deref().unwrap_or_default()
            )
        };
        match event {
            watcher::Event::Apply(o) => {
                let hash = relevant(o);
                self.seen.insert(key(o), hash) != Some(hash)
            }
            watcher::Event::Delete(o) => {
                self.seen.remove(&key(o));
                true
            }
            watcher::Event::Init => {
                // Objects gone while the watch was down get no Delete event.
                self.seen.clear();
                false
            }
            watcher::Event::InitApply(_) => false,
            watcher::Event::InitDone => true,
        }
    }
}

/// kaccel's own writes, by object, so the watch events that carry them back wake
/// nothing: waking on its own write cost a whole re-plan that found everything
/// in sync, and a change arriving meanwhile waited for that re-plan. A write is
/// marked before it is sent: the watch often delivers its echo before the API
/// server's answer reaches the apply (with the watches read on a task of their
/// own, the fleet bench's changes took 1.84 re-plans each instead of 1, the
/// second finding nothing to do). Events seen while a write is in flight are
/// held until its answer: the echo is dropped, anything else wakes the planner
/// after the reconcile ([`OwnWrites::take_missed`]): one re-plan too many, never
/// one too few.
#[derive(Clone, Default)]
pub(super) struct OwnWrites(Arc<Mutex<OwnWritesState>>);

#[derive(Default)]
struct OwnWritesState {
    by_object: std::collections::HashMap<ObjectRef, Own>,
    /// An event held while a write was in flight was not its echo.
    missed: bool,
}

enum Own {
    /// Sent, not answered: the resourceVersions of the waking events seen since.
    InFlight(Vec<String>),
    /// Answered with this resourceVersion; its echo not seen yet.
    Written(String),
}

impl OwnWrites {
    /// kaccel is about to write `target`.
    pub(super) fn begin(&self, target: &ObjectRef) {
        let mut state = self.0.lock().expect("own writes lock");
        state
            .by_object
            .insert(target.clone(), Own::InFlight(Vec::new()));
    }

    /// kaccel wrote `target`; the API server answered with `resource_version`
    /// (None: the write failed, or its answer carried none).
    pub(super) fn record(&self, target: &ObjectRef, resource_version: Option<&str>) {
        let mut state = self.0.lock().expect("own writes lock");
        let held = match state.by_object.remove(target) {
            Some(Own::InFlight(held)) => held,
            _ => Vec::new(),
        };
        let echo_seen = match resource_version {
            Some(ours) => held.iter().any(|seen| seen == ours),
            None => false,
        };
        if held
            .iter()
            .any(|seen| Some(seen.as_str()) != resource_version)
        {
            state.missed = true;
        }
        if let (Some(ours), false) = (resource_version, echo_seen) {
            state
                .by_object
                .insert(target.clone(), Own::Written(ours.to_string()));
        }
    }

    /// Whether an event held while a write was in flight turned out to be
    /// someone else's (then the planner must look again); cleared.
    pub(super) fn take_missed(&self) -> bool {
        std::mem::take(&mut self.0.lock().expect("own writes lock").missed)
    }

    /// Whether `object`, as the watch shows it, wakes the planner, given that the
    /// wake filter found it `moved`: not the echo of kaccel's last write of it
    /// (then forgotten: the next event of it is someone else's), and not while a
    /// write of it is in flight (held until the answer says whose it was).
    fn wakes(&self, kind: Kind, object: &DynamicObject, moved: bool) -> bool {
        let target = Self::target(kind, object);
        let seen = object.metadata.resource_version.as_deref();
        let mut state = self.0.lock().expect("own writes lock");
        match state.by_object.get_mut(&target) {
            Some(Own::InFlight(held)) => {
                if moved {
                    held.push(seen.unwrap_or_default().to_string());
                }
                false
            }
            Some(Own::Written(ours)) if Some(ours.as_str()) == seen => {
                state.by_object.remove(&target);
                false
            }
            _ => moved,
        }
    }

    /// The object is gone: a version recorded for it (an echo that never came)
    /// would otherwise stay for as long as kaccel runs.
    fn forget(&self, kind: Kind, object: &DynamicObject) {
        let target = Self::target(kind, object);
        let mut state = self.0.lock().expect("own writes lock");
        if let Some(Own::Written(_)) = state.by_object.get(&target) {
            state.by_object.remove(&target);
        }
    }

    fn target(kind: Kind, object: &DynamicObject) -> ObjectRef {
        ObjectRef {
            kind,
            namespace: object.metadata.namespace.clone(),
            name: object.name_any(),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().expect("own writes lock").by_object.len()
    }
}

/// Spec changes (generation), labels and annotations: everything a reconcile
/// reads of a class, a budget or a managed Kueue object, but its status.
fn spec_and_metadata<K: Resource>(o: &K) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let meta = o.meta();
    let mut h = crate::k8s::names::FINGERPRINTS.build_hasher();
    meta.generation.hash(&mut h);
    meta.labels.hash(&mut h);
    meta.annotations.hash(&mut h);
    meta.deletion_timestamp.is_some().hash(&mut h);
    h.finish()
}

/// The Node watch's index (see [`NodeIndex`]): the inventory's reading of every
/// Node, no Node objects.
#[derive(Clone)]
pub(super) struct NodeCache {
    index: Arc<Mutex<NodeIndex>>,
    synced: tokio::sync::watch::Receiver<bool>,
}

impl NodeCache {
    /// The Nodes as of the last event, as the inventory reads them.
    pub(super) fn snapshot(&self) -> Arc<Inventory> {
        self.index.lock().expect("node index lock").snapshot()
    }

    /// Nodes parsed since start.
    pub(super) fn reads(&self) -> u64 {
        self.index.lock().expect("node index lock").reads()
    }

    async fn wait_until_ready(&self) {
        let mut synced = self.synced.clone();
        let _ = synced.wait_for(|s| *s).await;
    }
}

/// Nodes read into a [`NodeIndex`] as their events arrive; an update that changes
/// nothing the inventory reads (a kubelet's status heartbeat) wakes nothing.
fn watch_nodes(client: &Client) -> (NodeCache, Events) {
    let index = Arc::new(Mutex::new(NodeIndex::default()));
    let (synced_tx, synced) = tokio::sync::watch::channel(false);
    let cache = NodeCache {
        index: index.clone(),
        synced,
    };
    let events = watcher(Api::<Node>::all(client.clone()), Default::default())
        .backoff(WatchBackoff::default())
        .filter_map(move |event| {
            let wake = match &event {
                Ok(e) => {
                    let changed = apply_node_event(&mut index.lock().expect("node index lock"), e);
                    if matches!(e, watcher::Event::InitDone) {
                        let _ = synced_tx.send(true);
                    }
                    changed
                }
                Err(_) => true,
            };
            std::future::ready(wake.then(|| event.map(|_| ())))
        })
        .boxed();
    (cache, events)
}

/// One Node watch event into `index` (this cluster's or a MultiKueue worker's);
/// true when what the inventory reads changed (a re-list's end always is).
pub(super) fn apply_node_event(index: &mut NodeIndex, event: &watcher::Event<Node>) -> bool {
    match event {
        watcher::Event::Init => {
            index.begin_relist();
            false
        }
        watcher::Event::InitApply(node) => {
            index.relisted(node);
            false
        }
        watcher::Event::InitDone => {
            index.end_relist();
            true
        }
        watcher::Event::Apply(node) => index.upsert(node),
        watcher::Event::Delete(node) => index.remove(&node.name_any()),
    }
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

/// Every ClusterQueue, slimmed to its labels and `spec.resourceGroups[].coveredResources`
/// (Kueue rewrites a queue's status on every admission: none of it is kept), and
/// an event only when a queue's covered resources change.
fn watch_covered_resources(client: &Client) -> (Store<DynamicObject>, Events) {
    let ar = crate::k8s::resources::kueue(Kind::ClusterQueue.as_str());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let writer = reflector::store::Writer::new(ar);
    let store = writer.as_reader();
    let events = watcher(api, watcher::Config::default())
        .backoff(WatchBackoff::default())
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
    own_writes: &OwnWrites,
) -> Result<(Caches, Events), Error> {
    let managed = watcher::Config::default().labels(&instance::managed_selector(&config.instance));
    let (nodes, nodes_events) = watch_nodes(client);
    // kaccel's own status writes come back as events: only spec and metadata wake.
    let (classes, class_events) = watch_waking_on(
        Api::<AcceleratorClass>::all(client.clone()),
        Default::default(),
        |_| {},
        Some(spec_and_metadata),
    );
    let (budgets, budget_events) = watch_waking_on(
        Api::<CreditBudget>::all(client.clone()),
        Default::default(),
        |_| {},
        Some(spec_and_metadata),
    );
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
        let (store, mut writer) = managed_cache();
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
            writer.apply(&watcher::Event::Init);
            writer.apply(&watcher::Event::InitDone);
            kueue.insert(kind, store);
            continue;
        }
        // Kueue writes a ClusterQueue's status at each admission: only spec and
        // metadata changes wake the planner (the ledger reads the status from
        // the store), and kaccel's own writes coming back do not.
        let mut seen = WakeFilter::default();
        let own_writes = own_writes.clone();
        let events = watcher(api, managed.clone())
            .backoff(WatchBackoff::default())
            .modify(move |o: &mut DynamicObject| slim_managed(kind, o))
            .inspect_ok(move |event| writer.apply(event))
            .filter_map(move |event| {
                let wake = match &event {
                    Ok(e) => managed_object_wakes(&mut seen, &own_writes, kind, e),
                    Err(_) => true,
                };
                std::future::ready(wake.then(|| event.map(|_| ())))
            })
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

/// Polls `events` (the watches' and the health pollers') on a task of its own
/// and hands on their wake-ups, at most one pending. A reflector fills its store
/// only while its stream is polled: read by the reconcile loop alone, without
/// leader election, kaccel's caches stood still while a reconcile awaited its
/// writes (its start-up at 5,000 Nodes created each of 1,600 LocalQueues up to
/// 15 times, re-planning on caches that had not yet seen its own creates). One
/// pending wake-up says as much as many: the loop reads the caches, not the
/// events, and a standby replica, which reads none, holds one, not a queue of
/// every event since it started.
pub(super) fn driven(mut events: Events) -> WakeUps {
    use tokio::sync::mpsc::error::TrySendError;
    let (wake, mut woken) = tokio::sync::mpsc::channel::<()>(1);
    tokio::spawn(async move {
        while let Some(event) = events.next().await {
            match event {
                Ok(()) => match wake.try_send(()) {
                    Ok(()) | Err(TrySendError::Full(())) => {}
                    Err(TrySendError::Closed(())) => return,
                },
                Err(err) => tracing::warn!(error = %err, "watch error (retrying)"),
            }
        }
    });
    stream::poll_fn(move |cx| woken.poll_recv(cx)).boxed()
}

/// Keeps what kaccel reads of a managed object: its spec and metadata (the diff)
/// and, of a ClusterQueue's status, the reservations (the ledger's drift check
/// and the placement note). The rest of the status, which Kueue rewrites at each
/// admission (a LocalQueue's lists every flavor with its node labels), was most
/// of kaccel's memory at fleet scale: 67 MiB for 2,600 objects at 5,000 Nodes.
fn slim_managed(kind: Kind, o: &mut DynamicObject) {
    o.metadata.managed_fields = None;
    let Some(fields) = o.data.as_object_mut() else {
        return;
    };
    let Some(mut status) = fields.remove("status") else {
        return;
    };
    if kind == Kind::ClusterQueue
        && let Some(reserved) = status.get_mut("flavorsReservation").map(Value::take)
    {
        fields.insert(
            "status".into(),
            serde_json::json!({ "flavorsReservation": reserved }),
        );
    }
}

/// A managed object's event wakes the planner when its spec or metadata moved
/// and it is not kaccel's own write coming back.
fn managed_object_wakes(
    seen: &mut WakeFilter,
    own_writes: &OwnWrites,
    kind: Kind,
    event: &watcher::Event<DynamicObject>,
) -> bool {
    // The filter sees every event first: it must know the echo's hash, or the
    // next status write of the object would look like a change.
    let moved = seen.wakes(event, spec_and_metadata);
    match event {
        watcher::Event::Apply(object) => own_writes.wakes(kind, object, moved),
        watcher::Event::Delete(object) => {
            own_writes.forget(kind, object);
            moved
        }
        _ => moved,
    }
}

impl Caches {
    pub(super) async fn wait_until_ready(&self) {
        self.nodes.wait_until_ready().await;
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

    /// The managed objects as JSON, with their [`super::diff::live_fingerprint`]s, but
    /// those `skip` says are known in sync at their fingerprint (turning 2,600
    /// queues with their status into JSON at every re-plan was most of its cost
    /// at fleet scale).
    pub(super) fn live_objects(
        &self,
        mut skip: impl FnMut(&ObjectRef, u64) -> bool,
    ) -> (BTreeMap<ObjectRef, Value>, BTreeMap<ObjectRef, u64>) {
        let mut live = BTreeMap::new();
        let mut fingerprints = BTreeMap::new();
        for (kind, store) in &self.kueue {
            for obj in store.state() {
                let target = ObjectRef {
                    kind: *kind,
                    namespace: obj.namespace.clone(),
                    name: obj.name.clone(),
                };
                if skip(&target, obj.fingerprint) {
                    continue;
                }
                fingerprints.insert(target.clone(), obj.fingerprint);
                live.insert(target, obj.value());
            }
        }
        (live, fingerprints)
    }
}

/// How kaccel's watches retry after an error (the API server restarting, a
/// broken connection): 200 ms doubling to at most 1 s, plus up to 20% jitter,
/// back to 200 ms after each event received. kube's default (client-go's: 0.8 s
/// doubling to 30 s, each step up to twice that with jitter) left kaccel blind for
/// 5 to 11 s after a 3.5 s API server restart, long enough for a Workload to be
/// evicted and re-admitted unseen (the ledger then charges to the re-admission,
/// a second late). A watch is one cheap request: ten of them retrying once a
/// second while the API server is down costs it nothing.
pub(crate) struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    pub(crate) const FIRST: Duration = Duration::from_millis(200);
    pub(crate) const MOST: Duration = Duration::from_secs(1);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::FIRST }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let delay = self.next;
        self.next = (delay * 2).min(Self::MOST);
        // Jitter from the clock's nanoseconds: replicas retrying together spread out.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        Some(delay + delay.mul_f64(f64::from(nanos % 1000) / 5000.0))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::FIRST;
    }
}

#[cfg(test)]
mod tests {
    /// The watches are read while nobody reads the wake-ups (a reconcile
    /// awaiting its writes, a standby replica), and those wait as one.
    #[tokio::test]
    async fn watches_are_read_while_nobody_reads_the_wake_ups() {
        use futures::{FutureExt, StreamExt};
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
        // Each event read stands for a reflector writing its store.
        let read = std::sync::Arc::new(AtomicUsize::new(0));
        let counted = read.clone();
        let events: super::Events = super::super::run::receiver_stream(events_rx)
            .inspect(move |()| {
                counted.fetch_add(1, Ordering::SeqCst);
            })
            .map(Ok)
            .boxed();
        let mut wake_ups = super::driven(events);
        for _ in 0..5 {
            events_tx.send(()).unwrap();
        }
        tokio::time::timeout(std::time::Duration::from_secs(5), async {
            while read.load(Ordering::SeqCst) < 5 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the five events are read without the wake-ups being read");
        assert_eq!(wake_ups.next().await, Some(()));
        assert!(
            wake_ups.next().now_or_never().is_none(),
            "five events left one wake-up, not five"
        );
        events_tx.send(()).unwrap();
        assert_eq!(wake_ups.next().await, Some(()));
        drop(events_tx);
        assert!(wake_ups.next().await.is_none(), "ends with the watches");
    }

    #[test]
    fn watch_retries_start_at_200_ms_double_to_1_s_and_start_over_after_an_event() {
        use kube::runtime::utils::Backoff;
        let mut backoff = super::WatchBackoff::default();
        let delays: Vec<std::time::Duration> = (0..5).map(|_| backoff.next().unwrap()).collect();
        for (delay, base_ms) in delays.iter().zip([200, 400, 800, 1000, 1000]) {
            let base = std::time::Duration::from_millis(base_ms);
            assert!(*delay >= base && *delay <= base.mul_f64(1.2), "{delays:?}");
        }
        backoff.reset();
        assert!(backoff.next().unwrap() < std::time::Duration::from_millis(241));
    }

    use super::*;

    #[test]
    fn a_status_write_wakes_nothing_a_spec_change_does() {
        let mut filter = WakeFilter::default();
        let queue = |generation: i64, admitted: u64| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                "metadata": {"name": "team-a-h100", "generation": generation},
                "status": {"admittedWorkloads": admitted},
            }))
            .unwrap()
        };
        let relevant = spec_and_metadata as fn(&DynamicObject) -> u64;
        assert!(filter.wakes(&watcher::Event::Apply(queue(1, 0)), relevant));
        assert!(!filter.wakes(&watcher::Event::Apply(queue(1, 5)), relevant));
        assert!(filter.wakes(&watcher::Event::Apply(queue(2, 5)), relevant));
    }

    #[test]
    fn managed_objects_keep_spec_metadata_and_a_cluster_queues_reservations_only() {
        let object = |kind: &str| -> DynamicObject {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": kind,
                "metadata": {"name": "h100", "labels": {"a": "b"},
                    "managedFields": [{"manager": "kaccel"}]},
                "spec": {"resourceGroups": []},
                "status": {
                    "flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "3"}]}],
                    "flavors": [{"name": "h100", "nodeLabels": {"nvidia.com/gpu.product": "H100"}}],
                    "conditions": [{"type": "Active", "status": "True"}],
                    "admittedWorkloads": 3,
                },
            }))
            .unwrap()
        };
        let mut queue = object("ClusterQueue");
        slim_managed(Kind::ClusterQueue, &mut queue);
        assert_eq!(queue.metadata.managed_fields, None);
        assert_eq!(queue.metadata.labels.as_ref().unwrap()["a"], "b");
        assert_eq!(
            queue.data["spec"],
            serde_json::json!({"resourceGroups": []})
        );
        assert_eq!(
            queue.data["status"],
            serde_json::json!({"flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "3"}]}]})
        );
        let mut local = object("LocalQueue");
        slim_managed(Kind::LocalQueue, &mut local);
        assert!(local.data.get("status").is_none(), "{:?}", local.data);
        assert_eq!(
            local.data["spec"],
            serde_json::json!({"resourceGroups": []})
        );
        // A queue Kueue has not reserved anything in yet keeps no status at all.
        let mut fresh = object("ClusterQueue");
        fresh.data["status"] = serde_json::json!({"conditions": []});
        slim_managed(Kind::ClusterQueue, &mut fresh);
        assert!(fresh.data.get("status").is_none());
    }

    fn cluster_queue(generation: i64, version: &str) -> DynamicObject {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "team-a-h100", "generation": generation, "resourceVersion": version},
        }))
        .unwrap()
    }

    fn target() -> ObjectRef {
        ObjectRef {
            kind: Kind::ClusterQueue,
            namespace: None,
            name: "team-a-h100".into(),
        }
    }

    #[test]
    fn kaccels_own_write_coming_back_wakes_nothing_anyone_elses_does() {
        let mut seen = WakeFilter::default();
        let own = OwnWrites::default();
        let wakes = |seen: &mut WakeFilter, q: DynamicObject| {
            managed_object_wakes(seen, &own, Kind::ClusterQueue, &watcher::Event::Apply(q))
        };
        assert!(wakes(&mut seen, cluster_queue(1, "10")), "first sight");
        // kaccel applied generation 2 and the API server answered with version 11.
        own.record(&target(), Some("11"));
        assert!(!wakes(&mut seen, cluster_queue(2, "11")), "the echo");
        // Kueue's status write after it: same generation, no wake either.
        assert!(!wakes(&mut seen, cluster_queue(2, "12")));
        // Someone edits the spec: news, even at a version kaccel once wrote.
        assert!(wakes(&mut seen, cluster_queue(3, "13")));
        // The echo is forgotten once seen: the same version again is not kaccel's.
        own.record(&target(), Some("14"));
        assert!(!wakes(&mut seen, cluster_queue(4, "14")));
        assert!(wakes(&mut seen, cluster_queue(5, "14")));
    }

    #[test]
    fn an_echo_seen_before_the_write_returned_wakes_nothing_a_change_meanwhile_does() {
        let mut seen = WakeFilter::default();
        let own = OwnWrites::default();
        let wakes = |seen: &mut WakeFilter, q: DynamicObject| {
            managed_object_wakes(seen, &own, Kind::ClusterQueue, &watcher::Event::Apply(q))
        };
        assert!(wakes(&mut seen, cluster_queue(1, "10")));
        // The watch delivers version 11 before the apply's answer comes back.
        own.begin(&target());
        assert!(!wakes(&mut seen, cluster_queue(2, "11")), "held");
        own.record(&target(), Some("11"));
        assert!(!own.take_missed(), "it was the echo");
        assert_eq!(own.len(), 0, "and is not waited for again");
        // Someone else's write after it is not mistaken for the echo.
        assert!(wakes(&mut seen, cluster_queue(3, "12")));

        // Someone else's spec change while kaccel's write is in flight: held,
        // then news once the answer names another version.
        own.begin(&target());
        assert!(!wakes(&mut seen, cluster_queue(4, "13")));
        own.record(&target(), Some("14"));
        assert!(own.take_missed());
        assert!(!own.take_missed(), "cleared once taken");
        // kaccel's own echo, after its answer, is still its own.
        assert!(!wakes(&mut seen, cluster_queue(5, "14")));

        // A status write held in flight is no news (it would not have woken).
        own.begin(&target());
        assert!(!wakes(&mut seen, cluster_queue(5, "15")));
        own.record(&target(), Some("16"));
        assert!(!own.take_missed());
        assert!(!wakes(&mut seen, cluster_queue(6, "16")));

        // A write that failed: whatever came meanwhile was someone else's.
        own.begin(&target());
        assert!(!wakes(&mut seen, cluster_queue(7, "17")));
        own.record(&target(), None);
        assert!(own.take_missed());
        assert_eq!(own.len(), 0);
    }

    #[test]
    fn an_unanswered_echo_goes_with_its_object() {
        let mut seen = WakeFilter::default();
        let own = OwnWrites::default();
        own.record(&target(), Some("11"));
        assert_eq!(own.len(), 1);
        assert!(managed_object_wakes(
            &mut seen,
            &own,
            Kind::ClusterQueue,
            &watcher::Event::Delete(cluster_queue(3, "13"))
        ));
        assert_eq!(own.len(), 0);
        // Another kind of the same name is another object.
        own.record(&target(), Some("20"));
        assert!(managed_object_wakes(
            &mut WakeFilter::default(),
            &own,
            Kind::LocalQueue,
            &watcher::Event::Apply(cluster_queue(1, "20"))
        ));
    }
}
