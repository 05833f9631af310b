//! The purity check: a device flavor's `nodeLabels` must select only nodes that carry
//! its variant (the same kind of device: vendor, model, sharing, partition).
//!
//! Kueue counts a workload against the flavor it assigned and then pins the pods with
//! the flavor's `nodeLabels`; nothing else keeps them off other hardware. A flavor
//! whose labels also select a node of another variant (a whole-GPU flavor matching a
//! MIG or time-sliced node of the same product, a whole MI300X flavor matching a CPX
//! node) hands out quota in one unit and devices in another, which breaks invariant 1
//! however the quota was computed. Vendor adapters pin what tells variants apart;
//! this check is the backstop that makes a missed case visible instead of shipped:
//! the planner refuses such a flavor and reports it on every class that wanted it,
//! naming what would tell the variants apart in the vendor's own labels.
//!
//! A DRA-only flavor (its resource is a DeviceClass) is checked against the nodes
//! that publish devices of that class: a claim can only be given such a device.
//!
//! Stage 3 of the planner, `refuse_impure`, applies the check to the resolved flavors.

use std::collections::BTreeMap;
use std::sync::Arc;

use foldhash::{HashMap, HashMapExt};

use crate::api::{self, DesiredCondition};
use crate::inventory::{DeviceVariant, NodeInventory, SharingMode, Vendor};

use super::ClassReport;
use super::flavors::{FlavorKey, ResolvedFlavors};

/// At most this many offending nodes are named in a report.
const NAMED_NODES: usize = 5;

/// A flavor the planner refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ImpureFlavor {
    /// The name the flavor would have had.
    pub flavor: String,
    pub variant: DeviceVariant,
    pub node_labels: BTreeMap<String, String>,
    /// Nodes the labels select that carry no device of the variant (sorted, all).
    pub foreign_nodes: Vec<String>,
    /// The vendor adapter pinned no node label for the variant (a class's own
    /// selector does not count): its nodeLabels would select any node that joins.
    pub unpinned: bool,
}

impl ImpureFlavor {
    pub fn message(&self) -> String {
        if self.unpinned {
            return format!(
                "flavor {} ({} {} on {}) not created: no vendor label pins its devices, so its nodeLabels would pin nothing (Kueue could place its pods' cpu and memory on any node, a CPU node that joins later included, and another model without labels would share the flavor); run the vendor's labeller, or label the nodes {}=<model>",
                self.flavor,
                self.variant.vendor,
                self.variant.model,
                self.variant.resource_name,
                crate::inventory::MODEL_LABEL,
            );
        }
        let shown = crate::k8s::names::first_few(
            self.foreign_nodes.iter().map(String::as_str),
            NAMED_NODES,
        );
        let labels: Vec<String> = self
            .node_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        format!(
            "flavor {} ({} {} {}{} on {}) not created: its nodeLabels {{{}}} also select {} node(s) without that variant ({}), so quota in one unit would be spent on other hardware; {}",
            self.flavor,
            self.variant.vendor,
            self.variant.model,
            self.variant.sharing,
            self.variant
                .partition_profile
                .as_deref()
                .map(|p| format!(" {p}"))
                .unwrap_or_default(),
            self.variant.resource_name,
            labels.join(", "),
            self.foreign_nodes.len(),
            shown,
            self.fix(),
        )
    }

