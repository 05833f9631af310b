//! Health as a trend: rules over a window of each device's recent samples.
//!
//! One scrape says little about a card whose correctable ECC count climbs every
//! minute, that resets three times an hour or throttles for an hour: each reading
//! alone is fine. A [`TrendRule`] says "signal, function, window, threshold ->
//! status" (e.g. the increase of the correctable ECC count over 10 minutes reaching
//! 100 makes the card Degraded); [`DeviceHistory`] keeps what the rules need per
//! device and [`DeviceHistory::observe`] turns each new reading into the verdicts of
//! the rules that hold. Pure: time is passed in.
//!
//! Memory is bounded by the rules, not by time or poll rate: each rule keeps a ring of
//! [`BUCKETS`] buckets spanning its window (increase, events or seconds above a level
//! per bucket), so a window always covers between 11/12 of the configured seconds and
//! all of them; a counter keeps only its last value. Samples never accumulate.
//!
//! What a counter does between two samples is read carefully:
//! - the first sample after kaccel starts (or after the device was forgotten) is a
//!   baseline, never an increase: a high but flat count is not a trend;
//! - a counter that falls was reset (exporter or driver restart): the new value is
//!   the new baseline, never a negative or a spike;
//! - an increase seen after a gap longer than the rule's window is not attributed to
//!   the window (it may be older), and a gauge's level only counts for the seconds
//!   since the previous sample up to the source's staleness limit: a gap in samples
//!   is neither hot nor cool, and shares are taken over the seconds observed.

#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use super::DeviceStatus;
use super::exporters::DeviceReading;
use super::policy::Policy;
use crate::api::Vendor;

/// Buckets per rule window.
pub const BUCKETS: usize = 12;
/// Distinct event keys (XIDs, fault codes) a rule remembers per device; a further
/// key replaces the one with the fewest events in the window.
const MAX_KEYS: usize = 4;
/// Resets of every cause count as one key.
const RESETS_KEY: &str = "*";
/// The longest window a rule may have (7 days): a bucket's seconds fit in a u16.
pub const MAX_WINDOW_SECONDS: u32 = 7 * 24 * 3600;

/// A vendor-neutral signal, filled by the vendor adapters (`exporters/vendors.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Signal {
    /// Correctable (single-bit) memory ECC errors: a counter.
    EccCorrectable,
    /// Uncorrectable (double-bit) memory ECC errors: a counter.
    EccUncorrectable,
    /// Memory row remapping waiting for a reset: 1 pending, 0 not.
    RowRemapPending,
    /// Device resets and recoveries: the driver asking for a reset (NVIDIA's GPU
    /// recovery action turning non-zero) and the XIDs that mean one
    /// (`health.policy.resetXids`), counted together.
    Resets,
    /// Device (core / junction) temperature, °C.
    Temperature,
    /// Memory (HBM) temperature, °C.
    MemoryTemperature,
    /// Clocks held down by the hardware (thermal or power slowdown, power brake):
    /// 1 while active, 0 not. Idle, application settings and software power caps
    /// are not degradation and read 0.
    ClockThrottle,
    /// XID errors (NVIDIA), each XID its own key.
    Xid,
    /// Vendor fault / driver error codes (Ascend), each code its own key.
    FaultCode,
}

/// How a signal changes from sample to sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SignalKind {
    /// Only goes up, except when reset.
    Counter,
    /// A level.
    Gauge,
    /// Discrete occurrences, each of a key.
    Event,
}

impl Signal {
    pub const ALL: [Signal; 9] = [
        Signal::EccCorrectable,
        Signal::EccUncorrectable,
        Signal::RowRemapPending,
        Signal::Resets,
        Signal::Temperature,
        Signal::MemoryTemperature,
        Signal::ClockThrottle,
        Signal::Xid,
        Signal::FaultCode,
    ];

    pub fn kind(self) -> SignalKind {
        match self {
            Signal::EccCorrectable | Signal::EccUncorrectable => SignalKind::Counter,
            Signal::RowRemapPending
            | Signal::Temperature
            | Signal::MemoryTemperature
            | Signal::ClockThrottle => SignalKind::Gauge,
            Signal::Resets | Signal::Xid | Signal::FaultCode => SignalKind::Event,
        }
    }

