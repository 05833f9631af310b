//! Stage 2, resolve flavors: which devices each valid class pools, and into which flavor.

use std::collections::{BTreeMap, BTreeSet};

use foldhash::{HashMap, HashMapExt};

use crate::api::{self, AcceleratorClass, AcceleratorClassSpec, DesiredCondition, SharingMode};
use crate::health::HealthSnapshot;
use crate::inventory::{DeviceVariant, NodeInventory};

use super::hardware::{MODEL_NOT_SELECTED, Signature, hardware_mismatch};
use super::purity::LabelIndex;
use super::{CPU_POOL_LABEL, CPU_POOL_VALUE, ClassReport, name_of};
use crate::k8s::names;

/// Identity of a flavor: the variant (None for a CPU pool) plus every node label
/// that pins it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct FlavorKey {
    pub(super) variant: Option<DeviceVariant>,
    /// Labels the vendor adapter pins the variant with.
    pub(super) pins: BTreeMap<String, String>,
    /// Class node labels and `pooling.splitBy` values on top of the pins.
    pub(super) extra: BTreeMap<String, String>,
}

impl FlavorKey {
    pub(super) fn node_labels(&self) -> BTreeMap<String, String> {
        let mut all = self.pins.clone();
        all.extend(self.extra.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    /// The flavor's name before collisions are resolved (see [`name_flavors`]).
    pub(super) fn name(&self) -> String {
        let mut parts: Vec<String> = Vec::new();
        match &self.variant {
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
        for value in self.extra.values() {
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
}

/// Where a group of devices lives: node index and group index (None = the node's CPU).
pub(super) type Member = (usize, Option<usize>);

/// What a flavor gathers while classes resolve.
#[derive(Default)]
pub(super) struct FlavorAcc {
    /// The device groups (or CPU nodes) pooled into it.
    pub(super) members: Vec<Member>,
    /// The classes that use it.
    pub(super) classes: BTreeSet<String>,
    /// Vendor taint keys of its device groups, which it tolerates.
    pub(super) tolerated: BTreeSet<String>,
}

/// The output of resolution: every flavor some class uses, and each class's flavors.
#[derive(Default)]
pub(super) struct ResolvedFlavors {
    /// In key order, so names and output do not depend on discovery order.
    pub(super) flavors: BTreeMap<FlavorKey, FlavorAcc>,
    /// Valid class -> its flavors (empty when nothing matched).
    pub(super) class_flavors: BTreeMap<String, BTreeSet<FlavorKey>>,
}

/// Device groups that passed a class's hardware requirements: the variant (None
/// for a CPU pool), its pin labels, and where the groups are.
type Candidate<'a> = (
    Option<&'a DeviceVariant>,
    &'a BTreeMap<String, String>,
    &'a [Member],
);

/// The fleet indexed once for every class: device groups by signature, CPU nodes.
struct Fleet<'a> {
    nodes: &'a [&'a NodeInventory],
    /// Signatures in order of their first member, so discovery is deterministic.
    signatures: Vec<(Signature<'a>, Vec<Member>)>,
    /// Nodes without any accelerator.
    cpu_nodes: Vec<Member>,
    /// Of those, the ones carrying kaccel's CPU pool label.
    labelled_cpu_nodes: Vec<Member>,
    cpu_pool_pins: BTreeMap<String, String>,
    no_pins: BTreeMap<String, String>,
    /// Nodes by the labels CPU pools select with (their classes' node labels and
    /// kaccel's pool label), to find the nodes with accelerators a pool selects.
    cpu_pool_labels: LabelIndex<'a>,
}

impl<'a> Fleet<'a> {
    fn index(nodes: &'a [&'a NodeInventory], classes: &[&AcceleratorClass]) -> Self {
        let mut signatures: HashMap<Signature<'a>, Vec<Member>> = HashMap::new();
        for (ni, node) in nodes.iter().enumerate() {
            for (gi, group) in node.groups.iter().enumerate() {
                signatures
                    .entry(Signature::of(group))
                    .or_default()
                    .push((ni, Some(gi)));
            }
        }
        let mut signatures: Vec<(Signature<'a>, Vec<Member>)> = signatures.into_iter().collect();
        signatures.sort_by(|a, b| a.1[0].cmp(&b.1[0]));
        let cpu_nodes: Vec<Member> = nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.has_accelerators())
            .map(|(i, _)| (i, None))
            .collect();
        let labelled_cpu_nodes: Vec<Member> = cpu_nodes
            .iter()
            .copied()
            .filter(|m| nodes[m.0].labels.get(CPU_POOL_LABEL) == Some(CPU_POOL_VALUE))
            .collect();
        Fleet {
            nodes,
            signatures,
            cpu_nodes,
            labelled_cpu_nodes,
            cpu_pool_pins: BTreeMap::from([(
                CPU_POOL_LABEL.to_string(),
                CPU_POOL_VALUE.to_string(),
            )]),
            no_pins: BTreeMap::new(),
            // No CPU pool, no keys: the index then reads no node.
            cpu_pool_labels: LabelIndex::new(nodes, {
                let cpu_pools = classes
                    .iter()
                    .filter(|c| c.spec.sharing == SharingMode::CpuOnly);
                let pool_label = cpu_pools.clone().next().map(|_| CPU_POOL_LABEL);
                cpu_pools
                    .flat_map(|c| c.spec.selector.node_labels.keys().map(String::as_str))
                    .chain(pool_label)
            }),
        }
    }
}

/// Flavors interned in discovery order, and which flavor owns each member.
/// Interning lets a class matching a whole signature build its key once, not once
/// per node (the planner runs on every watch event of a large fleet).
struct Pool {
    interned: HashMap<FlavorKey, usize>,
    keys: Vec<FlavorKey>,
    accs: Vec<FlavorAcc>,
    owner: Owners,
}

/// Which flavor owns each member: a slot per node (its CPU) and per device group,
/// looked up by index (every class asks for every member it matches).
struct Owners {
    /// Node index -> its first slot; the CPU's slot, then one per group.
    first_slot: Vec<usize>,
    owner: Vec<Option<usize>>,
}

impl Owners {
    fn new(nodes: &[&NodeInventory]) -> Self {
        let mut first_slot = Vec::with_capacity(nodes.len());
        let mut slots = 0;
        for node in nodes {
            first_slot.push(slots);
            slots += 1 + node.groups.len();
        }
        Owners {
            first_slot,
            owner: vec![None; slots],
        }
    }

    fn slot(&self, (node, group): Member) -> usize {
        self.first_slot[node] + group.map_or(0, |g| g + 1)
    }

    fn get(&self, member: Member) -> Option<usize> {
        self.owner[self.slot(member)]
    }

    fn set(&mut self, member: Member, flavor: usize) {
        let slot = self.slot(member);
        self.owner[slot] = Some(flavor);
    }
}

impl Pool {
    fn intern(&mut self, key: FlavorKey) -> usize {
        let Pool {
            interned,
            keys,
            accs,
            ..
        } = self;
        *interned.entry(key).or_insert_with_key(|k| {
            keys.push(k.clone());
            accs.push(FlavorAcc::default());
            keys.len() - 1
        })
    }
}

/// What matching one class found, before it becomes conditions.
#[derive(Default)]
struct ClassMatch<'a> {
    /// Flavors the class pools devices into.
    flavors: BTreeSet<usize>,
    /// Flavors of other classes that already pooled devices this class wanted.
    conflicts: BTreeSet<usize>,
    /// What was turned down, and why (for the NoMatchingHardware message).
    rejected: BTreeMap<String, String>,
    /// Nodes with accelerators that a CPU pool's node labels select.
    impure_cpu_pool: Vec<&'a str>,
}

/// Resolves every valid class (in name order) to its flavors. A device belongs to
/// the first class that pools it; a later class pooling it differently gets a
/// `Conflict` condition, and a class that matches nothing a `NoMatchingHardware`
/// one, on its report in `class_reports`.
pub(super) fn resolve(
    classes: &[&AcceleratorClass],
    nodes: &[&NodeInventory],
    health: &HealthSnapshot,
    class_reports: &mut BTreeMap<String, ClassReport>,
) -> ResolvedFlavors {
    let fleet = Fleet::index(nodes, classes);
    let version_split = version_split(&fleet, classes, class_reports);
    let mut pool = Pool {
        interned: HashMap::new(),
        keys: Vec::new(),
        accs: Vec::new(),
        owner: Owners::new(nodes),
    };
    let mut class_flavor_idx: BTreeMap<String, BTreeSet<usize>> = BTreeMap::new();
    for class in classes {
        let cname = name_of(&class.metadata);
        let report = class_reports.get_mut(&cname).expect("report exists");
        if !report.valid {
            continue;
        }
        let mut found = ClassMatch::default();
        let candidates = candidates(&fleet, &class.spec, health, &mut found);
        pool_members(
            &fleet,
            &class.spec,
            &candidates,
            &version_split,
            &mut pool,
            &mut found,
        );
        for &idx in &found.flavors {
            pool.accs[idx].classes.insert(cname.clone());
        }
        report_match(report, &found, &pool);
        class_flavor_idx.insert(cname, found.flavors);
    }

    // A key interned by a class whose devices all turned out to be pooled by another
    // class has no class: it is nobody's flavor, so it is neither checked nor emitted.
    let class_flavors = class_flavor_idx
        .into_iter()
        .map(|(c, idx)| (c, idx.into_iter().map(|i| pool.keys[i].clone()).collect()))
        .collect();
    let flavors = pool
        .keys
        .into_iter()
        .zip(pool.accs)
        .filter(|(_, acc)| !acc.classes.is_empty())
        .collect();
    ResolvedFlavors {
        flavors,
        class_flavors,
    }
}

/// The device groups (or CPU nodes) that meet the class's hard requirements.
fn candidates<'a>(
    fleet: &'a Fleet<'a>,
    spec: &AcceleratorClassSpec,
    health: &HealthSnapshot,
    found: &mut ClassMatch<'a>,
) -> Vec<Candidate<'a>> {
    let mut candidates: Vec<Candidate<'a>> = Vec::new();
    if spec.sharing == SharingMode::CpuOnly {
        // Without class node labels, kaccel's own pool label pins the flavor.
        let selector = if spec.selector.node_labels.is_empty() {
            if fleet.labelled_cpu_nodes.is_empty() {
                found.rejected.insert(
                    "CPU pool".to_string(),
                    format!(
                        "no accelerator-free node carries {CPU_POOL_LABEL}={CPU_POOL_VALUE}: label the CPU-only nodes, or set spec.selector.nodeLabels"
                    ),
                );
            }
            candidates.push((None, &fleet.cpu_pool_pins, &fleet.labelled_cpu_nodes));
            &fleet.cpu_pool_pins
        } else {
            candidates.push((None, &fleet.no_pins, &fleet.cpu_nodes));
            &spec.selector.node_labels
        };
        // Nodes with accelerators the CPU flavor's labels would select: CPU-only
        // pods could land there while none of their CPUs is counted.
        found.impure_cpu_pool = fleet
            .cpu_pool_labels
            .select(selector)
            .into_iter()
            .map(|i| fleet.cpu_pool_labels.node(i))
            .filter(|n| n.has_accelerators())
            .map(|n| n.name.as_str())
            .collect();
    } else {
        for (sig, members) in &fleet.signatures {
            let mismatch = hardware_mismatch(&spec.selector, spec.sharing, sig)
                .or_else(|| firmware_mismatch(&spec.selector, fleet, members, health));
            match mismatch {
                None => candidates.push((Some(sig.variant), sig.pins, members)),
                Some(reason) => {
                    if spec.sharing == sig.variant.sharing {
                        found
                            .rejected
                            .entry(sig.variant.model.clone())
                            .or_insert(reason);
                    }
                }
            }
        }
    }
    candidates
}

