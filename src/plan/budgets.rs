//! Stage 6, admit budgets: oldest first, validated, namespaces claimed, grants as quota demands.

use std::collections::BTreeMap;

use crate::api::{self, AcceleratorClass, CreditBudget, DesiredCondition};

use super::{BudgetReport, ClassReport, Demand, name_of};
use crate::api::parsed::parse_budget;

/// The budgets as the later stages use them.
#[derive(Default)]
pub(super) struct AdmittedBudgets<'a> {
    /// Oldest first (see [`admit`]); invalid ones included.
    pub(super) ordered: Vec<&'a CreditBudget>,
    /// Budget name -> its report: validity, errors and the conditions found so far.
    pub(super) reports: BTreeMap<String, BudgetReport>,
    /// One per grant of a valid class with guaranteed devices, in budget then grant order.
    pub(super) demands: Vec<Demand>,
    /// Valid budget -> the namespaces it owns (those no older budget claimed).
    pub(super) namespaces: BTreeMap<String, Vec<String>>,
}

/// Oldest first, so a budget created later can never take a namespace from an
/// existing team (files without timestamps fall back to name order).
pub(super) fn admit<'a>(
    budgets: &'a [CreditBudget],
    class_by_name: &BTreeMap<String, &AcceleratorClass>,
    class_reports: &BTreeMap<String, ClassReport>,
    class_order: &BTreeMap<String, Vec<String>>,
    classes_elsewhere: &BTreeMap<String, String>,
) -> AdmittedBudgets<'a> {
    let mut ordered: Vec<&CreditBudget> = budgets.iter().collect();
    ordered.sort_by(|a, b| {
        let created = |x: &CreditBudget| x.metadata.creation_timestamp.as_ref().map(|t| t.0);
        (created(a).is_none(), created(a), &a.metadata.name).cmp(&(
            created(b).is_none(),
            created(b),
            &b.metadata.name,
        ))
    });
    let mut admitted = AdmittedBudgets::default();
    let mut namespace_owner: BTreeMap<&str, String> = BTreeMap::new();
    for &budget in &ordered {
        let bname = name_of(&budget.metadata);
        let parsed = parse_budget(&budget.spec);
        let mut report = BudgetReport {
            valid: parsed.is_ok(),
            amounts: parsed.as_ref().ok().cloned(),
            errors: parsed.err().unwrap_or_default(),
            ..Default::default()
        };
        if report.valid {
            let own = claim_namespaces(budget, &bname, &mut namespace_owner, &mut report);
            admitted.namespaces.insert(bname.clone(), own);
            for grant in &budget.spec.classes {
                match class_by_name.get(&grant.name) {
                    None if classes_elsewhere.contains_key(&grant.name) => {
                        report.conditions.push(DesiredCondition::new(
                            "ClassNotFound",
                            true,
                            "ClassOfAnotherInstallation",
                            format!(
                                "spec.classes: AcceleratorClass {:?} is served by the kaccel installation {:?} (its label kaccel.io/instance), not by this budget's: a budget pays only for classes of its own installation; move the budget or the class; nothing is created for it",
                                grant.name, classes_elsewhere[&grant.name]
                            ),
                        ))
                    }
                    None => report.conditions.push(DesiredCondition::new(
                        "ClassNotFound",
                        true,
                        "ClassNotFound",
                        format!(
                            "spec.classes: AcceleratorClass {:?} does not exist: create it or remove it from the budget; nothing is created for it",
                            grant.name
                        ),
                    )),
                    Some(_) if !class_reports[&grant.name].valid => {
                        report.conditions.push(DesiredCondition::new(
                            "ClassInvalid",
                            true,
                            "ClassInvalid",
                            format!(
                                "spec.classes: AcceleratorClass {:?} is invalid (see its Invalid condition); nothing is created for it until it is fixed",
                                grant.name
                            ),
                        ))
                    }
                    Some(_) => {
                        if grant.guaranteed_devices > 0 {
                            admitted.demands.push(Demand {
                                budget: bname.clone(),
                                class: grant.name.clone(),
                                amount: u64::from(grant.guaranteed_devices),
                                flavors: class_order.get(&grant.name).cloned().unwrap_or_default(),
                            });
                        }
                    }
                }
            }
        }
        admitted.reports.insert(bname, report);
    }
    admitted.ordered = ordered;
    admitted
}

