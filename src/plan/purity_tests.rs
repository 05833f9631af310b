//! The purity check and invariant 1 per variant, on fleets built from the NVIDIA
//! and AMD label schemes their own labellers write
//! (`crate::inventory::vendor_fleet_nvidia_amd`) mixed with the synthetic fleet.
//! Every check recounts from the inventory, independently of the planner's report.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use proptest::prelude::*;

use super::tests::{
    arb_budgets, arb_classes, arb_health, budget, class, device_quota, open_to, run, selects,
};
use super::*;
use crate::api::HardwareSelector;
use crate::inventory::synthetic::generate_fleet;
use crate::inventory::vendor_fleet_nvidia_amd::{self as vendor_fleet, NODES};
use crate::inventory::vendor_fleet_other as other_fleet;
use crate::inventory::{DeviceGroup, DeviceVariant};

/// Total nominal quota per flavor over its device resources.
fn quota_per_flavor(plan: &Plan) -> BTreeMap<String, u64> {
    let mut quota: BTreeMap<String, u64> = BTreeMap::new();
    for ((flavor, _), amount) in device_quota(plan) {
        *quota.entry(flavor).or_default() += amount;
    }
    quota
}

fn variant_of(report: &FlavorReport) -> Option<DeviceVariant> {
    Some(DeviceVariant {
        vendor: report.vendor?,
        model: report.model.clone(),
        sharing: report.sharing,
        partition_profile: report.partition_profile.clone(),
        resource_name: report.resource_name.clone(),
    })
}

