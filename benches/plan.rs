//! Planning a large mixed fleet: 5,000 nodes / ~40,000 devices across 6 vendors, 50
//! classes and 200 budgets (target: median under 20 ms), and the same classes and
//! budgets over 500, 1,000, 2,500 and 5,000 nodes to show how time grows; and a
//! DRA-only fleet of 5,000 nodes / 40,000 devices published in ResourceSlices, which
//! the planner also turns into one DeviceClass per flavor; and the 5,000-node fleet
//! with Topology Aware Scheduling on; and 4 MultiKueue workers of 2,500 nodes
//! pooled, against one cluster of 10,000 (target: within 2x); and what a re-plan
//! of the 5,000 nodes does after planning: every desired object as JSON (before),
//! against fingerprints and the JSON of the one object a relabelled Node moves;
//! and a re-plan after one Node change, given the last plan's LocalQueues, as the
//! controller plans (device-plugin and DRA fleets).

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};

use std::collections::HashSet;

use kaccel::api::{AcceleratorClass, CreditBudget, SharingMode, synthetic};
use kaccel::controller::diff::{DesiredObjects, Kind, ObjectRef, desired_objects};
use kaccel::health::HealthSnapshot;
use kaccel::inventory::{Inventory, synthetic::generate_fleet};
use kaccel::plan::{Carried, PlanInput, PlanOptions, plan, plan_carrying};
use serde_json::json;

/// Returns the allocator's free pages to the system, as the controller does.
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// `inventory` with the first Node of `fleet` cordoned, read again alone: the
/// other nodes shared, as the controller's Node index changes one node.
fn one_node_cordoned(
    inventory: &Inventory,
    fleet: &[k8s_openapi::api::core::v1::Node],
    slices: &[k8s_openapi::api::resource::v1::ResourceSlice],
) -> Inventory {
    let mut node = fleet[0].clone();
    node.spec.get_or_insert_with(Default::default).unschedulable = Some(true);
    let name = node.metadata.name.clone().unwrap_or_default();
    let its_slices: Vec<_> = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(name.as_str()))
        .cloned()
        .collect();
    let read = Inventory::from_nodes_and_slices(&[node], &its_slices);
    let mut changed = inventory.clone();
    changed.nodes.extend(read.nodes);
    changed
}

/// Plans `inventories` (one Node apart) in turn, each plan given what the last
/// one left (its LocalQueues and purity verdicts), as the controller re-plans
/// after a Node change.
fn replan_in_turn(
    b: &mut criterion::Bencher<'_>,
    inventories: &[Inventory; 2],
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    health: &HealthSnapshot,
    options: &PlanOptions,
) {
    let input = |turn: usize| PlanInput {
        classes,
        budgets,
        inventory: &inventories[turn],
        health,
        options,
    };
    let mut carried = Carried::default();
    plan_carrying(&input(1), &mut carried);
    let mut turn = 0;
    b.iter(|| {
        turn ^= 1;
        let planned = plan_carrying(&input(turn), &mut carried);
        black_box(planned.cluster_queues.len())
    })
}