/// Why a variant's cards fail the class's firmware allow-list, if they do: every
/// card on the nodes the class selects (its `selector.nodeLabels`) must last
/// have reported an allowed version. All or nothing per variant: no node label
/// or DRA attribute publishes firmware, so a flavor could not keep the class's
/// pods off the cards that fail. A card no exporter has reported on fails too
/// (it cannot be verified).
fn firmware_mismatch(
    sel: &api::HardwareSelector,
    fleet: &Fleet<'_>,
    members: &[Member],
    health: &HealthSnapshot,
) -> Option<String> {
    if sel.firmware_versions.is_empty() {
        return None;
    }
    // version -> nodes whose cards report it, for the ones not allowed
    let mut disallowed: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let mut unverified: BTreeSet<&str> = BTreeSet::new();
    for &(ni, gi) in members {
        let node = fleet.nodes[ni];
        let Some(group) = gi.map(|g| &node.groups[g]) else {
            continue;
        };
        if !node.labels.carries_all(&sel.node_labels) {
            continue;
        }
        let reported = health.firmware_of(&node.name, &group.variant.resource_name);
        let cards: u32 = reported.iter().flat_map(|r| r.values()).sum();
        // Partitions and replicas share their card's firmware: one reading each.
        let expected = match group.variant.sharing {
            SharingMode::Whole => group.capacity,
            _ => 1,
        };
        if cards < expected {
            unverified.insert(&node.name);
        }
        for version in reported.into_iter().flat_map(|r| r.keys()) {
            if !sel.firmware_versions.iter().any(|a| a == version) {
                disallowed.entry(version).or_default().insert(&node.name);
            }
        }
    }
    if disallowed.is_empty() && unverified.is_empty() {
        return None;
    }
    let nodes = |set: &BTreeSet<&str>| names::first_few(set.iter().copied(), 3);
    let mut why: Vec<String> = disallowed
        .iter()
        .map(|(version, on)| format!("firmware {version} on {}", nodes(on)))
        .collect();
    if !unverified.is_empty() {
        why.push(format!(
            "firmware not reported by an exporter for every card on {}",
            nodes(&unverified)
        ));
    }
    Some(format!(
        "{} (allowed: {}); no node label or DRA attribute publishes firmware, so pods cannot be kept off some cards of a flavor: update those cards, or label the compliant nodes and list the label in spec.selector.nodeLabels",
        why.join("; "),
        sel.firmware_versions.join(", ")
    ))
}

