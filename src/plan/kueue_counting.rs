//! Stage 8c, Kueue counting: which logical resource Kueue must count each of
//! kaccel's DeviceClasses as, and whether the Kueue configuration the controller
//! read does so.
//!
//! Kueue v0.17 counts the devices a ResourceClaimTemplate requests only for
//! DeviceClasses its own Configuration maps to a logical resource name
//! (`resources.deviceClassMappings`, behind the `DynamicResourceAllocation` gate),
//! read once when Kueue starts. Each DRA-only flavor's quota is in its own logical
//! resource, `dra.kaccel.io/<flavor>`, counting exactly the claims of DeviceClass
//! `<flavor>.kaccel.io`: that DeviceClass pins the variant, so a claim counted
//! against the flavor is given a device of the flavor, as a device-plugin request
//! placed by the flavor's nodeLabels is.
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
    ObservedConfiguration, RETAIN, ResourceTransformation,
};

/// The domain of the logical resources kaccel's DRA flavors are counted in.
pub const DRA_RESOURCE_DOMAIN: &str = "dra.kaccel.io";

/// The logical resource a DRA-only flavor's quota is in (and the key of its
/// devices in a Workload's `resourceUsage`, which the ledger prices).
pub fn quota_resource(flavor: &str) -> String {
    format!("{DRA_RESOURCE_DOMAIN}/{flavor}")
}

/// Whether a workload may ask for this flavor's devices by the class resource
/// ([`api::CLASS_RESOURCE`]): a device-plugin flavor, whose vendor resource Kueue
/// counts as the class resource too (a transformation) and kaccel's webhook
/// rewrites the class resource into. Not CPU pools, and not DRA-only flavors
/// (their devices are asked for through claims of the flavor's DeviceClass).
pub fn counts_as_class_resource(flavor: &FlavorReport) -> bool {
    flavor.resource_name != super::CPU && flavor_of_resource(&flavor.resource_name).is_none()
}

/// The DeviceClass a kaccel DRA logical resource counts, if `resource` is one:
/// what finance sees as the resource of a DRA line.
pub fn device_class_of_resource(resource: &str) -> Option<String> {
    flavor_of_resource(resource).map(super::device_classes::device_class_name)
}

/// The flavor whose logical resource `resource` is ([`quota_resource`]'s inverse).
fn flavor_of_resource(resource: &str) -> Option<&str> {
    resource
        .strip_prefix(DRA_RESOURCE_DOMAIN)?
        .strip_prefix('/')
        .filter(|flavor| !flavor.is_empty())
}

/// The mapping Kueue needs for each DeviceClass kaccel writes, in name order.
pub fn mappings(device_classes: &[DeviceClass]) -> Vec<DeviceClassMapping> {
    let mut out: Vec<DeviceClassMapping> = device_classes
        .iter()
        .filter_map(|dc| {
            let name = dc.metadata.name.as_deref()?;
            let flavor = name.strip_suffix(DEVICE_CLASS_SUFFIX)?;
            Some(DeviceClassMapping {
                name: quota_resource(flavor),
                device_class_names: vec![name.to_string()],
            })
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

/// The vendor device resources Kueue must also count as the class resource, in
/// name order: those of every flavor a workload may ask for by it.
pub fn class_counted_resources(flavor_reports: &BTreeMap<String, FlavorReport>) -> BTreeSet<&str> {
    flavor_reports
        .values()
        .filter(|f| counts_as_class_resource(f))
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
        .filter(|f| counts_as_class_resource(f))
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
    let wanted = mappings(device_classes);
    // class -> the mappings of its flavors
    let mut by_class: BTreeMap<&str, Vec<&DeviceClassMapping>> = BTreeMap::new();
    for m in &wanted {
        let flavor = flavor_of_resource(&m.name);
        let report = flavor.and_then(|f| flavor_reports.get(f));
        for class in report.iter().flat_map(|f| &f.classes) {
            by_class.entry(class).or_default().push(m);
        }
    }
    let over_limit = wanted.len() > MAX_DEVICE_CLASS_MAPPINGS;
    for (class, needed) in by_class {
        let Some(report) = class_reports.get_mut(class) else {
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
                    names(&needed)
                ),
            ),
            Ok(config) => {
                let have = config.device_class_mappings();
                let mut missing = Vec::new();
                for m in &needed {
                    for dc in &m.device_class_names {
                        match have.get(dc.as_str()) {
                            Some(name) if *name == m.name => {}
                            Some(other) => missing.push(format!(
                                "DeviceClass {dc} is mapped to {other}, not {} (the resource this class's quota is in)",
                                m.name
                            )),
                            None => missing.push(format!(
                                "add resources.deviceClassMappings entry {{name: {}, deviceClassNames: [{dc}]}}",
                                m.name
                            )),
                        }
                    }
                }
                let gate = config.dra_gate_enabled() || observed.gate_on_command_line;
                if !gate {
                    missing.insert(
                        0,
                        format!("set featureGates.{DRA_GATE_V017}: true ({DRA_GATE_V018} on Kueue v0.18+)"),
                    );
                }
                if over_limit {
                    missing.push(format!(
                        "the plan needs {} mappings and Kueue v0.17 accepts at most {MAX_DEVICE_CLASS_MAPPINGS}: narrow the DRA classes (fewer DRA-only flavors)",
                        wanted.len()
                    ));
                }
                if missing.is_empty() {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_DEVICE_CLASSES,
                        true,
                        "Mapped",
                        format!("{} maps {}", observed.source, names(&needed)),
                    )
                } else {
                    DesiredCondition::new(
                        api::KUEUE_COUNTS_DEVICE_CLASSES,
                        false,
                        "DeviceClassNotMapped",
                        format!(
                            "Kueue does not count claims of {} ({}): {}; then restart Kueue (`kaccel plan --kueue-config` prints the snippet)",
                            names(&needed),
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

fn names(mappings: &[&DeviceClassMapping]) -> String {
    mappings
        .iter()
        .flat_map(|m| &m.device_class_names)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests;
