//! `kaccel run`: the thin I/O shell around the planner.
//!
//! Watches feed in-memory caches (reflectors). Any event marks the world dirty; after
//! a short quiet period (debounce) one reconcile runs, in named stages:
//! observe (snapshot the caches) -> plan (pure) -> diff (pure) -> apply (server-side
//! apply / delete, only what differs) -> status (only what differs) -> events.
//! Only the replica holding the leader Lease reconciles.

mod allocator;
pub mod config;
mod credits;
pub mod diff;
mod health_poller;
mod http;
mod metrics;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::stream::{self, BoxStream, StreamExt};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::resource::v1::ResourceSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::api::{
    AcceleratorClass, AcceleratorClassStatus, CreditBudget, CreditBudgetStatus, merge_conditions,
};
use crate::health::policy::apply_node_conditions;
use crate::inventory::Inventory;
use crate::plan::nodes::{NodeAction, UNHEALTHY_TAINT, node_actions};
use crate::plan::{MANAGED_BY, MANAGED_BY_LABEL, Plan, PlanInput, plan};
pub use config::Config;
use diff::{Action, Kind, ObjectRef, desired_objects, is_managed};
use metrics::{ClassHealthLabels, KindLabel, Metrics, ReasonLabel};

/// Failures a platform engineer can act on; `metric_label` names each in metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error during {action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot reach the cluster: {0}")]
    Connect(String),
    #[error("leader election failed: {0}")]
    LeaderElection(String),
    #[error("HTTP server on {address} failed: {source}")]
    Http {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "{target} already exists and is not kaccel's ({holder}): kaccel will not change an object it did not create; rename or delete it"
    )]
    Unmanaged { target: String, holder: String },
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Connect(_) => "connect",
            Error::LeaderElection(_) => "leader_election",
            Error::Http { .. } => "http",
            Error::Unmanaged { .. } => "unmanaged_conflict",
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

fn kueue_resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        crate::kueue::GROUP,
        crate::kueue::VERSION,
        kind.as_str(),
    ))
}

/// The watch caches the reconcile reads.
#[derive(Clone)]
struct Caches {
    nodes: Store<Node>,
    slices: Option<Store<ResourceSlice>>,
    classes: Store<AcceleratorClass>,
    budgets: Store<CreditBudget>,
    kueue: BTreeMap<Kind, Store<DynamicObject>>,
}

type Events = BoxStream<'static, Result<(), watcher::Error>>;

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

async fn start_watches(client: &Client, config: &Config) -> Result<(Caches, Events), Error> {
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

    let mut kueue = BTreeMap::new();
    for kind in Kind::ALL {
        let ar = kueue_resource(kind);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let writer = reflector::store::Writer::new(ar.clone());
        let store = writer.as_reader();
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
        },
        stream::select_all(streams).boxed(),
    ))
}

impl Caches {
    async fn wait_until_ready(&self) {
        let _ = self.nodes.wait_until_ready().await;
        let _ = self.classes.wait_until_ready().await;
        let _ = self.budgets.wait_until_ready().await;
        if let Some(s) = &self.slices {
            let _ = s.wait_until_ready().await;
        }
        for store in self.kueue.values() {
            let _ = store.wait_until_ready().await;
        }
    }

    fn live_objects(&self) -> BTreeMap<ObjectRef, Value> {
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

/// Everything one reconcile needs besides the caches.
struct Reconciler {
    client: Client,
    config: Config,
    metrics: Metrics,
    recorder: Recorder,
    health: health_poller::SharedTracker,
    /// Nodes held back by the share limit at the last reconcile.
    held_back: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Workloads kaccel evicted may be waiting to be requeued (checked at start too).
    requeue_pending: AtomicBool,
    /// Some budget names a namespace that does not exist (retried every few seconds).
    namespaces_missing: AtomicBool,
    /// A planned name is taken by an object kaccel does not own (not watched:
    /// retried every few seconds, so its removal is noticed).
    names_taken: AtomicBool,
    /// The credit ledger, when `ledger.enabled`.
    ledger: Option<LedgerParts>,
}

/// The ledger's tasks and what they share with the planner loop.
struct LedgerParts {
    shared: Arc<credits::LedgerShared>,
    runtime: Arc<credits::LedgerRuntime>,
}

/// Run the controller until SIGTERM / Ctrl-C.
pub async fn run(config: Config) -> Result<(), Error> {
    let client = Client::try_default()
        .await
        .map_err(|e| Error::Connect(e.to_string()))?;
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let ready = Arc::new(AtomicBool::new(false));
    let (shutdown_tx, shutdown_rx) = watch::channel(false);

    let tracker = health_poller::tracker(&config.health);
    let http_state = http::HttpState {
        registry: Arc::new(registry),
        ready: ready.clone(),
        tracker: tracker.clone(),
    };
    let address = config.http_address;
    let mut http_shutdown = shutdown_rx.clone();
    let http_task = tokio::spawn(async move {
        http::serve(address, http_state, async move {
            let _ = http_shutdown.wait_for(|s| *s).await;
        })
        .await
        .map_err(|source| Error::Http { address, source })
    });

    tokio::spawn(async move {
        shutdown_signal().await;
        tracing::info!("shutting down");
        let _ = shutdown_tx.send(true);
    });

    tokio::spawn(allocator::trim_periodically(metrics.clone()));
    let (caches, watch_events) = start_watches(&client, &config).await?;
    // Health pollers wake the reconcile loop like a watch event does.
    let (wake_tx, wake_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let ledger = config.ledger.enabled.then(|| {
        let shared = Arc::new(credits::LedgerShared::default());
        LedgerParts {
            runtime: credits::LedgerRuntime::new(
                client.clone(),
                config.ledger.clone(),
                &config.field_manager,
                metrics.clone(),
                shared.clone(),
                wake_tx.clone(),
            ),
            shared,
        }
    });
    health_poller::spawn_pollers(
        &client,
        &config.health,
        tracker.clone(),
        metrics.clone(),
        wake_tx,
    );
    let health_events = tokio_stream_from(wake_rx);
    let events: Events = stream::select(watch_events, health_events).boxed();
    let identity = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "kaccel".into());
    let reconciler = Reconciler {
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: "kaccel".into(),
                instance: Some(identity.clone()),
            },
        ),
        client: client.clone(),
        config: config.clone(),
        metrics: metrics.clone(),
        health: tracker,
        held_back: Default::default(),
        requeue_pending: AtomicBool::new(config.health.actions.evict_workloads_on_failed),
        namespaces_missing: AtomicBool::new(false),
        names_taken: AtomicBool::new(false),
        ledger,
    };

