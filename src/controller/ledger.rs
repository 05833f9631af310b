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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store as Cache};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::{Mutex, Notify, OnceCell, mpsc::UnboundedSender};

use super::config::Ledger as LedgerConfig;
use super::health_poller::{EVICTED_FOR_ANNOTATION, now_seconds};
use super::metrics::{BudgetLabel, DecisionLabel, KindLabel, Metrics, ReasonLabel};
use crate::api::{
    AcceleratorClassSpec, CreditBudgetSpec, Credits, ExhaustionPolicy, RenewalShortPolicy,
    ShortPolicy,
};
use crate::kueue::workload::Workload;
use crate::ledger::admission::{
    AdmissionError, BudgetView, Decision, FlavorUsage, WorkloadView, admission_number, decide,
    horizon_seconds, rate_info, reservation, usage_from_workload,
};
use crate::ledger::budget::{
    budget_entries, burn_rate_per_hour, current_period, is_exhausted, projected_exhaustion,
};
use crate::ledger::charge::{Charge, ChargeState, Renewal, RenewalRule};
use crate::ledger::entry::{Balances, Entry, EntryKind, format_micros, void_key};
use crate::ledger::export::rfc3339;
use crate::ledger::lifecycle::{
    FINALIZER, RESERVATION_ANNOTATION, RESERVATION_ANNOTATION_POINTER, ReservationRecord,
    STOPPED_ANNOTATION, check_state, condition, deletion_time, ended_at, evicted_since_admission,
    holds_quota, is_finished, record_of,
};
use crate::ledger::pricing::rate_errors;
use crate::ledger::store::{LedgerStore, OpenReservation, Store, StoreError};

/// What the planner knows that the check needs to price an admission; replaced
/// after every plan.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PricingSnapshot {
    /// False until the first plan ran.
    pub ready: bool,
    /// ResourceFlavor name -> device model.
    pub flavor_models: BTreeMap<String, String>,
    /// AcceleratorClass name -> (spec, generation).
    pub classes: BTreeMap<String, (AcceleratorClassSpec, Option<i64>)>,
    /// ClusterQueue name -> (budget, class).
    pub queues: BTreeMap<String, (String, String)>,
    /// CreditBudget name -> spec.
    pub budgets: BTreeMap<String, CreditBudgetSpec>,
}

impl PricingSnapshot {
    /// Why `class` cannot price any admission (a rate field that does not parse or
    /// is too large, which an older CRD without the CEL rule lets in), naming
    /// the fields and the fix; `None` when every rate of the class prices.
    pub fn rate_problem(&self, class: &str) -> Option<String> {
        let (spec, _) = self.classes.get(class)?;
        let errors = rate_errors(&spec.credits);
        (!errors.is_empty()).then(|| {
            let fields: Vec<String> = errors.iter().map(|(f, p)| format!("{f}: {p}")).collect();
            format!(
                "AcceleratorClass {class} has no usable credit rate ({}): fix the class (it is marked Invalid), then submit the Workload again",
                fields.join("; ")
            )
        })
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

pub fn workload_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        crate::kueue::GROUP,
        crate::kueue::VERSION,
        "Workload",
    ))
}

fn admission_check_resource() -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        crate::kueue::GROUP,
        crate::kueue::VERSION,
        "AdmissionCheck",
    ))
}

/// Everything the ledger tasks share.
pub struct LedgerRuntime {
    client: Client,
    config: LedgerConfig,
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
    /// Wakes the planner (Hold, status) when a budget's ledger view changed.
    wake_planner: UnboundedSender<()>,
    /// Events on Workloads (a stop for want of credits).
    recorder: Recorder,
    /// Findings seen at the previous reconciliation pass: a finding is acted on
    /// only when it persists, so work in flight (a settlement a moment away) is
    /// not mistaken for drift.
    previous_findings: Mutex<BTreeSet<String>>,
}