fn bench_plan(c: &mut Criterion) {
    let classes = synthetic::classes(50);
    let budgets = synthetic::budgets(200, 50);
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
    // The controller gave freed heap back to the system after each re-plan:
    // the next plan then faults its pages in again. The same 5,000 nodes, each
    // plan timed right after a trim.
    {
        let fleet = generate_fleet(5_000, 42);
        let inventory = Inventory::from_nodes(&fleet);
        let input = PlanInput {
            classes: &classes,
            budgets: &budgets,
            inventory: &inventory,
            health: &health,
            options: &options,
        };
        group.bench_function("nodes 5000 after a trim", |b| {
            b.iter_custom(|iterations| {
                let mut took = std::time::Duration::ZERO;
                for _ in 0..iterations {
                    trim();
                    let started = std::time::Instant::now();
                    let plan = plan(&input);
                    black_box(plan.cluster_queues.len());
                    drop(plan);
                    took += started.elapsed();
                }
                took
            })
        });
    }
    // A re-plan after one Node change, as the controller makes it: the same
    // 5,000 nodes with one of them cordoned, then not, in turn, each plan given
    // what the last one left (its LocalQueues, which a Node change leaves as
    // they were, and its purity verdicts).
    {
        let fleet = generate_fleet(5_000, 42);
        let inventory = Inventory::from_nodes(&fleet);
        let inventories = [
            inventory.clone(),
            one_node_cordoned(&inventory, &fleet, &[]),
        ];
        group.bench_function("nodes 5000 after a Node change", |b| {
            replan_in_turn(b, &inventories, &classes, &budgets, &health, &options)
        });
    }
    // The same 5,000 nodes with Topology Aware Scheduling on (every flavor's
    // nodes carry zone and hostname) and every fifth class asking for one
    // zone: the Topology stage and each such class's blocks on top.
    let fleet = generate_fleet(5_000, 42);
    let inventory = Inventory::from_nodes(&fleet);
    let mut zoned = classes.clone();
    for class in zoned.iter_mut().step_by(5) {
        if class.spec.sharing != SharingMode::CpuOnly {
            class.spec.topology = Some(kaccel::api::TopologyRequirement {
                level: kaccel::api::TopologyLevel::Zone,
            });
        }
    }
    let tas = PlanOptions {
        topology_aware_scheduling: true,
        ..PlanOptions::default()
    };
    group.bench_function("topology nodes 5000", |b| {
        b.iter(|| {
            let plan = plan(&PlanInput {
                classes: &zoned,
                budgets: &budgets,
                inventory: &inventory,
                health: &health,
                options: &tas,
            });
            black_box(plan.topologies.len())
        })
    });
    // MultiKueue: 4 worker clusters of 2,500 nodes against one cluster of
    // 10,000 (the same classes and budgets). A re-plan pools the workers' Node
    // indexes (kept current by their watches) and plans the union.
    let single = Inventory::from_nodes(&generate_fleet(10_000, 42));
    group.bench_function("nodes 10000", |b| {
        b.iter(|| {
            let plan = plan(&PlanInput {
                classes: &classes,
                budgets: &budgets,
                inventory: &single,
                health: &health,
                options: &options,
            });
            black_box(plan.cluster_queues.len())
        })
    });
    let workers: Vec<(String, std::sync::Arc<Inventory>)> = (0..4u64)
        .map(|w| {
            let name = format!("worker-{w}");
            let mut index = kaccel::inventory::index::NodeIndex::for_worker(&name);
            index.begin_relist();
            for node in generate_fleet(2_500, 42 + w) {
                index.relisted(&node);
            }
            index.end_relist();
            (name, index.snapshot())
        })
        .collect();
    let multikueue = PlanOptions {
        multikueue_check: Some("kaccel-multikueue".into()),
        ..PlanOptions::default()
    };
    let reachable = std::collections::BTreeMap::new();
    group.bench_function("multikueue 4 x 2500 nodes", |b| {
        b.iter(|| {
            let inventory = kaccel::inventory::index::worker_union(
                workers.iter().map(|(n, i)| (n.as_str(), i.clone())),
                &reachable,
            );
            let plan = plan(&PlanInput {
                classes: &classes,
                budgets: &budgets,
                inventory: &inventory,
                health: &health,
                options: &multikueue,
            });
            black_box(plan.cluster_queues.len())
        })
    });
    group.finish();

    // Reading Nodes into the inventory is part of every controller re-plan too.
    let fleet = generate_fleet(5_000, 42);
    c.bench_function("inventory/read 5000 nodes", |b| {
        b.iter(|| black_box(Inventory::from_nodes(&fleet).nodes.len()))
    });

    // After planning, a re-plan finds what to write. Every planned object as
    // JSON (what each re-plan built before, and dropped after), against what it
    // builds now: each object's fingerprint, written straight into a hash, and
    // JSON only for objects not in sync (here one: the root Cohort a relabelled
    // Node moves). Both include dropping what they built.
    let inventory = Inventory::from_nodes(&fleet);
    let planned = plan(&PlanInput {
        classes: &classes,
        budgets: &budgets,
        inventory: &inventory,
        health: &health,
        options: &options,
    });
    let mut group = c.benchmark_group("desired objects 5000 nodes");
    group.sample_size(30);
    group.bench_function("every object as JSON", |b| {
        b.iter(|| black_box(desired_objects(&planned).len()))
    });
    group.bench_function("fingerprints, JSON of one", |b| {
        b.iter(|| {
            let desired = DesiredObjects::of(&planned);
            let in_sync: HashSet<&ObjectRef> = desired
                .keys()
                .filter(|r| !(r.kind == Kind::Cohort && r.name == options.root_cohort))
                .collect();
            black_box(desired.values_except(&in_sync).len())
        })
    });
    group.finish();
}

