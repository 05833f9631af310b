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

use foldhash::{HashMap, HashMapExt};

use crate::api::{self, DesiredCondition};
use crate::inventory::{DeviceVariant, NodeInventory, SharingMode, Vendor};

use super::ClassReport;
use super::flavors::ResolvedFlavors;

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

/// The nodes `labels` select that carry no device of `variant`'s kind.
pub(crate) fn foreign_nodes(
    index: &LabelIndex<'_>,
    variant: &DeviceVariant,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    foreign_among(index, variant, labels, None)
}

/// For a DRA-only variant (its resource is a DeviceClass): the nodes `labels` select
/// that publish devices of that DeviceClass but none of `variant`'s kind under it. A
/// node without such devices cannot satisfy the flavor's claims, whatever its labels:
/// the scheduler places a claim by ResourceSlice, on top of the flavor's nodeLabels.
pub(crate) fn foreign_nodes_of_class(
    index: &LabelIndex<'_>,
    variant: &DeviceVariant,
    labels: &BTreeMap<String, String>,
) -> Vec<String> {
    foreign_among(index, variant, labels, Some(variant.resource_name.as_str()))
}

/// `class`: only the devices a claim of this DeviceClass can be given count.
fn foreign_among(
    index: &LabelIndex<'_>,
    variant: &DeviceVariant,
    labels: &BTreeMap<String, String>,
    class: Option<&str>,
) -> Vec<String> {
    let in_scope = |g: &&crate::inventory::DeviceGroup| {
        class.is_none_or(|c| crate::inventory::dra_device_class_of(g) == Some(c))
    };
    let mut foreign: Vec<String> = index
        .select(labels)
        .into_iter()
        .map(|i| index.nodes[i])
        .filter(|n| class.is_none() || n.groups.iter().any(|g| in_scope(&g)))
        .filter(|n| {
            !n.groups
                .iter()
                .filter(in_scope)
                .any(|g| same_device_kind(&g.variant, variant))
        })
        .map(|n| n.name.clone())
        .collect();
    foreign.sort();
    foreign
}

/// Stage 3: removes the device flavors that fail the purity check, from the flavors
/// and from every class's list, and reports each on the classes that would have
/// used it (a `Conflict` condition, merged into one per class).
pub(super) fn refuse_impure(
    resolved: &mut ResolvedFlavors,
    nodes: &[&NodeInventory],
    class_reports: &mut BTreeMap<String, ClassReport>,
) -> Vec<ImpureFlavor> {
    let index = LabelIndex::new(
        nodes,
        resolved
            .flavors
            .keys()
            .filter(|k| k.variant.is_some())
            .flat_map(|k| k.pins.keys().chain(k.extra.keys()).map(String::as_str)),
    );
    let mut refused = Vec::new();
    for (key, acc) in &resolved.flavors {
        let Some(variant) = &key.variant else {
            continue;
        };
        let node_labels = key.node_labels();
        let dra_only = crate::inventory::is_dra_device_class(&variant.resource_name);
        // A DRA claim can only be given a device its DeviceClass selects, so a DRA-only
        // flavor is checked against the nodes that publish devices of its class.
        let foreign_nodes = if dra_only {
            foreign_nodes_of_class(&index, variant, &node_labels)
        } else {
            foreign_nodes(&index, variant, &node_labels)
        };
        // A device-plugin flavor pins at least its vendor's presence label: one
        // pinned by nothing (or by a class's selector alone) selects nodes that
        // join the fleet later, a CPU node included, whatever this fleet holds.
        let unpinned = !dra_only && key.pins.is_empty();
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
                .filter(|(_, n)| wanted.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
                .map(|(i, _)| i)
                .collect();
            prop_assert_eq!(index.select(&wanted), expected);
        }
    }
}
