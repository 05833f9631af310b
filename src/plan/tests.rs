//! Planner tests, one file per subject: the example fleet, capacity, conflicts, the
//! invariants as properties over random fleets, purity on each vendor fleet. Here the
//! helpers they share: builders, the invariant and purity checks (they read the
//! generated Kueue objects and recount capacity from the inventory independently of
//! the planner's own report) and the strategies for random fleets.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use proptest::prelude::*;

use super::*;
use crate::api::{
    self, AcceleratorClassSpec, ClassGrant, CreditAllowance, CreditBudgetSpec, CreditRate,
    HardwareSelector, Period, Pooling,
};
use crate::inventory::synthetic::generate_fleet;
use crate::inventory::{DeviceGroup, DeviceVariant};

mod capacity;
mod conflicts;
mod driver_versions;
mod examples;
mod invariants;
mod purity_nvidia_amd;
mod purity_other_vendors;
mod unlabelled_models;

/// Plan a fleet of Nodes and DRA ResourceSlices, merged as the controller does.
pub(super) fn run_with_slices(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[Node],
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
    health: &HealthSnapshot,
) -> (Plan, Inventory) {
    let inventory = Inventory::from_nodes_and_slices(nodes, slices);
    let options = PlanOptions::default();
    let plan = plan(&PlanInput {
        classes,
        budgets,
        inventory: &inventory,
        health,
        options: &options,
    });
    (plan, inventory)
}

pub(super) fn class(
    name: &str,
    sharing: SharingMode,
    selector: HardwareSelector,
) -> AcceleratorClass {
    AcceleratorClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: AcceleratorClassSpec {
            description: None,
            sharing,
            selector,
            pooling: Pooling::default(),
            preference: vec![],
            devices_per_pod: vec![],
            pod_settings: vec![],
            topology: None,
            credits: CreditRate {
                per_device_hour: "1".into(),
                model_overrides: vec![],
            },
        },
        status: None,
    }
}

pub(super) fn budget(name: &str, namespaces: &[&str], grants: &[(&str, u32)]) -> CreditBudget {
    CreditBudget {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: CreditBudgetSpec {
            team: name.into(),
            namespaces: namespaces.iter().map(|s| s.to_string()).collect(),
            classes: grants
                .iter()
                .map(|(c, n)| ClassGrant {
                    name: c.to_string(),
                    guaranteed_devices: *n,
                })
                .collect(),
            credits: CreditAllowance {
                per_period: "3000".into(),
                period: Period {
                    start: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                        k8s_openapi::jiff::Timestamp::from_second(1_764_547_200).unwrap(),
                    ),
                    days: 30,
                },
                top_ups: Vec::new(),
            },
            fair_share_weight: None,
            on_exhaustion: ExhaustionPolicy::Hold,
            allow_borrowing: true,
            admission: Default::default(),
        },
        status: None,
    }
}

pub(super) fn run(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[Node],
    health: &HealthSnapshot,
) -> (Plan, Inventory) {
    run_with_slices(classes, budgets, nodes, &[], health)
}

fn examples() -> (Vec<AcceleratorClass>, Vec<CreditBudget>, Vec<Node>) {
    let loaded = crate::testkit::examples();
    (loaded.classes, loaded.budgets, loaded.nodes)
}

pub(super) fn qty(q: &Quantity) -> u64 {
    q.0.parse()
        .unwrap_or_else(|_| panic!("device quantity {q:?} is not an integer"))
}

/// Nominal quota of each (flavor, device resource) over every ClusterQueue and the
/// root Cohort.
pub(super) fn device_quota(plan: &Plan) -> BTreeMap<(String, String), u64> {
    let mut quota: BTreeMap<(String, String), u64> = BTreeMap::new();
    let groups = plan
        .cluster_queues
        .iter()
        .flat_map(|q| q.spec.resource_groups.iter())
        .chain(
            plan.cohorts
                .iter()
                .flat_map(|c| c.spec.resource_groups.iter()),
        );
    for rg in groups {
        for f in &rg.flavors {
            for r in &f.resources {
                if r.name != "cpu" && r.name != "memory" {
                    *quota.entry((f.name.clone(), r.name.clone())).or_default() +=
                        qty(&r.nominal_quota);
                }
            }
        }
    }
    quota
}

/// The flavor's nodeLabels select the node.
pub(super) fn selects(flavor: &ResourceFlavor, node: &NodeInventory) -> bool {
    node.labels.carries_all(&flavor.spec.node_labels)
}

