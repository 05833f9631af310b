//! The planner: pure, synchronous, deterministic.
//!
//! (AcceleratorClasses, CreditBudgets, inventory, health) -> the Kueue objects kaccel
//! wants to exist, plus the status each class and budget should show. No I/O, no
//! clock, no randomness: the same input always gives byte-identical output, which is
//! what lets the controller skip writes when nothing changed (invariant 4).
//!
//! Shape of what it builds:
//! - one ResourceFlavor per concrete device variant (vendor + model + sharing +
//!   partition, plus any `pooling.splitBy` labels and class node labels), shared by
//!   every class that uses that variant;
//! - a root Cohort holding the healthy capacity no team is guaranteed (lendable);
//! - per CreditBudget a team Cohort (its fair-share weight) and one ClusterQueue per
//!   class it may use, whose flavors are the class's flavors in preference order.
//!   Kueue lets a resource and a flavor appear in only one resource group of a
//!   ClusterQueue, so classes that share `nvidia.com/gpu` cannot be separate groups of
//!   one queue: one queue per (budget, class) keeps them apart;
//! - per budget namespace one LocalQueue per class, named after the class.
//!
//! [`plan`] is a pipeline; each stage is a pure function in its own file:
//! 1. `validate`: class reports, valid or not (invalid classes stop here);
//! 2. `flavors`: the devices each class pools, grouped into flavors (hard
//!    requirements in `hardware`);
//! 3. `purity`: flavors whose node labels select other hardware are refused;
//! 4. `flavors::name_flavors`, `capacity`: flavor names, health and healthy capacity;
//! 5. `order`: each class's flavors in preference order;
//! 6. `budgets`: budgets oldest first, validated, namespaces claimed, grants as demands;
//! 7. `quota`: healthy capacity split into nominal quotas (invariant 1);
//! 8. `objects`: the Kueue objects, and the budget and class each ClusterQueue bills;
//!    `device_classes`: a DeviceClass per DRA-only flavor, selecting its devices;
//! 9. `status`: the conditions of class and budget reports; `topology`: the
//!    Kueue Topology objects (stage 4b), each class's blocks at its level and
//!    the budgets whose guarantee fits in none.

pub mod nodes;
pub mod purity;

pub mod device_classes;
pub mod device_quarantine;
pub mod kueue_counting;

mod budgets;
mod capacity;
mod flavors;
mod hardware;
mod objects;
mod order;
mod quota;
mod status;
pub mod topology;
mod validate;
pub mod workers;

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::DeviceClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

pub use crate::api::parsed::{FieldError, validate_budget, validate_class};
use crate::api::{
    AcceleratorClass, CreditBudget, DesiredCondition, ExhaustionPolicy, HealthCounts,
    ResolvedFlavor, SharingMode, Vendor,
};
use crate::health::HealthSnapshot;
use crate::inventory::{Inventory, NodeInventory};
use crate::kueue::{ClusterQueue, Cohort, ResourceFlavor, Topology};
pub use objects::LocalQueues;
pub use purity::ImpureFlavor;
pub use quota::{Demand, allocate};

// The labels kaccel puts on what it creates, and the CPU pool label, live on the
// ground floor; the planner's users keep reaching them here.
pub use crate::k8s::labels::{
    BUDGET_LABEL, CLASS_LABEL, CPU_POOL_LABEL, CPU_POOL_VALUE, FLAVOR_LABEL, MANAGED_BY_LABEL,
    TEAM_LABEL,
};

/// Kueue's limit on flavors in one resource group.
pub const MAX_FLAVORS_PER_GROUP: usize = 64;

const CPU: &str = "cpu";
const MEMORY: &str = "memory";

