//! AWS: Neuron devices and cores, one view offered per node.

use super::*;

#[test]
fn aws_neuron_devices_and_cores() {
    let n = read_node(&node(
        r#"
metadata:
  name: trn1-01
  labels: {node.kubernetes.io/instance-type: trn1.32xlarge}
spec:
  taints: [{key: aws.amazon.com/neuron, value: present, effect: NoSchedule}]
status:
  capacity: {aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}
  allocatable: {aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "30"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let dev = group(&n, "aws.amazon.com/neuron");
    assert_eq!(dev.variant.vendor, Vendor::Aws);
    assert_eq!(dev.variant.model, "Trainium");
    assert_eq!(dev.variant.sharing, SharingMode::Whole);
    assert_eq!(dev.memory_mib, Some(32 * 1024));
    assert_eq!(
        dev.pin_labels,
        pins(&[("node.kubernetes.io/instance-type", "trn1.32xlarge")])
    );
    assert_eq!(
        dev.vendor_taint_keys,
        vec!["aws.amazon.com/neuron".to_string()]
    );
    assert_eq!(
        dev.raw_labels
            .get("node.kubernetes.io/instance-type")
            .map(String::as_str),
        Some("trn1.32xlarge")
    );
    // The cores are the same chips: one view per node, the device view by default.
    assert_eq!(n.groups.len(), 1, "{:#?}", n.groups);
    assert!(n.unclassified.is_empty(), "{:?}", n.unclassified);
}

/// The Neuron device plugin advertises `aws.amazon.com/neuron` and
/// `aws.amazon.com/neuroncore` on one node (aws-neuron/neuron-device-plugin README;
/// AWS Neuron docs "Kubernetes environment setup", checked against device plugin
/// 2.x docs). They are two views of the same chips: kaccel offers one per node, so
/// what is offered never exceeds the silicon. `kaccel.io/neuron.view=core` picks the
/// cores and pins the flavor to nodes so labelled.
#[test]
fn aws_neuron_one_view_per_node() {
    let read = |view: Option<&str>| {
        let label = view
            .map(|v| format!(", kaccel.io/neuron.view: {v}"))
            .unwrap_or_default();
        read_node(&node(&format!(
            r#"
metadata:
  name: trn1-01
  labels: {{node.kubernetes.io/instance-type: trn1.32xlarge{label}}}
status:
  capacity: {{aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "32"}}
  allocatable: {{aws.amazon.com/neuron: "16", aws.amazon.com/neuroncore: "30"}}
"#
        )))
    };
    // Chips offered, counted in device units (2 cores a Trainium chip).
    let chips = |n: &NodeInventory| -> u32 {
        n.groups
            .iter()
            .map(|g| match g.variant.sharing {
                SharingMode::Partition => g.capacity / 2,
                _ => g.capacity,
            })
            .sum()
    };
    let default = read(None);
    assert_eq!(chips(&default), 16, "{:#?}", default.groups);
    assert_eq!(
        default.groups[0].variant.resource_name,
        "aws.amazon.com/neuron"
    );

    let cores = read(Some("core"));
    assert_eq!(chips(&cores), 16, "{:#?}", cores.groups);
    let core = group(&cores, "aws.amazon.com/neuroncore");
    assert_eq!(core.variant.sharing, SharingMode::Partition);
    assert_eq!(
        core.variant.partition_profile.as_deref(),
        Some("neuroncore")
    );
    assert_eq!((core.capacity, core.allocatable), (32, 30));
    assert_eq!(core.memory_mib, Some(16 * 1024));
    assert_eq!(
        core.pin_labels,
        pins(&[
            ("kaccel.io/neuron.view", "core"),
            ("node.kubernetes.io/instance-type", "trn1.32xlarge")
        ])
    );
    assert!(cores.unclassified.is_empty());

    let bad = read(Some("both"));
    assert_eq!(chips(&bad), 16);
    assert!(
        bad.warnings
            .iter()
            .any(|w| w.contains("kaccel.io/neuron.view"))
    );
}
