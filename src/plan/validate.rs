//! Checks of one object that the CRD schema and CEL rules cannot express (or that
//! must hold even when a cluster runs an older CRD). Each problem names the field
//! and the fix.
//!
//! Stage 1 of the planner, [`classes`], validates every class; budgets are validated
//! when they are admitted (stage 6).

use std::collections::BTreeMap;

use crate::api::{
    AcceleratorClass, AcceleratorClassSpec, CreditBudgetSpec, Credits, SharingMode, Vendor,
};

use super::{ClassReport, name_of};
use crate::k8s::names::{valid_label_key, valid_label_value, version_at_least};

/// One problem with a field, in words a platform engineer can act on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for FieldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

fn err(field: impl Into<String>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.into(),
        message: message.into(),
    }
}

pub fn validate_class(spec: &AcceleratorClassSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let sel = &spec.selector;

    if spec.sharing == SharingMode::Partition && sel.partition_profile.is_none() {
        errors.push(err(
            "spec.selector.partitionProfile",
            "required when spec.sharing is Partition: name the profile, e.g. 1g.10gb",
        ));
    }
    if spec.sharing != SharingMode::Partition && sel.partition_profile.is_some() {
        errors.push(err(
            "spec.selector.partitionProfile",
            "only valid with spec.sharing: Partition; remove it or change spec.sharing",
        ));
    }
    if spec.sharing == SharingMode::CpuOnly
        && (!sel.vendors.is_empty()
            || !sel.models.is_empty()
            || sel.min_memory_mib.is_some()
            || sel.min_compute_capability.is_some()
            || sel.min_cuda_version.is_some())
    {
        errors.push(err(
            "spec.selector",
            "a CpuOnly class selects no accelerators: remove vendors, models, minMemoryMiB, minComputeCapability and minCudaVersion",
        ));
    }
    // NVIDIA-only constraints on a class that cannot contain NVIDIA devices would
    // silently match nothing: say so instead.
    let nvidia_possible = sel.vendors.is_empty() || sel.vendors.contains(&Vendor::Nvidia);
    for (field, set) in [
        (
            "spec.selector.minComputeCapability",
            sel.min_compute_capability.is_some(),
        ),
        (
            "spec.selector.minCudaVersion",
            sel.min_cuda_version.is_some(),
        ),
    ] {
        if set && !nvidia_possible {
            errors.push(err(
                field,
                "only NVIDIA devices have this property, but spec.selector.vendors excludes nvidia: add nvidia or remove the constraint",
            ));
        }
    }
    for (field, value) in [
        (
            "spec.selector.minComputeCapability",
            &sel.min_compute_capability,
        ),
        ("spec.selector.minDriverVersion", &sel.min_driver_version),
        ("spec.selector.minCudaVersion", &sel.min_cuda_version),
    ] {
        if let Some(v) = value
            && version_at_least(v, "0").is_none()
        {
            errors.push(err(
                field,
                format!("{v:?} is not a dotted version number, e.g. 12.4"),
            ));
        }
    }
    for (key, value) in &sel.node_labels {
        if !valid_label_key(key) {
            errors.push(err(
                format!("spec.selector.nodeLabels[{key}]"),
                "not a valid label key: use [prefix/]name, e.g. kaccel.io/pool",
            ));
        }
        if !valid_label_value(value) {
            errors.push(err(
                format!("spec.selector.nodeLabels[{key}]"),
                format!(
                    "{value:?} is not a valid label value (63 characters of [A-Za-z0-9._-], alphanumeric at both ends)"
                ),
            ));
        }
    }
    for (i, key) in spec.pooling.split_by.iter().enumerate() {
        if !valid_label_key(key) {
            errors.push(err(
                format!("spec.pooling.splitBy[{i}]"),
                format!("{key:?} is not a label key, e.g. topology.kubernetes.io/zone"),
            ));
        }
        if sel.node_labels.contains_key(key) {
            errors.push(err(
                format!("spec.pooling.splitBy[{i}]"),
                format!(
                    "{key:?} is already fixed by spec.selector.nodeLabels, so splitting by it yields one flavor: remove one of them"
                ),
            ));
        }
    }
    // The ledger's own rule, so a class the planner accepts always prices.
    for (field, problem) in crate::ledger::pricing::rate_errors(&spec.credits) {
        errors.push(err(field, problem));
    }
    for (i, o) in spec.credits.model_overrides.iter().enumerate() {
        if o.model.is_empty() {
            errors.push(err(
                format!("spec.credits.modelOverrides[{i}].model"),
                "must be a model pattern, e.g. *H100*",
            ));
        }
    }
    errors
}

