//! Stage 8c, Kueue counting: which logical resource Kueue must count each of
//! kaccel's DeviceClasses as, and whether the Kueue configuration the controller
//! read does so.
//!
//! One device, one count: every device flavor's quota is bounded by one name,
//! the class resource ([`api::CLASS_RESOURCE`]). A device-plugin flavor's vendor
//! resource is also counted as it (Kueue's `Retain` transformation). A DRA-only
//! flavor's quota is in the class resource alone: a class-level request
//! (`kaccel.io/accelerator: N`, which kaccel's pod webhook turns into the
//! implicit extended resource of the flavor's DeviceClass once Kueue placed it)
//! is counted as that name by Kueue with no configuration, and a claim of one of
//! kaccel's DeviceClasses (`<flavor>.kaccel.io`) is counted as it through one
//! `resources.deviceClassMappings` entry, behind Kueue v0.17's
//! `DynamicResourceAllocation` gate. Kueue sums the two names' admissions on a
//! flavor in one quota, so a device asked for both ways is never admitted twice.
//! (Kueue counts a claim by its mapping's name only, before flavor assignment, so
//! a per-flavor name for claims could not share a quota with the class resource.)
//!
//! kaccel does not own Kueue's configuration. `kaccel plan --kueue-config` prints
//! what to add; the running controller reads the configuration (a ConfigMap or a
//! file) and puts `KueueCountsDeviceClasses` on each class with DeviceClasses:
//! False, naming each missing mapping, until Kueue's configuration has them all.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::DeviceClass;

use super::device_classes::DEVICE_CLASS_SUFFIX;
use super::{ClassReport, FlavorReport};
use crate::api::{self, DesiredCondition};
use crate::kueue::config::{
    CONFIG_MAP_KEY, DRA_GATE_V017, DRA_GATE_V018, DeviceClassMapping, MAX_DEVICE_CLASS_MAPPINGS,
    MAX_DEVICE_CLASSES_PER_MAPPING, ObservedConfiguration, RETAIN, ResourceTransformation,
};

/// Kubernetes' implicit extended resource of every DeviceClass
/// (`deviceclass.resource.kubernetes.io/<name>`, `DRAExtendedResource`): a pod
/// asking for N of it is given N devices of that DeviceClass by the scheduler.
pub const IMPLICIT_EXTENDED_RESOURCE_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The domain of the resource a DRA-only flavor's ledger lines are named in.
pub const DRA_RESOURCE_DOMAIN: &str = "dra.kaccel.io";

/// The resource the ledger prices a DRA-only flavor's devices under,
/// `dra.kaccel.io/<flavor>`: Kueue counts them as the class resource (one quota
/// with class-level requests), and the line names where they came from, so
/// finance sees the DeviceClass (see [`device_class_of_resource`]).
pub fn dra_line_resource(flavor: &str) -> String {
    format!("{DRA_RESOURCE_DOMAIN}/{flavor}")
}

/// The DeviceClass a DRA ledger line's resource names, if `resource` is one.
pub fn device_class_of_resource(resource: &str) -> Option<String> {
    let flavor = resource
        .strip_prefix(DRA_RESOURCE_DOMAIN)?
        .strip_prefix('/')
        .filter(|flavor| !flavor.is_empty())?;
    Some(super::device_classes::device_class_name(flavor))
}

/// Whether a flavor's devices are published through DRA only (its quota is in
/// the class resource, its devices pinned by its DeviceClass).
pub fn is_dra_flavor(flavor: &FlavorReport) -> bool {
    crate::inventory::is_dra_device_class(&flavor.device_resource_name)
}

/// What a pod on this flavor's nodes asks for to be given its devices: the
/// vendor resource of a device-plugin flavor, or the implicit extended resource
/// of a DRA-only flavor's DeviceClass (the scheduler allocates exactly that
/// variant, so a request never mixes variants or reaches another class's cards).
pub fn pod_resource(flavor: &FlavorReport) -> String {
    if is_dra_flavor(flavor) {
        format!(
            "{IMPLICIT_EXTENDED_RESOURCE_PREFIX}{}",
            super::device_classes::device_class_name(&flavor.name)
        )
    } else {
        flavor.resource_name.clone()
    }
}

/// Whether a workload may ask for this flavor's devices by the class resource
/// ([`api::CLASS_RESOURCE`]): every device flavor (a device-plugin flavor's
/// vendor resource is counted as the class resource too, a DRA-only flavor's
/// quota is in it), not CPU pools.
pub fn counts_as_class_resource(flavor: &FlavorReport) -> bool {
    flavor.resource_name != super::CPU
}

