//! One broken DRA device out, not its node: a `resource.k8s.io/v1alpha3`
//! DeviceTaintRule per device the health loop holds out, selecting exactly that
//! device (driver + pool + device name), so the scheduler gives no new claim that
//! device while its healthy neighbours keep scheduling. Pure: the controller
//! writes the rules like every other object it owns (server-side apply, deleted
//! when no longer wanted, never one it did not create).
//!
//! The rails are the node actions' (see [`super::nodes`]):
//! - only Failed takes a device out (Degraded too when `deviceTaintOnDegraded`);
//!   Unknown never does;
//! - a rule kaccel holds stays while nothing fresh speaks for its device (a silent
//!   exporter never returns a failed card to service); only fresh healthy
//!   readings, held for the health policy's hold-down (the tracker keeps the bad
//!   status until then), remove it;
//! - at most `maxSharePercent` of a flavor's devices (at least one) are held out
//!   by rules at once; the rest are reported held back.
//!
//! Only devices published by a DRA driver alone (a DRA-only group) are taken out
//! this way: a device the device plugin also offers would still be handed out by
//! the kubelet, so its node is cordoned as before.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1alpha3::{
    DeviceTaint, DeviceTaintRule, DeviceTaintRuleSpec, DeviceTaintSelector,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::nodes::{HeldBack, NodeActionPolicy, UNHEALTHY_TAINT};
use super::{FlavorReport, MANAGED_BY_LABEL};
use crate::health::DeviceStatus;
use crate::inventory::{ByIdentity, DeviceGroup, DeviceRecord, Inventory, NodeInventory};

/// The node a rule's device is on, for people and for `kaccel inventory`.
pub const NODE_LABEL: &str = "kaccel.io/node";
/// Why kaccel took the device out (the health loop's reasons).
pub const REASON_ANNOTATION: &str = "kaccel.io/reason";

/// The effect of kaccel's device taints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
pub enum DeviceTaintEffect {
    /// No new claim gets the device; running pods stay.
    #[default]
    NoSchedule,
    /// Also evicts the pods using it (kube-controller-manager's device-taint-eviction).
    NoExecute,
}

impl DeviceTaintEffect {
    fn as_str(self) -> &'static str {
        match self {
            DeviceTaintEffect::NoSchedule => "NoSchedule",
            DeviceTaintEffect::NoExecute => "NoExecute",
        }
    }
}

/// Per node and device resource, the devices DeviceTaintRules take out (read by
/// the node actions for every group, so looked up without building a key).
pub type TakenOutPerDevice = BTreeMap<String, BTreeMap<String, u32>>;

/// One device's health as the health loop holds it now, matched to DRA devices
/// by node and UUID or PCI address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceHealth {
    pub node: String,
    pub uuid: Option<String>,
    pub pci_address: Option<String>,
    /// What it counts as now (a silent device is Unknown, unless last seen out).
    pub status: DeviceStatus,
    /// Whether a fresh reading speaks for it.
    pub fresh: bool,
    pub reasons: Vec<String>,
}

/// What to hold out per device.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Quarantine {
    /// The rules kaccel wants, by name.
    pub rules: Vec<DeviceTaintRule>,
    /// node -> device resource -> devices of that group a rule takes out: the
    /// node need not be cordoned for them.
    pub covered: TakenOutPerDevice,
    /// Devices a rule would take out, held back by the share limit.
    pub held_back: Vec<HeldBack>,
}

/// The rule kaccel names for a device: `kaccel-<driver>-<pool>-<device>` in
/// lower-case letters, digits and dashes, with a hash of the exact triple (pool
/// and device names may hold `.`, `/` or `_`, and two may read alike), at most
/// 253 characters: always a valid object name.
pub fn rule_name(device: &DeviceRecord) -> String {
    let exact = format!("{}/{}/{}", device.driver, device.pool, device.name);
    let hash = format!("{:08x}", crate::k8s::names::fnv1a(exact.as_bytes()) as u32);
    let mut readable = String::with_capacity(exact.len() + 7);
    readable.push_str("kaccel-");
    for c in exact.chars() {
        let c = if c.is_ascii_alphanumeric() {
            c.to_ascii_lowercase()
        } else {
            '-'
        };
        if !(c == '-' && readable.ends_with('-')) {
            readable.push(c);
        }
    }
    let readable = readable.trim_end_matches('-');
    crate::k8s::names::bounded(&[readable, &hash], 253)
}