    /// What would tell the variants apart, in the words of the vendor's stack.
    fn fix(&self) -> String {
        let v = &self.variant;
        if crate::inventory::is_dra_device_class(&v.resource_name) {
            return format!(
                "the selected nodes publish other devices under DeviceClass {} and no node label names this model: label its nodes {}={} (or run the vendor's labeller) so the flavor is pinned, or narrow the class with spec.selector.nodeLabels",
                v.resource_name,
                crate::inventory::MODEL_LABEL,
                v.model
            );
        }
        match (v.vendor, v.sharing) {
            (Vendor::Huawei, SharingMode::Partition) => "the Ascend device plugin (MindCluster) writes no node label that tells nodes with static vNPU templates from nodes of whole NPUs of the same chip (it writes accelerator, servertype, node.kubernetes.io/npu.chip.name and mind-cluster/npu-chip-memory on both): label the two kinds of nodes differently (e.g. npu-mode=vnpu and npu-mode=whole) and select them with spec.selector.nodeLabels in each class".to_string(),
            (Vendor::Huawei, _) => "set accelerator-type on the nodes as in MindCluster's node-label table (module, half or card for first-generation Atlas 800/300T, module-910b-8, module-a3-16, ...), or run an Ascend device plugin that writes node.kubernetes.io/npu.chip.name and servertype; nodes whose NPUs are all cut into static vNPUs need a label of their own, selected with spec.selector.nodeLabels".to_string(),
            (Vendor::Aws, _) => format!(
                "label every Neuron node of this instance type {}=device or =core: the view is pinned only where the label names it, so an unlabelled node's device flavor also selects nodes read in the core view",
                crate::inventory::NEURON_VIEW_LABEL
            ),
            _ => "label the nodes so the variants differ (e.g. run the vendor labeller with its sharing/partition labels) or narrow the class with spec.selector.nodeLabels".to_string(),
        }
    }
}

/// Node lookup by label, restricted to the label keys some flavor pins.
pub(crate) struct LabelIndex<'a> {
    nodes: &'a [&'a NodeInventory],
    /// (key, value) -> the indices of the nodes carrying it, ascending.
    postings: HashMap<(&'a str, &'a str), Vec<usize>>,
}

impl<'a> LabelIndex<'a> {
    pub(crate) fn new<'k>(
        nodes: &'a [&'a NodeInventory],
        keys: impl IntoIterator<Item = &'k str>,
    ) -> Self {
        let keys: Vec<&str> = {
            let mut k: Vec<&str> = keys.into_iter().collect();
            k.sort_unstable();
            k.dedup();
            k
        };
        // Keys and a node's labels are both sorted: one walk over the two finds
        // the node's indexed labels, fewer comparisons than a search per key (label
        // keys share long prefixes such as `nvidia.com/gpu.`, so each comparison
        // is a long one) and no hashing of every label a node carries.
        let mut postings: HashMap<(&'a str, &'a str), Vec<usize>> = HashMap::new();
        if !keys.is_empty() {
            for (i, node) in nodes.iter().enumerate() {
                let mut wanted = keys.iter().copied().peekable();
                for (k, v) in &node.labels {
                    while wanted.next_if(|key| *key < k).is_some() {}
                    match wanted.peek() {
                        Some(key) if *key == k => {
                            postings.entry((k, v)).or_default().push(i);
                            wanted.next();
                        }
                        Some(_) => {}
                        None => break,
                    }
                }
            }
        }
        LabelIndex { nodes, postings }
    }

    /// Indices of the nodes carrying every label (all nodes for no labels), in
    /// ascending order. Every label's key must be one the index was built with.
    pub(crate) fn select(&self, labels: &BTreeMap<String, String>) -> Vec<usize> {
        let mut lists: Vec<&[usize]> = labels
            .iter()
            .map(|(k, v)| {
                self.postings
                    .get(&(k.as_str(), v.as_str()))
                    .map_or(&[][..], Vec::as_slice)
            })
            .collect();
        lists.sort_by_key(|list| list.len());
        match lists.split_first() {
            // The narrowest list, kept where every other list holds the node too.
            Some((narrowest, others)) => narrowest
                .iter()
                .copied()
                .filter(|i| others.iter().all(|list| list.binary_search(i).is_ok()))
                .collect(),
            None => (0..self.nodes.len()).collect(),
        }
    }

    /// The node at `index` (from [`LabelIndex::select`]).
    pub(crate) fn node(&self, index: usize) -> &'a NodeInventory {
        self.nodes[index]
    }
}

