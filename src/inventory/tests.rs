//! Adapter tests on realistic Node objects (as the vendors' stacks label them), one
//! file per vendor, plus DRA slices, the example fleet and property tests; here the
//! helpers they share (`node`, `slice`, `group`, `pins`, the `H100` node).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::*;

mod amd;
mod aws;
mod cross_vendor;
mod dra;
mod example_fleet;
mod google;
mod huawei;
mod intel;
mod nvidia;
mod properties;

pub(super) fn node(yaml: &str) -> Node {
    serde_yaml::from_str(yaml).expect("test node YAML")
}

fn slice(yaml: &str) -> ResourceSlice {
    serde_yaml::from_str(yaml).expect("test slice YAML")
}

pub(super) fn group<'a>(n: &'a NodeInventory, resource: &str) -> &'a DeviceGroup {
    n.groups
        .iter()
        .find(|g| g.variant.resource_name == resource)
        .unwrap_or_else(|| panic!("no group for {resource} in {:#?}", n.groups))
}

pub(super) fn pins(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

const H100: &str = r#"
metadata:
  name: gpu-h100-01
  labels:
    topology.kubernetes.io/zone: zone-a
    topology.kubernetes.io/region: region-1
    topology.kaccel.io/rack: rack-7
    nvidia.com/gpu.present: "true"
    nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
    nvidia.com/gpu.family: hopper
    nvidia.com/gpu.memory: "81559"
    nvidia.com/gpu.count: "8"
    nvidia.com/gpu.compute.major: "9"
    nvidia.com/gpu.compute.minor: "0"
    nvidia.com/cuda.driver-version.full: "570.133.20"
    nvidia.com/cuda.runtime-version.full: "12.8"
    nvidia.com/mig.strategy: none
    kubernetes.io/hostname: gpu-h100-01
spec:
  taints:
    - {key: nvidia.com/gpu, value: present, effect: NoSchedule}
status:
  capacity: {cpu: "192", memory: 2063937476Ki, pods: "110", nvidia.com/gpu: "8"}
  allocatable: {cpu: 191500m, memory: 2061840324Ki, pods: "110", nvidia.com/gpu: "8"}
  conditions:
    - {type: Ready, status: "True", reason: KubeletReady}
    - {type: GpuThermalWatch, status: "False", reason: NoThermalIssue}
"#;
