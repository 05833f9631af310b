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

pub mod names;
pub mod nodes;
pub mod purity;
mod quota;
mod validate;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::Resource;
use serde::Serialize;

use crate::api::{
    self, AcceleratorClass, CreditBudget, Credits, DesiredCondition, ExhaustionPolicy,
    HealthCounts, ResolvedFlavor, SharingMode, Vendor,
};
use crate::health::HealthSnapshot;
use crate::inventory::{DeviceGroup, DeviceVariant, Inventory, NodeInventory};
use crate::kueue::{
    AdmissionCheckStrategyRule, AdmissionChecksStrategy, ClusterQueue, ClusterQueuePreemption,
    ClusterQueueSpec, Cohort, CohortSpec, FairSharing, FlavorFungibility, FlavorQuotas, LocalQueue,
    LocalQueueSpec, ResourceFlavor, ResourceFlavorSpec, ResourceGroup, ResourceQuota,
};
pub use purity::ImpureFlavor;
pub use quota::{Demand, allocate};
pub use validate::{FieldError, validate_budget, validate_class};

pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "kaccel";
pub const CLASS_LABEL: &str = "kaccel.io/class";
pub const BUDGET_LABEL: &str = "kaccel.io/budget";
pub const TEAM_LABEL: &str = "kaccel.io/team";
pub const FLAVOR_LABEL: &str = "kaccel.io/flavor";
/// The node label that pins a CPU-only class without `selector.nodeLabels`:
/// `kaccel.io/pool=cpu`. Kueue's nodeLabels cannot say "no accelerator", so the
/// platform team labels its CPU-only nodes; the flavor selects exactly those, and its
/// quota counts only those that carry no accelerator of any kind.
pub const CPU_POOL_LABEL: &str = "kaccel.io/pool";
pub const CPU_POOL_VALUE: &str = "cpu";

/// Kueue's limit on flavors in one resource group.
pub const MAX_FLAVORS_PER_GROUP: usize = 64;

const CPU: &str = "cpu";
const MEMORY: &str = "memory";

/// Knobs the planner takes from the controller configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct PlanOptions {
    /// The Cohort every team Cohort hangs under; it holds the unguaranteed capacity.
    pub root_cohort: String,
    /// AdmissionCheck every ClusterQueue references; only set when the credit
    /// ledger runs (a check nobody answers would block all admission).
    pub admission_check: Option<String>,
    /// Devices whose health is Unknown still count as capacity (a broken exporter
    /// must not drain the cluster; invariant 6).
    pub unknown_counts_as_capacity: bool,
    /// A flavor with at least this share (percent) of its devices in Warning moves
    /// after the healthy flavors of every class that uses it.
    pub demote_warning_percent: u32,
    /// Budgets whose credits are exhausted, with the stop policy to apply.
    pub held_budgets: BTreeMap<String, ExhaustionPolicy>,
    pub queueing_strategy: String,
}

impl Default for PlanOptions {
    fn default() -> Self {
        PlanOptions {
            root_cohort: "kaccel".into(),
            admission_check: None,
            unknown_counts_as_capacity: true,
            demote_warning_percent: 10,
            held_budgets: BTreeMap::new(),
            queueing_strategy: "BestEffortFIFO".into(),
        }
    }
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
    pub resource_flavors: Vec<ResourceFlavor>,
    pub cohorts: Vec<Cohort>,
    pub cluster_queues: Vec<ClusterQueue>,
    pub local_queues: Vec<LocalQueue>,
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
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClassReport {
    pub valid: bool,
    pub errors: Vec<FieldError>,
    /// Flavors in the preference order in force.
    pub flavors: Vec<ResolvedFlavor>,
    pub devices: HealthCounts,
    pub conditions: Vec<DesiredCondition>,
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
}

#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorReport {
    pub name: String,
    pub vendor: Option<Vendor>,
    pub model: String,
    pub sharing: SharingMode,
    pub partition_profile: Option<String>,
    /// The resource this flavor's capacity is counted in (`cpu` for CPU pools, in cores).
    pub resource_name: String,
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
}

/// Identity of a flavor: the variant (None for a CPU pool) plus every node label
/// that pins it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct FlavorKey {
    variant: Option<DeviceVariant>,
    /// Labels the vendor adapter pins the variant with.
    pins: BTreeMap<String, String>,
    /// Class node labels and `pooling.splitBy` values on top of the pins.
    extra: BTreeMap<String, String>,
}

impl FlavorKey {
    fn node_labels(&self) -> BTreeMap<String, String> {
        let mut all = self.pins.clone();
        all.extend(self.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }
}

/// Where a group of devices lives: node index and group index (None = the node's CPU).
type Member = (usize, Option<usize>);

/// Device groups that passed a class's hardware requirements: the variant (None
/// for a CPU pool), its pin labels, and where the groups are.
type Candidate<'a> = (
    Option<&'a DeviceVariant>,
    &'a BTreeMap<String, String>,
    &'a [Member],
);

#[derive(Default)]
struct FlavorAcc {
    members: Vec<Member>,
    classes: BTreeSet<String>,
    tolerated: BTreeSet<String>,
}

/// Hardware properties that decide whether a device group can join a class.
#[derive(Clone, PartialEq, Eq, Hash)]
struct Signature<'a> {
    variant: &'a DeviceVariant,
    memory_mib: Option<u64>,
    architecture: Option<&'a str>,
    compute_capability: Option<&'a str>,
    driver_version: Option<&'a str>,
    cuda_version: Option<&'a str>,
    pins: &'a BTreeMap<String, String>,
}

impl<'a> Signature<'a> {
    fn of(g: &'a DeviceGroup) -> Self {
        Signature {
            variant: &g.variant,
            memory_mib: g.memory_mib,
            architecture: g.architecture.as_deref(),
            compute_capability: g.compute_capability.as_deref(),
            driver_version: g.driver_version.as_deref(),
            cuda_version: g.cuda_version.as_deref(),
            pins: &g.pin_labels,
        }
    }
}

