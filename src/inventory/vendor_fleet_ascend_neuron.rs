//! Ascend and Neuron nodes written from what the Huawei and AWS stacks publish (not
//! from kaccel's output): Ascend nodes as the MindCluster device plugin labels them,
//! Neuron nodes in both views. One part of the fleet `vendor_fleet_other` assembles;
//! each entry's comment names its source.
//!
//! Sources:
//! - Huawei: Ascend/mind-cluster v7.3.2 (9246fe46, 2026-04-17),
//!   `component/ascend-device-plugin/pkg/server/manager.go` `getNewNodeLabel`
//!   (`servertype` = `<RealCardType>-<AiCoreCount>` when the node has none,
//!   `node.kubernetes.io/npu.chip.name` = the chip name from DCMI); card types from
//!   `component/ascend-common/api/default_name.go` (`Ascend910`, `Ascend910B`,
//!   `Ascend910A3`); the `accelerator` and `accelerator-type` labels as the MindCluster
//!   node-label table has the platform team set them; static vNPU resources
//!   `huawei.com/Ascend910-<template>` (`presetVirtualDevice`, `main.go`).
//! - AWS: the Neuron device plugin's `aws.amazon.com/neuron` and
//!   `aws.amazon.com/neuroncore` (both advertised on one node), EKS's
//!   `node.kubernetes.io/instance-type`; `kaccel.io/neuron.view` is kaccel's own.