/// The mapping Kueue needs for the DeviceClasses kaccel writes: one entry, the
/// class resource, listing them all in name order (none when there are none).
pub fn mappings(device_classes: &[DeviceClass]) -> Vec<DeviceClassMapping> {
    let mut names: Vec<String> = device_classes
        .iter()
        .filter_map(|dc| dc.metadata.name.clone())
        .filter(|name| name.ends_with(DEVICE_CLASS_SUFFIX))
        .collect();
    names.sort();
    if names.is_empty() {
        return vec![];
    }
    vec![DeviceClassMapping {
        name: api::CLASS_RESOURCE.to_string(),
        device_class_names: names,
    }]
}

/// Whether Kueue must also count this flavor's vendor resource as the class
/// resource (a transformation): a device-plugin flavor, not a DRA-only one (its
/// quota is in the class resource itself) nor a CPU pool.
fn vendor_resource_transformed(flavor: &FlavorReport) -> bool {
    counts_as_class_resource(flavor) && !is_dra_flavor(flavor)
}

/// The vendor device resources Kueue must also count as the class resource, in
/// name order: those of every flavor a workload may ask for by it.
pub fn class_counted_resources(flavor_reports: &BTreeMap<String, FlavorReport>) -> BTreeSet<&str> {
    flavor_reports
        .values()
        .filter(|f| vendor_resource_transformed(f))
        .map(|f| f.resource_name.as_str())
        .collect()
}

/// The transformation Kueue needs for each of [`class_counted_resources`]: keep
/// counting the vendor resource, and count each unit as one class resource too.
pub fn transformations(
    flavor_reports: &BTreeMap<String, FlavorReport>,
) -> Vec<ResourceTransformation> {
    class_counted_resources(flavor_reports)
        .into_iter()
        .map(|input| ResourceTransformation {
            input: input.to_string(),
            strategy: Some(RETAIN.to_string()),
            outputs: BTreeMap::from([(api::CLASS_RESOURCE.to_string(), "1".into())]),
        })
        .collect()
}

/// The lines to add to Kueue's Configuration so it counts every mapping and
/// transformation, as YAML with the comments a platform team needs (where it
/// goes, the restart, what a transformation does to other ClusterQueues).
pub fn configuration_snippet(
    mappings: &[DeviceClassMapping],
    transformations: &[ResourceTransformation],
) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "# Add to Kueue's Configuration (the `{CONFIG_MAP_KEY}` key of ConfigMap\n\
         # kueue-system/kueue-manager-config in Kueue's install manifests), then restart\n\
         # Kueue: it reads these only when it starts.\n"
    ));
    if mappings.is_empty() && transformations.is_empty() {
        out.push_str(
            "# Nothing to add: the plan has no device flavors (no DeviceClasses, no vendor resources).\n",
        );
        return out;
    }
    if let Some(m) = mappings
        .iter()
        .find(|m| m.device_class_names.len() > MAX_DEVICE_CLASSES_PER_MAPPING)
    {
        out.push_str(&format!(
            "# WARNING: {} DeviceClasses in one mapping; Kueue v0.17 accepts at most {MAX_DEVICE_CLASSES_PER_MAPPING}\n\
             # (claims of the others cannot be counted; class-level requests still are).\n",
            m.device_class_names.len()
        ));
    }
    if mappings.len() > MAX_DEVICE_CLASS_MAPPINGS {
        out.push_str(&format!(
            "# WARNING: {} mappings; Kueue v0.17 accepts at most {MAX_DEVICE_CLASS_MAPPINGS}.\n",
            mappings.len()
        ));
    }
    if !mappings.is_empty() {
        out.push_str(&format!(
            "# Kueue v0.18+ calls the gate {DRA_GATE_V018} (on by default there).\n\
             featureGates:\n  {DRA_GATE_V017}: true\n"
        ));
    }
    out.push_str("resources:\n");
    if !mappings.is_empty() {
        out.push_str("  deviceClassMappings:\n");
        for m in mappings {
            out.push_str(&format!("  - name: {}\n    deviceClassNames:\n", m.name));
            for c in &m.device_class_names {
                out.push_str(&format!("    - {c}\n"));
            }
        }
    }
    if !transformations.is_empty() {
        out.push_str(&format!(
            "  # One device, one count: each vendor device is also counted as {class}, so\n\
             \x20 # a flavor's {class} quota bounds the devices asked for by either name.\n\
             \x20 # This applies to EVERY ClusterQueue: one that covers a resource below but\n\
             \x20 # not {class} admits none of its workloads asking for it (kaccel reports\n\
             \x20 # such queues in the ForeignQueuesBlocked condition).\n\
             \x20 transformations:\n",
            class = api::CLASS_RESOURCE
        ));
        for t in transformations {
            out.push_str(&format!(
                "  - input: {}\n    strategy: {RETAIN}\n    outputs:\n",
                t.input
            ));
            for output in t.outputs.keys() {
                out.push_str(&format!("      {output}: \"1\"\n"));
            }
        }
    }
    out
}