pub fn plan(input: &PlanInput<'_>) -> Plan {
    let options = input.options;
    let nodes: Vec<&NodeInventory> = input.inventory.nodes.values().collect();

    // Stage 1: validate. Invalid objects are reported and take no part.
    let mut classes: Vec<&AcceleratorClass> = input.classes.iter().collect();
    classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut class_reports: BTreeMap<String, ClassReport> = BTreeMap::new();
    for class in &classes {
        let errors = validate_class(&class.spec);
        class_reports.insert(
            name_of(&class.metadata),
            ClassReport {
                valid: errors.is_empty(),
                errors,
                ..Default::default()
            },
        );
    }

    // Stage 2: resolve classes to flavors. Device groups with the same hardware
    // signature are matched once, not once per node.
    let mut signatures: HashMap<Signature<'_>, Vec<Member>> = HashMap::new();
    for (ni, node) in nodes.iter().enumerate() {
        for (gi, group) in node.groups.iter().enumerate() {
            signatures
                .entry(Signature::of(group))
                .or_default()
                .push((ni, Some(gi)));
        }
    }
    let mut signature_list: Vec<(Signature<'_>, Vec<Member>)> = signatures.into_iter().collect();
    signature_list.sort_by(|a, b| a.1[0].cmp(&b.1[0]));
    let cpu_nodes: Vec<Member> = nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.has_accelerators())
        .map(|(i, _)| (i, None))
        .collect();
    let cpu_pool_pins = BTreeMap::from([(CPU_POOL_LABEL.to_string(), CPU_POOL_VALUE.to_string())]);
    let labelled_cpu_nodes: Vec<Member> = cpu_nodes
        .iter()
        .copied()
        .filter(|m| {
            nodes[m.0].labels.get(CPU_POOL_LABEL).map(String::as_str) == Some(CPU_POOL_VALUE)
        })
        .collect();

    // Flavors are interned: a class matching a whole signature builds its key once,
    // not once per node (the planner runs on every watch event of a large fleet).
    let mut interned: HashMap<FlavorKey, usize> = HashMap::new();
    let mut flavor_keys: Vec<FlavorKey> = Vec::new();
    let mut accs: Vec<FlavorAcc> = Vec::new();
    let mut owner: HashMap<Member, usize> = HashMap::new();
    let mut class_flavor_idx: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    let mut intern =
        |key: FlavorKey, keys: &mut Vec<FlavorKey>, accs: &mut Vec<FlavorAcc>| -> usize {
            *interned.entry(key).or_insert_with_key(|k| {
                keys.push(k.clone());
                accs.push(FlavorAcc::default());
                keys.len() - 1
            })
        };

    for class in &classes {
        let cname = name_of(&class.metadata);
        let report = class_reports.get_mut(&cname).expect("report exists");
        if !report.valid {
            continue;
        }
        let spec = &class.spec;
        let mut rejected: BTreeMap<String, String> = BTreeMap::new();
        let mut conflicts: BTreeSet<usize> = BTreeSet::new();
        let mut keys: BTreeSet<usize> = BTreeSet::new();

        let mut candidates: Vec<Candidate<'_>> = Vec::new();
        let empty = BTreeMap::new();
        let mut impure_cpu_pool: Vec<&str> = Vec::new();
        if spec.sharing == SharingMode::CpuOnly {
            // Without class node labels, kaccel's own pool label pins the flavor.
            let selector = if spec.selector.node_labels.is_empty() {
                if labelled_cpu_nodes.is_empty() {
                    rejected.insert(
                        "CPU pool".to_string(),
                        format!(
                            "no accelerator-free node carries {CPU_POOL_LABEL}={CPU_POOL_VALUE}: label the CPU-only nodes, or set spec.selector.nodeLabels"
                        ),
                    );
                }
                candidates.push((None, &cpu_pool_pins, &labelled_cpu_nodes));
                &cpu_pool_pins
            } else {
                candidates.push((None, &empty, &cpu_nodes));
                &spec.selector.node_labels
            };
            // Nodes with accelerators the CPU flavor's labels would select: CPU-only
            // pods could land there while none of their CPUs is counted.
            impure_cpu_pool = nodes
                .iter()
                .filter(|n| {
                    n.has_accelerators() && selector.iter().all(|(k, v)| n.labels.get(k) == Some(v))
                })
                .map(|n| n.name.as_str())
                .collect();
        } else {
            for (sig, members) in &signature_list {
                match hardware_mismatch(&spec.selector, spec.sharing, sig) {
                    None => candidates.push((Some(sig.variant), sig.pins, members)),
                    Some(reason) => {
                        if spec.sharing == sig.variant.sharing {
                            rejected.entry(sig.variant.model.clone()).or_insert(reason);
                        }
                    }
                }
            }
        }

        let per_node = !spec.selector.node_labels.is_empty() || !spec.pooling.split_by.is_empty();
        for (variant, pins, members) in candidates {
            let whole_signature = (!per_node).then(|| {
                intern(
                    FlavorKey {
                        variant: variant.cloned(),
                        pins: pins.clone(),
                        extra: BTreeMap::new(),
                    },
                    &mut flavor_keys,
                    &mut accs,
                )
            });
            for &member in members {
                let node = nodes[member.0];
                let idx = match whole_signature {
                    Some(idx) => idx,
                    None => {
                        if !spec
                            .selector
                            .node_labels
                            .iter()
                            .all(|(k, v)| node.labels.get(k) == Some(v))
                        {
                            continue;
                        }
                        let mut extra = spec.selector.node_labels.clone();
                        let mut split_ok = true;
                        for key in &spec.pooling.split_by {
                            match node.labels.get(key) {
                                Some(v) => {
                                    extra.insert(key.clone(), v.clone());
                                }
                                None => split_ok = false,
                            }
                        }
                        if !split_ok {
                            rejected
                                .entry(format!("node {}", node.name))
                                .or_insert_with(|| {
                                    format!(
                                        "lacks a pooling.splitBy label ({})",
                                        spec.pooling.split_by.join(", ")
                                    )
                                });
                            continue;
                        }
                        let key = FlavorKey {
                            variant: variant.cloned(),
                            pins: pins.clone(),
                            extra,
                        };
                        intern(key, &mut flavor_keys, &mut accs)
                    }
                };
                match owner.get(&member) {
                    Some(&existing) if existing != idx => {
                        conflicts.insert(existing);
                        continue;
                    }
                    Some(_) => {}
                    None => {
                        owner.insert(member, idx);
                        let acc = &mut accs[idx];
                        acc.members.push(member);
                        if let Some(gi) = member.1 {
                            acc.tolerated
                                .extend(node.groups[gi].vendor_taint_keys.iter().cloned());
                        }
                    }
                }
                keys.insert(idx);
            }
        }
        for &idx in &keys {
            accs[idx].classes.insert(cname.clone());
        }
        // Name the classes that pooled the contested devices first.
        let conflicts: BTreeSet<String> = conflicts
            .iter()
            .map(|&idx| {
                accs[idx]
                    .classes
                    .iter()
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .collect();

        if !conflicts.is_empty() {
            report.conditions.push(DesiredCondition::new(
                api::CONFLICT,
                true,
                "PoolingConflict",
                format!(
                    "some devices are already pooled differently by class(es) {}: classes sharing hardware must use the same spec.pooling.splitBy and spec.selector.nodeLabels; those devices are left out of this class",
                    conflicts.into_iter().collect::<Vec<_>>().join("; ")
                ),
            ));
        }
        if !impure_cpu_pool.is_empty() {
            let shown: Vec<&str> = impure_cpu_pool.iter().take(5).copied().collect();
            let condition = DesiredCondition::new(
                api::CONFLICT,
                true,
                "CpuPoolSelectsAccelerators",
                format!(
                    "{} node(s) with accelerators ({}{}) carry the CPU pool's node labels: CPU-only workloads could be placed there, and their CPUs are not counted; remove the label from them or narrow spec.selector.nodeLabels",
                    impure_cpu_pool.len(),
                    shown.join(", "),
                    if impure_cpu_pool.len() > shown.len() {
                        ", ..."
                    } else {
                        ""
                    }
                ),
            );
            // One condition per type: join a pooling conflict found above.
            match report
                .conditions
                .iter_mut()
                .find(|c| c.type_ == api::CONFLICT)
            {
                Some(existing) => {
                    existing.message = format!("{}; {}", existing.message, condition.message)
                }
                None => report.conditions.push(condition),
            }
        }
        if keys.is_empty() {
            let why = if rejected.is_empty() {
                "no node offers this sharing mode with the selected vendors and labels".to_string()
            } else {
                rejected
                    .iter()
                    .take(5)
                    .map(|(m, r)| format!("{m}: {r}"))
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            report.conditions.push(DesiredCondition::new(
                api::NO_MATCHING_HARDWARE,
                true,
                "NoDeviceMatches",
                format!("no device meets every hard requirement of this class ({why})"),
            ));
        }
        class_flavor_idx.insert(cname, keys);
    }

    // Back to key order, so names and output do not depend on discovery order.
    // A key interned by a class whose devices all turned out to be pooled by another
    // class has no class: it is nobody's flavor, so it is neither checked nor emitted.
    let mut flavors: BTreeMap<FlavorKey, FlavorAcc> = flavor_keys
        .iter()
        .cloned()
        .zip(accs)
        .filter(|(_, acc)| !acc.classes.is_empty())
        .collect();

    // Purity: a device flavor whose nodeLabels also select nodes of another variant
    // is refused, and every class that wanted it says so.
    let impure_flavors = refuse_impure_flavors(&mut flavors, &nodes, &mut class_reports);
    let class_flavor_keys: BTreeMap<String, BTreeSet<FlavorKey>> = class_flavor_idx
        .into_iter()
        .map(|(c, idx)| {
            let keys = idx
                .into_iter()
                .map(|i| &flavor_keys[i])
                .filter(|k| flavors.contains_key(*k))
                .cloned()
                .collect();
            (c, keys)
        })
        .collect();

    // Stage 3: name flavors, count health and healthy capacity.
    let mut flavor_names: BTreeMap<FlavorKey, String> = BTreeMap::new();
    let mut used_names: BTreeSet<String> = BTreeSet::new();
    for key in flavors.keys() {
        let mut name = flavor_name(key);
        if !used_names.insert(name.clone()) {
            name = names::bounded(
                &[
                    &name,
                    &format!("{:08x}", names::fnv1a(format!("{key:?}").as_bytes()) as u32),
                ],
                63,
            );
            used_names.insert(name.clone());
        }
        flavor_names.insert(key.clone(), name);
    }

    let mut reports: BTreeMap<String, FlavorReport> = BTreeMap::new();
    for (key, acc) in &flavors {
        let name = flavor_names[key].clone();
        let report = flavor_report(&name, key, acc, &nodes, input.health, options);
        reports.insert(name, report);
    }

    // Stage 4: preference order per class (health demotes flavors).
    let mut class_order: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for class in &classes {
        let cname = name_of(&class.metadata);
        let Some(keys) = class_flavor_keys.get(&cname) else {
            continue;
        };
        let mut names: Vec<&String> = keys.iter().map(|k| &flavor_names[k]).collect();
        names.sort_by_key(|n| {
            let r = &reports[*n];
            let rank = class
                .spec
                .preference
                .iter()
                .position(|p| names::glob_match(p, &r.model))
                .unwrap_or(usize::MAX);
            (r.demoted, rank, (*n).clone())
        });
        class_order.insert(cname, names.into_iter().cloned().collect());
    }

    // Stage 5: budgets -> demands -> quotas (invariant 1).
    // Oldest first, so a budget created later can never take a namespace from an
    // existing team (files without timestamps fall back to name order).
    let mut budgets: Vec<&CreditBudget> = input.budgets.iter().collect();
    budgets.sort_by(|a, b| {
        let created = |x: &CreditBudget| x.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (created(a).is_none(), created(a), &a.metadata.name).cmp(&(
            created(b).is_none(),
            created(b),
            &b.metadata.name,
        ))
    });
    let class_by_name: BTreeMap<String, &AcceleratorClass> =
        classes.iter().map(|c| (name_of(&c.metadata), *c)).collect();
    let mut budget_reports: BTreeMap<String, BudgetReport> = BTreeMap::new();
    let mut demands: Vec<Demand> = Vec::new();
    let mut namespace_owner: BTreeMap<&str, String> = BTreeMap::new();
    let mut budget_namespaces: BTreeMap<String, Vec<String>> = BTreeMap::new();

    for budget in &budgets {
        let bname = name_of(&budget.metadata);
        let errors = validate_budget(&budget.spec);
        let mut report = BudgetReport {
            valid: errors.is_empty(),
            errors,
            ..Default::default()
        };
        if report.valid {
            let mut taken = Vec::new();
            let mut own = Vec::new();
            for ns in &budget.spec.namespaces {
                match namespace_owner.get(ns.as_str()) {
                    Some(other) => taken.push(format!("{ns} (budget {other})")),
                    None => {
                        namespace_owner.insert(ns, bname.clone());
                        own.push(ns.clone());
                    }
                }
            }
            if !taken.is_empty() {
                report.conditions.push(DesiredCondition::new(
                    api::CONFLICT,
                    true,
                    "NamespaceClaimed",
                    format!(
                        "spec.namespaces: {} already belong to another budget; a namespace can hold the LocalQueues of one budget only: remove it here or there",
                        taken.join(", ")
                    ),
                ));
            }
            budget_namespaces.insert(bname.clone(), own);
            for grant in &budget.spec.classes {
                match class_by_name.get(&grant.name) {
                    None => report.conditions.push(DesiredCondition::new(
                        "ClassNotFound",
                        true,
                        "ClassNotFound",
                        format!(
                            "spec.classes: AcceleratorClass {:?} does not exist: create it or remove it from the budget; nothing is created for it",
                            grant.name
                        ),
                    )),
                    Some(_) if !class_reports[&grant.name].valid => {
                        report.conditions.push(DesiredCondition::new(
                            "ClassInvalid",
                            true,
                            "ClassInvalid",
                            format!(
                                "spec.classes: AcceleratorClass {:?} is invalid (see its Invalid condition); nothing is created for it until it is fixed",
                                grant.name
                            ),
                        ))
                    }
                    Some(_) => {
                        if grant.guaranteed_devices > 0 {
                            demands.push(Demand {
                                budget: bname.clone(),
                                class: grant.name.clone(),
                                amount: u64::from(grant.guaranteed_devices),
                                flavors: class_order.get(&grant.name).cloned().unwrap_or_default(),
                            });
                        }
                    }
                }
            }
        }
        budget_reports.insert(bname, report);
    }

    let capacity: BTreeMap<String, u64> = reports
        .iter()
        .map(|(n, r)| (n.clone(), r.healthy_capacity))
        .collect();
    let granted = allocate(&demands, &capacity);
    for (demand, grant) in demands.iter().zip(&granted) {
        let report = budget_reports
            .get_mut(&demand.budget)
            .expect("budget report");
        let total: u64 = grant.values().sum();
        for (flavor, amount) in grant {
            report
                .grants
                .insert((demand.class.clone(), flavor.clone()), *amount);
            reports.get_mut(flavor).expect("flavor").granted += amount;
        }
        if total < demand.amount {
            report.conditions.push(DesiredCondition::new(
                api::QUOTA_SHORTFALL,
                true,
                "NotEnoughHealthyCapacity",
                format!(
                    "class {}: {} of {} guaranteed devices fit in healthy capacity; the quota is lowered so Kueue never admits onto broken or missing hardware",
                    demand.class, total, demand.amount
                ),
            ));
        }
    }
    for r in reports.values_mut() {
        r.spare = r.healthy_capacity - r.granted;
    }

    // Stage 6: build the Kueue objects.
    let mut plan = Plan::default();
    for (key, name) in &flavor_names {
        let report = &reports[name];
        plan.resource_flavors.push(build_flavor(
            name,
            key,
            report,
            &flavors[key],
            &class_by_name,
        ));
    }
    plan.resource_flavors
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.cohorts.push(build_root_cohort(options, &reports));

    for budget in &budgets {
        let bname = name_of(&budget.metadata);
        let report = budget_reports.get_mut(&bname).expect("budget report");
        if !report.valid {
            continue;
        }
        let team_cohort = names::bounded(&[&options.root_cohort, &bname], 253);
        plan.cohorts.push(Cohort {
            metadata: meta(
                &team_cohort,
                None,
                labels_for(Some(budget), None),
                owner_ref(*budget),
            ),
            spec: CohortSpec {
                parent_name: Some(options.root_cohort.clone()),
                resource_groups: vec![],
                fair_sharing: Some(FairSharing {
                    weight: Some(team_weight(&budget.spec)),
                }),
            },
        });
        report.cohort = Some(team_cohort.clone());
        let held = options.held_budgets.get(&bname).copied();
        if let Some(policy) = held {
            report.conditions.push(DesiredCondition::new(
                api::EXHAUSTED,
                true,
                "CreditsExhausted",
                format!(
                    "the team's credits are used up: its ClusterQueues are on {} until credits return (new period or top-up)",
                    policy.as_str()
                ),
            ));
        }
        let namespaces = budget_namespaces.get(&bname).cloned().unwrap_or_default();
        for grant in &budget.spec.classes {
            let Some(class) = class_by_name.get(&grant.name) else {
                continue;
            };
            if !class_reports[&grant.name].valid {
                continue;
            }
            let cq_name = cluster_queue_name(&bname, &grant.name);
            let order = class_order.get(&grant.name).cloned().unwrap_or_default();
            let cq = build_cluster_queue(
                &cq_name,
                &team_cohort,
                budget,
                class,
                &order,
                &reports,
                &report.grants,
                &namespaces,
                held,
                options,
            );
            plan.cluster_queues.push(cq);
            report.cluster_queues.push(cq_name.clone());
            for ns in &namespaces {
                plan.local_queues.push(LocalQueue {
                    metadata: meta(
                        &grant.name,
                        Some(ns),
                        labels_for(Some(budget), Some(&grant.name)),
                        owner_ref(*budget),
                    ),
                    spec: LocalQueueSpec {
                        cluster_queue: cq_name.clone(),
                        stop_policy: None,
                    },
                });
                report.local_queues.push(format!("{ns}/{}", grant.name));
            }
        }
        let ready = report.conditions.iter().all(|c| !c.status);
        report.conditions.insert(
            0,
            if ready {
                DesiredCondition::new(
                    api::READY,
                    true,
                    "Planned",
                    format!(
                        "{} ClusterQueue(s) and {} LocalQueue(s) planned",
                        report.cluster_queues.len(),
                        report.local_queues.len()
                    ),
                )
            } else {
                let first = report
                    .conditions
                    .iter()
                    .find(|c| c.status)
                    .expect("a true condition");
                DesiredCondition::new(
                    api::READY,
                    false,
                    first.reason.clone(),
                    first.message.clone(),
                )
            },
        );
    }
    for (bname, report) in budget_reports.iter_mut() {
        if !report.valid {
            report.conditions = vec![
                DesiredCondition::new(api::READY, false, "Invalid", "the budget is invalid"),
                invalid_condition(&report.errors),
            ];
            let _ = bname;
        }
    }
    plan.cohorts
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.cluster_queues
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    plan.local_queues.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });

    // Stage 7: class status.
    for (cname, report) in class_reports.iter_mut() {
        if !report.valid {
            report.conditions = vec![
                DesiredCondition::new(
                    api::READY,
                    false,
                    "Invalid",
                    "the class is invalid; nothing is created for it",
                ),
                invalid_condition(&report.errors),
            ];
            continue;
        }
        let order = class_order.get(cname).cloned().unwrap_or_default();
        let mut devices = HealthCounts::default();
        for fname in &order {
            let r = &reports[fname];
            devices.add(&r.devices);
            report.flavors.push(ResolvedFlavor {
                name: fname.clone(),
                vendor: r
                    .vendor
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "none".into()),
                model: r.model.clone(),
                sharing: r.sharing.to_string(),
                partition_profile: r.partition_profile.clone(),
                resource_name: r.resource_name.clone(),
                nodes: r.nodes.len() as u32,
                devices: r.devices,
                healthy_capacity: r.healthy_capacity.min(u64::from(u32::MAX)) as u32,
                demoted: r.demoted,
            });
        }
        report.devices = devices;
        let out = devices.degraded + devices.failed;
        let demoted: Vec<&str> = report
            .flavors
            .iter()
            .filter(|f| f.demoted)
            .map(|f| f.name.as_str())
            .collect();
        if out > 0 || !demoted.is_empty() {
            let mut msg = format!(
                "{} of {} devices are degraded or failed and left out of quota",
                out,
                devices.total()
            );
            if !demoted.is_empty() {
                msg.push_str(&format!(
                    "; flavors moved later for health warnings: {}",
                    demoted.join(", ")
                ));
            }
            report.conditions.push(DesiredCondition::new(
                api::DEGRADED,
                true,
                "UnhealthyDevices",
                msg,
            ));
        } else {
            report.conditions.push(DesiredCondition::new(
                api::DEGRADED,
                false,
                "AllHealthy",
                "no device of this class is degraded or failed",
            ));
        }
        // Unknown is not unhealthy, but it must be visible (invariant 6).
        report.conditions.push(if devices.unknown > 0 {
            DesiredCondition::new(
                api::HEALTH_UNKNOWN,
                true,
                "NoFreshHealthData",
                format!(
                    "{} of {} devices have no fresh health data (a stale, unreachable or unparseable source, or a NotReady node); they still count as capacity and trigger no action, and undo none (devices last seen failed or degraded are counted as such until fresh readings show them healthy for the hold-down)",
                    devices.unknown,
                    devices.total()
                ),
            )
        } else {
            DesiredCondition::new(
                api::HEALTH_UNKNOWN,
                false,
                "HealthKnown",
                "every device has a fresh health reading or node status",
            )
        });
        let capacity: u64 = report
            .flavors
            .iter()
            .map(|f| u64::from(f.healthy_capacity))
            .sum();
        // A class left with no flavor because its flavors were refused as impure
        // says so, rather than blaming health.
        let blocking = report.conditions.iter().find(|c| {
            c.status
                && (c.type_ == api::NO_MATCHING_HARDWARE
                    || (c.reason == "ImpureFlavor" && report.flavors.is_empty()))
        });
        let ready = match blocking {
            Some(c) => {
                DesiredCondition::new(api::READY, false, c.reason.clone(), c.message.clone())
            }
            None if capacity == 0 => DesiredCondition::new(
                api::READY,
                false,
                "NoHealthyCapacity",
                "every device of this class is unschedulable, degraded or failed",
            ),
            None => DesiredCondition::new(
                api::READY,
                true,
                "Resolved",
                format!(
                    "{} flavor(s), {} healthy device(s) schedulable",
                    report.flavors.len(),
                    capacity
                ),
            ),
        };
        report.conditions.insert(0, ready);
    }

    plan.classes = class_reports;
    plan.budgets = budget_reports;
    plan.flavors = reports;
    plan.impure_flavors = impure_flavors;
    plan
}