/// (node name, YAML) for the Ascend and Neuron nodes of the fleet.
pub(crate) const NODES: &[(&str, &str)] = &[
    // First-generation Atlas 800 (910): no accelerator-type set by the platform team,
    // servertype as the device plugin writes it (RealCardType Ascend910, 32 AI cores),
    // an older plugin without the chip-name label.
    (
        "ascend910-servertype",
        r#"
metadata:
  name: ascend910-servertype
  labels: {accelerator: huawei-Ascend910, servertype: Ascend910-32, host-arch: huawei-arm}
status:
  capacity: {cpu: "192", memory: 768Gi, huawei.com/Ascend910: "8"}
  allocatable: {cpu: "191", memory: 760Gi, huawei.com/Ascend910: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // Atlas 900 A3 SuperPoD: accelerator-type from the MindCluster table, servertype
    // from the plugin (RealCardType Ascend910A3).
    (
        "ascend910a3",
        r#"
metadata:
  name: ascend910a3
  labels: {accelerator: huawei-Ascend910, accelerator-type: module-a3-16-super-pod, servertype: Ascend910A3-20}
status:
  capacity: {cpu: "320", memory: 1536Gi, huawei.com/Ascend910: "16"}
  allocatable: {cpu: "319", memory: 1530Gi, huawei.com/Ascend910: "16"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // Atlas 800T A2 (910B) whose platform team set no accelerator-type: only the
    // plugin's servertype says it is no first-generation 910.
    (
        "ascend910b-servertype",
        r#"
metadata:
  name: ascend910b-servertype
  labels: {accelerator: huawei-Ascend910, servertype: Ascend910B-20}
status:
  capacity: {cpu: "192", memory: 1024Gi, huawei.com/Ascend910: "8"}
  allocatable: {cpu: "191", memory: 1020Gi, huawei.com/Ascend910: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // 910B3 with the chip-name label, whole NPUs only.
    (
        "ascend910b3-whole",
        r#"
metadata:
  name: ascend910b3-whole
  labels: {accelerator: huawei-Ascend910, accelerator-type: module-910b-8, node.kubernetes.io/npu.chip.name: 910B3, servertype: Ascend910B-20}
status:
  capacity: {cpu: "192", memory: 1024Gi, huawei.com/Ascend910: "8"}
  allocatable: {cpu: "191", memory: 1020Gi, huawei.com/Ascend910: "8"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // The same 910B3 server with static vNPUs (presetVirtualDevice): 4 chips cut into
    // 4-core templates, 4 whole; the plugin writes exactly the same labels.
    (
        "ascend910b3-vnpu",
        r#"
metadata:
  name: ascend910b3-vnpu
  labels: {accelerator: huawei-Ascend910, accelerator-type: module-910b-8, node.kubernetes.io/npu.chip.name: 910B3, servertype: Ascend910B-20}
status:
  capacity: {cpu: "192", memory: 1024Gi, huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "20"}
  allocatable: {cpu: "191", memory: 1020Gi, huawei.com/Ascend910: "4", huawei.com/Ascend910-4c: "20"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // trn1.32xlarge: 16 Trainium devices, 32 NeuronCores, both advertised; no view
    // label (device view).
    (
        "trn1-unlabelled",
        r#"
metadata:
  name: trn1-unlabelled
  labels: {node.kubernetes.io/instance-type: trn1.32xlarge}
spec:
  taints: [{key: aws.amazon.com/neuron, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "128", memory: 512Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  allocatable: {cpu: "127", memory: 500Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    (
        "trn1-device",
        r#"
metadata:
  name: trn1-device
  labels: {node.kubernetes.io/instance-type: trn1.32xlarge, kaccel.io/neuron.view: device}
spec:
  taints: [{key: aws.amazon.com/neuron, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "128", memory: 512Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  allocatable: {cpu: "127", memory: 500Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    (
        "trn1-core",
        r#"
metadata:
  name: trn1-core
  labels: {node.kubernetes.io/instance-type: trn1.32xlarge, kaccel.io/neuron.view: core}
spec:
  taints: [{key: aws.amazon.com/neuron, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "128", memory: 512Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  allocatable: {cpu: "127", memory: 500Gi, aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // Labelled core but advertising no cores (a plugin without the core resource):
    // offered in the device view, unpinned.
    (
        "trn1-core-without-cores",
        r#"
metadata:
  name: trn1-core-without-cores
  labels: {node.kubernetes.io/instance-type: trn1.2xlarge, kaccel.io/neuron.view: core}
status:
  capacity: {cpu: "8", memory: 32Gi, aws.amazon.com/neuron: "1"}
  allocatable: {cpu: "8", memory: 32Gi, aws.amazon.com/neuron: "1"}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
];

#[cfg(test)]
mod tests {

    use crate::inventory::tests::{group, pins};
    use crate::inventory::vendor_fleet_other::{fleet, node};
    use crate::inventory::{Inventory, Vendor, read_node};

    /// Ascend: the plugin's servertype names the card where no accelerator-type
    /// does, and pins it, so first-generation 910, 910B and A3 flavors select only
    /// their own nodes.
    #[test]
    fn ascend_servertype_tells_generations_apart() {
        let inv = Inventory::from_nodes(&fleet());
        let model = |name: &str| {
            group(&inv.nodes[name], "huawei.com/Ascend910")
                .variant
                .model
                .clone()
        };
        assert_eq!(model("ascend910-servertype"), "Ascend910");
        assert_eq!(model("ascend910a3"), "Ascend910A3");
        assert_eq!(model("ascend910b-servertype"), "Ascend910B");
        assert_eq!(model("ascend910b3-whole"), "Ascend910B3");
        let first = group(&inv.nodes["ascend910-servertype"], "huawei.com/Ascend910");
        assert_eq!(
            first.pin_labels,
            pins(&[
                ("accelerator", "huawei-Ascend910"),
                ("servertype", "Ascend910-32")
            ])
        );
        // Each generation's pins select no node of another generation. (The generic
        // 910B of a node without chip-name label also selects the 910B3 nodes, whose
        // servertype is the same: a model kaccel reads at two granularities, which
        // the planner's purity check refuses.)
        let generation = |m: &str| {
            if m.starts_with("Ascend910B") {
                "910B"
            } else if m.starts_with("Ascend910A3") {
                "A3"
            } else {
                "910"
            }
        };
        for (name, node) in &inv.nodes {
            for g in &node.groups {
                if g.variant.vendor != Vendor::Huawei {
                    continue;
                }
                for other in inv.nodes.values() {
                    if other.labels.carries_all(&g.pin_labels) {
                        assert!(
                            other
                                .groups
                                .iter()
                                .any(|o| generation(&o.variant.model)
                                    == generation(&g.variant.model)),
                            "{name}'s {} pins select {}",
                            g.variant.model,
                            other.name
                        );
                    }
                }
            }
        }
        // Without servertype (an older plugin, no accelerator-type): pinned by
        // `accelerator` alone, which the A3 node carries too (the planner refuses).
        let mut bare = node("ascend910-servertype");
        bare.metadata.labels.as_mut().unwrap().remove("servertype");
        let bare = read_node(&bare);
        let g = group(&bare, "huawei.com/Ascend910");
        assert_eq!(g.variant.model, "Ascend910");
        assert_eq!(g.pin_labels, pins(&[("accelerator", "huawei-Ascend910")]));
    }

    /// Neuron views: the view label is a pin only where it names the view offered.
    #[test]
    fn neuron_view_pins() {
        let inv = Inventory::from_nodes(&fleet());
        let only = |name: &str| {
            let n = &inv.nodes[name];
            assert_eq!(n.groups.len(), 1, "{name}: one view per node");
            &n.groups[0]
        };
        let unlabelled = only("trn1-unlabelled");
        assert_eq!(unlabelled.variant.resource_name, "aws.amazon.com/neuron");
        assert_eq!(
            unlabelled.pin_labels,
            pins(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")])
        );
        let device = only("trn1-device");
        assert_eq!(device.variant, unlabelled.variant);
        assert_eq!(
            device
                .pin_labels
                .get("kaccel.io/neuron.view")
                .map(String::as_str),
            Some("device")
        );
        let core = only("trn1-core");
        assert_eq!(core.variant.resource_name, "aws.amazon.com/neuroncore");
        assert_eq!(
            core.pin_labels
                .get("kaccel.io/neuron.view")
                .map(String::as_str),
            Some("core")
        );
        // Labelled core, no cores advertised: the device view, not pinned as core.
        let n = &inv.nodes["trn1-core-without-cores"];
        assert_eq!(n.groups[0].variant.resource_name, "aws.amazon.com/neuron");
        assert!(!n.groups[0].pin_labels.contains_key("kaccel.io/neuron.view"));
        assert!(
            n.warnings
                .iter()
                .any(|w| w.contains("kaccel.io/neuron.view=core"))
        );
    }
}
