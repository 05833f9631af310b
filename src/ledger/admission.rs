//! The pure decision layer of kaccel's credit AdmissionCheck: what a Kueue
//! admission uses, what it costs, whether a budget can cover it, and which ledger
//! entries settle it. No I/O and no clock: every time is passed in (unix seconds).
//!
//! Flow for the AdmissionCheck controller:
//! 1. [`usage_from_workload`] reads `status.admission.podSetAssignments[]` into
//!    device units per (flavor, resource); [`admission_number`] and
//!    [`horizon_seconds`] read the admission number and the reservation horizon.
//! 2. [`reservation`] prices the usage over the horizon with THE pricing function
//!    ([`cumulative`], invariant 2), taking rates from [`rate_info`] (the
//!    class's rates as parsed once, [`ClassRates`]).
//! 3. [`decide`] answers Reserve (the first term's Reserve entries, one per
//!    line), Wait (with the message the ML user sees) or Reject (a
//!    flavor/resource without a rate).
//! 4. While the workload runs, [`super::charge`] renews the reservation term by
//!    term, posts usage per interval and settles it at the end: every admitted
//!    second is charged, with no clip at the horizon. Keys come from
//!    [`super::entry`], so replays are no-ops.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::Value;

use super::charge::{Charge, ChargeOwner};
use super::entry::{Balances, Entry, format_micros};
use super::pricing::{PricingError, Rate, cumulative};
use crate::api::Credits;
use crate::api::rates::ClassRates;
use crate::k8s::quantity::parse_count;
use crate::kueue::workload::Workload;

/// Default reservation horizon when a Workload has no
/// `spec.maximumExecutionTimeSeconds` and the budget configures none: one hour.
pub const DEFAULT_HORIZON_SECONDS: u64 = 3600;

/// Core resources that are never accelerators.
const NON_ACCELERATOR: [&str; 4] = ["cpu", "memory", "ephemeral-storage", "pods"];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    #[error("workload has no status.admission.podSetAssignments: Kueue has not reserved quota")]
    NotAdmitted,
    #[error("workload field {field} is malformed: {reason}")]
    Malformed { field: String, reason: String },
    #[error(
        "podSet {pod_set:?}: resourceUsage[{resource:?}] = {value:?} is not a whole device count: {reason}"
    )]
    BadQuantity {
        pod_set: String,
        resource: String,
        value: String,
        reason: String,
    },
    #[error("podSet {pod_set:?}: resource {resource:?} has usage but no flavor in flavors")]
    NoFlavor { pod_set: String, resource: String },
    #[error(transparent)]
    Pricing(#[from] PricingError),
    #[error("reservation of {micros} micro-credits does not fit a ledger amount")]
    TooLarge { micros: u128 },
}

/// Device units of one (flavor, resource) in an admission, summed over podSets.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FlavorUsage {
    pub flavor: String,
    pub resource: String,
    pub device_units: u64,
}

/// Whether `resource` is counted as an accelerator: an extended resource
/// (`domain/name`, e.g. `nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`,
/// `amd.com/gpu`, `huawei.com/Ascend910`) outside the `kubernetes.io` domains.
/// `cpu`, `memory`, `ephemeral-storage`, `pods` and `hugepages-*` are not.
pub fn is_accelerator_resource(resource: &str) -> bool {
    if NON_ACCELERATOR.contains(&resource) || resource.starts_with("hugepages-") {
        return false;
    }
    match resource.split_once('/') {
        Some((domain, name)) => {
            !name.is_empty() && domain != "kubernetes.io" && !domain.ends_with(".kubernetes.io")
        }
        None => false,
    }
}

