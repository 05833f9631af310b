//! From readings to a status, with reasons and hysteresis; from statuses and source
//! states to the planner's [`HealthSnapshot`]. Pure: time is passed in.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::exporters::DeviceReading;
use super::{DeviceStatus, HealthSnapshot};
use crate::api::{HealthCounts, SharingMode, Vendor};
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
    /// A device must read healthy this long (seconds) before it counts again; after
    /// a silence, counted from the first fresh reading.
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
    /// Unix seconds the hold-down counts from: the last unhealthy reading, or the
    /// first fresh reading after a silence that kept the device out (a healthy
    /// reading before the silence proves nothing about the device after it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_down_from: Option<i64>,
    /// Set when its source answered (or went away) without this device, which was
    /// last seen Failed or Degraded: it is kept, still out, until a fresh reading.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unreported_since: Option<i64>,
    /// The source that reported it.
    pub source: String,
    pub reading: DeviceReading,
}

/// Out of quota and scheduling: the statuses a silence never undoes (invariant 6).
pub fn keeps_out(status: DeviceStatus) -> bool {
    matches!(status, DeviceStatus::Failed | DeviceStatus::Degraded)
}

/// Why nothing fresh speaks for a device any more, and since when (unix seconds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Silence {
    /// Its source is stale, unreachable or unparseable (or has not answered again).
    SourceStale(Option<i64>),
    /// Its source answers, but no longer about this device (or its source is gone).
    Unreported(i64),
}

impl TrackedDevice {
    /// None while a fresh, parseable reading speaks for the device.
    pub fn silence(&self, sources: &BTreeMap<String, SourceState>, now: i64) -> Option<Silence> {
        if let Some(t) = self.unreported_since {
            return Some(Silence::Unreported(t));
        }
        match sources.get(&self.source) {
            None => Some(Silence::Unreported(self.observed_at)),
            Some(s) if s.usable(now) => None,
            Some(s) => Some(Silence::SourceStale(s.silent_since())),
        }
    }

    /// What the device counts as now. A silent device is Unknown (capacity, never an
    /// action), except one last seen Failed or Degraded: it keeps that status, so a
    /// dead exporter never puts a broken device back into quota or its node back
    /// into service. Only fresh healthy readings, held for the hold-down, do.
    pub fn effective_status(
        &self,
        sources: &BTreeMap<String, SourceState>,
        now: i64,
    ) -> DeviceStatus {
        match self.silence(sources, now) {
            Some(_) if !keeps_out(self.status) => DeviceStatus::Unknown,
            _ => self.status,
        }
    }

    /// The status as an operator reads it, e.g. "Failed (last seen
    /// 2026-12-03T14:00:00Z, source stale since 2026-12-03T14:01:00Z)".
    pub fn status_text(&self, sources: &BTreeMap<String, SourceState>, now: i64) -> String {
        let time = crate::k8s::time::rfc3339;
        let why = match self.silence(sources, now) {
            None => return format!("{:?}", self.status),
            Some(Silence::SourceStale(Some(t))) => format!("source stale since {}", time(t)),
            Some(Silence::SourceStale(None)) => "source has not answered".to_string(),
            Some(Silence::Unreported(t)) => format!("not reported since {}", time(t)),
        };
        let seen = time(self.observed_at);
        match self.effective_status(sources, now) {
            DeviceStatus::Unknown => {
                format!("Unknown (last seen {:?} at {seen}, {why})", self.status)
            }
            status => format!("{status:?} (last seen {seen}, {why})"),
        }
    }
}

/// A device as `kaccel run` serves it at `/devices`: the tracked device, what it
/// counts as now, and that in words.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceView {
    #[serde(flatten)]
    pub device: TrackedDevice,
    /// [`TrackedDevice::effective_status`] when served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_status: Option<DeviceStatus>,
    /// [`TrackedDevice::status_text`] when served.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub status_text: String,
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
    /// Unix seconds of the first failed poll since the last success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failing_since: Option<i64>,
    pub stale_after_seconds: i64,
}

