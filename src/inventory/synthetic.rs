//! A deterministic synthetic fleet for benchmarks and property tests.
//!
//! [`generate_fleet`] draws node shapes from a weighted mix of real vendor setups:
//! NVIDIA H100/L40S whole GPUs, A100 MIG (mixed strategy), L4 time-slicing, AMD
//! MI300X whole and CPX/NPS4-partitioned, Intel Gaudi3, Huawei Ascend 910B (whole and
//! vNPU), AWS Trainium and GKE TPU v5e, plus 5% CPU-only nodes. Accelerator nodes
//! have 8 physical devices (`trn1.32xlarge`: 16 Trainium chips), so `n` nodes hold
//! about `8 n` physical devices (5,000 nodes: about 40,000); the schedulable units
//! differ where devices are partitioned or replicated. Nodes spread over three zones. A few nodes have
//! withdrawn devices (allocatable < capacity), are NotReady or are cordoned, as in
//! any real fleet. The same `(nodes, seed)` always gives the same fleet; no RNG crate
//! is involved (SplitMix64).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeCondition, NodeSpec, NodeStatus, Taint};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Physical accelerators per synthetic accelerator node (Trainium nodes: twice that).
pub const DEVICES_PER_NODE: u32 = 8;

const ZONES: [&str; 3] = ["zone-a", "zone-b", "zone-c"];

/// SplitMix64: tiny, fast, deterministic, good enough to pick shapes (and, in the
/// e2e crash test, kill times); not for anything that needs real randomness.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

#[derive(Clone, Copy)]
enum Shape {
    H100,
    A100MigMixed,
    L4TimeSlicing,
    L40S,
    Mi300x,
    Mi300xCpx,
    Gaudi3,
    Ascend910B,
    Ascend910BVnpu,
    Trainium,
    TpuV5e,
    CpuOnly,
}

/// (shape, weight); weights sum to 100.
const MIX: [(Shape, u64); 12] = [
    (Shape::H100, 27),
    (Shape::A100MigMixed, 8),
    (Shape::L4TimeSlicing, 8),
    (Shape::L40S, 10),
    (Shape::Mi300x, 12),
    (Shape::Mi300xCpx, 4),
    (Shape::Gaudi3, 7),
    (Shape::Ascend910B, 6),
    (Shape::Ascend910BVnpu, 2),
    (Shape::Trainium, 6),
    (Shape::TpuV5e, 5),
    (Shape::CpuOnly, 5),
];

/// `nodes` synthetic Nodes, deterministic in `seed`.
pub fn generate_fleet(nodes: usize, seed: u64) -> Vec<Node> {
    let mut rng = SplitMix64(seed ^ 0x6b61_6363_656c_0001);
    let total: u64 = MIX.iter().map(|(_, w)| w).sum();
    (0..nodes)
        .map(|i| {
            let mut pick = rng.below(total);
            let mut shape = Shape::CpuOnly;
            for (s, w) in MIX {
                if pick < w {
                    shape = s;
                    break;
                }
                pick -= w;
            }
            let zone = ZONES[(rng.below(ZONES.len() as u64)) as usize];
            // ~3% of nodes lost a device to the plugin's health check.
            let withdrawn = u32::from(rng.below(100) < 3);
            let not_ready = rng.below(200) == 0;
            let cordoned = rng.below(200) == 0;
            build(shape, i, zone, withdrawn, not_ready, cordoned)
        })
        .collect()
}

struct Builder {
    name: String,
    labels: BTreeMap<String, String>,
    taints: Vec<Taint>,
    capacity: BTreeMap<String, Quantity>,
    allocatable: BTreeMap<String, Quantity>,
}

impl Builder {
    fn label(&mut self, k: &str, v: impl Into<String>) -> &mut Self {
        self.labels.insert(k.to_string(), v.into());
        self
    }

    fn taint(&mut self, key: &str, value: &str) -> &mut Self {
        self.taints.push(Taint {
            key: key.to_string(),
            value: Some(value.to_string()),
            effect: "NoSchedule".to_string(),
            time_added: None,
        });
        self
    }

    /// A device resource; `withdrawn` units are missing from allocatable.
    fn resource(&mut self, name: &str, capacity: u32, withdrawn: u32) -> &mut Self {
        self.capacity
            .insert(name.to_string(), Quantity(capacity.to_string()));
        self.allocatable.insert(
            name.to_string(),
            Quantity(capacity.saturating_sub(withdrawn).to_string()),
        );
        self
    }
}

