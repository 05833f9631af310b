//! AcceleratorClass and CreditBudget specs parsed once, in one place, into typed
//! values (rates as [`Rate`](super::rates::Rate)s, amounts as [`Credits`]) with every field error
//! they have, named by JSON path and with the fix. The CRD's CEL rules are the
//! apply-time gate for the same rules; these also hold the checks CEL cannot
//! express, and hold even where a cluster runs an older CRD. The planner, the
//! pricing and the credit check read only these values, never the strings.

use super::rates::{ClassRates, RateError};
use super::{AcceleratorClassSpec, CreditBudgetSpec, Credits, SharingMode, Vendor};
use crate::k8s::names::{valid_dns_subdomain, valid_label_key, valid_label_value};

/// The most devices one pod may ask for in `spec.devicesPerPod` (the CRD's bound).
pub const MAX_DEVICES_PER_POD: u32 = 1024;

/// A class's spec parsed: its rates, and every field error it has (the rates'
/// included). The rates stand on their own: the credit check still answers a
/// Workload in the queue of a class invalid for another reason with its rates,
/// and one whose rates do not parse with their errors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedClass {
    pub rates: Result<ClassRates, Vec<RateError>>,
    /// The device counts one pod may ask for, ascending, no repeats; empty: any.
    pub devices_per_pod: Vec<u32>,
    pub errors: Vec<FieldError>,
}

impl ParsedClass {
    pub fn is_valid(&self) -> bool {
        self.errors.is_empty()
    }
}

/// A budget's amounts, period and top-ups once its spec parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedBudget {
    /// `spec.team` (a DNS label).
    pub team: String,
    /// `spec.credits.perPeriod`.
    pub per_period: Credits,
    /// `spec.credits.period`.
    pub period: ParsedPeriod,
    /// `spec.credits.topUps`, in spec order: names unique DNS labels, credits
    /// positive.
    pub top_ups: Vec<ParsedTopUp>,
    /// `spec.admission.overdraftLimit`, when set.
    pub overdraft_limit: Option<Credits>,
    /// `spec.fairShareWeight`, when set: positive, at most 3 decimal places.
    pub fair_share_weight: Option<Credits>,
}

/// `spec.credits.period` parsed: when the first period starts and how long each
/// lasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParsedPeriod {
    /// `spec.credits.period.start`, in unix seconds.
    pub start: i64,
    /// `spec.credits.period.days`: 1 to 366 in a parsed budget.
    pub days: u32,
}

/// One of `spec.credits.topUps` parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParsedTopUp {
    /// A DNS label, unique within the budget.
    pub name: String,
    /// Why it was given; an empty reason is `None`.
    pub reason: Option<String>,
    /// Positive.
    pub credits: Credits,
}

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