pub fn validate_budget(spec: &CreditBudgetSpec) -> Vec<FieldError> {
    let mut errors = Vec::new();
    if spec.namespaces.is_empty() {
        errors.push(err(
            "spec.namespaces",
            "list at least one namespace for the team's LocalQueues",
        ));
    }
    for (i, ns) in spec.namespaces.iter().enumerate() {
        if !crate::k8s::names::valid_dns_subdomain(ns) || ns.len() > 63 || ns.contains('.') {
            errors.push(err(
                format!("spec.namespaces[{i}]"),
                format!("{ns:?} is not a namespace name (a DNS label)"),
            ));
        }
        if spec.namespaces[..i].contains(ns) {
            errors.push(err(
                format!("spec.namespaces[{i}]"),
                format!("{ns:?} is listed twice: list each namespace once"),
            ));
        }
    }
    if spec.classes.is_empty() {
        errors.push(err(
            "spec.classes",
            "name at least one AcceleratorClass the team may use",
        ));
    }
    for (i, c) in spec.classes.iter().enumerate() {
        if spec.classes[..i].iter().any(|d| d.name == c.name) {
            errors.push(err(
                format!("spec.classes[{i}].name"),
                format!("class {:?} is listed twice: merge the entries", c.name),
            ));
        }
    }
    if let Err(e) = spec.credits.per_period.parse::<Credits>() {
        errors.push(err("spec.credits.perPeriod", e.to_string()));
    }
    if !(1..=366).contains(&spec.credits.period.days) {
        errors.push(err("spec.credits.period.days", "must be between 1 and 366"));
    }
    let admission = &spec.admission;
    if admission.default_horizon_seconds == Some(0) {
        errors.push(err(
            "spec.admission.defaultHorizonSeconds",
            "must be at least 1 second, e.g. 86400",
        ));
    }
    if let Some(limit) = &admission.overdraft_limit
        && let Err(e) = limit.parse::<Credits>()
    {
        errors.push(err("spec.admission.overdraftLimit", e.to_string()));
    }
    if admission.when_renewal_short == Some(crate::api::RenewalShortPolicy::Overdraft)
        && admission.overdraft_limit.is_none()
    {
        errors.push(err(
            "spec.admission.overdraftLimit",
            "whenRenewalShort: Overdraft needs the credits the budget may go below zero, e.g. \"500\"",
        ));
    }
    if let Some(w) = &spec.fair_share_weight {
        match w.parse::<Credits>() {
            Ok(c) if c.micros() > 0 && c.micros().is_multiple_of(1000) => {}
            _ => errors.push(err(
                "spec.fairShareWeight",
                format!("{w:?} must be a positive decimal with at most 3 places, e.g. \"2\""),
            )),
        }
    }
    errors
}

/// Stage 1: the classes in name order, and a report per class name saying whether
/// it is valid and why not. Invalid classes take no part in the later stages.
pub(super) fn classes(
    classes: &[AcceleratorClass],
) -> (Vec<&AcceleratorClass>, BTreeMap<String, ClassReport>) {
    let mut ordered: Vec<&AcceleratorClass> = classes.iter().collect();
    ordered.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut class_reports: BTreeMap<String, ClassReport> = BTreeMap::new();
    for class in &ordered {
        let errors = validate_class(&class.spec);
        class_reports.insert(
            name_of(&class.metadata),
            ClassReport {
                valid: errors.is_empty(),
                errors,
                ..Default::default()
            },
        );
    }
    (ordered, class_reports)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::HardwareSelector;
    use crate::plan::tests::class;

    #[test]
    fn classes_come_back_in_name_order_each_with_a_report() {
        let partition_without_profile = class(
            "b-part",
            SharingMode::Partition,
            HardwareSelector::default(),
        );
        let whole = class("a-whole", SharingMode::Whole, HardwareSelector::default());
        let input = [partition_without_profile, whole];
        let (ordered, reports) = classes(&input);
        let names: Vec<String> = ordered.iter().map(|c| name_of(&c.metadata)).collect();
        assert_eq!(names, ["a-whole", "b-part"]);
        assert!(reports["a-whole"].valid && reports["a-whole"].errors.is_empty());
        let invalid = &reports["b-part"];
        assert!(!invalid.valid);
        assert_eq!(invalid.errors[0].field, "spec.selector.partitionProfile");
    }
}
