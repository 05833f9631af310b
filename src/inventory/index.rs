//! The fleet's Nodes as the inventory reads them, kept current from a Node watch.
//!
//! Each Node is parsed once per change, when its event arrives, and only the parse
//! is kept (not the Node): a re-plan takes the current inventory as it is, and a
//! Node update that changes nothing the inventory reads (a kubelet's heartbeat)
//! is told apart so it wakes nobody. Pure and synchronous, fed by the controller's
//! watch (`controller/watches.rs`), like a reflector's store.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;

use super::{Inventory, NodeInventory, read_node};

/// A Node as the planner reads it: [`read_node`] less each device group's raw
/// vendor labels, which only `kaccel inventory` shows (the node's own labels,
/// which flavors select on, stay). Kept for every Node of the fleet, those copies
/// were about a fifth of the inventory's memory.
pub fn read_for_planning(node: &Node) -> NodeInventory {
    let mut read = read_node(node);
    for group in &mut read.groups {
        group.raw_labels = BTreeMap::new();
    }
    read
}

#[derive(Debug, Default)]
pub struct NodeIndex {
    /// Shared with the re-plans reading it; an update while one holds it copies it
    /// first (`Arc::make_mut`), so a re-plan never sees a half-applied change.
    current: Arc<Inventory>,
    /// Nodes of a re-list under way; they replace `current` when it ends.
    relist: Option<BTreeMap<String, Arc<NodeInventory>>>,
    synced: bool,
    reads: u64,
    /// The MultiKueue worker cluster these Nodes are in (None: kaccel's own
    /// cluster): each is keyed `<cluster>/<node>`, so two clusters' node names
    /// never meet in one inventory.
    cluster: Option<String>,
}

impl NodeIndex {
    /// The index of a worker cluster's Nodes (see [`NodeIndex::cluster`]).
    pub fn for_worker(cluster: &str) -> Self {
        NodeIndex {
            cluster: Some(cluster.to_string()),
            ..Default::default()
        }
    }

    fn read(&self, node: &Node) -> NodeInventory {
        let mut read = read_for_planning(node);
        if self.cluster.is_some() {
            read.name = self.key_of(&read.name);
        }
        read
    }

    /// The key a Node of this index is kept under.
    pub fn key_of(&self, name: &str) -> String {
        match &self.cluster {
            Some(cluster) => super::worker_key(cluster, name),
            None => name.to_string(),
        }
    }

    /// The inventory as of the last event (no slices merged).
    pub fn snapshot(&self) -> Arc<Inventory> {
        self.current.clone()
    }

    /// Whether a first list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// Nodes parsed so far.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// A (re-)list starts: Nodes it does not return are gone when it ends.
    pub fn begin_relist(&mut self) {
        self.relist = Some(BTreeMap::new());
    }

    /// A Node of the re-list under way (treated as an update without one).
    pub fn relisted(&mut self, node: &Node) {
        let read = self.read(node);
        self.reads += 1;
        match self.relist.as_mut() {
            Some(relist) => {
                relist.insert(read.name.clone(), Arc::new(read));
            }
            None => {
                Arc::make_mut(&mut self.current)
                    .nodes
                    .insert(read.name.clone(), Arc::new(read));
            }
        }
    }

    /// The re-list ended: its Nodes are the fleet now. Always a change to plan for.
    pub fn end_relist(&mut self) {
        if let Some(nodes) = self.relist.take() {
            self.current = Arc::new(Inventory { nodes });
        }
        self.synced = true;
    }

    /// A Node added or updated; true when what the inventory reads of it changed.
    pub fn upsert(&mut self, node: &Node) -> bool {
        let read = self.read(node);
        self.reads += 1;
        if self.current.nodes.get(&read.name).map(|n| &**n) == Some(&read) {
            return false;
        }
        // A re-plan holding the snapshot keeps its copy: this copies the map of
        // shared nodes, not the nodes.
        Arc::make_mut(&mut self.current)
            .nodes
            .insert(read.name.clone(), Arc::new(read));
        true
    }

    /// A Node deleted (by its own name); true when it was in the inventory.
    pub fn remove(&mut self, name: &str) -> bool {
        let key = self.key_of(name);
        if !self.current.nodes.contains_key(&key) {
            return false;
        }
        Arc::make_mut(&mut self.current).nodes.remove(&key);
        true
    }
}

