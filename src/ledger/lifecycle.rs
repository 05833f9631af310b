//! The pure lifecycle of a charged Workload, between Kueue's status and ledger
//! entries: which admission is recorded, whether it ended and when, which
//! periodic posts are due, and the refund of a platform-caused preemption. The
//! AdmissionCheck controller (`src/controller/credits/`) is the I/O around it.
//!
//! Every time used here comes from the Workload (Kueue's condition times, the
//! deletion timestamp) or from the recorded admission, never from "now" except
//! to decide which periodic posts are due: after a crash, a replay derives the
//! same entries with the same keys, so nothing is charged twice (invariant 3).

use serde::{Deserialize, Serialize};

use super::admission::{FlavorUsage, RateInfo, ReservationLine};
use super::charge::{Charge, ChargeOwner};
use super::pricing::Rate;
use crate::kueue::workload::Workload;

/// Annotation on a charged Workload holding the admission kaccel reserved for
/// (written with the finalizer, before the Reserve entry): the priced lines are
/// kept with the Workload so posts and the settlement use the rates of the
/// reservation even if the class's rates change meanwhile.
pub const RESERVATION_ANNOTATION: &str = "kaccel.io/credit-reservation";

/// JSON pointer of [`RESERVATION_ANNOTATION`] (`/` escaped as `~1`), for patches.
pub const RESERVATION_ANNOTATION_POINTER: &str =
    "/metadata/annotations/kaccel.io~1credit-reservation";

/// Annotation kaccel sets, with the message, on a Workload it deactivated because
/// its budget could not cover the renewal of its reservation.
pub const STOPPED_ANNOTATION: &str = "kaccel.io/stopped-for-credits";

/// Finalizer on Workloads kaccel charges: the final post happens even if kaccel
/// was down when the Workload finished or was deleted.
pub const FINALIZER: &str = "kaccel.io/credits";

/// Reason of a settlement Post (and refund) of an admission that ended by
/// eviction, before the eviction's reason; the FOCUS export's `x_EvictionReason`.
pub const EVICTED_PREFIX: &str = "evicted: ";

/// Reason hashed into the key of a preemption refund.
pub const PREEMPTION_REFUND: &str = "preemption-refund";

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RecordedLine {
    pub flavor: String,
    pub resource: String,
    pub device_units: u64,
    pub class: String,
    pub model: String,
    /// Micro-credits per device-hour.
    pub rate: u64,
    pub rate_card: String,
}

/// What [`RESERVATION_ANNOTATION`] holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReservationRecord {
    pub admission: u32,
    pub budget: String,
    pub team: String,
    pub cluster_queue: String,
    /// QuotaReserved time of this admission (unix seconds): the pricing anchor.
    pub admitted_at: i64,
    pub horizon_seconds: u64,
    pub lines: Vec<RecordedLine>,
}

impl ReservationRecord {
    pub fn from_lines(
        admission: u32,
        budget: &str,
        team: &str,
        cluster_queue: &str,
        admitted_at: i64,
        horizon_seconds: u64,
        lines: &[ReservationLine],
    ) -> Self {
        ReservationRecord {
            admission,
            budget: budget.into(),
            team: team.into(),
            cluster_queue: cluster_queue.into(),
            admitted_at,
            horizon_seconds,
            lines: lines
                .iter()
                .map(|l| RecordedLine {
                    flavor: l.usage.flavor.clone(),
                    resource: l.usage.resource.clone(),
                    device_units: l.usage.device_units,
                    class: l.rate.class.clone(),
                    model: l.rate.model.clone(),
                    rate: l.rate.rate.0,
                    rate_card: l.rate.rate_card.clone(),
                })
                .collect(),
        }
    }