impl LedgerRuntime {
    pub fn new(
        client: Client,
        config: LedgerConfig,
        field_manager: &str,
        metrics: Metrics,
        shared: Arc<LedgerShared>,
        wake_planner: UnboundedSender<()>,
    ) -> Arc<Self> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "kaccel".into(),
                instance: std::env::var("POD_NAME").ok(),
            },
        );
        Arc::new(LedgerRuntime {
            recorder,
            client,
            config,
            field_manager: format!("{field_manager}-credits"),
            metrics,
            shared,
            store: OnceCell::new(),
            reserve_lock: Mutex::new(()),
            balances: Default::default(),
            reserves_appended: Default::default(),
            wake_planner,
            previous_findings: Mutex::new(BTreeSet::new()),
        })
    }

    /// Runs until aborted (the planner loop aborts it when leadership ends):
    /// opens the store with retries, then the Workload controller and the budget
    /// loop side by side.
    pub async fn run(self: Arc<Self>, cluster_queues: Cache<DynamicObject>) {
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
        // The cache holds each Workload as the typed, slim view the check reads
        // (`kueue::workload`): a cluster keeps tens of thousands of finished
        // Workloads, whose pod templates and managed fields would otherwise all
        // stay in memory.
        let writer = kube::runtime::reflector::store::Writer::<Workload>::default();
        let workloads = writer.as_reader();
        let check = self.config.admission_check_name.clone();
        let relevant = Arc::new(RelevantWorkloads::default());
        let index = relevant.clone();
        let index_check = check.clone();
        let stream = watcher(api, watcher::Config::default())
            .modify(move |w| slim_workload(w, &check))
            .inspect_ok(move |event| index.observe(event, &index_check))
            .reflect(writer)
            .applied_objects();
        // Bounded: unbounded, every Workload listed at start (a cluster's whole
        // history) would get a reconcile future at once, each holding the
        // check's whole state machine, hundreds of MiB for a few 10,000s.
        let controller = Controller::for_stream(stream, workloads.clone())
            .with_config(
                kube::runtime::controller::Config::default().concurrency(RECONCILE_CONCURRENCY),
            )
            .reconcile_all_on(super::receiver_stream(trigger_rx));
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
            "apiVersion": format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION),
            "kind": "AdmissionCheck",
            "metadata": {"name": name, "labels": {crate::plan::MANAGED_BY_LABEL: crate::plan::MANAGED_BY}},
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
            "apiVersion": format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION),
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

    // ------------------------------------------------------------ workloads

    async fn reconcile_workload(&self, obj: Arc<Workload>) -> Result<Action, LedgerError> {
        let v = obj.to_value();
        let namespace = obj.namespace().unwrap_or_default();
        let name = obj.name_any();
        let shown = format!("{namespace}/{name}");
        let uid = obj.uid().unwrap_or_default();
        let check = check_state(&v, &self.config.admission_check_name);
        let has_finalizer = obj.finalizers().iter().any(|f| f == FINALIZER);
        if check.is_none() && !has_finalizer {
            return Ok(Action::await_change());
        }
        let record = record_of(&v).map_err(|message| LedgerError::BadWorkload {
            workload: shown.clone(),
            message: format!("{message}; remove the annotation to let kaccel charge it again"),
        })?;
        let now = now_seconds();
        let pricing = self.shared.pricing();
        let mut requeue: Option<i64> = None;

        // 1. The recorded admission: renewals and periodic posts while it runs, or
        // the settlement once it ended.
        let mut recorded: Option<(Charge, ChargeState)> = None;
        if let Some(rec) = &record {
            let entries = self.store().entries_for_workload(&uid).await?;
            let charge = rec.charge(&namespace, &name, &uid);
            let mut state = ChargeState::of(&charge, entries.iter().map(|s| &s.entry));
            if state.terms > 0 && !state.voided {
                match ended_at(&v, rec, EVICTED_FOR_ANNOTATION) {
                    Some(end) => {
                        let mut out = charge.settle(&state, &end, now);
                        let refunds = pricing
                            .budgets
                            .get(&rec.budget)
                            .is_some_and(|b| b.admission.refund_preemption);
                        if refunds {
                            state.apply(&charge, &out);
                            out.extend(charge.preemption_refunds(&state.posted, &end));
                        }
                        self.append(&out).await?;
                        tracing::info!(workload = %shown, admission = rec.admission, ended = %end.reason, "settled");
                        // Credits came back: waiting Workloads may fit now.
                        let _ = self.wake_planner.send(());
                    }
                    None => {
                        // A Workload kaccel (or anyone) deactivated is on its way
                        // out: no renewal; what it still uses is charged as overrun.
                        let active = v
                            .pointer("/spec/active")
                            .and_then(Value::as_bool)
                            .unwrap_or(true);
                        let renews = active && !is_bounded(&v);
                        if renews && now >= charge.renewal_due_at(state.terms) {
                            self.renew(&v, &charge, &mut state, &pricing, now).await?;
                        }
                        let (posts, next_post) =
                            charge.due_posts(&state, now, self.config.post_interval_seconds);
                        self.append(&posts).await?;
                        state.apply(&charge, &posts);
                        let next_renewal = charge.renewal_due_at(state.terms);
                        requeue = Some(if renews && next_renewal > now {
                            next_post.min(next_renewal)
                        } else {
                            next_post
                        });
                    }
                }
            }
            if state.terms > 0 {
                recorded = Some((charge, state));
            }
        }

        // 2. Answer a Pending check of a Workload holding quota.
        let finished = is_finished(&v);
        let deleting = deletion_time(&v).is_some();
        if let Some((state, message)) = check
            && matches!(state, "Pending")
            && holds_quota(&v)
            && !finished
            && !deleting
            && !evicted_since_admission(&v)
        {
            let admission = admission_number(&v).map_err(|source| LedgerError::Admission {
                workload: shown.clone(),
                source,
            })?;
            match (&record, &recorded) {
                (Some(rec), Some((charge, _))) if rec.admission == admission => {
                    // Reserved before a crash (or the cache lags the check write).
                    self.set_check(&v, "Ready", &ready_note(rec, charge, &v), None)
                        .await?;
                }
                _ => {
                    if let Some(after) = self
                        .decide(&v, &shown, &uid, admission, message, &pricing, now)
                        .await?
                    {
                        requeue = Some(requeue.map_or(after, |r| r.min(after)));
                    }
                }
            }
        }

        // 3. The finalizer goes once a finished or deleted Workload is settled
        // (a failed settlement returned early above).
        if has_finalizer && (finished || deleting) {
            self.release(&v).await?;
        }

        Ok(match requeue {
            Some(at) => Action::requeue(Duration::from_secs(
                at.saturating_sub(now).clamp(1, 3600) as u64
            )),
            None => Action::await_change(),
        })
    }

    /// Prices the admission and reserves, waits or rejects. Returns when to look
    /// again (unix seconds) while waiting.
    #[allow(clippy::too_many_arguments)]
    async fn decide(
        &self,
        v: &Value,
        shown: &str,
        uid: &str,
        admission: u32,
        current_message: &str,
        pricing: &PricingSnapshot,
        now: i64,
    ) -> Result<Option<i64>, LedgerError> {
        let retry_at = now + i64::from(self.config.retry_after_seconds);
        let cluster_queue = v
            .pointer("/status/admission/clusterQueue")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let Some((budget_name, class_name)) = pricing.queues.get(cluster_queue) else {
            if pricing.ready {
                let note = format!(
                    "ClusterQueue {cluster_queue:?} is not one kaccel generated for a CreditBudget: no budget pays for it"
                );
                self.set_check(v, "Pending", &note, None).await?;
            }
            return Ok(Some(retry_at));
        };
        let Some(budget) = pricing.budgets.get(budget_name) else {
            return Ok(Some(retry_at));
        };
        if let Some(message) = pricing.rate_problem(class_name) {
            return self.reject(v, &message).await;
        }
        let usage = usage_from_workload(v).map_err(|source| LedgerError::Admission {
            workload: shown.to_string(),
            source,
        })?;
        // A flavor the last plan did not know yet (just created): look again soon.
        if usage
            .iter()
            .any(|u| !pricing.flavor_models.contains_key(&u.flavor))
        {
            return Ok(Some(now + 2));
        }
        let default_horizon = budget
            .admission
            .default_horizon_seconds
            .unwrap_or(self.config.default_horizon_seconds);
        let horizon = horizon_seconds(v, default_horizon);
        let rates = |u: &FlavorUsage| {
            let model = pricing.flavor_models.get(&u.flavor)?;
            let (spec, generation) = pricing.classes.get(class_name)?;
            // Cannot fail: rate_problem above rejected every rate that does not
            // parse (pricing's rate_errors_agree_with_resolve_rate).
            rate_info(class_name, spec, *generation, model).ok()
        };
        // Too large to price (overflow) is a property of the admission: retrying
        // cannot help, so the Workload is rejected with the reason.
        let priced = match reservation(&usage, &rates, horizon) {
            Ok(priced) => priced,
            Err(e) => {
                let message = format!(
                    "cannot price this admission: {e}; ask for fewer devices or a shorter spec.maximumExecutionTimeSeconds"
                );
                return self.reject(v, &message).await;
            }
        };
        let admitted_at = match condition(v, "QuotaReserved") {
            Some((true, Some(t), _)) => t,
            _ => now,
        };
        let (namespace, name) = namespace_and_name(v);
        let workload = WorkloadView {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
            admission,
            admitted_at,
            now,
        };
        let guard = self.reserve_lock.lock().await;
        let balances = self.balances_of(budget_name).await?;
        let view = BudgetView {
            budget: budget_name.clone(),
            team: budget.team.clone(),
            balances,
        };
        match decide(&view, &workload, &priced) {
            Decision::Reserve { entries } => {
                let record = (!entries.is_empty()).then(|| {
                    ReservationRecord::from_lines(
                        admission,
                        budget_name,
                        &budget.team,
                        cluster_queue,
                        admitted_at,
                        horizon,
                        &priced.lines,
                    )
                });
                if let Some(record) = &record {
                    // The record (and finalizer) first: once the Reserve entry exists,
                    // the Workload cannot go away unsettled.
                    self.set_record(v, record).await?;
                    self.append(&entries).await?;
                }
                drop(guard);
                let note = match &record {
                    Some(record) => ready_note(
                        record,
                        &record.charge(&workload.namespace, &workload.name, uid),
                        v,
                    ),
                    None => "no accelerator devices to charge".to_string(),
                };
                self.set_check(v, "Ready", &note, None).await?;
                self.count_decision("reserve");
                let latency = (k8s_openapi::jiff::Timestamp::now().as_millisecond() as f64
                    / 1000.0
                    - admitted_at as f64)
                    .max(0.0);
                self.metrics.check_latency.observe(latency);
                let _ = self.wake_planner.send(());
                Ok(None)
            }
            Decision::Wait { message } => {
                drop(guard);
                self.count_decision("wait");
                match budget.admission.when_short {
                    ShortPolicy::Retry => {
                        self.set_check(v, "Retry", &message, Some(self.config.retry_after_seconds))
                            .await?;
                        Ok(None)
                    }
                    ShortPolicy::Pending => {
                        if message != current_message {
                            self.set_check(v, "Pending", &message, None).await?;
                        }
                        Ok(Some(retry_at))
                    }
                }
            }
            Decision::Reject { message } => {
                drop(guard);
                self.reject(v, &message).await
            }
        }
    }

    /// A budget's balances from the cache, or the store when not cached. Callers
    /// hold `reserve_lock` when they decide on the figures.
    async fn balances_of(&self, budget: &str) -> Result<Balances, LedgerError> {
        let cached = self
            .balances
            .lock()
            .expect("balances lock")
            .get(budget)
            .copied();
        if let Some(b) = cached {
            return Ok(b);
        }
        let b = self.store().balances(budget).await?;
        self.balances
            .lock()
            .expect("balances lock")
            .insert(budget.to_string(), b);
        Ok(b)
    }

    /// Reserves the next term of a running admission if its budget covers it (or
    /// allows the overdraft); else stops the Workload through Kueue.
    async fn renew(
        &self,
        v: &Value,
        charge: &Charge,
        state: &mut ChargeState,
        pricing: &PricingSnapshot,
        now: i64,
    ) -> Result<(), LedgerError> {
        let rule = pricing
            .budgets
            .get(&charge.owner.budget)
            .map(|b| renewal_rule(&b.admission))
            .unwrap_or_default();
        let guard = self.reserve_lock.lock().await;
        let balances = self.balances_of(&charge.owner.budget).await?;
        match charge.decide_renewal(state.terms, &balances, rule, now) {
            Renewal::Renew { entries, overdraft } => {
                self.append(&entries).await?;
                drop(guard);
                state.apply(charge, &entries);
                self.count_decision(if overdraft {
                    "renew_overdraft"
                } else {
                    "renew"
                });
                if overdraft {
                    tracing::warn!(budget = %charge.owner.budget, workload = %charge.owner.workload, "reservation renewed into an overdraft");
                }
                let _ = self.wake_planner.send(());
            }
            Renewal::Stop { message } => {
                drop(guard);
                let drains = pricing
                    .budgets
                    .get(&charge.owner.budget)
                    .is_some_and(|b| b.on_exhaustion == ExhaustionPolicy::HoldAndDrain);
                if drains {
                    // HoldAndDrain: the Workload runs on, charged as used (overrun),
                    // until its spending uses up the grant and the queue drains
                    // (Kueue evicts and requeues it; a top-up brings it back).
                    self.count_decision("await_drain");
                    tracing::info!(workload = %charge.owner.workload, %message, "renewal not covered; HoldAndDrain will stop it when the grant is spent");
                } else {
                    self.count_decision("stop");
                    self.stop_workload(v, &message).await?;
                }
            }
        }
        Ok(())
    }

    /// Deactivates a Workload whose renewal the budget cannot cover (Kueue evicts
    /// it and stops counting it), with the reason in an annotation and an Event.
    async fn stop_workload(&self, v: &Value, message: &str) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let patch = json!({
            "metadata": {"annotations": {STOPPED_ANNOTATION: message}},
            "spec": {"active": false},
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|source| LedgerError::Api {
                action: format!("stopping Workload {namespace}/{name} for want of credits"),
                source,
            })?;
        self.metrics.write("Workload", "stop");
        tracing::warn!(workload = %format!("{namespace}/{name}"), %message, "stopped a Workload its budget cannot cover");
        let reference = ObjectReference {
            api_version: Some(format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION)),
            kind: Some("Workload".into()),
            namespace: Some(namespace.into()),
            name: Some(name.into()),
            uid: v
                .pointer("/metadata/uid")
                .and_then(Value::as_str)
                .map(str::to_string),
            ..Default::default()
        };
        let event = Event {
            type_: EventType::Warning,
            reason: "CreditsExhausted".into(),
            note: Some(message.chars().take(1000).collect()),
            action: "StopWorkload".into(),
            secondary: None,
        };
        super::publish_event(&self.recorder, &self.metrics, &event, &reference).await;
        Ok(())
    }

    async fn reject(&self, v: &Value, message: &str) -> Result<Option<i64>, LedgerError> {
        self.count_decision("reject");
        self.set_check(v, "Rejected", message, None).await?;
        Ok(None)
    }

    fn count_decision(&self, decision: &str) {
        self.metrics
            .check_decisions
            .get_or_create(&DecisionLabel {
                decision: decision.into(),
            })
            .inc();
    }

    /// Writes kaccel's check state on the Workload (server-side apply of its own
    /// entry of the `admissionChecks` map list; other checks are untouched).
    async fn set_check(
        &self,
        v: &Value,
        state: &str,
        message: &str,
        requeue_after: Option<u32>,
    ) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let check = &self.config.admission_check_name;
        let current = check_state(v, check);
        if current == Some((state, message)) && state != "Retry" {
            return Ok(());
        }
        // The transition time moves only when the state does.
        let transition = match current {
            Some((s, _)) if s == state => v
                .pointer("/status/admissionChecks")
                .and_then(Value::as_array)
                .and_then(|a| a.iter().find(|c| c["name"] == check.as_str()))
                .and_then(|c| c["lastTransitionTime"].as_str())
                .map(str::to_string)
                .unwrap_or_else(|| rfc3339(now_seconds())),
            _ => rfc3339(now_seconds()),
        };
        let mut entry = json!({
            "name": check,
            "state": state,
            "message": message.chars().take(4000).collect::<String>(),
            "lastTransitionTime": transition,
        });
        if let Some(after) = requeue_after {
            entry["requeueAfterSeconds"] = json!(after);
        }
        let patch = json!({
            "apiVersion": format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION),
            "kind": "Workload",
            "metadata": {"name": name, "namespace": namespace},
            "status": {"admissionChecks": [entry]},
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch_status(
            name,
            &PatchParams::apply(&self.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| LedgerError::Api {
            action: format!("setting the credit check {state} on Workload {namespace}/{name}"),
            source,
        })?;
        self.metrics.write("Workload", "check");
        Ok(())
    }

    /// Sets kaccel's finalizer and reservation record on a Workload, by
    /// server-side apply of just those two fields.
    async fn set_record(&self, v: &Value, record: &ReservationRecord) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let patch = json!({
            "apiVersion": format!("{}/{}", crate::kueue::GROUP, crate::kueue::VERSION),
            "kind": "Workload",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "finalizers": [FINALIZER],
                "annotations": {RESERVATION_ANNOTATION: record.to_annotation()},
            },
        });
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        api.patch(
            name,
            &PatchParams::apply(&self.field_manager).force(),
            &Patch::Apply(&patch),
        )
        .await
        .map_err(|source| LedgerError::Api {
            action: format!("writing kaccel's finalizer on Workload {namespace}/{name}"),
            source,
        })?;
        self.metrics.write("Workload", "finalizer");
        Ok(())
    }

    /// Removes kaccel's finalizer and record from a settled Workload. A JSON patch
    /// of exactly those entries, guarded by the resourceVersion read: releasing by
    /// server-side apply left the finalizer behind whenever another writer had
    /// re-sent the list meanwhile (Kueue drops its own finalizer with a patch of
    /// the whole list, which makes it a co-owner of ours). A stale read fails the
    /// test and is retried.
    async fn release(&self, v: &Value) -> Result<(), LedgerError> {
        let (namespace, name) = namespace_and_name(v);
        let Some(index) = v
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .and_then(|f| f.iter().position(|f| f == FINALIZER))
        else {
            return Ok(());
        };
        let mut ops = vec![
            json!({"op": "test", "path": "/metadata/resourceVersion",
                   "value": v.pointer("/metadata/resourceVersion")}),
            json!({"op": "remove", "path": format!("/metadata/finalizers/{index}")}),
        ];
        if v.pointer("/metadata/annotations")
            .and_then(|a| a.get(RESERVATION_ANNOTATION))
            .is_some()
        {
            ops.push(json!({"op": "remove", "path": RESERVATION_ANNOTATION_POINTER}));
        }
        let patch = serde_json::from_value(Value::Array(ops)).expect("a valid JSON patch");
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), namespace, &workload_resource());
        match api
            .patch(name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await
        {
            Ok(_) => {}
            // Gone already (its finalizer was the last): nothing to remove.
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(source) => {
                return Err(LedgerError::Api {
                    action: format!("removing kaccel's finalizer from Workload {namespace}/{name}"),
                    source,
                });
            }
        }
        self.metrics.write("Workload", "finalizer");
        Ok(())
    }

    // ------------------------------------------------------------ budgets

    async fn budget_loop(
        self: Arc<Self>,
        workloads: Cache<Workload>,
        relevant: Arc<RelevantWorkloads>,
        cluster_queues: Cache<DynamicObject>,
        retrigger: UnboundedSender<()>,
    ) {
        // The reconciliation compares the ledger with the Workload cache: before it
        // is filled, every open reservation would look orphaned.
        let _ = workloads.wait_until_ready().await;
        let _ = cluster_queues.wait_until_ready().await;
        let mut tick =
            tokio::time::interval(Duration::from_secs(self.config.budget_interval_seconds));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = self.shared.budget_pass_due.notified() => {}
            }
            let pricing = self.shared.pricing();
            if !pricing.ready {
                continue;
            }
            let started = std::time::Instant::now();
            let cpu_started = super::metrics::process_cpu_seconds();
            let before = self.shared.budget_views();
            // Grants, top-ups and expiries carry no workload: one query per pass
            // finds those of every budget (a few per period each).
            let budget_level = self.store().entries_for_workload("").await.map(|rows| {
                let mut by_budget: BTreeMap<String, BTreeMap<String, Entry>> = BTreeMap::new();
                for s in rows {
                    by_budget
                        .entry(s.entry.budget.clone())
                        .or_default()
                        .insert(s.entry.key.clone(), s.entry);
                }
                by_budget
            });
            let mut views = BTreeMap::new();
            for (name, spec) in &pricing.budgets {
                // (store unreachable, message) on failure.
                let tick = match &budget_level {
                    Ok(by_budget) => {
                        let none = BTreeMap::new();
                        let known = by_budget.get(name).unwrap_or(&none);
                        self.budget_tick(name, spec, known).await.map_err(|e| {
                            let unreachable =
                                matches!(&e, LedgerError::Store(s) if store_unreachable(s));
                            (unreachable, e.to_string())
                        })
                    }
                    Err(e) => Err((store_unreachable(e), format!("ledger store: {e}"))),
                };
                let view = match tick {
                    Ok(view) => {
                        self.metrics.ledger_up.set(1);
                        view
                    }
                    Err((unreachable, message)) => {
                        if unreachable {
                            self.metrics.ledger_up.set(0);
                        }
                        tracing::warn!(budget = %name, error = %message, "budget ledger pass failed; retrying");
                        let mut view = before.get(name).cloned().unwrap_or_default();
                        view.error = Some(message);
                        view
                    }
                };
                self.metrics
                    .budget_remaining
                    .get_or_create(&BudgetLabel {
                        budget: name.clone(),
                    })
                    .set(i64::try_from(view.balances.remaining()).unwrap_or(i64::MAX));
                views.insert(name.clone(), view);
            }
            match self
                .reconcile_with_kueue(&pricing, &workloads, &relevant, &cluster_queues)
                .await
            {
                Ok(findings) => {
                    for (name, view) in views.iter_mut() {
                        view.drift = findings.get(name).cloned().unwrap_or_default();
                        self.metrics
                            .ledger_drift
                            .get_or_create(&BudgetLabel {
                                budget: name.clone(),
                            })
                            .set(view.drift.len() as i64);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "reconciliation against Kueue failed; retrying")
                }
            }
            self.metrics
                .budget_pass_duration
                .observe(started.elapsed().as_secs_f64());
            self.metrics
                .budget_pass_cpu
                .observe(super::metrics::process_cpu_seconds() - cpu_started);
            let credits_returned = views.iter().any(|(name, v)| {
                before
                    .get(name)
                    .is_none_or(|b| v.balances.remaining() > b.balances.remaining())
            });
            if views != before {
                *self.shared.budgets.write().expect("budgets lock") = views;
                let _ = self.wake_planner.send(());
            }
            if credits_returned {
                // A top-up, a new period or a settlement: waiting Workloads may fit.
                let _ = retrigger.send(());
            }
        }
    }

    /// Grants, expiries and top-ups due now, then the budget's figures.
    /// `known`: the budget's grants, top-ups and expiries, by key.
    async fn budget_tick(
        &self,
        name: &str,
        spec: &CreditBudgetSpec,
        known: &BTreeMap<String, Entry>,
    ) -> Result<BudgetLedgerView, LedgerError> {
        let now = now_seconds();
        let store = self.store();
        let window = current_period(&spec.credits, now);
        let before = self
            .reserves_appended
            .load(std::sync::atomic::Ordering::SeqCst);
        let balances = store.balances(name).await?;
        let mut error = None;
        let mut balances = balances;
        match budget_entries(name, spec, now, &|k: &str| known.get(k).cloned(), balances) {
            Ok(entries) if !entries.is_empty() => {
                self.append(&entries).await?;
                balances = store.balances(name).await?;
            }
            Ok(_) => {}
            Err(e) => error = Some(e.to_string()),
        }
        {
            // The store's figures become the cache's, unless a Reserve went in
            // meanwhile (then the next pass refreshes).
            let _guard = self.reserve_lock.lock().await;
            if self
                .reserves_appended
                .load(std::sync::atomic::Ordering::SeqCst)
                == before
            {
                self.balances
                    .lock()
                    .expect("balances lock")
                    .insert(name.to_string(), balances);
            }
        }
        let posted = store.posted_between(name, now - 86_400, now + 1).await?;
        let burn = burn_rate_per_hour(posted);
        Ok(BudgetLedgerView {
            balances,
            burn_per_hour: burn,
            // Projected from the start of the hour, so the status (and its write)
            // changes only when the figures do, or once an hour, not every pass.
            projected_exhaustion: projected_exhaustion(
                now - now.rem_euclid(3600),
                balances.remaining(),
                burn,
            ),
            period: window.map(|w| (w.start, w.end)),
            exhausted: is_exhausted(spec.on_exhaustion, &balances),
            error,
            drift: vec![],
        })
    }

    /// Open reservations against Workloads holding quota, and device units per
    /// (ClusterQueue, flavor) against Kueue's reservations. A finding seen at two
    /// passes in a row is drift: an orphaned reservation is closed with a Void
    /// entry that says why, and every finding goes to the budget's condition and
    /// the drift metric.
    async fn reconcile_with_kueue(
        &self,
        pricing: &PricingSnapshot,
        workloads: &Cache<Workload>,
        relevant: &RelevantWorkloads,
        cluster_queues: &Cache<DynamicObject>,
    ) -> Result<BTreeMap<String, Vec<String>>, LedgerError> {
        let open = self.store().open_reservations().await?;
        self.metrics
            .ledger_open_reservations
            .set(i64::try_from(open.len()).unwrap_or(i64::MAX));
        let check = &self.config.admission_check_name;
        // Only Workloads the comparison can count (a charged one carries the
        // finalizer; one waiting on the check holds quota), looked up by the index
        // the watch keeps: finished history, which a cluster keeps by the ten
        // thousand, is not even visited.
        let relevant: Vec<Value> = relevant
            .keys()
            .iter()
            .filter_map(|key| workloads.get(key))
            .filter_map(|w| ledger_relevant(&w, check))
            .collect();
        let queues: Vec<Value> = cluster_queues
            .state()
            .iter()
            .map(|q| serde_json::to_value(q.as_ref()).expect("objects serialise"))
            .collect();
        let found = crate::ledger::reconcile::compare(
            &open,
            &relevant,
            &queues,
            &pricing
                .queues
                .iter()
                .map(|(q, (budget, _))| (q.clone(), budget.clone()))
                .collect(),
            &self.config.admission_check_name,
        );
        let mut findings: BTreeMap<String, Vec<(String, Option<OpenReservation>)>> =
            BTreeMap::new();
        for f in found {
            findings
                .entry(f.budget)
                .or_default()
                .push((f.message, f.orphan));
        }

        // Act only on findings seen twice in a row.
        let mut previous = self.previous_findings.lock().await;
        let now_set: BTreeSet<String> = findings
            .values()
            .flatten()
            .map(|(text, _)| text.clone())
            .collect();
        let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (budget, list) in &findings {
            for (text, orphan) in list {
                if !previous.contains(text) {
                    continue;
                }
                if let Some(r) = orphan {
                    self.close_orphan(r).await?;
                }
                out.entry(budget.clone()).or_default().push(text.clone());
            }
        }
        *previous = now_set;
        Ok(out)
    }

    /// Closes a reservation whose Workload is gone (its finalizer was removed by
    /// hand, or the ledger was restored from a backup): what was posted stands,
    /// the rest is voided by an entry that says so.
    async fn close_orphan(&self, r: &OpenReservation) -> Result<(), LedgerError> {
        let e = &r.reserve.entry;
        // Closing is final: ask the API server, not the cache, whether it is gone.
        let api: Api<Workload> = Api::namespaced(self.client.clone(), &e.namespace);
        match api.get_opt(&e.workload).await {
            Ok(Some(mut w)) if w.uid().as_deref() == Some(e.workload_uid.as_str()) => {
                // Still there, but not charged by kaccel's finalizer any more
                // (removed by hand before settlement): settle it from the whole
                // object, as its own reconcile would have, since the cache keeps
                // a finished, unfinalized Workload as identity only.
                slim_view(&mut w);
                if w.is_true("Finished") || w.metadata.deletion_timestamp.is_some() {
                    tracing::warn!(key = %e.key, "settling a finished Workload whose finalizer was removed before its settlement");
                    self.reconcile_workload(Arc::new(w)).await?;
                } else {
                    tracing::info!(key = %e.key, "reservation looked orphaned but its Workload exists; left open");
                }
                return Ok(());
            }
            Ok(_) => {}
            Err(source) => {
                return Err(LedgerError::Api {
                    action: format!(
                        "checking Workload {}/{} before closing its reservation",
                        e.namespace, e.workload
                    ),
                    source,
                });
            }
        }
        let rest = r.open();
        let mut void = e.clone();
        void.key = void_key(&e.line());
        void.kind = EntryKind::Void;
        void.start = r.posted_until.max(e.start);
        void.end = void.start;
        void.credits = i64::try_from(rest.max(0)).unwrap_or(0);
        void.reason = format!(
            "reconciliation: Workload {}/{} is gone without settlement; usage after {} is not charged ({} credits released)",
            e.namespace,
            e.workload,
            rfc3339(void.start),
            format_micros(rest.max(0))
        );
        void.created_at = now_seconds();
        tracing::warn!(key = %e.key, "closing an orphaned reservation");
        self.append(&[void]).await
    }
}