/// Whether two variants are the same kind of device (vendor, model, sharing,
/// partition), whatever resource name the device plugin gives it: one node may
/// advertise CPX partitions as `amd.com/gpu` (`single` naming) and another as
/// `amd.com/cpx_nps4` (`mixed`); a flavor of one selecting the other sends no pod to
/// other hardware, as pods request the flavor's own resource.
pub(crate) fn same_device_kind(a: &DeviceVariant, b: &DeviceVariant) -> bool {
    a.vendor == b.vendor
        && a.model == b.model
        && a.sharing == b.sharing
        && a.partition_profile == b.partition_profile
}

/// Whether a node the flavor's labels select makes a flavor of `variant` impure:
/// it carries no device of the variant's kind. `class`: a DRA-only flavor's
/// DeviceClass, for which only nodes publishing devices of that class count (a
/// node without such devices cannot satisfy the flavor's claims, whatever its
/// labels: the scheduler places a claim by ResourceSlice, on top of the flavor's
/// nodeLabels), and only the devices a claim of it can be given.
fn lacks_variant(node: &NodeInventory, variant: &DeviceVariant, class: Option<&str>) -> bool {
    let in_scope = |g: &&crate::inventory::DeviceGroup| {
        class.is_none_or(|c| crate::inventory::dra_device_class_of(g) == Some(c))
    };
    (class.is_none() || node.groups.iter().any(|g| in_scope(&g)))
        && !node
            .groups
            .iter()
            .filter(in_scope)
            .any(|g| same_device_kind(&g.variant, variant))
}

/// The DeviceClass a flavor of `variant` is checked within: its resource, when
/// that is a DeviceClass (a DRA-only flavor); None for a device-plugin flavor.
fn class_scope(variant: &DeviceVariant) -> Option<&str> {
    crate::inventory::is_dra_device_class(&variant.resource_name)
        .then_some(variant.resource_name.as_str())
}

/// The purity verdicts of the last plan, and the nodes they were reached on, so
/// that a re-plan after a few Nodes changed checks those Nodes, not the fleet.
/// Whether a node makes a flavor impure follows from that node alone (its
/// labels and devices: `Labels::carries_all`, [`lacks_variant`]): the last verdict less
/// the nodes that changed, plus those of them that now make the flavor impure,
/// is the verdict a full check reaches. A flavor the last plan did not check,
/// or more than `recheck_limit` changed nodes, get the full check. Holding the
/// nodes costs a map of their keys and shared pointers, not copies of them.
#[derive(Debug)]
pub(crate) struct Verdicts {
    /// The inventory's nodes when the verdicts were reached, by inventory key.
    /// Held, so an unchanged node is known by its address: a changed node is a
    /// new `Arc`, and no other node can take an address while it is held.
    nodes: BTreeMap<String, Arc<NodeInventory>>,
    /// Each device flavor checked -> the inventory keys of the nodes that make it
    /// impure (usually none).
    foreign: HashMap<FlavorKey, Vec<String>>,
    recheck_limit: usize,
    /// Nodes the last plan checked one by one; None when it checked some flavor
    /// against the fleet.
    pub(crate) last_rechecked: Option<usize>,
}

impl Default for Verdicts {
    fn default() -> Self {
        Verdicts {
            nodes: BTreeMap::new(),
            foreign: HashMap::new(),
            // Past this, building the label index and checking every flavor
            // against it costs less than checking each changed node.
            recheck_limit: 64,
            last_rechecked: None,
        }
    }
}