    /// The name used in the config and in verdicts (`eccCorrectable`).
    pub fn name(self) -> &'static str {
        match self {
            Signal::EccCorrectable => "eccCorrectable",
            Signal::EccUncorrectable => "eccUncorrectable",
            Signal::RowRemapPending => "rowRemapPending",
            Signal::Resets => "resets",
            Signal::Temperature => "temperature",
            Signal::MemoryTemperature => "memoryTemperature",
            Signal::ClockThrottle => "clockThrottle",
            Signal::Xid => "xid",
            Signal::FaultCode => "faultCode",
        }
    }

    /// Its value in a reading (counters and gauges).
    pub fn value(self, r: &DeviceReading) -> Option<f64> {
        let flag = |b: Option<bool>| b.map(|b| if b { 1.0 } else { 0.0 });
        match self {
            Signal::EccCorrectable => r.ecc_correctable,
            Signal::EccUncorrectable => r.ecc_uncorrectable,
            Signal::RowRemapPending => flag(r.row_remap_pending),
            Signal::Temperature => r.temperature_c,
            Signal::MemoryTemperature => r.memory_temperature_c,
            Signal::ClockThrottle => flag(r.clock_throttle_active),
            Signal::Resets | Signal::Xid | Signal::FaultCode => None,
        }
        .filter(|v| v.is_finite())
    }

    fn counter_slot(self) -> Option<usize> {
        match self {
            Signal::EccCorrectable => Some(0),
            Signal::EccUncorrectable => Some(1),
            _ => None,
        }
    }
}

/// What a rule computes over its window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Function {
    /// How much a counter rose (resets excluded).
    Increase,
    /// A counter's rise per second over the window.
    Rate,
    /// Occurrences of the same key (the same XID, the same fault code).
    Count,
    /// Seconds the gauge was above `above`.
    DurationAbove,
    /// Share (0..1) of the observed seconds the gauge was above `above`; only once
    /// at least half the window was observed, so one sample is never a share.
    ShareAbove,
    /// The gauge's current value (no window).
    Latest,
}

impl Function {
    fn fits(self, kind: SignalKind) -> bool {
        match self {
            Function::Increase | Function::Rate => kind == SignalKind::Counter,
            Function::Count => kind == SignalKind::Event,
            Function::DurationAbove | Function::ShareAbove => kind == SignalKind::Gauge,
            Function::Latest => kind != SignalKind::Event,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Function::Increase => "increase",
            Function::Rate => "rate",
            Function::Count => "count",
            Function::DurationAbove => "durationAbove",
            Function::ShareAbove => "shareAbove",
            Function::Latest => "latest",
        }
    }
}

/// "signal, function, window, threshold -> status", for some vendors or all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TrendRule {
    /// Unique; named in every verdict.
    pub name: String,
    pub signal: Signal,
    pub function: Function,
    /// The level `durationAbove` and `shareAbove` measure against.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub above: Option<f64>,
    /// The window (ignored by `latest`).
    #[serde(default)]
    pub window_seconds: u32,
    /// The rule holds when the computed value reaches this.
    pub threshold: f64,
    /// The status while it holds: Warning, Degraded or Failed.
    pub status: DeviceStatus,
    /// The vendors it applies to; empty: all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub vendors: Vec<Vendor>,
}

impl TrendRule {
    fn applies_to(&self, vendor: Option<Vendor>) -> bool {
        self.vendors.is_empty() || vendor.is_some_and(|v| self.vendors.contains(&v))
    }

    fn bucket_seconds(&self) -> i64 {
        i64::from(self.window_seconds.div_ceil(BUCKETS as u32).max(1))
    }

