//! Node conditions (node-problem-detector, NVSentinel, vendor agents) raising device statuses.

use serde::{Deserialize, Serialize};

use crate::api::Vendor;
use crate::health::{DeviceStatus, HealthSnapshot};
use crate::inventory::Inventory;

/// A node condition (node-problem-detector, NVSentinel, a vendor health agent)
/// that, while True, gives the node's devices (of one vendor, or all) a status.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeConditionRule {
    #[serde(rename = "type")]
    pub type_: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vendor: Option<Vendor>,
    pub status: DeviceStatus,
}

pub fn default_node_condition_rules() -> Vec<NodeConditionRule> {
    let rule = |t: &str, vendor, status| NodeConditionRule {
        type_: t.into(),
        vendor,
        status,
    };
    vec![
        rule(
            "GpuThermalWatch",
            Some(Vendor::Nvidia),
            DeviceStatus::Warning,
        ),
        rule(
            "SysLogsXIDError",
            Some(Vendor::Nvidia),
            DeviceStatus::Degraded,
        ),
        rule("AMDGPUProblem", Some(Vendor::Amd), DeviceStatus::Failed),
    ]
}

/// Apply node conditions on top of what the sources said: a True condition moves
/// the node's devices of that vendor to at least the rule's status. Devices already
/// worse stay as they are.
pub fn apply_node_conditions(
    snapshot: &mut HealthSnapshot,
    inventory: &Inventory,
    rules: &[NodeConditionRule],
) {
    for node in inventory.nodes.values() {
        for rule in rules {
            if node.conditions.get(&rule.type_).map(|c| c.0.as_str()) != Some("True") {
                continue;
            }
            for group in &node.groups {
                if rule.vendor.is_some_and(|v| v != group.variant.vendor) {
                    continue;
                }
                let mut c = snapshot.counts_for(node, group);
                let moved = match rule.status {
                    DeviceStatus::Warning => std::mem::take(&mut c.healthy),
                    DeviceStatus::Degraded => {
                        std::mem::take(&mut c.healthy)
                            + std::mem::take(&mut c.warning)
                            + std::mem::take(&mut c.unknown)
                    }
                    DeviceStatus::Failed => {
                        std::mem::take(&mut c.healthy)
                            + std::mem::take(&mut c.warning)
                            + std::mem::take(&mut c.unknown)
                            + std::mem::take(&mut c.degraded)
                    }
                    DeviceStatus::Healthy | DeviceStatus::Unknown => 0,
                };
                match rule.status {
                    DeviceStatus::Warning => c.warning += moved,
                    DeviceStatus::Degraded => c.degraded += moved,
                    DeviceStatus::Failed => c.failed += moved,
                    DeviceStatus::Healthy | DeviceStatus::Unknown => {}
                }
                snapshot.set(&node.name, &group.variant.resource_name, c);
            }
        }
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn true_conditions_raise_device_status() {
        let text = include_str!("../../../examples/nodes.yaml");
        let nodes: Vec<k8s_openapi::api::core::v1::Node> = serde_yaml::Deserializer::from_str(text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect();
        let mut inventory = Inventory::from_nodes(&nodes);
        let node = inventory
            .nodes
            .values_mut()
            .find(|n| n.name.starts_with("gpu-h100"))
            .map(std::sync::Arc::make_mut)
            .unwrap();
        node.conditions
            .insert("GpuThermalWatch".into(), ("True".into(), "Hot".into()));
        let name = node.name.clone();
        let mut snapshot = HealthSnapshot::default();
        apply_node_conditions(&mut snapshot, &inventory, &default_node_condition_rules());
        let c = snapshot.groups[&name]["nvidia.com/gpu"];
        assert_eq!(c.healthy, 0);
        assert!(c.warning > 0);
        assert_eq!(snapshot.groups.len(), 1, "other nodes untouched");
    }
}
