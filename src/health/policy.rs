//! From readings to a status, with reasons and hysteresis; from statuses and source
//! states to the planner's [`HealthSnapshot`]. Pure: time is passed in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::exporters::DeviceReading;
use super::{DeviceStatus, HealthSnapshot};
use crate::api::{HealthCounts, Vendor};
use crate::inventory::Inventory;

/// Rules from signals to a status. Every threshold is configurable; the defaults
/// follow the vendors' guidance (NVIDIA's application XIDs are ignored, as its
/// device plugin does).
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// Device temperature (°C) from which a device is Warning (its flavor moves later).
    pub warning_temperature_c: f64,
    /// Device temperature (°C) from which a device is Degraded (out of quota).
    pub degraded_temperature_c: f64,
    /// Memory (HBM) temperature (°C) from which a device is Warning.
    pub memory_warning_temperature_c: f64,
    /// XIDs caused by applications, not hardware: ignored.
    pub ignored_xids: Vec<u64>,
    /// XIDs that mean the device failed (double-bit ECC, fallen off the bus, ...).
    pub failed_xids: Vec<u64>,
    /// A device must read healthy this long (seconds) before it counts again.
    pub hold_down_seconds: i64,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            warning_temperature_c: 85.0,
            degraded_temperature_c: 95.0,
            memory_warning_temperature_c: 95.0,
            ignored_xids: vec![13, 31, 43, 45, 68, 109],
            failed_xids: vec![48, 63, 64, 74, 79, 92, 94, 95, 119, 120],
            hold_down_seconds: 120,
        }
    }
}

fn severity(s: DeviceStatus) -> u8 {
    match s {
        DeviceStatus::Healthy => 0,
        DeviceStatus::Unknown => 1,
        DeviceStatus::Warning => 2,
        DeviceStatus::Degraded => 3,
        DeviceStatus::Failed => 4,
    }
}

/// The status one reading calls for, with every reason that applies.
pub fn classify(reading: &DeviceReading, policy: &Policy) -> (DeviceStatus, Vec<String>) {
    let mut status = DeviceStatus::Healthy;
    let mut reasons = Vec::new();
    let mut raise = |s: DeviceStatus, why: String| {
        if severity(s) > severity(status) {
            status = s;
        }
        reasons.push(why);
    };
    if let Some(n) = reading.ecc_uncorrectable.filter(|n| *n > 0.0) {
        raise(
            DeviceStatus::Failed,
            format!("{n} uncorrectable ECC error(s)"),
        );
    }
    if reading.row_remap_failure == Some(true) {
        raise(DeviceStatus::Failed, "row remapping failed".into());
    }
    if let Some(xid) = reading.last_xid.filter(|x| *x != 0) {
        if policy.failed_xids.contains(&xid) {
            raise(DeviceStatus::Failed, format!("critical XID {xid}"));
        } else if !policy.ignored_xids.contains(&xid) {
            raise(DeviceStatus::Warning, format!("XID {xid}"));
        }
    }
    if reading.vendor_healthy == Some(false) {
        raise(
            DeviceStatus::Failed,
            "the vendor's health check reports unhealthy".into(),
        );
    }
    if let Some(n) = reading.remapped_rows_uncorrectable.filter(|n| *n > 0.0) {
        raise(
            DeviceStatus::Degraded,
            format!("{n} row(s) remapped after uncorrectable errors (reset pending)"),
        );
    }
    if !reading.error_codes.is_empty() {
        raise(
            DeviceStatus::Degraded,
            format!("fault code(s) {}", reading.error_codes.join(", ")),
        );
    }
    if let Some(t) = reading.temperature_c {
        if t >= policy.degraded_temperature_c {
            raise(DeviceStatus::Degraded, format!("temperature {t} °C"));
        } else if t >= policy.warning_temperature_c {
            raise(DeviceStatus::Warning, format!("temperature {t} °C"));
        }
    }
    if let Some(t) = reading
        .memory_temperature_c
        .filter(|t| *t >= policy.memory_warning_temperature_c)
    {
        raise(DeviceStatus::Warning, format!("memory temperature {t} °C"));
    }
    (status, reasons)
}