fn malformed(field: &str, reason: impl Into<String>) -> AdmissionError {
    AdmissionError::Malformed {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// Device units per (flavor, resource) of a Kueue v1beta2 Workload's admission,
/// accelerator resources only, sorted by (flavor, resource).
///
/// `podSetAssignments[].resourceUsage` is, per Kueue v0.17's `PodSetAssignment`
/// ("keeps track of the total resources all the pods in the podset need to
/// run"), the **total for the podSet**, not per pod: it is used as is and
/// `count` is not multiplied in (it is only checked to be a non-negative
/// integer when present). It "will not change in case of quota reclaim", so the
/// amount is stable for the whole admission (invariant 2 counts exactly this).
/// Extended resources are whole units: a fractional or unparsable quantity is an
/// error naming the podSet and resource.
pub fn usage_from_workload(workload: &Workload) -> Result<Vec<FlavorUsage>, AdmissionError> {
    // The containers are typed (the API server enforces Kueue's schema on them);
    // the leaves Kueue does not constrain as tightly are checked here.
    let assignments = &workload
        .status
        .admission
        .as_ref()
        .ok_or(AdmissionError::NotAdmitted)?
        .pod_set_assignments;
    let mut totals: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (i, psa) in assignments.iter().enumerate() {
        let field = format!("status.admission.podSetAssignments[{i}]");
        // Kueue defaults the name to "main".
        let pod_set = psa.name.clone().unwrap_or_else(|| "main".to_string());
        if let Some(count) = &psa.count
            && !count.is_null()
            && count.as_u64().is_none()
        {
            return Err(malformed(
                &format!("{field}.count"),
                "not a non-negative integer",
            ));
        }
        let no_flavors = BTreeMap::new();
        let flavors = psa.flavors.as_ref().unwrap_or(&no_flavors);
        let Some(usage) = &psa.resource_usage else {
            continue;
        };
        for (resource, quantity) in usage {
            if !is_accelerator_resource(resource) {
                continue;
            }
            let bad = |value: String, reason: String| AdmissionError::BadQuantity {
                pod_set: pod_set.clone(),
                resource: resource.clone(),
                value,
                reason,
            };
            let raw = match quantity {
                Value::String(s) => s.clone(),
                Value::Number(n) => n.to_string(),
                other => return Err(bad(other.to_string(), "not a quantity".into())),
            };
            let units = parse_count(&raw).map_err(|e| bad(raw.clone(), e.to_string()))?;
            if units == 0 {
                continue;
            }
            let flavor = flavors
                .get(resource)
                .ok_or_else(|| AdmissionError::NoFlavor {
                    pod_set: pod_set.clone(),
                    resource: resource.clone(),
                })?;
            let slot = totals
                .entry((flavor.to_string(), resource.clone()))
                .or_default();
            *slot = slot.saturating_add(u64::from(units));
        }
    }
    Ok(totals
        .into_iter()
        .map(|((flavor, resource), device_units)| FlavorUsage {
            flavor,
            resource,
            device_units,
        })
        .collect())
}

/// The admission number of a Workload's current admission: 1 + the total of
/// `status.schedulingStats.evictions[].count`.
///
/// Why: it lives in the Workload's status (so it survives controller restarts
/// and is the same for every replica), Kueue only increments it (an eviction is
/// counted once, and every re-admission is preceded by an eviction), and the
/// list is capped at 256 (reason, cause) pairs so it is cheap. The QuotaReserved
/// condition's `lastTransitionTime` was rejected: it has one-second resolution
/// (two admissions within a second would collide) and it also moves on a
/// False transition. `requeueState.count` was rejected: Kueue resets it when a
/// deactivated Workload is reactivated, which would reuse old numbers.
///
/// The number already increments when Kueue marks the Workload evicted, before
/// it releases the quota: the controller must settle an admission with the
/// number stored on its Reserve entry, never recompute it at the end.
pub fn admission_number(workload: &Workload) -> Result<u32, AdmissionError> {
    let Some(stats) = &workload.status.scheduling_stats else {
        return Ok(1);
    };
    let mut total: u32 = 1;
    for (i, e) in stats.evictions.iter().enumerate() {
        let count = e
            .count
            .as_ref()
            .and_then(Value::as_u64)
            .and_then(|c| u32::try_from(c).ok())
            .ok_or_else(|| {
                malformed(
                    &format!("status.schedulingStats.evictions[{i}].count"),
                    "not a non-negative 32-bit integer",
                )
            })?;
        total = total
            .checked_add(count)
            .ok_or_else(|| malformed("status.schedulingStats.evictions", "count overflows"))?;
    }
    Ok(total)
}

/// The reservation horizon: `spec.maximumExecutionTimeSeconds` when set (Kueue
/// deactivates the Workload after it, so the reservation covers the whole run),
/// else `default_seconds`.
pub fn horizon_seconds(workload: &Workload, default_seconds: u64) -> u64 {
    workload
        .maximum_execution_seconds()
        .unwrap_or(default_seconds)
}

/// Everything a line needs to be priced and recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RateInfo {
    pub class: String,
    pub model: String,
    pub rate: Rate,
    pub rate_card: String,
}

/// The [`RateInfo`] of a flavor whose devices are `model` (a `FlavorReport`'s
/// `model`) in class `class_name`, whose rates are `rates`.
pub fn rate_info(class_name: &str, rates: &ClassRates, model: &str) -> RateInfo {
    RateInfo {
        class: class_name.to_string(),
        model: model.to_string(),
        rate: rates.for_model(model),
        rate_card: rates.rate_card().to_string(),
    }
}

/// One priced (flavor, resource) of a reservation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReservationLine {
    pub usage: FlavorUsage,
    pub rate: RateInfo,
    /// Price of the whole horizon for this line.
    pub credits: Credits,
}