/// Purity and invariant 1 per variant, recounted from the inventory:
/// - every node a device flavor's nodeLabels select carries that flavor's kind of
///   device (vendor, model, sharing, partition; the resource name may differ);
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
        assert!(!impure.foreign_nodes.is_empty());
        assert!(
            !plan
                .resource_flavors
                .iter()
                .any(|f| f.spec.node_labels == impure.node_labels
                    && plan.flavors[f.metadata.name.as_ref().unwrap()].resource_name
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
                !rf.spec
                    .node_labels
                    .iter()
                    .all(|(k, v)| cpx.labels.get(k) == Some(v)),
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

fn run_with_slices(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[Node],
    slices: &[ResourceSlice],
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

/// Classes for the Huawei / AWS / DRA fleet: whole devices of every vendor, Ascend
/// 4-core vNPUs, NeuronCores; each granted generously.
fn other_fleet_classes(
    selectors: &[(&str, BTreeMap<String, String>)],
) -> (Vec<AcceleratorClass>, Vec<CreditBudget>) {
    let sel = |profile: Option<&str>, name: &str| HardwareSelector {
        partition_profile: profile.map(str::to_string),
        node_labels: selectors
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, l)| l.clone())
            .unwrap_or_default(),
        ..Default::default()
    };
    let classes = vec![
        class("whole", SharingMode::Whole, sel(None, "whole")),
        class(
            "vnpu-4c",
            SharingMode::Partition,
            sel(Some("4c"), "vnpu-4c"),
        ),
        class(
            "neuroncores",
            SharingMode::Partition,
            sel(Some("neuroncore"), "neuroncores"),
        ),
    ];
    let budgets = vec![budget(
        "team",
        &["team"],
        &[
            ("whole", 10_000),
            ("vnpu-4c", 10_000),
            ("neuroncores", 10_000),
        ],
    )];
    (classes, budgets)
}

fn refused_messages(plan: &Plan) -> Vec<String> {
    plan.impure_flavors
        .iter()
        .map(ImpureFlavor::message)
        .collect()
}

/// Ascend, issue case (b): a first-generation 910 node without accelerator-type beside
/// an Atlas A3 node. The device plugin's servertype (`Ascend910-32` vs
/// `Ascend910A3-20`) is pinned, so both flavors are pure; without it (an older plugin)
/// the 910 flavor would select the A3 node and is refused, naming the labels that tell
/// them apart.
#[test]
fn ascend_first_generation_beside_a3() {
    let (classes, budgets) = other_fleet_classes(&[]);
    let health = HealthSnapshot::default();
    let nodes = vec![
        other_fleet::node("ascend910-servertype"),
        other_fleet::node("ascend910a3"),
    ];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let first_gen = plan
        .resource_flavors
        .iter()
        .find(|f| plan.flavors[f.metadata.name.as_ref().unwrap()].model == "Ascend910")
        .expect("a first-generation 910 flavor");
    assert_eq!(
        first_gen
            .spec
            .node_labels
            .get("servertype")
            .map(String::as_str),
        Some("Ascend910-32")
    );

    let mut bare = other_fleet::node("ascend910-servertype");
    bare.metadata.labels.as_mut().unwrap().remove("servertype");
    let nodes = vec![bare, other_fleet::node("ascend910a3")];
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let refused: Vec<&ImpureFlavor> = plan
        .impure_flavors
        .iter()
        .filter(|i| i.variant.model == "Ascend910")
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", refused_messages(&plan));
    assert_eq!(refused[0].foreign_nodes, ["ascend910a3"]);
    let message = refused[0].message();
    assert!(
        message.contains("accelerator-type") && message.contains("servertype"),
        "{message}"
    );
    // The A3 flavor is pinned by its accelerator-type: still emitted.
    assert!(plan.flavors.values().any(|r| r.model == "Ascend910A3"));
}

/// Ascend, issue case (a): static vNPU nodes carry exactly the labels of whole-NPU
/// nodes of the same chip (the device plugin writes no label saying a template
/// exists), so the 4c flavor would select the whole-only node: refused, naming the
/// fix. With the platform team's own label selected by each class, both are pure.
#[test]
fn ascend_vnpu_beside_whole_npus() {
    let health = HealthSnapshot::default();
    let nodes = vec![
        other_fleet::node("ascend910b3-whole"),
        other_fleet::node("ascend910b3-vnpu"),
    ];
    let (classes, budgets) = other_fleet_classes(&[]);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let refused: Vec<&ImpureFlavor> = plan
        .impure_flavors
        .iter()
        .filter(|i| i.variant.partition_profile.as_deref() == Some("4c"))
        .collect();
    assert_eq!(refused.len(), 1, "{:?}", refused_messages(&plan));
    assert_eq!(refused[0].foreign_nodes, ["ascend910b3-whole"]);
    let message = refused[0].message();
    assert!(
        message.contains("static vNPU") && message.contains("spec.selector.nodeLabels"),
        "{message}"
    );
    assert!(plan.classes["vnpu-4c"].flavors.is_empty());
    assert!(
        plan.classes["vnpu-4c"]
            .conditions
            .iter()
            .any(|c| c.reason == "ImpureFlavor" && c.message.contains("static vNPU"))
    );

    // The fix the message names.
    let mut nodes = nodes;
    for (node, mode) in nodes.iter_mut().zip(["whole", "vnpu"]) {
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("npu-mode".into(), mode.into());
    }
    let label = |v: &str| BTreeMap::from([("npu-mode".to_string(), v.to_string())]);
    let (classes, budgets) =
        other_fleet_classes(&[("vnpu-4c", label("vnpu")), ("whole", label("whole"))]);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let vnpu = &plan.classes["vnpu-4c"].flavors;
    assert_eq!(vnpu.len(), 1);
    assert_eq!(plan.flavors[&vnpu[0].name].healthy_capacity, 20);
}

/// Neuron views on a partly labelled fleet: the view is pinned where the label names
/// it, so the `device`-labelled and `core`-labelled flavors are pure; the device flavor
/// of the unlabelled node cannot exclude the core node (nodeLabels cannot require a
/// label's absence) and is refused, naming the label to set. Labelled throughout, the
/// fleet plans with no refusal.
#[test]
fn neuron_views_on_a_partly_labelled_fleet() {
    let health = HealthSnapshot::default();
    let (classes, budgets) = other_fleet_classes(&[]);
    let nodes: Vec<Node> = ["trn1-unlabelled", "trn1-device", "trn1-core"]
        .iter()
        .map(|n| other_fleet::node(n))
        .collect();
    let (plan, inventory) = run(&classes, &budgets, &nodes, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    assert_eq!(
        plan.impure_flavors.len(),
        1,
        "{:?}",
        refused_messages(&plan)
    );
    let refused = &plan.impure_flavors[0];
    assert_eq!(refused.variant.resource_name, "aws.amazon.com/neuron");
    assert!(!refused.node_labels.contains_key("kaccel.io/neuron.view"));
    assert_eq!(refused.foreign_nodes, ["trn1-core"]);
    assert!(
        refused.message().contains("kaccel.io/neuron.view=device"),
        "{}",
        refused.message()
    );
    let views: Vec<Option<&str>> = plan
        .resource_flavors
        .iter()
        .filter(|f| plan.flavors[f.metadata.name.as_ref().unwrap()].vendor == Some(Vendor::Aws))
        .map(|f| {
            f.spec
                .node_labels
                .get("kaccel.io/neuron.view")
                .map(String::as_str)
        })
        .collect();
    assert_eq!(views.len(), 2, "{views:?}");
    assert!(views.contains(&Some("device")) && views.contains(&Some("core")));

    let labelled: Vec<Node> = nodes[1..].to_vec();
    let (plan, inventory) = run(&classes, &budgets, &labelled, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let cores = &plan.classes["neuroncores"].flavors;
    assert_eq!(cores.len(), 1);
    assert_eq!(plan.flavors[&cores[0].name].healthy_capacity, 32);
}

/// DRA-only flavors are checked against the nodes publishing their DeviceClass: an
/// unpinned Gaudi2 flavor would also select the Gaudi3 node (same DeviceClass) and is
/// refused, naming the label that pins it; the TPU and Intel GPU nodes (other classes)
/// do not count against it. Pinned, every flavor is emitted.
#[test]
fn dra_flavors_are_pure_per_device_class() {
    let health = HealthSnapshot::default();
    let (classes, budgets) = other_fleet_classes(&[]);
    let names = ["gaudi2-dra", "gaudi3-dra", "max1550-dra", "tpu-v6e-dra"];
    let mut nodes: Vec<Node> = names.iter().map(|n| other_fleet::node(n)).collect();
    let slices: Vec<ResourceSlice> = names
        .iter()
        .flat_map(|n| other_fleet::slices_of(n))
        .collect();
    let (plan, inventory) = run_with_slices(&classes, &budgets, &nodes, &slices, &health);
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    assert_eq!(
        plan.impure_flavors.len(),
        1,
        "{:?}",
        refused_messages(&plan)
    );
    let refused = &plan.impure_flavors[0];
    assert_eq!(refused.variant.model, "Gaudi2");
    assert_eq!(refused.foreign_nodes, ["gaudi3-dra"]);
    assert!(
        refused
            .message()
            .contains("kaccel.io/accelerator.model=Gaudi2"),
        "{}",
        refused.message()
    );
    let emitted: BTreeMap<&str, u64> = plan
        .flavors
        .values()
        .map(|r| (r.model.as_str(), r.healthy_capacity))
        .collect();
    assert_eq!(
        emitted,
        BTreeMap::from([("Gaudi3", 2), ("Max_1550", 2), ("tpu-v6e-slice", 4)])
    );

    nodes[0]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(crate::inventory::MODEL_LABEL.into(), "Gaudi2".into());
    let (plan, inventory) = run_with_slices(&classes, &budgets, &nodes, &slices, &health);
    assert!(
        plan.impure_flavors.is_empty(),
        "{:?}",
        refused_messages(&plan)
    );
    assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
    let gaudi2 = plan
        .flavors
        .values()
        .find(|r| r.model == "Gaudi2")
        .expect("Gaudi2 flavor");
    // 7 Gaudi2 published, one unhealthy (healthy: false); the Unknown one is not a Gaudi2.
    assert_eq!(gaudi2.healthy_capacity, 6);
}

/// Labels the other fleet's nodes may lose (an older device plugin, a platform team
/// that labelled only some nodes).
const OTHER_DROPPABLE: [&str; 5] = [
    "servertype",
    "accelerator-type",
    "kaccel.io/neuron.view",
    "kaccel.io/accelerator.model",
    "gpu.intel.com/product",
];

fn arb_fleet_with_dra() -> impl Strategy<Value = (Vec<Node>, Vec<ResourceSlice>)> {
    (
        0usize..20,
        any::<u64>(),
        prop::collection::vec((0..other_fleet::NODES.len(), any::<u8>()), 0..16),
        prop::collection::vec((0..NODES.len(), any::<u8>()), 0..6),
    )
        .prop_map(|(synthetic, seed, picks, nv_amd)| {
            let mut nodes = generate_fleet(synthetic, seed);
            let mut slices = Vec::new();
            for (i, (pick, drops)) in picks.into_iter().enumerate() {
                let name = other_fleet::NODES[pick].0;
                let (mut node, node_slices) = other_fleet::renamed(name, &format!("{name}-{i}"));
                if let Some(labels) = node.metadata.labels.as_mut() {
                    for (bit, key) in OTHER_DROPPABLE.iter().enumerate() {
                        if drops & (1 << bit) != 0 && drops >> 5 == 0 {
                            labels.remove(*key);
                        }
                    }
                }
                // Now and then a driver's slices are not there (yet).
                if drops != 0xff {
                    slices.extend(node_slices);
                }
                nodes.push(node);
            }
            let vendor = vendor_fleet::fleet();
            for (i, (pick, _)) in nv_amd.into_iter().enumerate() {
                let mut node = vendor[pick].clone();
                node.metadata.name =
                    Some(format!("{}-v{i}", node.metadata.name.as_deref().unwrap()));
                nodes.push(node);
            }
            (nodes, slices)
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// The Huawei, AWS and DRA schemes (with labels randomly missing) mixed with the
    /// synthetic and NVIDIA/AMD fleets, random classes, budgets and health: emitted
    /// flavors are pure (DRA-only ones over their DeviceClass), quota stays within
    /// each variant, and every refusal is reported.
    #[test]
    fn dra_and_other_vendor_flavors_are_pure(
        (classes, budgets) in arb_classes().prop_flat_map(|c| { let n = c.len(); (Just(c), arb_budgets(n)) }),
        (nodes, slices) in arb_fleet_with_dra(),
        seed in any::<u64>(),
    ) {
        let health = arb_health(&nodes, seed);
        let mut all_classes = classes;
        let (extra, extra_budgets) = other_fleet_classes(&[]);
        all_classes.extend(extra);
        let mut all_budgets = budgets;
        all_budgets.extend(extra_budgets);
        let (plan, inventory) = run_with_slices(&all_classes, &all_budgets, &nodes, &slices, &health);
        assert_pure_and_within_variant_capacity(&plan, &inventory, &health);
        // Unclassified devices are never a variant's capacity nor CPU capacity.
        for (node, _) in inventory.unclassified() {
            prop_assert!(node.has_accelerators());
        }
    }
}
