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
use crate::api::rates::ClassRates;
use crate::api::{self, Credits};
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
    Ok(total_usage(&pod_set_usage(workload)?))
}

/// The podSets' usage summed per (flavor, resource), sorted.
pub fn total_usage(pod_sets: &[PodSetUsage]) -> Vec<FlavorUsage> {
    let mut totals: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    for u in pod_sets.iter().flat_map(|p| &p.usage) {
        let slot = totals.entry((&u.flavor, &u.resource)).or_default();
        *slot = slot.saturating_add(u.device_units);
    }
    totals
        .into_iter()
        .map(|((flavor, resource), device_units)| FlavorUsage {
            flavor: flavor.to_string(),
            resource: resource.to_string(),
            device_units,
        })
        .collect()
}

/// The devices of one podSet of an admission, each counted once.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodSetUsage {
    pub name: String,
    /// Pods in the podSet (`count`, 1 when absent).
    pub pods: u64,
    /// Device units per (flavor, resource), sorted; see [`usage_from_workload`].
    pub usage: Vec<FlavorUsage>,
}

impl PodSetUsage {
    /// Devices of the whole podSet, every name together.
    pub fn devices(&self) -> u64 {
        self.usage.iter().map(|u| u.device_units).sum()
    }
}

/// [`usage_from_workload`] per podSet, in the admission's order.
///
/// One device, one count: Kueue counts each vendor device resource also as
/// [`api::CLASS_RESOURCE`] (the `Retain` transformation kaccel asks Kueue's
/// configuration for), so on one flavor the class resource's usage already
/// includes the vendor resources' usage. Each vendor resource is kept as its
/// own line, and the class resource only for what exceeds them (the devices
/// asked for by the neutral name): the flavor's devices are the larger of the
/// two, never their sum. Where Kueue does not transform (its configuration lacks
/// it, which kaccel reports), a pod asking for one name is still charged right.
pub fn pod_set_usage(workload: &Workload) -> Result<Vec<PodSetUsage>, AdmissionError> {
    // The containers are typed (the API server enforces Kueue's schema on them);
    // the leaves Kueue does not constrain as tightly are checked here.
    let assignments = &workload
        .status
        .admission
        .as_ref()
        .ok_or(AdmissionError::NotAdmitted)?
        .pod_set_assignments;
    let mut out = Vec::with_capacity(assignments.len());
    for (i, psa) in assignments.iter().enumerate() {
        let mut totals: BTreeMap<(String, String), u64> = BTreeMap::new();
        let field = format!("status.admission.podSetAssignments[{i}]");
        // Kueue defaults the name to "main".
        let pod_set = psa.name.clone().unwrap_or_else(|| "main".to_string());
        let pods = match &psa.count {
            None => 1,
            Some(count) if count.is_null() => 1,
            Some(count) => count.as_u64().ok_or_else(|| {
                malformed(&format!("{field}.count"), "not a non-negative integer")
            })?,
        };
        let no_flavors = BTreeMap::new();
        let flavors = psa.flavors.as_ref().unwrap_or(&no_flavors);
        let no_usage = BTreeMap::new();
        let usage = psa.resource_usage.as_ref().unwrap_or(&no_usage);
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
        out.push(PodSetUsage {
            name: pod_set,
            pods,
            usage: counted_once(totals),
        });
    }
    Ok(out)
}

/// Per flavor: each vendor resource's units as they are, and the class
/// resource's units only beyond their sum (see [`pod_set_usage`]).
fn counted_once(totals: BTreeMap<(String, String), u64>) -> Vec<FlavorUsage> {
    let mut vendor_units: BTreeMap<&str, u64> = BTreeMap::new();
    for ((flavor, resource), units) in &totals {
        if resource != api::CLASS_RESOURCE {
            *vendor_units.entry(flavor).or_default() += units;
        }
    }
    let mut out = Vec::with_capacity(totals.len());
    for ((flavor, resource), units) in &totals {
        let device_units = if resource == api::CLASS_RESOURCE {
            units.saturating_sub(vendor_units.get(flavor.as_str()).copied().unwrap_or(0))
        } else {
            *units
        };
        if device_units > 0 {
            out.push(FlavorUsage {
                flavor: flavor.clone(),
                resource: resource.clone(),
                device_units,
            });
        }
    }
    out
}

/// The devices of one flavor in a Kueue resource list (`[{name, <field>: quantity}]`,
/// as in a ClusterQueue's `resources` or `flavorsReservation`), each counted once:
/// the class resource already counts the vendor resources (Kueue's `Retain`
/// transformation, see [`pod_set_usage`]), so the larger of the class resource
/// and the vendor resources' sum, never their sum. Non-accelerator resources and
/// quantities that are not whole counts are left out.
pub fn flavor_devices(resources: &Value, field: &str) -> u64 {
    count_devices(
        resources
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| Some((r["name"].as_str()?, r[field].as_str()?))),
    )
}

