//! Planned names held by objects kaccel does not own: whom they concern and the conditions saying so.

use std::collections::BTreeMap;

use super::diff::{DesiredObjects, Kind, ObjectRef};
use crate::plan::Plan;

/// Planned names taken by objects kaccel does not own, as notes for the classes
/// and budgets whose objects they are.
#[derive(Debug, Default, PartialEq)]
pub(super) struct NameConflicts {
    pub(super) classes: BTreeMap<String, Vec<String>>,
    pub(super) budgets: BTreeMap<String, Vec<String>>,
}

/// A taken ResourceFlavor concerns the classes pooled into it, a taken Topology
/// the classes of the flavors naming it; a taken Cohort, ClusterQueue or
/// LocalQueue its budget (the root Cohort: every budget). An object held up
/// because it would use a taken one concerns its own budget, or for a flavor
/// (held up by its Topology) the classes pooled into it.
pub(super) fn name_conflicts(
    taken: &BTreeMap<ObjectRef, String>,
    held_up: &[(ObjectRef, ObjectRef)],
    desired: &DesiredObjects,
    planned: &Plan,
) -> NameConflicts {
    let mut out = NameConflicts::default();
    let budget_of = |target: &ObjectRef| -> Vec<String> {
        match desired
            .get(target)
            .and_then(|o| o.labels()?.get(crate::k8s::labels::BUDGET_LABEL))
        {
            Some(b) => vec![b.to_string()],
            None => planned.budgets.keys().cloned().collect(),
        }
    };
    // The classes an object of theirs concerns, for flavors and Topologies.
    let classes_of = |target: &ObjectRef| -> Option<Vec<String>> {
        let flavors: Vec<&crate::plan::FlavorReport> = match target.kind {
            Kind::ResourceFlavor => planned.flavors.get(&target.name).into_iter().collect(),
            Kind::Topology => planned
                .flavors
                .values()
                .filter(|f| f.topology.as_ref().is_some_and(|t| t.name == target.name))
                .collect(),
            _ => return None,
        };
        Some(
            flavors
                .into_iter()
                .flat_map(|f| f.classes.iter().cloned())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect(),
        )
    };
    let mut tell = |target: &ObjectRef, note: String| match classes_of(target) {
        Some(classes) => {
            for class in classes {
                out.classes.entry(class).or_default().push(note.clone());
            }
        }
        None => {
            for budget in budget_of(target) {
                out.budgets.entry(budget).or_default().push(note.clone());
            }
        }
    };
    for (target, holder) in taken {
        tell(
            target,
            format!(
                "{target} already exists and is not this kaccel installation's ({holder}): kaccel leaves it unchanged and does not use it; delete or rename it"
            ),
        );
    }
    for (target, used) in held_up {
        tell(
            target,
            format!(
                "{target} is not written: it would use {used}, which is not this kaccel installation's"
            ),
        );
    }
    out
}

