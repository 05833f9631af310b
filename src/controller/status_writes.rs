//! What AcceleratorClass and CreditBudget statuses say, written only when it changed.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt, stream};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::name_conflicts::with_name_conflicts;
use super::reconcile::Reconciler;
use super::{Error, api_err, credits};
use crate::api::{
    AcceleratorClass, AcceleratorClassStatus, CreditBudget, CreditBudgetStatus, DesiredCondition,
    ResolvedFlavor, merge_conditions,
};
use crate::plan::Plan;
use crate::plan::nodes::HeldBack;

/// Status writes sent at once (classes and budgets are independent objects).
const STATUS_WRITES_IN_FLIGHT: usize = 8;

impl Reconciler {
    /// `limited`: flavor -> (nodes allowed out, nodes held back by the share limit).
    pub(super) async fn write_class_status<'a>(
        &'a self,
        classes: &'a [AcceleratorClass],
        planned: &'a Plan,
        limited: &'a std::collections::BTreeMap<String, (u32, Vec<String>)>,
        name_conflicts: &'a BTreeMap<String, Vec<String>>,
    ) -> Result<(), Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<AcceleratorClass> = Api::all(self.client.clone());
        let (api, now) = (&api, &now);
        let write_one = |class: &'a AcceleratorClass| async move {
            let name = class.name_any();
            let Some(report) = planned.classes.get(&name) else {
                return Ok(());
            };
            let existing = class.status.clone().unwrap_or_default();
            let generation = class.metadata.generation;
            let mut desired =
                with_name_conflicts(report.conditions.clone(), name_conflicts.get(&name));
            desired.push(automation_limited_condition(&report.flavors, limited));
            let status = AcceleratorClassStatus {
                observed_generation: generation,
                summary: (!report.flavors.is_empty()).then(|| {
                    report
                        .flavors
                        .iter()
                        .map(|f| f.name.as_str())
                        .collect::<Vec<_>>()
                        .join(",")
                }),
                flavors: report.flavors.clone(),
                devices: report.devices,
                conditions: merge_conditions(&existing.conditions, &desired, now, generation),
            };
            if status == existing {
                return Ok(());
            }
            let was_ready = condition_true(&existing.conditions, crate::api::READY);
            let patch = json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass", "status": status});
            api.patch_status(
                &name,
                &PatchParams::apply(&self.config.field_manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(api_err(format!("writing AcceleratorClass {name} status")))?;
            self.metrics.write("AcceleratorClass", "status");
            let now_ready = condition_true(&status.conditions, crate::api::READY).unwrap_or(false);
            if was_ready != Some(now_ready) {
                let first = status.conditions.first();
                self.publish(
                    &class.object_ref(&()),
                    if now_ready {
                        EventType::Normal
                    } else {
                        EventType::Warning
                    },
                    first.map(|c| c.reason.as_str()).unwrap_or("Reconciled"),
                    first.map(|c| c.message.as_str()).unwrap_or(""),
                )
                .await;
            }
            Ok::<(), Error>(())
        };
        stream::iter(classes)
            .map(write_one)
            .buffer_unordered(STATUS_WRITES_IN_FLIGHT)
            .try_collect()
            .await
    }

    /// `missing`: budget -> namespaces whose LocalQueues could not be created.
    pub(super) async fn write_budget_status<'a>(
        &'a self,
        budgets: &'a [CreditBudget],
        planned: &'a Plan,
        missing: &'a std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
        ledger_views: &'a BTreeMap<String, credits::BudgetLedgerView>,
        name_conflicts: &'a BTreeMap<String, Vec<String>>,
    ) -> Result<(), Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let api: Api<CreditBudget> = Api::all(self.client.clone());
        let (api, now) = (&api, &now);
        let write_one = |budget: &'a CreditBudget| async move {
            let name = budget.name_any();
            let Some(report) = planned.budgets.get(&name) else {
                return Ok(());
            };
            let existing = budget.status.clone().unwrap_or_default();
            let generation = budget.metadata.generation;
            let mut desired =
                with_name_conflicts(report.conditions.clone(), name_conflicts.get(&name));
            if report.valid {
                desired.push(namespace_missing_condition(missing.get(&name)));
            }
            let view = ledger_views.get(&name);
            if self.ledger.is_some() {
                desired.push(ledger_condition(view));
                desired.push(overdraft_condition(view));
            }
            let figure = |f: fn(&credits::BudgetLedgerView) -> i128| {
                view.map(|v| crate::ledger::entry::format_micros(f(v)))
            };
            let time = |t: Option<i64>| {
                t.and_then(|s| k8s_openapi::jiff::Timestamp::from_second(s).ok())
                    .map(Time)
            };
            let status = CreditBudgetStatus {
                observed_generation: generation,
                cohort: report.cohort.clone(),
                cluster_queues: report.cluster_queues.clone(),
                local_queues: report.local_queues.clone(),
                conditions: merge_conditions(&existing.conditions, &desired, now, generation),
                granted: figure(|v| v.balances.granted),
                reserved: figure(|v| v.balances.reserved),
                spent: figure(|v| v.balances.spent),
                remaining: figure(|v| v.balances.remaining()),
                burn_rate_per_hour: figure(|v| v.burn_per_hour),
                projected_exhaustion: time(view.and_then(|v| v.projected_exhaustion)),
                period_start: time(view.and_then(|v| v.period.map(|p| p.0))),
                period_end: time(view.and_then(|v| v.period.map(|p| p.1))),
            };
            if status == existing {
                return Ok(());
            }
            let patch = json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget", "status": status});
            api.patch_status(
                &name,
                &PatchParams::apply(&self.config.field_manager).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(api_err(format!("writing CreditBudget {name} status")))?;
            self.metrics.write("CreditBudget", "status");
            let exhausted_now =
                condition_true(&status.conditions, crate::api::EXHAUSTED) == Some(true);
            let exhausted_before =
                condition_true(&existing.conditions, crate::api::EXHAUSTED) == Some(true);
            if exhausted_now && !exhausted_before {
                self.publish(
                    &budget.object_ref(&()),
                    EventType::Warning,
                    "BudgetExhausted",
                    "credits are used up; new work waits",
                )
                .await;
            }
            Ok::<(), Error>(())
        };
        stream::iter(budgets)
            .map(write_one)
            .buffer_unordered(STATUS_WRITES_IN_FLIGHT)
            .try_collect()
            .await
    }
}

