//! The credit ledger at run time: kaccel's Kueue AdmissionCheck and the budget
//! loop. Thin I/O around the pure layers in `src/ledger` (pricing and the
//! reserve/wait/reject decision in `admission`, the Workload lifecycle in
//! `lifecycle`, periods and top-ups in `budget`).
//!
//! Workloads (one reconcile per Workload at a time, from kube-runtime's
//! Controller):
//! 1. post usage of the recorded admission per interval; settle it (last post +
//!    void, and a refund for platform preemption when the budget says so) once
//!    it ended — finished, quota released, re-admitted or deleted;
//! 2. answer a Pending check of a Workload holding quota: record the priced
//!    admission with a finalizer, append the Reserve entry, and only then set
//!    the check Ready; or leave it Pending / Retry with the message the user
//!    sees; or Rejected when nothing prices the devices;
//! 3. drop the finalizer once a finished or deleted Workload is settled.
//!
//! Budgets (every `budgetIntervalSeconds`): period grants, expiries and top-ups;
//! balances, burn rate and exhaustion for the status and the planner's Hold;
//! and the reconciliation of open reservations against Kueue.
//!
//! Every error is retried with backoff: an unreachable store delays answers, it
//! never loses an entry (entries are derived again from Kueue's state with the
//! same idempotency keys).
//!
//! Layout: this file holds the shared state and the task wiring;
//! `admission_check` the per-Workload reconcile, `budget_loop` the budget pass
//! and the reconciliation against Kueue, `workload_cache` what is cached of a
//! Workload and the index of open work.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::ApiResource;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, OnceCell, mpsc::UnboundedSender};

use super::config::Ledger as LedgerConfig;
use super::health_poller::now_seconds;
use super::managed_cache::ManagedCache;
use super::metrics::{BudgetLabel, DecisionLabel, KindLabel, Metrics, ReasonLabel, StageLabel};
use crate::api::parsed::{FieldError, ParsedBudget};
use crate::api::rates::{ClassRates, RateError};
use crate::api::{CreditBudgetSpec, Credits, ExhaustionPolicy, RenewalShortPolicy, ShortPolicy};
use crate::k8s::labels::EVICTED_FOR_ANNOTATION;
use crate::k8s::time::rfc3339;
use crate::kueue::workload::Workload;
use crate::ledger::admission::{
    AdmissionError, BudgetView, Decision, FlavorUsage, WorkloadView, admission_number,
    asks_by_two_names, decide, describe_counts, disallowed_devices_per_pod, flavor_devices,
    horizon_seconds, pod_set_usage, rate_info, reservation, total_usage, usage_from_workload,
};
use crate::ledger::budget::{
    budget_entries, burn_rate_per_hour, current_period, is_exhausted, projected_exhaustion,
};
use crate::ledger::charge::{Charge, ChargeState, Renewal, RenewalRule};
use crate::ledger::entry::{Balances, Entry, EntryKind, format_micros, void_key};
use crate::ledger::lifecycle::{
    Ended, RESERVATION_ANNOTATION, RESERVATION_ANNOTATION_POINTER, ReservationRecord,
    STOPPED_ANNOTATION, check_state, condition, deletion_time, ended_at, evicted_since_admission,
    holds_quota, is_finished, rebased, record_of,
};
use crate::ledger::store::{LedgerStore, OpenReservation, Store, StoreError, StoredEntry};

/// The admission the check is asked about.
#[derive(Clone, Copy, Debug)]
pub(super) struct Admission<'a> {
    /// `namespace/name`, as messages show it.
    pub shown: &'a str,
    pub uid: &'a str,
    /// Kueue's admission number ([`admission_number`]).
    pub number: u32,
    /// The reservation record as written on the Workload (its annotation,
    /// already parsed), if any.
    pub written: Option<&'a ReservationRecord>,
}