/// One device's tracked health.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackedDevice {
    pub node: String,
    pub vendor: Option<Vendor>,
    pub device: String,
    pub status: DeviceStatus,
    pub reasons: Vec<String>,
    /// Unix seconds of the reading.
    pub observed_at: i64,
    /// Unix seconds of the last reading that was not healthy.
    pub last_unhealthy_at: Option<i64>,
    /// The source that reported it.
    pub source: String,
    pub reading: DeviceReading,
}

/// State of one health source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SourceState {
    pub name: String,
    /// Nodes whose devices this source reports (for a vendor).
    pub nodes: Vec<String>,
    pub vendor: Option<Vendor>,
    pub last_success_at: Option<i64>,
    pub last_error: Option<String>,
    pub stale_after_seconds: i64,
}

impl SourceState {
    /// Fresh and parseable: its readings are trusted. Otherwise its devices are
    /// Unknown (invariant 6: never the last value seen).
    pub fn usable(&self, now: i64) -> bool {
        self.last_error.is_none()
            && self
                .last_success_at
                .is_some_and(|t| now - t <= self.stale_after_seconds)
    }

    pub fn problem(&self, now: i64) -> Option<String> {
        if let Some(e) = &self.last_error {
            return Some(format!("source {} unavailable: {e}", self.name));
        }
        match self.last_success_at {
            None => Some(format!("source {} has not answered yet", self.name)),
            Some(t) if now - t > self.stale_after_seconds => Some(format!(
                "source {} stale: last sample {}s ago",
                self.name,
                now - t
            )),
            _ => None,
        }
    }
}

/// Device health over time, with hysteresis.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    /// (node, device) -> tracked device.
    pub devices: BTreeMap<(String, String), TrackedDevice>,
    pub sources: BTreeMap<String, SourceState>,
}

impl Tracker {
    /// A successful scrape: readings replace what the source said before.
    pub fn observe(
        &mut self,
        source: &str,
        readings: Vec<DeviceReading>,
        now: i64,
        policy: &Policy,
    ) {
        if let Some(state) = self.sources.get_mut(source) {
            state.last_success_at = Some(now);
            state.last_error = None;
        }
        let mut seen = Vec::new();
        for reading in readings {
            let Some(node) = reading.node.clone() else {
                continue;
            };
            let key = (node.clone(), reading.device.clone());
            let (raw, mut reasons) = classify(&reading, policy);
            let previous = self.devices.get(&key);
            let mut last_unhealthy_at = previous.and_then(|p| p.last_unhealthy_at);
            let mut status = raw;
            if raw != DeviceStatus::Healthy {
                last_unhealthy_at = Some(now);
            } else if let (Some(prev), Some(bad_at)) = (previous, last_unhealthy_at)
                // Times are whole seconds: a difference of exactly `hold_down_seconds`
                // can be as little as `hold_down_seconds - 1` real seconds (bad at
                // x.99, healthy at x+2.00). Hold until the difference exceeds it.
                && now - bad_at <= policy.hold_down_seconds
                && prev.status != DeviceStatus::Healthy
                && prev.status != DeviceStatus::Unknown
            {
                // Hold-down: a device that just recovered keeps its last bad status.
                status = prev.status;
                reasons = vec![format!(
                    "recovering: healthy again, counts from {} (hold-down {}s)",
                    bad_at + policy.hold_down_seconds + 1,
                    policy.hold_down_seconds
                )];
            }
            seen.push(key.clone());
            self.devices.insert(
                key,
                TrackedDevice {
                    node,
                    vendor: reading.vendor,
                    device: reading.device.clone(),
                    status,
                    reasons,
                    observed_at: now,
                    last_unhealthy_at,
                    source: source.to_string(),
                    reading,
                },
            );
        }
        // Devices the source no longer reports are forgotten (their group falls back
        // to Unknown for the missing count).
        self.devices
            .retain(|k, d| d.source != source || seen.contains(k));
    }

