//! Stage 4b, topology: the Kueue Topology each device flavor's nodes form, and,
//! per class that states a level, how many devices one Workload can get there.
//!
//! A flavor's levels are the topology labels ([`inventory::topology`]) every one
//! of its nodes carries, widest first; a flavor gets a Topology only when that
//! includes a level above the node (every node has a hostname, and a topology of
//! hostnames alone would only turn on Kueue's placement checks for nothing). One
//! Topology object per distinct set of levels, named after the levels and a hash
//! of their labels, so two label schemes with the same level names stay apart.
//!
//! Kueue makes a flavor's `topologyName` (and with it its node labels and
//! tolerations) immutable once set: the controller never writes a change of
//! them (see `controller::diff`), so the name depends only on the labels.
//!
//! [`inventory::topology`]: crate::inventory::topology

use std::collections::{BTreeMap, BTreeSet};

use crate::api::{
    AcceleratorClass, CLASS_RESOURCE, DesiredCondition, FlavorTopology, ResolvedFlavor,
    TopologyLevel,
};
use crate::health::HealthSnapshot;
use crate::inventory::topology::{LEVEL_LABELS, level_mask, level_of, mask_levels};
use crate::inventory::{NodeInventory, is_dra_device_class};
use crate::k8s::names;
use crate::kueue::{Topology, TopologyLevelSpec, TopologySpec};

use super::capacity::{schedulable, usable};
use super::flavors::{FlavorAcc, FlavorKey};
use super::{BudgetReport, ClassReport, Demand, FlavorReport, MANAGED_BY_LABEL, PlanOptions};

/// The class condition about topology, true when something keeps Workloads of
/// the class from asking Kueue for its level on all its flavors (true means
/// "look here", like `Degraded`); false says how to ask.
pub const TOPOLOGY_CONDITION: &str = "TopologyMismatch";
/// The budget condition, true when a guarantee fits in no single block.
pub const GUARANTEE_SPANS_BLOCKS: &str = "GuaranteeSpansBlocks";

/// A flavor's topology: the Topology object's name and its levels' labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FlavorLevels {
    pub name: String,
    pub levels: Vec<String>,
}

/// Each device flavor's topology, by flavor name (flavors without one absent).
/// CPU pools and DRA-only flavors get none: Kueue's placement counts node
/// allocatable, which holds neither a pool's cores as devices nor DRA devices.
pub(super) fn flavor_levels(
    flavors: &BTreeMap<FlavorKey, FlavorAcc>,
    flavor_names: &BTreeMap<FlavorKey, String>,
    nodes: &[&NodeInventory],
    options: &PlanOptions,
) -> BTreeMap<String, FlavorLevels> {
    if !options.topology_aware_scheduling {
        return BTreeMap::new();
    }
    let mut out = BTreeMap::new();
    for (key, acc) in flavors {
        let Some(variant) = &key.variant else {
            continue;
        };
        // Kueue requires node labels on a flavor with a topology.
        if is_dra_device_class(&variant.resource_name)
            || key.pins.is_empty() && key.extra.is_empty()
        {
            continue;
        }
        // The labels every node carries, as a mask over LEVEL_LABELS: a re-plan
        // of thousands of nodes allocates nothing per node here.
        let mut common: Option<u32> = None;
        for &(ni, _) in &acc.members {
            let here = level_mask(&nodes[ni].labels);
            common = Some(common.map_or(here, |so_far| so_far & here));
        }
        let Some(mask) = common else {
            continue;
        };
        let levels = mask_levels(mask);
        if !levels
            .iter()
            .any(|&(_, level)| level != TopologyLevel::Host)
        {
            continue;
        }
        let labels: Vec<String> = levels.iter().map(|(l, _)| l.to_string()).collect();
        out.insert(
            flavor_names[key].clone(),
            FlavorLevels {
                name: topology_name(&options.instance, &levels),
                levels: labels,
            },
        );
    }
    out
}