/// The credits an admission needs for its whole horizon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    pub lines: Vec<ReservationLine>,
    /// Usage for which no rate was found (the admission must be rejected).
    pub unpriced: Vec<FlavorUsage>,
    pub horizon_seconds: u64,
    /// Sum of the lines' credits; fits an `i64` ledger amount.
    pub total: Credits,
}

/// Prices `usage` for `horizon_seconds` with [`cumulative`], the function every
/// post uses. Usage without a rate goes to `unpriced`; overflow is an error.
pub fn reservation(
    usage: &[FlavorUsage],
    rates: &dyn Fn(&FlavorUsage) -> Option<RateInfo>,
    horizon_seconds: u64,
) -> Result<Reservation, AdmissionError> {
    // A reservation covers at least one second (a term of 0 would never end).
    let horizon_seconds = horizon_seconds.max(1);
    let mut lines = Vec::new();
    let mut unpriced = Vec::new();
    let mut total: u128 = 0;
    for u in usage {
        match rates(u) {
            None => unpriced.push(u.clone()),
            Some(rate) => {
                let credits = cumulative(rate.rate, u.device_units, horizon_seconds)?;
                total += u128::from(credits.0);
                lines.push(ReservationLine {
                    usage: u.clone(),
                    rate,
                    credits,
                });
            }
        }
    }
    if total > i64::MAX as u128 {
        return Err(AdmissionError::TooLarge { micros: total });
    }
    Ok(Reservation {
        lines,
        unpriced,
        horizon_seconds,
        total: Credits(total as u64),
    })
}

/// What `decide` needs of a budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BudgetView {
    pub budget: String,
    pub team: String,
    pub balances: Balances,
}

/// What `decide` needs of a workload's admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    /// From [`admission_number`].
    pub admission: u32,
    /// When Kueue reserved quota (the QuotaReserved condition's
    /// `lastTransitionTime`), unix seconds: the pricing anchor.
    pub admitted_at: i64,
    /// The decision time, recorded as `created_at`.
    pub now: i64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Append these entries (at most one Reserve), then set the check Ready.
    Reserve { entries: Vec<Entry> },
    /// Keep the check Pending (or Retry, per the budget's policy) with `message`.
    Wait { message: String },
    /// The admission can never be priced: set the check Rejected with `message`.
    Reject { message: String },
}

pub(crate) fn format_duration(seconds: u64) -> String {
    match seconds {
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

/// `2 x nvidia-a10g for 2h at 1.5/device-hour + ...`: what the lines cost over
/// `seconds`, in the words the user sees.
pub(crate) fn describe_lines(lines: &[ReservationLine], seconds: u64) -> String {
    let mut out = String::new();
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str(" + ");
        }
        let _ = write!(
            out,
            "{} x {} for {} at {}/device-hour",
            l.usage.device_units,
            l.rate.model,
            format_duration(seconds),
            Credits(l.rate.rate.0)
        );
    }
    out
}

