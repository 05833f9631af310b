//! Intel Gaudi, Intel GPU and Google TPU nodes whose accelerators only DRA drivers
//! publish, with their ResourceSlices, written from what the drivers publish (not
//! from kaccel's output). One part of the fleet `vendor_fleet_other` assembles; each
//! entry's comment names its source.
//!
//! Sources:
//! - Intel Gaudi DRA: intel/intel-resource-drivers-for-kubernetes gaudi-v0.7.2
//!   (5630ca62), `cmd/kubelet-gaudi-plugin/node_state.go` `GetResources` (device name
//!   = UID `<pci address, : and . as ->-<pci device id>`, attributes `model`,
//!   `resource.kubernetes.io/pcieRoot`, `serial`, `healthy`, `pciRoot` = bus part of
//!   the root; no capacity; one pool per node named after it),
//!   `pkg/gaudi/device/device.go` (`ModelNames`: 0x1020 `Gaudi2`, 0x1060 `Gaudi3`,
//!   anything else `Unknown`).
//! - Intel GPU DRA: same repository, gpu-v0.11.0 (a696341b),
//!   `cmd/kubelet-gpu-plugin/node_state.go` `GetResources` (attributes `model`,
//!   `family`, `driver`, `sriov`, `type`, `pciId`, `pciAddress`, `health`, standard
//!   `pcieRoot`/`pciBusID`; capacity `memory` in Mi, `millicores` 1k; an Unhealthy
//!   device gets a `HealthIssues-<categories>` NoExecute taint),
//!   `pkg/gpu/device/models.go` (0x0bd5 `Max 1550`, family `Data Center Max`), the
//!   slice printed in `doc/gpu/USAGE.md`.
//! - Google TPU DRA: kubernetes-sigs/dra-driver-google-tpu v0.2.0 (b80d78e0),
//!   `cmd/tpu-dra-kubeletplugin/manager.go` `GetDevice` (attributes `index`, `uuid`
//!   (one per node), `tpuGen`, `brand`, `accelerator`, `chipCount`, `topology`; device
//!   names `accel<N>`), `util.go` (`AcceleratorGen`: `tpu-v6e-slice` -> `v6e`; GKE
//!   labels `cloud.google.com/gke-tpu-accelerator`, `-topology`), the ai-on-gke TPU DRA
//!   tutorial (node label `cloud.google.com/gke-tpu-dra-driver=true` turns GKE's TPU
//!   device plugin off, so the node advertises no `google.com/tpu`).
//!
//! Serial numbers, UUIDs and PCI addresses are made up in the vendors' formats.

