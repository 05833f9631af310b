//! Stage 8b, DeviceClasses: one kaccel-owned `resource.k8s.io/v1` DeviceClass per
//! DRA-only flavor (its devices published only by a DRA driver), whose CEL selector
//! selects exactly that flavor's devices, so a ResourceClaimTemplate naming it is
//! given a device of that variant and no other.
//!
//! The selector is built from what the flavor's devices publish, in the order the
//! scheduler must meet it (an attribute a device lacks is a runtime error, which
//! aborts the pod's scheduling attempt rather than skipping the device, so every
//! lookup is guarded by the clause before it or by `has`):
//! 1. the driver;
//! 2. the attributes that make the variant, each pinned to the values the variant's
//!    devices publish (`type`, the product, the partition profile: see
//!    [`crate::inventory::dra_selector_attributes`]);
//! 3. for each class using the flavor, its hard requirements the device publishes
//!    per device (minimum memory as a quantity, architectures, minimum compute
//!    capability / CUDA / driver versions as semver), or'ed across the classes.
//!    A requirement on a property the model alone decides (Gaudi and TPU memory and
//!    architecture, from kaccel's tables) is met by the product pin.
//!
//! A requirement CEL cannot express for the flavor's driver (a version published as
//! a plain string, memory some devices do not publish) writes no DeviceClass for
//! the flavor, and the class gets a condition naming the field.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::resource::v1::{
    CELDeviceSelector, DeviceClass, DeviceClassSpec, DeviceSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::flavors::{FlavorAcc, FlavorKey};
use super::{FLAVOR_LABEL, MANAGED_BY_LABEL};
use crate::api::{AcceleratorClass, HardwareSelector};
use crate::inventory::{AttributeKind, DeviceRecord, NodeInventory};

/// kaccel's DeviceClasses are named `<flavor>.kaccel.io`: a DNS subdomain like the
/// vendors' own classes (`gpu.nvidia.com`), and plainly kaccel's.
pub const DEVICE_CLASS_SUFFIX: &str = ".kaccel.io";

/// The DeviceClass kaccel writes for a flavor.
pub fn device_class_name(flavor: &str) -> String {
    format!("{flavor}{DEVICE_CLASS_SUFFIX}")
}

/// A class requirement the DeviceClass of a flavor cannot express.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceClassProblem {
    pub class: String,
    pub flavor: String,
    /// The class field, as a JSON path (`spec.selector.minDriverVersion`).
    pub field: String,
    pub message: String,
}

#[derive(Default)]
pub(super) struct DeviceClasses {
    pub(super) objects: Vec<DeviceClass>,
    pub(super) problems: Vec<DeviceClassProblem>,
}

