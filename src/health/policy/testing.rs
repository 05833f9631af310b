//! A watched H100 node of the example fleet, for tests here and in the planner.

use super::*;
use crate::api::{HealthCounts, Vendor};
use crate::inventory::Inventory;

/// The example H100 node with all 8 GPUs allocatable.
pub const NODE: &str = "gpu-h100-01";
/// Its one exporter source.
pub const SOURCE: &str = "dcgm";
pub const STALE_AFTER: i64 = 30;

/// The example fleet's inventory.
pub fn fleet() -> &'static Inventory {
    crate::testkit::example_inventory()
}

/// A tracker whose one source covers [`NODE`]'s GPUs, not answered yet.
pub fn watched() -> Tracker {
    let mut t = Tracker::default();
    t.sources.insert(
        SOURCE.into(),
        SourceState {
            name: SOURCE.into(),
            nodes: vec![NODE.into()],
            vendor: Some(Vendor::Nvidia),
            stale_after_seconds: STALE_AFTER,
            ..Default::default()
        },
    );
    t
}

/// Readings of [`NODE`]'s GPUs `devices`: uncorrectable ECC on `failed`, too hot
/// on `degraded`, healthy otherwise.
pub fn gpus(devices: &[u32], failed: &[u32], degraded: &[u32]) -> Vec<DeviceReading> {
    devices
        .iter()
        .map(|i| DeviceReading {
            vendor: Some(Vendor::Nvidia),
            node: Some(NODE.into()),
            device: i.to_string(),
            temperature_c: Some(if degraded.contains(i) { 99.0 } else { 50.0 }),
            ecc_uncorrectable: Some(if failed.contains(i) { 1.0 } else { 0.0 }),
            ..Default::default()
        })
        .collect()
}

/// One poll that brings no fresh news about the GPUs in `bad`, by `kind`: 0 the
/// exporter is unreachable, 1 no poll at all (it goes stale), 2 it answers
/// about every other GPU (healthy) but not those, 3 its source is removed.
pub fn silent_poll(t: &mut Tracker, kind: u8, now: i64, bad: &[u32]) {
    match kind {
        0 => t.fail(SOURCE, "connection refused".into(), now),
        1 => {}
        2 => {
            let quiet: Vec<u32> = (0..8).filter(|i| !bad.contains(i)).collect();
            t.observe(SOURCE, gpus(&quiet, &[], &[]), now, &Policy::default());
        }
        _ => t.remove_source(SOURCE, now),
    }
}

/// What the planner sees of [`NODE`]'s GPUs at `now`.
pub fn counts(t: &Tracker, inventory: &Inventory, now: i64) -> HealthCounts {
    let node = &inventory.nodes[NODE];
    let group = node
        .groups
        .iter()
        .find(|g| g.variant.resource_name == "nvidia.com/gpu")
        .expect("an nvidia.com/gpu group");
    t.snapshot(inventory, now).counts_for(node, group)
}