    /// The priced lines as the pricing functions take them (credits of the whole
    /// horizon are not needed by charging and are left 0).
    pub fn lines(&self) -> Vec<ReservationLine> {
        self.lines
            .iter()
            .map(|l| ReservationLine {
                usage: FlavorUsage {
                    flavor: l.flavor.clone(),
                    resource: l.resource.clone(),
                    device_units: l.device_units,
                },
                rate: RateInfo {
                    class: l.class.clone(),
                    model: l.model.clone(),
                    rate: Rate(l.rate),
                    rate_card: l.rate_card.clone(),
                },
                credits: crate::api::Credits(0),
            })
            .collect()
    }

    /// The admission as charging sees it: renewals, posts and the settlement.
    pub fn charge(&self, namespace: &str, workload: &str, workload_uid: &str) -> Charge {
        Charge {
            owner: ChargeOwner {
                budget: self.budget.clone(),
                team: self.team.clone(),
                namespace: namespace.into(),
                workload: workload.into(),
                workload_uid: workload_uid.into(),
                admission: self.admission,
            },
            admitted_at: self.admitted_at,
            term_seconds: self.horizon_seconds,
            lines: self.lines(),
            devices: vec![],
        }
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// The record on a Workload, if any. A record that does not parse is an error
/// (someone edited the annotation): the caller reports it instead of charging.
pub fn record_of(workload: &Workload) -> Result<Option<ReservationRecord>, String> {
    match workload.annotation(RESERVATION_ANNOTATION) {
        None => Ok(None),
        Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
            format!("annotation {RESERVATION_ANNOTATION} is not a kaccel reservation record: {e}")
        }),
    }
}

/// A condition of the Workload: (status is "True", lastTransitionTime in unix
/// seconds, reason).
pub fn condition<'a>(workload: &'a Workload, type_: &str) -> Option<(bool, Option<i64>, &'a str)> {
    let c = workload.condition(type_)?;
    Some((
        c.status == "True",
        c.last_transition_time.as_deref().and_then(parse_time),
        c.reason.as_deref().unwrap_or(""),
    ))
}

pub use crate::k8s::time::parse_time;

/// State and message of an AdmissionCheck on the Workload.
pub fn check_state<'a>(workload: &'a Workload, check: &str) -> Option<(&'a str, &'a str)> {
    let c = workload.check(check)?;
    Some((c.state.as_str(), c.message.as_str()))
}

pub fn holds_quota(workload: &Workload) -> bool {
    matches!(condition(workload, "QuotaReserved"), Some((true, _, _)))
}

/// Whether Kueue counts the Workload's reservation in its ClusterQueue usage:
/// quota reserved, not finished, and not deactivated-and-evicted (Kueue drops a
/// deactivated Workload from its usage at once, before QuotaReserved goes False).
pub fn counted_by_kueue(workload: &Workload) -> bool {
    let active = workload.active();
    let evicted = matches!(condition(workload, "Evicted"), Some((true, _, _)));
    holds_quota(workload) && !is_finished(workload) && (active || !evicted)
}

/// Kueue marked the Workload evicted after its current quota reservation: the
/// quota is about to be released, so the check must not be answered for it.
pub fn evicted_since_admission(v: &Workload) -> bool {
    match (condition(v, "Evicted"), condition(v, "QuotaReserved")) {
        (Some((true, Some(evicted), _)), Some((true, Some(reserved), _))) => evicted >= reserved,
        (Some((true, _, _)), _) => true,
        _ => false,
    }
}

pub fn is_finished(workload: &Workload) -> bool {
    matches!(condition(workload, "Finished"), Some((true, _, _)))
}

pub fn deletion_time(workload: &Workload) -> Option<i64> {
    workload
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

/// How a recorded admission ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub at: i64,
    /// Ended by Kueue preempting it or by kaccel's health loop evicting it (not
    /// by the team's own doing): refundable when the budget says so.
    pub platform_preempted: bool,
    pub reason: String,
}