pub(super) fn build(
    flavors: &BTreeMap<FlavorKey, FlavorAcc>,
    flavor_names: &BTreeMap<FlavorKey, String>,
    nodes: &[&NodeInventory],
    class_by_name: &BTreeMap<String, &AcceleratorClass>,
    instance: &str,
) -> DeviceClasses {
    let mut out = DeviceClasses::default();
    // One pass over the fleet: the devices of each DRA-only variant, and the types
    // each driver's devices publish each attribute as (the scheduler evaluates a
    // class on every device of its driver).
    let mut by_variant: BTreeMap<&crate::inventory::DeviceVariant, Vec<&DeviceRecord>> =
        BTreeMap::new();
    let mut by_driver: BTreeMap<&str, Vec<&DeviceRecord>> = BTreeMap::new();
    for g in nodes.iter().flat_map(|n| n.groups.iter()) {
        let dra_only = g.is_dra_only();
        // A DRA-only group's devices all come from its driver's slices: taken
        // whole, without reading each record (the fleet's largest array).
        let first = if dra_only {
            g.devices.first()
        } else {
            g.devices.iter().find(|d| !d.driver.is_empty())
        };
        let Some(first) = first else {
            continue;
        };
        let of_driver = by_driver.entry(first.driver.as_ref()).or_default();
        let start = of_driver.len();
        if dra_only {
            of_driver.extend(g.devices.iter());
        } else {
            of_driver.extend(g.devices.iter().filter(|d| !d.driver.is_empty()));
        }
        // The group's variant looked up once, not once per device.
        if dra_only {
            by_variant
                .entry(&g.variant)
                .or_default()
                .extend_from_slice(&of_driver[start..]);
        }
    }
    let kinds: BTreeMap<&str, AttributeKinds> = by_driver
        .into_iter()
        .map(|(driver, devices)| (driver, AttributeKinds::new(devices)))
        .collect();
    let no_kinds = AttributeKinds::new(Vec::new());
    for (key, acc) in flavors {
        let Some(variant) = &key.variant else {
            continue;
        };
        if !crate::inventory::is_dra_device_class(&variant.resource_name) {
            continue;
        }
        // Every device of the variant, wherever it is: the scheduler may place a
        // claim on any node the flavor's nodeLabels select, and there the class
        // must take exactly the devices of the variant that pass the requirements.
        let Some(devices) = by_variant.get(variant) else {
            continue;
        };
        if acc.members.is_empty() {
            continue;
        }
        // One driver per DRA-only variant (its resource is the driver's class).
        let Some(driver) = devices.first().map(|d| d.driver.as_ref()) else {
            continue;
        };
        if devices.iter().any(|d| d.driver != driver) {
            continue;
        }
        let fleet = kinds.get(driver).unwrap_or(&no_kinds);
        let variant_kinds = AttributeKinds::new(devices.clone());
        let flavor = &flavor_names[key];
        let classes: Vec<(&String, &AcceleratorClass)> = acc
            .classes
            .iter()
            .filter_map(|c| class_by_name.get(c).map(|class| (c, *class)))
            .collect();
        match selector(driver, devices, &variant_kinds, fleet, &classes) {
            Ok(expression) => out.objects.push(device_class(flavor, expression, instance)),
            Err((class, field, why)) => out.problems.push(DeviceClassProblem {
                class: class.clone(),
                flavor: flavor.clone(),
                field: field.into(),
                message: format!(
                    "{field} cannot be written into the CEL selector of DeviceClass {} for flavor {flavor}: {why}; no DeviceClass is written for this flavor, so Kueue counts no claim against it until the class is fixed",
                    device_class_name(flavor)
                ),
            }),
        }
    }
    out
}

fn device_class(flavor: &str, expression: String, instance: &str) -> DeviceClass {
    DeviceClass {
        metadata: ObjectMeta {
            name: Some(device_class_name(flavor)),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), instance.to_string()),
                (FLAVOR_LABEL.to_string(), flavor.to_string()),
            ])),
            ..Default::default()
        },
        spec: DeviceClassSpec {
            selectors: Some(vec![DeviceSelector {
                cel: Some(CELDeviceSelector { expression }),
            }]),
            ..Default::default()
        },
    }
}

/// (class, field, why) when a requirement of `class` cannot be expressed.
type Unexpressible<'a> = (&'a String, &'static str, String);

/// The CEL selector of a flavor's devices (see the module docs for its shape).
/// The types a set of devices publish an attribute as, worked out once per
/// attribute asked for (a requirement asks for the same one class after class).
struct AttributeKinds<'a> {
    devices: Vec<&'a DeviceRecord>,
    /// Attribute -> (types published, whether some device lacks it).
    seen: std::cell::RefCell<BTreeMap<&'static str, (BTreeSet<AttributeKind>, bool)>>,
}

impl<'a> AttributeKinds<'a> {
    fn new(devices: Vec<&'a DeviceRecord>) -> Self {
        AttributeKinds {
            devices,
            seen: Default::default(),
        }
    }

    fn of(&self, id: &'static str) -> (BTreeSet<AttributeKind>, bool) {
        self.seen
            .borrow_mut()
            .entry(id)
            .or_insert_with(|| {
                let mut kinds = BTreeSet::new();
                let mut lacking = false;
                // Shapes are shared fleet-wide when read: each distinct one once.
                let mut seen: Vec<&std::sync::Arc<BTreeMap<String, AttributeKind>>> = Vec::new();
                for d in &self.devices {
                    if seen
                        .iter()
                        .any(|p| std::sync::Arc::ptr_eq(p, &d.attribute_kinds))
                    {
                        continue;
                    }
                    seen.push(&d.attribute_kinds);
                    match d.attribute_kinds.get(id) {
                        Some(k) => {
                            kinds.insert(*k);
                        }
                        None => lacking = true,
                    }
                }
                (kinds, lacking)
            })
            .clone()
    }

    /// Every device that publishes `id` publishes it as `kind`.
    fn only(&self, id: &'static str, kind: AttributeKind) -> bool {
        self.of(id).0.iter().all(|k| *k == kind)
    }

