//! DRA ResourceSlices: devices joining plugin groups, DRA-only groups, ignored slices, MIG.

use super::*;

const GPU_SLICE: &str = r#"
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gpu-h100-01-gpu.nvidia.com-abcde}
spec:
  driver: gpu.nvidia.com
  nodeName: gpu-h100-01
  pool: {name: gpu-h100-01, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0
      attributes:
        type: {string: gpu}
        uuid: {string: GPU-4a3f2c1e-0000-1111-2222-333344445555}
        productName: {string: NVIDIA H100 80GB HBM3}
        architecture: {string: Hopper}
        driverVersion: {version: 570.133.20}
        cudaComputeCapability: {version: 9.0.0}
        cudaDriverVersion: {version: 12.8.0}
        pcieBusID: {string: "0000:18:00.0"}
        index: {int: 0}
      capacity:
        memory: {value: 81559Mi}
    - name: gpu-1
      attributes:
        gpu.nvidia.com/uuid: {string: GPU-9b8c7d6e-0000-1111-2222-333344445555}
        gpu.nvidia.com/productName: {string: NVIDIA H100 80GB HBM3}
      capacity:
        memory: {value: 80Gi}
"#;

#[test]
fn dra_slice_attaches_uuids() {
    let nodes = [node(H100)];
    let slices = [slice(GPU_SLICE)];
    let inv = Inventory::from_nodes_and_slices(&nodes, &slices);
    let n = &inv.nodes["gpu-h100-01"];
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 1, "devices join the device-plugin group");
    let g = group(n, "nvidia.com/gpu");
    assert_eq!(
        (g.capacity, g.allocatable),
        (8, 8),
        "counts stay the plugin's"
    );
    assert_eq!(g.devices.len(), 2);
    assert_eq!(g.devices[0].name, "gpu-0");
    assert_eq!(
        g.devices[0].uuid.as_deref(),
        Some("GPU-4a3f2c1e-0000-1111-2222-333344445555")
    );
    assert_eq!(g.devices[0].pci_address.as_deref(), Some("0000:18:00.0"));
    assert_eq!(g.devices[0].memory_mib, Some(81559));
    assert_eq!(
        g.devices[0].raw_attributes.get("index").map(String::as_str),
        Some("0")
    );
    assert_eq!(
        g.devices[1].uuid.as_deref(),
        Some("GPU-9b8c7d6e-0000-1111-2222-333344445555")
    );
    assert_eq!(g.devices[1].memory_mib, Some(80 * 1024));

    // Merging the same slice twice doubles nothing.
    let inv2 = Inventory::from_nodes_and_slices(&nodes, [&slices[0], &slices[0]]);
    assert_eq!(inv2, inv);
}

#[test]
fn dra_only_groups_and_ignored_slices() {
    let nodes = [node(
        r#"
metadata:
  name: gpu-mi300x-dra
  labels: {kubernetes.io/hostname: gpu-mi300x-dra}
status:
  capacity: {cpu: "192"}
  allocatable: {cpu: "191"}
"#,
    )];
    let amd = slice(
        r#"
metadata: {name: amd-slice}
spec:
  driver: gpu.amd.com
  nodeName: gpu-mi300x-dra
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0
      attributes:
        productName: {string: AMD Instinct MI300X}
        family: {string: CDNA3}
        partitionProfile: {string: spx_nps1}
        pciAddr: {string: "0000:0c:00.0"}
        driverVersion: {version: 6.10.5}
      capacity: {memory: {value: 192Gi}}
    - name: gpu-1
      attributes:
        productName: {string: AMD Instinct MI300X}
        partitionProfile: {string: spx_nps1}
        pciAddr: {string: "0000:22:00.0"}
      capacity: {memory: {value: 192Gi}}
      taints: [{key: gpu.amd.com/unhealthy, effect: NoSchedule}]
    - name: gpu-2-partition-0
      attributes:
        productName: {string: AMD Instinct MI300X}
        partitionProfile: {string: cpx_nps4}
      capacity: {memory: {value: 24Gi}}
"#,
    );
    let other = slice(
        r#"
metadata: {name: nic}
spec:
  driver: sriov.example.com
  nodeName: gpu-mi300x-dra
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: vf-0}]
"#,
    );
    let elsewhere = slice(
        r#"
metadata: {name: unknown-node}
spec:
  driver: gpu.nvidia.com
  nodeName: not-in-inventory
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"#,
    );
    let network = slice(
        r#"
metadata: {name: all-nodes}
spec:
  driver: gpu.nvidia.com
  allNodes: true
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices: [{name: gpu-0}]
"#,
    );
    let inv = Inventory::from_nodes_and_slices(&nodes, [&amd, &other, &elsewhere, &network]);
    assert_eq!(inv.nodes.len(), 1);
    let n = &inv.nodes["gpu-mi300x-dra"];
    assert!(n.warnings.is_empty(), "{:?}", n.warnings);
    assert_eq!(n.groups.len(), 2, "{:#?}", n.groups);
    let whole = n
        .groups
        .iter()
        .find(|g| g.variant.sharing == SharingMode::Whole)
        .expect("whole DRA group");
    assert_eq!(whole.variant.resource_name, "gpu.amd.com");
    assert_eq!(whole.variant.model, "AMD-Instinct-MI300X");
    assert_eq!(
        (whole.capacity, whole.allocatable),
        (2, 1),
        "a tainted device is not allocatable"
    );
    assert_eq!(whole.memory_mib, Some(192 * 1024));
    assert_eq!(whole.architecture.as_deref(), Some("cdna3"));
    assert!(whole.pin_labels.is_empty());
    assert_eq!(
        whole.devices[1].pci_address.as_deref(),
        Some("0000:22:00.0")
    );
    let part = n
        .groups
        .iter()
        .find(|g| g.variant.sharing == SharingMode::Partition)
        .expect("partition DRA group");
    assert_eq!(part.variant.partition_profile.as_deref(), Some("cpx_nps4"));
    assert_eq!(part.capacity, 1);
}

