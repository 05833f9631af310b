//! The pure lifecycle of a charged Workload, between Kueue's status and ledger
//! entries: which admission is recorded, whether it ended and when, which
//! periodic posts are due, and the refund of a platform-caused preemption. The
//! AdmissionCheck controller (`src/controller/ledger.rs`) is the I/O around it.
//!
//! Every time used here comes from the Workload (Kueue's condition times, the
//! deletion timestamp) or from the recorded admission, never from "now" except
//! to decide which periodic posts are due: after a crash, a replay derives the
//! same entries with the same keys, so nothing is charged twice (invariant 3).

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::admission::{FlavorUsage, RateInfo, ReservationLine, ReserveEntryView, post_interval};
use super::entry::{Entry, EntryKind, correction_key};
use super::pricing::Rate;

/// Annotation on a charged Workload holding the admission kaccel reserved for
/// (written with the finalizer, before the Reserve entry): the priced lines are
/// kept with the Workload so posts and the settlement use the rates of the
/// reservation even if the class's rates change meanwhile.
pub const RESERVATION_ANNOTATION: &str = "kaccel.io/credit-reservation";

/// JSON pointer of [`RESERVATION_ANNOTATION`] (`/` escaped as `~1`), for patches.
pub const RESERVATION_ANNOTATION_POINTER: &str =
    "/metadata/annotations/kaccel.io~1credit-reservation";

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
    /// horizon are not needed by posts and are left 0).
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

    /// The view posts and the settlement work from, given the stored Reserve entry.
    pub fn view(&self, reserve: Entry) -> ReserveEntryView {
        ReserveEntryView {
            reserve,
            lines: self.lines(),
            horizon_seconds: self.horizon_seconds,
        }
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// The record on a Workload, if any. A record that does not parse is an error
/// (someone edited the annotation): the caller reports it instead of charging.
pub fn record_of(workload: &Value) -> Result<Option<ReservationRecord>, String> {
    match workload
        .pointer("/metadata/annotations")
        .and_then(|a| a.get(RESERVATION_ANNOTATION))
        .and_then(Value::as_str)
    {
        None => Ok(None),
        Some(text) => serde_json::from_str(text).map(Some).map_err(|e| {
            format!("annotation {RESERVATION_ANNOTATION} is not a kaccel reservation record: {e}")
        }),
    }
}

/// A condition of the Workload: (status is "True", lastTransitionTime in unix
/// seconds, reason).
pub fn condition<'a>(workload: &'a Value, type_: &str) -> Option<(bool, Option<i64>, &'a str)> {
    let c = workload
        .pointer("/status/conditions")?
        .as_array()?
        .iter()
        .find(|c| c["type"] == type_)?;
    Some((
        c["status"] == "True",
        c["lastTransitionTime"].as_str().and_then(parse_time),
        c["reason"].as_str().unwrap_or(""),
    ))
}

pub fn parse_time(s: &str) -> Option<i64> {
    s.parse::<jiff::Timestamp>().ok().map(|t| t.as_second())
}

/// State and message of an AdmissionCheck on the Workload.
pub fn check_state<'a>(workload: &'a Value, check: &str) -> Option<(&'a str, &'a str)> {
    let c = workload
        .pointer("/status/admissionChecks")?
        .as_array()?
        .iter()
        .find(|c| c["name"] == check)?;
    Some((
        c["state"].as_str().unwrap_or(""),
        c["message"].as_str().unwrap_or(""),
    ))
}

pub fn holds_quota(workload: &Value) -> bool {
    matches!(condition(workload, "QuotaReserved"), Some((true, _, _)))
}

/// Whether Kueue counts the Workload's reservation in its ClusterQueue usage:
/// quota reserved, not finished, and not deactivated-and-evicted (Kueue drops a
/// deactivated Workload from its usage at once, before QuotaReserved goes False).
pub fn counted_by_kueue(workload: &Value) -> bool {
    let active = workload
        .pointer("/spec/active")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    let evicted = matches!(condition(workload, "Evicted"), Some((true, _, _)));
    holds_quota(workload) && !is_finished(workload) && (active || !evicted)
}

