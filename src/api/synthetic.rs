//! A large platform team's classes and budgets, for benchmarks (`benches/plan.rs`,
//! the controller-at-scale measurement in tests/e2e): every sharing mode, vendor
//! subsets, memory floors, partition profiles and preferences.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

use super::*;

/// `count` classes named `class-NN`: every sharing mode, vendor subsets, memory
/// floors, partition profiles and preferences, as a large platform team writes them.
pub fn classes(count: usize) -> Vec<AcceleratorClass> {
    let vendor_sets: [&[Vendor]; 6] = [
        &[Vendor::Nvidia],
        &[Vendor::Amd],
        &[Vendor::Nvidia, Vendor::Amd],
        &[Vendor::Intel, Vendor::Huawei],
        &[Vendor::Aws, Vendor::Google],
        &[],
    ];
    let profiles = ["1g.10gb", "3g.40gb", "cpx_nps4", "4c", "neuroncore"];
    (0..count)
        .map(|i| {
            let sharing = match i % 10 {
                0..=5 => SharingMode::Whole,
                6 | 7 => SharingMode::Partition,
                8 => SharingMode::TimeShare,
                _ => SharingMode::CpuOnly,
            };
            let selector = match sharing {
                SharingMode::CpuOnly => HardwareSelector::default(),
                _ => HardwareSelector {
                    vendors: vendor_sets[i % vendor_sets.len()].to_vec(),
                    min_memory_mib: (sharing == SharingMode::Whole && i % 3 == 0)
                        .then_some(40_000 + (i as u64 % 4) * 20_000),
                    partition_profile: (sharing == SharingMode::Partition)
                        .then(|| profiles[i % profiles.len()].to_string()),
                    ..Default::default()
                },
            };
            AcceleratorClass {
                metadata: ObjectMeta {
                    name: Some(format!("class-{i:02}")),
                    ..Default::default()
                },
                spec: AcceleratorClassSpec {
                    description: None,
                    sharing,
                    selector,
                    pooling: Pooling::default(),
                    preference: if i % 2 == 0 {
                        vec!["*H100*".into(), "*MI300X*".into()]
                    } else {
                        vec![]
                    },
                    devices_per_pod: vec![],
                    pod_settings: vec![],
                    topology: None,
                    credits: CreditRate {
                        per_device_hour: "2.5".into(),
                        model_overrides: vec![],
                    },
                },
                status: None,
            }
        })
        .collect()
}

/// `count` budgets of two namespaces each (`team-NNN-a`, `team-NNN-b`), each
/// guaranteeing devices of four of the first `classes` classes.
pub fn budgets(count: usize, classes: usize) -> Vec<CreditBudget> {
    (0..count)
        .map(|i| CreditBudget {
            metadata: ObjectMeta {
                name: Some(format!("team-{i:03}")),
                ..Default::default()
            },
            spec: CreditBudgetSpec {
                team: format!("team-{i:03}"),
                namespaces: vec![format!("team-{i:03}-a"), format!("team-{i:03}-b")],
                classes: (0..4)
                    .map(|k| ClassGrant {
                        name: format!("class-{:02}", (i * 7 + k * 13) % classes.max(1)),
                        guaranteed_devices: ((i + k) % 5) as u32 * 4,
                    })
                    .collect(),
                credits: CreditAllowance {
                    per_period: "10000".into(),
                    period: Period {
                        start: Time(
                            k8s_openapi::jiff::Timestamp::from_second(1_764_547_200).unwrap(),
                        ),
                        days: 30,
                    },
                    top_ups: Vec::new(),
                },
                fair_share_weight: None,
                on_exhaustion: ExhaustionPolicy::Hold,
                allow_borrowing: true,
                admission: Default::default(),
            },
            status: None,
        })
        .collect()
}
