//! Huawei: Ascend whole NPUs and vNPUs, A3 and 950 form factors, unknown ones unclassified.

use super::*;

#[test]
fn huawei_ascend_whole_and_vnpu() {
    let n = read_node(&node(
        r#"
metadata:
  name: npu-910b-02
  labels:
    accelerator: huawei-Ascend910
    accelerator-type: module-910b-8
    node.kubernetes.io/npu.chip.name: 910B3
    servertype: Ascend910B-20
    kubernetes.io/arch: arm64
status:
  capacity: {huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "20", huawei.com/Ascend910-memory: "262144"}
  allocatable: {huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "19", huawei.com/Ascend910-memory: "262144"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 2, "{:#?}", n.groups);
    let whole = group(&n, "huawei.com/Ascend910");
    assert_eq!(whole.variant.vendor, Vendor::Huawei);
    assert_eq!(whole.variant.model, "Ascend910B3");
    assert_eq!(whole.variant.sharing, SharingMode::Whole);
    assert_eq!(whole.memory_mib, Some(64 * 1024));
    assert_eq!(
        whole.pin_labels,
        pins(&[
            ("accelerator", "huawei-Ascend910"),
            ("node.kubernetes.io/npu.chip.name", "910B3")
        ])
    );
    assert_eq!(
        whole.raw_labels.get("servertype").map(String::as_str),
        Some("Ascend910B-20")
    );
    let vnpu = group(&n, "huawei.com/Ascend910-4c");
    assert_eq!(vnpu.variant.sharing, SharingMode::Partition);
    assert_eq!(vnpu.variant.partition_profile.as_deref(), Some("4c"));
    assert_eq!(vnpu.variant.model, "Ascend910B3");
    assert_eq!((vnpu.capacity, vnpu.allocatable), (20, 19));

    let older = read_node(&node(
        r#"
metadata:
  name: npu-910-01
  labels: {accelerator: huawei-Ascend910, accelerator-type: module}
status:
  capacity: {huawei.com/Ascend910: "8"}
  allocatable: {huawei.com/Ascend910: "8"}
"#,
    ));
    let g = group(&older, "huawei.com/Ascend910");
    assert_eq!(g.variant.model, "Ascend910");
    assert_eq!(
        g.pin_labels,
        pins(&[
            ("accelerator", "huawei-Ascend910"),
            ("accelerator-type", "module")
        ])
    );
}

/// Ascend schemes beyond first-generation 910 (MindCluster "创建节点标签" table:
/// `accelerator-type` `module-a3-16` for A200T A3 Box8, `module-a3-16-super-pod` for
/// Atlas 900 A3 SuperPoD; Ascend 950 nodes through `huawei.com/npu` with
/// `350-Atlas-*` / `850-*` / `950-SuperPod-*` form factors, mind-cluster
/// `ASCEND_950_NPU_NUM`). An A3 node is never the first-generation 910 variant, nor
/// selected by its flavor; an unknown form factor is unclassified.
#[test]
fn ascend_a3_npu_and_unknown_form_factors() {
    let read = |accel_type: &str, resource: &str| {
        read_node(&node(&format!(
            r#"
metadata:
  name: npu-01
  labels: {{accelerator: huawei-Ascend910, accelerator-type: {accel_type}}}
status:
  capacity: {{"{resource}": "16"}}
  allocatable: {{"{resource}": "16"}}
"#
        )))
    };
    let first_gen = read("module", "huawei.com/Ascend910");
    let a3 = read("module-a3-16-super-pod", "huawei.com/Ascend910");
    let g1 = group(&first_gen, "huawei.com/Ascend910");
    let g3 = group(&a3, "huawei.com/Ascend910");
    assert_eq!(g1.variant.model, "Ascend910");
    assert_eq!(g3.variant.model, "Ascend910A3");
    assert_ne!(g1.variant, g3.variant);
    // Pure: each flavor's pins are not all carried by the other node.
    assert!(
        g1.pin_labels
            .iter()
            .any(|(k, v)| a3.labels.get(k) != Some(v))
    );
    assert!(
        g3.pin_labels
            .iter()
            .any(|(k, v)| first_gen.labels.get(k) != Some(v))
    );

    let a5 = read("950-SuperPod-Atlas-8", "huawei.com/npu");
    let g5 = group(&a5, "huawei.com/npu");
    assert_eq!(g5.variant.model, "Ascend950");
    assert_eq!(g5.variant.sharing, SharingMode::Whole);

    let unknown = read("module-z9-64", "huawei.com/Ascend910");
    assert!(unknown.groups.is_empty(), "{:#?}", unknown.groups);
    assert_eq!(unknown.unclassified[0].source, "huawei.com/Ascend910");
    assert!(unknown.has_accelerators());
}