/// The budget's namespaces no older budget holds; the taken ones become a
/// `Conflict` condition on its report.
fn claim_namespaces<'a>(
    budget: &'a CreditBudget,
    bname: &str,
    namespace_owner: &mut BTreeMap<&'a str, String>,
    report: &mut BudgetReport,
) -> Vec<String> {
    let mut taken = Vec::new();
    let mut own = Vec::new();
    for ns in &budget.spec.namespaces {
        match namespace_owner.get(ns.as_str()) {
            Some(other) => taken.push(format!("{ns} (budget {other})")),
            None => {
                namespace_owner.insert(ns, bname.to_string());
                own.push(ns.clone());
            }
        }
    }
    if !taken.is_empty() {
        report.conditions.push(DesiredCondition::new(
            api::CONFLICT,
            true,
            "NamespaceClaimed",
            format!(
                "spec.namespaces: {} already belong to another budget; a namespace can hold the LocalQueues of one budget only: remove it here or there",
                taken.join(", ")
            ),
        ));
    }
    own
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HardwareSelector, SharingMode};
    use crate::plan::tests::{budget, class};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn created_at(mut budget: CreditBudget, second: i64) -> CreditBudget {
        budget.metadata.creation_timestamp = Some(Time(
            k8s_openapi::jiff::Timestamp::from_second(second).unwrap(),
        ));
        budget
    }

    #[test]
    fn the_oldest_budget_keeps_a_namespace_and_only_valid_classes_make_demands() {
        let gpu = class("gpu", SharingMode::Whole, HardwareSelector::default());
        let bad = class("bad", SharingMode::Partition, HardwareSelector::default());
        let class_by_name = BTreeMap::from([("gpu".to_string(), &gpu), ("bad".to_string(), &bad)]);
        let class_reports = BTreeMap::from([
            (
                "gpu".to_string(),
                ClassReport {
                    valid: true,
                    ..Default::default()
                },
            ),
            ("bad".to_string(), ClassReport::default()),
        ]);
        let class_order = BTreeMap::from([("gpu".to_string(), vec!["h100".to_string()])]);
        let budgets = [
            // First by name, but created later.
            // Nothing guaranteed: no demand.
            created_at(
                budget("a-young", &["shared", "young"], &[("gpu", 0)]),
                2_000,
            ),
            created_at(
                budget(
                    "b-old",
                    &["shared"],
                    &[("gpu", 4), ("bad", 1), ("ghost", 1)],
                ),
                1_000,
            ),
        ];

        let admitted = admit(
            &budgets,
            &class_by_name,
            &class_reports,
            &class_order,
            &BTreeMap::new(),
        );
        let order: Vec<String> = admitted
            .ordered
            .iter()
            .map(|b| name_of(&b.metadata))
            .collect();
        assert_eq!(order, ["b-old", "a-young"]);
        assert_eq!(admitted.namespaces["b-old"], ["shared"]);
        assert_eq!(admitted.namespaces["a-young"], ["young"]);
        let claimed = &admitted.reports["a-young"].conditions[0];
        assert_eq!(claimed.reason, "NamespaceClaimed");
        assert!(claimed.message.contains("shared (budget b-old)"));

        let reasons: Vec<&str> = admitted.reports["b-old"]
            .conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect();
        assert_eq!(reasons, ["ClassInvalid", "ClassNotFound"]);
        let demands: Vec<(&str, u64)> = admitted
            .demands
            .iter()
            .map(|d| (d.budget.as_str(), d.amount))
            .collect();
        assert_eq!(demands, [("b-old", 4)]);
        assert_eq!(admitted.demands[0].flavors, ["h100"]);

        // The same grant of a class another installation serves: that is what
        // the condition says, and still nothing is created for it.
        let elsewhere = BTreeMap::from([("ghost".to_string(), "kaccel-b".to_string())]);
        let admitted = admit(
            &budgets,
            &class_by_name,
            &class_reports,
            &class_order,
            &elsewhere,
        );
        let ghost = &admitted.reports["b-old"].conditions[1];
        assert_eq!(ghost.reason, "ClassOfAnotherInstallation");
        assert!(
            ghost
                .message
                .contains("\"ghost\" is served by the kaccel installation \"kaccel-b\""),
            "{}",
            ghost.message
        );
        assert_eq!(admitted.demands.len(), 1);
    }

    #[test]
    fn an_invalid_budget_claims_nothing() {
        let mut invalid = budget("invalid", &["shared"], &[("gpu", 1)]);
        invalid.spec.fair_share_weight = Some("-1".into());
        let valid = budget("valid", &["shared"], &[("gpu", 1)]);
        let budgets = [invalid, valid];
        let admitted = admit(
            &budgets,
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
            &BTreeMap::new(),
        );
        assert!(!admitted.reports["invalid"].valid);
        assert!(!admitted.namespaces.contains_key("invalid"));
        assert_eq!(admitted.namespaces["valid"], ["shared"]);
        let reasons: Vec<&str> = admitted.reports["valid"]
            .conditions
            .iter()
            .map(|c| c.reason.as_str())
            .collect();
        assert_eq!(reasons, ["ClassNotFound"]);
    }
}