/// What the planner knows that the check needs to price an admission; replaced
/// after every plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PricingSnapshot {
    /// False until the first plan ran.
    pub ready: bool,
    /// ResourceFlavor name -> device model.
    pub flavor_models: BTreeMap<String, String>,
    /// The DRA-only flavors: their class-resource usage is priced as
    /// `dra.kaccel.io/<flavor>` lines, naming the DeviceClass.
    pub dra_flavors: BTreeSet<String>,
    /// AcceleratorClass name -> its rates as the planner parsed them, or the
    /// errors of the rate fields that cannot price.
    pub classes: BTreeMap<String, Result<ClassRates, Vec<RateError>>>,
    /// AcceleratorClass name -> the device counts one pod may ask for (classes
    /// that restrict it only).
    pub devices_per_pod: BTreeMap<String, Vec<u32>>,
    /// ClusterQueue name -> (budget, class).
    pub queues: BTreeMap<String, (String, String)>,
    /// CreditBudget name -> spec.
    pub budgets: BTreeMap<String, CreditBudgetSpec>,
    /// CreditBudget name -> its amounts, period and top-ups as the planner parsed
    /// them (valid budgets).
    pub budget_amounts: BTreeMap<String, ParsedBudget>,
    /// CreditBudget name -> its field errors as the planner found them (invalid
    /// budgets: the ledger grants them nothing).
    pub budget_errors: BTreeMap<String, Vec<FieldError>>,
}

impl PricingSnapshot {
    /// Why `class` cannot price any admission (a rate field that does not parse or
    /// is too large, which an older CRD without the CEL rule lets in), naming
    /// the fields and the fix; `None` when every rate of the class prices.
    pub fn rate_problem(&self, class: &str) -> Option<String> {
        let errors = self.classes.get(class)?.as_ref().err()?;
        (!errors.is_empty()).then(|| {
            let fields: Vec<String> = errors
                .iter()
                .map(|e| format!("{}: {}", e.field, e.problem))
                .collect();
            format!(
                "AcceleratorClass {class} has no usable credit rate ({}): fix the class (it is marked Invalid), then submit the Workload again",
                fields.join("; ")
            )
        })
    }
}

impl PricingSnapshot {
    /// Why the ledger grants `budget` nothing: the field errors the planner found
    /// (the budget is marked Invalid with the same errors), naming each field and
    /// its fix.
    pub fn budget_problem(&self, budget: &str) -> String {
        match self.budget_errors.get(budget) {
            Some(errors) => format!(
                "CreditBudget {budget} is invalid, so the ledger grants it nothing until it is fixed (see its Invalid condition): {}",
                errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
            None => format!(
                "CreditBudget {budget} has not been parsed by the planner yet; the ledger grants it nothing until it is"
            ),
        }
    }
}

/// The ledger's view of a budget, for its status, the planner's Hold and metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetLedgerView {
    pub balances: Balances,
    pub burn_per_hour: i128,
    pub projected_exhaustion: Option<i64>,
    pub period: Option<(i64, i64)>,
    pub exhausted: bool,
    /// A problem the user must fix (a changed top-up, a bad amount) or the store
    /// being unreachable.
    pub error: Option<String>,
    /// Reconciliation findings of the last pass (empty = ledger matches Kueue).
    pub drift: Vec<String>,
}

/// Shared between the planner loop and the ledger tasks.
#[derive(Default)]
pub struct LedgerShared {
    pricing: RwLock<Arc<PricingSnapshot>>,
    budgets: RwLock<BTreeMap<String, BudgetLedgerView>>,
    /// Wakes the budget loop before its next tick: the pricing inputs changed, or
    /// entries were written (a reservation may have used the last credits).
    budget_pass_due: Notify,
}

impl LedgerShared {
    /// Replaces the snapshot; the budget loop runs at once only when it changed
    /// (the planner re-plans on every Kueue status update, most change nothing here).
    pub fn set_pricing(&self, snapshot: PricingSnapshot) {
        let mut current = self.pricing.write().expect("pricing lock");
        if **current != snapshot {
            *current = Arc::new(snapshot);
            self.budget_pass_due.notify_one();
        }
    }

    fn pricing(&self) -> Arc<PricingSnapshot> {
        self.pricing.read().expect("pricing lock").clone()
    }