/// Kueue marked the Workload evicted after its current quota reservation: the
/// quota is about to be released, so the check must not be answered for it.
pub fn evicted_since_admission(v: &Value) -> bool {
    match (condition(v, "Evicted"), condition(v, "QuotaReserved")) {
        (Some((true, Some(evicted), _)), Some((true, Some(reserved), _))) => evicted >= reserved,
        (Some((true, _, _)), _) => true,
        _ => false,
    }
}

pub fn is_finished(workload: &Value) -> bool {
    matches!(condition(workload, "Finished"), Some((true, _, _)))
}

pub fn deletion_time(workload: &Value) -> Option<i64> {
    workload
        .pointer("/metadata/deletionTimestamp")
        .and_then(Value::as_str)
        .and_then(parse_time)
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
    workload: &Value,
    record: &ReservationRecord,
    platform_annotation: &str,
) -> Option<Ended> {
    let clamp = |t: i64| t.max(record.admitted_at);
    let evicted = condition(workload, "Evicted");
    let preempted = matches!(evicted, Some((true, _, "Preempted")))
        || workload
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(platform_annotation))
            .is_some()
        || matches!(condition(workload, "Preempted"), Some((true, _, _)));
    if let Some((true, Some(t), _)) = condition(workload, "Finished") {
        return Some(Ended {
            at: clamp(t),
            platform_preempted: false,
            reason: "finished".into(),
        });
    }
    let reason = |what: &str| match evicted {
        Some((true, _, r)) if !r.is_empty() => format!("{what}; {EVICTED_PREFIX}{r}"),
        _ => what.to_string(),
    };
    // Deactivated (spec.active false, by the user, kaccel's health loop or Kueue's
    // maximumExecutionTimeSeconds): Kueue drops the Workload from its quota usage
    // as soon as it marks it evicted, even while QuotaReserved stays True until
    // its pods are gone, so the charge ends at the eviction too.
    let active = workload
        .pointer("/spec/active")
        .and_then(Value::as_bool)
        .unwrap_or(true);
    if !active
        && let Some((true, Some(t), _)) = evicted
        && t >= record.admitted_at
    {
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

/// The periodic posts due at `now` for a running admission: one per whole
/// interval `[admitted_at + k*interval, admitted_at + (k+1)*interval)` that ends
/// by `now` and starts at or after `posted_until`, stopping at the horizon. The
/// boundaries depend only on the admission, so a replay finds the same keys.
/// Also returns when the next post falls due (None past the horizon).
pub fn due_posts(
    view: &ReserveEntryView,
    admitted_at: i64,
    posted_until: i64,
    now: i64,
    interval_seconds: u64,
) -> (Vec<Entry>, Option<i64>) {
    let interval = i64::try_from(interval_seconds.max(1)).unwrap_or(i64::MAX);
    let horizon_end =
        admitted_at.saturating_add(i64::try_from(view.horizon_seconds).unwrap_or(i64::MAX));
    let mut out = Vec::new();
    // First boundary strictly after posted_until.
    let elapsed = posted_until.saturating_sub(admitted_at).max(0);
    let mut end = admitted_at.saturating_add((elapsed / interval + 1).saturating_mul(interval));
    let mut start = posted_until.max(admitted_at);
    loop {
        let clipped = end.min(horizon_end);
        if start >= horizon_end {
            return (out, None);
        }
        if clipped > now {
            return (out, Some(clipped));
        }
        if let Some(post) = post_interval(view, admitted_at, start, clipped) {
            out.push(post);
        }
        start = clipped;
        end = end.saturating_add(interval);
    }
}

/// The settlement entries of an admission that ended as `ended` says: its Post
/// carries the end reason (an eviction's reason shows in exports).
pub fn label_settlement(entries: &mut [Entry], ended: &Ended) {
    for e in entries.iter_mut().filter(|e| e.kind == EntryKind::Post) {
        e.reason = format!("usage until {}", ended.reason);
    }
}

/// The refund of everything an admission was charged (`posted`), as a negative
/// Correction, when a platform-caused preemption ended it and the budget refunds.
pub fn preemption_refund(reserve: &Entry, posted: i64, ended: &Ended) -> Option<Entry> {
    if posted <= 0 || !ended.platform_preempted {
        return None;
    }
    let mut e = reserve.clone();
    e.key = correction_key(
        &reserve.budget,
        &reserve.workload_uid,
        reserve.admission,
        reserve.start,
        ended.at,
        PREEMPTION_REFUND,
    );
    e.kind = EntryKind::Correction;
    e.end = ended.at.max(reserve.start);
    e.credits = -posted;
    e.reason = format!("{PREEMPTION_REFUND}: {}", ended.reason);
    e.created_at = e.end;
    Some(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::admission::settle;
    use crate::ledger::entry::{EntryKind, reserve_key};
    use serde_json::json;

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

    fn reserve(rec: &ReservationRecord) -> Entry {
        Entry {
            key: reserve_key(&rec.budget, "uid-1", rec.admission),
            kind: EntryKind::Reserve,
            budget: rec.budget.clone(),
            team: rec.team.clone(),
            namespace: "ns".into(),
            workload: "w".into(),
            workload_uid: "uid-1".into(),
            admission: 1,
            class: "h100".into(),
            flavor: "h100".into(),
            resource: "nvidia.com/gpu".into(),
            device_units: 2,
            start: rec.admitted_at,
            end: rec.admitted_at + rec.horizon_seconds as i64,
            credits: 2 * rec.horizon_seconds as i64 * 1_000_000,
            rate_card: "rc".into(),
            reason: "reserve".into(),
            created_at: rec.admitted_at,
        }
    }

    fn time(t: i64) -> String {
        jiff::Timestamp::from_second(t).unwrap().to_string()
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
        assert_eq!(record_of(&w).unwrap(), Some(rec));
        w["metadata"]["annotations"][RESERVATION_ANNOTATION] = json!("{not json");
        let err = record_of(&w).unwrap_err();
        assert!(err.contains(RESERVATION_ANNOTATION), "{err}");
        assert_eq!(record_of(&wl(json!([]))).unwrap(), None);
    }

    #[test]
    fn eviction_after_the_admission_blocks_answering_the_check() {
        let reserved =
            json!({"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)});
        let evicted =
            |t: i64| json!({"type": "Evicted", "status": "True", "lastTransitionTime": time(t)});
        assert!(!evicted_since_admission(&wl(json!([reserved.clone()]))));
        assert!(evicted_since_admission(&wl(json!([
            reserved.clone(),
            evicted(1_000)
        ]))));
        // An eviction of an earlier admission does not count against this one.
        assert!(!evicted_since_admission(&wl(json!([
            reserved.clone(),
            evicted(900)
        ]))));
        let cleared =
            json!({"type": "Evicted", "status": "False", "lastTransitionTime": time(1_100)});
        assert!(!evicted_since_admission(&wl(json!([reserved, cleared]))));
    }

    #[test]
    fn running_workload_has_not_ended() {
        let rec = record(600);
        let w = wl(
            json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)}]),
        );
        assert_eq!(ended_at(&w, &rec, "x"), None);
    }

    #[test]
    fn end_times_come_from_the_workload() {
        let rec = record(600);
        let finished = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Finished", "status": "True", "lastTransitionTime": time(1_100)}
        ]));
        assert_eq!(ended_at(&finished, &rec, "x").unwrap().at, 1_100);
        let released = wl(json!([
            {"type": "QuotaReserved", "status": "False", "lastTransitionTime": time(1_200)},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": time(1_190)}
        ]));
        let e = ended_at(&released, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_200, true));
        // Re-admitted while kaccel was down: the eviction time in between.
        let readmitted = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_500)},
            {"type": "Evicted", "status": "False", "reason": "Deactivated", "lastTransitionTime": time(1_300)}
        ]));
        let e = ended_at(&readmitted, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_300, false));
        // Deactivated: Kueue stops counting it at the eviction, QuotaReserved or not.
        let mut deactivated = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Evicted", "status": "True", "reason": "DeactivatedDueToMaximumExecutionTimeExceeded", "lastTransitionTime": time(1_060)}
        ]));
        deactivated["spec"] = json!({"active": false});
        let e = ended_at(&deactivated, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_060, false));
        // Deactivated but not yet marked evicted: still counted, still running.
        deactivated["status"]["conditions"][1]["status"] = json!("False");
        assert_eq!(ended_at(&deactivated, &rec, "x"), None);
        // Deleted while running.
        let mut deleted = wl(
            json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)}]),
        );
        deleted["metadata"]["deletionTimestamp"] = json!(time(1_050));
        assert_eq!(ended_at(&deleted, &rec, "x").unwrap().at, 1_050);
        // kaccel's health eviction annotation marks a platform cause.
        let mut health = released.clone();
        health["status"]["conditions"][1]["reason"] = json!("Deactivated");
        assert!(
            !ended_at(&health, &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        health["metadata"]["annotations"]["kaccel.io/evicted-for"] = json!("node-1: Failed");
        assert!(
            ended_at(&health, &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        // An end before the admission (clock skew) is clamped.
        let early =
            wl(json!([{"type": "Finished", "status": "True", "lastTransitionTime": time(900)}]));
        assert_eq!(ended_at(&early, &rec, "x").unwrap().at, 1_000);
    }

    #[test]
    fn periodic_posts_are_aligned_to_the_admission_and_stop_at_the_horizon() {
        let rec = record(250);
        let view = rec.view(reserve(&rec));
        // Interval 100 s: due at 1100, 1200; the horizon clips the third at 1250.
        let (posts, next) = due_posts(&view, 1_000, 1_000, 1_150, 100);
        assert_eq!(posts.len(), 1);
        assert_eq!(
            (posts[0].start, posts[0].end, posts[0].credits),
            (1_000, 1_100, 200_000_000)
        );
        assert_eq!(next, Some(1_200));
        let (posts, next) = due_posts(&view, 1_000, 1_100, 10_000, 100);
        let spans: Vec<_> = posts.iter().map(|p| (p.start, p.end)).collect();
        assert_eq!(spans, vec![(1_100, 1_200), (1_200, 1_250)]);
        assert_eq!(next, None);
        // After a settlement post that ended mid-interval, the next one starts there.
        let (posts, _) = due_posts(&view, 1_000, 1_130, 1_200, 100);
        assert_eq!((posts[0].start, posts[0].end), (1_130, 1_200));
        // Nothing due past the horizon.
        assert_eq!(due_posts(&view, 1_000, 1_250, 99_999, 100), (vec![], None));
    }

    #[test]
    fn posts_and_settlement_add_up_to_the_reservation() {
        let rec = record(250);
        let view = rec.view(reserve(&rec));
        let (posts, _) = due_posts(&view, 1_000, 1_000, 1_210, 100);
        let until = posts.last().unwrap().end;
        let settled = settle(&view, 1_000, 1_210, until);
        let posted: i64 = posts
            .iter()
            .chain(settled.iter())
            .filter(|e| e.kind == EntryKind::Post)
            .map(|e| e.credits)
            .sum();
        let voided: i64 = settled
            .iter()
            .filter(|e| e.kind == EntryKind::Void)
            .map(|e| e.credits)
            .sum();
        assert_eq!(posted, 2 * 210 * 1_000_000);
        assert_eq!(posted + voided, view.reserve.credits);
    }

    #[test]
    fn refund_only_for_platform_preemption_with_charges() {
        let rec = record(600);
        let r = reserve(&rec);
        let preempted = Ended {
            at: 1_100,
            platform_preempted: true,
            reason: "quota released; evicted: Preempted".into(),
        };
        let refund = preemption_refund(&r, 200_000_000, &preempted).unwrap();
        assert_eq!(
            (refund.kind, refund.credits),
            (EntryKind::Correction, -200_000_000)
        );
        assert!(refund.validate().is_ok());
        assert_eq!(preemption_refund(&r, 0, &preempted), None);
        let own = Ended {
            platform_preempted: false,
            ..preempted
        };
        assert_eq!(preemption_refund(&r, 200_000_000, &own), None);
    }
}