/// What the credit check keeps of a Workload in its cache.
///
/// - Charged (kaccel's finalizer), or holding quota unfinished with kaccel's
///   check on it: the typed view less what deserialising could not skip
///   (managed fields, labels, foreign annotations, CPU and memory usage).
/// - Anything else, identity only: a Workload waiting for quota, one without
///   kaccel's check, and finished history whose settlement is done (the
///   finalizer gone). The reconcile has nothing to do for those and the budget
///   pass skips them; they are what a cluster keeps by the ten thousand. A
///   change brings the whole object again with its watch event, so one that
///   gets quota is cached whole then.
fn slim_workload(w: &mut Workload, check: &str) {
    let working = w.has_check(check) && w.is_true("QuotaReserved") && !w.is_true("Finished");
    if w.has_finalizer(FINALIZER) || working {
        slim_view(w);
    } else {
        w.keep_identity_only();
    }
}

/// The keys of the Workloads the reconciliation against Kueue compares
/// ([`ledger_relevant`]), kept from the watch's events so a budget pass costs in
/// proportion to open work, not to every Workload the cluster keeps.
#[derive(Default)]
struct RelevantWorkloads {
    state: std::sync::Mutex<RelevantState>,
}

#[derive(Default)]
struct RelevantState {
    keys: std::collections::HashSet<ObjectRef<Workload>>,
    /// Filled during a (re-)list and swapped in when it is done, as the
    /// reflector does with its store: a Workload deleted while the watch was
    /// down is not in the new list.
    relisting: Option<std::collections::HashSet<ObjectRef<Workload>>>,
}

