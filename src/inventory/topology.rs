//! Topology levels read from the node labels vendors publish, widest first.
//!
//! Sources: Kubernetes' well-known labels (`topology.kubernetes.io/*`,
//! `kubernetes.io/hostname`); GKE's `cloud.google.com/gce-topology-{block,
//! subblock,host}` (Google's TAS guide for GKE: a block holds sub-blocks, which
//! hold hosts); EKS's `topology.k8s.aws/network-node-layer-{1,2,3}` (AWS's ML
//! topology guide and cloud-provider-aws: layer 1 is the broadest, layer 3 the
//! closest to the instance on most types); NVIDIA GPU feature discovery's
//! `nvidia.com/gpu.clique` (`<clusterUUID>.<cliqueID>` of the NVLink fabric);
//! and kaccel's own rack and datacenter labels for fleets no vendor labels.

use super::labels::Labels;

use crate::api::TopologyLevel;

/// `kubernetes.io/hostname`, set by every kubelet: the lowest level (Kueue
/// allows it only there).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// Every node label kaccel reads as a topology level, and the level it is.
pub const LEVEL_LABELS: [(&str, TopologyLevel); 12] = [
    (super::REGION_LABEL, TopologyLevel::Region),
    (super::ZONE_LABEL, TopologyLevel::Zone),
    (super::DATACENTER_LABEL, TopologyLevel::Datacenter),
    ("cloud.google.com/gce-topology-block", TopologyLevel::Block),
    (
        "topology.k8s.aws/network-node-layer-1",
        TopologyLevel::Block,
    ),
    (
        "cloud.google.com/gce-topology-subblock",
        TopologyLevel::Subblock,
    ),
    (
        "topology.k8s.aws/network-node-layer-2",
        TopologyLevel::Subblock,
    ),
    (super::RACK_LABEL, TopologyLevel::Rack),
    ("topology.k8s.aws/network-node-layer-3", TopologyLevel::Rack),
    ("nvidia.com/gpu.clique", TopologyLevel::NvlinkDomain),
    (
        "cloud.google.com/gce-topology-host",
        TopologyLevel::PhysicalHost,
    ),
    (HOSTNAME_LABEL, TopologyLevel::Host),
];

/// The level a node label is, if kaccel reads it as one.
pub fn level_of(label: &str) -> Option<TopologyLevel> {
    LEVEL_LABELS
        .iter()
        .find(|(l, _)| *l == label)
        .map(|(_, level)| *level)
}

/// The topology labels a node carries, widest level first (labels of one level
/// from two schemes, which no real node has, in name order).
pub fn node_levels(labels: &Labels) -> Vec<(&'static str, TopologyLevel)> {
    mask_levels(level_mask(labels))
}

/// The topology labels a node carries as a mask: bit i set when it carries
/// `LEVEL_LABELS[i]` with a value. Masks of many nodes AND to the labels all of
/// them carry, with no allocation per node.
pub fn level_mask(labels: &Labels) -> u32 {
    LEVEL_LABELS
        .iter()
        .enumerate()
        .filter(|(_, (label, _))| labels.get(label).is_some_and(|v| !v.is_empty()))
        .fold(0, |mask, (i, _)| mask | (1 << i))
}

/// The labels of a [`level_mask`], widest level first.
pub fn mask_levels(mask: u32) -> Vec<(&'static str, TopologyLevel)> {
    let mut out: Vec<(&'static str, TopologyLevel)> = LEVEL_LABELS
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(_, level)| *level)
        .collect();
    out.sort_by_key(|&(label, level)| (level, label));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_gke_a3_node_reads_as_zone_block_subblock_physical_host_and_host() {
        // Labels of a GKE node in a reserved A3 Mega block, as Google's TAS guide
        // and xpk's `gke-default` Topology list them (values are opaque IDs).
        let node = labels(&[
            ("kubernetes.io/hostname", "gke-a3-pool-7f2c"),
            ("topology.kubernetes.io/zone", "us-central1-a"),
            ("cloud.google.com/gce-topology-host", "0f5e1b2a3c"),
            ("cloud.google.com/gce-topology-subblock", "7b3c2a11"),
            ("cloud.google.com/gce-topology-block", "34a6b8d2"),
            ("cloud.google.com/gke-accelerator", "nvidia-h100-mega-80gb"),
        ]);
        let levels: Vec<TopologyLevel> = node_levels(&node).into_iter().map(|(_, l)| l).collect();
        assert_eq!(
            levels,
            [
                TopologyLevel::Zone,
                TopologyLevel::Block,
                TopologyLevel::Subblock,
                TopologyLevel::PhysicalHost,
                TopologyLevel::Host
            ]
        );
    }

    #[test]
    fn eks_network_layers_read_widest_first_and_the_nvlink_clique_below_the_rack() {
        // EKS's values look like `nn-e50490a237cb0f01a`; GFD's clique is the
        // fabric's cluster UUID and clique ID.
        let node = labels(&[
            ("topology.k8s.aws/network-node-layer-3", "nn-3a1"),
            (
                "topology.k8s.aws/network-node-layer-1",
                "nn-e50490a237cb0f01a",
            ),
            ("topology.k8s.aws/network-node-layer-2", "nn-2b7"),
            (
                "nvidia.com/gpu.clique",
                "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1",
            ),
            ("kubernetes.io/hostname", "ip-10-0-1-7"),
        ]);
        let read: Vec<&str> = node_levels(&node).into_iter().map(|(l, _)| l).collect();
        assert_eq!(
            read,
            [
                "topology.k8s.aws/network-node-layer-1",
                "topology.k8s.aws/network-node-layer-2",
                "topology.k8s.aws/network-node-layer-3",
                "nvidia.com/gpu.clique",
                "kubernetes.io/hostname"
            ]
        );
        assert_eq!(
            level_of("nvidia.com/gpu.clique"),
            Some(TopologyLevel::NvlinkDomain)
        );
        assert_eq!(level_of("nvidia.com/gpu.product"), None);
    }

    #[test]
    fn an_empty_label_value_is_no_level() {
        let node = labels(&[(super::super::RACK_LABEL, ""), (HOSTNAME_LABEL, "n1")]);
        assert_eq!(node_levels(&node), [(HOSTNAME_LABEL, TopologyLevel::Host)]);
    }
}