/// The ClusterQueue kaccel generates for a budget's grant of a class.
/// Remove the device flavors that fail the purity check; report each on the classes
/// that would have used it (a `Conflict` condition, merged into one per class).
fn refuse_impure_flavors(
    flavors: &mut BTreeMap<FlavorKey, FlavorAcc>,
    nodes: &[&NodeInventory],
    class_reports: &mut BTreeMap<String, ClassReport>,
) -> Vec<ImpureFlavor> {
    let index = purity::LabelIndex::new(
        nodes,
        flavors
            .keys()
            .filter(|k| k.variant.is_some())
            .flat_map(|k| k.pins.keys().chain(k.extra.keys()).map(String::as_str)),
    );
    let mut refused = Vec::new();
    for (key, acc) in flavors.iter() {
        let Some(variant) = &key.variant else {
            continue;
        };
        let node_labels = key.node_labels();
        // A DRA claim can only be given a device its DeviceClass selects, so a DRA-only
        // flavor is checked against the nodes that publish devices of its class.
        let foreign_nodes = if crate::inventory::is_dra_device_class(&variant.resource_name) {
            purity::foreign_nodes_of_class(&index, variant, &node_labels)
        } else {
            purity::foreign_nodes(&index, variant, &node_labels)
        };
        if foreign_nodes.is_empty() {
            continue;
        }
        let impure = ImpureFlavor {
            flavor: flavor_name(key),
            variant: variant.clone(),
            node_labels,
            foreign_nodes,
        };
        for class in &acc.classes {
            if let Some(report) = class_reports.get_mut(class) {
                push_merged(
                    &mut report.conditions,
                    api::CONFLICT,
                    "ImpureFlavor",
                    impure.message(),
                );
            }
        }
        refused.push((key.clone(), impure));
    }
    refused
        .into_iter()
        .map(|(key, impure)| {
            flavors.remove(&key);
            impure
        })
        .collect()
}