/// Decides the rules. `live` holds kaccel's own rules as they are now (by name),
/// so one whose device nothing fresh speaks for is kept as it is.
pub fn decide(
    inventory: &Inventory,
    health: &[DeviceHealth],
    flavors: &BTreeMap<String, FlavorReport>,
    live: &BTreeMap<String, DeviceTaintRule>,
    policy: &NodeActionPolicy,
    instance: &str,
) -> Quarantine {
    let mut out = Quarantine::default();
    if !policy.device_taint_rules {
        return out;
    }
    let readings = ByIdentity::new(health.iter().map(|h| {
        (
            h.node.as_str(),
            h.uuid.as_deref(),
            h.pci_address.as_deref(),
            h,
        )
    }));
    let takes_out = |s: DeviceStatus| {
        s == DeviceStatus::Failed
            || (policy.device_taint_on_degraded && s == DeviceStatus::Degraded)
    };
    // (taking out a new device?, flavor, rule, node, resource)
    let mut candidates: Vec<(bool, String, DeviceTaintRule, String, String)> = Vec::new();
    let mut held_out: BTreeMap<String, u32> = BTreeMap::new();
    // A MultiKueue worker's devices are its own cluster's to taint, not this one's.
    for node in inventory
        .nodes
        .values()
        .filter(|n| n.worker_cluster().is_none())
    {
        for group in node.groups.iter().filter(|g| g.is_dra_only()) {
            let Some(flavor) = flavor_of(flavors, node, group) else {
                continue;
            };
            for device in group.devices.iter().filter(|d| !d.driver.is_empty()) {
                let name = rule_name(device);
                let reading = readings
                    .get(
                        &node.name,
                        device.uuid.as_deref(),
                        device.pci_address.as_deref(),
                    )
                    .copied();
                let rule = match reading {
                    Some(h) if takes_out(h.status) => Some((
                        !live.contains_key(&name),
                        rule(
                            device,
                            &name,
                            &node.name,
                            h,
                            policy.device_taint_effect,
                            instance,
                        ),
                    )),
                    Some(h) if h.fresh => None,
                    // Nothing fresh speaks for the device: kaccel's rule stays as it is.
                    _ => live.get(&name).map(|r| (false, kept(r))),
                };
                if let Some((new, rule)) = rule {
                    if !new {
                        *held_out.entry(flavor.name.clone()).or_default() += 1;
                    }
                    candidates.push((
                        new,
                        flavor.name.clone(),
                        rule,
                        node.name.clone(),
                        group.variant.resource_name.clone(),
                    ));
                }
            }
        }
    }
    // Kept rules first, then new ones by name: a stable choice under the limit.
    candidates.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| a.2.metadata.name.cmp(&b.2.metadata.name))
    });
    for (new, flavor, rule, node, resource) in candidates {
        let allowed = allowed(&flavors[&flavor], policy);
        if new {
            let held = held_out.entry(flavor.clone()).or_default();
            if *held + 1 > allowed {
                let (device, reason) = HeldRule::of(&rule)
                    .map(|r| (r.device, r.reason))
                    .unwrap_or_default();
                out.held_back.push(HeldBack {
                    node: format!("{node} (device {device})"),
                    flavor,
                    allowed,
                    reason,
                });
                continue;
            }
            *held += 1;
        }
        *out.covered
            .entry(node)
            .or_default()
            .entry(resource)
            .or_default() += 1;
        out.rules.push(rule);
    }
    out.rules
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    out
}