/// New pods of the flavor could land on the node: Ready, not cordoned, and no
/// NoSchedule/NoExecute taint the flavor does not tolerate.
pub(super) fn open_to(flavor: &ResourceFlavor, node: &NodeInventory) -> bool {
    let tolerated: Vec<&str> = flavor
        .spec
        .tolerations
        .iter()
        .filter_map(|t| t.key.as_deref())
        .collect();
    let tainted = node.taints.iter().any(|t| {
        (t.effect == "NoSchedule" || t.effect == "NoExecute")
            && !tolerated.contains(&t.key.as_str())
    });
    node.accepts_new_pods() && !tainted
}

/// Invariant 1, recounted from scratch: for each flavor, the nominal quota of its
/// resource across every ClusterQueue and the root Cohort is at most the healthy,
/// schedulable devices on nodes carrying all of the flavor's node labels.
pub(super) fn assert_quota_within_healthy_capacity(
    plan: &Plan,
    inventory: &Inventory,
    health: &HealthSnapshot,
    unknown_counts: bool,
) {
    let quota = device_quota(plan);
    let transformed = kueue_counting::class_counted_resources(&plan.flavors);
    for flavor in &plan.resource_flavors {
        let fname = flavor.metadata.name.clone().unwrap();
        let report = &plan.flavors[&fname];
        // Every name a device of the flavor is asked for by: a DRA-only flavor's
        // quota is in the class resource alone, and the class resource counts a
        // device-plugin flavor's devices too; the inventory knows them under the
        // variant's.
        let resource = &report.device_resource_name;
        let healthy = healthy_devices(flavor, resource, inventory, health, unknown_counts);
        let mut by_name: BTreeMap<&str, u64> = BTreeMap::new();
        for ((qf, name), amount) in &quota {
            if *qf == fname {
                assert!(
                    *amount <= healthy,
                    "flavor {fname}: quota {amount} of {name} exceeds healthy capacity {healthy} of {resource}"
                );
                by_name.insert(name, *amount);
            }
        }
        // One device, one count: Kueue admitting as many workloads as the quotas
        // allow, asked for by every name in the worst mix, never admits more
        // devices than are healthy (the names' quotas together, not each alone).
        let admitted = kueue_admits_at_most(&by_name, &report.resource_name, &transformed);
        assert!(
            admitted <= healthy,
            "flavor {fname}: Kueue could admit {admitted} devices through {by_name:?} but only {healthy} are healthy"
        );
    }
}

/// Usable devices of `resource` on the schedulable nodes `flavor` selects.
fn healthy_devices(
    flavor: &ResourceFlavor,
    resource: &str,
    inventory: &Inventory,
    health: &HealthSnapshot,
    unknown_counts: bool,
) -> u64 {
    let mut healthy = 0u64;
    for node in inventory.nodes.values() {
        if !selects(flavor, node) || !open_to(flavor, node) {
            continue;
        }
        for g in node
            .groups
            .iter()
            .filter(|g| g.variant.resource_name == resource)
        {
            let c = health.counts_for(node, g);
            let usable = c.healthy + c.warning + if unknown_counts { c.unknown } else { 0 };
            healthy += u64::from(usable.min(g.allocatable));
        }
    }
    healthy
}

/// The most devices Kueue admits on one flavor whose quotas (summed over every
/// ClusterQueue and Cohort, all lendable) are `quota`, a workload asking for
/// `vendor` (the flavor's own resource) or the class resource, one device at a
/// time, in whichever order admits most. Kueue's counting, as its `Retain`
/// transformation does it: a vendor unit uses one of `vendor` and, when
/// `transformed` lists it, one class resource too; a class-resource unit uses
/// one class resource. A name the quotas do not cover cannot be asked for.
pub(super) fn kueue_admits_at_most(
    quota: &BTreeMap<&str, u64>,
    vendor: &str,
    transformed: &BTreeSet<&str>,
) -> u64 {
    let class_quota = quota.get(api::CLASS_RESOURCE).copied();
    // A DRA-only flavor: its claims and class requests are both the class resource.
    if vendor == api::CLASS_RESOURCE {
        return class_quota.unwrap_or(0);
    }
    let vendor_quota = quota.get(vendor).copied();
    let retained = transformed.contains(vendor);
    // Maximise vendor units x + class units y.
    match (vendor_quota, class_quota) {
        (None, None) => 0,
        // Transformed into a resource no queue covers: every vendor request refused.
        (Some(_), None) if retained => 0,
        (Some(v), None) => v,
        (None, Some(c)) => c,
        // x <= v and x + y <= c: the class quota bounds every mix.
        (Some(_), Some(c)) if retained => c,
        // Not transformed: x <= v and y <= c, two quotas usable in full.
        (Some(v), Some(c)) => v + c,
    }
}