/// Add a true condition, or append its message to a true one of the same type (a
/// status carries one condition per type).
fn push_merged(conditions: &mut Vec<DesiredCondition>, type_: &str, reason: &str, message: String) {
    match conditions.iter_mut().find(|c| c.type_ == type_ && c.status) {
        Some(existing) => {
            existing.message.push_str("; ");
            existing.message.push_str(&message);
        }
        None => conditions.push(DesiredCondition::new(type_, true, reason, message)),
    }
}

pub fn cluster_queue_name(budget: &str, class: &str) -> String {
    names::bounded(&[budget, class], 253)
}

fn invalid_condition(errors: &[FieldError]) -> DesiredCondition {
    DesiredCondition::new(
        api::INVALID,
        true,
        "FieldError",
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    )
}

fn name_of(meta: &ObjectMeta) -> String {
    meta.name.clone().unwrap_or_default()
}

/// Why a device signature fails a class's hard requirements; `None` if it passes.
/// A property the device does not publish fails a requirement on it: abstraction
/// must never hide a compatibility limit.
fn hardware_mismatch(
    sel: &api::HardwareSelector,
    sharing: SharingMode,
    sig: &Signature<'_>,
) -> Option<String> {
    let v = sig.variant;
    if v.sharing != sharing {
        return Some(format!("is {}, class wants {}", v.sharing, sharing));
    }
    if !sel.vendors.is_empty() && !sel.vendors.contains(&v.vendor) {
        return Some(format!("vendor {} not selected", v.vendor));
    }
    if !sel.models.is_empty() && !sel.models.iter().any(|m| names::glob_match(m, &v.model)) {
        return Some("model not selected".into());
    }
    if let Some(p) = &sel.partition_profile
        && v.partition_profile.as_deref() != Some(p.as_str())
    {
        return Some(format!(
            "partition {} is not {p}",
            v.partition_profile.as_deref().unwrap_or("none")
        ));
    }
    if let Some(min) = sel.min_memory_mib {
        match sig.memory_mib {
            Some(m) if m >= min => {}
            Some(m) => return Some(format!("memory {m} MiB below minMemoryMiB {min}")),
            None => return Some("memory not published, minMemoryMiB cannot be verified".into()),
        }
    }
    if !sel.architectures.is_empty() {
        match sig.architecture {
            Some(a) if sel.architectures.iter().any(|x| x.eq_ignore_ascii_case(a)) => {}
            Some(a) => return Some(format!("architecture {a} not allowed")),
            None => return Some("architecture not published".into()),
        }
    }
    for (what, want, have) in [
        (
            "minComputeCapability",
            &sel.min_compute_capability,
            sig.compute_capability,
        ),
        (
            "minDriverVersion",
            &sel.min_driver_version,
            sig.driver_version,
        ),
        ("minCudaVersion", &sel.min_cuda_version, sig.cuda_version),
    ] {
        if let Some(want) = want {
            match have.and_then(|h| names::version_at_least(h, want)) {
                Some(true) => {}
                Some(false) => {
                    return Some(format!("{} below {what} {want}", have.unwrap_or_default()));
                }
                None => return Some(format!("{what} {want} cannot be verified (not published)")),
            }
        }
    }
    None
}

