//! A fleet written from what the Huawei, AWS, Intel and Google stacks publish (not
//! from kaccel's output), as one: the Ascend and Neuron nodes of
//! `vendor_fleet_ascend_neuron`, then the DRA-only nodes and their ResourceSlices of
//! `vendor_fleet_intel_tpu_dra`, where each entry's comment names its source. Tests
//! read the fleet through the functions here.

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;

use super::vendor_fleet_ascend_neuron as ascend_neuron;
use super::vendor_fleet_intel_tpu_dra as dra;

/// (node name, YAML) for every node of the fleet: the Ascend and Neuron nodes, then
/// the DRA-only ones.
pub(crate) const NODES: &[(&str, &str)] =
    &concat::<{ ascend_neuron::NODES.len() + dra::NODES.len() }>(ascend_neuron::NODES, dra::NODES);

/// (node name, YAML) of the ResourceSlices the DRA drivers publish for the fleet.
pub(crate) const SLICES: &[(&str, &str)] = dra::SLICES;

/// `a` then `b`, as one array (`N` is their total length).
const fn concat<const N: usize>(
    a: &[(&'static str, &'static str)],
    b: &[(&'static str, &'static str)],
) -> [(&'static str, &'static str); N] {
    assert!(a.len() + b.len() == N);
    let mut out = [("", ""); N];
    let mut i = 0;
    while i < a.len() {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - a.len()];
        i += 1;
    }
    out
}

pub(crate) fn node(name: &str) -> Node {
    let (_, yaml) = NODES
        .iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no fixture node {name}"));
    serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("fixture node {name}: {e}"))
}

pub(crate) fn fleet() -> Vec<Node> {
    NODES.iter().map(|(name, _)| node(name)).collect()
}

/// The slices published for `node`, if any.
pub(crate) fn slices_of(node: &str) -> Vec<ResourceSlice> {
    SLICES
        .iter()
        .filter(|(n, _)| *n == node)
        .map(|(n, yaml)| serde_yaml::from_str(yaml).unwrap_or_else(|e| panic!("slice of {n}: {e}")))
        .collect()
}

/// A copy of a fixture node (and its slices) under another name, as the property
/// tests build bigger fleets.
pub(crate) fn renamed(name: &str, new_name: &str) -> (Node, Vec<ResourceSlice>) {
    let mut n = node(name);
    n.metadata.name = Some(new_name.to_string());
    if let Some(labels) = n.metadata.labels.as_mut()
        && labels.contains_key("kubernetes.io/hostname")
    {
        labels.insert("kubernetes.io/hostname".into(), new_name.to_string());
    }
    let slices = slices_of(name)
        .into_iter()
        .map(|mut s| {
            s.metadata.name = s.metadata.name.map(|m| m.replacen(name, new_name, 1));
            s.spec.node_name = Some(new_name.to_string());
            s.spec.pool.name = new_name.to_string();
            s
        })
        .collect();
    (n, slices)
}