    pub fn budget_views(&self) -> BTreeMap<String, BudgetLedgerView> {
        self.budgets.read().expect("budgets lock").clone()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    #[error("ledger store: {0}")]
    Store(#[from] StoreError),
    #[error("Kubernetes API error during {action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("Workload {workload}: {message}")]
    BadWorkload { workload: String, message: String },
    #[error("Workload {workload}: {source}")]
    Admission {
        workload: String,
        #[source]
        source: AdmissionError,
    },
}

impl LedgerError {
    pub fn metric_label(&self) -> &'static str {
        match self {
            LedgerError::Store(s) if store_unreachable(s) => "store_unreachable",
            LedgerError::Store(_) => "store",
            LedgerError::Api { .. } => "api",
            LedgerError::BadWorkload { .. } => "bad_workload",
            LedgerError::Admission { .. } => "admission",
        }
    }
}

/// The store could not be reached (as opposed to refusing or failing a query).
fn store_unreachable(e: &StoreError) -> bool {
    matches!(e, StoreError::Unreachable { .. } | StoreError::Postgres(_))
}

/// Workload reconciles running at once. Each is a few store round trips and
/// API writes; 32 keeps a burst of admissions moving on 2 cores.
const RECONCILE_CONCURRENCY: u16 = 32;

/// How long a Ready this process wrote explains a cached Pending (the watch
/// delivers the write well within it); after that the check is answered again.
const ANSWER_CACHE_LAG: Duration = Duration::from_secs(5);

pub fn workload_resource() -> ApiResource {
    crate::k8s::resources::kueue("Workload")
}

fn admission_check_resource() -> ApiResource {
    crate::k8s::resources::kueue("AdmissionCheck")
}

/// Everything the ledger tasks share.
pub struct LedgerRuntime {
    client: Client,
    config: LedgerConfig,
    /// The installation (config `instance`): the `managed-by` of its AdmissionCheck.
    instance: String,
    field_manager: String,
    metrics: Metrics,
    shared: Arc<LedgerShared>,
    /// Opened (with retries) by the budget loop; workloads wait until it is.
    store: OnceCell<Store>,
    /// One reservation decision at a time, so two admissions cannot both spend
    /// the same remaining credits.
    reserve_lock: Mutex<()>,
    /// Balances per budget, so a decision does not sum a budget's whole history.
    /// Kept by applying what this process appends (the leader is the only
    /// writer) and refreshed from the store every budget pass; a refresh that
    /// raced a Reserve is dropped ([`Self::reserves_appended`]), and the other
    /// races can only under-state what remains.
    balances: std::sync::Mutex<BTreeMap<String, Balances>>,
    /// Reserve appends so far (changed under `reserve_lock`).
    reserves_appended: std::sync::atomic::AtomicU64,
    /// Workload UID -> (admission, when) of the checks this process set Ready:
    /// a reconcile the watch brings before the Ready write itself is cached
    /// (the record write's own event) still reads Pending, and must not write
    /// Ready again (in a burst of 2,000 that was 1,700 extra status writes,
    /// each another event for Kueue).
    answered: std::sync::Mutex<HashMap<String, (u32, std::time::Instant)>>,
    /// The end of each recorded admission as the watch delivered it, before any
    /// reconcile ran (see [`EndsSeen`]).
    ends_seen: Arc<EndsSeen>,
    /// Wakes the planner (Hold, status) when a budget's ledger view changed.
    wake_planner: UnboundedSender<()>,
    /// Events on Workloads (a stop for want of credits).
    recorder: Recorder,
    /// Findings seen at the previous reconciliation pass: a finding is acted on
    /// only when it persists, so work in flight (a settlement a moment away) is
    /// not mistaken for drift.
    previous_findings: Mutex<BTreeSet<String>>,
    /// kaccel's ClusterQueues (set when the runtime starts): where the check
    /// reads the class's preference order and Kueue's use of each flavor.
    cluster_queues: std::sync::OnceLock<ManagedCache>,
    /// The Workload cache and its index of open work (set when the runtime
    /// starts): what kaccel itself knows each ClusterQueue holds, which Kueue's
    /// own count in the ClusterQueue's status can lag by a second.
    open_work: std::sync::OnceLock<(Cache<Workload>, Arc<RelevantWorkloads>)>,
    /// The health loop's devices and their holders: posts name the devices a
    /// Workload's pods hold.
    devices: super::health_poller::SharedTracker,
}

impl LedgerRuntime {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        config: LedgerConfig,
        instance: &str,
        field_manager: &str,
        metrics: Metrics,
        shared: Arc<LedgerShared>,
        wake_planner: UnboundedSender<()>,
        devices: super::health_poller::SharedTracker,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: instance.into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Arc::new(LedgerRuntime {
            recorder,
            client,
            instance: instance.into(),
            config,
            field_manager: format!("{field_manager}-credits"),
            metrics,
            shared,
            store: OnceCell::new(),
            reserve_lock: Mutex::new(()),
            balances: Default::default(),
            reserves_appended: Default::default(),
            answered: Default::default(),
            ends_seen: Default::default(),
            wake_planner,
            previous_findings: Mutex::new(BTreeSet::new()),
            cluster_queues: std::sync::OnceLock::new(),
            open_work: std::sync::OnceLock::new(),
            devices,
        })
    }