/// Per flavor, the most devices Kueue admits through every name its quotas are
/// in (see [`kueue_admits_at_most`]).
pub(super) fn quota_per_flavor(plan: &Plan) -> BTreeMap<String, u64> {
    let quota = device_quota(plan);
    let transformed = kueue_counting::class_counted_resources(&plan.flavors);
    let mut by_flavor: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for ((flavor, name), amount) in &quota {
        by_flavor.entry(flavor).or_default().insert(name, *amount);
    }
    by_flavor
        .into_iter()
        .map(|(flavor, names)| {
            let own = plan
                .flavors
                .get(flavor)
                .map(|f| f.resource_name.as_str())
                .unwrap_or_default();
            (
                flavor.to_string(),
                kueue_admits_at_most(&names, own, &transformed),
            )
        })
        .collect()
}

fn variant_of(report: &FlavorReport) -> Option<DeviceVariant> {
    Some(DeviceVariant {
        vendor: report.vendor?,
        model: report.model.clone(),
        sharing: report.sharing,
        partition_profile: report.partition_profile.clone(),
        resource_name: report.device_resource_name.clone(),
    })
}

/// Purity and invariant 1 per variant, recounted from the inventory:
/// - every node a device flavor's nodeLabels select carries that flavor's kind of
///   device (vendor, model, sharing, partition; the resource name may differ), and a
///   device-plugin flavor's nodeLabels are never empty;
/// - the flavor's quota is at most the usable devices of exactly that variant on the
///   schedulable nodes it selects, and the quota of all flavors of one variant
///   together at most the usable devices of that variant in the fleet;
/// - every refused flavor is absent from the output and reported on a class.
fn assert_pure_and_within_variant_capacity(
    plan: &Plan,
    inventory: &Inventory,
    health: &HealthSnapshot,
) {
    let quota = quota_per_flavor(plan);
    let usable = |node: &NodeInventory, g: &DeviceGroup| -> u64 {
        let c = health.counts_for(node, g);
        u64::from((c.healthy + c.warning + c.unknown).min(g.allocatable))
    };
    let mut per_variant: BTreeMap<DeviceVariant, u64> = BTreeMap::new();
    for flavor in &plan.resource_flavors {
        let name = flavor.metadata.name.clone().unwrap();
        let report = &plan.flavors[&name];
        let Some(variant) = variant_of(report) else {
            continue;
        };
        // A DRA-only flavor's claims can only be given devices of its DeviceClass:
        // the nodes that publish such devices are the ones it must not mislead.
        let class = crate::inventory::is_dra_device_class(&variant.resource_name)
            .then_some(variant.resource_name.as_str());
        // A device-plugin flavor pins at least its vendor's presence label: with
        // none, it would select any node that joins later.
        assert!(
            class.is_some() || !flavor.spec.node_labels.is_empty(),
            "flavor {name} ({variant:?}) pins no node label"
        );
        let in_scope = |g: &DeviceGroup| {
            class.is_none_or(|c| crate::inventory::dra_device_class_of(g) == Some(c))
        };
        let mut capacity = 0u64;
        for node in inventory.nodes.values() {
            if !selects(flavor, node) {
                continue;
            }
            if class.is_some() && !node.groups.iter().any(in_scope) {
                continue;
            }
            assert!(
                node.groups
                    .iter()
                    .filter(|g| in_scope(g))
                    .any(|g| purity::same_device_kind(&g.variant, &variant)),
                "flavor {name} ({variant:?}) selects node {} which carries {:?}",
                node.name,
                node.groups.iter().map(|g| &g.variant).collect::<Vec<_>>()
            );
            if open_to(flavor, node) {
                // Quota is counted in the flavor's own resource: exactly its variant.
                capacity += node
                    .groups
                    .iter()
                    .filter(|g| g.variant == variant)
                    .map(|g| usable(node, g))
                    .sum::<u64>();
            }
        }
        let granted = quota.get(&name).copied().unwrap_or(0);
        assert!(
            granted <= capacity,
            "flavor {name}: quota {granted} exceeds the {capacity} usable devices of its variant"
        );
        *per_variant.entry(variant).or_default() += granted;
    }
    for (variant, granted) in per_variant {
        let fleet: u64 = inventory
            .groups()
            .filter(|(_, g)| g.variant == variant)
            .map(|(n, g)| usable(n, g))
            .sum();
        assert!(
            granted <= fleet,
            "{variant:?}: quota {granted} over all its flavors exceeds {fleet} devices"
        );
    }
    for impure in &plan.impure_flavors {
        assert!(impure.unpinned || !impure.foreign_nodes.is_empty());
        assert!(
            !plan
                .resource_flavors
                .iter()
                .any(|f| f.spec.node_labels == impure.node_labels
                    && plan.flavors[f.metadata.name.as_ref().unwrap()].device_resource_name
                        == impure.variant.resource_name),
            "refused flavor {} was emitted",
            impure.flavor
        );
        assert!(
            plan.classes.values().any(|c| {
                // One Conflict condition per class: an ImpureFlavor report may be
                // merged into an earlier Conflict (e.g. PoolingConflict) and keep its
                // reason.
                c.conditions.iter().any(|cond| {
                    cond.type_ == crate::api::CONFLICT && cond.message.contains(&impure.message())
                })
            }),
            "refused flavor {} is reported on no class: {:#?}",
            impure.flavor,
            plan.classes
                .iter()
                .map(|(n, c)| (n, &c.conditions))
                .collect::<Vec<_>>()
        );
    }
}