/// Most devices of a flavor rules may hold out at once (at least one).
fn allowed(flavor: &FlavorReport, policy: &NodeActionPolicy) -> u32 {
    let devices = flavor.devices.total();
    (devices * policy.max_share_percent / 100)
        .max(1)
        .min(devices.max(1))
}

/// The flavor a node's group is planned in.
fn flavor_of<'a>(
    flavors: &'a BTreeMap<String, FlavorReport>,
    node: &NodeInventory,
    group: &DeviceGroup,
) -> Option<&'a FlavorReport> {
    flavors.values().find(|f| {
        f.nodes.contains(&node.name)
            && f.device_resource_name == group.variant.resource_name
            && f.model == group.variant.model
            && f.sharing == group.variant.sharing
            && f.partition_profile == group.variant.partition_profile
    })
}

fn rule(
    device: &DeviceRecord,
    name: &str,
    node: &str,
    health: &DeviceHealth,
    effect: DeviceTaintEffect,
    instance: &str,
) -> DeviceTaintRule {
    let reason = if health.reasons.is_empty() {
        format!("{:?}", health.status)
    } else {
        format!("{:?}: {}", health.status, health.reasons.join("; "))
    };
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY_LABEL.to_string(), instance.to_string()),
                (NODE_LABEL.to_string(), label_value(node)),
            ])),
            annotations: Some(BTreeMap::from([(REASON_ANNOTATION.to_string(), reason)])),
            ..Default::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: Some(DeviceTaintSelector {
                driver: Some(device.driver.to_string()),
                pool: Some(device.pool.clone()),
                device: Some(device.name.clone()),
            }),
            taint: DeviceTaint {
                key: UNHEALTHY_TAINT.to_string(),
                value: Some(format!("{:?}", health.status)),
                effect: effect.as_str().to_string(),
                time_added: None,
            },
        },
        status: None,
    }
}

/// A rule kaccel holds on one device, as `/devices` and `kaccel inventory` show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HeldRule {
    pub name: String,
    pub driver: String,
    pub pool: String,
    pub device: String,
    pub effect: String,
    pub reason: String,
}

impl HeldRule {
    /// `None` for a rule that does not name one device (not kaccel's shape).
    pub fn of(rule: &DeviceTaintRule) -> Option<Self> {
        let selector = rule.spec.device_selector.as_ref()?;
        Some(HeldRule {
            name: rule.metadata.name.clone()?,
            driver: selector.driver.clone()?,
            pool: selector.pool.clone()?,
            device: selector.device.clone()?,
            effect: rule.spec.taint.effect.clone(),
            reason: rule
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(REASON_ANNOTATION).cloned())
                .unwrap_or_default(),
        })
    }
}

/// A live rule of kaccel's as kaccel writes it: what it set, none of what the
/// API server added (`timeAdded`, status, the applied-hash annotation), so
/// keeping it costs no write.
fn kept(live: &DeviceTaintRule) -> DeviceTaintRule {
    let ours = |m: &Option<BTreeMap<String, String>>, keys: &[&str]| {
        m.as_ref().map(|m| {
            m.iter()
                .filter(|(k, _)| keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
    };
    DeviceTaintRule {
        metadata: ObjectMeta {
            name: live.metadata.name.clone(),
            labels: ours(&live.metadata.labels, &[MANAGED_BY_LABEL, NODE_LABEL]),
            annotations: ours(&live.metadata.annotations, &[REASON_ANNOTATION]),
            ..Default::default()
        },
        spec: DeviceTaintRuleSpec {
            device_selector: live.spec.device_selector.clone(),
            taint: DeviceTaint {
                time_added: None,
                ..live.spec.taint.clone()
            },
        },
        status: None,
    }
}

/// A node name as a label value (at most 63 characters).
fn label_value(node: &str) -> String {
    if node.len() <= 63 {
        node.to_string()
    } else {
        crate::k8s::names::bounded(&[node], 63)
    }
}

#[cfg(test)]
mod tests;
