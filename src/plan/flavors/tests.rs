//! Tests of flavor resolution: one flavor per signature, pooling conflicts, names, misses.

use super::*;
use crate::api::HardwareSelector;
use crate::plan::tests::class;
use crate::plan::validate;
use crate::testkit::devices::{gpus, node};

const H100: &str = "NVIDIA-H100-80GB-HBM3";
const ZONE: &str = "topology.kubernetes.io/zone";

fn resolve_on(
    classes: &[AcceleratorClass],
    nodes: &[NodeInventory],
) -> (ResolvedFlavors, BTreeMap<String, ClassReport>) {
    resolve_with(classes, nodes, &HealthSnapshot::default())
}

fn resolve_with(
    classes: &[AcceleratorClass],
    nodes: &[NodeInventory],
    health: &HealthSnapshot,
) -> (ResolvedFlavors, BTreeMap<String, ClassReport>) {
    let nodes: Vec<&NodeInventory> = nodes.iter().collect();
    let (ordered, mut reports) = validate::classes(classes);
    let resolved = resolve(&ordered, &nodes, health, &mut reports);
    (resolved, reports)
}

fn two_zones() -> [NodeInventory; 2] {
    [
        node("gpu-a", &[(ZONE, "z1")], vec![gpus(H100, 8)]),
        node("gpu-b", &[(ZONE, "z2")], vec![gpus(H100, 8)]),
    ]
}

#[test]
fn one_flavor_per_signature_unless_split_by_a_label() {
    let nodes = two_zones();
    let whole = class("h100", SharingMode::Whole, HardwareSelector::default());
    let (resolved, _) = resolve_on(std::slice::from_ref(&whole), &nodes);
    assert_eq!(resolved.flavors.len(), 1);
    let (key, acc) = resolved.flavors.iter().next().unwrap();
    assert_eq!(acc.members, vec![(0, Some(0)), (1, Some(0))]);
    assert_eq!(key.name(), "nvidia-h100-80gb-hbm3");

    let mut zoned = whole;
    zoned.spec.pooling.split_by = vec![ZONE.into()];
    let (resolved, _) = resolve_on(&[zoned], &nodes);
    let names: Vec<String> = resolved.flavors.keys().map(FlavorKey::name).collect();
    assert_eq!(
        names,
        ["nvidia-h100-80gb-hbm3-z1", "nvidia-h100-80gb-hbm3-z2"]
    );
    assert_eq!(resolved.class_flavors["h100"].len(), 2);
}

#[test]
fn devices_pooled_first_stay_with_that_class_and_the_other_reports_a_conflict() {
    let nodes = two_zones();
    let whole = class("a-whole", SharingMode::Whole, HardwareSelector::default());
    let mut zoned = class("b-zoned", SharingMode::Whole, HardwareSelector::default());
    zoned.spec.pooling.split_by = vec![ZONE.into()];
    let (resolved, reports) = resolve_on(&[zoned, whole], &nodes);

    // The zoned class's keys were interned, but own no device: no flavor.
    assert_eq!(resolved.flavors.len(), 1);
    assert!(resolved.class_flavors["b-zoned"].is_empty());
    let conditions = &reports["b-zoned"].conditions;
    let conflict = conditions
        .iter()
        .find(|c| c.type_ == api::CONFLICT)
        .expect("a Conflict condition");
    assert_eq!(conflict.reason, "PoolingConflict");
    assert!(
        conflict.message.contains("class(es) a-whole"),
        "{}",
        conflict.message
    );
    assert!(
        conditions
            .iter()
            .any(|c| c.type_ == api::NO_MATCHING_HARDWARE)
    );
    assert!(reports["a-whole"].conditions.is_empty());
}

#[test]
fn a_class_matching_nothing_says_what_was_turned_down() {
    let nodes = two_zones();
    let a100s = class(
        "a100",
        SharingMode::Whole,
        HardwareSelector {
            models: vec!["*A100*".into()],
            ..Default::default()
        },
    );
    let (resolved, reports) = resolve_on(&[a100s], &nodes);
    assert!(resolved.flavors.is_empty());
    let condition = &reports["a100"].conditions[0];
    assert_eq!(condition.type_, api::NO_MATCHING_HARDWARE);
    assert_eq!(
        condition.message,
        format!(
            "no device meets every hard requirement of this class ({H100}: model not selected)"
        )
    );
}

#[test]
fn invalid_classes_are_not_resolved() {
    let nodes = two_zones();
    // Partition without a profile is invalid.
    let invalid = class("part", SharingMode::Partition, HardwareSelector::default());
    let (resolved, reports) = resolve_on(&[invalid], &nodes);
    assert!(!reports["part"].valid);
    assert!(reports["part"].conditions.is_empty());
    assert!(resolved.class_flavors.is_empty());
}

