//! The purity check and invariant 1 per variant, on fleets built from the NVIDIA
//! and AMD label schemes their own labellers write
//! (`crate::inventory::vendor_fleet_nvidia_amd`) mixed with the synthetic fleet, and
//! on DRA-only groups. Every check recounts from the inventory, independently of the
//! planner's report.

use k8s_openapi::api::core::v1::Node;
use proptest::prelude::*;

use super::*;
use crate::api::HardwareSelector;
use crate::inventory::synthetic::generate_fleet;
use crate::inventory::vendor_fleet_nvidia_amd::{self as vendor_fleet, NODES};

/// One class per way of using the vendor fleet, each granted generously.
fn vendor_fleet_classes() -> (Vec<AcceleratorClass>, Vec<CreditBudget>) {
    let big = |sharing, profile: Option<&str>, min_memory_mib| {
        (
            sharing,
            HardwareSelector {
                partition_profile: profile.map(str::to_string),
                min_memory_mib,
                ..Default::default()
            },
        )
    };
    let specs = [
        ("whole-80g", big(SharingMode::Whole, None, Some(80 * 1024))),
        ("whole", big(SharingMode::Whole, None, None)),
        ("timeshare", big(SharingMode::TimeShare, None, None)),
        (
            "mig-1g10gb",
            big(SharingMode::Partition, Some("1g.10gb"), None),
        ),
        ("cpx", big(SharingMode::Partition, Some("cpx_nps4"), None)),
    ];
    let classes: Vec<AcceleratorClass> = specs
        .iter()
        .map(|(name, (sharing, sel))| class(name, *sharing, sel.clone()))
        .collect();
    let budgets = vec![budget(
        "team",
        &["team"],
        &specs.iter().map(|(n, _)| (*n, 10_000)).collect::<Vec<_>>(),
    )];
    (classes, budgets)
}

/// The issue's worst case: 8 whole MI300X plus a CPX/NPS4 node under `single` naming
/// (64 x amd.com/gpu) were offered as 72 "whole, >= 80 GB" GPUs.
#[test]
fn the_cpx_node_is_never_in_a_whole_gpu_class() {
    let (classes, budgets) = vendor_fleet_classes();
    let nodes = vendor_fleet::fleet();
    let health = HealthSnapshot::default();
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    for whole in ["whole-80g", "whole"] {
        for f in &plan.classes[whole].flavors {
            let report = &plan.flavors[&f.name];
            assert_eq!(report.sharing, SharingMode::Whole);
            assert!(
                !report.nodes.contains("amd-mi300x-cpx-single"),
                "{whole}: {} holds the CPX node",
                f.name
            );
            let rf = plan
                .resource_flavors
                .iter()
                .find(|rf| rf.metadata.name.as_deref() == Some(f.name.as_str()))
                .unwrap();
            let cpx = &inventory.nodes["amd-mi300x-cpx-single"];
            assert!(
                !cpx.labels.carries_all(&rf.spec.node_labels),
                "{whole}: {} selects the CPX node",
                f.name
            );
        }
    }
    let mi300x_whole: Vec<&FlavorReport> = plan
        .flavors
        .values()
        .filter(|r| r.model == "AMD_Instinct_MI300X_OAM" && r.sharing == SharingMode::Whole)
        .collect();
    assert_eq!(mi300x_whole.len(), 1);
    assert_eq!(mi300x_whole[0].healthy_capacity, 8);
    let cpx = &plan.classes["cpx"].flavors;
    assert_eq!(
        cpx.iter()
            .map(|f| plan.flavors[&f.name].healthy_capacity)
            .sum::<u64>(),
        128
    );
}