/// (node name, YAML) for the DRA-only nodes of the fleet.
pub(crate) const NODES: &[(&str, &str)] = &[
    // Gaudi2 server whose devices only the Gaudi DRA driver publishes (no
    // habana.ai/gaudi device plugin, no feature discovery).
    (
        "gaudi2-dra",
        r#"
metadata:
  name: gaudi2-dra
  labels: {kubernetes.io/hostname: gaudi2-dra}
status:
  capacity: {cpu: "160", memory: 1Ti}
  allocatable: {cpu: "159", memory: 1000Gi}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // Gaudi3 server, DRA only, labelled by the platform team with kaccel's model label.
    (
        "gaudi3-dra",
        r#"
metadata:
  name: gaudi3-dra
  labels: {kubernetes.io/hostname: gaudi3-dra, kaccel.io/accelerator.model: Gaudi3}
status:
  capacity: {cpu: "160", memory: 1Ti}
  allocatable: {cpu: "159", memory: 1000Gi}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // Data Center GPU Max 1550 server, DRA only; Intel's NFD rules still label the
    // product.
    (
        "max1550-dra",
        r#"
metadata:
  name: max1550-dra
  labels: {kubernetes.io/hostname: max1550-dra, gpu.intel.com/product: Max_1550, gpu.intel.com/family: Max_Series}
status:
  capacity: {cpu: "224", memory: 1Ti}
  allocatable: {cpu: "223", memory: 1000Gi}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
    // GKE ct6e-standard-4t TPU v6e node with the TPU DRA driver (device plugin off).
    (
        "tpu-v6e-dra",
        r#"
metadata:
  name: tpu-v6e-dra
  labels:
    cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice
    cloud.google.com/gke-tpu-topology: 2x2
    cloud.google.com/gke-accelerator-count: "4"
    cloud.google.com/gke-tpu-dra-driver: "true"
    node.kubernetes.io/instance-type: ct6e-standard-4t
spec:
  taints: [{key: google.com/tpu, value: present, effect: NoSchedule}]
status:
  capacity: {cpu: "180", memory: 720Gi}
  allocatable: {cpu: "179", memory: 700Gi}
  conditions: [{type: Ready, status: "True"}]
"#,
    ),
];

/// (node name, YAML) of the ResourceSlices the DRA drivers publish for the fleet.
pub(crate) const SLICES: &[(&str, &str)] = &[
    // Gaudi DRA GetResources: 8 Gaudi2 (PCI ID 0x1020), one reported unhealthy by HLML
    // (healthy false), one whose PCI device ID the driver does not know (Unknown).
    (
        "gaudi2-dra",
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gaudi2-dra-gaudi.intel.com-x7k2p}
spec:
  driver: gaudi.intel.com
  nodeName: gaudi2-dra
  pool: {name: gaudi2-dra, generation: 0, resourceSliceCount: 1}
  devices:
    - name: 0000-19-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:17"}
        serial: {string: AN00000001}
        healthy: {bool: true}
        pciRoot: {string: "17"}
    - name: 0000-1a-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:17"}
        serial: {string: AN00000002}
        healthy: {bool: true}
        pciRoot: {string: "17"}
    - name: 0000-2a-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:28"}
        serial: {string: AN00000003}
        healthy: {bool: true}
        pciRoot: {string: "28"}
    - name: 0000-2b-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:28"}
        serial: {string: AN00000004}
        healthy: {bool: false}
        pciRoot: {string: "28"}
    - name: 0000-9a-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:98"}
        serial: {string: AN00000005}
        healthy: {bool: true}
        pciRoot: {string: "98"}
    - name: 0000-9b-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:98"}
        serial: {string: AN00000006}
        healthy: {bool: true}
        pciRoot: {string: "98"}
    - name: 0000-ca-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:c8"}
        serial: {string: AN00000007}
        healthy: {bool: true}
        pciRoot: {string: "c8"}
    - name: 0000-cb-00-0-0x1099
      attributes:
        model: {string: Unknown}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:c8"}
        serial: {string: AN00000008}
        healthy: {bool: true}
        pciRoot: {string: "c8"}
"#,
    ),
    // Gaudi3 (PCI ID 0x1060), two devices shown.
    (
        "gaudi3-dra",
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gaudi3-dra-gaudi.intel.com-q9d4m}
spec:
  driver: gaudi.intel.com
  nodeName: gaudi3-dra
  pool: {name: gaudi3-dra, generation: 0, resourceSliceCount: 1}
  devices:
    - name: 0000-19-00-0-0x1060
      attributes:
        model: {string: Gaudi3}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:17"}
        serial: {string: HL00000001}
        healthy: {bool: true}
        pciRoot: {string: "17"}
    - name: 0000-1a-00-0-0x1060
      attributes:
        model: {string: Gaudi3}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:17"}
        serial: {string: HL00000002}
        healthy: {bool: true}
        pciRoot: {string: "17"}
"#,
    ),
    // GPU DRA GetResources: two Max 1550 (0x0bd5), one Unhealthy with its
    // HealthIssues taint, one whose memory xpumd has not reported yet ("0"), and an
    // SR-IOV virtual function (type vf).
    (
        "max1550-dra",
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: max1550-dra-gpu.intel.com-b2v8n}
spec:
  driver: gpu.intel.com
  nodeName: max1550-dra
  pool: {name: max1550-dra, generation: 0, resourceSliceCount: 1}
  devices:
    - name: 0000-29-00-0-0x0bd5
      attributes:
        driver: {string: i915}
        family: {string: Data Center Max}
        health: {string: Healthy}
        model: {string: Max 1550}
        pciAddress: {string: "0000:29:00.0"}
        pciId: {string: "0x0bd5"}
        pciRoot: {string: "00"}
        resource.kubernetes.io/pciBusID: {string: "0000:29:00.0"}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:00"}
        sriov: {bool: true}
        type: {string: gpu}
      capacity:
        memory: {value: 131072Mi}
        millicores: {value: 1k}
    - name: 0000-3a-00-0-0x0bd5
      attributes:
        driver: {string: i915}
        family: {string: Data Center Max}
        health: {string: Unhealthy}
        model: {string: Max 1550}
        pciAddress: {string: "0000:3a:00.0"}
        pciId: {string: "0x0bd5"}
        pciRoot: {string: "00"}
        resource.kubernetes.io/pciBusID: {string: "0000:3a:00.0"}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:00"}
        sriov: {bool: true}
        type: {string: gpu}
      capacity:
        memory: {value: 131072Mi}
        millicores: {value: 1k}
      taints: [{key: HealthIssues-memorytemperature, effect: NoExecute}]
    - name: 0000-9a-00-0-0x0bd5
      attributes:
        driver: {string: xe}
        family: {string: Data Center Max}
        health: {string: Unknown}
        model: {string: Max 1550}
        pciAddress: {string: "0000:9a:00.0"}
        pciId: {string: "0x0bd5"}
        pciRoot: {string: "80"}
        resource.kubernetes.io/pciBusID: {string: "0000:9a:00.0"}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:80"}
        sriov: {bool: false}
        type: {string: gpu}
      capacity:
        memory: {value: "0"}
        millicores: {value: 1k}
    - name: 0000-29-00-1-0x0bd5
      attributes:
        driver: {string: i915}
        family: {string: Data Center Max}
        health: {string: Healthy}
        model: {string: Max 1550}
        pciAddress: {string: "0000:29:00.1"}
        pciId: {string: "0x0bd5"}
        pciRoot: {string: "00"}
        resource.kubernetes.io/pciBusID: {string: "0000:29:00.1"}
        resource.kubernetes.io/pcieRoot: {string: "pci0000:00"}
        sriov: {bool: false}
        type: {string: vf}
      capacity:
        memory: {value: 22528Mi}
        millicores: {value: "500"}
"#,
    ),
    // TPU DRA GetDevice for a 4-chip v6e VM (2x2): one uuid for the node.
    (
        "tpu-v6e-dra",
        r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: tpu-v6e-dra-tpu.google.com-5wq2r}
spec:
  driver: tpu.google.com
  nodeName: tpu-v6e-dra
  pool: {name: tpu-v6e-dra, generation: 1, resourceSliceCount: 1}
  devices:
    - name: accel0
      attributes:
        index: {int: 0}
        uuid: {string: tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9}
        tpuGen: {string: v6e}
        brand: {string: Google}
        accelerator: {string: tpu-v6e-slice}
        chipCount: {int: 4}
        topology: {string: 2x2}
    - name: accel1
      attributes:
        index: {int: 1}
        uuid: {string: tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9}
        tpuGen: {string: v6e}
        brand: {string: Google}
        accelerator: {string: tpu-v6e-slice}
        chipCount: {int: 4}
        topology: {string: 2x2}
    - name: accel2
      attributes:
        index: {int: 2}
        uuid: {string: tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9}
        tpuGen: {string: v6e}
        brand: {string: Google}
        accelerator: {string: tpu-v6e-slice}
        chipCount: {int: 4}
        topology: {string: 2x2}
    - name: accel3
      attributes:
        index: {int: 3}
        uuid: {string: tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9}
        tpuGen: {string: v6e}
        brand: {string: Google}
        accelerator: {string: tpu-v6e-slice}
        chipCount: {int: 4}
        topology: {string: 2x2}
"#,
    ),
];

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::resource::v1::ResourceSlice;

    use crate::inventory::tests::{group, pins};
    use crate::inventory::vendor_fleet_other::{node, slices_of};
    use crate::inventory::{Inventory, SharingMode, Vendor};

    fn with_slices(names: &[&str]) -> Inventory {
        let nodes: Vec<Node> = names.iter().map(|n| node(n)).collect();
        let slices: Vec<ResourceSlice> = names.iter().flat_map(|n| slices_of(n)).collect();
        Inventory::from_nodes_and_slices(&nodes, &slices)
    }

    /// Two nodes publishing devices of one shape: the shapes are one allocation
    /// each, fleet-wide, so the planner reads each once however many nodes carry it;
    /// and the driver's name is its constant, not a copy per device.
    #[test]
    fn devices_of_one_shape_share_it_across_the_fleet() {
        let name = "gaudi2-dra";
        let twin_name = "gaudi2-dra-twin";
        let mut twin = node(name);
        twin.metadata.name = Some(twin_name.into());
        let mut slices = slices_of(name);
        let twins: Vec<ResourceSlice> = slices
            .iter()
            .cloned()
            .map(|mut s| {
                s.metadata.name = s.metadata.name.map(|n| format!("{n}-twin"));
                s.spec.node_name = Some(twin_name.into());
                s.spec.pool.name = format!("{}-twin", s.spec.pool.name);
                s
            })
            .collect();
        slices.extend(twins);
        let inv = Inventory::from_nodes_and_slices(&[node(name), twin], &slices);
        let first_device = |n: &str| {
            inv.nodes[n]
                .groups
                .iter()
                .find_map(|g| g.devices.first())
                .cloned()
                .expect("a DRA device")
        };
        let (a, b) = (first_device(name), first_device(twin_name));
        assert_ne!(a.pool, b.pool);
        assert!(std::sync::Arc::ptr_eq(
            &a.attribute_kinds,
            &b.attribute_kinds
        ));
        assert!(std::sync::Arc::ptr_eq(
            &a.selector_values,
            &b.selector_values
        ));
        for device in [&a, &b] {
            assert_eq!(device.driver, "gaudi.intel.com");
            assert!(
                matches!(device.driver, std::borrow::Cow::Borrowed(_)),
                "{:?} is a copy",
                device.driver
            );
        }
    }

    /// Gaudi DRA (gaudi-v0.7.2 `GetResources`): one group of the healthy and
    /// unhealthy Gaudi2, counted from the slice, the unhealthy one (healthy false)
    /// not allocatable; the `Unknown` model listed as unclassified, never a Gaudi2.
    #[test]
    fn gaudi_dra_devices_form_a_group_and_unknown_is_unclassified() {
        let inv = with_slices(&["gaudi2-dra"]);
        let n = &inv.nodes["gaudi2-dra"];
        assert_eq!(n.groups.len(), 1, "{:#?}", n.groups);
        let g = group(n, "gaudi.intel.com");
        assert_eq!(g.variant.vendor, Vendor::Intel);
        assert_eq!(g.variant.model, "Gaudi2");
        assert_eq!(g.variant.sharing, SharingMode::Whole);
        assert_eq!((g.capacity, g.allocatable), (7, 6));
        assert_eq!(g.memory_mib, Some(96 * 1024));
        assert_eq!(g.architecture.as_deref(), Some("gaudi2"));
        assert!(g.pin_labels.is_empty(), "no label names the model here");
        let bad = g
            .devices
            .iter()
            .find(|d| d.name == "0000-2b-00-0-0x1020")
            .unwrap();
        assert!(bad.tainted, "healthy: false is out of service");
        assert_eq!(bad.serial.as_deref(), Some("AN00000004"));
        assert_eq!(
            bad.raw_attributes.get("pciRoot").map(String::as_str),
            Some("28")
        );
        assert_eq!(n.unclassified.len(), 1, "{:?}", n.unclassified);
        let u = &n.unclassified[0];
        assert_eq!((u.source.as_str(), u.count), ("gaudi.intel.com (DRA)", 1));
        assert!(u.reason.contains("Unknown"), "{}", u.reason);
        assert!(n.has_accelerators());
        assert!(
            n.warnings
                .iter()
                .any(|w| w.starts_with("unclassified accelerator gaudi.intel.com (DRA)")),
            "{:?}",
            n.warnings
        );

        // The platform team's model label pins the flavor.
        let inv = with_slices(&["gaudi3-dra"]);
        let g = group(&inv.nodes["gaudi3-dra"], "gaudi.intel.com");
        assert_eq!(g.variant.model, "Gaudi3");
        assert_eq!(g.memory_mib, Some(128 * 1024));
        assert_eq!(
            g.pin_labels,
            pins(&[("kaccel.io/accelerator.model", "Gaudi3")])
        );
    }

    /// Intel GPU DRA (gpu-v0.11.0 `GetResources`): whole Max 1550 GPUs, spelled as
    /// Intel's product label spells them and pinned by it; an Unhealthy GPU is out of
    /// service; memory 0 (xpumd not reporting yet) is unknown, not zero; the SR-IOV
    /// VF is unclassified.
    #[test]
    fn intel_gpu_dra_devices() {
        let inv = with_slices(&["max1550-dra"]);
        let n = &inv.nodes["max1550-dra"];
        assert!(
            n.warnings.iter().all(|w| !w.contains("memory")),
            "{:?}",
            n.warnings
        );
        let g = group(n, "gpu.intel.com");
        assert_eq!(g.variant.model, "Max_1550");
        assert_eq!((g.capacity, g.allocatable), (3, 2));
        assert_eq!(g.memory_mib, Some(131072));
        assert_eq!(g.architecture.as_deref(), Some("xe-hpc"));
        assert_eq!(g.pin_labels, pins(&[("gpu.intel.com/product", "Max_1550")]));
        let unreported = g
            .devices
            .iter()
            .find(|d| d.name == "0000-9a-00-0-0x0bd5")
            .unwrap();
        assert_eq!(unreported.memory_mib, None);
        assert!(!unreported.tainted, "health Unknown is not unhealthy");
        assert_eq!(unreported.pci_address.as_deref(), Some("0000:9a:00.0"));
        assert_eq!(n.unclassified.len(), 1, "{:?}", n.unclassified);
        assert_eq!(n.unclassified[0].count, 1);
        assert!(n.unclassified[0].reason.contains("virtual function"));
    }

    /// TPU DRA (dra-driver-google-tpu v0.2.0 `GetDevice`): 4 chips of a v6e 2x2 VM,
    /// pinned by GKE's accelerator and topology labels, tolerating GKE's TPU taint;
    /// the per-node `uuid` is no device identity. Without the slice the node is
    /// unclassified (GKE's TPU labels, no device plugin); with it, it is not.
    #[test]
    fn tpu_dra_devices() {
        let bare = Inventory::from_nodes(&[node("tpu-v6e-dra")]);
        assert_eq!(bare.nodes["tpu-v6e-dra"].unclassified[0].count, 0);
        let inv = with_slices(&["tpu-v6e-dra"]);
        let n = &inv.nodes["tpu-v6e-dra"];
        assert!(n.unclassified.is_empty(), "{:?}", n.unclassified);
        assert!(
            n.warnings.iter().all(|w| !w.starts_with("unclassified")),
            "{:?}",
            n.warnings
        );
        let g = group(n, "tpu.google.com");
        assert_eq!(g.variant.vendor, Vendor::Google);
        assert_eq!(g.variant.model, "tpu-v6e-slice");
        assert_eq!((g.capacity, g.allocatable), (4, 4));
        assert_eq!(g.memory_mib, Some(32 * 1024));
        assert_eq!(g.architecture.as_deref(), Some("v6e"));
        assert_eq!(
            g.pin_labels,
            pins(&[
                ("cloud.google.com/gke-tpu-accelerator", "tpu-v6e-slice"),
                ("cloud.google.com/gke-tpu-topology", "2x2"),
            ])
        );
        assert_eq!(g.vendor_taint_keys, ["google.com/tpu"]);
        assert!(g.devices.iter().all(|d| d.uuid.is_none()));
    }

    /// A pool's older generation is ignored while the driver replaces its slices, and
    /// a device published twice counts once.
    #[test]
    fn only_the_newest_generation_of_a_pool_counts() {
        let nodes = [node("tpu-v6e-dra")];
        let current = slices_of("tpu-v6e-dra").remove(0);
        let mut old = current.clone();
        old.metadata.name = Some("tpu-v6e-dra-old".into());
        old.spec.pool.generation = 0;
        for (i, d) in old.spec.devices.as_mut().unwrap().iter_mut().enumerate() {
            d.name = format!("stale{i}");
        }
        let inv = Inventory::from_nodes_and_slices(&nodes, [&old, &current, &current]);
        let g = group(&inv.nodes["tpu-v6e-dra"], "tpu.google.com");
        assert_eq!(g.capacity, 4);
        assert!(g.devices.iter().all(|d| d.name.starts_with("accel")));
    }

    /// Huawei's Ascend DRA driver is not read: its devices are unclassified, so the
    /// node is no CPU-only node.
    #[test]
    fn ascend_dra_devices_are_unclassified() {
        let nodes = [node("gaudi2-dra")];
        let slice: ResourceSlice = serde_yaml::from_str(
            r#"
metadata: {name: npu}
spec:
  driver: npu.huawei.com
  nodeName: gaudi2-dra
  pool: {name: gaudi2-dra, generation: 1, resourceSliceCount: 1}
  devices: [{name: npu-0}, {name: npu-1}]
"#,
        )
        .unwrap();
        let inv = Inventory::from_nodes_and_slices(&nodes, [&slice]);
        let n = &inv.nodes["gaudi2-dra"];
        assert_eq!(n.unclassified[0].source, "npu.huawei.com (DRA)");
        assert_eq!(n.unclassified[0].count, 2);
        assert!(n.has_accelerators());
    }

    /// Gaudi devices never join an Intel GPU group (same vendor, other family), and
    /// join the device plugin's Gaudi group of the same model without changing its
    /// counts.
    #[test]
    fn dra_devices_join_only_their_own_family() {
        let gpu_node: Node = serde_yaml::from_str(
            r#"
metadata:
  name: gaudi2-dra
  labels: {gpu.intel.com/product: Max_1550}
status:
  capacity: {gpu.intel.com/i915: "2"}
  allocatable: {gpu.intel.com/i915: "2"}
"#,
        )
        .unwrap();
        let inv = Inventory::from_nodes_and_slices(&[gpu_node], &slices_of("gaudi2-dra"));
        let n = &inv.nodes["gaudi2-dra"];
        assert!(group(n, "gpu.intel.com/i915").devices.is_empty());
        assert_eq!(group(n, "gaudi.intel.com").capacity, 7);

        let plugin_node: Node = serde_yaml::from_str(
            r#"
metadata:
  name: gaudi2-dra
  labels: {habana.ai/device.type: GAUDI2}
status:
  capacity: {habana.ai/gaudi: "8"}
  allocatable: {habana.ai/gaudi: "8"}
"#,
        )
        .unwrap();
        let inv = Inventory::from_nodes_and_slices(&[plugin_node], &slices_of("gaudi2-dra"));
        let n = &inv.nodes["gaudi2-dra"];
        assert_eq!(n.groups.len(), 1, "{:#?}", n.groups);
        let g = group(n, "habana.ai/gaudi");
        assert_eq!((g.capacity, g.allocatable), (8, 8), "the plugin's counts");
        // All 8 are the plugin's devices; the records only add detail.
        assert_eq!(g.devices.len(), 8);
        assert!(n.unclassified.is_empty());
    }
}
