//! What counts as capacity: device health, cordoned and not-ready nodes, the CPU pool.

use super::*;

#[test]
fn failed_devices_shrink_quota_and_warnings_demote_a_flavor() {
    let (classes, budgets, nodes) = examples();
    let (healthy_plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = healthy_plan.flavors[h100].healthy_capacity;

    let mut health = HealthSnapshot::default();
    let h100_nodes: Vec<&String> = healthy_plan.flavors[h100].nodes.iter().collect();
    health.set(
        h100_nodes[0],
        "nvidia.com/gpu",
        HealthCounts {
            healthy: 5,
            failed: 3,
            ..Default::default()
        },
    );
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    assert!(plan.flavors[h100].healthy_capacity < before);
    assert!(plan.flavors[h100].granted <= plan.flavors[h100].healthy_capacity);
    assert_quota_within_healthy_capacity(&plan, &inventory, &health, true);
    let large = &plan.classes["large-training"];
    assert!(
        large
            .conditions
            .iter()
            .any(|c| c.type_ == api::DEGRADED && c.status)
    );

    // Every H100 node warns: H100 moves behind MI300X in every class using it.
    let mut health = HealthSnapshot::default();
    for n in &h100_nodes {
        health.set(
            n,
            "nvidia.com/gpu",
            HealthCounts {
                healthy: 4,
                warning: 4,
                ..Default::default()
            },
        );
    }
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    let large = &plan.classes["large-training"];
    assert_ne!(large.flavors[0].name, h100);
    assert!(
        large
            .flavors
            .iter()
            .find(|f| f.name == h100)
            .unwrap()
            .demoted
    );
    let cq = plan
        .cluster_queues
        .iter()
        .find(|q| q.metadata.name.as_deref() == Some("vision-large-training"))
        .unwrap();
    assert_ne!(cq.spec.resource_groups[0].flavors[0].name, h100);
}

#[test]
fn unknown_health_keeps_capacity_but_is_visible() {
    let (classes, budgets, nodes) = examples();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = plan.flavors[h100].healthy_capacity;
    let mut health = HealthSnapshot::default();
    for n in &plan.flavors[h100].nodes {
        health.set(
            n,
            "nvidia.com/gpu",
            HealthCounts {
                unknown: 8,
                ..Default::default()
            },
        );
    }
    let (plan, _) = run(&classes, &budgets, &nodes, &health);
    assert_eq!(
        plan.flavors[h100].healthy_capacity, before,
        "a dead exporter must not drain quota"
    );
    assert!(plan.flavors[h100].devices.unknown >= 31);
}

#[test]
fn cordoned_and_not_ready_nodes_leave_capacity() {
    let (classes, budgets, mut nodes) = examples();
    let (plan, _) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    let h100 = "nvidia-h100-80gb-hbm3";
    let before = plan.flavors[h100].healthy_capacity;
    let target = plan.flavors[h100].nodes.iter().next().unwrap().clone();
    let node = nodes
        .iter_mut()
        .find(|n| n.metadata.name.as_ref() == Some(&target))
        .unwrap();
    node.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    let (plan, inventory) = run(&classes, &budgets, &nodes, &HealthSnapshot::default());
    assert!(plan.flavors[h100].healthy_capacity < before);
    assert_quota_within_healthy_capacity(&plan, &inventory, &HealthSnapshot::default(), true);
}

/// A Ready node with `cpu` cores, 64 GiB, `labels` (YAML map entries) and `extra`
/// capacity entries (`, vendor/resource: "8"`).
fn ready_node(name: &str, labels: &str, extra: &str, cpu: u32) -> Node {
    serde_yaml::from_str(&format!(
        r#"
metadata: {{name: {name}, labels: {{{labels}}}}}
status:
  capacity: {{cpu: "{cpu}", memory: 64Gi{extra}}}
  allocatable: {{cpu: "{cpu}", memory: 64Gi{extra}}}
  conditions: [{{type: Ready, status: "True"}}]
"#
    ))
    .unwrap()
}

/// A CPU-only class without node labels: its flavor is pinned to `kaccel.io/pool=cpu`
/// (never empty nodeLabels, which select every node), its quota counts only labelled
/// nodes with no accelerator of any kind — not an accelerator node kaccel cannot
/// classify — and an accelerator node carrying the pool label is reported.
#[test]
fn cpu_pool_counts_only_accelerator_free_nodes_it_selects() {
    let node = ready_node;
    let nodes = vec![
        node("cpu-labelled", "kaccel.io/pool: cpu", "", 32),
        node("cpu-unlabelled", "", "", 16),
        // Qualcomm Cloud AI 100 (`qualcomm.com/qaic`): no kaccel adapter reads it.
        node(
            "qaic-01",
            "kaccel.io/pool: cpu",
            ", qualcomm.com/qaic: \"8\"",
            64,
        ),
        // GPU Feature Discovery labels, device plugin not (yet) advertising GPUs.
        node("gpu-no-plugin", "nvidia.com/gpu.present: \"true\"", "", 48),
    ];
    let cpu = class("cpu", SharingMode::CpuOnly, HardwareSelector::default());
    let (plan, inventory) = run(
        &[cpu],
        &[budget("t", &["t"], &[("cpu", 8)])],
        &nodes,
        &HealthSnapshot::default(),
    );
    assert_eq!(inventory.unclassified().count(), 2);
    let flavor = plan
        .flavors
        .values()
        .find(|f| f.classes.contains("cpu"))
        .expect("CPU flavor");
    assert_eq!(
        flavor.node_labels,
        BTreeMap::from([(CPU_POOL_LABEL.to_string(), CPU_POOL_VALUE.to_string())])
    );
    assert_eq!(
        flavor.nodes.iter().map(String::as_str).collect::<Vec<_>>(),
        vec!["cpu-labelled"]
    );
    assert_eq!(flavor.healthy_capacity, 32);
    let rf = plan
        .resource_flavors
        .iter()
        .find(|rf| rf.metadata.name.as_deref() == Some(flavor.name.as_str()))
        .unwrap();
    assert_eq!(rf.spec.node_labels, flavor.node_labels);
    let conflict = plan.classes["cpu"]
        .conditions
        .iter()
        .find(|c| c.type_ == api::CONFLICT)
        .expect("the pool label on an accelerator node is reported");
    assert!(conflict.message.contains("qaic-01"), "{}", conflict.message);
    assert!(!conflict.message.contains("cpu-labelled"));
}

/// A CPU-only class with node labels of its own: the accelerator nodes reported
/// are those carrying all of its labels, not some.
#[test]
fn a_cpu_pool_reports_accelerator_nodes_carrying_all_its_labels() {
    let node = |name: &str, labels: &str, extra: &str| ready_node(name, labels, extra, 32);
    // Qualcomm Cloud AI 100 (`qualcomm.com/qaic`): an accelerator no adapter reads.
    let qaic = ", qualcomm.com/qaic: \"8\"";
    let nodes = vec![
        node("cpu-a", "pool: general, zone: a", ""),
        node("qaic-a", "pool: general, zone: a", qaic),
        node("qaic-b", "pool: general, zone: b", qaic),
        node("qaic-other-pool", "pool: batch, zone: a", qaic),
    ];
    let mut cpu = class("cpu", SharingMode::CpuOnly, HardwareSelector::default());
    cpu.spec.selector.node_labels = BTreeMap::from([
        ("pool".into(), "general".into()),
        ("zone".into(), "a".into()),
    ]);
    let (plan, _) = run(
        &[cpu],
        &[budget("t", &["t"], &[("cpu", 8)])],
        &nodes,
        &HealthSnapshot::default(),
    );
    let conflict = plan.classes["cpu"]
        .conditions
        .iter()
        .find(|c| c.type_ == api::CONFLICT)
        .expect("an accelerator node carrying the pool's labels is reported");
    assert!(
        conflict.message.contains("1 node(s)"),
        "{}",
        conflict.message
    );
    assert!(conflict.message.contains("qaic-a"), "{}", conflict.message);
    for not_selected in ["cpu-a", "qaic-b", "qaic-other-pool"] {
        assert!(
            !conflict.message.contains(not_selected),
            "{not_selected}: {}",
            conflict.message
        );
    }
}