/// Each variant of the published NVIDIA and AMD schemes gets exactly one flavor,
/// pure, with quota within its own devices.
#[test]
fn vendor_fleet_one_pure_flavor_per_variant() {
    let (classes, budgets) = vendor_fleet_classes();
    let nodes = vendor_fleet::fleet();
    let health = HealthSnapshot::default();
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        plan.impure_flavors
            .iter()
            .map(ImpureFlavor::message)
            .collect::<Vec<_>>()
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let mut flavors_per_variant: BTreeMap<DeviceVariant, usize> = BTreeMap::new();
    for r in plan.flavors.values() {
        *flavors_per_variant
            .entry(variant_of(r).unwrap())
            .or_default() += 1;
    }
    assert!(
        flavors_per_variant.values().all(|n| *n == 1),
        "{flavors_per_variant:#?}"
    );
    // Every variant some class asks for has its flavor: whole (H100, A100, MI300X,
    // MI210), time-share (renamed H100, MIG-single and MIG-mixed replicas), the
    // 1g.10gb partition and both CPX namings.
    assert_eq!(flavors_per_variant.len(), 10, "{flavors_per_variant:#?}");
    // MIG slices shared by time-slicing are never offered as partitions.
    for f in &plan.classes["mig-1g10gb"].flavors {
        let r = &plan.flavors[&f.name];
        assert_eq!(r.sharing, SharingMode::Partition);
        assert_eq!(
            r.nodes.iter().collect::<Vec<_>>(),
            vec!["nv-a100-mig-mixed"]
        );
    }
}

