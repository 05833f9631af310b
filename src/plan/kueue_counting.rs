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

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::DeviceClass;

use super::device_classes::DEVICE_CLASS_SUFFIX;
use super::{ClassReport, FlavorReport};
use crate::api::{self, DesiredCondition};
use crate::kueue::config::{
    CONFIG_MAP_KEY, DRA_GATE_V017, DRA_GATE_V018, DeviceClassMapping, MAX_DEVICE_CLASS_MAPPINGS,
    ObservedConfiguration,
};

/// The domain of the logical resources kaccel's DRA flavors are counted in.
pub const DRA_RESOURCE_DOMAIN: &str = "dra.kaccel.io";

/// The logical resource a DRA-only flavor's quota is in (and the key of its
/// devices in a Workload's `resourceUsage`, which the ledger prices).
pub fn quota_resource(flavor: &str) -> String {
    format!("{DRA_RESOURCE_DOMAIN}/{flavor}")
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

/// The lines to add to Kueue's Configuration so it counts every mapping, as YAML
/// with the comments a platform team needs (where it goes, the restart).
pub fn configuration_snippet(mappings: &[DeviceClassMapping]) -> String {
    let mut out = String::new();
    out.push_str(&format!(
        "# Add to Kueue's Configuration (the `{CONFIG_MAP_KEY}` key of ConfigMap\n\
         # kueue-system/kueue-manager-config in Kueue's install manifests), then restart\n\
         # Kueue: it reads the mappings only when it starts. Kueue v0.18+ calls the gate\n\
         # {DRA_GATE_V018} (on by default there).\n"
    ));
    if mappings.is_empty() {
        out.push_str("# Nothing to add: the plan has no DeviceClasses (no DRA-only flavors).\n");
        return out;
    }
    if mappings.len() > MAX_DEVICE_CLASS_MAPPINGS {
        out.push_str(&format!(
            "# WARNING: {} mappings; Kueue v0.17 accepts at most {MAX_DEVICE_CLASS_MAPPINGS}.\n",
            mappings.len()
        ));
    }
    out.push_str(&format!("featureGates:\n  {DRA_GATE_V017}: true\n"));
    out.push_str("resources:\n  deviceClassMappings:\n");
    for m in mappings {
        out.push_str(&format!("  - name: {}\n    deviceClassNames:\n", m.name));
        for c in &m.device_class_names {
            out.push_str(&format!("    - {c}\n"));
        }
    }
    out
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