fn flavor_name(key: &FlavorKey) -> String {
    let mut parts: Vec<String> = Vec::new();
    match &key.variant {
        Some(v) => {
            let model = names::slug(&v.model);
            let vendor = v.vendor.as_str();
            if !model.starts_with(vendor) {
                parts.push(vendor.to_string());
            }
            parts.push(model);
            match v.sharing {
                SharingMode::TimeShare => {
                    // Replicas of a MIG slice: the slice, then `shared`.
                    if let Some(profile) = &v.partition_profile {
                        parts.push(names::slug(profile));
                    }
                    parts.push("shared".into())
                }
                SharingMode::Partition => parts.push(names::slug(
                    v.partition_profile.as_deref().unwrap_or("part"),
                )),
                _ => {}
            }
        }
        None => parts.push("cpu".into()),
    }
    for value in key.extra.values() {
        let part = names::slug(value);
        if parts.last() != Some(&part) {
            parts.push(part);
        }
    }
    let refs: Vec<&str> = parts
        .iter()
        .map(String::as_str)
        .filter(|p| !p.is_empty())
        .collect();
    names::bounded(&refs, 63)
}

fn flavor_report(
    name: &str,
    key: &FlavorKey,
    acc: &FlavorAcc,
    nodes: &[&NodeInventory],
    health: &HealthSnapshot,
    options: &PlanOptions,
) -> FlavorReport {
    let mut report = FlavorReport {
        name: name.to_string(),
        vendor: key.variant.as_ref().map(|v| v.vendor),
        model: key
            .variant
            .as_ref()
            .map(|v| v.model.clone())
            .unwrap_or_else(|| "cpu".into()),
        sharing: key
            .variant
            .as_ref()
            .map(|v| v.sharing)
            .unwrap_or(SharingMode::CpuOnly),
        partition_profile: key
            .variant
            .as_ref()
            .and_then(|v| v.partition_profile.clone()),
        resource_name: key
            .variant
            .as_ref()
            .map(|v| v.resource_name.clone())
            .unwrap_or_else(|| CPU.into()),
        node_labels: key.node_labels(),
        tolerated_taint_keys: acc.tolerated.iter().cloned().collect(),
        classes: acc.classes.clone(),
        ..Default::default()
    };
    for &(ni, gi) in &acc.members {
        let node = nodes[ni];
        report.nodes.insert(node.name.clone());
        let schedulable = node.accepts_new_pods() && !blocking_taint(node, &acc.tolerated);
        match gi {
            Some(gi) => {
                let group = &node.groups[gi];
                let counts = health.counts_for(node, group);
                report.devices.add(&counts);
                if schedulable {
                    let usable = counts.healthy
                        + counts.warning
                        + if options.unknown_counts_as_capacity {
                            counts.unknown
                        } else {
                            0
                        };
                    report.healthy_capacity += u64::from(usable.min(group.allocatable));
                    // The node's CPU and memory are shared by its device groups in
                    // proportion to their device counts.
                    let node_devices: u64 = node.groups.iter().map(|g| u64::from(g.capacity)).sum();
                    let share = |total: u64| -> u64 {
                        if node_devices == 0 {
                            0
                        } else {
                            (u128::from(total) * u128::from(group.capacity)
                                / u128::from(node_devices)) as u64
                        }
                    };
                    report.cpu_millis += share(node.cpu_millis);
                    report.memory_bytes += share(node.memory_bytes);
                }
            }
            None => {
                let cores = (node.cpu_millis / 1000) as u32;
                if node.ready == Some(true) {
                    report.devices.healthy += cores;
                } else {
                    report.devices.unknown += cores;
                }
                if schedulable {
                    report.healthy_capacity += u64::from(cores);
                    report.cpu_millis += u64::from(cores) * 1000;
                    report.memory_bytes += node.memory_bytes;
                }
            }
        }
    }
    let total = u64::from(report.devices.total());
    let warning = u64::from(report.devices.warning);
    report.demoted =
        warning > 0 && warning * 100 >= u64::from(options.demote_warning_percent) * total.max(1);
    report
}

