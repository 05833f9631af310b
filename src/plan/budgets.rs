//! Stage 6, admit budgets: order them, validate them, give each its namespaces and turn its grants into quota demands.

use std::collections::BTreeMap;

use crate::api::{self, AcceleratorClass, CreditBudget, DesiredCondition};

use super::validate::validate_budget;
use super::{BudgetReport, ClassReport, Demand, name_of};

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
        let errors = validate_budget(&budget.spec);
        let mut report = BudgetReport {
            valid: errors.is_empty(),
            errors,
            ..Default::default()
        };
        if report.valid {
            let own = claim_namespaces(budget, &bname, &mut namespace_owner, &mut report);
            admitted.namespaces.insert(bname.clone(), own);
            for grant in &budget.spec.classes {
                match class_by_name.get(&grant.name) {
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
