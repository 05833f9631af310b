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

use super::admission::{FlavorUsage, RateInfo, ReservationLine, admission_number};
use super::charge::{Charge, ChargeOwner};
use super::entry::{Entry, EntryKind};
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
            cluster: String::new(),
        }
    }

    /// The record an admission's first-term Reserve entries imply: for a
    /// charged Workload whose record annotation is gone (removed by hand while
    /// its reservation is open), so it is still settled in full. The latest
    /// admission with Reserve entries wins;
    /// its first term's entries (the earliest start) give the lines in the
    /// order they were appended, the horizon and the admission time, so posts,
    /// renewals and the settlement derive the same entries (and keys) as with
    /// the written record. The model is read back from the entry's reason (the
    /// words the reason was written with, so a replayed renewal is the same
    /// entry); `model_of` (the flavor's model today) when the reason does not
    /// say. `None` without Reserve entries.
    pub fn from_reserve_entries<'a>(
        entries: impl IntoIterator<Item = &'a Entry> + Clone,
        cluster_queue: &str,
        model_of: impl Fn(&str) -> Option<String>,
    ) -> Option<Self> {
        let reserves = || {
            entries
                .clone()
                .into_iter()
                .filter(|e| e.kind == EntryKind::Reserve)
        };
        let admission = reserves().map(|e| e.admission).max()?;
        let first_start = reserves()
            .filter(|e| e.admission == admission)
            .map(|e| e.start)
            .min()?;
        let first_term: Vec<&Entry> = reserves()
            .filter(|e| e.admission == admission && e.start == first_start)
            .collect();
        let head = first_term.first()?;
        Some(ReservationRecord {
            admission,
            budget: head.budget.clone(),
            team: head.team.clone(),
            cluster_queue: cluster_queue.into(),
            admitted_at: first_start,
            horizon_seconds: u64::try_from(head.end.saturating_sub(head.start)).unwrap_or(0),
            lines: first_term
                .iter()
                .map(|e| RecordedLine {
                    flavor: e.flavor.clone(),
                    resource: e.resource.clone(),
                    device_units: e.device_units,
                    class: e.class.clone(),
                    model: model_in_reason(&e.reason, e.device_units)
                        .map(str::to_string)
                        .or_else(|| model_of(&e.flavor))
                        .unwrap_or_else(|| e.flavor.clone()),
                    rate: e.rate,
                    rate_card: e.rate_card.clone(),
                })
                .collect(),
        })
    }

    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).expect("a record serialises")
    }
}

