//! Prometheus metrics of the controller.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    pub kind: String,
    pub verb: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassHealthLabels {
    pub class: String,
    pub health: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassFlavorLabels {
    pub class: String,
    pub flavor: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    pub cluster: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockedQueueLabels {
    pub cluster_queue: String,
    pub resource: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AnswerLabel {
    pub answer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ActionLabel {
    pub action: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BudgetLabel {
    pub budget: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabel {
    pub decision: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabel {
    pub stage: &'static str,
}

/// A histogram of the credit check's stages (see `Metrics::check_stage`).
pub type StageHistograms = Family<StageLabel, Histogram, fn() -> Histogram>;

fn stage_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

#[derive(Clone)]
pub struct Metrics {
    /// Ledger entries written (replays that were already stored are not counted).
    pub ledger_entries: Family<KindLabel, Counter>,
    /// Ledger writes that failed (retried).
    pub ledger_errors: Family<ReasonLabel, Counter>,
    /// 1 while the ledger store answers.
    pub ledger_up: Gauge,
    /// Open reservations (reserved, not yet settled) at the last budget pass.
    pub ledger_open_reservations: Gauge,
    /// Reconciliation findings per budget at the last pass (0 = in sync).
    pub ledger_drift: Family<BudgetLabel, Gauge>,
    /// Credit AdmissionCheck answers, by decision.
    pub check_decisions: Family<DecisionLabel, Counter>,
    /// Seconds from Kueue reserving quota to kaccel setting the check Ready.
    pub check_latency: Histogram,
    /// Checks set Ready before Kueue listed them on the Workload (quota
    /// reserved, its Workload controller behind; see the reconcile's step 2).
    pub check_answered_unlisted: Counter,
    /// Seconds per stage of a reservation on the admission path, in order:
    /// `record` (annotation + finalizer write, before the lock; skipped when
    /// already written), `lock` (waiting for other reservations), `balances`,
    /// `append` (durable Reserve entry), `status` (check set Ready).
    pub check_stage: StageHistograms,
    /// Wall time of one budget pass (grants, balances, the reconciliation
    /// against Kueue), store round trips included.
    pub budget_pass_duration: Histogram,
    /// Process CPU time (all threads) spent while one budget pass ran: an upper
    /// bound on the pass's own CPU time.
    pub budget_pass_cpu: Histogram,
    /// Time spent handing freed heap back to the system (`allocator`).
    pub allocator_trim: Histogram,
    /// Remaining micro-credits per budget.
    pub budget_remaining: Family<BudgetLabel, Gauge>,
    pub source_up: Family<SourceLabel, Gauge>,
    pub source_errors: Family<SourceLabel, Counter>,
    pub source_last_success: Family<SourceLabel, Gauge>,
    pub node_actions: Family<ActionLabel, Counter>,
    pub node_actions_held_back: Gauge,
    /// Accelerator devices no adapter could classify (offered to no class).
    pub inventory_unclassified_devices: Gauge,
    /// Nodes parsed into the inventory (again): the work a re-plan does per change.
    pub inventory_node_reads: Counter,
    pub reconciles: Counter,
    pub reconcile_failures: Family<ReasonLabel, Counter>,
    pub reconcile_duration: Histogram,
    /// Seconds per stage of a re-plan, in order: `pending` (first event to the
    /// start: the quiet and pacing windows), `observe` (caches, inventory and
    /// health read), `plan`, `diff`, `apply` (managed Kueue objects written),
    /// `nodes` (taints, cordons, evictions), `status` (class and budget status).
    /// A change reaches its quota after `pending` through `apply`.
    pub reconcile_stage: StageHistograms,
    pub writes: Family<WriteLabels, Counter>,
    pub managed_objects: Family<KindLabel, Gauge>,
    pub class_devices: Family<ClassHealthLabels, Gauge>,
    /// Per class with a topology level and flavor: the healthy devices of its
    /// fullest block (what one Workload can get at most).
    pub class_largest_block: Family<ClassFlavorLabels, Gauge>,
    /// Per MultiKueue worker: 1 while kaccel reads its Nodes, 0 while not.
    pub worker_cluster_reachable: Family<WorkerLabels, Gauge>,
    /// Per MultiKueue worker: the Nodes kaccel last read there.
    pub worker_cluster_nodes: Family<WorkerLabels, Gauge>,
    /// 1 per (ClusterQueue kaccel does not own, resource) that Kueue's
    /// transformation into `kaccel.io/accelerator` keeps from admitting.
    pub foreign_queues_blocked: Family<BlockedQueueLabels, Gauge>,
    /// The pod webhook's answers: allow (no class resource), rewrite, deny.
    pub webhook_answers: Family<AnswerLabel, Counter>,
    /// Seconds the pod webhook took per review (its Workload read included).
    pub webhook_latency: Histogram,
    /// The Workload webhook's answers: `finalizer` (bound for a queue this
    /// installation charges) or `allow` (left alone).
    pub workload_webhook_answers: Family<AnswerLabel, Counter>,
    pub leader: Gauge,
    /// Events the API server refused or never got (a missing RBAC verb shows here).
    pub event_write_failures: Family<ReasonLabel, Counter>,
    /// Failed attempts to create or read the leader-election Lease (Forbidden: the
    /// Role does not cover the configured lease namespace or name).
    pub leader_election_failures: Family<ReasonLabel, Counter>,
}

impl Metrics {
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            ledger_entries: Family::default(),
            ledger_errors: Family::default(),
            ledger_up: Gauge::default(),
            ledger_open_reservations: Gauge::default(),
            ledger_drift: Family::default(),
            check_decisions: Family::default(),
            check_latency: Histogram::new(exponential_buckets(0.005, 2.0, 14)),
            check_answered_unlisted: Counter::default(),
            check_stage: Family::new_with_constructor(stage_histogram),
            budget_pass_duration: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            budget_pass_cpu: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            allocator_trim: Histogram::new(exponential_buckets(0.0001, 2.0, 14)),
            budget_remaining: Family::default(),
            source_up: Family::default(),
            source_errors: Family::default(),
            source_last_success: Family::default(),
            node_actions: Family::default(),
            node_actions_held_back: Gauge::default(),
            inventory_unclassified_devices: Gauge::default(),
            inventory_node_reads: Counter::default(),
            reconciles: Counter::default(),
            reconcile_failures: Family::default(),
            reconcile_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            reconcile_stage: Family::new_with_constructor(stage_histogram),
            writes: Family::default(),
            managed_objects: Family::default(),
            class_devices: Family::default(),
            class_largest_block: Family::default(),
            worker_cluster_reachable: Family::default(),
            worker_cluster_nodes: Family::default(),
            foreign_queues_blocked: Family::default(),
            webhook_answers: Family::default(),
            webhook_latency: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            workload_webhook_answers: Family::default(),
            leader: Gauge::default(),
            event_write_failures: Family::default(),
            leader_election_failures: Family::default(),
        };
        registry.register(
            "kaccel_ledger_entries",
            "Credit ledger entries written, by kind",
            m.ledger_entries.clone(),
        );
        registry.register(
            "kaccel_ledger_errors",
            "Ledger store operations that failed and are retried, by reason",
            m.ledger_errors.clone(),
        );
        registry.register(
            "kaccel_ledger_up",
            "1 while the ledger store answers",
            m.ledger_up.clone(),
        );
        registry.register(
            "kaccel_ledger_open_reservations",
            "Reservations not yet settled, at the last budget pass",
            m.ledger_open_reservations.clone(),
        );
        registry.register(
            "kaccel_ledger_drift",
            "Ledger vs Kueue reconciliation findings per budget at the last pass (0 = in sync)",
            m.ledger_drift.clone(),
        );
        registry.register(
            "kaccel_admission_check_decisions",
            "Answers of the credit AdmissionCheck, by decision",
            m.check_decisions.clone(),
        );
        registry.register(
            "kaccel_admission_check_latency_seconds",
            "Time from Kueue reserving quota to the credit check set Ready",
            m.check_latency.clone(),
        );
        registry.register(
            "kaccel_admission_check_answered_unlisted",
            "Credit checks set Ready before Kueue listed the check on the Workload",
            m.check_answered_unlisted.clone(),
        );
        registry.register(
            "kaccel_admission_check_stage_seconds",
            "Time per stage of a reservation on the admission path: record, lock, balances, append, status",
            m.check_stage.clone(),
        );
        registry.register(
            "kaccel_ledger_budget_pass_seconds",
            "Wall time of one budget pass of the credit ledger, store round trips included",
            m.budget_pass_duration.clone(),
        );
        registry.register(
            "kaccel_allocator_trim_seconds",
            "Time spent handing the allocator's freed pages back to the system (every 30 s)",
            m.allocator_trim.clone(),
        );
        registry.register(
            "kaccel_ledger_budget_pass_cpu_seconds",
            "Process CPU time (all threads) while one budget pass ran, an upper bound on its own",
            m.budget_pass_cpu.clone(),
        );
        registry.register(
            "kaccel_budget_remaining_microcredits",
            "Remaining micro-credits of each CreditBudget",
            m.budget_remaining.clone(),
        );
        registry.register(
            "kaccel_reconciles",
            "Reconciles (plan + diff + writes) run",
            m.reconciles.clone(),
        );
        registry.register(
            "kaccel_reconcile_failures",
            "Reconciles that failed, by reason",
            m.reconcile_failures.clone(),
        );
        registry.register(
            "kaccel_reconcile_duration_seconds",
            "Duration of a reconcile",
            m.reconcile_duration.clone(),
        );
        registry.register(
            "kaccel_reconcile_stage_seconds",
            "Time per stage of a reconcile: pending, observe, plan, diff, apply, nodes, status",
            m.reconcile_stage.clone(),
        );
        registry.register(
            "kaccel_writes",
            "Writes sent to the API server, by kind and verb",
            m.writes.clone(),
        );
        registry.register(
            "kaccel_managed_objects",
            "Kueue objects kaccel manages, by kind",
            m.managed_objects.clone(),
        );
        registry.register(
            "kaccel_foreign_cluster_queue_blocked",
            "1 per ClusterQueue kaccel does not own and resource it covers that Kueue also counts as kaccel.io/accelerator, which the queue does not cover (Kueue admits none of its workloads asking for that resource)",
            m.foreign_queues_blocked.clone(),
        );
        registry.register(
            "kaccel_pod_webhook_answers",
            "Pod webhook answers: allow (no kaccel.io/accelerator), rewrite, deny",
            m.webhook_answers.clone(),
        );
        registry.register(
            "kaccel_pod_webhook_seconds",
            "Seconds the pod webhook took per AdmissionReview",
            m.webhook_latency.clone(),
        );
        registry.register(
            "kaccel_workload_webhook_answers",
            "Workload webhook answers: finalizer (bound for a ClusterQueue this installation charges), allow",
            m.workload_webhook_answers.clone(),
        );
        registry.register(
            "kaccel_class_devices",
            "Devices of each AcceleratorClass by health",
            m.class_devices.clone(),
        );
        registry.register(
            "kaccel_class_largest_block",
            "Healthy devices in the fullest block at an AcceleratorClass's spec.topology.level, per flavor: the most one Workload that requires that level can get",
            m.class_largest_block.clone(),
        );
        registry.register(
            "kaccel_worker_cluster_reachable",
            "1 while kaccel reads the Nodes of a MultiKueue worker cluster, 0 while it cannot (its devices count as Unknown)",
            m.worker_cluster_reachable.clone(),
        );
        registry.register(
            "kaccel_worker_cluster_nodes",
            "Nodes kaccel last read in a MultiKueue worker cluster",
            m.worker_cluster_nodes.clone(),
        );
        registry.register(
            "kaccel_leader",
            "1 while this replica holds the leader Lease",
            m.leader.clone(),
        );
        registry.register(
            "kaccel_health_source_up",
            "1 while a health source answers with parseable device metrics",
            m.source_up.clone(),
        );
        registry.register(
            "kaccel_health_source_errors",
            "Failed polls of a health source (unreachable, bad status, unparseable)",
            m.source_errors.clone(),
        );
        registry.register(
            "kaccel_health_source_last_success_timestamp_seconds",
            "Unix time of a health source's last good answer (staleness = now - this)",
            m.source_last_success.clone(),
        );
        registry.register(
            "kaccel_node_actions",
            "Taints, untaints, cordons and uncordons kaccel applied",
            m.node_actions.clone(),
        );
        registry.register(
            "kaccel_node_actions_held_back",
            "Node actions the per-flavor share limit held back (alert on > 0)",
            m.node_actions_held_back.clone(),
        );
        registry.register(
            "kaccel_inventory_unclassified_devices",
            "Accelerator devices kaccel cannot classify (unknown resource, label scheme or model): offered to no class and not CPU-only capacity; `kaccel plan -o summary` on the Node YAML names them (alert on > 0)",
            m.inventory_unclassified_devices.clone(),
        );
        registry.register(
            "kaccel_inventory_node_reads",
            "Nodes read into the inventory; a re-plan reads only the Nodes whose resourceVersion changed since the last one",
            m.inventory_node_reads.clone(),
        );
        registry.register(
            "kaccel_event_write_failures",
            "Kubernetes Events kaccel could not write, by reason (Forbidden: the RBAC role lacks create on events)",
            m.event_write_failures.clone(),
        );
        registry.register(
            "kaccel_leader_election_failures",
            "Failed attempts to create or read the leader-election Lease, by reason (Forbidden: manifests/role.yaml does not cover the lease's namespace or name); retried with backoff",
            m.leader_election_failures.clone(),
        );
        m
    }

    pub fn write(&self, kind: &str, verb: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                kind: kind.to_string(),
                verb: verb.to_string(),
            })
            .inc();
    }
}

/// CPU time of the whole process so far (all threads), in seconds.
pub fn process_cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `t` is a valid, writable timespec; the clock id is a constant
    // every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut t) };
    if rc != 0 {
        return 0.0;
    }
    t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
}