impl Verdicts {
    /// The keys of the nodes added, removed or changed since the verdicts were
    /// reached, in key order; None when more than `recheck_limit` did.
    fn changed_nodes(&self, now: &BTreeMap<String, Arc<NodeInventory>>) -> Option<Vec<String>> {
        use std::cmp::Ordering;
        let mut changed = Vec::new();
        let mut last = self.nodes.iter().peekable();
        let mut current = now.iter().peekable();
        loop {
            let key = match (last.peek(), current.peek()) {
                (None, None) => break,
                (Some((key, _)), None) => {
                    let key = *key;
                    last.next();
                    key
                }
                (None, Some((key, _))) => {
                    let key = *key;
                    current.next();
                    key
                }
                (Some((last_key, last_node)), Some((key, node))) => match last_key.cmp(key) {
                    Ordering::Less => {
                        let key = *last_key;
                        last.next();
                        key
                    }
                    Ordering::Greater => {
                        let key = *key;
                        current.next();
                        key
                    }
                    Ordering::Equal => {
                        let same = Arc::ptr_eq(last_node, node);
                        let key = *key;
                        last.next();
                        current.next();
                        if same {
                            continue;
                        }
                        key
                    }
                },
            };
            changed.push(key.clone());
            if changed.len() > self.recheck_limit {
                return None;
            }
        }
        Some(changed)
    }

    /// Holds `now`'s nodes for the next plan: the changed ones replaced, or all.
    fn hold(&mut self, now: &BTreeMap<String, Arc<NodeInventory>>, changed: Option<&[String]>) {
        match changed {
            Some(changed) => {
                for key in changed {
                    match now.get(key) {
                        Some(node) => {
                            self.nodes.insert(key.clone(), node.clone());
                        }
                        None => {
                            self.nodes.remove(key);
                        }
                    }
                }
            }
            None => self.nodes = now.clone(),
        }
    }
}