fn refused_messages(plan: &Plan) -> Vec<String> {
    plan.impure_flavors
        .iter()
        .map(ImpureFlavor::message)
        .collect()
}

// ---- strategies for properties over random fleets ----

fn vendor_subset(bits: u8) -> Vec<Vendor> {
    Vendor::ALL
        .iter()
        .enumerate()
        .filter(|(i, _)| bits & (1 << i) != 0)
        .map(|(_, v)| *v)
        .collect()
}

prop_compose! {
    fn arb_class(i: usize)(
        sharing in prop_oneof![Just(SharingMode::Whole), Just(SharingMode::Partition), Just(SharingMode::TimeShare), Just(SharingMode::CpuOnly)],
        vendors in any::<u8>(),
        min_memory in prop_oneof![Just(None), Just(Some(16_000u64)), Just(Some(40_000)), Just(Some(80_000))],
        profile in prop_oneof![Just("1g.10gb"), Just("3g.40gb"), Just("cpx_nps4"), Just("4c"), Just("neuroncore")],
        split in prop::bool::weighted(0.2),
        prefer_amd in any::<bool>(),
    ) -> AcceleratorClass {
        let sel = match sharing {
            SharingMode::CpuOnly => HardwareSelector::default(),
            _ => HardwareSelector {
                vendors: vendor_subset(vendors),
                min_memory_mib: if sharing == SharingMode::Whole { min_memory } else { None },
                partition_profile: (sharing == SharingMode::Partition).then(|| profile.to_string()),
                ..Default::default()
            },
        };
        let mut c = class(&format!("class-{i}"), sharing, sel);
        if split { c.spec.pooling.split_by = vec!["topology.kubernetes.io/zone".into()]; }
        if prefer_amd { c.spec.preference = vec!["*MI300X*".into()]; }
        c
    }
}

pub(super) fn arb_classes() -> impl Strategy<Value = Vec<AcceleratorClass>> {
    (1usize..7).prop_flat_map(|n| (0..n).map(arb_class).collect::<Vec<_>>())
}

pub(super) fn arb_budgets(classes: usize) -> impl Strategy<Value = Vec<CreditBudget>> {
    prop::collection::vec(
        prop::collection::vec((0..classes + 1, 0u32..120), 1..5),
        1..6,
    )
    .prop_map(|budgets| {
        budgets
            .into_iter()
            .enumerate()
            .map(|(i, grants)| {
                let mut seen = std::collections::BTreeSet::new();
                let grants: Vec<(String, u32)> = grants
                    .into_iter()
                    .filter(|(c, _)| seen.insert(*c))
                    .map(|(c, n)| (format!("class-{c}"), n)) // class-{classes} does not exist
                    .collect();
                let refs: Vec<(&str, u32)> = grants.iter().map(|(c, n)| (c.as_str(), *n)).collect();
                budget(&format!("team-{i}"), &[&format!("ns-{i}")], &refs)
            })
            .collect()
    })
}

pub(super) fn arb_health(nodes: &[Node], seed: u64) -> HealthSnapshot {
    let inventory = Inventory::from_nodes(nodes);
    let mut health = HealthSnapshot::default();
    let mut x = seed | 1;
    for (node, group) in inventory.groups() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if x.is_multiple_of(3) {
            let cap = group.capacity;
            let failed = (x >> 8) as u32 % (cap + 1);
            let warning = (x >> 16) as u32 % (cap - failed + 1);
            let unknown = (x >> 24) as u32 % (cap - failed - warning + 1);
            health.set(
                &node.name,
                &group.variant.resource_name,
                HealthCounts {
                    healthy: cap - failed - warning - unknown,
                    warning,
                    failed,
                    unknown,
                    ..Default::default()
                },
            );
        }
    }
    health
}