/// 5,000 DRA-only nodes, each labelled with its model and publishing 8 GPUs of one
/// of four products through NVIDIA's or AMD's DRA driver (as `deviceinfo.go` and
/// the AMD driver's discovery publish them), with two driver versions.
fn dra_fleet(
    nodes: usize,
) -> (
    Vec<k8s_openapi::api::core::v1::Node>,
    Vec<k8s_openapi::api::resource::v1::ResourceSlice>,
) {
    let products = [
        (
            "gpu.nvidia.com",
            "NVIDIA H100 80GB HBM3",
            "81559Mi",
            "Hopper",
        ),
        (
            "gpu.nvidia.com",
            "NVIDIA A100-SXM4-80GB",
            "81920Mi",
            "Ampere",
        ),
        ("gpu.nvidia.com", "NVIDIA L40S", "46068Mi", "Ada Lovelace"),
        (
            "gpu.amd.com",
            "AMD Instinct MI300X",
            "196592Mi",
            "AMD_CDNA_3",
        ),
    ];
    let mut fleet = Vec::new();
    let mut slices = Vec::new();
    for n in 0..nodes {
        let (driver, product, memory, arch) = products[n % products.len()];
        let name = format!("dra-{n:05}");
        let model = product.split_whitespace().collect::<Vec<_>>().join("-");
        fleet.push(
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kaccel.io/accelerator.model": model}},
                "status": {"allocatable": {"cpu": "96", "memory": "1Ti", "pods": "110"},
                           "conditions": [{"type": "Ready", "status": "True"}]},
            }))
            .expect("a Node"),
        );
        let version = if n % 3 == 0 { "535.104.5" } else { "550.54.15" };
        let devices: Vec<serde_json::Value> = (0..8)
            .map(|i| {
                json!({
                    "name": format!("gpu-{i}"),
                    "attributes": {
                        "type": {"string": if driver == "gpu.amd.com" { "amdgpu" } else { "gpu" }},
                        "uuid": {"string": format!("GPU-{n:05}-{i}")},
                        "productName": {"string": product},
                        "architecture": {"string": arch}, "family": {"string": arch},
                        "driverVersion": {"version": version},
                    },
                    "capacity": {"memory": {"value": memory}},
                })
            })
            .collect();
        slices.push(
            serde_json::from_value(json!({
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"name": format!("{name}-{driver}")},
                "spec": {"driver": driver, "nodeName": name,
                         "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                         "devices": devices},
            }))
            .expect("a ResourceSlice"),
        );
    }
    (fleet, slices)
}

fn bench_plan_dra(c: &mut Criterion) {
    let mut classes = synthetic::classes(50);
    // Some classes require a driver version, written into their DeviceClasses.
    for (i, class) in classes.iter_mut().enumerate() {
        if class.spec.sharing == SharingMode::Whole && i % 4 == 1 {
            class.spec.selector.min_driver_version = Some("550".into());
        }
    }
    let budgets = synthetic::budgets(200, 50);
    let health = HealthSnapshot::default();
    let options = PlanOptions::default();
    let (fleet, slices) = dra_fleet(5_000);
    let inventory = Inventory::from_nodes_and_slices(&fleet, &slices);
    let plan_fleet = || {
        plan(&PlanInput {
            classes: &classes,
            budgets: &budgets,
            inventory: &inventory,
            health: &health,
            options: &options,
        })
    };
    let planned = plan_fleet();
    let devices: u64 = inventory.groups().map(|(_, g)| u64::from(g.capacity)).sum();
    eprintln!(
        "DRA fleet: 5000 nodes, {devices} devices, {} flavors, {} DeviceClasses",
        planned.flavors.len(),
        planned.device_classes.len()
    );
    let mut group = c.benchmark_group("plan");
    group.sample_size(30);
    group.bench_function("dra nodes 5000", |b| {
        b.iter(|| black_box(plan_fleet().device_classes.len()))
    });
    // After one Node change, as the controller re-plans (see "nodes 5000 after
    // a Node change"): one node cordoned, then not, what the last plan left kept.
    let inventories = [
        inventory.clone(),
        one_node_cordoned(&inventory, &fleet, &slices),
    ];
    group.bench_function("dra nodes 5000 after a Node change", |b| {
        replan_in_turn(b, &inventories, &classes, &budgets, &health, &options)
    });
    group.finish();
    c.bench_function("inventory/read 5000 DRA nodes and slices", |b| {
        b.iter(|| {
            black_box(
                Inventory::from_nodes_and_slices(&fleet, &slices)
                    .nodes
                    .len(),
            )
        })
    });
}

criterion_group!(benches, bench_plan, bench_plan_dra);
criterion_main!(benches);