/// [`flavor_devices`] of one flavor of a ClusterQueue's typed
/// `status.flavorsReservation`, its `total`s.
pub fn reserved_devices(usage: &crate::kueue::FlavorUsage) -> u64 {
    count_devices(
        usage
            .resources
            .iter()
            .filter_map(|r| Some((r.name.as_str(), r.total.as_ref()?.0.as_str()))),
    )
}

/// The counting rule of [`flavor_devices`] over (resource name, quantity) pairs.
fn count_devices<'a>(resources: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let (mut class_units, mut vendor_units) = (0u64, 0u64);
    for (name, quantity) in resources {
        if !is_accelerator_resource(name) {
            continue;
        }
        let Ok(units) = parse_count(quantity) else {
            continue;
        };
        if name == api::CLASS_RESOURCE {
            class_units += u64::from(units);
        } else {
            vendor_units += u64::from(units);
        }
    }
    class_units.max(vendor_units)
}

/// The first podSet whose pods ask for devices by the class resource and by a
/// vendor resource together, with that vendor resource. Kueue cannot count such
/// a pod once: its transformation writes the vendor resource's class-resource
/// count over or onto the pod's own (Go map order decides, v0.17
/// `pkg/workload/workload.go`), so the check refuses it rather than admit
/// devices the quota did not see.
pub fn asks_by_two_names(workload: &Workload) -> Option<(&str, &str)> {
    workload.spec.pod_sets.iter().find_map(|p| {
        if !p.resources.contains(api::CLASS_RESOURCE) {
            return None;
        }
        p.resources
            .iter()
            .find(|r| *r != api::CLASS_RESOURCE && is_accelerator_resource(r))
            .map(|vendor| (p.name.as_str(), vendor.as_str()))
    })
}

/// A podSet whose claim asks for one flavor's devices (a kaccel DeviceClass,
/// `<flavor>.kaccel.io`) while Kueue assigned its class resource another flavor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MisplacedClaim {
    pub pod_set: String,
    pub template: String,
    pub device_class: String,
    pub claim_flavor: String,
    pub assigned_flavor: String,
}

/// The first podSet of an admitted `workload` whose claim would wait forever:
/// Kueue counts a claim of any kaccel DeviceClass as the class resource (one
/// device, one count) and may place it on any flavor of the class with room,
/// but the claim can only be given devices of its own DeviceClass's flavor.
/// `device_classes` maps each ResourceClaimTemplate name to the DeviceClasses
/// its requests name (templates not in it are not kaccel's concern).
pub fn misplaced_claim(
    workload: &Workload,
    device_classes: &BTreeMap<String, Vec<String>>,
) -> Option<MisplacedClaim> {
    let assignments = &workload.status.admission.as_ref()?.pod_set_assignments;
    workload.spec.pod_sets.iter().find_map(|p| {
        let assigned = assignments
            .iter()
            .find(|a| a.name.as_deref().unwrap_or("main") == p.name)?
            .flavors
            .as_ref()?
            .get(api::CLASS_RESOURCE)?;
        p.claim_templates.iter().find_map(|template| {
            device_classes.get(template)?.iter().find_map(|dc| {
                let flavor = dc.strip_suffix(crate::plan::device_classes::DEVICE_CLASS_SUFFIX)?;
                (flavor != assigned).then(|| MisplacedClaim {
                    pod_set: p.name.clone(),
                    template: template.clone(),
                    device_class: dc.clone(),
                    claim_flavor: flavor.to_string(),
                    assigned_flavor: assigned.to_string(),
                })
            })
        })
    })
}

/// `8`, `1 or 2`, `1, 2 or 4`: allowed device counts in the words a user reads.
pub fn describe_counts(counts: &[u32]) -> String {
    match counts {
        [] => "any number of".to_string(),
        [one] => one.to_string(),
        [rest @ .., last] => format!(
            "{} or {last}",
            rest.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// The first podSet whose pods ask for a device count `allowed` does not list
/// (podSets without devices, e.g. a launcher, are not held to it): its name and
/// the count per pod, or `None` when every podSet fits or `allowed` is empty.
pub fn disallowed_devices_per_pod(
    pod_sets: &[PodSetUsage],
    allowed: &[u32],
) -> Option<(String, String)> {
    if allowed.is_empty() {
        return None;
    }
    pod_sets.iter().find_map(|p| {
        let devices = p.devices();
        if devices == 0 {
            return None;
        }
        let per_pod = (p.pods > 0 && devices % p.pods == 0).then(|| devices / p.pods);
        match per_pod {
            Some(n) if u32::try_from(n).is_ok_and(|n| allowed.contains(&n)) => None,
            Some(n) => Some((p.name.clone(), n.to_string())),
            None => Some((
                p.name.clone(),
                format!(
                    "{devices} over {} pod(s), not the same count in each",
                    p.pods
                ),
            )),
        }
    })
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
    /// The MultiKueue worker it runs in (`status.clusterName`; empty: here, or
    /// not dispatched yet).
    pub cluster: String,
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
            devices: vec![],
            cluster: workload.cluster.clone(),
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
mod tests;