impl SourceState {
    /// Fresh and parseable: its readings are trusted. Otherwise its devices are
    /// Unknown (invariant 6: never the last value seen), except those last seen
    /// Failed or Degraded, which stay out ([`TrackedDevice::effective_status`]).
    pub fn usable(&self, now: i64) -> bool {
        self.last_error.is_none()
            && self
                .last_success_at
                .is_some_and(|t| now - t <= self.stale_after_seconds)
    }

    /// When an unusable source stopped speaking for its devices: its first failed
    /// poll, or the moment its last sample went stale, whichever came first. None
    /// for a source that has neither answered nor failed yet.
    pub fn silent_since(&self) -> Option<i64> {
        let stale_at = self
            .last_success_at
            .map(|t| t.saturating_add(self.stale_after_seconds));
        match (self.failing_since, stale_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
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
        // Silent until this answer: what it held out restarts its hold-down here.
        let after_silence = self.sources.get(source).is_some_and(|s| !s.usable(now));
        if let Some(state) = self.sources.get_mut(source) {
            state.last_success_at = Some(now);
            state.last_error = None;
            state.failing_since = None;
        }
        let mut seen = BTreeSet::new();
        for reading in readings {
            let Some(node) = reading.node.clone() else {
                continue;
            };
            let key = (node.clone(), reading.device.clone());
            let (raw, mut reasons) = classify(&reading, policy);
            let previous = self.devices.get(&key);
            let held_before = previous
                .filter(|p| p.status != DeviceStatus::Healthy && p.status != DeviceStatus::Unknown);
            let mut last_unhealthy_at = previous.and_then(|p| p.last_unhealthy_at);
            let mut hold_down_from =
                previous.and_then(|p| p.hold_down_from.or(p.last_unhealthy_at));
            let mut status = raw;
            if raw != DeviceStatus::Healthy {
                last_unhealthy_at = Some(now);
                hold_down_from = Some(now);
            } else if let Some(prev) = held_before {
                if after_silence || prev.unreported_since.is_some() {
                    hold_down_from = Some(now);
                }
                // Times are whole seconds: a difference of exactly `hold_down_seconds`
                // can be as little as `hold_down_seconds - 1` real seconds (bad at
                // x.99, healthy at x+2.00). Hold until the difference exceeds it.
                if let Some(from) = hold_down_from.filter(|t| now - t <= policy.hold_down_seconds) {
                    // Hold-down: a device that just recovered keeps its last bad status.
                    status = prev.status;
                    reasons = vec![format!(
                        "recovering: healthy again, counts from {} (hold-down {}s)",
                        from + policy.hold_down_seconds + 1,
                        policy.hold_down_seconds
                    )];
                }
            }
            seen.insert(key.clone());
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
                    hold_down_from,
                    unreported_since: None,
                    source: source.to_string(),
                    reading,
                },
            );
        }
        // Devices the source no longer reports are forgotten (their group falls back
        // to Unknown for the missing count), except those it last reported out: a
        // device that fell off the bus must not come back by vanishing.
        self.release_unreported(source, now, |k| seen.contains(k));
    }

    /// Forget `source`'s devices (but those `keep` names), except the ones last
    /// seen Failed or Degraded: those stay out, marked unreported since `now`. If
    /// any stays, its healthy siblings stay too (as Unknown), so partitions and
    /// time-share replicas keep being split over the real number of devices.
    fn release_unreported(
        &mut self,
        source: &str,
        now: i64,
        keep: impl Fn(&(String, String)) -> bool,
    ) {
        let mut held_nodes = BTreeSet::new();
        for (k, d) in &mut self.devices {
            if d.source == source && !keep(k) && keeps_out(d.status) {
                d.unreported_since.get_or_insert(now);
                held_nodes.insert(d.node.clone());
            }
        }
        self.devices
            .retain(|k, d| d.source != source || keep(k) || held_nodes.contains(&d.node));
        for (k, d) in &mut self.devices {
            if d.source == source && !keep(k) {
                d.unreported_since.get_or_insert(now);
            }
        }
    }

    /// A source that no longer exists (the exporter pod of a node went away): its
    /// state goes; its devices go too, except what it last reported out.
    pub fn remove_source(&mut self, source: &str, now: i64) {
        self.sources.remove(source);
        self.release_unreported(source, now, |_| false);
    }

    /// A failed scrape (unreachable, bad status, unparseable body) at `now`.
    pub fn fail(&mut self, source: &str, error: String, now: i64) {
        if let Some(state) = self.sources.get_mut(source) {
            state.last_error = Some(error);
            state.failing_since.get_or_insert(now);
        }
    }

    /// Every device with what it counts as at `now` (served at `/devices`).
    pub fn device_views(&self, now: i64) -> Vec<DeviceView> {
        self.devices
            .values()
            .map(|d| DeviceView {
                device: d.clone(),
                effective_status: Some(d.effective_status(&self.sources, now)),
                status_text: d.status_text(&self.sources, now),
            })
            .collect()
    }

    /// The planner's view: per node and device group, devices by status. A device
    /// whose source is stale or failing, or that its source stopped reporting, is
    /// Unknown, unless it was last seen Failed or Degraded: then it stays that
    /// ([`TrackedDevice::effective_status`]). A group no source covers and no
    /// tracked device speaks for keeps the Node's own view (ready, withdrawn devices).
    pub fn snapshot(&self, inventory: &Inventory, now: i64) -> HealthSnapshot {
        let mut snapshot = HealthSnapshot::default();
        for node in inventory.nodes.values() {
            for group in &node.groups {
                let vendor = group.variant.vendor;
                let covered = self
                    .sources
                    .values()
                    .any(|s| s.vendor == Some(vendor) && s.nodes.contains(&node.name));
                let statuses: Vec<DeviceStatus> = self
                    .devices
                    .values()
                    .filter(|d| d.node == node.name && d.vendor == Some(vendor))
                    .map(|d| d.effective_status(&self.sources, now))
                    .collect();
                if !covered && statuses.is_empty() {
                    continue;
                }
                // A whole-device group has at least as many devices as its capacity:
                // those no reading speaks for (one that fell off the bus) are
                // Unknown, never made up from the others' readings.
                let reported = statuses.len() as u32;
                let physical = match group.variant.sharing {
                    SharingMode::Whole => reported.max(group.capacity),
                    _ => reported,
                }
                .max(1) as u64;
                let capacity = u64::from(group.capacity);
                // Partitions and time-share replicas follow their physical device.
                // Bad statuses round up and healthy rounds down, so a failed chip
                // on a node whose devices are split over several groups never
                // disappears in rounding (invariant 1).
                let count = |st: DeviceStatus| statuses.iter().filter(|s| **s == st).count() as u64;
                let up = |n: u64| n.saturating_mul(capacity).div_ceil(physical);
                let failed = up(count(DeviceStatus::Failed)).min(capacity);
                let degraded = up(count(DeviceStatus::Degraded)).min(capacity - failed);
                let warning = up(count(DeviceStatus::Warning)).min(capacity - failed - degraded);
                let healthy = (count(DeviceStatus::Healthy) * capacity / physical)
                    .min(capacity - failed - degraded - warning);
                // What is left (unreported or silent devices, rounding) is Unknown;
                // devices the vendor plugin withdrew are moved out by `counts_for`.
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

/// A watched H100 node of the example fleet, for tests here and in the planner.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// The example H100 node with all 8 GPUs allocatable.
    pub const NODE: &str = "gpu-h100-01";
    /// Its one exporter source.
    pub const SOURCE: &str = "dcgm";
    pub const STALE_AFTER: i64 = 30;

    /// The example fleet's inventory (parsed once: property tests ask often).
    pub fn fleet() -> &'static Inventory {
        static FLEET: std::sync::LazyLock<Inventory> =
            std::sync::LazyLock::new(|| Inventory::from_nodes(&crate::cli::load::examples().nodes));
        &FLEET
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
                // Polls 30 s apart stay fresh: a longer gap would restart the hold-down.
                stale_after_seconds: 45,
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
        let inventory = testing::fleet();
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
        let snap = t.snapshot(inventory, 100);
        for g in &node.groups {
            let c = snap.counts_for(node, g);
            assert!(c.failed >= 1, "{}: {c:?}", g.variant.resource_name);
            assert_eq!(c.total(), g.capacity);
        }
    }
    mod last_known_bad {
        use super::super::testing::{
            NODE, SOURCE, STALE_AFTER, counts, fleet, gpus, silent_poll, watched,
        };
        use super::*;

        const ALL: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];

        fn status(t: &Tracker, device: &str) -> DeviceStatus {
            t.devices[&(NODE.to_string(), device.to_string())].status
        }

        #[test]
        fn a_device_last_seen_failed_stays_out_while_its_source_is_silent() {
            let p = Policy::default();
            let inventory = fleet();
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &[3], &[5]), 100, &p);
            let before = counts(&t, inventory, 100);
            assert_eq!((before.failed, before.degraded, before.healthy), (1, 1, 6));
            // Unreachable, then long stale: the bad two stay out, the rest is Unknown.
            t.fail(SOURCE, "connection refused".into(), 101);
            for now in [101, 100 + 2 * STALE_AFTER, 100_000] {
                let c = counts(&t, inventory, now);
                assert_eq!(
                    (c.failed, c.degraded, c.healthy, c.unknown),
                    (1, 1, 0, 6),
                    "at {now}"
                );
            }
            let d = &t.devices[&(NODE.to_string(), "3".to_string())];
            assert_eq!(
                d.status_text(&t.sources, 200),
                "Failed (last seen 1970-01-01T00:01:40Z, source stale since 1970-01-01T00:01:41Z)"
            );
            let ok = &t.devices[&(NODE.to_string(), "0".to_string())];
            assert_eq!(ok.effective_status(&t.sources, 200), DeviceStatus::Unknown);
            assert!(
                ok.status_text(&t.sources, 200)
                    .starts_with("Unknown (last seen Healthy at 1970-01-01T00:01:40Z"),
                "{}",
                ok.status_text(&t.sources, 200)
            );
        }

        #[test]
        fn a_stale_source_without_errors_holds_the_same() {
            let p = Policy::default();
            let inventory = fleet();
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
            let c = counts(&t, inventory, 100 + STALE_AFTER + 1);
            assert_eq!((c.failed, c.unknown), (1, 7));
            let d = &t.devices[&(NODE.to_string(), "3".to_string())];
            assert!(
                d.status_text(&t.sources, 200)
                    .ends_with("source stale since 1970-01-01T00:02:10Z)"),
                "{}",
                d.status_text(&t.sources, 200)
            );
        }

        #[test]
        fn recovery_after_a_silence_waits_a_full_hold_down() {
            let p = Policy {
                hold_down_seconds: 60,
                ..Default::default()
            };
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
            t.fail(SOURCE, "connection refused".into(), 110);
            // Back long after the hold-down would have ended: the silence proves
            // nothing, so the hold-down starts at the first fresh healthy reading.
            t.observe(SOURCE, gpus(&ALL, &[], &[]), 500, &p);
            assert_eq!(status(&t, "3"), DeviceStatus::Failed);
            assert!(
                t.devices[&(NODE.to_string(), "3".to_string())].reasons[0]
                    .contains("counts from 561")
            );
            for now in [520, 540, 560] {
                t.observe(SOURCE, gpus(&ALL, &[], &[]), now, &p);
                assert_eq!(status(&t, "3"), DeviceStatus::Failed, "at {now}");
            }
            t.observe(SOURCE, gpus(&ALL, &[], &[]), 561, &p);
            assert_eq!(status(&t, "3"), DeviceStatus::Healthy);
            assert_eq!(status(&t, "0"), DeviceStatus::Healthy, "never held");
        }

        #[test]
        fn a_bad_device_its_source_stops_reporting_stays_out() {
            let p = Policy {
                hold_down_seconds: 10,
                ..Default::default()
            };
            let inventory = fleet();
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
            // GPU 3 fell off the bus: the exporter answers for the other seven.
            let others: Vec<u32> = ALL.iter().copied().filter(|i| *i != 3).collect();
            t.observe(SOURCE, gpus(&others, &[], &[]), 101, &p);
            let c = counts(&t, inventory, 101);
            assert_eq!((c.failed, c.healthy, c.unknown), (1, 7, 0));
            let d = &t.devices[&(NODE.to_string(), "3".to_string())];
            assert_eq!(
                d.status_text(&t.sources, 101),
                "Failed (last seen 1970-01-01T00:01:40Z, not reported since 1970-01-01T00:01:41Z)"
            );
            // Back and healthy: out for a full hold-down from its first fresh reading.
            t.observe(SOURCE, gpus(&ALL, &[], &[]), 200, &p);
            assert_eq!(status(&t, "3"), DeviceStatus::Failed);
            t.observe(SOURCE, gpus(&ALL, &[], &[]), 211, &p);
            assert_eq!(status(&t, "3"), DeviceStatus::Healthy);
            // A healthy device that vanishes is forgotten, as before.
            t.observe(SOURCE, gpus(&others, &[], &[]), 212, &p);
            assert!(!t.devices.contains_key(&(NODE.to_string(), "3".to_string())));
        }

        #[test]
        fn a_bad_device_outlives_its_removed_source() {
            let p = Policy::default();
            let inventory = fleet();
            let mut t = watched();
            t.observe(SOURCE, gpus(&ALL, &[3], &[]), 100, &p);
            // The node's exporter pod went away: no source covers the node any more.
            t.remove_source(SOURCE, 150);
            let c = counts(&t, inventory, 150);
            assert_eq!((c.failed, c.unknown), (1, 7), "{c:?}");
            // With nothing bad to remember, the group falls back to the Node's view.
            let mut clean = watched();
            clean.observe(SOURCE, gpus(&ALL, &[], &[]), 100, &p);
            clean.remove_source(SOURCE, 150);
            assert!(clean.devices.is_empty());
            assert_eq!(counts(&clean, inventory, 150).healthy, 8);
        }

        proptest::proptest! {
            /// No sequence of silent polls (unreachable, unparseable, stale, an answer
            /// without the bad devices, the source removed) lowers the bad count.
            #[test]
            fn silence_never_lowers_the_bad_count(
                failed in proptest::collection::btree_set(0u32..8, 0..4),
                degraded in proptest::collection::btree_set(0u32..8, 0..4),
                events in proptest::collection::vec((0u8..4, 1i64..200), 1..12),
            ) {
                let p = Policy::default();
                let inventory = fleet();
                let failed: Vec<u32> = failed.into_iter().collect();
                let degraded: Vec<u32> = degraded.into_iter().collect();
                let mut t = watched();
                t.observe(SOURCE, gpus(&ALL, &failed, &degraded), 100, &p);
                let out = |c: HealthCounts| c.failed + c.degraded;
                let bad = out(counts(&t, inventory, 100));
                let mut now = 100;
                let silenced: Vec<u32> = failed.iter().chain(&degraded).copied().collect();
                for (event, dt) in events {
                    now += dt;
                    silent_poll(&mut t, event, now, &silenced);
                    proptest::prop_assert!(out(counts(&t, inventory, now)) >= bad);
                }
            }
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