    let result = if config.leader_election.enabled {
        lead_then_reconcile(
            &client,
            &config,
            &identity,
            reconciler,
            caches,
            events,
            ready,
            shutdown_rx.clone(),
        )
        .await
    } else {
        metrics.leader.set(1);
        reconcile_loop(reconciler, caches, events, ready, shutdown_rx.clone(), None).await
    };
    // Stop the HTTP server too, whatever ended the loop.
    http_task.abort();
    result
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler installs");
        tokio::select! {
            _ = ctrl_c => {},
            _ = term.recv() => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[allow(clippy::too_many_arguments)]
async fn lead_then_reconcile(
    client: &Client,
    config: &Config,
    identity: &str,
    reconciler: Reconciler,
    caches: Caches,
    events: Events,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) -> Result<(), Error> {
    let le = &config.leader_election;
    let namespace = std::env::var("POD_NAMESPACE").unwrap_or_else(|_| le.lease_namespace.clone());
    let manager = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &le.lease_name)
        .with_namespace(&namespace)
        .with_identity(identity)
        .with_duration(le.lease_duration_seconds)
        .with_grace(le.renew_grace_seconds)
        // Each replica needs its own field manager: kube-lease-manager relies on
        // server-side apply conflicts between managers to keep a single holder.
        .with_field_manager(format!("{}-lease-{identity}", config.field_manager))
        .build()
        .await
        .map_err(|e| Error::LeaderElection(e.to_string()))?;
    let (mut is_leader, lease_task) = manager.watch().await;
    tracing::info!(lease = %le.lease_name, %namespace, %identity, "waiting for leadership");
    // Caches fill while waiting, so a new leader acts at once.
    let cache_ready = ready.clone();
    let caches_for_ready = caches.clone();
    tokio::spawn(async move {
        caches_for_ready.wait_until_ready().await;
        cache_ready.store(true, Ordering::Relaxed);
    });
    // The watch streams must be polled to fill the caches even while following.
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let mut events = events;
    tokio::spawn(async move {
        while let Some(e) = events.next().await {
            match e {
                Ok(()) => {
                    if events_tx.send(()).is_err() {
                        break;
                    }
                }
                Err(err) => tracing::warn!(error = %err, "watch error (retrying)"),
            }
        }
    });
    loop {
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => {
                drop(is_leader);
                // Dropping the channel makes the lease task release the Lease.
                let _ = lease_task.await;
                return Ok(());
            }
            changed = is_leader.changed() => {
                if changed.is_err() {
                    return Err(Error::LeaderElection("lease task ended".into()));
                }
                if *is_leader.borrow_and_update() {
                    break;
                }
            }
        }
    }
    tracing::info!(%identity, "became leader");
    reconciler.metrics.leader.set(1);
    let events = tokio_stream_from(events_rx);
    let lost = async move {
        let _ = is_leader.wait_for(|l| !*l).await;
    };
    let result = reconcile_loop(
        reconciler,
        caches,
        events,
        ready,
        shutdown.clone(),
        Some(Box::pin(lost)),
    )
    .await;
    // Returning drops the channel: the lease task releases the Lease for a fast handover.
    let _ = lease_task.await;
    result
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The wake-ups sent on `rx`, as a stream.
fn receiver_stream(
    mut rx: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> impl futures::Stream<Item = ()> + Send + 'static {
    stream::poll_fn(move |cx| rx.poll_recv(cx))
}

/// The wake-ups sent on `rx`, as reconcile events.
fn tokio_stream_from(rx: tokio::sync::mpsc::UnboundedReceiver<()>) -> Events {
    receiver_stream(rx).map(Ok).boxed()
}

async fn reconcile_loop(
    reconciler: Reconciler,
    caches: Caches,
    mut events: Events,
    ready: Arc<AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
    mut lost_leadership: Option<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>,
) -> Result<(), Error> {
    // Poll events while the caches sync (they fill from these streams).
    let sync = caches.wait_until_ready();
    tokio::pin!(sync);
    loop {
        tokio::select! {
            _ = &mut sync => break,
            e = events.next() => if let Some(Err(err)) = e { tracing::warn!(error = %err, "watch error (retrying)") },
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
        }
    }
    ready.store(true, Ordering::Relaxed);
    tracing::info!("caches synced");
    // The ledger's tasks run while this loop does (the leader's), and stop with it.
    let _ledger_task = reconciler.ledger.as_ref().map(|l| {
        let cluster_queues = caches.kueue[&Kind::ClusterQueue].clone();
        AbortOnDrop(tokio::spawn(l.runtime.clone().run(cluster_queues)))
    });

    let debounce = reconciler.config.debounce();
    let max_delay = reconciler.config.max_delay();
    let mut dirty_since: Option<Instant> = Some(Instant::now());
    let mut last_event = Instant::now();
    let mut resync = tokio::time::interval(reconciler.config.resync());
    resync.tick().await;
    loop {
        let deadline = dirty_since.map(|first| (last_event + debounce).min(first + max_delay));
        let sleep = async {
            match deadline {
                Some(d) => tokio::time::sleep_until(d.into()).await,
                None => std::future::pending().await,
            }
        };
        let lost = async {
            match lost_leadership.as_mut() {
                Some(l) => l.await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = shutdown.wait_for(|s| *s) => return Ok(()),
            _ = lost => {
                tracing::warn!("lost leadership: stopping writes");
                reconciler.metrics.leader.set(0);
                return Err(Error::LeaderElection("lost the Lease".into()));
            }
            e = events.next() => match e {
                Some(Ok(())) => {
                    last_event = Instant::now();
                    dirty_since.get_or_insert(last_event);
                }
                Some(Err(err)) => tracing::warn!(error = %err, "watch error (retrying)"),
                None => return Err(Error::Connect("watch streams ended".into())),
            },
            _ = resync.tick() => { dirty_since.get_or_insert(Instant::now()); }
            _ = sleep => {
                dirty_since = None;
                let started = Instant::now();
                reconciler.metrics.reconciles.inc();
                if let Err(e) = reconciler.reconcile(&caches).await {
                    tracing::warn!(error = %e, "reconcile failed; retrying");
                    reconciler.metrics.reconcile_failures.get_or_create(&ReasonLabel { reason: e.metric_label().into() }).inc();
                    // Retry after a pause rather than spinning.
                    dirty_since = Some(Instant::now() + Duration::from_secs(1));
                    last_event = Instant::now() + Duration::from_secs(1);
                }
                reconciler.metrics.reconcile_duration.observe(started.elapsed().as_secs_f64());
                if dirty_since.is_none()
                    && (reconciler.namespaces_missing.load(Ordering::Relaxed)
                        || reconciler.names_taken.load(Ordering::Relaxed))
                {
                    // Namespaces and objects kaccel does not own are not watched:
                    // try again in a while.
                    dirty_since = Some(Instant::now() + Duration::from_secs(5));
                    last_event = Instant::now() + Duration::from_secs(5);
                }
                if dirty_since.is_none() && reconciler.requeue_pending.load(Ordering::Relaxed) {
                    // Kueue evicts asynchronously and Workloads are not watched: look again soon.
                    dirty_since = Some(Instant::now());
                    last_event = Instant::now() + Duration::from_millis(500);
                }
            }
        }
    }
}

impl Reconciler {
    /// observe -> plan -> diff -> apply -> status.
    async fn reconcile(&self, caches: &Caches) -> Result<(), Error> {
        // Observe.
        let classes: Vec<AcceleratorClass> = caches
            .classes
            .state()
            .iter()
            .map(|c| (**c).clone())
            .collect();
        let budgets: Vec<CreditBudget> = caches
            .budgets
            .state()
            .iter()
            .map(|b| (**b).clone())
            .collect();
        let nodes = caches.nodes.state();
        let slices = caches
            .slices
            .as_ref()
            .map(|s| s.state())
            .unwrap_or_default();
        let inventory = Inventory::from_nodes_and_slices(
            nodes.iter().map(|n| n.as_ref()),
            slices.iter().map(|s| s.as_ref()),
        );
        self.metrics
            .inventory_unclassified_devices
            .set(i64::try_from(inventory.unclassified_device_count()).unwrap_or(i64::MAX));
        let live = caches.live_objects();

        // Plan (pure).
        let mut options = self.config.plan_options();
        let ledger_views = self
            .ledger
            .as_ref()
            .map(|l| l.shared.budget_views())
            .unwrap_or_default();
        options.held_budgets = budgets
            .iter()
            .filter(|b| ledger_views.get(&b.name_any()).is_some_and(|v| v.exhausted))
            .map(|b| (b.name_any(), b.spec.on_exhaustion))
            .collect();
        let health = {
            let tracker = self.health.lock().expect("tracker lock");
            tracker.snapshot(&inventory, health_poller::now_seconds())
        };
        let mut health = health;
        apply_node_conditions(&mut health, &inventory, &self.config.health.node_conditions);
        let planned = plan(&PlanInput {
            classes: &classes,
            budgets: &budgets,
            inventory: &inventory,
            health: &health,
            options: &options,
        });

        if let Some(l) = &self.ledger {
            l.shared.set_pricing(credits::PricingSnapshot {
                ready: true,
                flavor_models: planned
                    .flavors
                    .iter()
                    .map(|(name, f)| (name.clone(), f.model.clone()))
                    .collect(),
                classes: classes
                    .iter()
                    .map(|c| (c.name_any(), (c.spec.clone(), c.metadata.generation)))
                    .collect(),
                queues: priced_queues(&planned, &budgets),
                budgets: budgets
                    .iter()
                    .map(|b| (b.name_any(), b.spec.clone()))
                    .collect(),
            });
        }

        // Diff (pure).
        let desired = desired_objects(&planned);
        let actions = diff::diff(&desired, &live);

        // Apply.
        let mut first_error = None;
        // A LocalQueue whose namespace does not exist yet is not an error to retry
        // at once: it becomes a condition on its budget, and is tried again later.
        let mut missing_namespaces: std::collections::BTreeMap<
            String,
            std::collections::BTreeSet<String>,
        > = Default::default();
        // Planned names held by objects kaccel does not own, and the planned objects
        // not written because they would use one of those.
        let mut taken: BTreeMap<ObjectRef, String> = BTreeMap::new();
        let mut held_up: Vec<(ObjectRef, ObjectRef)> = Vec::new();
        for action in &actions {
            if let Action::Apply { target, object, .. } | Action::Recreate { target, object } =
                action
                && let Some(used) = diff::references(target.kind, object)
                    .into_iter()
                    .find(|r| taken.contains_key(r))
            {
                held_up.push((target.clone(), used));
                continue;
            }
            match self.apply(action, &live).await {
                Ok(()) => {}
                Err(Error::Unmanaged { target, holder }) => {
                    tracing::warn!(%target, %holder, "planned name taken by an object kaccel does not own; left unchanged");
                    if let Action::Apply { target, .. } = action {
                        taken.insert(target.clone(), holder);
                    }
                }
                Err(Error::Api {
                    source: kube::Error::Api(status),
                    ..
                }) if status.code == 404 && is_local_queue(action) => {
                    if let Some((budget, ns)) = local_queue_budget(action) {
                        missing_namespaces.entry(budget).or_default().insert(ns);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "write failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        self.namespaces_missing
            .store(!missing_namespaces.is_empty(), Ordering::Relaxed);
        self.names_taken.store(!taken.is_empty(), Ordering::Relaxed);
        let name_conflicts = name_conflicts(&taken, &held_up, &desired, &planned);
        self.record_metrics(&planned, &desired);

        // Nodes: taint / cordon for health, within the share limit.
        let decided = node_actions(
            &inventory,
            &health,
            &planned.flavors,
            &self.config.health.actions,
        );
        self.metrics
            .node_actions_held_back
            .set(decided.held_back.len() as i64);
        for action in &decided.actions {
            if let Err(e) = self.apply_node(action).await {
                first_error.get_or_insert(e);
            }
        }
        // Held-back actions: an Event once per node when it starts being held back
        // (not on every reconcile: a persisting fault must not cost writes).
        let now_held: std::collections::BTreeSet<String> =
            decided.held_back.iter().map(|h| h.node.clone()).collect();
        let newly_held: Vec<_> = {
            let mut last = self.held_back.lock().expect("held-back lock");
            let newly = decided
                .held_back
                .iter()
                .filter(|h| !last.contains(&h.node))
                .cloned()
                .collect();
            *last = now_held;
            newly
        };
        for held in newly_held {
            tracing::warn!(node = %held.node, flavor = %held.flavor, allowed = held.allowed, reason = %held.reason, "node action held back by the share limit");
            let reference = ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(held.node.clone()),
                ..Default::default()
            };
            self.publish(
                &reference,
                EventType::Warning,
                "AutomationLimited",
                &format!(
                    "not taken out despite {}: flavor {} already has {} node(s) held out by kaccel (maxSharePercent)",
                    held.reason, held.flavor, held.allowed
                ),
            )
            .await;
        }

        // Workloads kaccel evicted go back to their queues once Kueue evicted them.
        if self.requeue_pending.load(Ordering::Relaxed) {
            let (requeued, waiting) = health_poller::requeue_evicted(&self.client)
                .await
                .map_err(api_err("requeueing evicted Workloads"))?;
            for w in &requeued {
                self.metrics.write("Workload", "requeue");
                tracing::info!(workload = %w, "requeued after eviction");
            }
            self.requeue_pending.store(waiting > 0, Ordering::Relaxed);
        }

        // Status.
        let limited: std::collections::BTreeMap<String, (u32, Vec<String>)> = decided
            .held_back
            .iter()
            .fold(Default::default(), |mut m, h| {
                let e = m.entry(h.flavor.clone()).or_insert((h.allowed, Vec::new()));
                e.1.push(h.node.clone());
                m
            });
        self.write_class_status(&classes, &planned, &limited, &name_conflicts.classes)
            .await?;
        self.write_budget_status(
            &budgets,
            &planned,
            &missing_namespaces,
            &ledger_views,
            &name_conflicts.budgets,
        )
        .await?;
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    async fn apply(&self, action: &Action, live: &BTreeMap<ObjectRef, Value>) -> Result<(), Error> {
        let ssa = PatchParams::apply(&self.config.field_manager).force();
        match action {
            Action::Apply {
                target,
                object,
                create,
            } => {
                let api = self.api_for(target);
                if *create
                    && let Some(existing) = api
                        .get_opt(&target.name)
                        .await
                        .map_err(api_err(format!("reading {target}")))?
                    && let existing = serde_json::to_value(&existing).unwrap_or_default()
                    && !is_managed(&existing)
                {
                    return Err(Error::Unmanaged {
                        target: target.to_string(),
                        holder: diff::holder_of(&existing),
                    });
                }
                let verb = if *create { "create" } else { "update" };
                api.patch(&target.name, &ssa, &Patch::Apply(object))
                    .await
                    .map_err(api_err(format!("applying {target}")))?;
                self.metrics.write(target.kind.as_str(), verb);
                tracing::info!(%target, verb, "applied");
                if target.kind == Kind::ResourceFlavor && *create {
                    self.event_for_flavor(target, "FlavorCreated", "created the ResourceFlavor")
                        .await;
                }
                if target.kind == Kind::ClusterQueue
                    && let Some(old) = live.get(target)
                    && device_quota(object) < device_quota(old)
                {
                    self.event_for_queue(
                        object,
                        EventType::Warning,
                        "QuotaReduced",
                        &format!(
                            "nominal device quota of {} lowered from {} to {} (healthy capacity or guarantees changed)",
                            target.name,
                            device_quota(old),
                            device_quota(object)
                        ),
                    )
                    .await;
                }
            }
            Action::Recreate { target, object } => {
                let api = self.api_for(target);
                api.delete(&target.name, &DeleteParams::default())
                    .await
                    .map_err(api_err(format!("deleting {target} to recreate it")))?;
                self.metrics.write(target.kind.as_str(), "delete");
                api.patch(&target.name, &ssa, &Patch::Apply(object))
                    .await
                    .map_err(api_err(format!("recreating {target}")))?;
                self.metrics.write(target.kind.as_str(), "create");
            }
            Action::Delete { target } => {
                let api = self.api_for(target);
                match api.delete(&target.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_err(format!("deleting {target}"))(e)),
                }
                self.metrics.write(target.kind.as_str(), "delete");
                tracing::info!(%target, "deleted (no longer planned)");
                if target.kind == Kind::ResourceFlavor {
                    self.event_for_flavor(
                        target,
                        "FlavorRemoved",
                        "removed the ResourceFlavor: no class uses it any more",
                    )
                    .await;
                }
            }
        }
        Ok(())
    }

    async fn apply_node(&self, action: &NodeAction) -> Result<(), Error> {
        let (verb, event_reason, type_, note) = match action {
            NodeAction::Taint { reason, .. } => (
                "taint",
                "KaccelTainted",
                EventType::Warning,
                format!("tainted {UNHEALTHY_TAINT}:NoSchedule: all accelerators out ({reason})"),
            ),
            NodeAction::Untaint { .. } => (
                "untaint",
                "KaccelUntainted",
                EventType::Normal,
                "removed kaccel's taint: accelerators healthy again".to_string(),
            ),
            NodeAction::Cordon { reason, .. } => (
                "cordon",
                "KaccelCordoned",
                EventType::Warning,
                format!("cordoned for a failed accelerator ({reason}); repair requested"),
            ),
            NodeAction::Uncordon { .. } => (
                "uncordon",
                "KaccelUncordoned",
                EventType::Normal,
                "uncordoned: the accelerators kaccel cordoned for are healthy again".to_string(),
            ),
        };
        health_poller::apply_node_action(&self.client, action)
            .await
            .map_err(api_err(format!("{verb} node {}", action.node())))?;
        if let NodeAction::Cordon { node, reason } = action
            && self.config.health.actions.evict_workloads_on_failed
        {
            let evicted = health_poller::evict_workloads_on(&self.client, node, reason)
                .await
                .map_err(api_err(format!("evicting Workloads from node {node}")))?;
            if !evicted.is_empty() {
                self.metrics.write("Workload", "evict");
                self.requeue_pending.store(true, Ordering::Relaxed);
                tracing::warn!(%node, workloads = ?evicted, "evicted Workloads from a node with a failed accelerator");
                let reference = ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                };
                self.publish(
                    &reference,
                    EventType::Warning,
                    "KaccelEvictedWorkloads",
                    &format!("evicted for requeue: {}", evicted.join(", ")),
                )
                .await;
            }
        }
        self.metrics.write("Node", verb);
        self.metrics
            .node_actions
            .get_or_create(&metrics::ActionLabel {
                action: verb.into(),
            })
            .inc();
        tracing::info!(node = %action.node(), verb, "node action");
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(action.node().to_string()),
            ..Default::default()
        };
        self.publish(&reference, type_, event_reason, &note).await;
        Ok(())
    }

    fn api_for(&self, target: &ObjectRef) -> Api<DynamicObject> {
        let ar = kueue_resource(target.kind);
        match &target.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }

    async fn event_for_flavor(&self, target: &ObjectRef, reason: &str, note: &str) {
        let reference = ObjectReference {
            api_version: Some(format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION)),
            kind: Some(target.kind.as_str().into()),
            name: Some(target.name.clone()),
            ..Default::default()
        };
        self.publish(&reference, EventType::Normal, reason, note)
            .await;
    }

    async fn event_for_queue(&self, object: &Value, type_: EventType, reason: &str, note: &str) {
        let reference = ObjectReference {
            api_version: Some(format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION)),
            kind: Some("ClusterQueue".into()),
            name: object["metadata"]["name"].as_str().map(str::to_string),
            ..Default::default()
        };
        self.publish(&reference, type_, reason, note).await;
    }

    async fn publish(
        &self,
        reference: &ObjectReference,
        type_: EventType,
        reason: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.into(),
            note: Some(note.chars().take(1000).collect()),
            action: "Reconcile".into(),
            secondary: None,
        };
        publish_event(&self.recorder, &self.metrics, &event, reference).await;
    }

