//! The health loop's work per poll at fleet scale (criterion): 500 dcgm-exporter
//! answers of 8 GPUs each (the labels and metrics the fleet bench's fake
//! exporters serve, as dcgm-exporter writes them) parsed, read into devices and
//! observed by a tracker that already knows them, as every 5 s poll of a quiet
//! fleet does. Only public parsing and tracker calls: builds of older commits
//! run it unchanged, for a same-machine comparison. And the planner's view that
//! every re-plan takes of the tracker (`Tracker::snapshot`): the 5,000-node
//! synthetic fleet, 500 of its NVIDIA nodes watched by an exporter each.
//!
//!   cargo bench --bench health_poll

use criterion::{Criterion, criterion_group, criterion_main};
use kaccel::health::exporters::{ExporterKind, readings};
use kaccel::health::policy::{Policy, Tracker};
use kaccel::inventory::{Inventory, Vendor, synthetic::generate_fleet};

const EXPORTERS: usize = 500;
const GPUS: usize = 8;

fn answer(node: &str) -> String {
    let mut s = String::new();
    for (metric, value) in [
        ("DCGM_FI_DEV_GPU_TEMP", "41"),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "0"),
        ("DCGM_FI_DEV_XID_ERRORS", "0"),
    ] {
        s.push_str(&format!("# HELP {metric} x\n# TYPE {metric} gauge\n"));
        for i in 0..GPUS {
            s.push_str(&format!(
                "{metric}{{gpu=\"{i}\",UUID=\"GPU-{node}-{i:04}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\",DCGM_FI_DRIVER_VERSION=\"550.54.15\"}} {value}\n",
                0x18 + i
            ));
        }
    }
    s
}

fn poll(c: &mut Criterion) {
    let policy = Policy::default();
    let answers: Vec<(String, String)> = (0..EXPORTERS)
        .map(|n| {
            let node = format!("gpu-node-{n:05}");
            (format!("dcgm-{node}"), answer(&node))
        })
        .collect();
    let mut tracker = Tracker::default();
    let mut now = 1_000_000;
    let round = |tracker: &mut Tracker, now: i64| {
        for (source, text) in &answers {
            let samples = kaccel::health::prom::parse(text).expect("parses");
            let found = readings(ExporterKind::DcgmExporter, &samples, None);
            tracker.observe(source, found, now, &policy);
        }
    };
    round(&mut tracker, now);
    c.bench_function("health/one poll of 500 dcgm-exporters, 8 GPUs each", |b| {
        b.iter(|| {
            now += 5;
            round(&mut tracker, now);
        })
    });
}

fn snapshot(c: &mut Criterion) {
    let policy = Policy::default();
    let fleet = generate_fleet(5_000, 42);
    let inventory = Inventory::from_nodes(&fleet);
    let watched: Vec<String> = inventory
        .nodes
        .values()
        .filter(|n| n.groups.iter().any(|g| g.variant.vendor == Vendor::Nvidia))
        .take(EXPORTERS)
        .map(|n| n.name.clone())
        .collect();
    let mut tracker = Tracker::default();
    let now = 1_000_000;
    for node in &watched {
        let samples = kaccel::health::prom::parse(&answer(node)).expect("parses");
        let found = readings(ExporterKind::DcgmExporter, &samples, None);
        tracker.observe(&format!("dcgm-{node}"), found, now, &policy);
    }
    c.bench_function(
        "health/snapshot of 5,000 nodes, 500 watched by an exporter",
        |b| b.iter(|| std::hint::black_box(tracker.snapshot(&inventory, now).groups.len())),
    );
}

criterion_group!(benches, poll, snapshot);
criterion_main!(benches);