/// A NoSchedule/NoExecute taint the flavor does not tolerate keeps new pods off.
fn blocking_taint(node: &NodeInventory, tolerated: &BTreeSet<String>) -> bool {
    node.taints.iter().any(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute") && !tolerated.contains(&t.key)
    })
}

fn meta(
    name: &str,
    namespace: Option<&str>,
    labels: BTreeMap<String, String>,
    owners: Vec<OwnerReference>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels),
        owner_references: (!owners.is_empty()).then_some(owners),
        ..Default::default()
    }
}

fn labels_for(budget: Option<&CreditBudget>, class: Option<&str>) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([(MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string())]);
    if let Some(b) = budget {
        labels.insert(BUDGET_LABEL.into(), name_of(&b.metadata));
        labels.insert(TEAM_LABEL.into(), b.spec.team.clone());
    }
    if let Some(c) = class {
        labels.insert(CLASS_LABEL.into(), c.to_string());
    }
    labels
}

/// Owner reference to a kaccel object, when it came from the API server (has a UID).
fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> Vec<OwnerReference> {
    let meta = obj.meta();
    match (&meta.uid, &meta.name) {
        (Some(uid), Some(name)) => vec![OwnerReference {
            api_version: K::api_version(&()).to_string(),
            kind: K::kind(&()).to_string(),
            name: name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }],
        _ => vec![],
    }
}

