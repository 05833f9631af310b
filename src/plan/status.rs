//! Stage 9, status: the Ready, Degraded, HealthUnknown, UnlabelledModels and Invalid
//! conditions of reports.

use std::collections::BTreeMap;

use crate::api::{self, DesiredCondition, HealthCounts, ResolvedFlavor};

use super::{BudgetReport, ClassReport, FieldError, FlavorReport};
use crate::api::AcceleratorClass;
use crate::inventory::{Inventory, Vendor};

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
        let order = class_order
            .get(cname)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let mut devices = HealthCounts::default();
        for fname in order {
            let flavor = &flavor_reports[fname];
            devices.add(&flavor.devices);
            report.flavors.push(resolved_flavor(fname, flavor));
        }
        report.devices = devices;
        let mut trend_rules: BTreeMap<&str, u32> = BTreeMap::new();
        for fname in order {
            for (rule, nodes) in &flavor_reports[fname].trend_rules {
                *trend_rules.entry(rule).or_default() += nodes;
            }
        }
        let degraded = degraded_condition(&devices, &report.flavors, &trend_rules);
        report.conditions.push(degraded);
        // Unknown is not unhealthy, but it must be visible (invariant 6).
        report.conditions.push(health_unknown_condition(&devices));
        let ready = class_ready(report);
        report.conditions.insert(0, ready);
    }
}

/// A DRA-only flavor whose DeviceClass a class requirement kept from being
/// written: `DeviceClassesReady` False on the class, naming the field. The flavor
/// keeps its quota (in its logical resource), but no claim is counted against it
/// until its DeviceClass exists.
pub(super) fn device_class_problems(
    class_reports: &mut BTreeMap<String, ClassReport>,
    problems: &[super::device_classes::DeviceClassProblem],
) {
    let mut by_class: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for p in problems {
        by_class.entry(&p.class).or_default().push(&p.message);
    }
    for (class, messages) in by_class {
        if let Some(report) = class_reports.get_mut(class) {
            report.conditions.push(DesiredCondition::new(
                api::DEVICE_CLASSES_READY,
                false,
                "RequirementNotExpressible",
                messages.join("; "),
            ));
        }
    }
}

/// Devices a vendor adapter knew but could not name the model of, per (vendor,
/// resource): how many, on which nodes. The inventory offers them to no class
/// (an unknown model could be a partition or a time-shared card; a flavor for them
/// would pin only the vendor's presence label, pooling every unlabelled model).
pub(super) type UnlabelledModels = BTreeMap<(Vendor, String), (u64, Vec<String>)>;

pub(super) fn unlabelled_models(inventory: &Inventory) -> UnlabelledModels {
    let mut out = UnlabelledModels::new();
    for (node, u) in inventory.unclassified() {
        if let Some(vendor) = u.unlabelled_model_of {
            let entry = out.entry((vendor, u.source.clone())).or_default();
            entry.0 += u64::from(u.count);
            entry.1.push(node.name.clone());
        }
    }
    out
}

/// `UnlabelledModels` on every valid class: True, naming them, while devices of a
/// vendor the class selects (or any, for a class naming no vendor) are left out of
/// every flavor because no node label names their model.
pub(super) fn unlabelled_models_condition(
    class_reports: &mut BTreeMap<String, ClassReport>,
    classes: &BTreeMap<String, &AcceleratorClass>,
    unlabelled: &UnlabelledModels,
) {
    for (name, report) in class_reports.iter_mut() {
        let Some(class) = classes.get(name).filter(|_| report.valid) else {
            continue;
        };
        let vendors = &class.spec.selector.vendors;
        let missed: Vec<String> = unlabelled
            .iter()
            .filter(|((vendor, _), _)| vendors.is_empty() || vendors.contains(vendor))
            .map(|((_, resource), (count, nodes))| {
                format!(
                    "{count} {resource} on {} node(s) ({})",
                    nodes.len(),
                    crate::k8s::names::first_few(nodes.iter().map(String::as_str), 5)
                )
            })
            .collect();
        report.conditions.push(if missed.is_empty() {
            DesiredCondition::new(
                api::UNLABELLED_MODELS,
                false,
                "ModelsLabelled",
                "a node label names the model of every device this class could pool",
            )
        } else {
            DesiredCondition::new(
                api::UNLABELLED_MODELS,
                true,
                "NoModelLabel",
                format!(
                    "no node label names the model of {}: they are in no flavor (a flavor pinned by the vendor's presence label alone would pool every unlabelled model, partitions and time-shared cards included); run the vendor's labeller, or label the nodes {}=<model>",
                    missed.join(", "),
                    crate::inventory::MODEL_LABEL
                ),
            )
        });
    }
}