/// The device model a Reserve entry's reason names: reasons read
/// `<why> (term N): <units> x <model> for <duration> at <rate>/device-hour`
/// ([`super::admission::describe_lines`]). `None` when the reason is not in
/// those words or names other units.
pub fn model_in_reason(reason: &str, device_units: u64) -> Option<&str> {
    let (_, line) = reason.split_once("): ")?;
    let (units, rest) = line.split_once(" x ")?;
    if units.parse::<u64>().ok()? != device_units {
        return None;
    }
    let (model, tail) = rest.rsplit_once(" for ")?;
    (!model.is_empty() && tail.ends_with("/device-hour") && tail.contains(" at ")).then_some(model)
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

/// How Kueue's message starts on every admission check it reset to Pending at
/// an eviction (`prepareForEviction`: the reset's time is the Evicted
/// condition's, one clock reading for both).
pub const EVICTION_RESET_PREFIX: &str = "Reset to Pending after eviction";

/// When Kueue evicted the Workload, read from kaccel's own check `check` while it
/// still carries Kueue's reset: Pending, Kueue's message, the eviction's time.
pub fn eviction_reset(workload: &Workload, check: &str) -> Option<i64> {
    let c = workload.check(check)?;
    if c.state != "Pending" || !c.message.starts_with(EVICTION_RESET_PREFIX) {
        return None;
    }
    c.last_transition_time.as_deref().and_then(parse_time)
}

/// Whether Kueue's eviction statistics show evictions, every one of them a
/// deactivation (`Deactivated`, `DeactivatedDueTo...`).
pub fn only_deactivated(workload: &Workload) -> bool {
    let evictions = workload
        .status
        .scheduling_stats
        .as_ref()
        .map(|s| s.evictions.as_slice())
        .unwrap_or_default();
    !evictions.is_empty()
        && evictions
            .iter()
            .all(|e| e.reason.starts_with("Deactivated"))
}

pub fn deletion_time(workload: &Workload) -> Option<i64> {
    workload
        .metadata
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
}

/// When Kueue stamped the recorded admission's quota reservation again, later,
/// without ending it: QuotaReserved True at a later time, while Kueue counted no
/// eviction since the record (the admission number is the record's) and shows
/// none in between (no Evicted condition since the record, no reset of kaccel's
/// check `check`). Kueue does this when its reservation write failed on the way
/// back (an API server going down mid-answer): the write landed, Kueue saw an
/// error, forgot the reservation and wrote it again with a new time (the ledger
/// crash test's w026). The same admission goes on: ending it there left the
/// rest of the run uncharged, as nothing else answers an admission number twice.
pub fn restamped_at(workload: &Workload, record: &ReservationRecord, check: &str) -> Option<i64> {
    let Some((true, Some(at), _)) = condition(workload, "QuotaReserved") else {
        return None;
    };
    let evicted_since = matches!(
        condition(workload, "Evicted"),
        Some((_, Some(e), _)) if e >= record.admitted_at
    );
    (at > record.admitted_at
        && admission_number(workload).ok() == Some(record.admission)
        && !evicted_since
        && eviction_reset(workload, check).is_none())
    .then_some(at)
}

/// The record to charge from when Kueue stamped its admission again (see
/// [`restamped_at`]) before kaccel posted any usage or reserved past the first
/// term (`entries`, the Workload's in the store): the charge starts at Kueue's
/// new time, the one its Admitted Workload shows. The first term's Reserve stays
/// (it holds the same credits; the settlement voids what is left). Once usage is
/// posted or a later term reserved, their keys follow from the first time, so
/// the charge keeps it: a few seconds of an outage charged, none lost. The
/// entries are read only once a re-stamp is seen (every reconcile asks).
pub fn rebased<'a>(
    record: &ReservationRecord,
    workload: &Workload,
    check: &str,
    entries: impl IntoIterator<Item = &'a Entry>,
) -> Option<ReservationRecord> {
    let at = restamped_at(workload, record, check)?;
    // Which entries are this admission's does not depend on the Workload's names.
    let state = super::charge::ChargeState::of(&record.charge("", "", ""), entries);
    (state.terms == 1 && state.posted.is_empty() && !state.voided).then(|| ReservationRecord {
        admitted_at: at,
        ..record.clone()
    })
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
/// - quota reserved again after the recorded admission, with an eviction in
///   between (not a re-stamp, [`restamped_at`]; kaccel did not see the
///   eviction: down, or its watch not delivering while the API server's cache
///   re-initialised): the eviction time Kueue wrote on kaccel's own check
///   (`check`) when it reset it to Pending, which nothing rewrites until kaccel
///   answers the new admission; else the Evicted time when it lies in between;
///   else the new reservation time;
/// - deleted while holding quota: the deletion timestamp.
///
/// The end never precedes the admission. `None` while it runs.
pub fn ended_at(
    workload: &Workload,
    record: &ReservationRecord,
    platform_annotation: &str,
    check: &str,
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
        Some((true, Some(t), _))
            if t > record.admitted_at && restamped_at(workload, record, check).is_none() =>
        {
            let in_between = |e: &i64| *e >= record.admitted_at && *e <= t;
            // Only after deactivations: Kueue stops counting a deactivated
            // Workload at its eviction, but another (a preemption) keeps its
            // quota until its pods are gone, which this does not record.
            if let Some(e) = eviction_reset(workload, check)
                .filter(in_between)
                .filter(|_| only_deactivated(workload))
            {
                return Some(Ended {
                    at: e,
                    platform_preempted: preempted,
                    reason: reason("evicted, then re-admitted"),
                });
            }
            let at = match evicted {
                Some((_, Some(e), _)) if in_between(&e) => e,
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
    use proptest::prelude::*;
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

    /// `ended_at` of a Workload written as JSON, kaccel's check `kaccel-credits`.
    fn end_of(w: &Value, rec: &ReservationRecord, platform_annotation: &str) -> Option<Ended> {
        ended_at(&typed(w), rec, platform_annotation, "kaccel-credits")
    }

    fn typed(v: &Value) -> Workload {
        serde_json::from_value(v.clone()).expect("a Workload")
    }

    fn wl(conditions: Value) -> Value {
        json!({"metadata": {"name": "w", "annotations": {}}, "status": {"conditions": conditions}})
    }

    /// What a reservation and its life write: the first term, two renewals,
    /// posts, and (before them) a settled earlier admission of the same Workload.
    fn written_entries(rec: &ReservationRecord) -> Vec<Entry> {
        let c = rec.charge("ns", "w", "uid-1");
        let mut earlier = rec.clone();
        earlier.admission = rec.admission - 1;
        earlier.admitted_at = rec.admitted_at - 10_000;
        let old = earlier.charge("ns", "w", "uid-1");
        let mut out = old.reserve_terms(0, 2, "reserve", earlier.admitted_at);
        out.extend(c.reserve_terms(0, 1, "reserve", rec.admitted_at + 3));
        out.extend(c.posts(rec.admitted_at, rec.admitted_at + 60, "usage"));
        out.extend(c.reserve_terms(1, 3, "renewal", rec.admitted_at + 90));
        out
    }

    #[test]
    fn the_record_comes_back_from_the_reserve_entries() {
        let mut rec = record(600);
        rec.admission = 2;
        rec.lines.push(RecordedLine {
            flavor: "h100-dra".into(),
            resource: "dra.kaccel.io/h100-dra".into(),
            device_units: 1,
            class: "h100".into(),
            model: "nvidia-h100-80gb-hbm3".into(),
            rate: 1_500_000,
            rate_card: "rc-2".into(),
        });
        let entries = written_entries(&rec);
        let rebuilt =
            ReservationRecord::from_reserve_entries(&entries, "vision-h100", |_| None).unwrap();
        assert_eq!(rebuilt, rec);
        // The renewal the rebuilt record writes is the one already stored.
        let again = rebuilt
            .charge("ns", "w", "uid-1")
            .reserve_terms(1, 2, "renewal", 5);
        assert!(again[0].same_content(&entries[entries.len() - 4]));
        assert_eq!(
            ReservationRecord::from_reserve_entries(&entries[..0], "q", |_| None),
            None
        );
    }

    #[test]
    fn a_reason_in_other_words_takes_the_flavors_model() {
        let rec = record(600);
        let mut entries = rec
            .charge("ns", "w", "uid-1")
            .reserve_terms(0, 1, "reserve", 0);
        entries[0].reason = "written by hand".into();
        let rebuilt = ReservationRecord::from_reserve_entries(&entries, "vision-h100", |f| {
            (f == "h100").then(|| "H100 today".to_string())
        })
        .unwrap();
        assert_eq!(rebuilt.lines[0].model, "H100 today");
        let rebuilt =
            ReservationRecord::from_reserve_entries(&entries, "vision-h100", |_| None).unwrap();
        assert_eq!(rebuilt.lines[0].model, "h100", "the flavor's name, last");
        assert_eq!(
            model_in_reason("reserve (term 1): 3 x H100 for 1h at 1/device-hour", 2),
            None
        );
    }

    proptest! {
        #[test]
        fn any_record_comes_back_from_its_entries(
            models in proptest::collection::vec("[a-zA-Z0-9][a-zA-Z0-9._-]{0,40}", 1..4),
            units in 1u64..10_000,
            rate in 0u64..1_000_000_000_000,
            horizon in 1u64..10_000_000,
            admitted_at in 10_001i64..4_000_000_000,
            admission in 2u32..1000,
        ) {
            let mut rec = record(horizon);
            rec.admission = admission;
            rec.admitted_at = admitted_at;
            rec.lines = models
                .iter()
                .enumerate()
                .map(|(i, model)| RecordedLine {
                    flavor: format!("flavor-{i}"),
                    resource: "nvidia.com/gpu".into(),
                    device_units: units + i as u64,
                    class: "c".into(),
                    model: model.clone(),
                    rate: rate / (i as u64 + 1),
                    rate_card: "rc".into(),
                })
                .collect();
            let entries = written_entries(&rec);
            let rebuilt = ReservationRecord::from_reserve_entries(&entries, "vision-h100", |_| None);
            prop_assert_eq!(rebuilt, Some(rec));
        }
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

    /// Kueue's reservation write landed while its answer was lost to an API
    /// server restart; Kueue wrote it again with a later time and admitted the
    /// Workload (the ledger crash test's w026, reserved at 80, stamped again at
    /// 82, deactivated at 93, charged [80, 82) and nothing after). The same
    /// admission goes on, charged from Kueue's new time.
    #[test]
    fn a_reservation_kueue_stamped_again_is_the_same_admission_from_the_new_time() {
        let rec = record(2);
        let restamped = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_002)},
            {"type": "Admitted", "status": "True", "lastTransitionTime": time(1_011)}
        ]));
        assert_eq!(
            restamped_at(&typed(&restamped), &rec, "kaccel-credits"),
            Some(1_002)
        );
        assert_eq!(end_of(&restamped, &rec, "x"), None, "not an end");

        // Nothing but the first term written: charged from the new time.
        let c = rec.charge("ns", "w", "uid-1");
        let reserve = c.reserve_terms(0, 1, "reserve", 1_000);
        let moved = rebased(&rec, &typed(&restamped), "kaccel-credits", &reserve).unwrap();
        assert_eq!(moved.admitted_at, 1_002);
        assert_eq!(
            ReservationRecord {
                admitted_at: rec.admitted_at,
                ..moved.clone()
            },
            rec
        );
        // The first term's Reserve (written at 1_000) still counts as reserved;
        // deactivated at 1_013 the admission is charged [1_002, 1_013) exactly
        // and what it reserved balances.
        let c2 = moved.charge("ns", "w", "uid-1");
        let state2 = ChargeState::of(&c2, &reserve);
        assert_eq!(state2.terms, 1);
        let end = Ended {
            at: 1_013,
            platform_preempted: false,
            reason: "deactivated".into(),
        };
        let settled = c2.settle(&state2, &end, 1_020);
        let sum = |kind: EntryKind| -> i64 {
            reserve
                .iter()
                .chain(&settled)
                .filter(|e| e.kind == kind)
                .map(|e| e.credits)
                .sum()
        };
        // 2 devices x 11 s x 1 credit.
        assert_eq!(sum(EntryKind::Post), 22_000_000);
        assert_eq!(
            sum(EntryKind::Reserve),
            sum(EntryKind::Post) + sum(EntryKind::Void)
        );
        let mut keys: Vec<&str> = reserve
            .iter()
            .chain(&settled)
            .map(|e| e.key.as_str())
            .collect();
        keys.sort();
        let n = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), n, "no key written twice");

        // Usage posted (or a later term reserved) from the first time: the
        // charge keeps it (their keys follow from it), still not ended.
        let posted = c.posts(1_000, 1_002, "usage");
        let with_posts = reserve.iter().chain(&posted);
        assert_eq!(
            rebased(&rec, &typed(&restamped), "kaccel-credits", with_posts),
            None
        );
        let renewal = c.reserve_terms(1, 2, "renewal", 1_001);
        let renewed = reserve.iter().chain(&renewal);
        assert_eq!(
            rebased(&rec, &typed(&restamped), "kaccel-credits", renewed),
            None
        );

        // An eviction in between is no re-stamp: Kueue counted it (a new
        // admission number), or its Evicted condition or its reset of kaccel's
        // check lies after the record.
        let mut counted = restamped.clone();
        counted["status"]["schedulingStats"] = json!({"evictions": [
            {"reason": "Preempted", "underlyingCause": "", "count": 1}]});
        assert_eq!(restamped_at(&typed(&counted), &rec, "kaccel-credits"), None);
        assert!(end_of(&counted, &rec, "x").is_some());
        let mut evicted = restamped.clone();
        evicted["status"]["conditions"].as_array_mut().unwrap().push(
            json!({"type": "Evicted", "status": "False", "reason": "QuotaReserved", "lastTransitionTime": time(1_001)}),
        );
        assert_eq!(restamped_at(&typed(&evicted), &rec, "kaccel-credits"), None);
        assert_eq!(end_of(&evicted, &rec, "x").unwrap().at, 1_001);
        let mut reset = restamped.clone();
        reset["status"]["admissionChecks"] = json!([
            {"name": "kaccel-credits", "state": "Pending", "message": "Reset to Pending after eviction. Previously: Ready", "lastTransitionTime": time(1_001)}
        ]);
        assert_eq!(restamped_at(&typed(&reset), &rec, "kaccel-credits"), None);
        // An Evicted condition of an earlier admission is no eviction of this one.
        let mut earlier = restamped.clone();
        earlier["status"]["conditions"].as_array_mut().unwrap().push(
            json!({"type": "Evicted", "status": "False", "reason": "QuotaReserved", "lastTransitionTime": time(900)}),
        );
        assert_eq!(
            restamped_at(&typed(&earlier), &rec, "kaccel-credits"),
            Some(1_002)
        );
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
        assert_eq!(end_of(&w, &rec, "x"), None);
    }

    #[test]
    fn end_times_come_from_the_workload() {
        let rec = record(600);
        let finished = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Finished", "status": "True", "lastTransitionTime": time(1_100)}
        ]));
        assert_eq!(end_of(&finished, &rec, "x").unwrap().at, 1_100);
        let released = wl(json!([
            {"type": "QuotaReserved", "status": "False", "lastTransitionTime": time(1_200)},
            {"type": "Evicted", "status": "True", "reason": "Preempted", "lastTransitionTime": time(1_190)}
        ]));
        let e = end_of(&released, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_200, true));
        // Re-admitted while kaccel was down: the eviction time in between.
        let readmitted = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_500)},
            {"type": "Evicted", "status": "False", "reason": "Deactivated", "lastTransitionTime": time(1_300)}
        ]));
        let e = end_of(&readmitted, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_300, false));
        // Evicted and re-admitted unseen, Evicted rewritten at the re-admission:
        // the eviction's time from Kueue's reset of kaccel's check.
        let mut unseen = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_500)},
            {"type": "Evicted", "status": "False", "reason": "QuotaReserved", "lastTransitionTime": time(1_500)}
        ]));
        unseen["status"]["schedulingStats"] = json!({"evictions": [
            {"reason": "Deactivated", "underlyingCause": "", "count": 1}]});
        unseen["status"]["admissionChecks"] = json!([
            {"name": "other-check", "state": "Pending", "message": "Reset to Pending after eviction. Previously: Ready", "lastTransitionTime": time(1_100)},
            {"name": "kaccel-credits", "state": "Pending", "message": "Reset to Pending after eviction. Previously: Ready", "lastTransitionTime": time(1_250)}
        ]);
        let e = end_of(&unseen, &rec, "x").unwrap();
        assert_eq!(e.at, 1_250);
        assert!(
            e.reason.starts_with("evicted, then re-admitted"),
            "{}",
            e.reason
        );
        // After a preemption Kueue counted the quota until the pods were gone,
        // which the reset does not say: the re-admission, as before.
        let mut preempted = unseen.clone();
        preempted["status"]["schedulingStats"]["evictions"][0]["reason"] = json!("Preempted");
        let e = end_of(&preempted, &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.as_str()), (1_500, "re-admitted"));
        // kaccel's own Pending (waiting for credits) is no eviction record.
        unseen["status"]["admissionChecks"][1]["message"] = json!("waiting for credits");
        let e = end_of(&unseen, &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.as_str()), (1_500, "re-admitted"));
        // Deactivated: Kueue stops counting it at the eviction, QuotaReserved or not.
        let mut deactivated = wl(json!([
            {"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)},
            {"type": "Evicted", "status": "True", "reason": "DeactivatedDueToMaximumExecutionTimeExceeded", "lastTransitionTime": time(1_060)}
        ]));
        deactivated["spec"] = json!({"active": false});
        let e = end_of(&deactivated, &rec, "x").unwrap();
        assert_eq!((e.at, e.platform_preempted), (1_060, false));
        // Deactivated and evicted, then marked Finished once its pods ended (the
        // crash test's w158): Kueue stopped counting it at the eviction.
        let mut late_finish = deactivated.clone();
        late_finish["status"]["conditions"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "Finished", "status": "True", "lastTransitionTime": time(1_070)}));
        let e = end_of(&late_finish, &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.starts_with("deactivated")), (1_060, true));
        // Finished first, deactivated after: the finish ends it.
        late_finish["status"]["conditions"][2]["lastTransitionTime"] = json!(time(1_050));
        let e = end_of(&late_finish, &rec, "x").unwrap();
        assert_eq!((e.at, e.reason.as_str()), (1_050, "finished"));
        // Deactivated but not yet marked evicted: still counted, still running.
        deactivated["status"]["conditions"][1]["status"] = json!("False");
        assert_eq!(end_of(&deactivated, &rec, "x"), None);
        // Deleted while running.
        let mut deleted = wl(
            json!([{"type": "QuotaReserved", "status": "True", "lastTransitionTime": time(1_000)}]),
        );
        deleted["metadata"]["deletionTimestamp"] = json!(time(1_050));
        assert_eq!(end_of(&deleted, &rec, "x").unwrap().at, 1_050);
        // kaccel's health eviction annotation marks a platform cause.
        let mut health = released.clone();
        health["status"]["conditions"][1]["reason"] = json!("Deactivated");
        assert!(
            !end_of(&health, &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        health["metadata"]["annotations"]["kaccel.io/evicted-for"] = json!("node-1: Failed");
        assert!(
            end_of(&health, &rec, "kaccel.io/evicted-for")
                .unwrap()
                .platform_preempted
        );
        // An end before the admission (clock skew) is clamped.
        let early =
            wl(json!([{"type": "Finished", "status": "True", "lastTransitionTime": time(900)}]));
        assert_eq!(end_of(&early, &rec, "x").unwrap().at, 1_000);
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