/// `<instance>-<level names>-<hash of the labels>`, e.g. `kaccel-zone-rack-host-1f2e3d4c`.
fn topology_name(instance: &str, levels: &[(&'static str, TopologyLevel)]) -> String {
    let kinds: Vec<String> = levels
        .iter()
        .map(|(_, level)| level.as_str().to_ascii_lowercase())
        .collect();
    let labels: Vec<&str> = levels.iter().map(|(l, _)| *l).collect();
    let hash = format!("{:08x}", names::fnv1a(labels.join(",").as_bytes()) as u32);
    let mut parts: Vec<&str> = vec![instance];
    parts.extend(kinds.iter().map(String::as_str));
    // The hash keeps its place at the end whatever the length.
    let head = names::bounded(&parts, 63 - hash.len() - 1);
    format!("{head}-{hash}")
}

/// One Topology object per distinct set of levels in use, by name.
pub(super) fn objects(levels: &BTreeMap<String, FlavorLevels>, instance: &str) -> Vec<Topology> {
    let distinct: BTreeMap<&str, &[String]> = levels
        .values()
        .map(|f| (f.name.as_str(), f.levels.as_slice()))
        .collect();
    distinct
        .into_iter()
        .map(|(name, labels)| {
            let mut topology = Topology::new(
                name,
                TopologySpec {
                    levels: labels
                        .iter()
                        .map(|l| TopologyLevelSpec {
                            node_label: l.clone(),
                        })
                        .collect(),
                },
            );
            topology.metadata.labels = Some(BTreeMap::from([(
                MANAGED_BY_LABEL.to_string(),
                instance.to_string(),
            )]));
            topology
        })
        .collect()
}

/// The blocks of one flavor at one level: how many domains hold its devices and
/// the healthy capacity of the fullest. A domain is named by the values of every
/// level down to this one, as Kueue names it (rack `r1` of two zones is two racks).
fn blocks_at(
    acc: &FlavorAcc,
    levels: &[String],
    depth: usize,
    nodes: &[&NodeInventory],
    health: &HealthSnapshot,
    options: &PlanOptions,
) -> (u32, u64) {
    let mut by_domain: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    let mut domain: Vec<&str> = Vec::with_capacity(depth + 1);
    for &(ni, gi) in &acc.members {
        let node = nodes[ni];
        domain.clear();
        domain.extend(
            levels[..=depth]
                .iter()
                .map(|l| node.labels.get(l).unwrap_or_default()),
        );
        // Looked up by slice; a new domain's key is allocated once.
        if !by_domain.contains_key(domain.as_slice()) {
            by_domain.insert(domain.clone(), 0);
        }
        let capacity = by_domain
            .get_mut(domain.as_slice())
            .expect("inserted above");
        if let Some(gi) = gi
            && schedulable(node, &acc.tolerated)
        {
            let group = &node.groups[gi];
            *capacity += usable(&health.counts_for(node, group), group.allocatable, options);
        }
    }
    let largest = by_domain.values().copied().max().unwrap_or(0);
    (by_domain.len() as u32, largest)
}

/// What the class and budget stages need from this one.
pub(super) struct TopologyInput<'a> {
    pub(super) class_by_name: &'a BTreeMap<String, &'a AcceleratorClass>,
    pub(super) flavors: &'a BTreeMap<FlavorKey, FlavorAcc>,
    pub(super) flavor_names: &'a BTreeMap<FlavorKey, String>,
    pub(super) flavor_reports: &'a BTreeMap<String, FlavorReport>,
    pub(super) nodes: &'a [&'a NodeInventory],
    pub(super) health: &'a HealthSnapshot,
    pub(super) options: &'a PlanOptions,
}

/// A flavor with a topology whose nodes Kueue cannot place on: Kueue's
/// configuration counts its vendor resource as the class resource too, and
/// Kueue v0.17's TAS checks that transformed request against node allocatable
/// when it reserves (`flavorassigner.ComputeTASNetUsage`), so a node that does
/// not advertise enough `kaccel.io/accelerator` never fits.
struct ClassResourceGap<'a> {
    resource: &'a str,
    nodes: Vec<&'a str>,
}

fn class_resource_gaps<'a>(
    input: &TopologyInput<'a>,
    acc_by_name: &BTreeMap<&str, &'a FlavorAcc>,
) -> BTreeMap<&'a str, ClassResourceGap<'a>> {
    let Some(Ok(config)) = input
        .options
        .kueue_configuration
        .as_ref()
        .map(|observed| observed.read.as_ref())
    else {
        return BTreeMap::new();
    };
    let transformed = config.transformations();
    let mut gaps = BTreeMap::new();
    for (name, report) in input.flavor_reports {
        if report.topology.is_none()
            || !transformed
                .get(report.device_resource_name.as_str())
                .is_some_and(|t| t.retains_one_per_unit(CLASS_RESOURCE))
        {
            continue;
        }
        let Some(acc) = acc_by_name.get(name.as_str()) else {
            continue;
        };
        let mut nodes: Vec<&str> = acc
            .members
            .iter()
            .filter_map(|&(ni, gi)| {
                let node = input.nodes[ni];
                let group = &node.groups[gi?];
                (node.class_resource_allocatable.unwrap_or(0) < group.allocatable)
                    .then_some(node.name.as_str())
            })
            .collect();
        nodes.dedup();
        if !nodes.is_empty() {
            gaps.insert(
                name.as_str(),
                ClassResourceGap {
                    resource: report.device_resource_name.as_str(),
                    nodes,
                },
            );
        }
    }
    gaps
}