impl RelevantWorkloads {
    fn observe(&self, event: &watcher::Event<Workload>, check: &str) {
        let mut state = self.state.lock().expect("relevant index lock");
        match event {
            watcher::Event::Init => state.relisting = Some(Default::default()),
            watcher::Event::InitApply(w) => {
                if ledger_relevant_typed(w, check) {
                    let key = ObjectRef::from_obj(w);
                    state.relisting.get_or_insert_default().insert(key);
                }
            }
            watcher::Event::InitDone => {
                if let Some(keys) = state.relisting.take() {
                    state.keys = keys;
                }
            }
            watcher::Event::Apply(w) => {
                let key = ObjectRef::from_obj(w);
                if ledger_relevant_typed(w, check) {
                    state.keys.insert(key);
                } else {
                    state.keys.remove(&key);
                }
            }
            watcher::Event::Delete(w) => {
                state.keys.remove(&ObjectRef::from_obj(w));
            }
        }
    }

    fn keys(&self) -> Vec<ObjectRef<Workload>> {
        let state = self.state.lock().expect("relevant index lock");
        state.keys.iter().cloned().collect()
    }
}

/// The typed view of a Workload the check works on.
fn slim_view(w: &mut Workload) {
    w.slim(
        "kaccel.io/",
        crate::ledger::admission::is_accelerator_resource,
    );
}