/// ClusterQueues kaccel does not own that Kueue will not admit a workload of,
/// once it counts a vendor resource as the class resource: each queue covering
/// such a resource but not the class resource -> those resources. Kueue's own
/// transformations are used when kaccel read them, else the ones the plan asks for.
pub fn blocked_queues(
    foreign: &BTreeMap<String, BTreeSet<String>>,
    observed: Option<&ObservedConfiguration>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
) -> BTreeMap<String, Vec<String>> {
    let transformed: BTreeSet<String> = match observed.map(|o| &o.read) {
        Some(Ok(config)) => config
            .transformations()
            .into_iter()
            .filter(|(_, t)| t.outputs.contains_key(api::CLASS_RESOURCE))
            .map(|(input, _)| input.to_string())
            .collect(),
        _ => class_counted_resources(flavor_reports)
            .into_iter()
            .map(str::to_string)
            .collect(),
    };
    foreign
        .iter()
        .filter(|(_, covered)| !covered.contains(api::CLASS_RESOURCE))
        .filter_map(|(queue, covered)| {
            let blocked: Vec<String> = covered.intersection(&transformed).cloned().collect();
            (!blocked.is_empty()).then(|| (queue.clone(), blocked))
        })
        .collect()
}

/// `KueueCountsClassRequests` on every class with a flavor asked for by the
/// class resource, from what the controller read of Kueue's configuration
/// (nothing when it read nothing), and `ForeignQueuesBlocked` on those whose
/// vendor resources block a ClusterQueue kaccel does not own.
pub(super) fn class_request_conditions(
    class_reports: &mut BTreeMap<String, ClassReport>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
    observed: Option<&ObservedConfiguration>,
    blocked: &BTreeMap<String, Vec<String>>,
) {
    let Some(observed) = observed else {
        return;
    };
    // class -> the vendor resources of its flavors asked for by the class resource
    let mut by_class: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for flavor in flavor_reports
        .values()
        .filter(|f| vendor_resource_transformed(f))
    {
        for class in &flavor.classes {
            by_class
                .entry(class)
                .or_default()
                .insert(&flavor.resource_name);
        }
    }
    let class = api::CLASS_RESOURCE;
    for (class_name, resources) in by_class {
        let Some(report) = class_reports.get_mut(class_name) else {
            continue;
        };
        let listed = resources.iter().copied().collect::<Vec<_>>().join(", ");
        let counted = match &observed.read {
            Err(why) => DesiredCondition::new(
                api::KUEUE_COUNTS_CLASS_REQUESTS,
                false,
                "KueueConfigurationUnreadable",
                format!(
                    "cannot read Kueue's configuration ({}): {why}; Kueue counts {listed} as {class} only if it transforms them",
                    observed.source
                ),
            ),
            Ok(config) => {
                let have = config.transformations();
                let missing: Vec<String> = resources
                    .iter()
                    .filter(|r| !have.get(*r).is_some_and(|t| t.retains_one_per_unit(class)))
                    .map(|r| match have.get(r) {
                        Some(_) => format!(
                            "the transformation of {r} must keep it (strategy {RETAIN}) and output {class}: \"1\""
                        ),
                        None => format!(
                            "add resources.transformations entry {{input: {r}, strategy: {RETAIN}, outputs: {{{class}: \"1\"}}}}"
                        ),
                    })
                    .collect();
                if missing.is_empty() {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_CLASS_REQUESTS,
                        true,
                        "Transformed",
                        format!("{} counts {listed} as {class} too", observed.source),
                    )
                } else {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_CLASS_REQUESTS,
                        false,
                        "TransformationMissing",
                        format!(
                            "Kueue does not count {listed} as {class} ({}), so a device asked for by both names could be admitted twice: {}; then restart Kueue (`kaccel plan --kueue-config` prints the snippet)",
                            observed.source,
                            missing.join("; ")
                        ),
                    )
                }
            }
        };
        report.conditions.push(counted);
        let blocking: Vec<String> = blocked
            .iter()
            .filter(|(_, rs)| rs.iter().any(|r| resources.contains(r.as_str())))
            .map(|(queue, rs)| format!("{queue} ({})", rs.join(", ")))
            .collect();
        report.conditions.push(if blocking.is_empty() {
            DesiredCondition::new(
                api::FOREIGN_QUEUES_BLOCKED,
                false,
                "NoneBlocked",
                format!("every ClusterQueue covering {listed} also covers {class}"),
            )
        } else {
            DesiredCondition::new(
                api::FOREIGN_QUEUES_BLOCKED,
                true,
                "ForeignQueueLacksClassResource",
                format!(
                    "ClusterQueue(s) kaccel does not own cover these but not {class}, which Kueue counts them as too, so it admits none of their workloads asking for them: {}; add {class} to each such resource group with a nominal quota equal to the vendor resource's (kaccel never writes to them)",
                    blocking.join(", ")
                ),
            )
        });
    }
}

