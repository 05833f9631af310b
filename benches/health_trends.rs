//! The health trend rules at fleet scale (issue: health as a trend):
//!
//! - memory: heap bytes of the trend history for 40,000 devices (5,000 nodes x 8
//!   GPUs) with the default rules, after an hour and a quarter of 15 s polls so
//!   every rule's ring is full, every device's correctable ECC count rising, one in
//!   ten with XIDs of four different kinds recurring (the keyed rings' worst case);
//!   printed, not timed;
//! - time: one scrape of 5,000 devices through the tracker (classification, trend
//!   rules, hysteresis), warmed so the rings are full (criterion).
//!
//!   cargo bench --bench health_trends
use std::collections::BTreeMap;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use kaccel::api::Vendor;
use kaccel::health::exporters::DeviceReading;
use kaccel::health::policy::{Policy, SourceState, Tracker};
use kaccel::health::trend::DeviceHistory;

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

const GPUS_PER_NODE: usize = 8;
const POLL: i64 = 15;

/// GPU `gpu` of node `node` at poll `poll`: every trend signal present.
fn reading(node: usize, gpu: usize, poll: i64) -> DeviceReading {
    let device = node * GPUS_PER_NODE + gpu;
    let noisy = device.is_multiple_of(10);
    let mut signal_fields = kaccel::health::shared_text::FieldMap::default();
    signal_fields.insert(
        "eccCorrectable",
        vec!["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL".into()],
    );
    DeviceReading {
        vendor: Some(Vendor::Nvidia),
        node: Some(format!("gpu-node-{node:05}")),
        device: format!("GPU-{device:08x}-0000-0000-0000-000000000000"),
        index: Some(gpu as u32),
        temperature_c: Some(60.0 + (poll % 40) as f64),
        memory_temperature_c: Some(70.0),
        ecc_uncorrectable: Some(0.0),
        ecc_correctable: Some((poll * (1 + device as i64 % 3)) as f64),
        row_remap_pending: Some(false),
        clock_throttle_active: Some(poll % 3 == 0),
        recovery_action: Some(0),
        last_xid: Some(0),
        // XIDs 43, 45, 48, 62 counted by the exporter, rising on the noisy tenth.
        xid_counts: if noisy {
            [43, 45, 48, 62]
                .into_iter()
                .map(|x| (x, (poll / 4) as f64))
                .collect()
        } else {
            BTreeMap::new()
        },
        signal_fields,
        ..Default::default()
    }
}

fn history_memory(nodes: usize, polls: i64) {
    let policy = Policy::default();
    let readings: Vec<Vec<DeviceReading>> = (0..nodes)
        .map(|n| (0..GPUS_PER_NODE).map(|g| reading(n, g, 0)).collect())
        .collect();
    let before = counting_alloc::live_bytes();
    let mut history: BTreeMap<(String, String), DeviceHistory> = BTreeMap::new();
    for poll in 0..polls {
        for (n, node) in readings.iter().enumerate() {
            for (g, r) in node.iter().enumerate() {
                let mut r = r.clone();
                let fresh = reading(n, g, poll);
                r.ecc_correctable = fresh.ecc_correctable;
                r.temperature_c = fresh.temperature_c;
                r.clock_throttle_active = fresh.clock_throttle_active;
                r.xid_counts = fresh.xid_counts;
                let key = (r.node.clone().unwrap_or_default(), r.device.clone());
                history
                    .entry(key)
                    .or_default()
                    .observe(&r, 1_000_000 + poll * POLL, &policy, 60);
            }
        }
    }
    let bytes = counting_alloc::live_bytes() - before;
    let devices = nodes * GPUS_PER_NODE;
    println!(
        "trend history: {devices} devices, {} default rules, {polls} polls of {POLL}s: \
         {:.1} MiB ({} bytes per device, keys included)",
        policy.trend_rules.len(),
        bytes as f64 / (1024.0 * 1024.0),
        bytes / devices as isize
    );
}