fn build(
    shape: Shape,
    index: usize,
    zone: &str,
    withdrawn: u32,
    not_ready: bool,
    cordoned: bool,
) -> Node {
    let prefix = match shape {
        Shape::H100 => "h100",
        Shape::A100MigMixed => "a100-mig",
        Shape::L4TimeSlicing => "l4-ts",
        Shape::L40S => "l40s",
        Shape::Mi300x => "mi300x",
        Shape::Mi300xCpx => "mi300x-cpx",
        Shape::Gaudi3 => "gaudi3",
        Shape::Ascend910B => "ascend910b",
        Shape::Ascend910BVnpu => "ascend910b-vnpu",
        Shape::Trainium => "trn1",
        Shape::TpuV5e => "tpu-v5e",
        Shape::CpuOnly => "cpu",
    };
    let mut b = Builder {
        name: format!("syn-{prefix}-{index:05}"),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        capacity: BTreeMap::new(),
        allocatable: BTreeMap::new(),
    };
    b.label("kubernetes.io/hostname", b.name.clone())
        .label("kubernetes.io/arch", "amd64")
        .label("kubernetes.io/os", "linux")
        .label(super::ZONE_LABEL, zone)
        .label(super::REGION_LABEL, "region-1");
    let n = DEVICES_PER_NODE;
    let (cpu, mem_gi) = match shape {
        Shape::CpuOnly => ("64", 256),
        Shape::L4TimeSlicing | Shape::L40S => ("96", 768),
        _ => ("192", 2048),
    };
    match shape {
        Shape::H100 => {
            nvidia(&mut b, "NVIDIA-H100-80GB-HBM3", "hopper", "81559", "9", "0");
            b.resource("nvidia.com/gpu", n, withdrawn);
        }
        Shape::L40S => {
            nvidia(&mut b, "NVIDIA-L40S", "ada-lovelace", "46068", "8", "9");
            b.resource("nvidia.com/gpu", n, withdrawn);
        }
        Shape::L4TimeSlicing => {
            nvidia(
                &mut b,
                "NVIDIA-L4-SHARED",
                "ada-lovelace",
                "23034",
                "8",
                "9",
            );
            b.label("nvidia.com/gpu.sharing-strategy", "time-slicing")
                .label("nvidia.com/gpu.replicas", "4");
            b.resource("nvidia.com/gpu", n * 4, withdrawn * 4);
        }
        Shape::A100MigMixed => {
            nvidia(&mut b, "NVIDIA-A100-SXM4-80GB", "ampere", "81920", "8", "0");
            // GFD labels MIG-enabled cards without sharing (replicas 0) and each MIG
            // resource under its own name.
            b.label("nvidia.com/mig.strategy", "mixed")
                .label("nvidia.com/mig.capable", "true")
                .label("nvidia.com/gpu.replicas", "0")
                .label(
                    "nvidia.com/mig-1g.10gb.product",
                    "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb",
                )
                .label("nvidia.com/mig-1g.10gb.count", "28")
                .label("nvidia.com/mig-1g.10gb.replicas", "1")
                .label("nvidia.com/mig-1g.10gb.memory", "9728")
                .label(
                    "nvidia.com/mig-3g.40gb.product",
                    "NVIDIA-A100-SXM4-80GB-MIG-3g.40gb",
                )
                .label("nvidia.com/mig-3g.40gb.count", "8")
                .label("nvidia.com/mig-3g.40gb.replicas", "1")
                .label("nvidia.com/mig-3g.40gb.memory", "40192");
            // 4 GPUs as 7 x 1g.10gb, 4 GPUs as 2 x 3g.40gb.
            b.resource("nvidia.com/mig-1g.10gb", 28, withdrawn * 7)
                .resource("nvidia.com/mig-3g.40gb", 8, 0);
        }
        Shape::Mi300x | Shape::Mi300xCpx => {
            b.label("amd.com/gpu.product-name", "AMD_Instinct_MI300X_OAM")
                .label("amd.com/gpu.family", "AI")
                .label("amd.com/gpu.device-id", "74a1")
                .label("amd.com/gpu.cu-count", "304")
                .label("amd.com/gpu.driver-version", "6.10.5")
                .label("amd.com/gpu.compute-partitioning-supported", "true")
                .label("amd.com/gpu.memory-partitioning-supported", "true")
                .taint("amd.com/gpu", "present");
            if matches!(shape, Shape::Mi300x) {
                b.label("amd.com/gpu.vram", "192G")
                    .label("amd.com/gpu.compute-memory-partition", "spx_nps1");
                b.resource("amd.com/gpu", n, withdrawn);
            } else {
                b.label("amd.com/gpu.vram", "24G")
                    .label("amd.com/gpu.compute-memory-partition", "cpx_nps4");
                b.resource("amd.com/cpx_nps4", n * 8, withdrawn * 8);
            }
        }
        Shape::Gaudi3 => {
            b.label(super::MODEL_LABEL, "Gaudi3")
                .taint("habana.ai/gaudi", "present");
            b.resource("habana.ai/gaudi", n, withdrawn);
        }
        Shape::Ascend910B | Shape::Ascend910BVnpu => {
            b.label("accelerator", "huawei-Ascend910")
                .label("accelerator-type", "module-910b-8")
                .label("node.kubernetes.io/npu.chip.name", "910B3")
                .label("servertype", "Ascend910B-20")
                .label("kubernetes.io/arch", "arm64");
            if matches!(shape, Shape::Ascend910B) {
                b.resource("huawei.com/Ascend910", n, withdrawn);
            } else {
                // Half the NPUs cut into 4-core vNPUs (5 per 20-core chip), half whole.
                b.resource("huawei.com/Ascend910", n / 2, withdrawn)
                    .resource("huawei.com/Ascend910-4c", (n / 2) * 5, 0);
            }
        }
        Shape::Trainium => {
            b.label("node.kubernetes.io/instance-type", "trn1.32xlarge")
                .taint("aws.amazon.com/neuron", "present");
            // trn1.32xlarge: 16 Trainium chips, 2 NeuronCores each.
            b.resource("aws.amazon.com/neuron", n * 2, withdrawn)
                .resource("aws.amazon.com/neuroncore", n * 4, withdrawn * 2);
        }
        Shape::TpuV5e => {
            b.label(
                "cloud.google.com/gke-tpu-accelerator",
                "tpu-v5-lite-podslice",
            )
            .label("cloud.google.com/gke-tpu-topology", "2x4")
            .label("node.kubernetes.io/instance-type", "ct5lp-hightpu-8t")
            .taint("google.com/tpu", "present");
            b.resource("google.com/tpu", n, withdrawn);
        }
        Shape::CpuOnly => {
            b.label("kaccel.io/pool", "cpu");
        }
    }
    let mut capacity = b.capacity;
    let mut allocatable = b.allocatable;
    for (k, cap, alloc) in [
        (
            "cpu",
            cpu.to_string(),
            format!("{}m", cpu.parse::<u64>().unwrap_or(0) * 1000 - 500),
        ),
        (
            "memory",
            format!("{mem_gi}Gi"),
            format!("{}Mi", mem_gi * 1024 - 2048),
        ),
        ("pods", "110".to_string(), "110".to_string()),
        (
            "ephemeral-storage",
            "1843Gi".to_string(),
            "1700Gi".to_string(),
        ),
    ] {
        capacity.insert(k.to_string(), Quantity(cap));
        allocatable.insert(k.to_string(), Quantity(alloc));
    }
    Node {
        metadata: ObjectMeta {
            name: Some(b.name),
            labels: Some(b.labels),
            ..ObjectMeta::default()
        },
        spec: Some(NodeSpec {
            taints: (!b.taints.is_empty()).then_some(b.taints),
            unschedulable: cordoned.then_some(true),
            ..NodeSpec::default()
        }),
        status: Some(NodeStatus {
            capacity: Some(capacity),
            allocatable: Some(allocatable),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_string(),
                status: if not_ready { "False" } else { "True" }.to_string(),
                reason: Some(
                    if not_ready {
                        "KubeletNotReady"
                    } else {
                        "KubeletReady"
                    }
                    .to_string(),
                ),
                ..NodeCondition::default()
            }]),
            ..NodeStatus::default()
        }),
    }
}