/// `AutomationLimited` on a class: the share limit held node actions back on
/// one of its flavors. Said on every class using the flavor, next to the metric
/// and the Node Events.
fn automation_limited_condition(
    flavors: &[ResolvedFlavor],
    limited: &BTreeMap<String, (u32, Vec<String>)>,
) -> DesiredCondition {
    let held: Vec<String> = flavors
        .iter()
        .filter_map(|f| {
            limited.get(&f.name).map(|(allowed, nodes)| {
                format!(
                    "{}: {} node(s) not taken out ({}) because {allowed} already are (maxSharePercent)",
                    f.name,
                    nodes.len(),
                    nodes.join(", ")
                )
            })
        })
        .collect();
    if held.is_empty() {
        DesiredCondition::new(
            "AutomationLimited",
            false,
            "WithinShare",
            "node actions are within the configured share of each flavor",
        )
    } else {
        DesiredCondition::new(
            "AutomationLimited",
            true,
            "ShareLimitReached",
            held.join("; "),
        )
    }
}

/// `NamespaceMissing` on a valid budget: `missing` names the namespaces whose
/// LocalQueues could not be created (tried again later, not an error).
fn namespace_missing_condition(missing: Option<&BTreeSet<String>>) -> DesiredCondition {
    match missing {
        Some(namespaces) => DesiredCondition::new(
            "NamespaceMissing",
            true,
            "NamespaceNotFound",
            format!(
                "spec.namespaces: {} do(es) not exist: create them; their LocalQueues are created as soon as they do",
                namespaces.iter().cloned().collect::<Vec<_>>().join(", ")
            ),
        ),
        None => DesiredCondition::new(
            "NamespaceMissing",
            false,
            "NamespacesExist",
            "every namespace in spec.namespaces has its LocalQueues",
        ),
    }
}

