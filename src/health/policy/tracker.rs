//! Device health over time: tracked devices, sources, hysteresis, and the planner's snapshot.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Policy, classify};
use crate::api::{HealthCounts, SharingMode, Vendor};
use crate::health::exporters::DeviceReading;
use crate::health::exporters::PodRef;
use crate::health::trend::{DeviceHistory, TrendVerdict};
use crate::health::{DeviceStatus, HealthSnapshot};
use crate::inventory::holders::{ClaimedDevice, DraDeviceId, Holder};
use crate::inventory::{ByIdentity, Inventory};

/// Status changes kept per device (for `kaccel inventory --device`).
pub const TRANSITIONS_KEPT: usize = 16;

/// A device's status changed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Transition {
    /// Unix seconds.
    pub at: i64,
    /// None: first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<DeviceStatus>,
    pub to: DeviceStatus,
    pub reasons: Vec<String>,
}

/// Record a status change (a first sighting only when not Healthy), keeping the last
/// [`TRANSITIONS_KEPT`].
fn note_transition(
    transitions: &mut Vec<Transition>,
    from: Option<DeviceStatus>,
    to: DeviceStatus,
    reasons: &[String],
    at: i64,
) {
    if from == Some(to) || (from.is_none() && to == DeviceStatus::Healthy) {
        return;
    }
    if transitions.len() == TRANSITIONS_KEPT {
        transitions.remove(0);
    }
    transitions.push(Transition {
        at,
        from,
        to,
        reasons: reasons.to_vec(),
    });
}

/// What one reading makes of a device, given what it was.
struct Judged {
    status: DeviceStatus,
    reasons: Vec<String>,
    verdicts: Vec<TrendVerdict>,
    last_unhealthy_at: Option<i64>,
    hold_down_from: Option<i64>,
}

/// The status a reading calls for (`raw` and its reasons from [`classify`], raised by
/// the trend `verdicts`), with hysteresis: a device that was bad and reads healthy
/// keeps its last bad status through the hold-down.
fn judge(
    previous: Option<&TrackedDevice>,
    mut raw: DeviceStatus,
    mut reasons: Vec<String>,
    verdicts: Vec<TrendVerdict>,
    now: i64,
    policy: &Policy,
    after_silence: bool,
) -> Judged {
    for verdict in &verdicts {
        raw = super::worse(raw, verdict.status);
        reasons.push(verdict.reason());
    }
    let held_before =
        previous.filter(|p| p.status != DeviceStatus::Healthy && p.status != DeviceStatus::Unknown);
    let mut last_unhealthy_at = previous.and_then(|p| p.last_unhealthy_at);
    let mut hold_down_from = previous.and_then(|p| p.hold_down_from.or(p.last_unhealthy_at));
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
    Judged {
        status,
        reasons,
        verdicts,
        last_unhealthy_at,
        hold_down_from,
    }
}

/// A source with no state (tests, `kaccel inventory`) trusts gaps up to this long.
const DEFAULT_MAX_GAP_SECONDS: i64 = 60;

/// One device's tracked health.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrackedDevice {
    pub node: String,
    pub vendor: Option<Vendor>,
    pub device: String,
    pub status: DeviceStatus,
    pub reasons: Vec<String>,
    /// The trend rules that hold for it ([`crate::health::trend`]), with what they
    /// measured and the vendor fields they read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub verdicts: Vec<TrendVerdict>,
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
    /// Its last status changes, oldest first (at most [`TRANSITIONS_KEPT`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transitions: Vec<Transition>,
    /// What the trend rules remember of it; goes with the device.
    #[serde(skip)]
    pub history: DeviceHistory,
    /// The [`Tracker::observe`] call that last reported it (its source's answer).
    #[serde(skip)]
    seen_in: u64,
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
    /// The pod holding it (as its exporter says, or the pod its ResourceClaim is
    /// reserved for) and that pod's Workload, ClusterQueue and team where kaccel
    /// resolved them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<Holder>,
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

/// Source -> the (node, device) keys of its devices (`Tracker::by_source`).
type DevicesBySource = BTreeMap<String, BTreeSet<(String, String)>>;

/// `key` joins `source`'s devices.
fn index(by_source: &mut DevicesBySource, source: &str, key: &(String, String)) {
    by_source
        .entry(source.to_string())
        .or_default()
        .insert(key.clone());
}