#[test]
fn names_that_slug_alike_are_told_apart_by_a_hash_of_the_key() {
    let key = |zone: &str| FlavorKey {
        variant: Some(crate::testkit::devices::whole_gpu(H100)),
        pins: BTreeMap::new(),
        extra: BTreeMap::from([(ZONE.to_string(), zone.to_string())]),
    };
    let flavors: BTreeMap<FlavorKey, FlavorAcc> = [key("Z1"), key("z1")]
        .into_iter()
        .map(|k| (k, FlavorAcc::default()))
        .collect();
    let named = name_flavors(&flavors);
    // "Z1" sorts first and keeps the plain name.
    assert_eq!(named[&key("Z1")], "nvidia-h100-80gb-hbm3-z1");
    let second = &named[&key("z1")];
    assert!(second.starts_with("nvidia-h100-80gb-hbm3-z1-"), "{second}");
    assert_eq!(second.len(), "nvidia-h100-80gb-hbm3-z1-".len() + 8);
}

/// A firmware allow-list admits a variant only when every card on the nodes the
/// class selects last reported an allowed version: one card on an old VBIOS, or
/// one no exporter has read, turns the variant down, naming the version and the
/// node; the class's node labels narrow what must comply.
#[test]
fn a_firmware_allow_list_takes_a_variant_only_when_every_selected_card_complies() {
    const GOOD: &str = "96.00.89.00.01";
    const OLD: &str = "96.00.5A.00.01";
    let nodes = two_zones();
    let resource = nodes[0].groups[0].variant.resource_name.clone();
    let reported = |a: &[(&str, u32)], b: &[(&str, u32)]| {
        let mut h = HealthSnapshot::default();
        for (node, versions) in [("gpu-a", a), ("gpu-b", b)] {
            if versions.is_empty() {
                continue;
            }
            h.firmware.entry(node.into()).or_default().insert(
                resource.clone(),
                versions.iter().map(|(v, n)| (v.to_string(), *n)).collect(),
            );
        }
        h
    };
    let allow = |node_labels: &[(&str, &str)]| {
        class(
            "pinned",
            SharingMode::Whole,
            HardwareSelector {
                firmware_versions: vec![GOOD.into(), "96.00.99.00.01".into()],
                node_labels: node_labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..Default::default()
            },
        )
    };
    let message = |reports: &BTreeMap<String, ClassReport>| {
        reports["pinned"]
            .conditions
            .iter()
            .find(|c| c.type_ == api::NO_MATCHING_HARDWARE)
            .map(|c| c.message.clone())
    };

    // Every card on both nodes on an allowed version: the variant is the class's.
    let all_good = reported(&[(GOOD, 8)], &[(GOOD, 6), ("96.00.99.00.01", 2)]);
    let (resolved, reports) = resolve_with(&[allow(&[])], &nodes, &all_good);
    assert_eq!(resolved.class_flavors["pinned"].len(), 1);
    assert_eq!(message(&reports), None);

    // Two cards of node b on an old VBIOS: nothing, naming version and node.
    let one_old = reported(&[(GOOD, 8)], &[(GOOD, 6), (OLD, 2)]);
    let (resolved, reports) = resolve_with(&[allow(&[])], &nodes, &one_old);
    assert!(resolved.class_flavors["pinned"].is_empty());
    let m = message(&reports).expect("NoMatchingHardware");
    assert!(m.contains(&format!("firmware {OLD} on gpu-b")), "{m}");
    assert!(
        m.contains(&format!("allowed: {GOOD}, 96.00.99.00.01")),
        "{m}"
    );
    assert!(m.contains("spec.selector.nodeLabels"), "{m}");

    // A card no exporter has read cannot be verified.
    let unread = reported(&[(GOOD, 8)], &[(GOOD, 7)]);
    let (resolved, reports) = resolve_with(&[allow(&[])], &nodes, &unread);
    assert!(resolved.class_flavors["pinned"].is_empty());
    let m = message(&reports).expect("NoMatchingHardware");
    assert!(
        m.contains("not reported by an exporter for every card on gpu-b"),
        "{m}"
    );
    let (resolved, _) = resolve_with(&[allow(&[])], &nodes, &HealthSnapshot::default());
    assert!(resolved.class_flavors["pinned"].is_empty());

    // The class selects zone z1 only: node b's old cards are not its concern,
    // and its flavor's node labels keep its pods off them.
    let (resolved, reports) = resolve_with(&[allow(&[(ZONE, "z1")])], &nodes, &one_old);
    assert_eq!(message(&reports), None);
    let flavors = &resolved.class_flavors["pinned"];
    assert_eq!(flavors.len(), 1);
    let key = flavors.iter().next().unwrap();
    assert_eq!(key.node_labels().get(ZONE).map(String::as_str), Some("z1"));
    assert_eq!(resolved.flavors[key].members, vec![(0, Some(0))]);

    // Without an allow-list, firmware is only a fact.
    let plain = class("pinned", SharingMode::Whole, HardwareSelector::default());
    let (resolved, _) = resolve_with(&[plain], &nodes, &one_old);
    assert_eq!(resolved.class_flavors["pinned"].len(), 1);
}