/// Flavor -> (nodes allowed out, nodes held back by the share limit).
pub(super) fn share_limited(held_back: &[HeldBack]) -> BTreeMap<String, (u32, Vec<String>)> {
    held_back.iter().fold(Default::default(), |mut m, h| {
        let e = m.entry(h.flavor.clone()).or_insert((h.allowed, Vec::new()));
        e.1.push(h.node.clone());
        m
    })
}

/// `LedgerInSync` on a budget: the ledger answers and matches Kueue.
fn ledger_condition(view: Option<&credits::BudgetLedgerView>) -> crate::api::DesiredCondition {
    use crate::api::DesiredCondition;
    match view {
        None => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "LedgerPending",
            "the ledger has not looked at this budget yet (is the ledger store reachable?)",
        ),
        Some(v) if v.error.is_some() => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "LedgerError",
            v.error.clone().unwrap_or_default(),
        ),
        Some(v) if !v.drift.is_empty() => DesiredCondition::new(
            LEDGER_IN_SYNC,
            false,
            "Drift",
            format!(
                "the ledger and Kueue disagree ({} finding(s)): {}",
                v.drift.len(),
                v.drift
                    .iter()
                    .take(5)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join("; ")
            ),
        ),
        Some(_) => DesiredCondition::new(
            LEDGER_IN_SYNC,
            true,
            "InSync",
            "open reservations match the Workloads holding quota, and charged devices match Kueue's usage",
        ),
    }
}

/// `Overdrawn` on a budget: running work renewed its reservations into the
/// overdraft the budget allows (`remaining` below zero). Visible, never silent.
fn overdraft_condition(view: Option<&credits::BudgetLedgerView>) -> crate::api::DesiredCondition {
    use crate::api::{DesiredCondition, OVERDRAWN};
    match view.map(|v| v.balances.remaining()) {
        Some(remaining) if remaining < 0 => DesiredCondition::new(
            OVERDRAWN,
            true,
            "Overdraft",
            format!(
                "remaining credits are {}: running work renewed its reservations into the overdraft spec.admission.overdraftLimit allows; new work waits until credits return",
                crate::ledger::entry::format_micros(remaining)
            ),
        ),
        _ => DesiredCondition::new(
            OVERDRAWN,
            false,
            "NotOverdrawn",
            "remaining credits are not below zero",
        ),
    }
}

/// Condition type of the ledger's reconciliation on a CreditBudget.
pub const LEDGER_IN_SYNC: &str = "LedgerInSync";

