//! Stage 9, status: the `Ready`, `Degraded`, `HealthUnknown` and `Invalid` conditions of class and budget reports.

use std::collections::BTreeMap;

use crate::api::{self, DesiredCondition, HealthCounts, ResolvedFlavor};

use super::{BudgetReport, ClassReport, FieldError, FlavorReport};

/// Completes every class report: an invalid class gets `Ready=False` and its
/// field errors; a valid one its flavors in preference order, device counts and
/// the `Ready`, `Degraded` and `HealthUnknown` conditions.
pub(super) fn classes(
    class_reports: &mut BTreeMap<String, ClassReport>,
    class_order: &BTreeMap<String, Vec<String>>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
) {
    for (cname, report) in class_reports.iter_mut() {
        if !report.valid {
            report.conditions = vec![
                DesiredCondition::new(
                    api::READY,
                    false,
                    "Invalid",
                    "the class is invalid; nothing is created for it",
                ),
                invalid_condition(&report.errors),
            ];
            continue;
        }
        let order = class_order.get(cname).cloned().unwrap_or_default();
        let mut devices = HealthCounts::default();
        for fname in &order {
            let r = &flavor_reports[fname];
            devices.add(&r.devices);
            report.flavors.push(ResolvedFlavor {
                name: fname.clone(),
                vendor: r
                    .vendor
                    .map(|v| v.to_string())
                    .unwrap_or_else(|| "none".into()),
                model: r.model.clone(),
                sharing: r.sharing.to_string(),
                partition_profile: r.partition_profile.clone(),
                resource_name: r.resource_name.clone(),
                nodes: r.nodes.len() as u32,
                devices: r.devices,
                healthy_capacity: r.healthy_capacity.min(u64::from(u32::MAX)) as u32,
                demoted: r.demoted,
            });
        }
        report.devices = devices;
        let out = devices.degraded + devices.failed;
        let demoted: Vec<&str> = report
            .flavors
            .iter()
            .filter(|f| f.demoted)
            .map(|f| f.name.as_str())
            .collect();
        if out > 0 || !demoted.is_empty() {
            let mut msg = format!(
                "{} of {} devices are degraded or failed and left out of quota",
                out,
                devices.total()
            );
            if !demoted.is_empty() {
                msg.push_str(&format!(
                    "; flavors moved later for health warnings: {}",
                    demoted.join(", ")
                ));
            }
            report.conditions.push(DesiredCondition::new(
                api::DEGRADED,
                true,
                "UnhealthyDevices",
                msg,
            ));
        } else {
            report.conditions.push(DesiredCondition::new(
                api::DEGRADED,
                false,
                "AllHealthy",
                "no device of this class is degraded or failed",
            ));
        }
        // Unknown is not unhealthy, but it must be visible (invariant 6).
        report.conditions.push(if devices.unknown > 0 {
            DesiredCondition::new(
                api::HEALTH_UNKNOWN,
                true,
                "NoFreshHealthData",
                format!(
                    "{} of {} devices have no fresh health data (a stale, unreachable or unparseable source, or a NotReady node); they still count as capacity and trigger no action, and undo none (devices last seen failed or degraded are counted as such until fresh readings show them healthy for the hold-down)",
                    devices.unknown,
                    devices.total()
                ),
            )
        } else {
            DesiredCondition::new(
                api::HEALTH_UNKNOWN,
                false,
                "HealthKnown",
                "every device has a fresh health reading or node status",
            )
        });
        let capacity: u64 = report
            .flavors
            .iter()
            .map(|f| u64::from(f.healthy_capacity))
            .sum();
        // A class left with no flavor because its flavors were refused as impure
        // says so, rather than blaming health.
        let blocking = report.conditions.iter().find(|c| {
            c.status
                && (c.type_ == api::NO_MATCHING_HARDWARE
                    || (c.reason == "ImpureFlavor" && report.flavors.is_empty()))
        });
        let ready = match blocking {
            Some(c) => {
                DesiredCondition::new(api::READY, false, c.reason.clone(), c.message.clone())
            }
            None if capacity == 0 => DesiredCondition::new(
                api::READY,
                false,
                "NoHealthyCapacity",
                "every device of this class is unschedulable, degraded or failed",
            ),
            None => DesiredCondition::new(
                api::READY,
                true,
                "Resolved",
                format!(
                    "{} flavor(s), {} healthy device(s) schedulable",
                    report.flavors.len(),
                    capacity
                ),
            ),
        };
        report.conditions.insert(0, ready);
    }
}

/// A valid budget's `Ready` condition: true when no other condition is, otherwise
/// false with the first true condition's reason and message.
pub(super) fn budget_ready(report: &BudgetReport) -> DesiredCondition {
    let ready = report.conditions.iter().all(|c| !c.status);
    if ready {
        DesiredCondition::new(
            api::READY,
            true,
            "Planned",
            format!(
                "{} ClusterQueue(s) and {} LocalQueue(s) planned",
                report.cluster_queues.len(),
                report.local_queues.len()
            ),
        )
    } else {
        let first = report
            .conditions
            .iter()
            .find(|c| c.status)
            .expect("a true condition");
        DesiredCondition::new(
            api::READY,
            false,
            first.reason.clone(),
            first.message.clone(),
        )
    }
}

/// An invalid budget's conditions: `Ready=False` and its field errors, nothing else.
pub(super) fn invalid_budgets(budget_reports: &mut BTreeMap<String, BudgetReport>) {
    for report in budget_reports.values_mut() {
        if !report.valid {
            report.conditions = vec![
                DesiredCondition::new(api::READY, false, "Invalid", "the budget is invalid"),
                invalid_condition(&report.errors),
            ];
        }
    }
}

fn invalid_condition(errors: &[FieldError]) -> DesiredCondition {
    DesiredCondition::new(
        api::INVALID,
        true,
        "FieldError",
        errors
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    )
}
