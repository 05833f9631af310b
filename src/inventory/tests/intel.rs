//! Intel: Gaudi and GPU device plugins, and Habana feature discovery's label schemes.

use super::*;

#[test]
fn intel_gaudi_and_gpus() {
    let n = read_node(&node(
        r#"
metadata:
  name: hpu-gaudi3-01
  labels: {kaccel.io/accelerator.model: Gaudi3}
spec:
  taints: [{key: habana.ai/gaudi, value: present, effect: NoSchedule}]
status:
  capacity: {habana.ai/gaudi: "8"}
  allocatable: {habana.ai/gaudi: "7"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let g = group(&n, "habana.ai/gaudi");
    assert_eq!(g.variant.vendor, Vendor::Intel);
    assert_eq!(g.variant.model, "Gaudi3");
    assert_eq!((g.capacity, g.allocatable), (8, 7));
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("gaudi3"));
    assert_eq!(g.pin_labels, pins(&[(MODEL_LABEL, "Gaudi3")]));
    assert_eq!(g.vendor_taint_keys, vec!["habana.ai/gaudi".to_string()]);

    let dl1 = read_node(&node(
        r#"
metadata:
  name: dl1
  labels: {node.kubernetes.io/instance-type: dl1.24xlarge}
status:
  capacity: {habana.ai/gaudi: "8"}
  allocatable: {habana.ai/gaudi: "8"}
"#,
    ));
    let g = group(&dl1, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi");
    assert_eq!(
        g.pin_labels,
        pins(&[("node.kubernetes.io/instance-type", "dl1.24xlarge")])
    );

    let gpu = read_node(&node(
        r#"
metadata:
  name: max1550
  labels:
    gpu.intel.com/product: Max_1550
    gpu.intel.com/family: Max_Series
    gpu.intel.com/device.count: "4"
    gpu.intel.com/memory.max: "549755813888"
    gpu.intel.com/millicores: "4000"
    gpu.intel.com/tiles: "8"
status:
  capacity: {gpu.intel.com/i915: "4", gpu.intel.com/millicores: "4000", gpu.intel.com/memory.max: "549755813888"}
  allocatable: {gpu.intel.com/i915: "4", gpu.intel.com/millicores: "4000", gpu.intel.com/memory.max: "549755813888"}
"#,
    ));
    assert!(gpu.warnings.is_empty(), "{:?}", gpu.warnings);
    assert_eq!(gpu.groups.len(), 1, "millicores/memory.max are not devices");
    let g = group(&gpu, "gpu.intel.com/i915");
    assert_eq!(g.variant.model, "Max_1550");
    assert_eq!(g.variant.sharing, SharingMode::Whole);
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("xe-hpc"));
    assert_eq!(g.pin_labels, pins(&[("gpu.intel.com/product", "Max_1550")]));

    let shared = read_node(&node(
        r#"
metadata:
  name: flex-shared
  labels: {gpu.intel.com/product: Flex_170, gpu.intel.com/device.count: "1"}
status:
  capacity: {gpu.intel.com/xe: "10"}
  allocatable: {gpu.intel.com/xe: "10"}
"#,
    ));
    assert_eq!(
        group(&shared, "gpu.intel.com/xe").variant.sharing,
        SharingMode::TimeShare
    );
}

/// Habana feature discovery labels (HabanaAI habanalabs-feature-discovery README:
/// `habana.ai/device.count`, `habana.ai/machine.type`, `habana.ai/driver.version`;
/// the issue's `habana.ai/device.type` and `habana.ai/device.id`). PCI IDs from the
/// habanalabs kernel driver (`PCI_IDS_GAUDI2 0x1020`, `PCI_IDS_GAUDI3 0x1060`,
/// HabanaAI/drivers.accel.habanalabs.kernel `habanalabs_drv.c`). A value kaccel does
/// not know is unclassified, never guessed.
#[test]
fn habana_feature_discovery_schemes() {
    let read = |labels: &str| {
        read_node(&node(&format!(
            r#"
metadata:
  name: gaudi-01
  labels: {{habana.ai/device.count: "8", habana.ai/driver.version: 1.18.0-524, {labels}}}
status:
  capacity: {{habana.ai/gaudi: "8"}}
  allocatable: {{habana.ai/gaudi: "8"}}
"#
        )))
    };
    let by_type = read("habana.ai/device.type: GAUDI3");
    let g = group(&by_type, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi3");
    assert_eq!(g.memory_mib, Some(128 * 1024));
    assert_eq!(g.pin_labels, pins(&[("habana.ai/device.type", "GAUDI3")]));

    let by_id = read("habana.ai/device.id: \"1020\"");
    let g = group(&by_id, "habana.ai/gaudi");
    assert_eq!(g.variant.model, "Gaudi2");
    assert_eq!(g.pin_labels, pins(&[("habana.ai/device.id", "1020")]));

    let unknown = read("habana.ai/device.type: GAUDI9");
    assert!(unknown.groups.is_empty(), "{:#?}", unknown.groups);
    assert_eq!(unknown.unclassified.len(), 1);
    assert_eq!(unknown.unclassified[0].count, 8);
    assert!(unknown.warnings.iter().any(|w| w.contains("GAUDI9")));
}