/// Fills each valid class's flavors' topology (with the blocks at the class's
/// level) and sets its `TopologyMismatch` condition.
pub(super) fn classes(
    input: &TopologyInput<'_>,
    class_reports: &mut BTreeMap<String, ClassReport>,
) {
    let acc_by_name: BTreeMap<&str, &FlavorAcc> = input
        .flavors
        .iter()
        .map(|(key, acc)| (input.flavor_names[key].as_str(), acc))
        .collect();
    let gaps = class_resource_gaps(input, &acc_by_name);
    // Classes share flavors: each flavor's blocks at a depth are counted once.
    let mut blocks_seen: BTreeMap<(&str, usize), (u32, u64)> = BTreeMap::new();
    for (cname, report) in class_reports.iter_mut() {
        if !report.valid {
            continue;
        }
        let level = input
            .class_by_name
            .get(cname)
            .and_then(|c| c.spec.topology.as_ref())
            .map(|t| t.level);
        for flavor in &mut report.flavors {
            let Some(levels) = &input.flavor_reports[&flavor.name].topology else {
                continue;
            };
            let mut topology = FlavorTopology {
                name: levels.name.clone(),
                levels: levels.levels.clone(),
                ..Default::default()
            };
            if let Some(level) = level
                && let Some(depth) = levels
                    .levels
                    .iter()
                    .position(|l| level_of(l) == Some(level))
                && let Some((&key, &acc)) = acc_by_name.get_key_value(flavor.name.as_str())
            {
                let (blocks, largest) = match blocks_seen.get(&(key, depth)) {
                    Some(&seen) => seen,
                    None => {
                        let counted = blocks_at(
                            acc,
                            &levels.levels,
                            depth,
                            input.nodes,
                            input.health,
                            input.options,
                        );
                        blocks_seen.insert((key, depth), counted);
                        counted
                    }
                };
                topology.level_label = Some(levels.levels[depth].clone());
                topology.blocks = Some(blocks);
                topology.largest_block = Some(largest);
            }
            flavor.topology = Some(topology);
        }
        let condition = class_resource_condition(report, &gaps)
            .or_else(|| class_condition(report, level, input.options));
        if let Some(condition) = condition {
            report.conditions.push(condition);
        }
    }
}

/// `TopologyMismatch` on a class one of whose flavors Kueue cannot place on
/// (see [`ClassResourceGap`]): nothing else matters until that is fixed.
fn class_resource_condition(
    report: &ClassReport,
    gaps: &BTreeMap<&str, ClassResourceGap<'_>>,
) -> Option<DesiredCondition> {
    let stuck: Vec<String> = report
        .flavors
        .iter()
        .filter_map(|f| {
            let gap = gaps.get(f.name.as_str())?;
            Some(format!(
                "{} ({} as {CLASS_RESOURCE}; nodes {})",
                f.name,
                gap.resource,
                names::first_few(gap.nodes.iter().copied(), 3)
            ))
        })
        .collect();
    if stuck.is_empty() {
        return None;
    }
    Some(DesiredCondition::new(
        TOPOLOGY_CONDITION,
        true,
        "ClassResourceNotAdvertised",
        format!(
            "Kueue's configuration counts these flavors' devices as {CLASS_RESOURCE} too, and Kueue's Topology Aware Scheduling checks that against node allocatable, which these nodes do not advertise, so Kueue admits no Workload there: {}. Add {CLASS_RESOURCE} (their device count) to each node's status.capacity, or set planner.topologyAwareScheduling to false",
            stuck.join("; ")
        ),
    ))
}

