//! Allocation: what admitted Kueue Workloads hold per ResourceFlavor and device resource.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::Value;

use crate::inventory::{DeviceVariant, Inventory};
use crate::k8s::quantity::parse_count;
use crate::kueue::workload::Workload;

/// Devices held by admitted Kueue Workloads, per ResourceFlavor and resource.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Allocation {
    /// Set when allocation could not be read: then `flavors` is empty and means
    /// "unknown", not "nothing allocated".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
    pub flavors: Vec<FlavorAllocation>,
    /// Problems met while reading Workloads (e.g. an unparseable quantity).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FlavorAllocation {
    pub flavor: String,
    pub resource_name: String,
    /// Variants of the device groups the flavor's `nodeLabels` select (usually one);
    /// empty when the flavor no longer exists or selects no such devices.
    pub variants: Vec<DeviceVariant>,
    /// Nodes with a selected group.
    pub nodes: u32,
    /// Capacity and allocatable of the selected groups.
    pub capacity: u64,
    pub allocatable: u64,
    /// Sum of `resourceUsage` of this resource in admitted, unfinished Workloads
    /// assigned to this flavor.
    pub allocated: u64,
    pub workloads: u32,
}

/// The Kueue objects allocation is computed from: flavors and queues as JSON,
/// Workloads typed.
#[derive(Clone, Debug, Default)]
pub struct KueueObjects {
    pub flavors: Vec<Value>,
    pub cluster_queues: Vec<Value>,
    pub workloads: Vec<Workload>,
}

/// Whether a resource name is a device (an extended resource such as
/// `nvidia.com/gpu`), not cpu, memory, pods, ephemeral storage or hugepages.
/// A resource devices are published under (not the class resource, which names
/// no device of its own: its usage is the flavor's devices).
fn is_device_resource(name: &str) -> bool {
    name.contains('/')
        && !name.starts_with("kubernetes.io/")
        && !name.starts_with("hugepages-")
        && name != crate::api::CLASS_RESOURCE
}

fn labels_of(obj: &Value) -> BTreeMap<String, String> {
    obj.pointer("/spec/nodeLabels")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
        .collect()
}