/// The variants (with their pins) whose nodes some class's minimum driver or CUDA
/// version splits: some of their device groups meet every requirement of that
/// class, others fail only the version. Their flavors are pinned to the version
/// labels (for every class, so classes sharing the hardware share the flavors):
/// otherwise the flavor's `nodeLabels` would let Kueue place the class's pods on
/// the older drivers the planner did not count. DRA-only groups need no pin: the
/// DeviceClass's CEL keeps claims off those devices.
fn version_split<'a>(
    fleet: &Fleet<'a>,
    classes: &[&AcceleratorClass],
    class_reports: &BTreeMap<String, ClassReport>,
) -> BTreeSet<(&'a DeviceVariant, &'a BTreeMap<String, String>)> {
    let mut split = BTreeSet::new();
    for class in classes {
        let spec = &class.spec;
        let sel = &spec.selector;
        let valid = class_reports
            .get(&name_of(&class.metadata))
            .is_some_and(|r| r.valid);
        if !valid || (sel.min_driver_version.is_none() && sel.min_cuda_version.is_none()) {
            continue;
        }
        let relaxed = api::HardwareSelector {
            min_driver_version: None,
            min_cuda_version: None,
            ..sel.clone()
        };
        let mut passing = BTreeSet::new();
        let mut version_failing = BTreeSet::new();
        for (sig, members) in &fleet.signatures {
            let dra_only = members
                .first()
                .is_some_and(|&(n, g)| g.is_some_and(|g| fleet.nodes[n].groups[g].is_dra_only()));
            if dra_only {
                continue;
            }
            let key = (sig.variant, sig.pins);
            if hardware_mismatch(sel, spec.sharing, sig).is_none() {
                passing.insert(key);
            } else if hardware_mismatch(&relaxed, spec.sharing, sig).is_none() {
                version_failing.insert(key);
            }
        }
        split.extend(passing.intersection(&version_failing).copied());
    }
    split
}