    /// Why the rule cannot be used, as (field, what to write instead).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        let name = &self.name;
        if name.is_empty() {
            return Some(("name", "every rule needs a name".into()));
        }
        if !self.function.fits(self.signal.kind()) {
            let fits: Vec<&str> = [
                Function::Increase,
                Function::Rate,
                Function::Count,
                Function::DurationAbove,
                Function::ShareAbove,
                Function::Latest,
            ]
            .into_iter()
            .filter(|f| f.fits(self.signal.kind()))
            .map(Function::name)
            .collect();
            return Some((
                "function",
                format!(
                    "rule {name:?}: {} cannot take {}; use one of {}",
                    self.function.name(),
                    self.signal.name(),
                    fits.join(", ")
                ),
            ));
        }
        let needs_above = matches!(
            self.function,
            Function::DurationAbove | Function::ShareAbove
        );
        match self.above {
            None if needs_above => {
                return Some((
                    "above",
                    format!(
                        "rule {name:?}: {} needs `above`, the level it measures against",
                        self.function.name()
                    ),
                ));
            }
            Some(a) if !a.is_finite() => {
                return Some(("above", format!("rule {name:?}: must be a number")));
            }
            _ => {}
        }
        if self.function != Function::Latest
            && (self.window_seconds == 0 || self.window_seconds > MAX_WINDOW_SECONDS)
        {
            return Some((
                "windowSeconds",
                format!("rule {name:?}: must be 1..{MAX_WINDOW_SECONDS} (7 days)"),
            ));
        }
        if !self.threshold.is_finite()
            || (self.function == Function::ShareAbove
                && !(self.threshold > 0.0 && self.threshold <= 1.0))
        {
            return Some((
                "threshold",
                format!(
                    "rule {name:?}: must be a number{}",
                    if self.function == Function::ShareAbove {
                        " in (0, 1], a share of the window"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if !matches!(
            self.status,
            DeviceStatus::Warning | DeviceStatus::Degraded | DeviceStatus::Failed
        ) {
            return Some((
                "status",
                format!("rule {name:?}: must be Warning, Degraded or Failed"),
            ));
        }
        None
    }
}

/// A rule that holds for a device, with what it measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TrendVerdict {
    pub rule: String,
    pub status: DeviceStatus,
    pub signal: Signal,
    pub function: Function,
    pub window_seconds: u32,
    /// The computed value (an increase, a count, seconds, a share, a level).
    pub value: f64,
    pub threshold: f64,
    /// The XID or fault code that recurred (`count` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The vendor's own metric names the signal was read from.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
}

impl TrendVerdict {
    /// One line for reasons, e.g. "rule correctable-ecc-rising: increase of
    /// eccCorrectable (DCGM_FI_DEV_ECC_SBE_VOL_TOTAL) over 600s = 140 >= 100".
    pub fn reason(&self) -> String {
        let what = match &self.key {
            Some(key) => format!("{} {key}", self.signal.name()),
            None => self.signal.name().to_string(),
        };
        let fields = if self.fields.is_empty() {
            String::new()
        } else {
            format!(" ({})", self.fields.join(", "))
        };
        let window = if self.function == Function::Latest {
            String::new()
        } else {
            format!(" over {}s", self.window_seconds)
        };
        format!(
            "rule {}: {} of {what}{fields}{window} = {} >= {}",
            self.rule,
            self.function.name(),
            crate::health::prom::format_value(round3(self.value)),
            crate::health::prom::format_value(self.threshold)
        )
    }
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

/// A window as [`BUCKETS`] buckets, the newest numbered `head` (time / bucket width).
#[derive(Clone, Debug, Default, PartialEq)]
struct Ring {
    head: i64,
    amount: [f32; BUCKETS],
    /// Seconds observed per bucket (`shareAbove` divides by them).
    observed: [u16; BUCKETS],
}

impl Ring {
    /// Move to bucket `bucket`, emptying the buckets that fell out of the window. A
    /// clock that goes back keeps adding to the newest bucket.
    fn advance(&mut self, bucket: i64) {
        if bucket <= self.head {
            return;
        }
        let steps = (bucket - self.head).min(BUCKETS as i64);
        for step in 1..=steps {
            let slot = (self.head + step).rem_euclid(BUCKETS as i64) as usize;
            self.amount[slot] = 0.0;
            self.observed[slot] = 0;
        }
        self.head = bucket;
    }

    fn add(&mut self, amount: f64, observed: i64) {
        let slot = self.head.rem_euclid(BUCKETS as i64) as usize;
        self.amount[slot] += amount as f32;
        self.observed[slot] = self.observed[slot].saturating_add(observed.clamp(0, 65535) as u16);
    }

    fn total(&self) -> f64 {
        self.amount.iter().map(|a| f64::from(*a)).sum()
    }

    fn observed_seconds(&self) -> i64 {
        self.observed.iter().map(|s| i64::from(*s)).sum()
    }
}

/// A rule's memory for one device.
#[derive(Clone, Debug, PartialEq)]
enum RuleState {
    /// Rules with no window (`latest`) or that do not apply to the device.
    None,
    /// Boxed: a device's rules that have not started yet (or never apply to it)
    /// cost a pointer, not a ring.
    Window(Box<Ring>),
    /// `count`: one ring per key seen (at most [`MAX_KEYS`]).
    Keyed(Vec<(String, Ring)>),
}

/// What the rules remember of one device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceHistory {
    /// Unix seconds of the previous reading.
    last_at: Option<i64>,
    /// Each counter signal's last value.
    counters: [Option<CounterMemory>; 2],
    /// Previous event state: the last XID, per-XID counts, fault codes present, the
    /// recovery action asked for.
    last_xid: Option<u64>,
    recovery_action: Option<u64>,
    xid_counts: Vec<(u64, f64)>,
    fault_codes: Vec<String>,
    /// Index-aligned with the rules it was built for.
    rules: Box<[RuleState]>,
}

/// A counter's last value, and the value it had before it last fell.
#[derive(Clone, Copy, Debug, PartialEq)]
struct CounterMemory {
    at: i64,
    value: f64,
    /// Set by a fall (a reset), cleared once the counter is past it again.
    before_fall: Option<f64>,
}

impl CounterMemory {
    /// The rise from this memory to `value`. A fall is a reset: the new value is the
    /// new baseline. A counter that comes back to where it was before a fall was
    /// restarted by what reads it (an exporter answering 0 before its first poll),
    /// not new errors: only what lies beyond the old value counts.
    fn rise_to(&mut self, value: f64, now: i64) -> f64 {
        let rise = if value < self.value {
            self.before_fall = Some(self.before_fall.unwrap_or(0.0).max(self.value));
            0.0
        } else {
            match self.before_fall {
                Some(old) if value >= old => {
                    self.before_fall = None;
                    value - old
                }
                _ => value - self.value,
            }
        };
        self.at = now;
        self.value = value;
        rise
    }
}

/// What one reading changed: counter rises, events per key.
struct Step {
    /// Seconds since the previous reading (None: first reading, or a gap longer
    /// than the source's staleness limit).
    interval: Option<i64>,
    /// Per counter slot: (rise, seconds since that counter's previous value).
    rises: [Option<(f64, i64)>; 2],
    xid_events: Vec<(String, f64)>,
    fault_events: Vec<(String, f64)>,
    reset_events: f64,
}

impl DeviceHistory {
    /// Take in one reading at `now` and return the rules that hold. `max_gap` is the
    /// source's staleness limit: a longer gap counts as no observation.
    pub fn observe(
        &mut self,
        reading: &DeviceReading,
        now: i64,
        policy: &Policy,
        max_gap: i64,
    ) -> Vec<TrendVerdict> {
        let rules = &policy.trend_rules;
        if self.rules.len() != rules.len() {
            self.rules = vec![RuleState::None; rules.len()].into_boxed_slice();
        }
        let step = self.step(reading, now, max_gap, policy);
        let mut verdicts = Vec::new();
        for (rule, state) in rules.iter().zip(self.rules.iter_mut()) {
            if !rule.applies_to(reading.vendor) {
                continue;
            }
            let Some((value, key)) = update(rule, state, &step, reading, now) else {
                continue;
            };
            if value >= rule.threshold {
                verdicts.push(TrendVerdict {
                    rule: rule.name.clone(),
                    status: rule.status,
                    signal: rule.signal,
                    function: rule.function,
                    window_seconds: rule.window_seconds,
                    value,
                    threshold: rule.threshold,
                    key,
                    fields: reading
                        .signal_fields
                        .get(rule.signal.name())
                        .map(|fields| fields.iter().map(|f| f.to_string()).collect())
                        .unwrap_or_default(),
                });
            }
        }
        verdicts
    }

    fn step(&mut self, r: &DeviceReading, now: i64, max_gap: i64, policy: &Policy) -> Step {
        let had_previous = self.last_at.is_some();
        let interval = self
            .last_at
            .map(|t| now - t)
            .filter(|gap| *gap > 0 && *gap <= max_gap);
        if self.last_at.is_none_or(|t| now > t) {
            self.last_at = Some(now);
        }
        let mut rises = [None; 2];
        for signal in [Signal::EccCorrectable, Signal::EccUncorrectable] {
            let slot = signal.counter_slot().expect("a counter");
            let Some(value) = signal.value(r) else {
                continue;
            };
            match &mut self.counters[slot] {
                Some(memory) if now > memory.at => {
                    let since = now - memory.at;
                    rises[slot] = Some((memory.rise_to(value, now), since));
                }
                Some(_) => {}
                // The first value is a baseline, never a rise.
                None => {
                    self.counters[slot] = Some(CounterMemory {
                        at: now,
                        value,
                        before_fall: None,
                    })
                }
            }
        }
        let xid_events = self.xid_events(r, &policy.ignored_xids);
        let fault_events = self.fault_events(r, had_previous);
        let mut reset_events: f64 = xid_events
            .iter()
            .filter(|(xid, _)| {
                xid.parse::<u64>()
                    .is_ok_and(|x| policy.reset_xids.contains(&x))
            })
            .map(|(_, n)| n)
            .sum();
        if let Some(action) = r.recovery_action {
            // Each new request for a recovery is one.
            if self.recovery_action.is_some_and(|before| before != action) && action != 0 {
                reset_events += 1.0;
            }
            self.recovery_action = Some(action);
        }
        Step {
            interval,
            rises,
            xid_events,
            fault_events,
            reset_events,
        }
    }

    /// XIDs that occurred since the previous reading: from the exporter's per-XID
    /// counts where it publishes them (a rise is new occurrences), else from the
    /// last-XID value changing to a new non-zero XID.
    fn xid_events(&mut self, r: &DeviceReading, ignored: &[u64]) -> Vec<(String, f64)> {
        let mut events = Vec::new();
        if !r.xid_counts.is_empty() {
            for (xid, count) in &r.xid_counts {
                let before = self
                    .xid_counts
                    .iter()
                    .find(|(x, _)| x == xid)
                    .map(|(_, c)| *c);
                if let Some(before) = before
                    && *count > before
                    && !ignored.contains(xid)
                {
                    events.push((xid.to_string(), count - before));
                }
            }
            // Keep the counts of this reading (bounded by what the exporter lists).
            self.xid_counts = r
                .xid_counts
                .iter()
                .map(|(x, c)| (*x, *c))
                .take(32)
                .collect();
        } else if let Some(xid) = r.last_xid {
            if self.last_xid.is_some_and(|before| before != xid)
                && xid != 0
                && !ignored.contains(&xid)
            {
                events.push((xid.to_string(), 1.0));
            }
            self.last_xid = Some(xid);
        }
        events
    }

    /// Fault codes present now that were absent in the previous reading.
    fn fault_events(&mut self, r: &DeviceReading, had_previous: bool) -> Vec<(String, f64)> {
        let events = if had_previous {
            r.error_codes
                .iter()
                .filter(|c| !self.fault_codes.contains(c))
                .map(|c| (c.clone(), 1.0))
                .collect()
        } else {
            Vec::new()
        };
        self.fault_codes = r.error_codes.iter().take(16).cloned().collect();
        events
    }
}

/// Feed one step into a rule's state; its current value (and key) when it has one.
fn update(
    rule: &TrendRule,
    state: &mut RuleState,
    step: &Step,
    reading: &DeviceReading,
    now: i64,
) -> Option<(f64, Option<String>)> {
    if rule.function == Function::Latest {
        return rule.signal.value(reading).map(|v| (v, None));
    }
    let width = rule.bucket_seconds();
    let bucket = now.div_euclid(width);
    let window = i64::from(rule.window_seconds);
    if rule.function == Function::Count {
        if !matches!(state, RuleState::Keyed(_)) {
            *state = RuleState::Keyed(Vec::new());
        }
        let RuleState::Keyed(rings) = state else {
            unreachable!("set above")
        };
        let resets;
        let events = match rule.signal {
            Signal::Xid => &step.xid_events,
            Signal::Resets => {
                resets = (step.reset_events > 0.0)
                    .then(|| (RESETS_KEY.to_string(), step.reset_events))
                    .into_iter()
                    .collect::<Vec<_>>();
                &resets
            }
            _ => &step.fault_events,
        };
        for ring in rings.iter_mut() {
            ring.1.advance(bucket);
        }
        for (key, n) in events {
            let at = match rings.iter().position(|(k, _)| k == key) {
                Some(i) => i,
                None => {
                    let fresh = Ring {
                        head: bucket,
                        ..Default::default()
                    };
                    if rings.len() < MAX_KEYS {
                        rings.push((key.clone(), fresh));
                        rings.len() - 1
                    } else {
                        let quietest = (0..rings.len())
                            .min_by(|a, b| rings[*a].1.total().total_cmp(&rings[*b].1.total()))
                            .expect("MAX_KEYS > 0");
                        rings[quietest] = (key.clone(), fresh);
                        quietest
                    }
                }
            };
            let ring = &mut rings[at].1;
            ring.add(*n, 0);
        }
        rings.retain(|(_, ring)| ring.total() > 0.0);
        if rings.is_empty() {
            // Give the memory back: most devices never see an XID.
            *rings = Vec::new();
        }
        return rings
            .iter()
            .map(|(key, ring)| (ring.total(), key))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(total, key)| (total, (key != RESETS_KEY).then(|| key.clone())));
    }
    if !matches!(state, RuleState::Window(_)) {
        *state = RuleState::Window(Box::new(Ring {
            head: bucket,
            ..Default::default()
        }));
    }
    let RuleState::Window(ring) = state else {
        unreachable!("set above")
    };
    ring.advance(bucket);
    match rule.function {
        Function::Increase | Function::Rate => {
            let slot = rule.signal.counter_slot()?;
            // A rise seen after a gap longer than the window may be older than it.
            if let Some((rise, gap)) = step.rises[slot].filter(|(_, gap)| *gap <= window) {
                ring.add(rise, gap);
            }
            let increase = ring.total();
            Some(match rule.function {
                Function::Rate => (increase / window as f64, None),
                _ => (increase, None),
            })
        }
        _ => {
            let level = rule.above.unwrap_or(0.0);
            if let (Some(seconds), Some(value)) = (step.interval, rule.signal.value(reading)) {
                let above = if value > level { seconds as f64 } else { 0.0 };
                ring.add(above, seconds);
            }
            let above = ring.total();
            if rule.function == Function::DurationAbove {
                return Some((above, None));
            }
            let observed = ring.observed_seconds();
            (observed > 0 && observed * 2 >= window).then(|| (above / observed as f64, None))
        }
    }
}

/// The rules kaccel starts with. Windows and thresholds follow what an SRE pages on;
/// every one can be replaced in `health.policy.trendRules`.
pub fn default_rules() -> Vec<TrendRule> {
    let rule = |name: &str,
                signal,
                function,
                above,
                window_seconds,
                threshold,
                status,
                vendors: &[Vendor]| TrendRule {
        name: name.into(),
        signal,
        function,
        above,
        window_seconds,
        threshold,
        status,
        vendors: vendors.to_vec(),
    };
    use DeviceStatus::{Degraded, Failed, Warning};
    use Function::{Count, DurationAbove, Increase, Latest, ShareAbove};
    use Signal::*;
    vec![
        // Single-bit errors are corrected, but a count that climbs is memory failing.
        rule(
            "correctable-ecc-rising",
            EccCorrectable,
            Increase,
            None,
            600,
            100.0,
            Degraded,
            &[],
        ),
        // Rows wait for a reset to be remapped: avoid the card for new work.
        rule(
            "row-remap-pending",
            RowRemapPending,
            Latest,
            None,
            0,
            1.0,
            Warning,
            &[],
        ),
        // A card that keeps resetting is not coming back by itself.
        rule(
            "repeated-resets",
            Resets,
            Count,
            None,
            3600,
            3.0,
            Failed,
            &[],
        ),
        // Hot for most of ten minutes, not one sample. AMD reads the junction
        // (hotspot), which runs hotter than NVIDIA's core temperature.
        rule(
            "sustained-heat",
            Temperature,
            DurationAbove,
            Some(85.0),
            600,
            480.0,
            Degraded,
            &[Vendor::Nvidia, Vendor::Huawei, Vendor::Intel],
        ),
        rule(
            "sustained-heat-junction",
            Temperature,
            DurationAbove,
            Some(100.0),
            600,
            480.0,
            Degraded,
            &[Vendor::Amd],
        ),
        // Hardware slowdown for half an hour: slower than its flavor promises.
        rule(
            "clock-throttled",
            ClockThrottle,
            ShareAbove,
            Some(0.0),
            3600,
            0.5,
            Warning,
            &[],
        ),
        // The same XID or fault code again and again.
        rule(
            "recurring-xid",
            Xid,
            Count,
            None,
            3600,
            3.0,
            Degraded,
            &[Vendor::Nvidia],
        ),
        rule(
            "recurring-fault-code",
            FaultCode,
            Count,
            None,
            3600,
            3.0,
            Degraded,
            &[],
        ),
    ]
}