fn build_flavor(
    name: &str,
    key: &FlavorKey,
    report: &FlavorReport,
    acc: &FlavorAcc,
    classes: &BTreeMap<String, &AcceleratorClass>,
) -> ResourceFlavor {
    let mut labels = labels_for(None, None);
    labels.insert(FLAVOR_LABEL.into(), name.to_string());
    // A flavor shared by several classes is owned by each of them (no controller
    // owner), so it goes away only when the last class using it does.
    let owners: Vec<OwnerReference> = acc
        .classes
        .iter()
        .filter_map(|c| classes.get(c))
        .flat_map(|c| owner_ref(*c))
        .map(|mut o| {
            o.controller = None;
            o
        })
        .collect();
    ResourceFlavor {
        metadata: meta(name, None, labels, owners),
        spec: ResourceFlavorSpec {
            node_labels: key.node_labels(),
            tolerations: report
                .tolerated_taint_keys
                .iter()
                .map(|k| k8s_openapi::api::core::v1::Toleration {
                    key: Some(k.clone()),
                    operator: Some("Exists".into()),
                    effect: Some("NoSchedule".into()),
                    ..Default::default()
                })
                .collect(),
        },
    }
}

fn build_root_cohort(options: &PlanOptions, reports: &BTreeMap<String, FlavorReport>) -> Cohort {
    let resource_groups = if reports.is_empty() {
        vec![]
    } else {
        let flavors: Vec<&FlavorReport> = reports.values().take(MAX_FLAVORS_PER_GROUP).collect();
        let covered = covered_resources(flavors.iter().copied());
        vec![ResourceGroup {
            flavors: flavors
                .iter()
                .map(|r| FlavorQuotas {
                    name: r.name.clone(),
                    resources: quotas_for(&covered, r, r.spare, None),
                })
                .collect(),
            covered_resources: covered,
        }]
    };
    Cohort {
        metadata: meta(&options.root_cohort, None, labels_for(None, None), vec![]),
        spec: CohortSpec {
            parent_name: None,
            resource_groups,
            fair_sharing: None,
        },
    }
}