/// Puts each candidate member into its flavor: one flavor per signature, or, with
/// class node labels, `pooling.splitBy` or a version split ([`version_split`]), one
/// per distinct label values.
fn pool_members<'a>(
    fleet: &Fleet<'a>,
    spec: &AcceleratorClassSpec,
    candidates: &[Candidate<'a>],
    version_split: &BTreeSet<(&'a DeviceVariant, &'a BTreeMap<String, String>)>,
    pool: &mut Pool,
    found: &mut ClassMatch<'_>,
) {
    let per_class = !spec.selector.node_labels.is_empty() || !spec.pooling.split_by.is_empty();
    for &(variant, pins, members) in candidates {
        let by_version = variant.is_some_and(|v| version_split.contains(&(v, pins)));
        let per_node = per_class || by_version;
        let whole_signature = (!per_node).then(|| {
            pool.intern(FlavorKey {
                variant: variant.cloned(),
                pins: pins.clone(),
                extra: BTreeMap::new(),
            })
        });
        for &member in members {
            let node = fleet.nodes[member.0];
            let idx = match whole_signature {
                Some(idx) => idx,
                None => {
                    if !node.labels.carries_all(&spec.selector.node_labels) {
                        continue;
                    }
                    let mut extra = spec.selector.node_labels.clone();
                    let mut split_ok = true;
                    for key in &spec.pooling.split_by {
                        match node.labels.get(key) {
                            Some(v) => {
                                extra.insert(key.clone(), v.to_string());
                            }
                            None => split_ok = false,
                        }
                    }
                    if !split_ok {
                        found
                            .rejected
                            .entry(format!("node {}", node.name))
                            .or_insert_with(|| {
                                format!(
                                    "lacks a pooling.splitBy label ({})",
                                    spec.pooling.split_by.join(", ")
                                )
                            });
                        continue;
                    }
                    if by_version {
                        let versions = member
                            .1
                            .map(|g| &node.groups[g].version_labels)
                            .filter(|v| !v.is_empty());
                        let Some(versions) = versions else {
                            found
                                .rejected
                                .entry(format!("node {}", node.name))
                                .or_insert_with(|| {
                                    "its driver version is on no node label: a flavor could not keep pods of a class with a minimum version off older drivers".into()
                                });
                            continue;
                        };
                        extra.extend(versions.iter().map(|(k, v)| (k.clone(), v.clone())));
                    }
                    pool.intern(FlavorKey {
                        variant: variant.cloned(),
                        pins: pins.clone(),
                        extra,
                    })
                }
            };
            match pool.owner.get(member) {
                Some(existing) if existing != idx => {
                    found.conflicts.insert(existing);
                    continue;
                }
                Some(_) => {}
                None => {
                    pool.owner.set(member, idx);
                    let acc = &mut pool.accs[idx];
                    acc.members.push(member);
                    if let Some(gi) = member.1 {
                        acc.tolerated
                            .extend(node.groups[gi].vendor_taint_keys.iter().cloned());
                    }
                }
            }
            found.flavors.insert(idx);
        }
    }
}

