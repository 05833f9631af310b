//! Google: GKE's TPU labels and google.com/tpu.

use super::*;

#[test]
fn google_tpu() {
    let n = read_node(&node(
        r#"
metadata:
  name: tpu-v5e-01
  labels:
    cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice
    cloud.google.com/gke-tpu-topology: 2x4
    cloud.google.com/gke-nodepool: tpu-pool
spec:
  taints: [{key: google.com/tpu, value: present, effect: NoSchedule}]
status:
  capacity: {google.com/tpu: "8"}
  allocatable: {google.com/tpu: "8"}
"#,
    ));
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    let g = group(&n, "google.com/tpu");
    assert_eq!(g.variant.vendor, Vendor::Google);
    assert_eq!(g.variant.model, "tpu-v5-lite-podslice");
    assert_eq!(g.memory_mib, Some(16 * 1024));
    assert_eq!(g.architecture.as_deref(), Some("v5e"));
    assert_eq!(
        g.pin_labels,
        pins(&[
            (
                "cloud.google.com/gke-tpu-accelerator",
                "tpu-v5-lite-podslice"
            ),
            ("cloud.google.com/gke-tpu-topology", "2x4")
        ])
    );
    assert_eq!(g.raw_labels.len(), 2, "node pool name is not a TPU label");
}