    fn record_metrics(&self, planned: &Plan, desired: &BTreeMap<ObjectRef, Value>) {
        for kind in Kind::ALL {
            let n = desired.keys().filter(|r| r.kind == kind).count();
            self.metrics
                .managed_objects
                .get_or_create(&KindLabel {
                    kind: kind.as_str().into(),
                })
                .set(n as i64);
        }
        for (class, report) in &planned.classes {
            let d = report.devices;
            for (health, n) in [
                ("healthy", d.healthy),
                ("warning", d.warning),
                ("degraded", d.degraded),
                ("failed", d.failed),
                ("unknown", d.unknown),
            ] {
                self.metrics
                    .class_devices
                    .get_or_create(&ClassHealthLabels {
                        class: class.clone(),
                        health: health.into(),
                    })
                    .set(i64::from(n));
            }
        }
    }

    /// `limited`: flavor -> (nodes allowed out, nodes held back by the share limit).
    async fn write_class_status(
        &self,
        classes: &[AcceleratorClass],
        planned: &Plan,
        limited: &std::collections::BTreeMap<String, (u32, Vec<String>)>,
        name_conflicts: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<AcceleratorClass> = Api::all(self.client.clone());
        for class in classes {
            let name = class.name_any();
            let Some(report) = planned.classes.get(&name) else {
                continue;
            };
            let existing = class.status.clone().unwrap_or_default();
            let generation = class.metadata.generation;
            // The share limit held node actions back: say so on every class using
            // the flavor, next to the metric and the Node Events.
            let held: Vec<String> = report
                .flavors
                .iter()
                .filter_map(|f| {
                    limited.get(&f.name).map(|(allowed, nodes)| {
                        format!(
                            "{}: {} node(s) not taken out ({}) because {allowed} already are (maxSharePercent)",
                            f.name,
                            nodes.len(),
                            nodes.join(", ")
                        )
                    })
                })
                .collect();
            let mut desired =
                with_name_conflicts(report.conditions.clone(), name_conflicts.get(&name));
            desired.push(if held.is_empty() {
                crate::api::DesiredCondition::new(
                    "AutomationLimited",
                    false,
                    "WithinShare",
                    "node actions are within the configured share of each flavor",
                )
            } else {
                crate::api::DesiredCondition::new(
                    "AutomationLimited",
                    true,
                    "ShareLimitReached",
                    held.join("; "),
                )
            });
            let status = AcceleratorClassStatus {
                observed_generation: generation,
                summary: (!report.flavors.is_empty()).then(|| {
                    report
                        .flavors
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                flavors: report.flavors.clone(),
                devices: report.devices,
                conditions: merge_conditions(&existing.conditions, &desired, &now, generation),
            };
            if status == existing {
                continue;
            }
            let was_ready = condition_true(&existing.conditions, crate::api::READY);
            let patch = json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass", "status": status});
            api.patch_status(
                &name,
                &PatchParams::apply(&self.config.field_manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(api_err(format!("writing AcceleratorClass {name} status")))?;
            self.metrics.write("AcceleratorClass", "status");
            let now_ready = condition_true(&status.conditions, crate::api::READY).unwrap_or(false);
            if was_ready != Some(now_ready) {
                let first = status.conditions.first();
                self.publish(
                    &class.object_ref(&()),
                    if now_ready {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    },
                    first.map(|c| c.reason.as_str()).unwrap_or("Reconciled"),
                    first.map(|c| c.message.as_str()).unwrap_or(""),
                )
                .await;
            }
        }
        Ok(())
    }

    /// `missing`: budget -> namespaces whose LocalQueues could not be created.
    async fn write_budget_status(
        &self,
        budgets: &[CreditBudget],
        planned: &Plan,
        missing: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        ledger_views: &BTreeMap<String, credits::BudgetLedgerView>,
        name_conflicts: &BTreeMap<String, Vec<String>>,
    ) -> Result<(), Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<CreditBudget> = Api::all(self.client.clone());
        for budget in budgets {
            let name = budget.name_any();
            let Some(report) = planned.budgets.get(&name) else {
                continue;
            };
            let existing = budget.status.clone().unwrap_or_default();
            let generation = budget.metadata.generation;
            let mut desired =
                with_name_conflicts(report.conditions.clone(), name_conflicts.get(&name));
            if report.valid {
                desired.push(match missing.get(&name) {
                    Some(namespaces) => crate::api::DesiredCondition::new(
                        "NamespaceMissing",
                        true,
                        "NamespaceNotFound",
                        format!(
                            "spec.namespaces: {} do(es) not exist: create them; their LocalQueues are created as soon as they do",
                            namespaces.iter().cloned().collect::<Vec<_>>().join(", ")
                        ),
                    ),
                    None => crate::api::DesiredCondition::new(
                        "NamespaceMissing",
                        false,
                        "NamespacesExist",
                        "every namespace in spec.namespaces has its LocalQueues",
                    ),
                });
            }
            let view = ledger_views.get(&name);
            if self.ledger.is_some() {
                desired.push(ledger_condition(view));
                desired.push(overdraft_condition(view));
            }
            let figure = |f: fn(&credits::BudgetLedgerView) -> i128| {
                view.map(|v| crate::ledger::entry::format_micros(f(v)))
            };
            let time = |t: Option<i64>| {
                t.and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
                    .map(Time)
            };
            let status = CreditBudgetStatus {
                observed_generation: generation,
                cohort: report.cohort.clone(),
                cluster_queues: report.cluster_queues.clone(),
                local_queues: report.local_queues.clone(),
                conditions: merge_conditions(&existing.conditions, &desired, &now, generation),
                granted: figure(|v| v.balances.granted),
                reserved: figure(|v| v.balances.reserved),
                spent: figure(|v| v.balances.spent),
                remaining: figure(|v| v.balances.remaining()),
                burn_rate_per_hour: figure(|v| v.burn_per_hour),
                projected_exhaustion: time(view.and_then(|v| v.projected_exhaustion)),
                period_start: time(view.and_then(|v| v.period.map(|p| p.0))),
                period_end: time(view.and_then(|v| v.period.map(|p| p.1))),
            };
            if status == existing {
                continue;
            }
            let patch = json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget", "status": status});
            api.patch_status(
                &name,
                &PatchParams::apply(&self.config.field_manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(api_err(format!("writing CreditBudget {name} status")))?;
            self.metrics.write("CreditBudget", "status");
            let exhausted_now =
                condition_true(&status.conditions, crate::api::EXHAUSTED) == Some(true);
            let exhausted_before =
                condition_true(&existing.conditions, crate::api::EXHAUSTED) == Some(true);
            if exhausted_now && !exhausted_before {
                self.publish(
                    &budget.object_ref(&()),
                    EventType::Warning,
                    "BudgetExhausted",
                    "credits are used up; new work waits",
                )
                .await;
            }
        }
        Ok(())
    }
}

/// Planned names taken by objects kaccel does not own, as notes for the classes
/// and budgets whose objects they are.
#[derive(Debug, Default, PartialEq)]
struct NameConflicts {
    classes: BTreeMap<String, Vec<String>>,
    budgets: BTreeMap<String, Vec<String>>,
}

/// A taken ResourceFlavor concerns the classes pooled into it; a taken Cohort,
/// ClusterQueue or LocalQueue its budget (the root Cohort: every budget). An object
/// held up because it would use a taken one concerns its own budget.
fn name_conflicts(
    taken: &BTreeMap<ObjectRef, String>,
    held_up: &[(ObjectRef, ObjectRef)],
    desired: &BTreeMap<ObjectRef, Value>,
    planned: &Plan,
) -> NameConflicts {
    let mut out = NameConflicts::default();
    let budget_of = |target: &ObjectRef| -> Vec<String> {
        match desired
            .get(target)
            .and_then(|o| o["metadata"]["labels"][crate::plan::BUDGET_LABEL].as_str())
        {
            Some(b) => vec![b.to_string()],
            None => planned.budgets.keys().cloned().collect(),
        }
    };
    for (target, holder) in taken {
        let note = format!(
            "{target} already exists and is not kaccel's ({holder}): kaccel leaves it unchanged and does not use it; delete or rename it"
        );
        if target.kind == Kind::ResourceFlavor {
            for class in planned
                .flavors
                .get(&target.name)
                .map(|f| f.classes.iter())
                .into_iter()
                .flatten()
            {
                out.classes
                    .entry(class.clone())
                    .or_default()
                    .push(note.clone());
            }
        } else {
            for budget in budget_of(target) {
                out.budgets.entry(budget).or_default().push(note.clone());
            }
        }
    }
    for (target, used) in held_up {
        for budget in budget_of(target) {
            out.budgets.entry(budget).or_default().push(format!(
                "{target} is not written: it would use {used}, which is not kaccel's"
            ));
        }
    }
    out
}

/// A status's conditions with `notes` (name conflicts found while writing) added:
/// `Conflict` True naming them (after any conflict the planner found) and `Ready`
/// False. Unchanged without notes.
fn with_name_conflicts(
    mut conditions: Vec<crate::api::DesiredCondition>,
    notes: Option<&Vec<String>>,
) -> Vec<crate::api::DesiredCondition> {
    use crate::api::{CONFLICT, DesiredCondition, READY};
    let Some(notes) = notes.filter(|n| !n.is_empty()) else {
        return conditions;
    };
    let message = notes.join("; ");
    match conditions
        .iter_mut()
        .find(|c| c.type_ == CONFLICT && c.status)
    {
        Some(c) => c.message = format!("{}; {message}", c.message),
        None => {
            conditions.retain(|c| c.type_ != CONFLICT);
            conditions.push(DesiredCondition::new(
                CONFLICT,
                true,
                "NameTaken",
                message.clone(),
            ));
        }
    }
    match conditions.iter_mut().find(|c| c.type_ == READY) {
        Some(ready) if ready.status => {
            *ready = DesiredCondition::new(READY, false, "NameTaken", message);
        }
        Some(_) => {}
        None => conditions.insert(0, DesiredCondition::new(READY, false, "NameTaken", message)),
    }
    conditions
}

/// ClusterQueue -> (budget, class) for the credit check: the planned queues, and
/// the queues of grants whose class turned invalid. Kaccel deletes the latter, but
/// Workloads holding quota in them still get an answer: the class's own error
/// when its rate cannot price, rather than waiting for a queue nobody pays for.
fn priced_queues(planned: &Plan, budgets: &[CreditBudget]) -> BTreeMap<String, (String, String)> {
    let mut queues: BTreeMap<String, (String, String)> = planned
        .cluster_queues
        .iter()
        .filter_map(|q| {
            let labels = q.metadata.labels.as_ref()?;
            Some((
                q.metadata.name.clone()?,
                (
                    labels.get(crate::plan::BUDGET_LABEL)?.clone(),
                    labels.get(crate::plan::CLASS_LABEL)?.clone(),
                ),
            ))
        })
        .collect();
    for budget in budgets {
        let name = budget.name_any();
        for grant in &budget.spec.classes {
            if planned.classes.get(&grant.name).is_some_and(|c| !c.valid) {
                queues
                    .entry(crate::plan::cluster_queue_name(&name, &grant.name))
                    .or_insert_with(|| (name.clone(), grant.name.clone()));
            }
        }
    }
    queues
}

/// Writes an Event. A failure does not fail the reconcile (Events are advisory),
/// but it is logged at warn and counted, so a missing RBAC verb does not go unseen.
pub(super) async fn publish_event(
    recorder: &Recorder,
    metrics: &Metrics,
    event: &Event,
    reference: &ObjectReference,
) {
    if let Err(e) = recorder.publish(event, reference).await {
        let reason = match &e {
            kube::Error::Api(status) if !status.reason.is_empty() => status.reason.clone(),
            kube::Error::Api(status) => format!("HTTP{}", status.code),
            _ => "Unreachable".to_string(),
        };
        tracing::warn!(error = %e, %reason, event_reason = %event.reason, object = ?reference.name, "could not write a Kubernetes Event (check the role grants create on events)");
        metrics
            .event_write_failures
            .get_or_create(&ReasonLabel { reason })
            .inc();
    }
}

/// `LedgerInSync` on a budget: the ledger answers and matches Kueue.
fn ledger_condition(view: Option<&credits::BudgetLedgerView>) -> crate::api::DesiredCondition {
    use crate::api::DesiredCondition;
    match view {
        None => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "LedgerPending",
            "the ledger has not looked at this budget yet (is the ledger store reachable?)",
        ),
        Some(v) if v.error.is_some() => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "LedgerError",
            v.error.clone().unwrap_or_default(),
        ),
        Some(v) if !v.drift.is_empty() => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "Drift",
            format!(
                "the ledger and Kueue disagree ({} finding(s)): {}",
                v.drift.len(),
                v.drift
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
        Some(_) => DesiredCondition::new(
            LEDGER_IN_SYNC,
            true,
            "InSync",
            "open reservations match the Workloads holding quota, and charged devices match Kueue's usage",
        ),
    }
}

/// `Overdrawn` on a budget: running work renewed its reservations into the
/// overdraft the budget allows (`remaining` below zero). Visible, never silent.
fn overdraft_condition(view: Option<&credits::BudgetLedgerView>) -> crate::api::DesiredCondition {
    use crate::api::{DesiredCondition, OVERDRAWN};
    match view.map(|v| v.balances.remaining()) {
        Some(remaining) if remaining < 0 => DesiredCondition::new(
            OVERDRAWN,
            true,
            "Overdraft",
            format!(
                "remaining credits are {}: running work renewed its reservations into the overdraft spec.admission.overdraftLimit allows; new work waits until credits return",
                crate::ledger::entry::format_micros(remaining)
            ),
        ),
        _ => DesiredCondition::new(
            OVERDRAWN,
            false,
            "NotOverdrawn",
            "remaining credits are not below zero",
        ),
    }
}

/// Condition type of the ledger's reconciliation on a CreditBudget.
pub const LEDGER_IN_SYNC: &str = "LedgerInSync";

fn condition_true(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status == "True")
}

fn is_local_queue(action: &Action) -> bool {
    matches!(action, Action::Apply { target, .. } | Action::Recreate { target, .. } if target.kind == Kind::LocalQueue)
}

/// The budget (label) and namespace of a LocalQueue write.
fn local_queue_budget(action: &Action) -> Option<(String, String)> {
    let (Action::Apply { target, object, .. } | Action::Recreate { target, object }) = action
    else {
        return None;
    };
    let budget = object["metadata"]["labels"][crate::plan::BUDGET_LABEL].as_str()?;
    Some((budget.to_string(), target.namespace.clone()?))
}

/// Total nominal quota of device resources (not cpu/memory) in a ClusterQueue.
fn device_quota(cq: &Value) -> u64 {
    cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rg| rg["flavors"].as_array().into_iter().flatten())
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .filter(|r| r["name"] != "cpu" && r["name"] != "memory")
        .filter_map(|r| r["nominalQuota"].as_str())
        .filter_map(|q| crate::inventory::parse_count(q).ok())
        .map(u64::from)
        .sum()
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

    /// An API server that refuses everything as RBAC does for a missing verb.
    async fn forbidding_api_server() -> Client {
        let app = axum::Router::new().fallback(|| async {
            (
                axum::http::StatusCode::FORBIDDEN,
                [("content-type", "application/json")],
                r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"events.events.k8s.io is forbidden: User \"kaccel\" cannot create resource \"events\"","reason":"Forbidden","code":403}"#,
            )
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        let config = kube::Config::new(url.parse().unwrap());
        Client::try_from(config).unwrap()
    }

    #[test]
    fn workloads_in_the_queue_of_a_class_turned_invalid_still_get_an_answer() {
        let loaded = crate::cli::load::examples();
        let (mut classes, budgets) = (loaded.classes, loaded.budgets);
        let inventory = Inventory::from_nodes(&loaded.nodes);
        let budget = &budgets[0];
        let class = budget.spec.classes[0].name.clone();
        let queue = crate::plan::cluster_queue_name(&budget.name_any(), &class);
        let input = |classes: &[AcceleratorClass]| {
            plan(&PlanInput {
                classes,
                budgets: &budgets,
                inventory: &inventory,
                health: &Default::default(),
                options: &Default::default(),
            })
        };
        let planned = input(&classes);
        assert!(
            planned
                .cluster_queues
                .iter()
                .any(|q| q.metadata.name.as_deref() == Some(queue.as_str())),
            "cluster_queue_name is the planner's name"
        );
        let valid = priced_queues(&planned, &budgets);
        assert_eq!(valid[&queue], (budget.name_any(), class.clone()));

        let bad = classes.iter_mut().find(|c| c.name_any() == class).unwrap();
        bad.spec.credits.per_device_hour = "abc".into();
        let planned = input(&classes);
        assert!(
            !planned
                .cluster_queues
                .iter()
                .any(|q| q.metadata.name.as_deref() == Some(queue.as_str()))
        );
        assert_eq!(
            priced_queues(&planned, &budgets)[&queue],
            (budget.name_any(), class)
        );
    }

    #[test]
    fn a_taken_name_is_a_conflict_on_the_classes_or_budget_that_planned_it() {
        let loaded = crate::cli::load::examples();
        let planned = plan(&PlanInput {
            classes: &loaded.classes,
            budgets: &loaded.budgets,
            inventory: &Inventory::from_nodes(&loaded.nodes),
            health: &Default::default(),
            options: &Default::default(),
        });
        let desired = desired_objects(&planned);
        let (flavor, report) = planned.flavors.iter().next().unwrap();
        let cq = desired
            .keys()
            .find(|r| r.kind == Kind::ClusterQueue)
            .unwrap()
            .clone();
        let budget = desired[&cq]["metadata"]["labels"][crate::plan::BUDGET_LABEL]
            .as_str()
            .unwrap()
            .to_string();
        let flavor_ref = ObjectRef {
            kind: Kind::ResourceFlavor,
            namespace: None,
            name: flavor.clone(),
        };
        let taken = BTreeMap::from([
            (flavor_ref.clone(), "managed by terraform".to_string()),
            (cq.clone(), "owned by Team x".to_string()),
        ]);
        let lq = desired
            .iter()
            .find(|(r, v)| {
                r.kind == Kind::LocalQueue && v["spec"]["clusterQueue"] == cq.name.as_str()
            })
            .map(|(r, _)| r.clone())
            .unwrap();
        assert_eq!(
            diff::references(Kind::LocalQueue, &desired[&lq]),
            vec![cq.clone()]
        );
        let notes = name_conflicts(&taken, &[(lq.clone(), cq.clone())], &desired, &planned);
        for class in &report.classes {
            let n = &notes.classes[class];
            assert!(
                n[0].contains(&format!("ResourceFlavor {flavor}"))
                    && n[0].contains("managed by terraform"),
                "{n:?}"
            );
        }
        let n = &notes.budgets[&budget];
        assert!(
            n.iter()
                .any(|m| m.contains(&format!("ClusterQueue {}", cq.name))
                    && m.contains("owned by Team x")),
            "{n:?}"
        );
        assert!(
            n.iter()
                .any(|m| m.starts_with(&format!("{lq} is not written"))),
            "{n:?}"
        );

        // Ready goes False, Conflict True; an earlier planner Conflict keeps its reason.
        let ready = vec![crate::api::DesiredCondition::new(
            crate::api::READY,
            true,
            "Planned",
            "ok",
        )];
        let merged = with_name_conflicts(ready.clone(), Some(&vec!["X taken".into()]));
        assert_eq!(merged[0].type_, crate::api::READY);
        assert!(!merged[0].status && merged[0].reason == "NameTaken");
        assert!(
            merged
                .iter()
                .any(|c| c.type_ == crate::api::CONFLICT && c.status && c.message == "X taken")
        );
        assert_eq!(with_name_conflicts(ready.clone(), None), ready);
        let pooled = vec![
            crate::api::DesiredCondition::new(crate::api::READY, false, "PoolingConflict", "p"),
            crate::api::DesiredCondition::new(crate::api::CONFLICT, true, "PoolingConflict", "p"),
        ];
        let merged = with_name_conflicts(pooled, Some(&vec!["X taken".into()]));
        assert_eq!(merged[1].message, "p; X taken");
        assert_eq!(merged[0].reason, "PoolingConflict");
    }

    #[test]
    fn the_holder_of_a_foreign_object_is_named() {
        let owned = json!({"metadata": {"ownerReferences": [{"kind": "Team", "name": "x"}]}});
        assert_eq!(diff::holder_of(&owned), "owned by Team x");
        let labelled =
            json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "terraform"}}});
        assert_eq!(diff::holder_of(&labelled), "managed by terraform");
        let written = json!({"metadata": {"managedFields": [{"manager": "kubectl-create"}, {"manager": "kubectl-create"}]}});
        assert_eq!(
            diff::holder_of(&written),
            "written by field manager kubectl-create"
        );
        assert!(diff::holder_of(&json!({})).contains("no owner recorded"));
    }

    #[tokio::test]
    async fn a_refused_event_is_counted_by_reason() {
        let client = forbidding_api_server().await;
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: "kaccel".into(),
                instance: None,
            },
        );
        let metrics = Metrics::register(&mut Registry::default());
        let event = Event {
            type_: EventType::Normal,
            reason: "FlavorCreated".into(),
            note: None,
            action: "Reconcile".into(),
            secondary: None,
        };
        let reference = ObjectReference {
            kind: Some("Node".into()),
            name: Some("n1".into()),
            ..Default::default()
        };
        publish_event(&recorder, &metrics, &event, &reference).await;
        publish_event(&recorder, &metrics, &event, &reference).await;
        let forbidden = ReasonLabel {
            reason: "Forbidden".into(),
        };
        assert_eq!(
            metrics.event_write_failures.get_or_create(&forbidden).get(),
            2
        );
    }
}
