//! The example fleet (examples/nodes.yaml) reads cleanly, with one pin set per variant.

use std::collections::BTreeSet;

use serde::Deserialize;

use super::*;

const EXAMPLE_FLEET: &str = include_str!("../../../examples/nodes.yaml");

pub(crate) fn example_nodes() -> Vec<Node> {
    serde_yaml::Deserializer::from_str(EXAMPLE_FLEET)
        .map(|doc| Node::deserialize(doc).expect("examples/nodes.yaml: a v1 Node"))
        .collect()
}

#[test]
fn example_fleet_reads_cleanly() {
    let nodes = example_nodes();
    assert_eq!(nodes.len(), 22);
    let inv = Inventory::from_nodes(&nodes);
    assert_eq!(inv.nodes.len(), 22, "node names are unique");
    for n in inv.nodes.values() {
        assert!(n.warnings.is_empty(), "{}: {:?}", n.name, n.warnings);
        assert_eq!(n.ready, Some(true), "{}", n.name);
        assert!(n.topology.zone.is_some(), "{}", n.name);
        assert!(n.cpu_millis > 0 && n.memory_bytes > 0, "{}", n.name);
    }
    let vendors: BTreeSet<Vendor> = inv.groups().map(|(_, g)| g.variant.vendor).collect();
    assert!(vendors.len() >= 6, "{vendors:?}");

    let variants: BTreeSet<&DeviceVariant> = inv.groups().map(|(_, g)| &g.variant).collect();
    let has = |model: &str, sharing: SharingMode, profile: Option<&str>| {
        variants.iter().any(|v| {
            v.model == model && v.sharing == sharing && v.partition_profile.as_deref() == profile
        })
    };
    assert!(has("NVIDIA-H100-80GB-HBM3", SharingMode::Whole, None));
    assert!(has("NVIDIA-A100-SXM4-80GB", SharingMode::Whole, None));
    assert!(has(
        "NVIDIA-A100-SXM4-80GB",
        SharingMode::Partition,
        Some("1g.10gb")
    ));
    assert!(has(
        "NVIDIA-A100-SXM4-80GB",
        SharingMode::Partition,
        Some("3g.40gb")
    ));
    assert!(has("NVIDIA-L4", SharingMode::TimeShare, None));
    assert!(has("NVIDIA-L40S", SharingMode::Whole, None));
    assert!(has("AMD_Instinct_MI300X_OAM", SharingMode::Whole, None));
    assert!(has(
        "AMD_Instinct_MI300X_OAM",
        SharingMode::Partition,
        Some("cpx_nps4")
    ));
    assert!(has("Gaudi2", SharingMode::Whole, None));
    assert!(has("Gaudi3", SharingMode::Whole, None));
    assert!(has("Ascend910B3", SharingMode::Whole, None));
    assert!(has("Ascend910B3", SharingMode::Partition, Some("4c")));
    assert!(has("Trainium", SharingMode::Whole, None));
    // One Neuron view per node: the example trn1 node advertises both, the device
    // view is offered.
    assert!(!has("Trainium", SharingMode::Partition, Some("neuroncore")));
    assert!(has("tpu-v5-lite-podslice", SharingMode::Whole, None));

    // Whole H100s: 4 nodes x 8, one withdrawn.
    let (cap, alloc) = inv
        .groups()
        .filter(|(_, g)| g.variant.model == "NVIDIA-H100-80GB-HBM3")
        .fold((0, 0), |(c, a), (_, g)| (c + g.capacity, a + g.allocatable));
    assert_eq!((cap, alloc), (32, 31));
    // Pins of one variant agree across its nodes (one flavor per variant here).
    let mut pins_by_variant: BTreeMap<&DeviceVariant, BTreeSet<&BTreeMap<String, String>>> =
        BTreeMap::new();
    for (_, g) in inv.groups() {
        pins_by_variant
            .entry(&g.variant)
            .or_default()
            .insert(&g.pin_labels);
        assert!(!g.pin_labels.is_empty(), "{:?}", g.variant);
        for (k, v) in &g.pin_labels {
            // Every pin label exists on the node with that value (checked per node below).
            assert!(!k.is_empty() && !v.is_empty());
        }
    }
    for (v, p) in &pins_by_variant {
        assert_eq!(p.len(), 1, "{v:?}: {p:?}");
    }
    for n in inv.nodes.values() {
        for g in &n.groups {
            for (k, v) in &g.pin_labels {
                assert_eq!(
                    n.labels.get(k),
                    Some(v.as_str()),
                    "{}: pin {k} not on node",
                    n.name
                );
            }
        }
    }
    // Different variants never share a pin set and resource (flavors stay apart).
    let mut seen = BTreeSet::new();
    for (v, p) in &pins_by_variant {
        let key = (v.resource_name.clone(), p.iter().next().cloned());
        assert!(seen.insert(key), "two variants with one pin set: {v:?}");
    }
    let cpu_only = inv
        .nodes
        .values()
        .filter(|n| n.labels.get("kaccel.io/pool") == Some("cpu"))
        .count();
    assert_eq!(cpu_only, 3);
}