/// Stage 3: removes the device flavors that fail the purity check, from the flavors
/// and from every class's list, and reports each on the classes that would have
/// used it (a `Conflict` condition, merged into one per class). `nodes` are the
/// values of `inventory` in its order; `verdicts`, the last plan's, when kept.
pub(super) fn refuse_impure(
    resolved: &mut ResolvedFlavors,
    inventory: &BTreeMap<String, Arc<NodeInventory>>,
    nodes: &[&NodeInventory],
    verdicts: Option<&mut Verdicts>,
    class_reports: &mut BTreeMap<String, ClassReport>,
) -> Vec<ImpureFlavor> {
    let changed = verdicts.as_deref().and_then(|v| v.changed_nodes(inventory));
    // Built when some flavor needs the full check: the label index, and the
    // inventory keys of the nodes it numbers.
    let mut index: Option<(LabelIndex<'_>, Vec<&String>)> = None;
    let mut foreign_by_flavor: HashMap<FlavorKey, Vec<String>> = HashMap::new();
    let mut refused = Vec::new();
    for (key, acc) in &resolved.flavors {
        let Some(variant) = &key.variant else {
            continue;
        };
        let node_labels = key.node_labels();
        let class = class_scope(variant);
        let last = verdicts.as_deref().and_then(|v| v.foreign.get(key));
        let foreign_keys: Vec<String> = match (&changed, last) {
            (Some(changed), Some(last)) => {
                let mut foreign: Vec<String> = last
                    .iter()
                    .filter(|k| !changed.contains(k))
                    .cloned()
                    .collect();
                foreign.extend(changed.iter().filter_map(|k| {
                    let node = inventory.get(k)?;
                    (node.labels.carries_all(&node_labels) && lacks_variant(node, variant, class))
                        .then(|| k.clone())
                }));
                foreign.sort();
                foreign
            }
            _ => {
                let (index, keys) = index.get_or_insert_with(|| {
                    let index = LabelIndex::new(
                        nodes,
                        resolved
                            .flavors
                            .keys()
                            .filter(|k| k.variant.is_some())
                            .flat_map(|k| k.pins.keys().chain(k.extra.keys()).map(String::as_str)),
                    );
                    (index, inventory.keys().collect())
                });
                index
                    .select(&node_labels)
                    .into_iter()
                    .filter(|&i| lacks_variant(index.node(i), variant, class))
                    .map(|i| keys[i].clone())
                    .collect()
            }
        };
        let mut foreign_nodes: Vec<String> = foreign_keys
            .iter()
            .filter_map(|k| inventory.get(k).map(|n| n.name.clone()))
            .collect();
        foreign_nodes.sort();
        if verdicts.is_some() {
            foreign_by_flavor.insert(key.clone(), foreign_keys);
        }
        // A device-plugin flavor pins at least its vendor's presence label: one
        // pinned by nothing (or by a class's selector alone) selects nodes that
        // join the fleet later, a CPU node included, whatever this fleet holds.
        let unpinned = class.is_none() && key.pins.is_empty();
        if foreign_nodes.is_empty() && !unpinned {
            continue;
        }
        let impure = ImpureFlavor {
            flavor: key.name(),
            variant: variant.clone(),
            node_labels,
            foreign_nodes,
            unpinned,
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
    if let Some(verdicts) = verdicts {
        verdicts.last_rechecked = changed.as_ref().filter(|_| index.is_none()).map(Vec::len);
        verdicts.hold(inventory, changed.as_deref());
        verdicts.foreign = foreign_by_flavor;
    }
    refused
        .into_iter()
        .map(|(key, impure)| {
            resolved.flavors.remove(&key);
            for keys in resolved.class_flavors.values_mut() {
                keys.remove(&key);
            }
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Keys with a long shared prefix, as vendor labels have, and one without.
    const KEYS: [&str; 5] = [
        "nvidia.com/gpu.product",
        "nvidia.com/gpu.present",
        "nvidia.com/mig.strategy",
        "nvidia.com/gpu.sharing-strategy",
        "zone",
    ];

    fn labels() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map(
            proptest::sample::select(&KEYS[..]).prop_map(str::to_string),
            proptest::sample::select(&["a", "b"][..]).prop_map(str::to_string),
            0..=KEYS.len(),
        )
    }

    proptest! {
        /// The index selects exactly the nodes that carry every label asked for,
        /// in node order, whichever keys it holds and however the lists overlap.
        #[test]
        fn select_finds_the_nodes_carrying_every_label(
            node_labels in proptest::collection::vec(labels(), 0..40),
            indexed in proptest::sample::subsequence(&KEYS[..], 0..=KEYS.len()),
            wanted in labels(),
        ) {
            let nodes: Vec<NodeInventory> = node_labels
                .into_iter()
                .enumerate()
                .map(|(i, labels)| {
                    let labels: Vec<(&str, &str)> =
                        labels.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    crate::testkit::devices::node(&format!("n{i}"), &labels, Vec::new())
                })
                .collect();
            let refs: Vec<&NodeInventory> = nodes.iter().collect();
            let index = LabelIndex::new(&refs, indexed.iter().copied());
            // Only keys the index holds may be asked for.
            let wanted: BTreeMap<String, String> = wanted
                .into_iter()
                .filter(|(k, _)| indexed.contains(&k.as_str()))
                .collect();
            let expected: Vec<usize> = refs
                .iter()
                .enumerate()
                .filter(|(_, n)| n.labels.carries_all(&wanted))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(index.select(&wanted), expected);
        }
    }

    use crate::plan::flavors::{FlavorAcc, FlavorKey, ResolvedFlavors};
    use crate::testkit::devices::{PRODUCT_LABEL, gpus, whole_gpu};
    use std::collections::BTreeSet;

    /// What a node of the purity fleet carries: a zone (or none) and some of
    /// [`group`]'s kinds.
    type NodeSpec = (Option<bool>, Vec<u8>);

    /// Whole A100s, whole H100s, and A100 MIG slices pinned by the same product
    /// label as whole A100s (so each A100 flavor selects the other's nodes).
    fn group(kind: u8) -> crate::inventory::DeviceGroup {
        match kind {
            0 => gpus("A100", 8),
            1 => gpus("H100", 8),
            _ => {
                let mut variant = whole_gpu("A100");
                variant.sharing = SharingMode::Partition;
                variant.partition_profile = Some("1g.10gb".into());
                variant.resource_name = "nvidia.com/mig-1g.10gb".into();
                let mut slices = crate::inventory::DeviceGroup::new(variant, 56, 56);
                slices.pin_labels = BTreeMap::from([(PRODUCT_LABEL.to_string(), "A100".into())]);
                slices
            }
        }
    }

    fn purity_node(name: &str, (zone, kinds): &NodeSpec) -> NodeInventory {
        let zone = zone.map(|a| ("zone", if a { "a" } else { "b" }));
        crate::testkit::devices::node(
            name,
            &zone.into_iter().collect::<Vec<_>>(),
            kinds.iter().map(|&k| group(k)).collect(),
        )
    }

    /// The flavors a step may plan: `mask` picks some of them.
    fn purity_flavors(mask: u8) -> ResolvedFlavors {
        let pinned = |model: &str| BTreeMap::from([(PRODUCT_LABEL.to_string(), model.to_string())]);
        let keys = [
            (Some(whole_gpu("A100")), pinned("A100"), BTreeMap::new()),
            (Some(whole_gpu("H100")), pinned("H100"), BTreeMap::new()),
            (Some(group(2).variant), pinned("A100"), BTreeMap::new()),
            (
                Some(whole_gpu("A100")),
                pinned("A100"),
                BTreeMap::from([("zone".to_string(), "a".to_string())]),
            ),
            // Pinned by nothing: refused whatever the fleet.
            (Some(whole_gpu("H100")), BTreeMap::new(), BTreeMap::new()),
        ];
        let mut resolved = ResolvedFlavors::default();
        for (i, (variant, pins, extra)) in keys.into_iter().enumerate() {
            if mask & (1 << i) == 0 {
                continue;
            }
            let key = FlavorKey {
                variant,
                pins,
                extra,
            };
            let acc = FlavorAcc {
                classes: BTreeSet::from([format!("class-{}", i % 2)]),
                ..FlavorAcc::default()
            };
            resolved.flavors.insert(key.clone(), acc);
            resolved
                .class_flavors
                .entry(format!("class-{}", i % 2))
                .or_default()
                .insert(key);
        }
        resolved
    }

    type Outcome = (
        Vec<ImpureFlavor>,
        Vec<FlavorKey>,
        BTreeMap<String, BTreeSet<FlavorKey>>,
        BTreeMap<String, ClassReport>,
    );

    fn check(
        mask: u8,
        inventory: &BTreeMap<String, Arc<NodeInventory>>,
        verdicts: Option<&mut Verdicts>,
    ) -> Outcome {
        let nodes: Vec<&NodeInventory> = inventory.values().map(|n| &**n).collect();
        let mut resolved = purity_flavors(mask);
        let mut reports: BTreeMap<String, ClassReport> = ["class-0", "class-1"]
            .into_iter()
            .map(|c| (c.to_string(), ClassReport::default()))
            .collect();
        let refused = refuse_impure(&mut resolved, inventory, &nodes, verdicts, &mut reports);
        (
            refused,
            resolved.flavors.into_keys().collect(),
            resolved.class_flavors,
            reports,
        )
    }

    fn node_spec() -> impl Strategy<Value = Option<NodeSpec>> {
        proptest::option::of((
            proptest::option::of(any::<bool>()),
            proptest::collection::vec(0u8..3, 0..3),
        ))
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Carrying the last plan's verdicts never changes what the purity
        /// check refuses or reports, whichever nodes changed, appeared or went
        /// (a changed node is a new `Arc`; so is one re-read unchanged), and
        /// whichever flavors the plans ask about.
        #[test]
        fn carried_verdicts_reach_the_full_check(
            first in proptest::collection::vec(node_spec(), 12),
            steps in proptest::collection::vec(
                (
                    proptest::collection::vec((0usize..12, node_spec()), 0..4),
                    proptest::collection::vec(0usize..12, 0..2),
                    0u8..32,
                ),
                1..6,
            ),
            first_mask in 0u8..32,
            recheck_limit in 1usize..6,
        ) {
            let mut specs = first;
            let arc = |i: usize, spec: &Option<NodeSpec>| {
                spec.as_ref().map(|s| Arc::new(purity_node(&format!("node-{i}"), s)))
            };
            let mut held: Vec<Option<Arc<NodeInventory>>> =
                specs.iter().enumerate().map(|(i, s)| arc(i, s)).collect();
            let inventory_of = |held: &[Option<Arc<NodeInventory>>]| -> BTreeMap<String, Arc<NodeInventory>> {
                held.iter()
                    .enumerate()
                    .filter_map(|(i, n)| Some((format!("node-{i}"), n.clone()?)))
                    .collect()
            };
            let mut verdicts = Verdicts { recheck_limit, ..Verdicts::default() };
            let inventory = inventory_of(&held);
            prop_assert_eq!(
                check(first_mask, &inventory, Some(&mut verdicts)),
                check(first_mask, &inventory, None)
            );
            let mut last_mask = first_mask;
            for (changes, rereads, mask) in steps {
                let mut touched = BTreeSet::new();
                for (i, spec) in changes {
                    specs[i] = spec;
                    held[i] = arc(i, &specs[i]);
                    touched.insert(i);
                }
                // Read again, the same: a new Arc, nothing else changed.
                for i in rereads {
                    held[i] = arc(i, &specs[i]);
                    touched.insert(i);
                }
                let inventory = inventory_of(&held);
                prop_assert_eq!(
                    check(mask, &inventory, Some(&mut verdicts)),
                    check(mask, &inventory, None)
                );
                // The changed nodes alone were checked, when few enough and
                // the last plan checked every flavor asked about.
                if touched.len() <= recheck_limit && mask & !last_mask == 0 {
                    prop_assert!(verdicts.last_rechecked.is_some_and(|n| n <= touched.len()));
                }
                last_mask = mask;
            }
        }
    }

    /// One node turned from whole A100s to MIG slices: only it is checked, and
    /// the whole-A100 flavor is refused for it; turned back, the flavor returns.
    #[test]
    fn one_changed_node_is_checked_alone() {
        let whole: NodeSpec = (None, vec![0]);
        let sliced: NodeSpec = (None, vec![2]);
        let mut held: BTreeMap<String, Arc<NodeInventory>> = (0..20)
            .map(|i| {
                let name = format!("node-{i:02}");
                let node = Arc::new(purity_node(&name, &whole));
                (name, node)
            })
            .collect();
        let mut verdicts = Verdicts::default();
        let (refused, ..) = check(0b1, &held, Some(&mut verdicts));
        assert!(refused.is_empty());
        assert_eq!(
            verdicts.last_rechecked, None,
            "the first plan checks the fleet"
        );

        held.insert("node-07".into(), Arc::new(purity_node("node-07", &sliced)));
        let (refused, flavors, ..) = check(0b1, &held, Some(&mut verdicts));
        assert_eq!(verdicts.last_rechecked, Some(1));
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].foreign_nodes, ["node-07"]);
        assert!(flavors.is_empty());

        // Another node re-read unchanged: node-07 is still foreign.
        held.insert("node-03".into(), Arc::new(purity_node("node-03", &whole)));
        let (refused, ..) = check(0b1, &held, Some(&mut verdicts));
        assert_eq!(verdicts.last_rechecked, Some(1));
        assert_eq!(refused[0].foreign_nodes, ["node-07"]);

        held.insert("node-07".into(), Arc::new(purity_node("node-07", &whole)));
        let (refused, flavors, ..) = check(0b1, &held, Some(&mut verdicts));
        assert_eq!(verdicts.last_rechecked, Some(1));
        assert!(refused.is_empty());
        assert_eq!(flavors.len(), 1);
    }
}