/// `key` leaves `source`'s devices; a source left without any leaves the index.
fn unindex(by_source: &mut DevicesBySource, source: &str, key: &(String, String)) {
    if let Some(keys) = by_source.get_mut(source) {
        keys.remove(key);
        if keys.is_empty() {
            by_source.remove(source);
        }
    }
}

/// Device health over time, with hysteresis.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    /// (node, device) -> tracked device. Read freely; changed only by the
    /// tracker's own methods, which keep `by_source` in step. Boxed: a tracked
    /// device is about 900 bytes, and the map's nodes hold 11 entries each, most
    /// half empty, so inline the map took 1.7 KB per device (7 MB at 4,000).
    pub devices: BTreeMap<(String, String), Box<TrackedDevice>>,
    /// Source -> the keys of its devices: a poll of one exporter visits its own
    /// devices, not the fleet's.
    by_source: DevicesBySource,
    pub sources: BTreeMap<String, SourceState>,
    /// What kaccel found about the pods exporters attribute devices to, by
    /// (namespace, pod); filled by the controller's holder resolver.
    pub holders: BTreeMap<(String, String), Holder>,
    /// DRA devices allocated through ResourceClaims that pods hold (set by the
    /// controller's holder resolver), and how to find them from a tracked device.
    claimed: BTreeMap<DraDeviceId, ClaimedDevice>,
    claimed_index: ByIdentity<DraDeviceId>,
    /// Counts [`Tracker::observe`] calls: a device whose `seen_in` is the current
    /// one was in the answer being read.
    generation: u64,
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
        // A gap in samples longer than this is no observation (trend rules).
        let max_gap = self
            .sources
            .get(source)
            .map_or(DEFAULT_MAX_GAP_SECONDS, |s| s.stale_after_seconds.max(1));
        if let Some(state) = self.sources.get_mut(source) {
            state.last_success_at = Some(now);
            state.last_error = None;
            state.failing_since = None;
        }
        self.generation += 1;
        let generation = self.generation;
        for reading in readings {
            let Some(node) = reading.node.clone() else {
                continue;
            };
            let key = (node, reading.device.clone());
            let (raw, reasons) = classify(&reading, policy);
            // A device seen before is updated in place: its strings, history and
            // map slot are reused, which is most of a poll's work at fleet scale.
            if let Some(d) = self.devices.get_mut(&key) {
                let verdicts = d.history.observe(&reading, now, policy, max_gap);
                let judged = judge(Some(d), raw, reasons, verdicts, now, policy, after_silence);
                note_transition(
                    &mut d.transitions,
                    Some(d.status),
                    judged.status,
                    &judged.reasons,
                    now,
                );
                d.vendor = reading.vendor;
                d.status = judged.status;
                d.reasons = judged.reasons;
                d.verdicts = judged.verdicts;
                d.observed_at = now;
                d.last_unhealthy_at = judged.last_unhealthy_at;
                d.hold_down_from = judged.hold_down_from;
                d.unreported_since = None;
                if d.source != source {
                    unindex(&mut self.by_source, &d.source, &key);
                    index(&mut self.by_source, source, &key);
                    d.source = source.to_string();
                }
                d.reading = reading;
                d.seen_in = generation;
                continue;
            }
            let mut history = DeviceHistory::default();
            let verdicts = history.observe(&reading, now, policy, max_gap);
            let judged = judge(None, raw, reasons, verdicts, now, policy, after_silence);
            let mut transitions = Vec::new();
            note_transition(&mut transitions, None, judged.status, &judged.reasons, now);
            let device = TrackedDevice {
                node: key.0.clone(),
                vendor: reading.vendor,
                device: reading.device.clone(),
                status: judged.status,
                reasons: judged.reasons,
                verdicts: judged.verdicts,
                observed_at: now,
                last_unhealthy_at: judged.last_unhealthy_at,
                hold_down_from: judged.hold_down_from,
                unreported_since: None,
                source: source.to_string(),
                reading,
                transitions,
                history,
                seen_in: generation,
            };
            index(&mut self.by_source, source, &key);
            self.devices.insert(key, Box::new(device));
        }
        // Devices the source no longer reports are forgotten (their group falls back
        // to Unknown for the missing count), except those it last reported out: a
        // device that fell off the bus must not come back by vanishing.
        self.release_unreported(source, now, |d| d.seen_in == generation);
    }

    /// Forget `source`'s devices (but those `keep` names), except the ones last
    /// seen Failed or Degraded: those stay out, marked unreported since `now`. If
    /// any stays, its healthy siblings stay too (as Unknown), so partitions and
    /// time-share replicas keep being split over the real number of devices.
    fn release_unreported(
        &mut self,
        source: &str,
        now: i64,
        keep: impl Fn(&TrackedDevice) -> bool,
    ) {
        let Some(keys) = self.by_source.get_mut(source) else {
            return;
        };
        let mut held_nodes = BTreeSet::new();
        for key in keys.iter() {
            if let Some(d) = self.devices.get(key)
                && !keep(d)
                && keeps_out(d.status)
            {
                held_nodes.insert(d.node.clone());
            }
        }
        keys.retain(|key| {
            let Some(d) = self.devices.get_mut(key) else {
                return false;
            };
            if keep(d) {
                return true;
            }
            if !held_nodes.contains(&d.node) {
                self.devices.remove(key);
                return false;
            }
            d.unreported_since.get_or_insert(now);
            true
        });
        if keys.is_empty() {
            self.by_source.remove(source);
        }
    }

    /// Whether `by_source` names exactly the devices each source holds.
    #[cfg(test)]
    pub(crate) fn source_index_is_exact(&self) -> bool {
        let mut expected = DevicesBySource::new();
        for (key, d) in &self.devices {
            expected
                .entry(d.source.clone())
                .or_default()
                .insert(key.clone());
        }
        expected == self.by_source
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
                device: (**d).clone(),
                effective_status: Some(d.effective_status(&self.sources, now)),
                status_text: d.status_text(&self.sources, now),
                holder: self.holder_of(d),
            })
            .collect()
    }

    /// Replace what ResourceClaims say DRA devices are held by.
    pub fn set_claimed(&mut self, claimed: BTreeMap<DraDeviceId, ClaimedDevice>) {
        self.claimed_index = ByIdentity::new(claimed.values().filter_map(|c| {
            Some((
                c.ids.node.as_deref()?,
                c.ids.uuid.as_deref(),
                c.ids.pci_address.as_deref(),
                c.id.clone(),
            ))
        }));
        self.claimed = claimed;
    }

    /// The claim a tracked device was allocated through, matched by node and
    /// UUID, else PCI address.
    fn claim_of(&self, d: &TrackedDevice) -> Option<&ClaimedDevice> {
        let id = self.claimed_index.get(
            &d.node,
            d.reading.uuid.as_deref(),
            d.reading.pci_bus_id.as_deref(),
        )?;
        self.claimed.get(id)
    }

    /// The pod holding a device: the exporter's attribution, else the first pod
    /// of the ResourceClaim it was allocated through (with that claim).
    fn pod_of(&self, d: &TrackedDevice) -> Option<(PodRef, Option<&ClaimedDevice>)> {
        if let Some(pod) = &d.reading.pod {
            return Some((pod.clone(), None));
        }
        let c = self.claim_of(d)?;
        let pod = PodRef {
            namespace: c.namespace.clone(),
            name: c.pods.first()?.clone(),
            container: None,
        };
        Some((pod, Some(c)))
    }

    /// The holder of a device: the exporter's pod, or the pod of its
    /// ResourceClaim, with what the resolver found.
    pub fn holder_of(&self, d: &TrackedDevice) -> Option<Holder> {
        let (pod, claim) = self.pod_of(d)?;
        Some(self.holder_of_pod(&pod, claim.map(|c| c.claim.clone())))
    }

    fn holder_of_pod(&self, pod: &PodRef, claim: Option<String>) -> Holder {
        let mut holder = self
            .holders
            .get(&(pod.namespace.clone(), pod.name.clone()))
            .cloned()
            .unwrap_or_else(|| Holder {
                namespace: pod.namespace.clone(),
                pod: pod.name.clone(),
                unresolved: Some("not looked up yet".into()),
                ..Default::default()
            });
        holder.container = pod.container.clone();
        holder.claim = claim;
        holder
    }

    /// The devices (UUIDs, else the exporter's id, else a DRA device's
    /// driver/pool/device) the pods of a Workload hold now, as exporters attribute
    /// them or ResourceClaims allocate them, tied to it by the resolver; sorted. A
    /// claimed device the exporter also reports goes by the exporter's name for it,
    /// as it does when the exporter attributes it.
    pub fn devices_held_by(&self, namespace: &str, workload: &str) -> Vec<String> {
        let runs_it = |pod: &str| {
            self.holders
                .get(&(namespace.to_string(), pod.to_string()))
                .is_some_and(|h| h.workload.as_deref() == Some(workload))
        };
        let mut held = Vec::new();
        let mut reported = BTreeSet::new();
        for d in self.devices.values() {
            let Some((pod, claim)) = self.pod_of(d) else {
                continue;
            };
            if let Some(c) = claim {
                reported.insert(&c.id);
            }
            if pod.namespace == namespace && runs_it(&pod.name) {
                held.push(d.reading.uuid.clone().unwrap_or_else(|| d.device.clone()));
            }
        }
        held.extend(
            self.claimed
                .values()
                .filter(|c| !reported.contains(&c.id) && c.namespace == namespace)
                .filter(|c| c.pods.iter().any(|p| runs_it(p)))
                .map(ClaimedDevice::ledger_id),
        );
        held.retain(|id| !id.is_empty() && !id.contains([',', ';', ' ']));
        held.sort();
        held.dedup();
        held
    }

    /// The pods exporters attribute devices to and ResourceClaims are reserved
    /// for now, as (namespace, pod).
    pub fn attributed_pods(&self) -> BTreeSet<(String, String)> {
        let attributed = self
            .devices
            .values()
            .filter_map(|d| d.reading.pod.as_ref())
            .map(|p| (p.namespace.clone(), p.name.clone()));
        let claimed = self
            .claimed
            .values()
            .flat_map(|c| c.pods.iter().map(|p| (c.namespace.clone(), p.clone())));
        attributed.chain(claimed).collect()
    }

    /// The sources that have neither answered nor failed yet (just configured).
    pub fn unanswered_sources(&self) -> Vec<String> {
        self.sources
            .values()
            .filter(|s| {
                s.last_success_at.is_none() && s.failing_since.is_none() && s.last_error.is_none()
            })
            .map(|s| s.name.clone())
            .collect()
    }

    /// The planner's view: per node and device group, devices by status. A device
    /// whose source is stale or failing, or that its source stopped reporting, is
    /// Unknown, unless it was last seen Failed or Degraded: then it stays that
    /// ([`TrackedDevice::effective_status`]). A group no source covers and no
    /// tracked device speaks for keeps the Node's own view (ready, withdrawn devices).
    pub fn snapshot(&self, inventory: &Inventory, now: i64) -> HealthSnapshot {
        let mut snapshot = HealthSnapshot::default();
        // (node, vendor) a source speaks for, once: looked up per device group.
        let covered_nodes: std::collections::HashSet<(&str, Vendor)> = self
            .sources
            .values()
            .filter_map(|s| Some((s, s.vendor?)))
            .flat_map(|(s, vendor)| s.nodes.iter().map(move |n| (n.as_str(), vendor)))
            .collect();
        // Only a node a source covers or a tracked device sits on can show more
        // than the Node's own view: those are visited, not the fleet's (500 of
        // 5,000 nodes in the fleet bench, at each re-plan). Devices are keyed by
        // (node, device), so one walk groups each node's.
        let mut watched: BTreeMap<&str, Vec<&TrackedDevice>> = BTreeMap::new();
        for ((node, _), device) in &self.devices {
            watched.entry(node.as_str()).or_default().push(&**device);
        }
        for &(node, _) in &covered_nodes {
            watched.entry(node).or_default();
        }
        for (name, node_devices) in watched {
            let Some(node) = inventory.nodes.get(name) else {
                continue;
            };
            for group in &node.groups {
                let vendor = group.variant.vendor;
                let covered = covered_nodes.contains(&(node.name.as_str(), vendor));
                let mut rules = BTreeSet::new();
                let mut firmware: BTreeMap<String, u32> = BTreeMap::new();
                let statuses: Vec<DeviceStatus> = node_devices
                    .iter()
                    .filter(|d| d.vendor == Some(vendor))
                    .inspect(|d| {
                        if let Some(v) = &d.reading.firmware_version {
                            *firmware.entry(v.clone()).or_default() += 1;
                        }
                    })
                    .map(|d| {
                        let status = d.effective_status(&self.sources, now);
                        if !matches!(status, DeviceStatus::Healthy | DeviceStatus::Unknown) {
                            rules.extend(d.verdicts.iter().map(|v| v.rule.clone()));
                        }
                        status
                    })
                    .collect();
                if !rules.is_empty() {
                    snapshot
                        .trend_rules
                        .entry(node.name.clone())
                        .or_default()
                        .insert(group.variant.resource_name.clone(), rules);
                }
                if !firmware.is_empty() {
                    snapshot
                        .firmware
                        .entry(node.name.clone())
                        .or_default()
                        .insert(group.variant.resource_name.clone(), firmware);
                }
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