/// A flavor as a class's status lists it.
fn resolved_flavor(name: &str, r: &FlavorReport) -> ResolvedFlavor {
    ResolvedFlavor {
        name: name.to_string(),
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
        // Filled, with the class's blocks, by the topology stage.
        topology: None,
    }
}

/// `Degraded`: devices out of quota for health, and flavors demoted for warnings.
fn degraded_condition(
    devices: &HealthCounts,
    flavors: &[ResolvedFlavor],
    trend_rules: &BTreeMap<&str, u32>,
) -> DesiredCondition {
    let out = devices.degraded + devices.failed;
    let demoted: Vec<&str> = flavors
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
        if !trend_rules.is_empty() {
            // Rule names and node counts only: stable while the rule holds, so the
            // status is not rewritten on every poll.
            let holding: Vec<String> = trend_rules
                .iter()
                .map(|(rule, nodes)| {
                    format!(
                        "{rule} ({nodes} node{})",
                        if *nodes == 1 { "" } else { "s" }
                    )
                })
                .collect();
            msg.push_str(&format!(
                "; health trend rules holding: {}",
                holding.join(", ")
            ));
        }
        DesiredCondition::new(api::DEGRADED, true, "UnhealthyDevices", msg)
    } else {
        DesiredCondition::new(
            api::DEGRADED,
            false,
            "AllHealthy",
            "no device of this class is degraded or failed",
        )
    }
}

fn health_unknown_condition(devices: &HealthCounts) -> DesiredCondition {
    if devices.unknown > 0 {
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
    }
}