    /// Every device publishes `id`, as `kind`.
    fn all(&self, id: &'static str, kind: AttributeKind) -> bool {
        let (kinds, lacking) = self.of(id);
        !lacking && kinds.iter().all(|k| *k == kind)
    }
}

/// `devices`: those of the flavor's variant (`variant_kinds`: the types they
/// publish); `fleet`: the types every device of the driver publishes.
fn selector<'a>(
    driver: &str,
    devices: &[&DeviceRecord],
    variant_kinds: &AttributeKinds<'_>,
    fleet: &AttributeKinds<'_>,
    classes: &[(&'a String, &AcceleratorClass)],
) -> Result<String, Unexpressible<'a>> {
    let attr = |id: &str| format!("device.attributes[{}].{id}", literal(driver));
    let mut clauses = vec![format!("device.driver == {}", literal(driver))];
    for (i, id) in crate::inventory::dra_selector_attributes(driver)
        .iter()
        .enumerate()
    {
        let mut values: BTreeSet<&str> = BTreeSet::new();
        let mut some_lack_it = false;
        // Values are shared fleet-wide when read: each distinct set once.
        let mut seen: Vec<&std::sync::Arc<[Option<String>]>> = Vec::new();
        for d in devices {
            if seen
                .iter()
                .any(|p| std::sync::Arc::ptr_eq(p, &d.selector_values))
            {
                continue;
            }
            seen.push(&d.selector_values);
            match d.selector_values.get(i).and_then(|v| v.as_deref()) {
                Some(v) => {
                    values.insert(v);
                }
                None => some_lack_it = true,
            }
        }
        if values.is_empty() {
            // None of the flavor's devices publish it: a device that does is of
            // another variant (NVIDIA's `profile` on a MIG device), unless empty.
            clauses.push(format!("(!has({a}) || {a} == \"\")", a = attr(id)));
            continue;
        }
        let listed = list(values.iter().copied());
        clauses.push(if some_lack_it {
            format!(
                "(has({a}) && {a} != \"\" ? {a} in {listed} : true)",
                a = attr(id)
            )
        } else {
            format!("has({a}) && {a} in {listed}", a = attr(id))
        });
    }
    let mut per_class: Vec<String> = Vec::new();
    let mut unconstrained = false;
    // Counted once for the flavor, not once per class.
    let memory_published = devices.iter().filter(|d| d.memory_mib.is_some()).count();
    for (name, class) in classes {
        let requirements = class_requirements(
            driver,
            (devices.len(), memory_published),
            variant_kinds,
            fleet,
            &class.spec.selector,
        )
        .map_err(|(field, why)| (*name, field, why))?;
        if requirements.is_empty() {
            unconstrained = true;
        } else {
            per_class.push(requirements.join(" && "));
        }
    }
    if !unconstrained && !per_class.is_empty() {
        per_class.sort();
        per_class.dedup();
        clauses.push(if per_class.len() == 1 {
            per_class.remove(0)
        } else {
            format!("(({}))", per_class.join(") || ("))
        });
    }
    let expression = clauses.join(" && ");
    // The API server refuses a longer one: say so rather than fail every apply.
    if expression.len() > MAX_SELECTOR_BYTES
        && let Some((first, _)) = classes.first()
    {
        return Err((
            first,
            "spec.selector",
            format!(
                "the selector would be {} bytes, over the API server's limit of {MAX_SELECTOR_BYTES} (too many product spellings or classes with different requirements on one flavor)",
                expression.len()
            ),
        ));
    }
    Ok(expression)
}

/// The API server's limit on a DeviceClass CEL selector
/// (`resource.k8s.io/v1` `CELSelectorExpressionMaxLength`).
const MAX_SELECTOR_BYTES: usize = 10 * 1024;