#[test]
fn dra_mig_devices_join_mig_groups() {
    let nodes = [node(
        r#"
metadata:
  name: mig
  labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB, nvidia.com/mig.strategy: mixed}
status:
  capacity: {nvidia.com/mig-1g.10gb: "7"}
  allocatable: {nvidia.com/mig-1g.10gb: "7"}
"#,
    )];
    let s = slice(
        r#"
metadata: {name: mig-slice}
spec:
  driver: gpu.nvidia.com
  nodeName: mig
  pool: {name: p, generation: 1, resourceSliceCount: 1}
  devices:
    - name: gpu-0-mig-1g10gb-0
      attributes:
        type: {string: mig}
        profile: {string: 1g.10gb}
        uuid: {string: MIG-aaaa}
        productName: {string: NVIDIA A100-SXM4-80GB}
"#,
    );
    let inv = Inventory::from_nodes_and_slices(&nodes, [&s]);
    let n = &inv.nodes["mig"];
    assert_eq!(n.groups.len(), 1);
    assert_eq!(n.groups[0].devices[0].uuid.as_deref(), Some("MIG-aaaa"));
    assert_eq!(n.groups[0].capacity, 7);
}

/// Devices of a group that publish the same shapes share them (the planner reads
/// each shape once); a device that differs keeps its own, with its own values.
#[test]
fn devices_of_a_group_share_equal_shapes_and_keep_their_own_values() {
    let nodes = [node(H100)];
    let mut third = String::from(GPU_SLICE);
    third.push_str(
        r#"    - name: gpu-2
      attributes:
        gpu.nvidia.com/uuid: {string: GPU-1b8c7d6e-0000-1111-2222-333344445555}
        gpu.nvidia.com/productName: {string: NVIDIA H100 80GB HBM3}
      capacity:
        memory: {value: 80Gi}
    - name: gpu-3
      attributes:
        type: {string: gpu}
        productName: {string: NVIDIA H100 80GB HBM3}
"#,
    );
    let inv = Inventory::from_nodes_and_slices(&nodes, &[slice(&third)]);
    let devices = &inv.nodes["gpu-h100-01"].groups[0].devices;
    assert_eq!(devices.len(), 4);
    let values = |i: usize| -> Vec<Option<&str>> {
        devices[i]
            .selector_values
            .iter()
            .map(|v| v.as_deref())
            .collect()
    };
    // NVIDIA's pins: type, productName, profile; bare or qualified alike.
    assert_eq!(
        values(0),
        [Some("gpu"), Some("NVIDIA H100 80GB HBM3"), None]
    );
    assert_eq!(values(1), [None, Some("NVIDIA H100 80GB HBM3"), None]);
    assert_eq!(
        values(3),
        [Some("gpu"), Some("NVIDIA H100 80GB HBM3"), None]
    );
    use std::sync::Arc;
    // gpu-1 and gpu-2 publish the same: one allocation; gpu-0 and gpu-1 differ.
    assert!(Arc::ptr_eq(
        &devices[1].selector_values,
        &devices[2].selector_values
    ));
    assert!(Arc::ptr_eq(
        &devices[1].attribute_kinds,
        &devices[2].attribute_kinds
    ));
    assert!(!Arc::ptr_eq(
        &devices[0].selector_values,
        &devices[1].selector_values
    ));
    assert!(!Arc::ptr_eq(
        &devices[0].attribute_kinds,
        &devices[1].attribute_kinds
    ));
    assert_eq!(devices[2].attribute_kinds.len(), 2);
}