/// The JSON of a cached Workload the reconciliation against Kueue must look at
/// (charged: kaccel's finalizer; or counted by Kueue with kaccel's check on it),
/// `None` for the rest, decided on the typed view so a pass builds JSON only
/// for open work.
fn ledger_relevant(w: &Workload, check: &str) -> Option<Value> {
    ledger_relevant_typed(w, check).then(|| w.to_value())
}

fn ledger_relevant_typed(w: &Workload, check: &str) -> bool {
    w.has_finalizer(FINALIZER) || (w.counted_by_kueue() && w.has_check(check))
}

fn namespace_and_name(v: &Value) -> (&str, &str) {
    let text = |p: &str| v.pointer(p).and_then(Value::as_str).unwrap_or_default();
    (text("/metadata/namespace"), text("/metadata/name"))
}

/// The check's message once credits are reserved (the same words whichever path
/// sets it, so a replay writes nothing).
fn ready_note(record: &ReservationRecord, charge: &Charge, workload: &Value) -> String {
    let mut cards: Vec<&str> = record.lines.iter().map(|l| l.rate_card.as_str()).collect();
    cards.sort_unstable();
    cards.dedup();
    let span = if is_bounded(workload) {
        format!("for up to {}s", record.horizon_seconds)
    } else {
        format!(
            "for the first {}s, renewed every {}s while it runs",
            record.horizon_seconds, record.horizon_seconds
        )
    };
    format!(
        "reserved {} credits of budget {} {span} (rate card {})",
        format_micros(i128::try_from(charge.term_price(0)).unwrap_or(i128::MAX)),
        record.budget,
        cards.join(", ")
    )
}