/// Without the labels that tell variants apart (GFD before per-resource replicas
/// labels), the whole A100 flavor would select the all-MIG node and the MIG flavor the
/// whole node: both are refused and reported, not emitted.
#[test]
fn an_impure_flavor_is_refused_and_reported() {
    let stripped: Vec<Node> = ["nv-a100-whole", "nv-a100-mig-mixed"]
        .iter()
        .map(|name| {
            let mut node = vendor_fleet::fleet()
                .into_iter()
                .find(|n| n.metadata.name.as_deref() == Some(name))
                .unwrap();
            node.metadata
                .labels
                .as_mut()
                .unwrap()
                .retain(|k, _| !k.ends_with(".replicas") && !k.starts_with("nvidia.com/mig-"));
            node
        })
        .collect();
    let (classes, budgets) = vendor_fleet_classes();
    let health = HealthSnapshot::default();
    let (plan, inventory) = run(&classes, &budgets, &stripped, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let refused: Vec<(&str, SharingMode)> = plan
        .impure_flavors
        .iter()
        .map(|i| (i.foreign_nodes[0].as_str(), i.variant.sharing))
        .collect();
    assert!(
        refused.contains(&("nv-a100-mig-mixed", SharingMode::Whole)),
        "{refused:?}"
    );
    assert!(
        refused.contains(&("nv-a100-whole", SharingMode::Partition)),
        "{refused:?}"
    );
    assert!(plan.classes["mig-1g10gb"].flavors.is_empty());
    let conflict = plan.classes["whole"]
        .conditions
        .iter()
        .find(|c| c.reason == "ImpureFlavor")
        .expect("ImpureFlavor condition");
    assert!(
        conflict.message.contains("nv-a100-mig-mixed"),
        "{}",
        conflict.message
    );
    let summary = crate::cli::summary::render(&plan, &inventory);
    assert!(
        summary.contains("ImpureFlavor") || summary.contains("not created"),
        "{summary}"
    );
}

/// Shrunk from `dra_and_other_vendor_flavors_are_pure`: a class pooled by zone takes
/// every A100 first; a second class over the same cards (not split) interns its own
/// flavor key but gets no device. That key is nobody's flavor: it must be neither
/// emitted nor refused (a refusal no class reports), only the zoned one exists.
#[test]
fn a_flavor_every_class_lost_to_another_pooling_is_nobodys() {
    let mut node = vendor_fleet::fleet()
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some("nv-a100-whole"))
        .unwrap();
    let zone = "topology.kubernetes.io/zone";
    node.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(zone.into(), "zone-a".into());
    // The same model under a MIG label set: the unsplit key selects it too, so were
    // that key checked it would be refused.
    let mixed = vendor_fleet::fleet()
        .into_iter()
        .find(|n| n.metadata.name.as_deref() == Some("nv-a100-mig-mixed"))
        .unwrap();
    let mut zoned = class(
        "a-zoned",
        SharingMode::Whole,
        HardwareSelector {
            vendors: vec![crate::api::Vendor::Nvidia],
            ..Default::default()
        },
    );
    zoned.spec.pooling.split_by = vec![zone.into()];
    let all = class("b-all", SharingMode::Whole, HardwareSelector::default());
    let budgets = vec![budget("team", &["team"], &[("a-zoned", 1), ("b-all", 1)])];
    let health = HealthSnapshot::default();
    let (plan, inventory) = run(&[zoned, all], &budgets, &[node, mixed], &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    for (name, report) in &plan.flavors {
        assert!(!report.classes.is_empty(), "flavor {name} has no class");
    }
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert!(
        plan.classes["b-all"]
            .conditions
            .iter()
            .any(|c| c.reason == "PoolingConflict"),
        "{:#?}",
        plan.classes["b-all"].conditions
    );
}

/// Labels the vendor fleet's nodes may lose, as with an older labeller or one run
/// without its partition flag.
const DROPPABLE: [&str; 5] = [
    "nvidia.com/gpu.replicas",
    "nvidia.com/gpu.sharing-strategy",
    "nvidia.com/mig-1g.10gb.product",
    "amd.com/gpu.compute-memory-partition",
    "amd.com/gpu.product-name",
];

fn arb_mixed_fleet() -> impl Strategy<Value = Vec<Node>> {
    (
        0usize..40,
        any::<u64>(),
        prop::collection::vec((0..NODES.len(), any::<u8>()), 0..14),
    )
        .prop_map(|(synthetic, seed, picks)| {
            let mut nodes = generate_fleet(synthetic, seed);
            let vendor = vendor_fleet::fleet();
            for (i, (pick, drops)) in picks.into_iter().enumerate() {
                let mut node = vendor[pick].clone();
                let name = format!("{}-{i}", node.metadata.name.as_deref().unwrap());
                node.metadata.name = Some(name);
                if let Some(labels) = node.metadata.labels.as_mut() {
                    for (bit, key) in DROPPABLE.iter().enumerate() {
                        // Mostly intact nodes: drop a label for 1 bit pattern in 4.
                        if drops & (1 << bit) != 0 && drops >> 6 == 0 {
                            labels.remove(*key);
                        }
                    }
                }
                nodes.push(node);
            }
            nodes
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// On random mixed fleets (synthetic nodes of every vendor plus the NVIDIA and
    /// AMD published schemes, some with labels missing) and random classes and
    /// budgets: no emitted flavor selects a node without its variant, quota stays
    /// within each variant's devices, and every refusal is reported.
    #[test]
    fn flavors_are_pure_and_quota_within_each_variant(
        (classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        nodes in arb_mixed_fleet(),
        seed in any::<u64>(),
    ) {
        let health = arb_health(&nodes, seed);
        let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
        assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    }
}

/// DRA-only groups have no pins by design (claims are placed by ResourceSlice): the
/// purity check leaves their flavors to the DRA path instead of refusing them all.
#[test]
fn dra_only_flavors_are_not_refused() {
    let nodes: Vec<Node> = [
        "metadata: {name: dra-node}\nstatus: {capacity: {cpu: \"64\"}, allocatable: {cpu: \"64\"}}",
        "metadata: {name: cpu-node}\nstatus: {capacity: {cpu: \"64\"}, allocatable: {cpu: \"64\"}}",
    ]
    .iter()
    .map(|y| serde_yaml::from_str(y).unwrap())
    .collect();
    let slice: k8s_openapi::api::resource::v1::ResourceSlice = serde_yaml::from_str(
        r#"
metadata: {name: amd-slice}
spec:
  driver: gpu.amd.com
  nodeName: dra-node
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0
      attributes:
        productName: {string: AMD Instinct MI300X}
        partitionProfile: {string: spx_nps1}
      capacity: {memory: {value: 192Gi}}
"#,
    )
    .unwrap();
    let inventory = Inventory::from_nodes_and_slices(&nodes, [&slice]);
    let classes = vec![class(
        "whole",
        SharingMode::Whole,
        HardwareSelector::default(),
    )];
    let health = HealthSnapshot::default();
    let options = PlanOptions::default();
    let plan = plan(&PlanInput {
        classes: &classes,
        budgets: &[],
        inventory: &inventory,
        health: &health,
        options: &options,
    });
    assert!(plan.impure_flavors.is_empty());
    assert_eq!(plan.resource_flavors.len(), 1);
}
