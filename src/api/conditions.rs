//! Status conditions. The planner says what each condition should be; the
//! controller merges that into the stored list so `lastTransitionTime` only moves
//! when the status really changes (an unchanged status costs no write).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use serde::{Deserialize, Serialize};

pub const READY: &str = "Ready";
pub const DEGRADED: &str = "Degraded";
pub const NO_MATCHING_HARDWARE: &str = "NoMatchingHardware";
pub const INVALID: &str = "Invalid";
pub const CONFLICT: &str = "Conflict";
pub const QUOTA_SHORTFALL: &str = "QuotaShortfall";
pub const EXHAUSTED: &str = "Exhausted";
pub const OVERDRAWN: &str = "Overdrawn";
pub const HEALTH_UNKNOWN: &str = "HealthUnknown";
/// True while devices of a vendor the class selects are in no flavor because no
/// node label names their model.
pub const UNLABELLED_MODELS: &str = "UnlabelledModels";
/// False when a DRA-only flavor of the class has no DeviceClass (a requirement
/// its driver's attributes cannot express).
pub const DEVICE_CLASSES_READY: &str = "DeviceClassesReady";
/// False while the Kueue configuration kaccel read does not map every DeviceClass
/// of the class to the logical resource its quota is in (Kueue would not count
/// the claims).
pub const KUEUE_COUNTS_DEVICE_CLASSES: &str = "KueueCountsDeviceClasses";
/// True when Kueue's configuration counts every vendor device resource of the
/// class's flavors as `kaccel.io/accelerator` too (a `Retain` transformation), so
/// one device is one count however it is asked for; False names what is missing.
pub const KUEUE_COUNTS_CLASS_REQUESTS: &str = "KueueCountsClassRequests";
/// True when ClusterQueues kaccel does not own cover a vendor resource of the
/// class that Kueue also counts as `kaccel.io/accelerator`, but not that
/// resource: Kueue admits none of their workloads asking for it. kaccel never
/// writes to them; the message names each one and the fix.
pub const FOREIGN_QUEUES_BLOCKED: &str = "ForeignQueuesBlocked";

/// A condition as the planner wants it, without timestamps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DesiredCondition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: bool,
    pub reason: String,
    pub message: String,
}

impl DesiredCondition {
    pub fn new(
        type_: &str,
        status: bool,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        DesiredCondition {
            type_: type_.to_string(),
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }

    pub fn status_str(&self) -> &'static str {
        if self.status { "True" } else { "False" }
    }
}

/// Merge desired conditions into the existing ones. Conditions kaccel does not manage
/// are dropped; `lastTransitionTime` is kept when the status is unchanged.
pub fn merge_conditions(
    existing: &[Condition],
    desired: &[DesiredCondition],
    now: &Time,
    observed_generation: Option<i64>,
) -> Vec<Condition> {
    desired
        .iter()
        .map(|d| {
            let previous = existing.iter().find(|c| c.type_ == d.type_);
            let last_transition_time = match previous {
                Some(p) if p.status == d.status_str() => p.last_transition_time.clone(),
                _ => now.clone(),
            };
            Condition {
                type_: d.type_.clone(),
                status: d.status_str().to_string(),
                reason: d.reason.clone(),
                message: d.message.clone(),
                last_transition_time,
                observed_generation,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn keeps_transition_time_when_status_unchanged() {
        let first = merge_conditions(
            &[],
            &[DesiredCondition::new(READY, true, "Resolved", "ok")],
            &t(100),
            Some(1),
        );
        let second = merge_conditions(
            &first,
            &[DesiredCondition::new(READY, true, "Resolved", "still ok")],
            &t(200),
            Some(2),
        );
        assert_eq!(second[0].last_transition_time, t(100));
        assert_eq!(second[0].message, "still ok");
        let third = merge_conditions(
            &second,
            &[DesiredCondition::new(READY, false, "NoHardware", "gone")],
            &t(300),
            Some(2),
        );
        assert_eq!(third[0].last_transition_time, t(300));
    }
}
