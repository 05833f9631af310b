//! Normalised device health, as the planner consumes it.
//!
//! Vendor health adapters (exporters, node conditions, DRA device taints) report per
//! device; the planner needs, per node and device group, how many devices are in
//! each status. A group with no report falls back to what the node itself says
//! (see [`HealthSnapshot::counts_for`]).

pub mod exporters;
pub mod policy;
pub mod prom;
pub mod promql;
pub mod scrape;
pub mod shared_text;
pub mod trend;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::api::HealthCounts;
use crate::inventory::{DeviceGroup, NodeInventory};

/// Normalised status of one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DeviceStatus {
    /// Fine.
    Healthy,
    /// Still schedulable, but its flavor is moved later in the preference order.
    Warning,
    /// Out of healthy capacity: quota shrinks, no new work.
    Degraded,
    /// Confirmed failure: out of capacity, node action per policy.
    Failed,
    /// No fresh, parseable signal. Not unhealthy: counts as capacity and never
    /// triggers an action on its own.
    Unknown,
}

/// Health of the devices in one group on one node, keyed by node name and
/// extended resource name.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HealthSnapshot {
    /// node name -> resource name -> counts.
    pub groups: BTreeMap<String, BTreeMap<String, HealthCounts>>,
    /// node name -> resource name -> the trend rules holding for devices there that
    /// are out or demoted (Warning, Degraded, Failed): the class status names them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub trend_rules: BTreeMap<String, BTreeMap<String, BTreeSet<String>>>,
    /// node name -> resource name -> firmware (VBIOS) version -> devices whose
    /// last reading reported it. A fact, not health: kept from the last reading
    /// when the source goes silent. Devices no reading names are not counted.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub firmware: BTreeMap<String, BTreeMap<String, BTreeMap<String, u32>>>,
}

impl HealthSnapshot {
    pub fn set(&mut self, node: &str, resource: &str, counts: HealthCounts) {
        self.groups
            .entry(node.to_string())
            .or_default()
            .insert(resource.to_string(), counts);
    }

    /// The trend rules holding for a group's devices.
    pub fn trend_rules_for<'a>(
        &'a self,
        node: &str,
        resource: &str,
    ) -> impl Iterator<Item = &'a String> + 'a {
        self.trend_rules
            .get(node)
            .and_then(|groups| groups.get(resource))
            .into_iter()
            .flatten()
    }

    /// The firmware versions a group's devices last reported, with how many
    /// report each (empty when none did).
    pub fn firmware_of(&self, node: &str, resource: &str) -> Option<&BTreeMap<String, u32>> {
        self.firmware.get(node)?.get(resource)
    }

    fn get(&self, node: &str, resource: &str) -> Option<&HealthCounts> {
        self.groups.get(node)?.get(resource)
    }

    /// Counts for a group. Devices the vendor plugin withdrew (capacity above
    /// allocatable) are Degraded unless a source says worse; a node whose Ready
    /// condition is False or Unknown makes its unreported devices Unknown. Reports
    /// are clamped to the group's capacity so a confused source cannot invent devices.
    pub fn counts_for(&self, node: &NodeInventory, group: &DeviceGroup) -> HealthCounts {
        // Out of service: withdrawn by the device plugin, or tainted through DRA
        // (a device taint keeps new claims off it, like a withdrawn device).
        // A DRA-only group's tainted devices are already out of its allocatable
        // (the inventory counts them so); only other groups' are counted here,
        // which spares the planner a pass over every DRA device of the fleet.
        let tainted = if group.is_dra_only() {
            0
        } else {
            group.devices.iter().filter(|d| d.tainted).count() as u32
        };
        let withdrawn = group
            .capacity
            .saturating_sub(group.allocatable)
            .max(tainted.min(group.capacity));
        match self.get(&node.name, &group.variant.resource_name) {
            Some(reported) => clamp(*reported, group.capacity, withdrawn),
            None if node.ready != Some(true) => HealthCounts {
                unknown: group.capacity - withdrawn,
                degraded: withdrawn,
                ..Default::default()
            },
            None => HealthCounts {
                healthy: group.capacity - withdrawn,
                degraded: withdrawn,
                ..Default::default()
            },
        }
    }
}

/// Fit a report to the group: at least `withdrawn` devices are out (degraded or
/// failed), and the total equals the capacity (missing devices are Unknown).
fn clamp(reported: HealthCounts, capacity: u32, withdrawn: u32) -> HealthCounts {
    let mut c = reported;
    // Trim from the most optimistic statuses first if the source reports too many.
    let mut excess = c.total().saturating_sub(capacity);
    for field in [
        &mut c.healthy,
        &mut c.unknown,
        &mut c.warning,
        &mut c.degraded,
        &mut c.failed,
    ] {
        let cut = excess.min(*field);
        *field -= cut;
        excess -= cut;
    }
    // Devices nobody reported are Unknown; then at least `withdrawn` are out.
    c.unknown += capacity.saturating_sub(c.total());
    let out = c.degraded + c.failed;
    if out < withdrawn {
        let mut missing = withdrawn - out;
        for field in [&mut c.healthy, &mut c.unknown, &mut c.warning] {
            let moved = missing.min(*field);
            *field -= moved;
            missing -= moved;
        }
        c.degraded += withdrawn - out - missing;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_dra_tainted_device_is_out_of_service() {
        let nodes = crate::testkit::examples().nodes;
        let mut inventory = crate::inventory::Inventory::from_nodes(&nodes);
        let node = inventory
            .nodes
            .values_mut()
            .find(|n| n.groups.len() == 1 && n.groups[0].capacity == n.groups[0].allocatable)
            .map(std::sync::Arc::make_mut)
            .expect("an example node with nothing withdrawn");
        let name = node.name.clone();
        let group = &mut node.groups[0];
        group.devices.push(crate::inventory::DeviceRecord {
            tainted: true,
            ..crate::testkit::devices::dra_device("gpu-3", "gpu.nvidia.com", &name)
        });
        let node = &inventory.nodes[&name];
        let c = HealthSnapshot::default().counts_for(node, &node.groups[0]);
        assert_eq!(c.degraded, 1);
        assert_eq!(c.healthy, node.groups[0].capacity - 1);
    }

    proptest! {
        #[test]
        fn clamp_keeps_total_and_withdrawn(
            h in 0u32..20, w in 0u32..20, d in 0u32..20, f in 0u32..20, u in 0u32..20,
            capacity in 0u32..40, withdrawn_raw in 0u32..40,
        ) {
            let withdrawn = withdrawn_raw.min(capacity);
            let c = clamp(HealthCounts { healthy: h, warning: w, degraded: d, failed: f, unknown: u }, capacity, withdrawn);
            prop_assert_eq!(c.total(), capacity);
            prop_assert!(c.degraded + c.failed >= withdrawn);
        }
    }
}