/// Device resources of the flavors (sorted), then cpu and memory: Kueue refuses a
/// workload that requests a resource its ClusterQueue does not cover.
fn covered_resources<'a>(flavors: impl Iterator<Item = &'a FlavorReport>) -> Vec<String> {
    let devices: BTreeSet<String> = flavors
        .map(|r| r.resource_name.clone())
        .filter(|r| r != CPU)
        .collect();
    devices
        .into_iter()
        .chain([CPU.to_string(), MEMORY.to_string()])
        .collect()
}

/// Quotas of one flavor for every covered resource: `amount` units of the flavor's
/// own resource, the matching share of its CPU and memory, and 0 of the others.
fn quotas_for(
    covered: &[String],
    flavor: &FlavorReport,
    amount: u64,
    borrowing_limit: Option<u64>,
) -> Vec<ResourceQuota> {
    let share = |total: u64| -> u64 {
        if flavor.healthy_capacity == 0 {
            0
        } else {
            (u128::from(total) * u128::from(amount) / u128::from(flavor.healthy_capacity)) as u64
        }
    };
    let is_cpu_pool = flavor.resource_name == CPU;
    covered
        .iter()
        .map(|r| {
            let nominal = if r == CPU {
                cpu_quantity(if is_cpu_pool {
                    amount * 1000
                } else {
                    share(flavor.cpu_millis)
                })
            } else if r == MEMORY {
                Quantity(share(flavor.memory_bytes).to_string())
            } else if *r == flavor.resource_name {
                Quantity(amount.to_string())
            } else {
                Quantity("0".into())
            };
            ResourceQuota {
                name: r.clone(),
                nominal_quota: nominal,
                borrowing_limit: borrowing_limit.map(|b| Quantity(b.to_string())),
                lending_limit: None,
            }
        })
        .collect()
}

fn cpu_quantity(millis: u64) -> Quantity {
    if millis.is_multiple_of(1000) {
        Quantity((millis / 1000).to_string())
    } else {
        Quantity(format!("{millis}m"))
    }
}

/// Team weight: explicit, or credits per day (so a team with twice the budget gets
/// twice the share of idle capacity).
fn team_weight(spec: &api::CreditBudgetSpec) -> Quantity {
    if let Some(w) = &spec.fair_share_weight
        && let Ok(c) = w.parse::<Credits>()
    {
        return Quantity(format!("{}m", c.micros() / 1000));
    }
    let per_period = spec
        .credits
        .per_period
        .parse::<Credits>()
        .unwrap_or_default();
    let per_day_milli = per_period.micros() / 1000 / u64::from(spec.credits.period.days.max(1));
    Quantity(format!("{per_day_milli}m"))
}

#[allow(clippy::too_many_arguments)]
fn build_cluster_queue(
    name: &str,
    team_cohort: &str,
    budget: &CreditBudget,
    class: &AcceleratorClass,
    order: &[String],
    reports: &BTreeMap<String, FlavorReport>,
    grants: &BTreeMap<(String, String), u64>,
    namespaces: &[String],
    held: Option<ExhaustionPolicy>,
    options: &PlanOptions,
) -> ClusterQueue {
    let class_name = name_of(&class.metadata);
    let flavors: Vec<&FlavorReport> = order
        .iter()
        .take(MAX_FLAVORS_PER_GROUP)
        .map(|f| &reports[f])
        .collect();
    let resource_groups = if flavors.is_empty() {
        vec![]
    } else {
        let covered = covered_resources(flavors.iter().copied());
        let borrowing = (!budget.spec.allow_borrowing).then_some(0);
        vec![ResourceGroup {
            flavors: flavors
                .iter()
                .map(|r| FlavorQuotas {
                    name: r.name.clone(),
                    resources: quotas_for(
                        &covered,
                        r,
                        grants
                            .get(&(class_name.clone(), r.name.clone()))
                            .copied()
                            .unwrap_or(0),
                        borrowing,
                    ),
                })
                .collect(),
            covered_resources: covered,
        }]
    };
    ClusterQueue {
        metadata: meta(
            name,
            None,
            labels_for(Some(budget), Some(&class_name)),
            owner_ref(budget),
        ),
        spec: ClusterQueueSpec {
            cohort_name: Some(team_cohort.to_string()),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".into(),
                    operator: "In".into(),
                    values: Some(namespaces.to_vec()),
                }]),
                match_labels: None,
            }),
            resource_groups,
            queueing_strategy: Some(options.queueing_strategy.clone()),
            // Try every flavor before borrowing or preempting, so the preference
            // order (healthy flavors first) is what decides placement.
            flavor_fungibility: Some(FlavorFungibility {
                when_can_borrow: Some("TryNextFlavor".into()),
                when_can_preempt: Some("TryNextFlavor".into()),
            }),
            // A guarantee is nominal quota that others may borrow while it is
            // idle; Kueue's default (`Never`) would never give it back, so the
            // owner reclaims it by preempting borrowers.
            preemption: Some(ClusterQueuePreemption {
                reclaim_within_cohort: Some("Any".into()),
            }),
            stop_policy: Some(held.map(|p| p.as_str()).unwrap_or("None").to_string()),
            fair_sharing: None,
            admission_checks_strategy: options.admission_check.as_ref().map(|c| {
                AdmissionChecksStrategy {
                    admission_checks: vec![AdmissionCheckStrategyRule { name: c.clone() }],
                }
            }),
        },
        status: None,
    }
}

#[cfg(test)]
mod purity_tests;
#[cfg(test)]
mod tests;