/// GFD labels for one NVIDIA product.
fn nvidia(b: &mut Builder, product: &str, family: &str, memory: &str, major: &str, minor: &str) {
    b.label("nvidia.com/gpu.present", "true")
        .label("nvidia.com/gpu.product", product)
        .label("nvidia.com/gpu.family", family)
        .label("nvidia.com/gpu.memory", memory)
        .label("nvidia.com/gpu.count", DEVICES_PER_NODE.to_string())
        .label("nvidia.com/gpu.compute.major", major)
        .label("nvidia.com/gpu.compute.minor", minor)
        .label("nvidia.com/cuda.driver-version.full", "570.133.20")
        .label("nvidia.com/cuda.runtime-version.full", "12.8")
        .label("nvidia.com/gpu.replicas", "1")
        .label("nvidia.com/gpu.sharing-strategy", "none")
        .label("nvidia.com/mig.strategy", "none")
        .taint("nvidia.com/gpu", "present");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::{Inventory, SharingMode, Vendor};

    #[test]
    fn deterministic() {
        assert_eq!(generate_fleet(200, 7), generate_fleet(200, 7));
        assert_ne!(generate_fleet(200, 7), generate_fleet(200, 8));
    }

    #[test]
    fn realistic_mix_without_warnings() {
        let fleet = generate_fleet(2_000, 42);
        let inv = Inventory::from_nodes(&fleet);
        assert_eq!(inv.nodes.len(), 2_000);
        for n in inv.nodes.values() {
            assert!(n.warnings.is_empty(), "{}: {:?}", n.name, n.warnings);
            assert!(n.cpu_millis > 0 && n.memory_bytes > 0);
        }
        let vendors: std::collections::BTreeSet<Vendor> =
            inv.groups().map(|(_, g)| g.variant.vendor).collect();
        assert_eq!(vendors.len(), 6);
        for mode in [
            SharingMode::Whole,
            SharingMode::Partition,
            SharingMode::TimeShare,
        ] {
            assert!(
                inv.groups().any(|(_, g)| g.variant.sharing == mode),
                "{mode}"
            );
        }
        let accel_nodes = inv.nodes.values().filter(|n| n.has_accelerators()).count();
        assert!(accel_nodes > 1_850 && accel_nodes < 1_950, "{accel_nodes}");
        assert!(inv.groups().any(|(_, g)| g.allocatable < g.capacity));
    }
}