/// A Workload with `spec.maximumExecutionTimeSeconds`: Kueue stops it at its
/// horizon, so its reservation is never renewed (the eviction's lag is charged
/// as overrun).
fn is_bounded(workload: &Value) -> bool {
    workload
        .pointer("/spec/maximumExecutionTimeSeconds")
        .and_then(Value::as_u64)
        .is_some_and(|s| s > 0)
}

/// A budget's rule for renewals it cannot cover (an unparsable limit allows no
/// overdraft; the budget's Invalid condition names it).
fn renewal_rule(policy: &crate::api::AdmissionPolicy) -> RenewalRule {
    let limit = policy
        .overdraft_limit
        .as_deref()
        .and_then(|l| l.parse::<Credits>().ok());
    RenewalRule {
        allow_overdraft: policy.when_renewal_short == Some(RenewalShortPolicy::Overdraft)
            && limit.is_some(),
        overdraft_limit: limit.unwrap_or(Credits::ZERO),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CreditRate, ModelRate};

    fn snapshot_with_class(per_device_hour: &str, overrides: &[(&str, &str)]) -> PricingSnapshot {
        let spec: AcceleratorClassSpec = serde_json::from_value(json!({
            "sharing": "Whole",
            "credits": { "perDeviceHour": "1" }
        }))
        .unwrap();
        let spec = AcceleratorClassSpec {
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
            classes: [("gpus".to_string(), (spec, Some(1)))].into(),
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

    fn workload(conditions: Value, checks: Value, finalizers: Value) -> Workload {
        let mut w: Workload = serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {
                "name": "w", "namespace": "ns", "uid": "u", "finalizers": finalizers,
                "annotations": {"kaccel.io/credit-reservation": "{}", "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "kueue", "operation": "Update"}],
            },
            "spec": {"queueName": "q", "active": true, "podSets": [{"name": "main", "count": 1, "template": {"spec": {"containers": []}}}]},
            "status": {"conditions": conditions, "admissionChecks": checks, "resourceRequests": [{"name": "main"}]},
        }))
        .expect("a Workload");
        slim_workload(&mut w, "kaccel-credits");
        w
    }

    #[test]
    fn relevant_index_follows_the_watch() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let held = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let finished = json!([{"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"}]);
        let named = |mut w: Workload, name: &str| {
            w.metadata.name = Some(name.into());
            w
        };
        let charged = named(
            workload(held.clone(), check.clone(), json!([FINALIZER])),
            "charged",
        );
        let settled = named(workload(finished, check.clone(), json!([])), "charged");
        let waiting = named(workload(held, check.clone(), json!([])), "waiting");
        let history = named(workload(json!([]), json!([]), json!([])), "history");
        let index = RelevantWorkloads::default();
        let names = |index: &RelevantWorkloads| {
            let mut n: Vec<String> = index.keys().into_iter().map(|k| k.name).collect();
            n.sort();
            n
        };
        index.observe(&watcher::Event::Init, "kaccel-credits");
        for w in [&charged, &waiting, &history] {
            index.observe(&watcher::Event::InitApply(w.clone()), "kaccel-credits");
        }
        // Nothing is swapped in before the list is complete.
        assert!(index.keys().is_empty());
        index.observe(&watcher::Event::InitDone, "kaccel-credits");
        assert_eq!(names(&index), ["charged", "waiting"]);
        // Settled (finalizer released): out; deleted: out.
        index.observe(&watcher::Event::Apply(settled), "kaccel-credits");
        index.observe(&watcher::Event::Delete(waiting.clone()), "kaccel-credits");
        assert!(index.keys().is_empty());
        index.observe(&watcher::Event::Apply(waiting.clone()), "kaccel-credits");
        assert_eq!(names(&index), ["waiting"]);
        // A re-list after the watch was down forgets what is gone.
        index.observe(&watcher::Event::Init, "kaccel-credits");
        index.observe(
            &watcher::Event::InitApply(charged.clone()),
            "kaccel-credits",
        );
        index.observe(&watcher::Event::InitDone, "kaccel-credits");
        assert_eq!(names(&index), ["charged"]);
    }

    #[test]
    fn history_and_foreign_workloads_are_cached_as_identity_only() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let finished = json!([{"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"}]);
        let identity = |w: &Workload| {
            w.spec == Default::default()
                && w.status == Default::default()
                && w.metadata.annotations.is_none()
                && w.metadata.finalizers.is_none()
                && w.metadata.uid.as_deref() == Some("u")
                && w.metadata.name.as_deref() == Some("w")
        };
        // Settled history: finished, kaccel's finalizer gone.
        assert!(identity(&workload(
            finished.clone(),
            check.clone(),
            json!([])
        )));
        // Not kaccel's: no check of kaccel's, no finalizer.
        assert!(identity(&workload(json!([]), json!([]), json!([]))));
        let foreign = json!([{"name": "another-check", "state": "Pending"}]);
        assert!(identity(&workload(json!([]), foreign, json!([]))));
        // Finished but not yet settled: kept whole.
        let unsettled = workload(finished, check.clone(), json!([FINALIZER]));
        assert!(!identity(&unsettled) && unsettled.is_true("Finished"));
        // Still waiting for quota: nothing for the check to do yet.
        assert!(identity(&workload(json!([]), check.clone(), json!([]))));
        // Holding quota with the check on it: kept whole.
        let reserved = json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}]);
        let waiting = workload(reserved, check, json!([]));
        assert_eq!(waiting.status.admission_checks.len(), 1);
        assert_eq!(waiting.spec.queue_name.as_deref(), Some("q"));
    }

    #[test]
    fn the_cache_keeps_only_what_the_check_reads() {
        let w = workload(json!([]), json!([]), json!([FINALIZER]));
        assert!(w.metadata.managed_fields.is_none());
        let annotations = w.metadata.annotations.as_ref().unwrap();
        assert_eq!(
            annotations.keys().collect::<Vec<_>>(),
            ["kaccel.io/credit-reservation"]
        );
        let v = w.to_value();
        assert!(v["spec"].get("podSets").is_none());
        assert_eq!(v["spec"]["queueName"], "q");
        assert!(v["status"].get("resourceRequests").is_none());
        assert_eq!(w.finalizers(), [FINALIZER]);
    }

    #[test]
    fn the_reconciliation_skips_finished_history() {
        let check = json!([{"name": "kaccel-credits", "state": "Ready"}]);
        let reserved = json!({"type": "QuotaReserved", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"});
        let finished = json!({"type": "Finished", "status": "True", "lastTransitionTime": "2026-12-01T00:10:00Z"});
        // Charged: the finalizer makes it relevant whatever its state.
        let charged = workload(
            json!([reserved, finished]),
            check.clone(),
            json!([FINALIZER]),
        );
        assert!(ledger_relevant(&charged, "kaccel-credits").is_some());
        // Waiting on the check while holding quota: counted.
        let waiting = workload(json!([reserved]), check.clone(), json!([]));
        assert!(ledger_relevant(&waiting, "kaccel-credits").is_some());
        assert!(ledger_relevant(&waiting, "another-check").is_none());
        // Finished and settled: skipped.
        let history = workload(json!([reserved, finished]), check, json!([]));
        assert!(ledger_relevant(&history, "kaccel-credits").is_none());
    }
}