/// `KueueCountsDeviceClasses` on every class that has a DeviceClass, from what
/// the controller read of Kueue's configuration (nothing when it read nothing).
pub(super) fn conditions(
    class_reports: &mut BTreeMap<String, ClassReport>,
    flavor_reports: &BTreeMap<String, FlavorReport>,
    device_classes: &[DeviceClass],
    observed: Option<&ObservedConfiguration>,
) {
    let Some(observed) = observed else {
        return;
    };
    // Kaccel's DeviceClasses, in the order the printed mapping lists them.
    let wanted = mappings(device_classes);
    let all: Vec<&str> = wanted
        .iter()
        .flat_map(|m| &m.device_class_names)
        .map(String::as_str)
        .collect();
    // class -> the DeviceClasses of its flavors
    let mut by_class: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for &name in &all {
        let flavor = name.strip_suffix(DEVICE_CLASS_SUFFIX).unwrap_or(name);
        for class in flavor_reports.get(flavor).iter().flat_map(|f| &f.classes) {
            by_class.entry(class).or_default().push(name);
        }
    }
    // Kueue takes at most this many names in one mapping: the rest cannot be.
    let countable: BTreeSet<&str> = all
        .iter()
        .copied()
        .take(MAX_DEVICE_CLASSES_PER_MAPPING)
        .collect();
    let class = api::CLASS_RESOURCE;
    for (class_name, needed) in by_class {
        let Some(report) = class_reports.get_mut(class_name) else {
            continue;
        };
        let condition = match &observed.read {
            Err(why) => DesiredCondition::new(
                api::KUEUE_COUNTS_DEVICE_CLASSES,
                false,
                "KueueConfigurationUnreadable",
                format!(
                    "cannot read Kueue's configuration ({}): {why}; Kueue counts claims of {} only if it maps them",
                    observed.source,
                    needed.join(", ")
                ),
            ),
            Ok(config) => {
                let have = config.device_class_mappings();
                let mut missing = Vec::new();
                for dc in &needed {
                    match have.get(dc) {
                        Some(name) if *name == class => {}
                        Some(other) => missing.push(format!(
                            "DeviceClass {dc} is mapped to {other}, not {class} (the resource this class's quota is in)"
                        )),
                        None if countable.contains(dc) => missing.push(format!(
                            "add {dc} to the deviceClassNames of the resources.deviceClassMappings entry named {class}"
                        )),
                        None => missing.push(format!(
                            "DeviceClass {dc} is beyond the {MAX_DEVICE_CLASSES_PER_MAPPING} DeviceClasses Kueue v0.17 counts in one mapping ({} in the plan), so its claims cannot be admitted: ask for its devices as {class} (counted without a mapping), or narrow the DRA classes",
                            all.len()
                        )),
                    }
                }
                let gate = config.dra_gate_enabled() || observed.gate_on_command_line;
                if !gate {
                    missing.insert(
                        0,
                        format!("set featureGates.{DRA_GATE_V017}: true ({DRA_GATE_V018} on Kueue v0.18+)"),
                    );
                }
                if missing.is_empty() {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_DEVICE_CLASSES,
                        true,
                        "Mapped",
                        format!(
                            "{} counts claims of {} as {class}",
                            observed.source,
                            needed.join(", ")
                        ),
                    )
                } else {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_DEVICE_CLASSES,
                        false,
                        "DeviceClassNotMapped",
                        format!(
                            "Kueue does not count claims of {} ({}): {}; then restart Kueue (`kaccel plan --kueue-config` prints the snippet)",
                            needed.join(", "),
                            observed.source,
                            missing.join("; ")
                        ),
                    )
                }
            }
        };
        report.conditions.push(condition);
    }
}

#[cfg(test)]
mod tests;