fn describe(res: &Reservation) -> String {
    describe_lines(&res.lines, res.horizon_seconds)
}

impl Reservation {
    /// The admission as charging sees it ([`Charge`]): its lines, in terms of the
    /// horizon from the admission time.
    pub fn charge(&self, budget: &BudgetView, workload: &WorkloadView) -> Charge {
        Charge {
            owner: ChargeOwner {
                budget: budget.budget.clone(),
                team: budget.team.clone(),
                namespace: workload.namespace.clone(),
                workload: workload.name.clone(),
                workload_uid: workload.uid.clone(),
                admission: workload.admission,
            },
            admitted_at: workload.admitted_at,
            term_seconds: self.horizon_seconds,
            lines: self.lines.clone(),
        }
    }
}

/// Reserve if the budget's remaining credits cover the reservation, else Wait
/// with the message the ML user sees; Reject when some usage has no rate.
/// An admission with no accelerator usage reserves nothing (empty entries).
pub fn decide(budget: &BudgetView, workload: &WorkloadView, reservation: &Reservation) -> Decision {
    if !reservation.unpriced.is_empty() {
        let what: Vec<String> = reservation
            .unpriced
            .iter()
            .map(|u| format!("{} x {} on flavor {}", u.device_units, u.resource, u.flavor))
            .collect();
        return Decision::Reject {
            message: format!(
                "budget {} has no credit rate for {}: no AcceleratorClass granted to team {} prices that flavor",
                budget.budget,
                what.join(", "),
                budget.team
            ),
        };
    }
    if reservation.lines.is_empty() {
        return Decision::Reserve { entries: vec![] };
    }
    let remaining = budget.balances.remaining();
    if remaining >= i128::from(reservation.total.0) {
        return Decision::Reserve {
            entries: reservation.charge(budget, workload).reserve_terms(
                0,
                1,
                "reserve",
                workload.now,
            ),
        };
    }
    Decision::Wait {
        message: format!(
            "team {} has {} credits left; this workload needs up to {} ({})",
            budget.team,
            format_micros(remaining),
            reservation.total,
            describe(reservation)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::CreditRate;
    use crate::ledger::EntryKind;
    use proptest::prelude::*;
    use serde_json::json;

    fn typed(v: &Value) -> Workload {
        serde_json::from_value(v.clone()).expect("a Workload")
    }

    fn workload() -> Value {
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": "job-train-7f2c", "namespace": "vision", "uid": "0b6e-uid"},
            "spec": {
                "queueName": "vision",
                "maximumExecutionTimeSeconds": 7200,
                "podSets": [
                    {"name": "launcher", "count": 1},
                    {"name": "workers", "count": 4},
                    {"name": "notebook", "count": 2}
                ]
            },
            "status": {
                "conditions": [{"type": "QuotaReserved", "status": "True",
                                "lastTransitionTime": "2025-01-01T00:00:00Z"}],
                "admission": {
                    "clusterQueue": "kaccel-vision",
                    "podSetAssignments": [
                        {"name": "launcher", "count": 1,
                         "flavors": {"cpu": "cpu-pool", "memory": "cpu-pool"},
                         "resourceUsage": {"cpu": "2", "memory": "4Gi"}},
                        {"name": "workers", "count": 4,
                         "flavors": {"cpu": "h100-pool", "memory": "h100-pool",
                                     "nvidia.com/mig-1g.10gb": "nvidia-h100-80gb-hbm3-mig-1g.10gb"},
                         "resourceUsage": {"cpu": "32", "memory": "256Gi",
                                           "nvidia.com/mig-1g.10gb": "8",
                                           "ephemeral-storage": "10Gi", "pods": "4"}},
                        {"name": "notebook", "count": 2,
                         "flavors": {"nvidia.com/gpu": "nvidia-a10g-SHARED"},
                         "resourceUsage": {"nvidia.com/gpu": "2", "hugepages-2Mi": "0"}}
                    ]
                },
                "schedulingStats": {"evictions": [
                    {"reason": "Preempted", "underlyingCause": "", "count": 2},
                    {"reason": "PodsReadyTimeout", "underlyingCause": "", "count": 1}
                ]}
            }
        })
    }

    #[test]
    fn usage_reads_totals_per_flavor_and_skips_core_resources() {
        let u = usage_from_workload(&typed(&workload())).unwrap();
        assert_eq!(
            u,
            vec![
                FlavorUsage {
                    flavor: "nvidia-a10g-SHARED".into(),
                    resource: "nvidia.com/gpu".into(),
                    device_units: 2,
                },
                FlavorUsage {
                    flavor: "nvidia-h100-80gb-hbm3-mig-1g.10gb".into(),
                    resource: "nvidia.com/mig-1g.10gb".into(),
                    device_units: 8,
                },
            ]
        );
        assert_eq!(admission_number(&typed(&workload())).unwrap(), 4);
        assert_eq!(horizon_seconds(&typed(&workload()), 3600), 7200);
        assert_eq!(admission_number(&typed(&json!({"status": {}}))).unwrap(), 1);
        assert_eq!(horizon_seconds(&typed(&json!({})), 3600), 3600);
    }

    #[test]
    fn bad_quantities_name_the_pod_set_and_resource() {
        for bad in ["0.5", "500m", "lots", "-1"] {
            let mut w = workload();
            w["status"]["admission"]["podSetAssignments"][1]["resourceUsage"]["nvidia.com/mig-1g.10gb"] =
                json!(bad);
            let e = usage_from_workload(&typed(&w)).unwrap_err().to_string();
            assert!(e.contains("workers") && e.contains("mig-1g.10gb"), "{e}");
        }
        let mut w = workload();
        w["status"]["admission"]["podSetAssignments"][2]["flavors"] = json!({});
        assert!(matches!(
            usage_from_workload(&typed(&w)),
            Err(AdmissionError::NoFlavor { .. })
        ));
        assert_eq!(
            usage_from_workload(&typed(&json!({"status": {}}))),
            Err(AdmissionError::NotAdmitted)
        );
        let mut w = workload();
        w["status"]["schedulingStats"]["evictions"][0]["count"] = json!(-1);
        assert!(admission_number(&typed(&w)).is_err());
    }

    fn rates(u: &FlavorUsage) -> Option<RateInfo> {
        let (model, r) = match u.resource.as_str() {
            "nvidia.com/gpu" => ("nvidia-a10g", "1.5"),
            "nvidia.com/mig-1g.10gb" => ("nvidia-h100-80gb-hbm3-mig-1g.10gb", "0.25"),
            _ => return None,
        };
        let spec = CreditRate {
            per_device_hour: r.into(),
            model_overrides: vec![],
        };
        Some(RateInfo {
            class: "gpu".into(),
            model: model.into(),
            rate: ClassRates::parse(&spec, Some(1)).ok()?.for_model(model),
            rate_card: ClassRates::parse(&spec, Some(1))
                .ok()?
                .rate_card()
                .to_string(),
        })
    }

    fn budget(remaining_credits: u64) -> BudgetView {
        let mut balances = Balances::default();
        balances.apply(EntryKind::Grant, Credits::whole(remaining_credits).0 as i64);
        BudgetView {
            budget: "vision".into(),
            team: "vision".into(),
            balances,
        }
    }

    fn view() -> WorkloadView {
        WorkloadView {
            namespace: "vision".into(),
            name: "job-train-7f2c".into(),
            uid: "0b6e-uid".into(),
            admission: 4,
            admitted_at: 1_735_689_600,
            now: 1_735_689_601,
        }
    }

    #[test]
    fn decide_reserves_waits_and_rejects() {
        let u = usage_from_workload(&typed(&workload())).unwrap();
        let res = reservation(&u, &rates, horizon_seconds(&typed(&workload()), 3600)).unwrap();
        // 2 x 1.5 x 2h + 8 x 0.25 x 2h = 6 + 4 = 10 credits.
        assert_eq!(res.total, Credits::whole(10));
        match decide(&budget(10), &view(), &res) {
            Decision::Reserve { entries } => {
                // One Reserve per line, each with its own flavor, units and rate.
                let lines: Vec<_> = entries
                    .iter()
                    .map(|e| (e.flavor.as_str(), e.device_units, e.credits, e.rate))
                    .collect();
                assert_eq!(
                    lines,
                    vec![
                        ("nvidia-a10g-SHARED", 2, 6_000_000, 1_500_000),
                        ("nvidia-h100-80gb-hbm3-mig-1g.10gb", 8, 4_000_000, 250_000),
                    ]
                );
                for e in &entries {
                    assert_eq!(
                        e.key,
                        format!(
                            "reserve/vision/0b6e-uid/4/1735689600/{}/{}",
                            e.flavor, e.resource
                        )
                    );
                    assert_eq!(e.end - e.start, 7200);
                    assert!(!e.flavor.contains('+') && !e.class.contains('+'));
                    e.validate().unwrap();
                }
            }
            d => panic!("{d:?}"),
        }
        match decide(&budget(3), &view(), &res) {
            Decision::Wait { message } => assert_eq!(
                message,
                "team vision has 3 credits left; this workload needs up to 10 \
                 (2 x nvidia-a10g for 2h at 1.5/device-hour + \
                 8 x nvidia-h100-80gb-hbm3-mig-1g.10gb for 2h at 0.25/device-hour)"
            ),
            d => panic!("{d:?}"),
        }
        let mut u2 = u.clone();
        u2.push(FlavorUsage {
            flavor: "mi300x".into(),
            resource: "amd.com/gpu".into(),
            device_units: 1,
        });
        match decide(
            &budget(100),
            &view(),
            &reservation(&u2, &rates, 3600).unwrap(),
        ) {
            Decision::Reject { message } => {
                assert!(message.contains("amd.com/gpu") && message.contains("mi300x"))
            }
            d => panic!("{d:?}"),
        }
        assert_eq!(
            decide(
                &budget(0),
                &view(),
                &reservation(&[], &rates, 3600).unwrap()
            ),
            Decision::Reserve { entries: vec![] }
        );
    }

    #[test]
    fn message_example_from_the_issue() {
        let usage = [FlavorUsage {
            flavor: "h100".into(),
            resource: "nvidia.com/gpu".into(),
            device_units: 4,
        }];
        let r = |_: &FlavorUsage| {
            Some(RateInfo {
                class: "gpu".into(),
                model: "nvidia-h100-80gb-hbm3".into(),
                rate: Rate(100_000_000),
                rate_card: "rc-x".into(),
            })
        };
        let res = reservation(&usage, &r, 3600).unwrap();
        match decide(&budget(120), &view(), &res) {
            Decision::Wait { message } => assert_eq!(
                message,
                "team vision has 120 credits left; this workload needs up to 400 \
                 (4 x nvidia-h100-80gb-hbm3 for 1h at 100/device-hour)"
            ),
            d => panic!("{d:?}"),
        }
    }

    proptest! {
        #[test]
        fn decide_never_reserves_more_than_remaining(rate in 0u64..1_000_000_000, units in 0u64..1000,
                horizon in 0u64..1_000_000, granted in 0i64..1_000_000_000_000, spent in 0i64..1_000_000_000_000) {
            let usage = [FlavorUsage { flavor: "f".into(), resource: "nvidia.com/gpu".into(), device_units: units }];
            let r = move |_: &FlavorUsage| Some(RateInfo { class: "c".into(), model: "m".into(), rate: Rate(rate), rate_card: "rc".into() });
            let res = reservation(&usage, &r, horizon).unwrap();
            let mut balances = Balances::default();
            balances.apply(EntryKind::Grant, granted);
            balances.apply(EntryKind::Correction, spent);
            let b = BudgetView { budget: "b".into(), team: "t".into(), balances };
            match decide(&b, &view(), &res) {
                Decision::Reserve { entries } => {
                    let sum: i128 = entries.iter().map(|e| i128::from(e.credits)).sum();
                    prop_assert!(sum <= balances.remaining());
                }
                Decision::Wait { message } => {
                    prop_assert!(i128::from(res.total.0) > balances.remaining());
                    prop_assert!(message.contains("credits left"));
                }
                Decision::Reject { .. } => prop_assert!(false, "priced usage rejected"),
            }
        }
    }
}