    /// Runs until aborted (the planner loop aborts it when leadership ends):
    /// opens the store with retries, then the Workload controller and the budget
    /// loop side by side.
    pub async fn run(self: Arc<Self>, cluster_queues: ManagedCache) {
        let _ = self.cluster_queues.set(cluster_queues.clone());
        let url = self.config.store_url();
        let shown = crate::ledger::store::redact_url(&url);
        let mut delay = Duration::from_millis(500);
        loop {
            match Store::open(&url).await {
                Ok(store) => {
                    let _ = self.store.set(store);
                    self.metrics.ledger_up.set(1);
                    tracing::info!(store = %shown, "ledger store open");
                    break;
                }
                Err(e) => {
                    self.metrics.ledger_up.set(0);
                    self.metrics
                        .ledger_errors
                        .get_or_create(&ReasonLabel {
                            reason: "store_unreachable".into(),
                        })
                        .inc();
                    tracing::error!(store = %shown, error = %e, retry_in = ?delay, "cannot open the ledger store; credit checks stay Pending until it answers");
                    self.set_admission_check(Some(&format!(
                        "ledger store {shown} cannot be opened: {e}; kaccel retries, and credit checks stay Pending until it answers"
                    )))
                    .await;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(15));
                }
            }
        }
        self.set_admission_check(None).await;

        let api: Api<Workload> = Api::all(self.client.clone());
        let (trigger_tx, trigger_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        // The cache holds the Workloads the check has work with, each as the
        // typed, slim view it reads (`kueue::workload`): a cluster keeps tens of
        // thousands of finished Workloads, whose pod templates and managed fields
        // would otherwise all stay in memory. Only those are reconciled.
        let writer = kube::runtime::reflector::store::Writer::<Workload>::default();
        let workloads = writer.as_reader();
        let ours = Ours::of(&self.config);
        let relevant = Arc::new(RelevantWorkloads::default());
        let _ = self.open_work.set((workloads.clone(), relevant.clone()));
        let index = relevant.clone();
        let (slim_ours, index_ours, trigger_ours, waiting_ours) =
            (ours.clone(), ours.clone(), ours.clone(), ours.clone());
        let mut cache = CompactingWriter::new(writer, ours);
        let ends = self.ends_seen.clone();
        let watched = watcher(api, watcher::Config::default())
            .backoff(crate::controller::watches::WatchBackoff::default())
            .modify(move |w| slim_workload(w, &slim_ours))
            .inspect_err(|e| tracing::warn!(error = %e, "Workload watch error (retrying)"))
            .inspect_ok(move |event| ends.observe(event))
            .inspect_ok(move |event| index.observe(event, &index_ours))
            .inspect_ok(move |event| cache.apply(event))
            .applied_objects()
            .try_filter(move |w| std::future::ready(worth_caching(w, &trigger_ours)));
        // When credits come back, the Workloads of the index of open work whose
        // check is not answered Ready yet are looked at again: they may fit
        // now. Not every Workload the cluster keeps, nor the ones answered
        // Ready, whose reconcile has nothing to gain from it: when a burst of
        // 2,000 was settled, every budget pass re-queued all that were still
        // open, about 70,000 reconciles in all, each a ledger read.
        let (open_work, open_cache) = (relevant.clone(), workloads.clone());
        let retriggered = super::receiver_stream(trigger_rx).flat_map(move |()| {
            let open: Vec<Result<Workload, watcher::Error>> = open_work
                .keys()
                .iter()
                .filter_map(|key| open_cache.get(key))
                .filter(|w| may_wait_for_credits(w, &waiting_ours))
                .map(|w| Ok(Workload::clone(&w)))
                .collect();
            futures::stream::iter(open)
        });
        // Bounded: unbounded, every Workload listed at start (a cluster's whole
        // history) would get a reconcile future at once, each holding the
        // check's whole state machine, hundreds of MiB for a few 10,000s.
        let controller = Controller::for_stream(
            futures::stream::select(watched, retriggered),
            workloads.clone(),
        )
        .with_config(
            kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
        );
        let ctx = self.clone();
        let workload_task = controller
            .run(
                |obj, ctx: Arc<LedgerRuntime>| async move { ctx.reconcile_workload(obj).await },
                |_obj, err: &LedgerError, ctx: Arc<LedgerRuntime>| {
                    tracing::warn!(error = %err, "credit check reconcile failed; retrying");
                    ctx.metrics
                        .ledger_errors
                        .get_or_create(&ReasonLabel {
                            reason: err.metric_label().into(),
                        })
                        .inc();
                    Action::requeue(Duration::from_secs(2))
                },
                ctx,
            )
            .for_each(|_| async {});
        let budget_task = self
            .clone()
            .budget_loop(workloads, relevant, cluster_queues, trigger_tx);
        tokio::join!(workload_task, budget_task);
    }