/// The MultiKueue worker clusters' Nodes as one inventory (keys are already
/// `<cluster>/<node>`). A worker kaccel cannot read now keeps its last-read
/// Nodes with their Ready condition unknown: their devices are Unknown
/// (capacity, not failures), as when a kubelet stops reporting.
pub fn worker_union<'a>(
    workers: impl IntoIterator<Item = (&'a str, Arc<Inventory>)>,
    unreachable: &BTreeMap<String, String>,
) -> Inventory {
    let mut nodes = BTreeMap::new();
    for (cluster, inventory) in workers {
        let lost = unreachable.contains_key(cluster);
        for (key, node) in &inventory.nodes {
            let node = if lost && node.ready.is_some() {
                let mut unknown = (**node).clone();
                unknown.ready = None;
                Arc::new(unknown)
            } else {
                node.clone()
            };
            nodes.insert(key.clone(), node);
        }
    }
    Inventory { nodes }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::synthetic::generate_fleet;
    use proptest::prelude::*;

    /// What the index should hold for `nodes`: a fresh read of each.
    fn planning_read<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> Inventory {
        Inventory {
            nodes: nodes
                .into_iter()
                .map(read_for_planning)
                .map(|n| (n.name.clone(), Arc::new(n)))
                .collect(),
        }
    }

    #[test]
    fn the_planners_read_drops_only_the_groups_raw_vendor_labels() {
        for node in generate_fleet(30, 11) {
            let full = read_node(&node);
            let planned = read_for_planning(&node);
            assert!(planned.groups.iter().all(|g| g.raw_labels.is_empty()));
            let mut restored = planned.clone();
            for (g, original) in restored.groups.iter_mut().zip(&full.groups) {
                g.raw_labels = original.raw_labels.clone();
            }
            assert_eq!(restored, full, "nothing else differs");
            assert_eq!(planned.labels, full.labels, "flavors select on these");
        }
        // The fleet has raw vendor labels to drop at all.
        assert!(
            generate_fleet(30, 11)
                .iter()
                .any(|n| read_node(n).groups.iter().any(|g| !g.raw_labels.is_empty()))
        );
    }

    fn relabelled(mut node: Node, key: &str, value: &str) -> Node {
        node.metadata
            .labels
            .get_or_insert_default()
            .insert(key.into(), value.into());
        node
    }

    #[test]
    fn a_list_then_updates_then_a_relist() {
        let fleet = generate_fleet(20, 3);
        let mut index = NodeIndex::default();
        index.begin_relist();
        for node in &fleet {
            index.relisted(node);
        }
        assert!(!index.is_synced());
        assert!(
            index.snapshot().nodes.is_empty(),
            "not before the list ends"
        );
        index.end_relist();
        assert!(index.is_synced());
        assert_eq!(*index.snapshot(), planning_read(&fleet));

        // The same Node again (a heartbeat): nothing to plan.
        assert!(!index.upsert(&fleet[3]));
        // A label the inventory reads: a change, and a re-plan holding the old
        // snapshot keeps seeing the old Node.
        let held = index.snapshot();
        let changed = relabelled(fleet[3].clone(), "topology.kubernetes.io/zone", "zone-z");
        assert!(index.upsert(&changed));
        assert_ne!(*held, *index.snapshot());
        assert_eq!(*held, planning_read(&fleet));
        // Only the changed Node is new: the others are the held snapshot's own,
        // not copies (a change during a re-plan costs one Node, not the fleet).
        let now = index.snapshot();
        let changed_name = changed.metadata.name.as_deref().unwrap();
        for (name, node) in &now.nodes {
            assert_eq!(
                Arc::ptr_eq(node, &held.nodes[name]),
                name != changed_name,
                "{name}"
            );
        }

        // Deleted, and deleted again (already gone).
        let name = fleet[5].metadata.name.clone().unwrap();
        assert!(index.remove(&name));
        assert!(!index.remove(&name));

        // A re-list without fleet[0]: it is gone once the re-list ends.
        index.begin_relist();
        for node in &fleet[1..] {
            index.relisted(node);
        }
        index.end_relist();
        assert_eq!(*index.snapshot(), planning_read(&fleet[1..]));
    }

    #[test]
    fn a_kubelet_heartbeat_is_no_change() {
        let node = |heartbeat: &str| -> Node {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "gpu-1", "labels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
                "status": {
                    "allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                    "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                    "lastHeartbeatTime": heartbeat}],
                    "images": [{"names": ["registry.k8s.io/pause:3.10"], "sizeBytes": 320368}],
                },
            }))
            .unwrap()
        };
        let mut index = NodeIndex::default();
        assert!(index.upsert(&node("2026-12-05T08:00:00Z")));
        assert!(!index.upsert(&node("2026-12-05T08:05:00Z")));
        let mut not_ready = node("2026-12-05T08:06:00Z");
        not_ready
            .status
            .as_mut()
            .unwrap()
            .conditions
            .as_mut()
            .unwrap()[0]
            .status = "False".into();
        assert!(index.upsert(&not_ready));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Whatever the updates, the index is what a fresh read of the current
        /// Nodes gives, and an update says "changed" exactly when that read moved.
        #[test]
        fn the_index_is_a_fresh_read_of_the_current_nodes(
            seed in any::<u64>(),
            updates in proptest::collection::vec((0usize..15, 0usize..15, any::<bool>()), 1..20),
        ) {
            let fleet = generate_fleet(15, seed);
            let others = generate_fleet(15, seed ^ 7);
            let mut current: BTreeMap<String, Node> = fleet
                .iter()
                .map(|n| (n.metadata.name.clone().unwrap(), n.clone()))
                .collect();
            let mut index = NodeIndex::default();
            index.begin_relist();
            fleet.iter().for_each(|n| index.relisted(n));
            index.end_relist();
            for (i, j, delete) in updates {
                let name = fleet[i].metadata.name.clone().unwrap();
                let before = planning_read(current.values());
                let said = if delete {
                    current.remove(&name);
                    index.remove(&name)
                } else {
                    let mut node = if j % 3 == 0 { fleet[i].clone() } else { others[j].clone() };
                    node.metadata.name = Some(name.clone());
                    node.metadata.labels.get_or_insert_default()
                        .insert("kubernetes.io/hostname".into(), name.clone());
                    current.insert(name, node.clone());
                    index.upsert(&node)
                };
                let after = planning_read(current.values());
                prop_assert_eq!(&*index.snapshot(), &after);
                prop_assert_eq!(said, before != after);
            }
        }
    }
}