    /// A failed scrape (unreachable, bad status, unparseable body).
    pub fn fail(&mut self, source: &str, error: String) {
        if let Some(state) = self.sources.get_mut(source) {
            state.last_error = Some(error);
        }
    }

    /// The planner's view: per node and device group, devices by status. A group
    /// whose vendor is covered by a source that is stale or failing is Unknown; a
    /// group no source covers keeps the Node's own view (ready, withdrawn devices).
    pub fn snapshot(&self, inventory: &Inventory, now: i64) -> HealthSnapshot {
        let mut snapshot = HealthSnapshot::default();
        for node in inventory.nodes.values() {
            for group in &node.groups {
                let vendor = group.variant.vendor;
                let covering: Vec<&SourceState> = self
                    .sources
                    .values()
                    .filter(|s| s.vendor == Some(vendor) && s.nodes.contains(&node.name))
                    .collect();
                if covering.is_empty() {
                    continue;
                }
                let withdrawn = group.capacity.saturating_sub(group.allocatable);
                if !covering.iter().any(|s| s.usable(now)) {
                    snapshot.set(
                        &node.name,
                        &group.variant.resource_name,
                        HealthCounts {
                            unknown: group.allocatable,
                            degraded: withdrawn,
                            ..Default::default()
                        },
                    );
                    continue;
                }
                let devices: Vec<&TrackedDevice> = self
                    .devices
                    .values()
                    .filter(|d| d.node == node.name && d.vendor == Some(vendor))
                    .collect();
                let physical = devices.len().max(1) as u64;
                let capacity = u64::from(group.capacity);
                // Partitions and time-share replicas follow their physical device.
                // Bad statuses round up and healthy rounds down, so a failed chip
                // on a node whose devices are split over several groups never
                // disappears in rounding (invariant 1).
                let count =
                    |st: DeviceStatus| devices.iter().filter(|d| d.status == st).count() as u64;
                let up = |n: u64| n.saturating_mul(capacity).div_ceil(physical);
                let failed = up(count(DeviceStatus::Failed)).min(capacity);
                let degraded = up(count(DeviceStatus::Degraded)).min(capacity - failed);
                let warning = up(count(DeviceStatus::Warning)).min(capacity - failed - degraded);
                let healthy = (count(DeviceStatus::Healthy) * capacity / physical)
                    .min(capacity - failed - degraded - warning);
                // What is left (unreported devices, rounding) is Unknown.
                let unknown = capacity - failed - degraded - warning - healthy;
                snapshot.set(
                    &node.name,
                    &group.variant.resource_name,
                    HealthCounts {
                        healthy: healthy as u32,
                        warning: warning as u32,
                        degraded: degraded as u32,
                        failed: failed as u32,
                        unknown: unknown as u32,
                    },
                );
            }
        }
        snapshot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(node: &str, device: &str) -> DeviceReading {
        DeviceReading {
            vendor: Some(Vendor::Nvidia),
            node: Some(node.into()),
            device: device.into(),
            temperature_c: Some(50.0),
            ..Default::default()
        }
    }

    #[test]
    fn rules_map_signals_to_status() {
        let p = Policy::default();
        let mut r = reading("n", "0");
        assert_eq!(classify(&r, &p).0, DeviceStatus::Healthy);
        r.last_xid = Some(13);
        assert_eq!(
            classify(&r, &p).0,
            DeviceStatus::Healthy,
            "application XID ignored"
        );
        r.last_xid = Some(79);
        assert_eq!(classify(&r, &p).0, DeviceStatus::Failed);
        let mut r = reading("n", "0");
        r.ecc_uncorrectable = Some(2.0);
        let (s, why) = classify(&r, &p);
        assert_eq!(s, DeviceStatus::Failed);
        assert!(why[0].contains("uncorrectable ECC"));
        let mut r = reading("n", "0");
        r.temperature_c = Some(88.0);
        assert_eq!(classify(&r, &p).0, DeviceStatus::Warning);
        r.temperature_c = Some(99.0);
        assert_eq!(classify(&r, &p).0, DeviceStatus::Degraded);
        let mut r = reading("n", "0");
        r.vendor_healthy = Some(false);
        r.error_codes = vec!["0x80E01801".into()];
        let (s, why) = classify(&r, &p);
        assert_eq!(s, DeviceStatus::Failed, "worst wins");
        assert_eq!(why.len(), 2, "every reason kept");
    }

    #[test]
    fn recovery_waits_for_hold_down() {
        let p = Policy {
            hold_down_seconds: 60,
            ..Default::default()
        };
        let mut t = Tracker::default();
        t.sources.insert(
            "s".into(),
            SourceState {
                name: "s".into(),
                stale_after_seconds: 30,
                ..Default::default()
            },
        );
        let mut bad = reading("n", "0");
        bad.ecc_uncorrectable = Some(1.0);
        t.observe("s", vec![bad], 100, &p);
        t.observe("s", vec![reading("n", "0")], 130, &p);
        let d = &t.devices[&("n".to_string(), "0".to_string())];
        assert_eq!(d.status, DeviceStatus::Failed, "still in hold-down");
        assert!(d.reasons[0].contains("recovering"));
        t.observe("s", vec![reading("n", "0")], 161, &p);
        assert_eq!(
            t.devices[&("n".to_string(), "0".to_string())].status,
            DeviceStatus::Healthy
        );
    }

    #[test]
    fn hold_down_is_never_shorter_than_configured() {
        // Whole-second clock: bad at 100.99 reads as 100, healthy at 102.00 as 102.
        // Only ~1 s has passed, so a 2 s hold-down must still hold.
        let p = Policy {
            hold_down_seconds: 2,
            ..Default::default()
        };
        let mut t = Tracker::default();
        let key = ("n".to_string(), "0".to_string());
        let mut bad = reading("n", "0");
        bad.last_xid = Some(79);
        t.observe("s", vec![bad], 100, &p);
        t.observe("s", vec![reading("n", "0")], 101, &p);
        assert_eq!(t.devices[&key].status, DeviceStatus::Failed);
        t.observe("s", vec![reading("n", "0")], 102, &p);
        assert_eq!(
            t.devices[&key].status,
            DeviceStatus::Failed,
            "released after as little as 1 s"
        );
        assert!(t.devices[&key].reasons[0].contains("counts from 103"));
        t.observe("s", vec![reading("n", "0")], 103, &p);
        assert_eq!(t.devices[&key].status, DeviceStatus::Healthy);
    }

    #[test]
    fn stale_or_broken_sources_are_unknown_never_last_value() {
        let s = SourceState {
            name: "s".into(),
            last_success_at: Some(100),
            stale_after_seconds: 10,
            ..Default::default()
        };
        assert!(s.usable(105));
        assert!(!s.usable(111));
        assert!(s.problem(111).unwrap().contains("stale"));
        let broken = SourceState {
            last_error: Some("connection refused".into()),
            ..s
        };
        assert!(!broken.usable(101));
    }

    #[test]
    fn a_failed_chip_never_rounds_away() {
        // 8 physical chips shared by a 4-card group and a 20-vNPU group.
        let text = include_str!("../../examples/nodes.yaml");
        let nodes: Vec<k8s_openapi::api::core::v1::Node> = serde_yaml::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let inventory = Inventory::from_nodes(&nodes);
        let node = inventory
            .nodes
            .values()
            .find(|n| {
                n.groups.len() > 1 && n.groups.iter().all(|g| g.variant.vendor == Vendor::Huawei)
            })
            .expect("an Ascend node with whole and vNPU groups");
        let p = Policy::default();
        let mut t = Tracker::default();
        t.sources.insert(
            "s".into(),
            SourceState {
                name: "s".into(),
                nodes: vec![node.name.clone()],
                vendor: Some(Vendor::Huawei),
                stale_after_seconds: 30,
                ..Default::default()
            },
        );
        let readings: Vec<DeviceReading> = (0..8)
            .map(|i| DeviceReading {
                vendor: Some(Vendor::Huawei),
                node: Some(node.name.clone()),
                device: i.to_string(),
                vendor_healthy: Some(i != 3),
                ..Default::default()
            })
            .collect();
        t.observe("s", readings, 100, &p);
        let snap = t.snapshot(&inventory, 100);
        for g in &node.groups {
            let c = snap.counts_for(node, g);
            assert!(c.failed >= 1, "{}: {c:?}", g.variant.resource_name);
            assert_eq!(c.total(), g.capacity);
        }
    }
}

/// A node condition (node-problem-detector, NVSentinel, a vendor health agent)
/// that, while True, gives the node's devices (of one vendor, or all) a status.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConditionRule {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<Vendor>,
    pub status: DeviceStatus,
}