    /// Notes that this process set the check of `uid`'s `admission` Ready.
    fn note_answered(&self, uid: &str, admission: u32) {
        let mut answered = self.answered.lock().expect("answered lock");
        // Bounded by admissions in flight: an entry only matters until the
        // cache shows the write.
        answered.retain(|_, (_, at)| at.elapsed() < ANSWER_CACHE_LAG);
        answered.insert(uid.to_string(), (admission, std::time::Instant::now()));
    }

    /// Whether this process set the check of `uid`'s `admission` Ready so
    /// recently that a cached Pending is the cache lagging, not a new question.
    fn recently_answered(&self, uid: &str, admission: u32) -> bool {
        let answered = self.answered.lock().expect("answered lock");
        answered
            .get(uid)
            .is_some_and(|(a, at)| *a == admission && at.elapsed() < ANSWER_CACHE_LAG)
    }

    /// Forgets `uid` once the cache shows kaccel's answer (or it is gone).
    fn forget_answered(&self, uid: &str) {
        self.answered.lock().expect("answered lock").remove(uid);
    }

    fn store(&self) -> &Store {
        self.store
            .get()
            .expect("the store is opened before any task starts")
    }

    async fn append(&self, entries: &[Entry]) -> Result<(), LedgerError> {
        if entries.is_empty() {
            return Ok(());
        }
        match self.store().append(entries).await {
            Ok(outcome) => {
                self.metrics.ledger_up.set(1);
                {
                    let mut cache = self.balances.lock().expect("balances lock");
                    for e in entries {
                        if outcome.duplicates == 0 {
                            if let Some(b) = cache.get_mut(&e.budget) {
                                b.apply(e.kind, e.credits);
                            }
                        } else {
                            // Some were stored already: read the budget again.
                            cache.remove(&e.budget);
                        }
                    }
                }
                if entries.iter().any(|e| e.kind == EntryKind::Reserve) {
                    self.reserves_appended
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                if outcome.inserted > 0 {
                    self.shared.budget_pass_due.notify_one();
                    for e in entries {
                        self.metrics
                            .ledger_entries
                            .get_or_create(&KindLabel {
                                kind: e.kind.as_str().into(),
                            })
                            .inc();
                    }
                }
                Ok(())
            }
            Err(e) => {
                if store_unreachable(&e) {
                    self.metrics.ledger_up.set(0);
                }
                Err(e.into())
            }
        }
    }

    /// Creates kaccel's AdmissionCheck and sets its Active condition (Kueue
    /// treats ClusterQueues whose checks are not Active as inactive). `problem`
    /// makes it inactive with that message.
    async fn set_admission_check(&self, problem: Option<&str>) {
        let api: Api<DynamicObject> =
            Api::all_with(self.client.clone(), &admission_check_resource());
        let name = &self.config.admission_check_name;
        let params = PatchParams::apply(&self.field_manager).force();
        let object = json!({
            "apiVersion": crate::k8s::resources::kueue_api_version(),
            "kind": "AdmissionCheck",
            "metadata": {"name": name, "labels": {crate::k8s::labels::MANAGED_BY_LABEL: self.instance}},
            "spec": {"controllerName": self.config.controller_name},
        });
        if let Err(e) = api.patch(name, &params, &Patch::Apply(&object)).await {
            tracing::warn!(error = %e, admission_check = %name, "cannot write the AdmissionCheck");
            return;
        }
        let (status, reason, message) = match problem {
            None => (
                "True",
                "Active",
                "kaccel charges credits for admissions".to_string(),
            ),
            Some(p) => ("False", "LedgerUnavailable", p.to_string()),
        };
        let status_patch = json!({
            "apiVersion": crate::k8s::resources::kueue_api_version(),
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "status": {"conditions": [{
                "type": "Active", "status": status, "reason": reason, "message": message,
                "lastTransitionTime": rfc3339(now_seconds()),
            }]},
        });
        if let Err(e) = api
            .patch_status(name, &params, &Patch::Apply(&status_patch))
            .await
        {
            tracing::warn!(error = %e, admission_check = %name, "cannot write the AdmissionCheck status");
        }
    }
}

mod admission_check;
mod budget_loop;
mod workload_cache;

use workload_cache::{
    CompactingWriter, Ours, RelevantWorkloads, may_wait_for_credits, slim_workload, worth_caching,
};

/// The end of each recorded admission as the watch delivered it.
///
/// The reconcile reads the cache's latest state, and Kueue rewrites a Workload's
/// conditions when it admits it again: a deactivation (Evicted=True at t) followed
/// within a reconcile's lag by re-activation and re-admission leaves Evicted=False
/// at the re-admission time, and the eviction time is gone. After an API server
/// restart the relist queues every Workload at once and that lag reached seconds,
/// so the charge ran a second past Kueue's. The watch sees every state in order:
/// the first end it shows for an admission is kept here (only while unsettled)
/// and wins over a later "re-admitted" reading.
#[derive(Default)]
pub(crate) struct EndsSeen(std::sync::Mutex<HashMap<String, (u32, Ended)>>);

impl EndsSeen {
    fn observe(&self, event: &watcher::Event<Workload>) {
        let w = match event {
            watcher::Event::Apply(w) | watcher::Event::InitApply(w) => w,
            watcher::Event::Delete(w) => {
                if let Some(uid) = w.uid() {
                    self.0.lock().expect("ends lock").remove(&uid);
                }
                return;
            }
            watcher::Event::Init | watcher::Event::InitDone => return,
        };
        let Some(uid) = w.uid() else {
            return;
        };
        // Only what a re-admission can overwrite (a deactivation, a quota
        // release), and only while kaccel's record is on the Workload: the map
        // holds unsettled admissions, not the cluster's history.
        let Ok(Some(record)) = record_of(w) else {
            self.0.lock().expect("ends lock").remove(&uid);
            return;
        };
        // Only ends a re-admission rewrites are kept, none read from a check.
        let Some(end) = ended_at(w, &record, EVICTED_FOR_ANNOTATION, "").filter(|e| {
            e.reason.starts_with("deactivated") || e.reason.starts_with("quota released")
        }) else {
            return;
        };
        let mut ends = self.0.lock().expect("ends lock");
        match ends.get(&uid) {
            Some((seen, _)) if *seen == record.admission => {}
            _ => {
                ends.insert(uid, (record.admission, end));
            }
        }
    }