/// A status's conditions with `notes` (name conflicts found while writing) added:
/// `Conflict` True naming them (after any conflict the planner found) and `Ready`
/// False. Unchanged without notes.
pub(super) fn with_name_conflicts(
    mut conditions: Vec<crate::api::DesiredCondition>,
    notes: Option<&Vec<String>>,
) -> Vec<crate::api::DesiredCondition> {
    use crate::api::{CONFLICT, DesiredCondition, READY};
    let Some(notes) = notes.filter(|n| !n.is_empty()) else {
        return conditions;
    };
    let message = notes.join("; ");
    match conditions
        .iter_mut()
        .find(|c| c.type_ == CONFLICT && c.status)
    {
        Some(c) => c.message = format!("{}; {message}", c.message),
        None => {
            conditions.retain(|c| c.type_ != CONFLICT);
            conditions.push(DesiredCondition::new(
                CONFLICT,
                true,
                "NameTaken",
                message.clone(),
            ));
        }
    }
    match conditions.iter_mut().find(|c| c.type_ == READY) {
        Some(ready) if ready.status => {
            *ready = DesiredCondition::new(READY, false, "NameTaken", message);
        }
        Some(_) => {}
        None => conditions.insert(0, DesiredCondition::new(READY, false, "NameTaken", message)),
    }
    conditions
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::diff::{self, desired_objects};

    #[test]
    fn a_taken_name_is_a_conflict_on_the_classes_or_budget_that_planned_it() {
        let planned = crate::testkit::example_plan();
        let values = desired_objects(&planned);
        let desired = DesiredObjects::of(&planned);
        let (flavor, report) = planned.flavors.iter().next().unwrap();
        let cq = values
            .keys()
            .find(|r| r.kind == Kind::ClusterQueue)
            .unwrap()
            .clone();
        let budget = values[&cq]["metadata"]["labels"][crate::k8s::labels::BUDGET_LABEL]
            .as_str()
            .unwrap()
            .to_string();
        let flavor_ref = ObjectRef {
            kind: Kind::ResourceFlavor,
            namespace: None,
            name: flavor.clone(),
        };
        let taken = BTreeMap::from([
            (flavor_ref.clone(), "managed by terraform".to_string()),
            (cq.clone(), "owned by Team x".to_string()),
        ]);
        let lq = values
            .iter()
            .find(|(r, v)| {
                r.kind == Kind::LocalQueue && v["spec"]["clusterQueue"] == cq.name.as_str()
            })
            .map(|(r, _)| r.clone())
            .unwrap();
        assert_eq!(
            diff::references(Kind::LocalQueue, &values[&lq]),
            vec![cq.clone()]
        );
        let notes = name_conflicts(&taken, &[(lq.clone(), cq.clone())], &desired, &planned);
        for class in &report.classes {
            let n = &notes.classes[class];
            assert!(
                n[0].contains(&format!("ResourceFlavor {flavor}"))
                    && n[0].contains("managed by terraform"),
                "{n:?}"
            );
        }
        let n = &notes.budgets[&budget];
        assert!(
            n.iter()
                .any(|m| m.contains(&format!("ClusterQueue {}", cq.name))
                    && m.contains("owned by Team x")),
            "{n:?}"
        );
        assert!(
            n.iter()
                .any(|m| m.starts_with(&format!("{lq} is not written"))),
            "{n:?}"
        );

        // Ready goes False, Conflict True; an earlier planner Conflict keeps its reason.
        let ready = vec![crate::api::DesiredCondition::new(
            crate::api::READY,
            true,
            "Planned",
            "ok",
        )];
        let merged = with_name_conflicts(ready.clone(), Some(&vec!["X taken".into()]));
        assert_eq!(merged[0].type_, crate::api::READY);
        assert!(!merged[0].status && merged[0].reason == "NameTaken");
        assert!(
            merged
                .iter()
                .any(|c| c.type_ == crate::api::CONFLICT && c.status && c.message == "X taken")
        );
        assert_eq!(with_name_conflicts(ready.clone(), None), ready);
        let pooled = vec![
            crate::api::DesiredCondition::new(crate::api::READY, false, "PoolingConflict", "p"),
            crate::api::DesiredCondition::new(crate::api::CONFLICT, true, "PoolingConflict", "p"),
        ];
        let merged = with_name_conflicts(pooled, Some(&vec!["X taken".into()]));
        assert_eq!(merged[1].message, "p; X taken");
        assert_eq!(merged[0].reason, "PoolingConflict");
    }

    #[test]
    fn a_taken_topology_concerns_the_classes_of_the_flavors_naming_it_and_so_does_a_held_up_flavor()
    {
        let planned = crate::testkit::example_plan_with(&crate::plan::PlanOptions {
            topology_aware_scheduling: true,
            ..Default::default()
        });
        let values = desired_objects(&planned);
        let desired = DesiredObjects::of(&planned);
        let topology = values
            .keys()
            .find(|r| r.kind == Kind::Topology)
            .expect("the example fleet forms one")
            .clone();
        let flavor = values
            .iter()
            .find(|(r, v)| {
                r.kind == Kind::ResourceFlavor
                    && v["spec"]["topologyName"] == topology.name.as_str()
            })
            .map(|(r, _)| r.clone())
            .unwrap();
        assert_eq!(
            diff::references(Kind::ResourceFlavor, &values[&flavor]),
            vec![topology.clone()]
        );
        let taken = BTreeMap::from([(topology.clone(), "managed by terraform".to_string())]);
        let notes = name_conflicts(
            &taken,
            &[(flavor.clone(), topology.clone())],
            &desired,
            &planned,
        );
        assert!(
            notes.budgets.is_empty(),
            "no budget planned either: {notes:?}"
        );
        let classes_of_flavor = &planned.flavors[&flavor.name].classes;
        for class in classes_of_flavor {
            let n = &notes.classes[class];
            assert!(
                n.iter()
                    .any(|m| m.contains(&format!("Topology {}", topology.name))
                        && m.contains("managed by terraform")),
                "{n:?}"
            );
            assert!(
                n.iter()
                    .any(|m| m.starts_with(&format!("{flavor} is not written"))),
                "{n:?}"
            );
        }
        // Every class using a flavor of that Topology is told, and only those.
        let told: std::collections::BTreeSet<&String> = notes.classes.keys().collect();
        let expected: std::collections::BTreeSet<&String> = planned
            .flavors
            .values()
            .filter(|f| f.topology.is_some())
            .flat_map(|f| f.classes.iter())
            .collect();
        assert_eq!(told, expected);
    }

    #[test]
    fn a_taken_object_no_budget_labels_concerns_every_budget() {
        let planned = crate::testkit::example_plan();
        let values = desired_objects(&planned);
        let desired = DesiredObjects::of(&planned);
        let root = values
            .iter()
            .find(|(r, v)| {
                r.kind == Kind::Cohort
                    && v["metadata"]["labels"][crate::k8s::labels::BUDGET_LABEL].is_null()
            })
            .map(|(r, _)| r.clone())
            .expect("the root Cohort carries no budget label");
        let taken = BTreeMap::from([(root.clone(), "managed by terraform".to_string())]);
        let notes = name_conflicts(&taken, &[], &desired, &planned);
        assert!(notes.classes.is_empty(), "{notes:?}");
        assert!(
            planned.budgets.len() > 1,
            "the examples have several budgets"
        );
        assert_eq!(
            notes.budgets.keys().collect::<Vec<_>>(),
            planned.budgets.keys().collect::<Vec<_>>()
        );
        for n in notes.budgets.values() {
            assert_eq!(n.len(), 1);
            assert!(n[0].starts_with(&format!("{root} already exists")), "{n:?}");
        }
        assert_eq!(
            name_conflicts(&BTreeMap::new(), &[], &desired, &planned),
            NameConflicts::default()
        );
    }

    #[test]
    fn name_conflicts_add_ready_false_unless_it_already_is_and_replace_a_false_conflict() {
        use crate::api::{CONFLICT, DesiredCondition, READY};
        let notes = Some(vec!["X taken".to_string()]);
        // No Ready yet: one goes first.
        let merged = with_name_conflicts(vec![], notes.as_ref());
        assert_eq!(
            merged[0],
            DesiredCondition::new(READY, false, "NameTaken", "X taken")
        );
        assert_eq!(
            merged[1],
            DesiredCondition::new(CONFLICT, true, "NameTaken", "X taken")
        );
        // Ready already False for the planner's own reason: kept as it is.
        let not_ready = vec![
            DesiredCondition::new(READY, false, "InvalidSpec", "bad rate"),
            DesiredCondition::new(CONFLICT, false, "NoConflict", "none"),
        ];
        let merged = with_name_conflicts(not_ready.clone(), notes.as_ref());
        assert_eq!(merged[0], not_ready[0]);
        let conflicts: Vec<_> = merged.iter().filter(|c| c.type_ == CONFLICT).collect();
        assert_eq!(conflicts.len(), 1, "{merged:?}");
        assert!(conflicts[0].status && conflicts[0].reason == "NameTaken");
        // No notes: unchanged.
        assert_eq!(
            with_name_conflicts(not_ready.clone(), Some(&vec![])),
            not_ready
        );
    }
}
