//! Planning a large mixed fleet: 5,000 nodes / ~40,000 devices across 6 vendors, 50
//! classes and 200 budgets (target: median under 20 ms), and the same classes and
//! budgets over 500, 1,000, 2,500 and 5,000 nodes to show how time grows.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kaccel::api::*;
use kaccel::health::HealthSnapshot;
use kaccel::inventory::{Inventory, synthetic::generate_fleet};
use kaccel::plan::{PlanInput, PlanOptions, plan};

/// 50 classes: every sharing mode, vendor subsets, memory floors, partition
/// profiles and preferences, as a large platform team would write them.
fn classes() -> Vec<AcceleratorClass> {
    let vendor_sets: [&[Vendor]; 6] = [
        &[Vendor::Nvidia],
        &[Vendor::Amd],
        &[Vendor::Nvidia, Vendor::Amd],
        &[Vendor::Intel, Vendor::Huawei],
        &[Vendor::Aws, Vendor::Google],
        &[],
    ];
    let profiles = ["1g.10gb", "3g.40gb", "cpx_nps4", "4c", "neuroncore"];
    (0..50)
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

fn budgets() -> Vec<CreditBudget> {
    (0..200)
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
                        name: format!("class-{:02}", (i * 7 + k * 13) % 50),
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

fn bench_plan(c: &mut Criterion) {
    let classes = classes();
    let budgets = budgets();
    let health = HealthSnapshot::default();
    let options = PlanOptions::default();

    let mut group = c.benchmark_group("plan");
    group.sample_size(30);
    for nodes in [500usize, 1_000, 2_500, 5_000] {
        let fleet = generate_fleet(nodes, 42);
        let inventory = Inventory::from_nodes(&fleet);
        let devices: u64 = inventory.groups().map(|(_, g)| u64::from(g.capacity)).sum();
        eprintln!("fleet: {nodes} nodes, {devices} schedulable device units");
        group.bench_with_input(
            BenchmarkId::new("nodes", nodes),
            &inventory,
            |b, inventory| {
                b.iter(|| {
                    let plan = plan(&PlanInput {
                        classes: &classes,
                        budgets: &budgets,
                        inventory,
                        health: &health,
                        options: &options,
                    });
                    black_box(plan.cluster_queues.len())
                })
            },
        );
    }
    group.finish();

    // Reading Nodes into the inventory is part of every controller re-plan too.
    let fleet = generate_fleet(5_000, 42);
    c.bench_function("inventory/read 5000 nodes", |b| {
        b.iter(|| black_box(Inventory::from_nodes(&fleet).nodes.len()))
    });
}

criterion_group!(benches, bench_plan);
criterion_main!(benches);