    /// The end to settle `admission` with: the one the watch saw first when the
    /// Workload now only says it was admitted again.
    fn settle_with(&self, uid: &str, admission: u32, now_reads: Ended) -> Ended {
        if !now_reads.reason.starts_with("re-admitted") {
            return now_reads;
        }
        match self.0.lock().expect("ends lock").get(uid) {
            Some((a, seen)) if *a == admission => seen.clone(),
            _ => now_reads,
        }
    }

    /// Forgets `uid` once its admission is settled.
    fn settled(&self, uid: &str) {
        self.0.lock().expect("ends lock").remove(uid);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{AcceleratorClassSpec, CreditRate, ModelRate};
    use crate::ledger::lifecycle::RecordedLine;

    /// A deactivated Workload kaccel reconciles only after Kueue admitted it again
    /// (the conditions of the ledger_crash fault test's w044): the eviction the
    /// watch delivered in between is the end, not the re-admission.
    #[test]
    fn an_end_the_watch_saw_wins_over_a_later_re_admitted_reading() {
        let record = ReservationRecord {
            admission: 1,
            budget: "b".into(),
            team: "t".into(),
            cluster_queue: "cq".into(),
            admitted_at: 1_000,
            horizon_seconds: 600,
            lines: vec![RecordedLine {
                flavor: "h100".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 1,
                class: "c".into(),
                model: "H100".into(),
                rate: 3_600_000_000,
                rate_card: "rc".into(),
            }],
        };
        let time = |t: i64| jiff::Timestamp::from_second(t).unwrap().to_string();
        let workload = |active: bool, conditions: Value| -> Workload {
            serde_json::from_value(json!({
                "metadata": {"name": "w044", "uid": "uid-44",
                    "annotations": {RESERVATION_ANNOTATION: record.to_annotation()}},
                "spec": {"active": active},
                "status": {"conditions": conditions}
            }))
            .unwrap()
        };
        let deactivated = workload(
            false,
            json!([
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
                {"type": "Evicted", "status": "True", "reason": "Deactivated", "lastTransitionTime": time(1_013)}
            ]),
        );
        let admitted_again = workload(
            true,
            json!([
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_014)},
                {"type": "Evicted", "status": "False", "reason": "QuotaReserved", "lastTransitionTime": time(1_014)}
            ]),
        );
        let reads_now = ended_at(
            &admitted_again,
            &record,
            EVICTED_FOR_ANNOTATION,
            "kaccel-credits",
        )
        .unwrap();
        assert_eq!(
            (reads_now.at, reads_now.reason.as_str()),
            (1_014, "re-admitted")
        );

