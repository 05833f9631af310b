//! One reconcile's stages in order: observe -> plan -> diff -> apply -> nodes -> status.
//!
//! The stages' writes live in apply.rs, node_actions.rs and status.rs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kube::runtime::events::Recorder;
use kube::{Client, ResourceExt};

use super::apply::Applied;
use super::diff::{self, DesiredObjects, Kind};
use super::metrics::{
    BlockedQueueLabels, ClassFlavorLabels, ClassHealthLabels, KindLabel, Metrics, StageHistograms,
    StageLabel,
};
use super::name_conflicts::name_conflicts;
use super::pricing_snapshot::pricing_snapshot;
use super::status_writes::share_limited;
use super::watches::Caches;
use super::{Config, Error, credits, health_poller};
use crate::health::policy::apply_node_conditions;
use crate::inventory::Inventory;
use crate::k8s::instance;
use crate::kueue::config::{Configuration, ObservedConfiguration};
use crate::plan::device_quarantine::{self, DeviceHealth, Quarantine};
use crate::plan::{Carried, Plan, PlanInput, Served, plan_carrying, served_by};
use k8s_openapi::api::resource::v1alpha3::DeviceTaintRule;

/// Everything one reconcile needs besides the caches.
pub(super) struct Reconciler {
    pub(super) client: Client,
    pub(super) config: Config,
    pub(super) metrics: Metrics,
    pub(super) recorder: Recorder,
    pub(super) health: health_poller::SharedTracker,
    /// Nodes held back by the share limit at the last reconcile.
    pub(super) held_back: std::sync::Mutex<std::collections::BTreeSet<String>>,
    /// Workloads kaccel evicted may be waiting to be requeued (checked at start too).
    pub(super) requeue_pending: AtomicBool,
    /// Workloads warned of an eviction may be due (checked at start too).
    pub(super) evictions_pending: AtomicBool,
    /// Unix seconds before which warned Workloads are not looked at again.
    pub(super) next_eviction_check: std::sync::Mutex<i64>,
    /// Some budget names a namespace that does not exist (retried every few seconds).
    pub(super) namespaces_missing: AtomicBool,
    /// A planned name is taken by an object kaccel does not own (not watched:
    /// retried every few seconds, so its removal is noticed).
    pub(super) names_taken: AtomicBool,
    /// Until then, a reconcile waits for health sources that have not answered
    /// (nor failed) yet: a restarted kaccel plans from their first readings, not
    /// from cards it has not read (a firmware allow-list would take a class's
    /// flavors away for the seconds of the first poll).
    pub(super) health_warm_until: std::time::Instant,
    /// A reconcile waited for a first health answer (retried soon).
    pub(super) health_warming: AtomicBool,
    /// The DeviceTaintRules of the last reconcile, for /devices.
    pub(super) held_rules: super::http::SharedHeldRules,
    /// The credit ledger, when `ledger.enabled`.
    pub(super) ledger: Option<LedgerParts>,
    /// Managed objects found in sync at the last diff (not compared again until
    /// they or their plan move).
    pub(super) in_sync: std::sync::Mutex<diff::InSync>,
    /// What kaccel's applies returned, so their watch events wake nothing.
    pub(super) own_writes: super::watches::OwnWrites,
    /// The Node index's parse count at the last reconcile (for the metric).
    pub(super) node_reads_seen: std::sync::atomic::AtomicU64,
    /// MultiKueue workers' Node watches (none configured: this cluster's Nodes
    /// are planned).
    pub(super) workers: super::multikueue::Workers,
    /// Asked after each reconcile: what a re-plan freed goes back to the system.
    pub(super) trim: super::allocator::TrimRequests,
    /// What the last plan left for the next: its LocalQueues (reused while the
    /// budgets, their namespaces and the classes' validity call for the same
    /// ones) and its purity verdicts (a Node change re-checks that Node).
    pub(super) carried: std::sync::Mutex<Carried>,
}

/// The ledger's tasks and what they share with the planner loop.
pub(super) struct LedgerParts {
    pub(super) shared: Arc<credits::LedgerShared>,
    pub(super) runtime: Arc<credits::LedgerRuntime>,
}

