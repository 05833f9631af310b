//! From readings to a status, with reasons and hysteresis; from statuses and source
//! states to the planner's [`HealthSnapshot`](super::HealthSnapshot). Pure: time is
//! passed in.
//!
//! This file holds the rules from one reading to a status ([`Policy`],
//! [`classify`]); tracking statuses over time (hysteresis, silent sources, the
//! snapshot) is `policy/tracker.rs`, node conditions on top are
//! `policy/node_conditions.rs`.

mod node_conditions;
mod tracker;

#[cfg(test)]
pub(crate) mod testing;
#[cfg(test)]
mod tests;

use serde::{Deserialize, Serialize};

use super::DeviceStatus;
use super::exporters::DeviceReading;
use super::trend::{TrendRule, default_rules};

pub use node_conditions::{NodeConditionRule, apply_node_conditions, default_node_condition_rules};
pub use tracker::{
    DeviceView, Silence, SourceState, TRANSITIONS_KEPT, TrackedDevice, Tracker, Transition,
    keeps_out,
};

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
    /// XIDs that mean the device was reset or recovered (fallen off the bus,
    /// contained and uncontained ECC errors): counted by `resets` trend rules.
    pub reset_xids: Vec<u64>,
    /// A device must read healthy this long (seconds) before it counts again; after
    /// a silence, counted from the first fresh reading.
    pub hold_down_seconds: i64,
    /// Rules over a window of samples (rising ECC counts, repeated resets, sustained
    /// heat, throttling, recurring XIDs): the list replaces the defaults whole.
    pub trend_rules: Vec<TrendRule>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            warning_temperature_c: 85.0,
            degraded_temperature_c: 95.0,
            memory_warning_temperature_c: 95.0,
            ignored_xids: vec![13, 31, 43, 45, 68, 109],
            failed_xids: vec![48, 63, 64, 74, 79, 92, 94, 95, 119, 120],
            reset_xids: vec![79, 94, 95],
            hold_down_seconds: 120,
            trend_rules: default_rules(),
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

/// The worse of two statuses.
pub fn worse(a: DeviceStatus, b: DeviceStatus) -> DeviceStatus {
    if severity(b) > severity(a) { b } else { a }
}

/// The status one reading calls for, with every reason that applies.
pub fn classify(reading: &DeviceReading, policy: &Policy) -> (DeviceStatus, Vec<String>) {
    let mut status = DeviceStatus::Healthy;
    let mut reasons = Vec::new();
    let mut raise = |s: DeviceStatus, why: String| {
        status = worse(status, s);
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
    match reading.recovery_action {
        None | Some(0) => {}
        Some(3) => raise(
            DeviceStatus::Warning,
            "the driver asks to drain peer-to-peer work (recovery action 3)".into(),
        ),
        Some(action) => {
            let what = match action {
                1 => "a GPU reset",
                2 => "a node reboot",
                4 => "a drain and reset",
                _ => "a recovery",
            };
            raise(
                DeviceStatus::Degraded,
                format!("the driver asks for {what} (recovery action {action})"),
            )
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