/// Allocation per (flavor, device resource). Rows: every (flavor, device resource)
/// a ClusterQueue grants quota for (so idle flavors show 0), plus whatever admitted
/// Workloads hold (also on flavors that no longer exist). A Workload counts while
/// `Admitted` is True and `Finished` is not.
pub fn allocation(inventory: &Inventory, kueue: &KueueObjects) -> Allocation {
    let KueueObjects {
        flavors,
        cluster_queues,
        workloads,
    } = kueue;
    let mut rows: BTreeMap<(String, String), FlavorAllocation> = BTreeMap::new();
    let mut selectors: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    // flavor -> what its pods ask for, where kaccel's ResourceFlavor says so: a
    // DRA-only flavor's quota is in the class resource, its row is this name.
    let mut pod_resources: BTreeMap<String, String> = BTreeMap::new();
    for flavor in flavors {
        let Some(name) = flavor.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        selectors.insert(name.to_string(), labels_of(flavor));
        let annotation = flavor
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(crate::k8s::labels::DEVICE_RESOURCE_ANNOTATION))
            .and_then(Value::as_str);
        if let Some(resource) = annotation {
            pod_resources.insert(name.to_string(), resource.to_string());
        }
    }
    let new_row = |flavor: &str, resource: &str| {
        let mut row = FlavorAllocation {
            flavor: flavor.to_string(),
            resource_name: resource.to_string(),
            variants: Vec::new(),
            nodes: 0,
            capacity: 0,
            allocatable: 0,
            allocated: 0,
            workloads: 0,
        };
        if let Some(selector) = selectors.get(flavor) {
            let mut variants = BTreeSet::new();
            let mut nodes = BTreeSet::new();
            // A DRA flavor's row is its DeviceClass's implicit extended resource:
            // the DRA groups its nodeLabels select.
            let dra = resource
                .starts_with(crate::plan::kueue_counting::IMPLICIT_EXTENDED_RESOURCE_PREFIX);
            for (node, group) in inventory.groups() {
                let counted = group.variant.resource_name == resource
                    || (dra && crate::inventory::is_dra_device_class(&group.variant.resource_name));
                if counted && node.labels.carries_all(selector) {
                    variants.insert(group.variant.clone());
                    nodes.insert(node.name.as_str());
                    row.capacity += u64::from(group.capacity);
                    row.allocatable += u64::from(group.allocatable);
                }
            }
            row.variants = variants.into_iter().collect();
            row.nodes = nodes.len() as u32;
        }
        row
    };
    // Every (flavor, device resource) with quota in a ClusterQueue: idle ones show 0.
    // (A flavor's nodeLabels alone do not say which resource it is for: a MIG node's
    // whole-GPU and partition flavors select the same nodes.)
    for cq in cluster_queues {
        let groups = cq
            .pointer("/spec/resourceGroups")
            .and_then(Value::as_array)
            .into_iter()
            .flatten();
        for flavor in groups.flat_map(|rg| rg["flavors"].as_array().into_iter().flatten()) {
            let Some(name) = flavor["name"].as_str() else {
                continue;
            };
            for quota in flavor["resources"].as_array().into_iter().flatten() {
                let Some(mut resource) = quota["name"].as_str() else {
                    continue;
                };
                if resource == crate::api::CLASS_RESOURCE
                    && let Some(dra) = pod_resources.get(name).filter(|r| {
                        r.starts_with(
                            crate::plan::kueue_counting::IMPLICIT_EXTENDED_RESOURCE_PREFIX,
                        )
                    })
                {
                    resource = dra;
                }
                let key = (name.to_string(), resource.to_string());
                if !is_device_resource(resource) || rows.contains_key(&key) {
                    continue;
                }
                // Kueue makes every flavor of a resource group list every covered
                // resource: skip the zero-quota entries for devices it does not select.
                let row = new_row(name, resource);
                let nominal = quota["nominalQuota"]
                    .as_str()
                    .and_then(|q| parse_count(q).ok())
                    .unwrap_or(0);
                if row.nodes > 0 || nominal > 0 {
                    rows.insert(key, row);
                }
            }
        }
    }
    let mut warnings = Vec::new();
    for wl in workloads {
        if !wl.is_true("Admitted") || wl.is_true("Finished") {
            continue;
        }
        let name = format!(
            "{}/{}",
            wl.metadata.namespace.as_deref().unwrap_or(""),
            wl.metadata.name.as_deref().unwrap_or("")
        );
        // The ledger's reading of the admission: each device counted once
        // however it was asked for (see `pod_set_usage`).
        let usage = match crate::ledger::admission::usage_from_workload(wl) {
            Ok(usage) => usage,
            Err(e) => {
                warnings.push(format!("Workload {name}: {e}"));
                continue;
            }
        };
        let mut counted: BTreeSet<(String, String)> = BTreeSet::new();
        for u in usage {
            // Devices asked for by the class resource are the flavor's own: they go
            // on the row of the resource its devices are published under.
            let resource = if u.resource == crate::api::CLASS_RESOURCE {
                rows.keys()
                    .find(|(flavor, _)| *flavor == u.flavor)
                    .map(|(_, r)| r.clone())
                    .unwrap_or(u.resource)
            } else {
                u.resource
            };
            let key = (u.flavor.clone(), resource.clone());
            let row = rows
                .entry(key.clone())
                .or_insert_with(|| new_row(&u.flavor, &resource));
            row.allocated += u.device_units;
            if counted.insert(key) {
                row.workloads += 1;
            }
        }
    }
    Allocation {
        unavailable: None,
        flavors: rows.into_values().collect(),
        warnings,
    }
}