/// `TopologyMismatch` on a class: for a class with a level, whether its flavors' nodes
/// carry it; for one without, whether its flavors mix topology and none (Kueue
/// gives a Workload that names no topology only the flavors without one).
fn class_condition(
    report: &ClassReport,
    level: Option<TopologyLevel>,
    options: &PlanOptions,
) -> Option<DesiredCondition> {
    let with: Vec<&str> = report
        .flavors
        .iter()
        .filter(|f| f.topology.is_some())
        .map(|f| f.name.as_str())
        .collect();
    let without: Vec<&str> = report
        .flavors
        .iter()
        .filter(|f| f.topology.is_none())
        .map(|f| f.name.as_str())
        .collect();
    let Some(level) = level else {
        if with.is_empty() || without.is_empty() {
            return None;
        }
        return Some(DesiredCondition::new(
            TOPOLOGY_CONDITION,
            true,
            "MixedTopology",
            format!(
                "flavors {} have a topology and {} do not: Kueue places a Workload that names no topology level only on {}, and one that does only on {}",
                with.join(", "),
                without.join(", "),
                without.join(", "),
                with.join(", ")
            ),
        ));
    };
    if !options.topology_aware_scheduling {
        return Some(DesiredCondition::new(
            TOPOLOGY_CONDITION,
            true,
            "TopologyDisabled",
            format!(
                "spec.topology.level is {level}, but this installation writes no Kueue Topology (planner.topologyAwareScheduling is false): set it to true in kaccel's config, or remove spec.topology"
            ),
        ));
    }
    // The flavors whose nodes carry the level (the topology stage set its label).
    let (labelled, missing): (Vec<&ResolvedFlavor>, Vec<&ResolvedFlavor>) = report
        .flavors
        .iter()
        .partition(|f| f.topology.as_ref().is_some_and(|t| t.level_label.is_some()));
    let level_labels: Vec<&str> = LEVEL_LABELS
        .iter()
        .filter(|(_, l)| *l == level)
        .map(|(label, _)| *label)
        .collect();
    if labelled.is_empty() {
        return Some(DesiredCondition::new(
            TOPOLOGY_CONDITION,
            true,
            "LevelNotLabelled",
            format!(
                "spec.topology.level is {level}, but the nodes of no flavor of this class all carry a {level} label ({}): label them, or choose a level they carry",
                level_labels.join(", ")
            ),
        ));
    }
    let labels: BTreeSet<&str> = labelled
        .iter()
        .filter_map(|f| f.topology.as_ref()?.level_label.as_deref())
        .collect();
    let resources: BTreeSet<&str> = labelled.iter().map(|f| f.resource_name.as_str()).collect();
    let (largest_flavor, largest) = labelled
        .iter()
        .map(|f| {
            let largest = f.topology.as_ref().and_then(|t| t.largest_block);
            (f.name.as_str(), largest.unwrap_or(0))
        })
        .max_by_key(|&(name, largest)| (largest, std::cmp::Reverse(name)))
        .expect("not empty");
    let ask = format!(
        "Workloads ask for one {level} with kueue.x-k8s.io/podset-required-topology: {}, and for {} rather than {} (Kueue places them by node allocatable); the fullest holds {largest} healthy devices (flavor {largest_flavor})",
        labels.into_iter().collect::<Vec<_>>().join(" or "),
        resources.into_iter().collect::<Vec<_>>().join(" or "),
        CLASS_RESOURCE
    );
    if missing.is_empty() {
        Some(DesiredCondition::new(
            TOPOLOGY_CONDITION,
            false,
            "LevelLabelled",
            ask,
        ))
    } else {
        Some(DesiredCondition::new(
            TOPOLOGY_CONDITION,
            true,
            "LevelMissing",
            format!(
                "the nodes of flavors {} do not all carry a {level} label ({}), so Kueue places no Workload that requires one there; {ask}",
                missing
                    .iter()
                    .map(|f| f.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                level_labels.join(", ")
            ),
        ))
    }
}

/// `GuaranteeSpansBlocks` on each valid budget whose guarantee of a class with
/// a level exceeds the fullest block of every flavor of the class: its queue
/// holds that quota, but no one Workload can use it all (true), or it fits
/// (false). Added after `Ready`: the queues work either way.
pub(super) fn budgets(
    demands: &[Demand],
    class_reports: &BTreeMap<String, ClassReport>,
    class_by_name: &BTreeMap<String, &AcceleratorClass>,
    budget_reports: &mut BTreeMap<String, BudgetReport>,
) {
    let mut spans: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    let mut fits: BTreeSet<&str> = BTreeSet::new();
    for demand in demands {
        let Some(level) = class_by_name
            .get(&demand.class)
            .and_then(|c| c.spec.topology.as_ref())
            .map(|t| t.level)
        else {
            continue;
        };
        let Some(largest) = class_reports.get(&demand.class).and_then(|r| {
            r.flavors
                .iter()
                .filter_map(|f| f.topology.as_ref()?.largest_block)
                .max()
        }) else {
            continue;
        };
        if demand.amount > largest {
            spans.entry(&demand.budget).or_default().push(format!(
                "the guarantee of {} {} devices fits in no single {level}: the fullest holds {largest} healthy devices, the most one Workload can get",
                demand.amount, demand.class
            ));
        } else {
            fits.insert(&demand.budget);
        }
    }
    for (name, report) in budget_reports.iter_mut() {
        if !report.valid {
            continue;
        }
        if let Some(messages) = spans.get(name.as_str()) {
            report.conditions.push(DesiredCondition::new(
                GUARANTEE_SPANS_BLOCKS,
                true,
                "GuaranteeExceedsBlock",
                messages.join("; "),
            ));
        } else if fits.contains(name.as_str()) {
            report.conditions.push(DesiredCondition::new(
                GUARANTEE_SPANS_BLOCKS,
                false,
                "FitsInBlock",
                "every guarantee of a class with a topology level fits in one of its blocks",
            ));
        }
    }
}

#[cfg(test)]
mod tests;