pub fn default_node_condition_rules() -> Vec<NodeConditionRule> {
    let rule = |t: &str, vendor, status| NodeConditionRule {
        type_: t.into(),
        vendor,
        status,
    };
    vec![
        rule(
            "GpuThermalWatch",
            Some(Vendor::Nvidia),
            DeviceStatus::Warning,
        ),
        rule(
            "SysLogsXIDError",
            Some(Vendor::Nvidia),
            DeviceStatus::Degraded,
        ),
        rule("AMDGPUProblem", Some(Vendor::Amd), DeviceStatus::Failed),
    ]
}

/// Apply node conditions on top of what the sources said: a True condition moves
/// the node's devices of that vendor to at least the rule's status. Devices already
/// worse stay as they are.
pub fn apply_node_conditions(
    snapshot: &mut HealthSnapshot,
    inventory: &Inventory,
    rules: &[NodeConditionRule],
) {
    for node in inventory.nodes.values() {
        for rule in rules {
            if node.conditions.get(&rule.type_).map(|c| c.0.as_str()) != Some("True") {
                continue;
            }
            for group in &node.groups {
                if rule.vendor.is_some_and(|v| v != group.variant.vendor) {
                    continue;
                }
                let mut c = snapshot.counts_for(node, group);
                let moved = match rule.status {
                    DeviceStatus::Warning => std::mem::take(&mut c.healthy),
                    DeviceStatus::Degraded => {
                        std::mem::take(&mut c.healthy)
                            + std::mem::take(&mut c.warning)
                            + std::mem::take(&mut c.unknown)
                    }
                    DeviceStatus::Failed => {
                        std::mem::take(&mut c.healthy)
                            + std::mem::take(&mut c.warning)
                            + std::mem::take(&mut c.unknown)
                            + std::mem::take(&mut c.degraded)
                    }
                    DeviceStatus::Healthy | DeviceStatus::Unknown => 0,
                };
                match rule.status {
                    DeviceStatus::Warning => c.warning += moved,
                    DeviceStatus::Degraded => c.degraded += moved,
                    DeviceStatus::Failed => c.failed += moved,
                    DeviceStatus::Healthy | DeviceStatus::Unknown => {}
                }
                snapshot.set(&node.name, &group.variant.resource_name, c);
            }
        }
    }
}

#[cfg(test)]
mod node_condition_tests {
    use super::*;

    #[test]
    fn true_conditions_raise_device_status() {
        let text = include_str!("../../examples/nodes.yaml");
        let nodes: Vec<k8s_openapi::api::core::v1::Node> = serde_yaml::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let mut inventory = Inventory::from_nodes(&nodes);
        let node = inventory
            .nodes
            .values_mut()
            .find(|n| n.name.starts_with("gpu-h100"))
            .unwrap();
        node.conditions
            .insert("GpuThermalWatch".into(), ("True".into(), "Hot".into()));
        let name = node.name.clone();
        let mut snapshot = HealthSnapshot::default();
        apply_node_conditions(&mut snapshot, &inventory, &default_node_condition_rules());
        let c = snapshot.groups[&name]["nvidia.com/gpu"];
        assert_eq!(c.healthy, 0);
        assert!(c.warning > 0);
        assert_eq!(snapshot.groups.len(), 1, "other nodes untouched");
    }
}