impl Reconciler {
    /// observe -> plan -> diff -> apply -> status.
    pub(super) async fn reconcile(&self, caches: &Caches) -> Result<(), Error> {
        if std::time::Instant::now() < self.health_warm_until {
            let waiting = self
                .health
                .lock()
                .expect("tracker lock")
                .unanswered_sources();
            if !waiting.is_empty() {
                tracing::debug!(sources = ?waiting, "waiting for the first health answers");
                self.health_warming.store(true, Ordering::Relaxed);
                return Ok(());
            }
        }
        self.health_warming.store(false, Ordering::Relaxed);
        if self.workers.first_read_pending() {
            tracing::debug!("waiting for the first read of every MultiKueue worker's Nodes");
            return Ok(());
        }
        let mut clock = StageClock::start(&self.metrics.reconcile_stage);
        // Observe: the classes and budgets this installation serves
        // (`kaccel.io/instance`); another installation's are not even read.
        let Served {
            classes,
            budgets,
            classes_elsewhere,
        } = served_by(
            &self.config.instance,
            caches.classes.state().iter().map(|c| c.as_ref()),
            caches.budgets.state().iter().map(|b| b.as_ref()),
        );
        // With MultiKueue workers, only their Nodes are planned: every admission
        // is dispatched to a worker, none runs here.
        let unreachable_workers = self.workers.unreachable();
        let slices = match &caches.slices {
            Some(s) if !self.workers.enabled() => s.state(),
            _ => Vec::new(),
        };
        // The Node watch parsed each Node as it changed: nothing to read here.
        let nodes = if self.workers.enabled() {
            self.workers
                .export_metrics(&self.metrics, &unreachable_workers);
            Arc::new(self.workers.inventory(&unreachable_workers))
        } else {
            caches.nodes.snapshot()
        };
        let reads = caches.nodes.reads();
        let before = self.node_reads_seen.swap(reads, Ordering::Relaxed);
        self.metrics
            .inventory_node_reads
            .inc_by(reads.saturating_sub(before));
        let with_slices;
        let inventory: &Inventory = if slices.is_empty() {
            &nodes
        } else {
            with_slices = nodes.with_slices(slices.iter().map(|s| s.as_ref()));
            &with_slices
        };
        self.metrics
            .inventory_unclassified_devices
            .set(i64::try_from(inventory.unclassified_device_count()).unwrap_or(i64::MAX));

        clock.lap("observe");

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
        options.kueue_configuration = self.observe_kueue_configuration(caches);
        options.classes_elsewhere = classes_elsewhere;
        options.unreachable_workers = unreachable_workers;
        options.foreign_cluster_queues = caches
            .all_cluster_queues
            .state()
            .iter()
            .filter(|q| !instance::owns(&self.config.instance, q.labels()))
            .map(|q| (q.name_any(), super::watches::covered_resources(q)))
            .collect();
        let health = {
            let tracker = self.health.lock().expect("tracker lock");
            tracker.snapshot(inventory, health_poller::now_seconds())
        };
        let mut health = health;
        apply_node_conditions(&mut health, inventory, &self.config.health.node_conditions);
        let mut planned = {
            let mut carried = self.carried.lock().expect("carried plan lock");
            let last_local_queues = carried.local_queues.clone();
            let planned = plan_carrying(
                &PlanInput {
                    classes: &classes,
                    budgets: &budgets,
                    inventory,
                    health: &health,
                    options: &options,
                },
                &mut carried,
            );
            // 1 when a Node or health change left the queues as they were.
            clock.note(
                "local queues kept",
                usize::from(planned.local_queues.shared_with(&last_local_queues)),
            );
            // The Nodes the purity check looked at (the fleet's when all).
            clock.note(
                "purity nodes checked",
                carried.nodes_rechecked().unwrap_or(inventory.nodes.len()),
            );
            planned
        };
        // One failed DRA device out by a DeviceTaintRule, not its node.
        let quarantine = self.quarantine(caches, inventory, &planned);
        planned.device_taint_rules = quarantine.rules.clone();
        *self.held_rules.lock().expect("held rules lock") = quarantine
            .rules
            .iter()
            .filter_map(device_quarantine::HeldRule::of)
            .collect();

        if let Some(l) = &self.ledger {
            l.shared.set_pricing(pricing_snapshot(&planned, &budgets));
        }

        clock.lap("plan");

        // Diff (pure): objects held in sync are neither built as JSON nor compared.
        let desired = DesiredObjects::of(&planned);
        let (live, actions) = {
            let mut in_sync = self.in_sync.lock().expect("in-sync lock");
            let mut skipped = std::collections::HashSet::new();
            let (live, live_fingerprints) = caches.live_objects(|target, fingerprint| {
                in_sync.skips(&desired, target, fingerprint, &mut skipped)
            });
            let compared = desired.values_except(&skipped);
            clock.note("compared", compared.len());
            let actions = diff::diff(&compared, &live, &self.config.instance);
            clock.note("actions", actions.len());
            in_sync.record(&desired, &live_fingerprints, &actions);
            (live, actions)
        };

        clock.lap("diff");

        // Apply.
        let Applied {
            mut first_error,
            missing_namespaces,
            taken,
            held_up,
        } = self.apply_all(&actions, &live).await;
        self.namespaces_missing
            .store(!missing_namespaces.is_empty(), Ordering::Relaxed);
        self.names_taken.store(!taken.is_empty(), Ordering::Relaxed);
        clock.lap("apply");
        let name_conflicts = name_conflicts(&taken, &held_up, &desired, &planned);
        self.record_metrics(&planned, &desired);

        // Nodes: taint / cordon for health, within the share limit.
        let mut decided = self
            .act_on_nodes(
                inventory,
                &health,
                &planned,
                &quarantine.covered,
                &mut first_error,
            )
            .await;
        for held in &quarantine.held_back {
            tracing::warn!(device = %held.node, flavor = %held.flavor, allowed = held.allowed, reason = %held.reason, "device taint held back by the share limit");
        }
        decided.held_back.extend(quarantine.held_back);

        // Warned Workloads whose grace period ended are evicted; Workloads kaccel
        // evicted go back to their queues once Kueue evicted them.
        self.deactivate_due_workloads().await?;
        self.requeue_evicted_workloads().await?;

        clock.lap("nodes");

        // Status.
        let limited = share_limited(&decided.held_back);
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
        clock.lap("status");
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The DeviceTaintRules for failed DRA devices (none when the API is not served).
    fn quarantine(&self, caches: &Caches, inventory: &Inventory, planned: &Plan) -> Quarantine {
        if !caches.device_taint_rules {
            return Quarantine::default();
        }
        let now = health_poller::now_seconds();
        let devices: Vec<DeviceHealth> = {
            let tracker = self.health.lock().expect("tracker lock");
            tracker
                .devices
                .values()
                .map(|d| DeviceHealth {
                    node: d.node.clone(),
                    uuid: d.reading.uuid.clone(),
                    pci_address: d.reading.pci_bus_id.clone(),
                    status: d.effective_status(&tracker.sources, now),
                    fresh: d.silence(&tracker.sources, now).is_none(),
                    reasons: d.reasons.clone(),
                })
                .collect()
        };
        let live: BTreeMap<String, DeviceTaintRule> = caches.kueue[&Kind::DeviceTaintRule]
            .state()
            .iter()
            .filter_map(|o| {
                let rule: DeviceTaintRule = o.read().ok()?;
                Some((o.name.clone(), rule))
            })
            .collect();
        device_quarantine::decide(
            inventory,
            &devices,
            &planned.flavors,
            &live,
            &self.config.health.actions,
            &self.config.instance,
        )
    }

    /// Kueue's configuration, from the file or the ConfigMap `kueue` names.
    fn observe_kueue_configuration(&self, caches: &Caches) -> Option<ObservedConfiguration> {
        let settings = &self.config.kueue;
        let gate_on_command_line = settings.dra_gate_on_command_line;
        let (source, read) = if !settings.config_file.is_empty() {
            let source = format!("file {}", settings.config_file);
            let read = std::fs::read_to_string(&settings.config_file)
                .map_err(|e| format!("cannot read it: {e}"))
                .and_then(|text| Configuration::parse(&source, &text).map_err(|e| e.reason));
            (source, read)
        } else {
            let (namespace, name) = settings.config_map_ref()?;
            let source = format!("ConfigMap {namespace}/{name}");
            let key = &settings.config_map_key;
            let store = caches.kueue_config_map.as_ref()?;
            let read = match store.state().first() {
                None => Err("not found, or kaccel may not read it (manifests/role.yaml grants kueue-system/kueue-manager-config); set kueue.configMap or kueue.configFile in kaccel's config".to_string()),
                Some(cm) => match cm.data.as_ref().and_then(|d| d.get(key)) {
                    None => Err(format!("it has no key {key} (kueue.configMapKey)")),
                    Some(text) => Configuration::parse(&source, text).map_err(|e| e.reason),
                },
            };
            (source, read)
        };
        Some(ObservedConfiguration {
            source,
            read,
            gate_on_command_line,
        })
    }

    fn record_metrics(&self, planned: &Plan, desired: &DesiredObjects) {
        for kind in Kind::ALL {
            let n = desired.keys().filter(|r| r.kind == kind).count();
            self.metrics
                .managed_objects
                .get_or_create(&KindLabel {
                    kind: kind.as_str().into(),
                })
                .set(n as i64);
        }
        // Rebuilt each time: a queue fixed or deleted leaves no stale series.
        self.metrics.foreign_queues_blocked.clear();
        for (queue, resources) in &planned.blocked_queues {
            for resource in resources {
                self.metrics
                    .foreign_queues_blocked
                    .get_or_create(&BlockedQueueLabels {
                        cluster_queue: queue.clone(),
                        resource: resource.clone(),
                    })
                    .set(1);
            }
        }
        // Rebuilt each time: a class or flavor gone leaves no stale series.
        self.metrics.class_largest_block.clear();
        for (class, report) in &planned.classes {
            let d = report.devices;
            for flavor in &report.flavors {
                if let Some(largest) = flavor.topology.as_ref().and_then(|t| t.largest_block) {
                    self.metrics
                        .class_largest_block
                        .get_or_create(&ClassFlavorLabels {
                            class: class.clone(),
                            flavor: flavor.name.clone(),
                        })
                        .set(i64::try_from(largest).unwrap_or(i64::MAX));
                }
            }
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
}

/// Times the stages of one reconcile (`kaccel_reconcile_stage_seconds`): each lap
/// is the time since the previous one. When it ends (however the reconcile
/// returns) it logs the laps at debug level (`kaccel::replan`), so a slow change
/// can be traced to its stage, which the histograms' means cannot show.
struct StageClock<'a> {
    stages: &'a StageHistograms,
    since: std::time::Instant,
    laps: Vec<(&'static str, f64)>,
    /// Counts logged beside the laps (objects the diff compared, its actions).
    notes: Vec<(&'static str, usize)>,
}

impl<'a> StageClock<'a> {
    fn start(stages: &'a StageHistograms) -> Self {
        StageClock {
            stages,
            since: std::time::Instant::now(),
            laps: Vec::with_capacity(6),
            notes: Vec::new(),
        }
    }

    fn note(&mut self, what: &'static str, count: usize) {
        self.notes.push((what, count));
    }

    fn lap(&mut self, stage: &'static str) {
        let now = std::time::Instant::now();
        let seconds = now.duration_since(self.since).as_secs_f64();
        self.stages
            .get_or_create(&StageLabel { stage })
            .observe(seconds);
        self.laps.push((stage, seconds * 1000.0));
        self.since = now;
    }
}

impl Drop for StageClock<'_> {
    fn drop(&mut self) {
        if tracing::enabled!(target: "kaccel::replan", tracing::Level::DEBUG) {
            let laps: Vec<String> = self
                .laps
                .iter()
                .map(|(stage, ms)| format!("{stage} {ms:.1}"))
                .chain(self.notes.iter().map(|(what, n)| format!("{what}: {n}")))
                .collect();
            tracing::debug!(target: "kaccel::replan", "re-plan stages (ms): {}", laps.join(", "));
        }
    }
}