/// The tracker as the health loop fills it: every node's dcgm-exporter answer
/// (the vendor-format fixture, its node name and UUIDs made the node's own)
/// parsed and observed, raw metric and label fields kept per device.
fn tracker_memory(nodes: usize) {
    use kaccel::health::exporters::{ExporterKind, readings};
    let fixture = include_str!("../src/health/testdata/dcgm.prom");
    let policy = Policy::default();
    let answers: Vec<String> = (0..nodes)
        .map(|n| {
            fixture
                .replace("gpu-node-a", &format!("gpu-node-{n:05}"))
                .replace("UUID=\"GPU-", &format!("UUID=\"GPU-{n:05}-"))
        })
        .collect();
    let before = counting_alloc::live_bytes();
    let mut tracker = Tracker::default();
    for (n, answer) in answers.iter().enumerate() {
        let samples = kaccel::health::prom::parse(answer).expect("the fixture parses");
        let read = readings(ExporterKind::DcgmExporter, &samples, None);
        tracker.observe(&format!("dcgm-{n:05}"), read, 1_000_000, &policy);
    }
    let bytes = counting_alloc::live_bytes() - before;
    let devices = tracker.devices.len();
    println!(
        "tracker: {devices} devices from {nodes} dcgm-exporter answers (the fixture's \
         metrics and labels): {:.1} MiB ({} bytes per device)",
        bytes as f64 / (1024.0 * 1024.0),
        bytes / devices.max(1) as isize
    );
}

fn one_scrape(c: &mut Criterion) {
    let nodes = 5_000 / GPUS_PER_NODE;
    let policy = Policy::default();
    let mut tracker = Tracker::default();
    tracker.sources.insert(
        "dcgm".into(),
        SourceState {
            name: "dcgm".into(),
            nodes: (0..nodes).map(|n| format!("gpu-node-{n:05}")).collect(),
            vendor: Some(Vendor::Nvidia),
            stale_after_seconds: 60,
            ..Default::default()
        },
    );
    let scrape = |poll: i64| -> Vec<DeviceReading> {
        (0..nodes)
            .flat_map(|n| (0..GPUS_PER_NODE).map(move |g| reading(n, g, poll)))
            .collect()
    };
    // Warm: an hour and a quarter of polls, so every ring is full.
    let mut poll = 0;
    while poll < 300 {
        tracker.observe("dcgm", scrape(poll), 1_000_000 + poll * POLL, &policy);
        poll += 1;
    }
    c.bench_function("tracker observe: one scrape of 5,000 devices", |b| {
        b.iter_batched(
            || {
                poll += 1;
                (scrape(poll), 1_000_000 + poll * POLL)
            },
            |(readings, now)| tracker.observe("dcgm", readings, now, &policy),
            BatchSize::LargeInput,
        )
    });
    // Same run, no trend rules: what the rules add to the tracker.
    let plain = Policy {
        trend_rules: vec![],
        ..Policy::default()
    };
    let sources = tracker.sources.clone();
    let mut tracker = Tracker::default();
    tracker.sources = sources;
    tracker.observe("dcgm", scrape(0), 1_000_000, &plain);
    c.bench_function(
        "tracker observe: one scrape of 5,000 devices, no trend rules",
        |b| {
            b.iter_batched(
                || {
                    poll += 1;
                    (scrape(poll), 1_000_000 + poll * POLL)
                },
                |(readings, now)| tracker.observe("dcgm", readings, now, &plain),
                BatchSize::LargeInput,
            )
        },
    );
    // The trend rules alone: 5,000 device histories, each fed its reading.
    let mut histories: Vec<DeviceHistory> = vec![DeviceHistory::default(); nodes * GPUS_PER_NODE];
    for p in 0..300 {
        for (h, r) in histories.iter_mut().zip(scrape(p)) {
            h.observe(&r, 1_000_000 + p * POLL, &policy, 60);
        }
    }
    c.bench_function("trend rules alone: one scrape of 5,000 devices", |b| {
        b.iter_batched(
            || {
                poll += 1;
                (scrape(poll), 1_000_000 + poll * POLL)
            },
            |(readings, now)| {
                for (h, r) in histories.iter_mut().zip(&readings) {
                    std::hint::black_box(h.observe(r, now, &policy, 60));
                }
                readings
            },
            BatchSize::LargeInput,
        )
    });
}

fn memory(_: &mut Criterion) {
    history_memory(5_000, 300);
    tracker_memory(5_000);
}

criterion_group!(benches, memory, one_scrape);
criterion_main!(benches);