/// Knobs the planner takes from the controller configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    /// The installation planning (config `instance`): the `managed-by` value of
    /// every object in the plan.
    pub instance: String,
    /// The Cohort every team Cohort hangs under; it holds the unguaranteed capacity.
    pub root_cohort: String,
    /// AdmissionCheck every ClusterQueue references; only set when the credit
    /// ledger runs (a check nobody answers would block all admission).
    pub admission_check: Option<String>,
    /// Kueue's MultiKueue AdmissionCheck, when kaccel plans for worker clusters
    /// (config `multiKueue.workers`): every ClusterQueue references it on all
    /// its flavors (Kueue refuses one per flavor), so admitted work is
    /// dispatched to a worker. Listed after the credit check, which Kueue wants
    /// Ready before it dispatches.
    pub multikueue_check: Option<String>,
    /// MultiKueue worker clusters kaccel cannot read now -> why: their devices
    /// are Unknown (capacity, not failures) and each class with devices there
    /// says so (see [`workers`]).
    pub unreachable_workers: BTreeMap<String, String>,
    /// Devices whose health is Unknown still count as capacity (a broken exporter
    /// must not drain the cluster; invariant 6).
    pub unknown_counts_as_capacity: bool,
    /// A flavor with at least this share (percent) of its devices in Warning moves
    /// after the healthy flavors of every class that uses it.
    pub demote_warning_percent: u32,
    /// Budgets whose credits are exhausted, with the stop policy to apply.
    pub held_budgets: BTreeMap<String, ExhaustionPolicy>,
    pub queueing_strategy: String,
    /// Kueue's configuration as the controller read it, to check that Kueue counts
    /// the DeviceClasses (`None`: not read, no check; see [`kueue_counting`]).
    pub kueue_configuration: Option<crate::kueue::config::ObservedConfiguration>,
    /// ClusterQueues kaccel does not own -> the resources they cover: checked
    /// against Kueue's transformations (see [`kueue_counting::blocked_queues`]).
    pub foreign_cluster_queues: BTreeMap<String, BTreeSet<String>>,
    /// AcceleratorClasses another kaccel installation serves -> its instance: a
    /// budget naming one is told whose it is, not that it does not exist.
    pub classes_elsewhere: BTreeMap<String, String>,
    /// Write Kueue Topology objects and each device flavor's `topologyName`
    /// where its nodes carry topology labels (see [`topology`]). Off by default:
    /// Kueue then places every Workload of those flavors by node allocatable.
    pub topology_aware_scheduling: bool,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            instance: crate::k8s::instance::DEFAULT_INSTANCE.into(),
            root_cohort: "kaccel".into(),
            admission_check: None,
            multikueue_check: None,
            unreachable_workers: BTreeMap::new(),
            unknown_counts_as_capacity: true,
            demote_warning_percent: 10,
            held_budgets: BTreeMap::new(),
            queueing_strategy: "BestEffortFIFO".into(),
            kueue_configuration: None,
            foreign_cluster_queues: BTreeMap::new(),
            classes_elsewhere: BTreeMap::new(),
            topology_aware_scheduling: false,
        }
    }
}

/// What one installation plans from: the classes and budgets it serves
/// (`kaccel.io/instance`, see [`crate::k8s::instance`]), and every other
/// installation's class by name, so a budget naming one is told whose it is
/// ([`PlanOptions::classes_elsewhere`]).
#[derive(Debug, Default)]
pub struct Served {
    pub classes: Vec<AcceleratorClass>,
    pub budgets: Vec<CreditBudget>,
    pub classes_elsewhere: BTreeMap<String, String>,
}

/// Splits the cluster's (or files') classes and budgets for `instance`.
pub fn served_by<'a>(
    instance: &str,
    classes: impl IntoIterator<Item = &'a AcceleratorClass>,
    budgets: impl IntoIterator<Item = &'a CreditBudget>,
) -> Served {
    use crate::k8s::instance;
    let unlabelled = BTreeMap::new();
    let labels = |meta: &'a ObjectMeta| meta.labels.as_ref().unwrap_or(&unlabelled);
    let mut out = Served::default();
    for class in classes {
        let class_labels = labels(&class.metadata);
        if instance::serves(instance, class_labels) {
            out.classes.push(class.clone());
        } else {
            out.classes_elsewhere.insert(
                name_of(&class.metadata),
                instance::served_by(class_labels).to_string(),
            );
        }
    }
    out.budgets = budgets
        .into_iter()
        .filter(|b| instance::serves(instance, labels(&b.metadata)))
        .cloned()
        .collect();
    out
}