/// A valid class's `Ready` condition: false when no hardware matched, when every
/// flavor was refused as impure, or when no healthy device is schedulable.
fn class_ready(report: &ClassReport) -> DesiredCondition {
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
    match blocking {
        Some(c) => DesiredCondition::new(api::READY, false, c.reason.clone(), c.message.clone()),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn condition(type_: &str, reason: &str) -> DesiredCondition {
        DesiredCondition::new(type_, true, reason, format!("{reason} happened"))
    }

    #[test]
    fn a_budget_is_ready_until_a_condition_holds() {
        // A condition that does not hold does not block.
        let mut report = BudgetReport {
            valid: true,
            cluster_queues: vec!["team-gpu".into()],
            local_queues: vec!["ns/gpu".into(), "ns2/gpu".into()],
            conditions: vec![DesiredCondition::new(
                api::EXHAUSTED,
                false,
                "CreditsLeft",
                "credits left",
            )],
            ..Default::default()
        };
        let ready = budget_ready(&report);
        assert!(ready.status);
        assert_eq!(
            ready.message,
            "1 ClusterQueue(s) and 2 LocalQueue(s) planned"
        );
        report.conditions = vec![
            DesiredCondition::new(api::CONFLICT, false, "Fine", "nothing"),
            condition(api::QUOTA_SHORTFALL, "NotEnoughHealthyCapacity"),
            condition(api::EXHAUSTED, "CreditsExhausted"),
        ];
        let ready = budget_ready(&report);
        assert!(!ready.status);
        assert_eq!(ready.reason, "NotEnoughHealthyCapacity");
        assert_eq!(ready.message, "NotEnoughHealthyCapacity happened");
    }

    #[test]
    fn invalid_reports_show_only_ready_false_and_their_field_errors() {
        let error = |field: &str| FieldError {
            field: field.into(),
            message: "is wrong".into(),
        };
        let mut budget_reports = BTreeMap::from([
            (
                "broken".to_string(),
                BudgetReport {
                    errors: vec![error("spec.namespaces"), error("spec.classes")],
                    conditions: vec![condition(api::CONFLICT, "NamespaceClaimed")],
                    ..Default::default()
                },
            ),
            (
                "fine".to_string(),
                BudgetReport {
                    valid: true,
                    conditions: vec![condition(api::CONFLICT, "NamespaceClaimed")],
                    ..Default::default()
                },
            ),
        ]);
        invalid_budgets(&mut budget_reports);
        let broken = &budget_reports["broken"].conditions;
        assert_eq!(broken.len(), 2);
        assert_eq!(
            (broken[0].type_.as_str(), broken[0].status),
            (api::READY, false)
        );
        assert_eq!(broken[1].type_, api::INVALID);
        assert_eq!(
            broken[1].message,
            "spec.namespaces: is wrong; spec.classes: is wrong"
        );
        assert_eq!(
            budget_reports["fine"].conditions[0].reason,
            "NamespaceClaimed"
        );

        let mut class_reports = BTreeMap::from([(
            "bad".to_string(),
            ClassReport {
                errors: vec![error("spec.selector")],
                ..Default::default()
            },
        )]);
        classes(&mut class_reports, &BTreeMap::new(), &BTreeMap::new());
        let reasons: Vec<&str> = class_reports["bad"]
            .conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect();
        assert_eq!(reasons, ["Invalid", "FieldError"]);
    }

    #[test]
    fn a_class_reports_its_flavors_health_and_readiness() {
        let flavor = |capacity: u64, devices: HealthCounts, demoted: bool| FlavorReport {
            model: "GPU".into(),
            healthy_capacity: capacity,
            devices,
            demoted,
            ..Default::default()
        };
        let flavor_reports = BTreeMap::from([
            (
                "ok".to_string(),
                flavor(
                    3,
                    HealthCounts {
                        healthy: 3,
                        unknown: 1,
                        ..Default::default()
                    },
                    false,
                ),
            ),
            (
                "warm".to_string(),
                flavor(
                    0,
                    HealthCounts {
                        warning: 2,
                        failed: 2,
                        ..Default::default()
                    },
                    true,
                ),
            ),
        ]);
        let mut flavor_reports = flavor_reports;
        flavor_reports.get_mut("warm").unwrap().trend_rules =
            BTreeMap::from([("repeated-resets".to_string(), 2)]);
        let valid = || ClassReport {
            valid: true,
            ..Default::default()
        };
        let mut class_reports = BTreeMap::from([
            ("both".to_string(), valid()),
            ("broken".to_string(), valid()),
        ]);
        let class_order = BTreeMap::from([
            (
                "both".to_string(),
                vec!["ok".to_string(), "warm".to_string()],
            ),
            ("broken".to_string(), vec!["warm".to_string()]),
        ]);
        classes(&mut class_reports, &class_order, &flavor_reports);

        let both = &class_reports["both"];
        let flavors: Vec<&str> = both.flavors.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(flavors, ["ok", "warm"]);
        assert_eq!(both.devices.total(), 8);
        let summary: Vec<(&str, bool, &str)> = both
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status, c.reason.as_str()))
            .collect();
        assert_eq!(
            summary,
            [
                (api::READY, true, "Resolved"),
                (api::DEGRADED, true, "UnhealthyDevices"),
                (api::HEALTH_UNKNOWN, true, "NoFreshHealthData"),
            ]
        );
        assert!(both.conditions[1].message.contains("health warnings: warm"));
        assert!(
            both.conditions[1]
                .message
                .ends_with("; health trend rules holding: repeated-resets (2 nodes)"),
            "{}",
            both.conditions[1].message
        );
        assert_eq!(
            both.conditions[0].message,
            "2 flavor(s), 3 healthy device(s) schedulable"
        );

        let broken = &class_reports["broken"].conditions[0];
        assert_eq!(
            (broken.status, broken.reason.as_str()),
            (false, "NoHealthyCapacity")
        );
    }
}