/// Whether the recorded admission ended, and when, from the Workload alone:
/// - finished: the Finished condition's time;
/// - quota released (evicted, deactivated, Retry/Rejected): the QuotaReserved
///   condition's False time;
/// - quota reserved again after the recorded admission (kaccel was down during
///   an eviction): the Evicted time when it lies in between, else the new
///   reservation time;
/// - deleted while holding quota: the deletion timestamp.
///
/// The end never precedes the admission. `None` while it runs.
pub fn ended_at(
    workload: &Workload,
    record: &ReservationRecord,
    platform_annotation: &str,
) -> Option<Ended> {
    let clamp = |t: i64| t.max(record.admitted_at);
    let evicted = condition(workload, "Evicted");
    let preempted = matches!(evicted, Some((true, _, "Preempted")))
        || workload.annotation(platform_annotation).is_some()
        || matches!(condition(workload, "Preempted"), Some((true, _, _)));
    let reason = |what: &str| match evicted {
        Some((true, _, r)) if !r.is_empty() => format!("{what}; {EVICTED_PREFIX}{r}"),
        _ => what.to_string(),
    };
    // Deactivated (spec.active false, by the user, kaccel's health loop or Kueue's
    // maximumExecutionTimeSeconds): Kueue drops the Workload from its quota usage
    // as soon as it marks it evicted, even while QuotaReserved stays True until
    // its pods are gone, so the charge ends at the eviction too, also when the
    // Workload is marked Finished after that (its pods ended later).
    let active = workload.active();
    let deactivated_at = match evicted {
        Some((true, Some(t), _)) if !active && t >= record.admitted_at => Some(t),
        _ => None,
    };
    if let Some((true, Some(t), _)) = condition(workload, "Finished")
        && deactivated_at.is_none_or(|d| clamp(t) <= d)
    {
        return Some(Ended {
            at: clamp(t),
            platform_preempted: false,
            reason: "finished".into(),
        });
    }
    if let Some(t) = deactivated_at {
        return Some(Ended {
            at: t,
            platform_preempted: preempted,
            reason: reason("deactivated"),
        });
    }
    match condition(workload, "QuotaReserved") {
        Some((false, t, _)) => {
            let at = t
                .or_else(|| deletion_time(workload))
                .unwrap_or(record.admitted_at);
            return Some(Ended {
                at: clamp(at),
                platform_preempted: preempted,
                reason: reason("quota released"),
            });
        }
        Some((true, Some(t), _)) if t > record.admitted_at => {
            let at = match evicted {
                Some((_, Some(e), _)) if e >= record.admitted_at && e <= t => e,
                _ => t,
            };
            return Some(Ended {
                at: clamp(at),
                platform_preempted: preempted,
                reason: reason("re-admitted"),
            });
        }
        None => {
            // No QuotaReserved condition at all: Kueue never kept the admission.
            return Some(Ended {
                at: record.admitted_at,
                platform_preempted: false,
                reason: "no quota reservation".into(),
            });
        }
        _ => {}
    }
    deletion_time(workload).map(|t| Ended {
        at: clamp(t),
        platform_preempted: false,
        reason: "deleted".into(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::charge::ChargeState;
    use crate::ledger::entry::EntryKind;
    use serde_json::{Value, json};

    fn record(horizon: u64) -> ReservationRecord {
        ReservationRecord {
            admission: 1,
            budget: "vision".into(),
            team: "vision".into(),
            cluster_queue: "vision-h100".into(),
            admitted_at: 1_000,
            horizon_seconds: horizon,
            lines: vec![RecordedLine {
                flavor: "h100".into(),
                resource: "nvidia.com/gpu".into(),
                device_units: 2,
                class: "h100".into(),
                model: "H100".into(),
                // 3600 credits per device-hour = 1 credit per device-second.
                rate: 3_600_000_000,
                rate_card: "rc".into(),
            }],
        }
    }

    fn charge(rec: &ReservationRecord) -> (Charge, ChargeState) {
        let c = rec.charge("ns", "w", "uid-1");
        let reserve = c.reserve_terms(0, 1, "reserve", rec.admitted_at);
        let state = ChargeState::of(&c, &reserve);
        (c, state)
    }

    fn time(t: i64) -> String {
        jiff::Timestamp::from_second(t).unwrap().to_string()
    }

    fn typed(v: &Value) -> Workload {
        serde_json::from_value(v.clone()).expect("a Workload")
    }

    fn wl(conditions: Value) -> Value {
        json!({"metadata": {"name": "w", "annotations": {}}, "status": {"conditions": conditions}})
    }

    #[test]
    fn annotation_pointer_names_the_annotation() {
        let w = json!({"metadata": {"annotations": {RESERVATION_ANNOTATION: "x"}}});
        assert_eq!(w.pointer(RESERVATION_ANNOTATION_POINTER), Some(&json!("x")));
    }

    #[test]
    fn record_round_trips_through_the_annotation() {
        let rec = record(600);
        let mut w = wl(json!([]));
        w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!(rec.to_annotation());
        assert_eq!(record_of(&typed(&w)).unwrap(), Some(rec));
        w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!("{not json");
        let err = record_of(&typed(&w)).unwrap_err();
        assert!(err.contains(RESERVATION_ANNOTATION), "{err}");
        assert_eq!(record_of(&typed(&wl(json!([])))).unwrap(), None);
    }

    #[test]
    fn eviction_after_the_admission_blocks_answering_the_check() {
        let reserved =
            json!({"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)});
        let evicted =
            |t: i64| json!({"type": "Evicted", "status": "True", "lastTransitionTime": time(t)});
        assert!(!evicted_since_admission(&typed(&wl(json!([
            reserved.clone()
        ])))));
        assert!(evicted_since_admission(&typed(&wl(json!([
            reserved.clone(),
            evicted(1_000)
        ])))));
        // An eviction of an earlier admission does not count against this one.
        assert!(!evicted_since_admission(&typed(&wl(json!([
            reserved.clone(),
            evicted(900)
        ])))));
        let cleared =
            json!({"type": "Evicted", "status": "False", "lastTransitionTime": time(1_100)});
        assert!(!evicted_since_admission(&typed(&wl(json!([
            reserved, cleared
        ])))));
    }

    #[test]
    fn running_workload_has_not_ended() {
        let rec = record(600);
        let w = wl(
            json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)}]),
        );
        assert_eq!(ended_at(&typed(&w), &rec, "x"), None);
    }

    #[test]
    fn end_times_come_from_the_workload() {
        let rec = record(600);
        let finished = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Finished", "status": "True", "lastTransitionTime": time(1_100)}
        ]));
        assert_eq!(ended_at(&typed(&finished), &rec, "x").unwrap().at, 1_100);
        let released = wl(json!([
            {"type": "QuotaReserved", "status": "False", "lastTransitionTime": time(1_200)},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": time(1_190)}
        ]));
        let e = ended_at(&typed(&released), &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_200, true));
        // Re-admitted while kaccel was down: the eviction time in between.
        let readmitted = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_500)},
            {"type": "Evicted", "status": "False", "reason": "Deactivated", "lastTransitionTime": time(1_300)}
        ]));
        let e = ended_at(&typed(&readmitted), &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_300, false));
        // Deactivated: Kueue stops counting it at the eviction, QuotaReserved or not.
        let mut deactivated = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Evicted", "status": "True", "reason": "DeactivatedDueToMaximumExecutionTimeExceeded", "lastTransitionTime": time(1_060)}
        ]));
        deactivated["spec"] = json!({"active": false});
        let e = ended_at(&typed(&deactivated), &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_060, false));
        // Deactivated and evicted, then marked Finished once its pods ended (the
        // crash test's w158): Kueue stopped counting it at the eviction.
        let mut late_finish = deactivated.clone();
        late_finish["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Finished", "status": "True", "lastTransitionTime": time(1_070)}));
        let e = ended_at(&typed(&late_finish), &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.starts_with("deactivated")), (1_060, true));
        // Finished first, deactivated after: the finish ends it.
        late_finish["status"]["conditions"][2]["lastTransitionTime"] = json!(time(1_050));
        let e = ended_at(&typed(&late_finish), &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.as_str()), (1_050, "finished"));
        // Deactivated but not yet marked evicted: still counted, still running.
        deactivated["status"]["conditions"][1]["status"] = json!("False");
        assert_eq!(ended_at(&typed(&deactivated), &rec, "x"), None);
        // Deleted while running.
        let mut deleted = wl(
            json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)}]),
        );
        deleted["metadata"]["deletionTimestamp"] = json!(time(1_050));
        assert_eq!(ended_at(&typed(&deleted), &rec, "x").unwrap().at, 1_050);
        // kaccel's health eviction annotation marks a platform cause.
        let mut health = released.clone();
        health["status"]["conditions"][1]["reason"] = json!("Deactivated");
        assert!(
            !ended_at(&typed(&health), &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        health["metadata"]["annotations"]["kaccel.io/evicted-for"] = json!("node-1: Failed");
        assert!(
            ended_at(&typed(&health), &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        // An end before the admission (clock skew) is clamped.
        let early =
            wl(json!([{"type": "Finished", "status": "True", "lastTransitionTime": time(900)}]));
        assert_eq!(ended_at(&typed(&early), &rec, "x").unwrap().at, 1_000);
    }

    #[test]
    fn periodic_posts_are_aligned_to_the_admission_and_run_past_the_horizon() {
        let rec = record(250);
        let (c, mut state) = charge(&rec);
        // Interval 100 s: due at 1100, 1200, ...
        let (posts, next) = c.due_posts(&state, 1_150, 100);
        assert_eq!(posts.len(), 1);
        assert_eq!(
            (posts[0].start, posts[0].end, posts[0].credits),
            (1_000, 1_100, 200_000_000)
        );
        assert_eq!(next, 1_200);
        state.posted_until = 1_100;
        // Past the reserved 250 s: the posts go on (the overrun is reserved
        // first), with a boundary at the end of each term.
        let (posts, next) = c.due_posts(&state, 1_400, 100);
        let spans: Vec<_> = posts.iter().map(|p| (p.kind, p.start, p.end)).collect();
        assert_eq!(
            spans,
            vec![
                (EntryKind::Reserve, 1_250, 1_500),
                (EntryKind::Post, 1_100, 1_200),
                (EntryKind::Post, 1_200, 1_250),
                (EntryKind::Post, 1_250, 1_300),
                (EntryKind::Post, 1_300, 1_400),
            ]
        );
        assert_eq!(next, 1_500);
        // After a settlement post that ended mid-interval, the next one starts there.
        state.posted_until = 1_130;
        let (posts, _) = c.due_posts(&state, 1_200, 100);
        assert_eq!((posts[0].start, posts[0].end), (1_130, 1_200));
    }

    #[test]
    fn posts_and_settlement_add_up_to_the_reservation() {
        let rec = record(250);
        let (c, mut state) = charge(&rec);
        let (posts, _) = c.due_posts(&state, 1_210, 100);
        state.apply(&c, &posts);
        let end = Ended {
            at: 1_210,
            platform_preempted: false,
            reason: "finished".into(),
        };
        let settled = c.settle(&state, &end, 1_210);
        let sum = |k: EntryKind| -> i64 {
            posts
                .iter()
                .chain(settled.iter())
                .filter(|e| e.kind == k)
                .map(|e| e.credits)
                .sum()
        };
        assert_eq!(sum(EntryKind::Post), 2 * 210 * 1_000_000);
        assert_eq!(
            sum(EntryKind::Post) + sum(EntryKind::Void),
            c.term_price(0) as i64
        );
        assert!(settled.iter().any(|e| e.reason == "usage until finished"));
    }
}