pub struct PlanInput<'a> {
    pub classes: &'a [AcceleratorClass],
    pub budgets: &'a [CreditBudget],
    pub inventory: &'a Inventory,
    pub health: &'a HealthSnapshot,
    pub options: &'a PlanOptions,
}

/// Everything kaccel wants to exist, and what each of its resources should report.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// One per DRA-only flavor (see [`device_classes`]).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub device_classes: Vec<DeviceClass>,
    /// One per failed DRA device kaccel takes out; not planned from the classes
    /// but decided by the controller from device health ([`device_quarantine`]).
    #[serde(skip)]
    pub device_taint_rules: Vec<k8s_openapi::api::resource::v1alpha3::DeviceTaintRule>,
    /// One per distinct set of topology levels the flavors' nodes carry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub topologies: Vec<Topology>,
    pub resource_flavors: Vec<ResourceFlavor>,
    pub cohorts: Vec<Cohort>,
    pub cluster_queues: Vec<ClusterQueue>,
    pub local_queues: LocalQueues,
    #[serde(skip)]
    pub classes: BTreeMap<String, ClassReport>,
    #[serde(skip)]
    pub budgets: BTreeMap<String, BudgetReport>,
    #[serde(skip)]
    pub flavors: BTreeMap<String, FlavorReport>,
    /// Device flavors refused because their nodeLabels also select nodes without
    /// their variant (see [`purity`]); each is reported on the classes that wanted it.
    #[serde(skip)]
    pub impure_flavors: Vec<ImpureFlavor>,
    /// DRA-only flavors left without a DeviceClass: a class requirement CEL cannot
    /// express for the driver; each is reported on its class.
    #[serde(skip)]
    pub device_class_problems: Vec<device_classes::DeviceClassProblem>,
    /// ClusterQueue name -> (budget, class) it bills, for the credit check: every
    /// planned ClusterQueue, plus the queues of grants whose class is invalid (not
    /// planned, so kaccel deletes them, but Workloads holding quota in them still
    /// get an answer).
    #[serde(skip)]
    pub priced_queues: BTreeMap<String, (String, String)>,
    /// ClusterQueues kaccel does not own that Kueue's transformations into the
    /// class resource block -> the resources (see [`kueue_counting::blocked_queues`]).
    #[serde(skip)]
    pub blocked_queues: BTreeMap<String, Vec<String>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassReport {
    pub valid: bool,
    pub errors: Vec<FieldError>,
    /// Flavors in the preference order in force.
    pub flavors: Vec<ResolvedFlavor>,
    pub devices: HealthCounts,
    pub conditions: Vec<DesiredCondition>,
    /// The class's rates as parsed in stage 1 (`None` only in a default report):
    /// what the credit check prices with.
    pub rates: Option<Result<crate::api::rates::ClassRates, Vec<crate::api::rates::RateError>>>,
    /// The device counts one pod may ask for, as parsed in stage 1 (empty: any):
    /// what the credit check holds each Workload of the class to.
    pub devices_per_pod: Vec<u32>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct BudgetReport {
    pub valid: bool,
    pub errors: Vec<FieldError>,
    pub cohort: Option<String>,
    pub cluster_queues: Vec<String>,
    pub local_queues: Vec<String>,
    /// (class, flavor) -> nominal quota granted, in the flavor's unit.
    pub grants: BTreeMap<(String, String), u64>,
    pub conditions: Vec<DesiredCondition>,
    /// The budget's amounts as parsed when it was admitted (`None` when invalid).
    pub amounts: Option<crate::api::parsed::ParsedBudget>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorReport {
    pub name: String,
    pub vendor: Option<Vendor>,
    pub model: String,
    pub sharing: SharingMode,
    pub partition_profile: Option<String>,
    /// The resource this flavor's quota is in (`cpu` for CPU pools, in cores; the
    /// flavor's logical resource for a DRA-only flavor, see [`kueue_counting`]).
    pub resource_name: String,
    /// The resource its devices are published under (the variant's: a DRA-only
    /// flavor's is its driver's DeviceClass; otherwise `resource_name`).
    pub device_resource_name: String,
    pub node_labels: BTreeMap<String, String>,
    pub tolerated_taint_keys: Vec<String>,
    pub nodes: BTreeSet<String>,
    pub devices: HealthCounts,
    /// Devices on schedulable nodes that are not known to be broken.
    pub healthy_capacity: u64,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    /// Total nominal quota across all ClusterQueues.
    pub granted: u64,
    /// Held by the root Cohort: healthy capacity nobody is guaranteed.
    pub spare: u64,
    pub classes: BTreeSet<String>,
    pub demoted: bool,
    /// Health trend rules holding for its devices: rule name -> nodes it holds on.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub trend_rules: BTreeMap<String, u32>,
    /// The Kueue Topology its nodes form, when they carry topology labels.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub topology: Option<topology::FlavorLevels>,
}

pub fn plan(input: &PlanInput<'_>) -> Plan {
    plan_with(input, None, None)
}

/// What a plan leaves for the next one, so that a re-plan after a Node or
/// health change does work for what changed rather than for the fleet: the
/// LocalQueues (which such a change leaves as they were, see [`LocalQueues`])
/// and the purity check's verdicts (see [`purity::Verdicts`]). A plan is the
/// same with or without it; the controller keeps one between re-plans.
#[derive(Debug, Default)]
pub struct Carried {
    /// The last plan's LocalQueues: reused, not built again, when the inputs
    /// call for exactly those.
    pub local_queues: LocalQueues,
    purity: purity::Verdicts,
}

impl Carried {
    /// The Nodes the last plan's purity check looked at one by one (those
    /// that changed since the plan before); None when it checked the fleet.
    pub fn nodes_rechecked(&self) -> Option<usize> {
        self.purity.last_rechecked
    }
}

/// [`plan`], given what the last plan left ([`Carried`]), which it then
/// replaces with what this plan leaves.
pub fn plan_carrying(input: &PlanInput<'_>, carried: &mut Carried) -> Plan {
    let planned = plan_with(
        input,
        Some(&carried.local_queues),
        Some(&mut carried.purity),
    );
    carried.local_queues = planned.local_queues.clone();
    planned
}

fn plan_with(
    input: &PlanInput<'_>,
    kept_local_queues: Option<&LocalQueues>,
    purity_verdicts: Option<&mut purity::Verdicts>,
) -> Plan {
    let options = input.options;
    let nodes: Vec<&NodeInventory> = input.inventory.nodes.values().map(|n| &**n).collect();

    // 1. Validate classes: invalid ones are reported and take no further part.
    let (classes, mut class_reports) = validate::classes(input.classes);
    let class_by_name: BTreeMap<String, &AcceleratorClass> =
        classes.iter().map(|c| (name_of(&c.metadata), *c)).collect();
    // 2. Resolve flavors: the devices each class pools, grouped into flavors.
    let mut resolved = flavors::resolve(&classes, &nodes, input.health, &mut class_reports);
    // 3. Purity: refuse flavors whose node labels also select other hardware.
    let impure_flavors = purity::refuse_impure(
        &mut resolved,
        &input.inventory.nodes,
        &nodes,
        purity_verdicts,
        &mut class_reports,
    );
    // 4. Name the flavors and measure their health and healthy capacity.
    let flavor_names = flavors::name_flavors(&resolved.flavors);
    let mut flavor_reports = capacity::measure(
        &resolved.flavors,
        &flavor_names,
        &nodes,
        input.health,
        options,
    );
    // 4b. Topology: the levels each device flavor's nodes carry.
    let flavor_levels = topology::flavor_levels(&resolved.flavors, &flavor_names, &nodes, options);
    let topologies = topology::objects(&flavor_levels, &options.instance);
    for (name, levels) in flavor_levels {
        if let Some(report) = flavor_reports.get_mut(&name) {
            report.topology = Some(levels);
        }
    }
    // 5. Preference order of each class's flavors (health warnings demote).
    let class_order = order::preference_order(
        &classes,
        &resolved.class_flavors,
        &flavor_names,
        &flavor_reports,
    );
    // 6. Admit budgets: oldest first, validated, namespaces claimed, grants as demands.
    let mut budgets = budgets::admit(
        input.budgets,
        &class_by_name,
        &class_reports,
        &class_order,
        &options.classes_elsewhere,
    );
    // 7. Split healthy capacity into quotas (invariant 1).
    quota::split(&budgets.demands, &mut flavor_reports, &mut budgets.reports);
    // 8. Build the Kueue objects; valid budgets get their queue names and Ready.
    let objects = objects::build(
        &objects::ObjectsInput {
            flavors: &resolved.flavors,
            flavor_names: &flavor_names,
            flavor_reports: &flavor_reports,
            class_by_name: &class_by_name,
            class_reports: &class_reports,
            class_order: &class_order,
            budgets: &budgets.ordered,
            input_budgets: input.budgets,
            namespaces: &budgets.namespaces,
            options,
            kept_local_queues,
        },
        &mut budgets.reports,
    );
    let device_classes = device_classes::build(
        &resolved.flavors,
        &flavor_names,
        &nodes,
        &class_by_name,
        &options.instance,
    );
    // 9. Status: class conditions, and invalid budgets' conditions.
    status::classes(&mut class_reports, &class_order, &flavor_reports);
    status::unlabelled_models_condition(
        &mut class_reports,
        &class_by_name,
        &status::unlabelled_models(input.inventory),
    );
    status::device_class_problems(&mut class_reports, &device_classes.problems);
    kueue_counting::conditions(
        &mut class_reports,
        &flavor_reports,
        &device_classes.objects,
        options.kueue_configuration.as_ref(),
    );
    let blocked_queues = kueue_counting::blocked_queues(
        &options.foreign_cluster_queues,
        options.kueue_configuration.as_ref(),
        &flavor_reports,
    );
    kueue_counting::class_request_conditions(
        &mut class_reports,
        &flavor_reports,
        options.kueue_configuration.as_ref(),
        &blocked_queues,
    );
    let topology_input = topology::TopologyInput {
        class_by_name: &class_by_name,
        flavors: &resolved.flavors,
        flavor_names: &flavor_names,
        flavor_reports: &flavor_reports,
        nodes: &nodes,
        health: input.health,
        options,
    };
    topology::classes(&topology_input, &mut class_reports);
    topology::budgets(
        &budgets.demands,
        &class_reports,
        &class_by_name,
        &mut budgets.reports,
    );
    workers::classes(&mut class_reports, &flavor_reports, options);
    status::invalid_budgets(&mut budgets.reports);

    Plan {
        topologies,
        device_taint_rules: Vec::new(),
        device_classes: device_classes.objects,
        device_class_problems: device_classes.problems,
        resource_flavors: objects.resource_flavors,
        cohorts: objects.cohorts,
        cluster_queues: objects.cluster_queues,
        local_queues: objects.local_queues,
        classes: class_reports,
        budgets: budgets.reports,
        flavors: flavor_reports,
        impure_flavors,
        priced_queues: objects.priced_queues,
        blocked_queues,
    }
}

pub fn cluster_queue_name(budget: &str, class: &str) -> String {
    crate::k8s::names::bounded(&[budget, class], 253)
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

#[cfg(test)]
mod tests;