/// One class's hard requirements as CEL clauses on one device of `driver`.
/// `(devices, memory_published)`: how many devices the flavor has, and how many
/// of them publish their memory capacity.
fn class_requirements(
    driver: &str,
    (devices, memory_published): (usize, usize),
    variant_kinds: &AttributeKinds<'_>,
    fleet: &AttributeKinds<'_>,
    selector: &HardwareSelector,
) -> Result<Vec<String>, (&'static str, String)> {
    // A clause calls a string or version function on the attribute: every device
    // of the driver that publishes it must publish that type, or evaluating the
    // class on it is an error (which fails the pod's scheduling, not the device).
    let typed_as = |id: &'static str, kind: AttributeKind| fleet.only(id, kind);
    let attrs = format!("device.attributes[{}]", literal(driver));
    let mut clauses = Vec::new();
    let spec = crate::inventory::dra_requirement_attributes(driver);
    if let Some(min) = selector.min_memory_mib {
        if memory_published == devices {
            let memory = format!("device.capacity[{}].memory", literal(driver));
            clauses.push(format!(
                "has({memory}) && {memory}.compareTo(quantity(\"{min}Mi\")) >= 0"
            ));
        } else if !(spec.memory_from_model && memory_published == 0) {
            // (From the model: kaccel's table, which the product pin decides.)
            return Err((
                "spec.selector.minMemoryMiB",
                format!("some devices of driver {driver} publish no memory capacity"),
            ));
        }
    }
    if !selector.architectures.is_empty() {
        match spec.architecture {
            None => {} // from the model, which the product pins
            Some(id) if !typed_as(id, AttributeKind::String) => {
                return Err((
                    "spec.selector.architectures",
                    format!(
                        "some devices of driver {driver} publish {id} as another type than a string"
                    ),
                ));
            }
            Some(id) => {
                let allowed: BTreeSet<String> = selector
                    .architectures
                    .iter()
                    .map(|a| a.to_ascii_lowercase())
                    .collect();
                let a = format!("{attrs}.{id}");
                // `RequirementAttributes::architecture_of`, in CEL.
                let (known, read) = if spec.intel_family {
                    (
                        format!(" && {a} != \"Unknown\""),
                        format!(
                            "({a}.contains(\"Max\") ? \"xe-hpc\" : {a}.contains(\"Flex\") ? \"xe-hpg\" : {a}.lowerAscii())"
                        ),
                    )
                } else {
                    (String::new(), format!("{a}.lowerAscii()"))
                };
                clauses.push(format!(
                    "has({a}) && {a} != \"\"{known} && {read} in {}",
                    list(allowed.iter().map(String::as_str))
                ));
            }
        }
    }
    for (field, want, id, major_minor) in [
        (
            "spec.selector.minComputeCapability",
            &selector.min_compute_capability,
            spec.compute_capability,
            true,
        ),
        (
            "spec.selector.minCudaVersion",
            &selector.min_cuda_version,
            spec.cuda_version,
            true,
        ),
        (
            "spec.selector.minDriverVersion",
            &selector.min_driver_version,
            spec.driver_version,
            false,
        ),
    ] {
        let Some(want) = want else { continue };
        let Some(id) = id else {
            return Err((
                field,
                format!("driver {driver} publishes no such attribute"),
            ));
        };
        let versions = variant_kinds.all(id, AttributeKind::Version);
        if !versions || !typed_as(id, AttributeKind::Version) {
            return Err((
                field,
                format!(
                    "driver {driver} publishes {id} as a string (or not at all) on some devices, not as a version: CEL cannot compare it"
                ),
            ));
        }
        let bound = semver_bound(want, major_minor)
            .ok_or_else(|| (field, format!("{want:?} is not a dotted version")))?;
        let a = format!("{attrs}.{id}");
        clauses.push(format!(
            "has({a}) && {a}.compareTo(semver(\"{bound}\")) >= 0"
        ));
    }
    Ok(clauses)
}

/// The least semver a device's version must reach to pass the Rust matcher's
/// `version_at_least(have, want)` (components compared as numbers, missing ones
/// 0). `major_minor`: the matcher reads only the device's major.minor
/// (compute capability, CUDA version), so a bound with a patch means the next
/// minor.
pub(super) fn semver_bound(want: &str, major_minor: bool) -> Option<String> {
    let parts: Vec<u64> = want
        .trim()
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| parts.get(i).copied().unwrap_or(0);
    let kept = if major_minor { 2 } else { 3 };
    let mut bound = [at(0), at(1), at(2)];
    if major_minor {
        bound[2] = 0;
    }
    // A non-zero component past what a device version holds: only the next
    // version up passes.
    if parts.iter().skip(kept).any(|&p| p > 0) {
        bound[kept - 1] = bound[kept - 1].checked_add(1)?;
    }
    Some(format!("{}.{}.{}", bound[0], bound[1], bound[2]))
}

/// A CEL string literal (JSON's escapes are CEL's).
fn literal(s: &str) -> String {
    serde_json::to_string(s).expect("a string serialises")
}

fn list<'v>(values: impl Iterator<Item = &'v str>) -> String {
    format!("[{}]", values.map(literal).collect::<Vec<_>>().join(", "))
}

#[cfg(test)]
mod tests;