        let ends = EndsSeen::default();
        // Without the watch having shown the eviction, the reading stands.
        assert_eq!(ends.settle_with("uid-44", 1, reads_now.clone()).at, 1_014);
        ends.observe(&watcher::Event::Apply(deactivated));
        ends.observe(&watcher::Event::Apply(admitted_again.clone()));
        let settled = ends.settle_with("uid-44", 1, reads_now.clone());
        assert_eq!(settled.at, 1_013, "{settled:?}");
        assert!(settled.reason.starts_with("deactivated"), "{settled:?}");
        // Another admission's end does not apply; a settled one is forgotten.
        assert_eq!(ends.settle_with("uid-44", 2, reads_now.clone()).at, 1_014);
        ends.settled("uid-44");
        assert_eq!(ends.settle_with("uid-44", 1, reads_now.clone()).at, 1_014);
        // A finished reading is never replaced.
        ends.observe(&watcher::Event::Apply(workload(
            false,
            json!([
                {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
                {"type": "Evicted", "status": "True", "reason": "Deactivated", "lastTransitionTime": time(1_013)}
            ]),
        )));
        let finished = Ended {
            at: 1_020,
            platform_preempted: false,
            reason: "finished".into(),
        };
        assert_eq!(ends.settle_with("uid-44", 1, finished.clone()), finished);
        // A deleted Workload is forgotten.
        ends.observe(&watcher::Event::Delete(admitted_again));
        assert_eq!(ends.settle_with("uid-44", 1, reads_now).at, 1_014);
    }

    fn snapshot_with_class(per_device_hour: &str, overrides: &[(&str, &str)]) -> PricingSnapshot {
        let spec: AcceleratorClassSpec = serde_json::from_value(json!({
            "sharing": "Whole",
            "credits": { "perDeviceHour": "1" }
        }))
        .unwrap();
        let spec = AcceleratorClassSpec {
            topology: None,
            credits: CreditRate {
                per_device_hour: per_device_hour.into(),
                model_overrides: overrides
                    .iter()
                    .map(|(m, r)| ModelRate {
                        model: m.to_string(),
                        per_device_hour: r.to_string(),
                    })
                    .collect(),
            },
            ..spec
        };
        PricingSnapshot {
            ready: true,
            classes: [(
                "gpus".to_string(),
                ClassRates::parse(&spec.credits, Some(1)),
            )]
            .into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_class_with_an_unusable_rate_rejects_naming_the_fields_and_fix() {
        let bad = snapshot_with_class("abc", &[("*H100*", "2000000000")]);
        let message = bad.rate_problem("gpus").expect("a bad rate is a problem");
        for needle in [
            "AcceleratorClass gpus",
            "spec.credits.perDeviceHour: \"abc\" is not a credit amount",
            "e.g. \"2.5\"",
            "spec.credits.modelOverrides[0].perDeviceHour",
            "use a smaller credit unit",
            "fix the class",
        ] {
            assert!(message.contains(needle), "{needle:?} missing: {message}");
        }
        assert_eq!(
            snapshot_with_class("2.5", &[("*H100*", "6")]).rate_problem("gpus"),
            None
        );
        assert_eq!(bad.rate_problem("no-such-class"), None);
    }
}