/// An AcceleratorClass's spec parsed. `generation` is the class's (it goes into
/// the rate-card version).
pub fn parse_class(spec: &AcceleratorClassSpec, generation: Option<i64>) -> ParsedClass {
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
    // The CRD's patterns: major.minor for compute capability and CUDA, one to
    // four dotted numbers for the driver.
    for (field, value, parts, example) in [
        (
            "spec.selector.minComputeCapability",
            &sel.min_compute_capability,
            2..=2,
            "major.minor, e.g. 8.0",
        ),
        (
            "spec.selector.minDriverVersion",
            &sel.min_driver_version,
            1..=4,
            "dotted numbers, e.g. 550.54.15",
        ),
        (
            "spec.selector.minCudaVersion",
            &sel.min_cuda_version,
            2..=2,
            "major.minor, e.g. 12.4",
        ),
    ] {
        if let Some(v) = value
            && !dotted_numbers(v, parts)
        {
            errors.push(err(
                field,
                format!("{v:?} is not a dotted version number: write {example}"),
            ));
        }
    }
    for (list, patterns) in [
        ("spec.selector.models", &sel.models),
        ("spec.preference", &spec.preference),
    ] {
        for (i, p) in patterns.iter().enumerate() {
            if p.is_empty() || p.chars().count() > 128 {
                errors.push(err(
                    format!("{list}[{i}]"),
                    "must be a non-empty model pattern of at most 128 characters, e.g. *H100*",
                ));
            }
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
        if !valid_label_key(key) || key.len() > 253 {
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
    for (i, count) in spec.devices_per_pod.iter().enumerate() {
        if !(1..=MAX_DEVICES_PER_POD).contains(count) {
            errors.push(err(
                format!("spec.devicesPerPod[{i}]"),
                format!("{count} is not a device count from 1 to {MAX_DEVICES_PER_POD}, e.g. 8"),
            ));
        }
    }
    if spec.sharing == SharingMode::CpuOnly && !spec.devices_per_pod.is_empty() {
        errors.push(err(
            "spec.devicesPerPod",
            "a CpuOnly class has no devices to count: remove spec.devicesPerPod",
        ));
    }
    for (i, settings) in spec.pod_settings.iter().enumerate() {
        let field = format!("spec.podSettings[{i}]");
        if spec.sharing == SharingMode::CpuOnly {
            errors.push(err(
                &field,
                "a CpuOnly class places no pod on devices: remove spec.podSettings",
            ));
        }
        for (j, env) in settings.env.iter().enumerate() {
            let valid = !env.name.is_empty()
                && !env.name.starts_with(|c: char| c.is_ascii_digit())
                && env
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
            if !valid {
                errors.push(err(
                    format!("{field}.env[{j}].name"),
                    format!(
                        "{:?} is not an environment variable name, e.g. HIP_VISIBLE_DEVICES",
                        env.name
                    ),
                ));
            }
        }
        if let Some(runtime) = &settings.runtime_class_name
            && !valid_dns_subdomain(runtime)
        {
            errors.push(err(
                format!("{field}.runtimeClassName"),
                format!("{runtime:?} is not a RuntimeClass name (a DNS subdomain, e.g. nvidia)"),
            ));
        }
        if settings
            .image
            .as_deref()
            .is_some_and(|i| i.trim().is_empty() || i.contains(char::is_whitespace))
        {
            errors.push(err(
                format!("{field}.image"),
                "must be an image reference without spaces, e.g. rocm/pytorch:latest",
            ));
        }
    }
    let mut devices_per_pod = spec.devices_per_pod.clone();
    devices_per_pod.sort_unstable();
    devices_per_pod.dedup();
    // The rates the ledger prices with, so a class the planner accepts always prices.
    let rates = ClassRates::parse(&spec.credits, generation);
    if let Err(rate_errors) = &rates {
        for e in rate_errors {
            errors.push(err(&e.field, &e.problem));
        }
    }
    for (i, o) in spec.credits.model_overrides.iter().enumerate() {
        if o.model.is_empty() {
            errors.push(err(
                format!("spec.credits.modelOverrides[{i}].model"),
                "must be a model pattern, e.g. *H100*",
            ));
        }
    }
    ParsedClass {
        rates,
        devices_per_pod,
        errors,
    }
}

/// A CreditBudget's spec parsed: every field error it has, or its team, amounts,
/// period and top-ups.
pub fn parse_budget(spec: &CreditBudgetSpec) -> Result<ParsedBudget, Vec<FieldError>> {
    let mut errors = Vec::new();
    if spec.namespaces.is_empty() {
        errors.push(err(
            "spec.namespaces",
            "list at least one namespace for the team's LocalQueues",
        ));
    }
    if !dns_label(&spec.team) {
        errors.push(err(
            "spec.team",
            format!(
                "{:?} is not a DNS label: lower-case letters, digits and '-', e.g. vision",
                spec.team
            ),
        ));
    }
    for (i, ns) in spec.namespaces.iter().enumerate() {
        if !valid_dns_subdomain(ns) || ns.len() > 63 || ns.contains('.') {
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
    let per_period = spec
        .credits
        .per_period
        .parse::<Credits>()
        .map_err(|e| errors.push(err("spec.credits.perPeriod", e.to_string())));
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
    if admission
        .default_horizon_seconds
        .is_some_and(|s| s > MAX_HORIZON_SECONDS)
    {
        errors.push(err(
            "spec.admission.defaultHorizonSeconds",
            format!("must be at most {MAX_HORIZON_SECONDS} (one year), e.g. 86400"),
        ));
    }
    if admission.overdraft_limit.is_some()
        && admission.when_renewal_short != Some(crate::api::RenewalShortPolicy::Overdraft)
    {
        errors.push(err(
            "spec.admission.overdraftLimit",
            "applies only with spec.admission.whenRenewalShort: Overdraft: set both, or remove overdraftLimit",
        ));
    }
    let mut top_ups = Vec::with_capacity(spec.credits.top_ups.len());
    for (i, top_up) in spec.credits.top_ups.iter().enumerate() {
        let errors_before = errors.len();
        if !dns_label(&top_up.name) {
            errors.push(err(
                format!("spec.credits.topUps[{i}].name"),
                format!(
                    "{:?} is not a DNS label: lower-case letters, digits and '-', e.g. q3-extra",
                    top_up.name
                ),
            ));
        }
        if spec.credits.top_ups[..i]
            .iter()
            .any(|t| t.name == top_up.name)
        {
            errors.push(err(
                format!("spec.credits.topUps[{i}].name"),
                format!(
                    "{:?} is used twice: give each top-up its own name",
                    top_up.name
                ),
            ));
        }
        match top_up.credits.parse::<Credits>() {
            Ok(credits) if credits.micros() > 0 => {
                if errors.len() == errors_before {
                    top_ups.push(ParsedTopUp {
                        name: top_up.name.clone(),
                        reason: top_up.reason.clone().filter(|r| !r.is_empty()),
                        credits,
                    });
                }
            }
            _ => errors.push(err(
                format!("spec.credits.topUps[{i}].credits"),
                format!("{:?} must be a positive decimal with at most 6 places, e.g. \"200\"; to take credits away, lower perPeriod", top_up.credits),
            )),
        }
    }
    let overdraft_limit = match &admission.overdraft_limit {
        None => None,
        Some(limit) => match limit.parse::<Credits>() {
            Ok(c) => Some(c),
            Err(e) => {
                errors.push(err("spec.admission.overdraftLimit", e.to_string()));
                None
            }
        },
    };
    if admission.when_renewal_short == Some(crate::api::RenewalShortPolicy::Overdraft)
        && admission.overdraft_limit.is_none()
    {
        errors.push(err(
            "spec.admission.overdraftLimit",
            "whenRenewalShort: Overdraft needs the credits the budget may go below zero, e.g. \"500\"",
        ));
    }
    let fair_share_weight = match &spec.fair_share_weight {
        None => None,
        Some(w) => match w.parse::<Credits>() {
            Ok(c) if c.micros() > 0 && decimal_within(w, 6, 3) => Some(c),
            _ => {
                errors.push(err(
                    "spec.fairShareWeight",
                    format!("{w:?} must be a positive decimal with at most 3 places, e.g. \"2\""),
                ));
                None
            }
        },
    };
    match per_period {
        Ok(per_period) if errors.is_empty() => Ok(ParsedBudget {
            team: spec.team.clone(),
            per_period,
            period: ParsedPeriod {
                start: spec.credits.period.start.0.as_second(),
                days: spec.credits.period.days,
            },
            top_ups,
            overdraft_limit,
            fair_share_weight,
        }),
        _ => Err(errors),
    }
}

/// The longest reservation horizon a budget may set: one year.
pub const MAX_HORIZON_SECONDS: u64 = 31_536_000;

/// `1`, `8.0`, `550.54.15`: dot-separated runs of digits, as many as `parts` allows.
fn dotted_numbers(value: &str, parts: std::ops::RangeInclusive<usize>) -> bool {
    let groups: Vec<&str> = value.split('.').collect();
    parts.contains(&groups.len())
        && groups
            .iter()
            .all(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
}

/// A decimal with at most `int` integer and `frac` fractional digits.
fn decimal_within(value: &str, int: usize, frac: usize) -> bool {
    let (i, f) = value.split_once('.').unwrap_or((value, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    (1..=int).contains(&i.len())
        && digits(i)
        && f.len() <= frac
        && digits(f)
        && !(value.contains('.') && f.is_empty())
}

/// A DNS label (RFC 1123): what Kubernetes accepts as a namespace or label-safe name.
fn dns_label(value: &str) -> bool {
    value.len() <= 63 && valid_dns_subdomain(value) && !value.contains('.')
}

/// Every field error of a class (none when it parses).
pub fn validate_class(spec: &AcceleratorClassSpec) -> Vec<FieldError> {
    parse_class(spec, None).errors
}

/// Every field error of a budget (none when it parses).
pub fn validate_budget(spec: &CreditBudgetSpec) -> Vec<FieldError> {
    parse_budget(spec).err().unwrap_or_default()
}

#[cfg(test)]
mod tests;