fn condition_true(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<bool> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::entry::Balances;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn view(granted: i128, spent: i128) -> credits::BudgetLedgerView {
        credits::BudgetLedgerView {
            balances: Balances {
                granted,
                reserved: 0,
                spent,
            },
            ..Default::default()
        }
    }

    fn said(c: &DesiredCondition) -> (&str, bool, &str) {
        (c.type_.as_str(), c.status, c.reason.as_str())
    }

    #[test]
    fn ledger_in_sync_says_pending_error_drift_or_in_sync() {
        assert_eq!(
            said(&ledger_condition(None)),
            (LEDGER_IN_SYNC, false, "LedgerPending")
        );
        let clean = view(10_000_000, 0);
        assert_eq!(
            said(&ledger_condition(Some(&clean))),
            (LEDGER_IN_SYNC, true, "InSync")
        );
        let drifted = credits::BudgetLedgerView {
            drift: (1..=7).map(|i| format!("finding {i}")).collect(),
            ..clean.clone()
        };
        let c = ledger_condition(Some(&drifted));
        assert_eq!(said(&c), (LEDGER_IN_SYNC, false, "Drift"));
        assert!(c.message.contains("(7 finding(s))"), "{}", c.message);
        assert!(c.message.contains("finding 5"), "{}", c.message);
        assert!(
            !c.message.contains("finding 6"),
            "only the first five: {}",
            c.message
        );
        // An error wins over drift: the findings may be stale.
        let failing = credits::BudgetLedgerView {
            error: Some("store unreachable".into()),
            ..drifted
        };
        let c = ledger_condition(Some(&failing));
        assert_eq!(said(&c), (LEDGER_IN_SYNC, false, "LedgerError"));
        assert_eq!(c.message, "store unreachable");
    }

    #[test]
    fn overdrawn_only_when_remaining_is_below_zero() {
        let c = overdraft_condition(Some(&view(1_000_000, 2_500_000)));
        assert_eq!(said(&c), (crate::api::OVERDRAWN, true, "Overdraft"));
        assert!(
            c.message.contains("remaining credits are -1.5"),
            "{}",
            c.message
        );
        for v in [Some(view(1_000_000, 1_000_000)), Some(view(2, 1)), None] {
            let c = overdraft_condition(v.as_ref());
            assert_eq!(
                said(&c),
                (crate::api::OVERDRAWN, false, "NotOverdrawn"),
                "{v:?}"
            );
        }
    }

    #[test]
    fn condition_true_reads_one_type_and_none_when_absent() {
        let conditions: Vec<Condition> = serde_json::from_value(json!([
            {"type": "Ready", "status": "True", "reason": "Planned", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Exhausted", "status": "False", "reason": "CreditsLeft", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"},
            {"type": "Conflict", "status": "Unknown", "reason": "NotChecked", "message": "",
             "lastTransitionTime": "2026-01-01T00:00:00Z"}
        ]))
        .unwrap();
        assert_eq!(condition_true(&conditions, "Ready"), Some(true));
        assert_eq!(condition_true(&conditions, "Exhausted"), Some(false));
        assert_eq!(condition_true(&conditions, "Conflict"), Some(false));
        assert_eq!(condition_true(&conditions, "Overdrawn"), None);
        assert_eq!(condition_true(&[], "Ready"), None);
    }

    fn held(node: &str, flavor: &str, allowed: u32) -> HeldBack {
        HeldBack {
            node: node.into(),
            flavor: flavor.into(),
            allowed,
            reason: "gpu failed".into(),
        }
    }

    #[test]
    fn held_back_nodes_are_grouped_by_flavor_with_the_allowed_count() {
        let limited = share_limited(&[
            held("n1", "h100", 2),
            held("n2", "mi300", 1),
            held("n3", "h100", 2),
        ]);
        assert_eq!(
            limited,
            BTreeMap::from([
                (
                    "h100".to_string(),
                    (2, vec!["n1".to_string(), "n3".to_string()])
                ),
                ("mi300".to_string(), (1, vec!["n2".to_string()])),
            ])
        );
        assert!(share_limited(&[]).is_empty());
    }

    #[test]
    fn automation_limited_names_the_held_back_nodes_of_the_class_flavors_only() {
        let flavor = |name: &str| ResolvedFlavor {
            name: name.into(),
            ..Default::default()
        };
        let limited = share_limited(&[
            held("n1", "h100", 2),
            held("n3", "h100", 2),
            held("n9", "mi300", 1),
        ]);
        let c = automation_limited_condition(&[flavor("h100"), flavor("a100")], &limited);
        assert_eq!(said(&c), ("AutomationLimited", true, "ShareLimitReached"));
        assert_eq!(
            c.message,
            "h100: 2 node(s) not taken out (n1, n3) because 2 already are (maxSharePercent)"
        );
        let c = automation_limited_condition(&[flavor("a100")], &limited);
        assert_eq!(said(&c), ("AutomationLimited", false, "WithinShare"));
        let c = automation_limited_condition(&[], &BTreeMap::new());
        assert_eq!(said(&c), ("AutomationLimited", false, "WithinShare"));
    }

    #[test]
    fn namespace_missing_names_the_namespaces_to_create() {
        let missing = BTreeSet::from(["ml-b".to_string(), "ml-a".to_string()]);
        let c = namespace_missing_condition(Some(&missing));
        assert_eq!(said(&c), ("NamespaceMissing", true, "NamespaceNotFound"));
        assert!(
            c.message
                .starts_with("spec.namespaces: ml-a, ml-b do(es) not exist"),
            "{}",
            c.message
        );
        let c = namespace_missing_condition(None);
        assert_eq!(said(&c), ("NamespaceMissing", false, "NamespacesExist"));
    }
}