/// The class's conditions from matching: pooling conflicts, a CPU pool that selects
/// accelerator nodes (one `Conflict` condition for both), and no match at all.
fn report_match(report: &mut ClassReport, found: &ClassMatch<'_>, pool: &Pool) {
    // Name the classes that pooled the contested devices first.
    let conflicts: BTreeSet<String> = found
        .conflicts
        .iter()
        .map(|&idx| {
            pool.accs[idx]
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
    let impure_cpu_pool = &found.impure_cpu_pool;
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
    if found.flavors.is_empty() {
        let why = if found.rejected.is_empty() {
            "no node offers this sharing mode with the selected vendors and labels".to_string()
        } else {
            // The models the class selects but turned down for another reason
            // first: they are what the platform team is looking for.
            let mut rejected: Vec<(&String, &String)> = found.rejected.iter().collect();
            rejected.sort_by_key(|(_, r)| r.as_str() == MODEL_NOT_SELECTED);
            rejected
                .into_iter()
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
}

/// Names every flavor. Two keys can slug to the same name (labels differing only
/// in case or punctuation); the later one in key order gets a hash of its key.
pub(super) fn name_flavors(
    flavors: &BTreeMap<FlavorKey, FlavorAcc>,
) -> BTreeMap<FlavorKey, String> {
    let mut flavor_names: BTreeMap<FlavorKey, String> = BTreeMap::new();
    let mut used_names: BTreeSet<String> = BTreeSet::new();
    for key in flavors.keys() {
        let mut name = key.name();
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
    flavor_names
}

#[cfg(test)]
mod tests;
