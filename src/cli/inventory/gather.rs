//! Reading the inventory: the cluster, Node files, or a running controller's device health.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::Value;

use super::{Allocation, DeviceHealth, InventoryError, InventoryReport, KueueObjects, allocation};
use crate::cli::load;
use crate::inventory::Inventory;
use crate::k8s::resources::kueue;
use crate::kueue::workload::Workload;

impl InventoryReport {
    /// Take per-device health from a running controller: group counts then follow
    /// the controller's sources (the same snapshot its planner uses).
    pub async fn with_health_from(mut self, address: &str) -> Result<Self, InventoryError> {
        let health = fetch_device_health(address).await?;
        let mut tracker = crate::health::policy::Tracker::default();
        for s in &health.sources {
            tracker.sources.insert(s.name.clone(), s.clone());
        }
        for d in &health.devices {
            let d = &d.device;
            tracker
                .devices
                .insert((d.node.clone(), d.device.clone()), Box::new(d.clone()));
        }
        let snapshot = tracker.snapshot(&self.inventory, health.observed_at);
        if self.taint_rules.is_empty() {
            self.taint_rules = health.taint_rules.clone();
        }
        for (node, group) in self.inventory.groups() {
            self.health.entry(node.name.clone()).or_default().insert(
                group.variant.resource_name.clone(),
                snapshot.counts_for(node, group),
            );
        }
        self.device_health = Some(health);
        Ok(self)
    }
}

/// What a running controller serves at `/devices`.
pub async fn fetch_device_health(address: &str) -> Result<DeviceHealth, InventoryError> {
    let url = format!("{}/devices", address.trim_end_matches('/'));
    let (status, body) = crate::health::scrape::Scraper::default()
        .get(
            &url,
            std::time::Duration::from_secs(5),
            crate::health::prom::MAX_BODY_BYTES,
        )
        .await
        .map_err(|e| InventoryError::Health(format!("{url}: {e}")))?;
    if status != 200 {
        return Err(InventoryError::Health(format!("{url}: HTTP {status}")));
    }
    serde_json::from_str(&body)
        .map_err(|e| InventoryError::Health(format!("{url}: not a kaccel /devices answer: {e}")))
}

/// The offline inventory: Nodes and ResourceSlices from files, no allocation.
pub fn read_files(paths: &[PathBuf]) -> Result<InventoryReport, InventoryError> {
    let loaded = load::load(paths).map_err(InventoryError::Load)?;
    let source = paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    if loaded.nodes.is_empty() {
        return Err(InventoryError::NoNodes(source));
    }
    let inventory = Inventory::from_nodes_and_slices(&loaded.nodes, &loaded.slices);
    let allocation = Allocation {
        unavailable: Some("not read: Nodes come from files (--nodes), not a cluster".into()),
        ..Default::default()
    };
    Ok(InventoryReport::new(source, inventory, allocation))
}

/// The inventory of the cluster of the current kubeconfig (or in-cluster config):
/// Nodes (required), DRA ResourceSlices (when served), and Kueue ResourceFlavors
/// and Workloads for allocation (reported unavailable when they cannot be read).
pub async fn read_cluster() -> Result<InventoryReport, InventoryError> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| InventoryError::NoCluster(e.to_string()))?;
    let server = config.cluster_url.to_string();
    let client = Client::try_from(config)
        .map_err(|e| InventoryError::NoCluster(format!("{server}: {e}")))?;
    let nodes: Vec<Node> = Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| InventoryError::Api {
            what: "Nodes",
            server: server.clone(),
            message: short(&e),
        })?
        .items;
    let mut notes = Vec::new();
    let slices: Vec<ResourceSlice> = match Api::<ResourceSlice>::all(client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list.items,
        Err(e) => {
            notes.push(format!(
                "DRA ResourceSlices (resource.k8s.io/v1) not read: {}",
                short(&e)
            ));
            Vec::new()
        }
    };
    let inventory = Inventory::from_nodes_and_slices(&nodes, &slices);
    let allocation = match read_kueue(&client).await {
        Ok(kueue) => allocation(&inventory, &kueue),
        Err(reason) => Allocation {
            unavailable: Some(format!("source unavailable: {reason}")),
            ..Default::default()
        },
    };
    let mut report = InventoryReport::new(server, inventory, allocation);
    if !slices.is_empty() {
        let rules: Api<DynamicObject> =
            Api::all_with(client.clone(), &crate::k8s::resources::device_taint_rule());
        // Every kaccel installation's rules (each labels the node it takes a
        // device out on): the inventory is the cluster's, not one instance's.
        let mine = ListParams::default().labels(crate::plan::device_quarantine::NODE_LABEL);
        match rules.list(&mine).await {
            Ok(list) => {
                report.taint_rules = list
                    .items
                    .iter()
                    .filter_map(|r| {
                        let rule: k8s_openapi::api::resource::v1alpha3::DeviceTaintRule =
                            serde_json::from_value(serde_json::to_value(r).ok()?).ok()?;
                        super::HeldTaintRule::of(&rule)
                    })
                    .collect();
            }
            Err(e) => notes.push(format!(
                "DeviceTaintRules (resource.k8s.io/v1alpha3) not read: {}",
                short(&e)
            )),
        }
        // Who holds each DRA device: the pods its ResourceClaim is reserved for.
        match Api::<ResourceClaim>::all(client.clone())
            .list(&ListParams::default())
            .await
        {
            Ok(list) => {
                report.claimed = crate::inventory::holders::claimed_devices(&list.items)
                    .into_values()
                    .collect();
            }
            Err(e) => notes.push(format!(
                "ResourceClaims (resource.k8s.io/v1) not read: {}",
                short(&e)
            )),
        }
    }
    report.notes = notes;
    Ok(report)
}

/// ResourceFlavors, ClusterQueues and Workloads (all namespaces), as JSON.
async fn read_kueue(client: &Client) -> Result<KueueObjects, String> {
    let mut lists = Vec::new();
    for (kind, plural) in [
        ("ResourceFlavor", "ResourceFlavors"),
        ("ClusterQueue", "ClusterQueues"),
    ] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
        let list = api.list(&ListParams::default()).await.map_err(|e| {
            format!(
                "cannot list Kueue {plural} ({}/{}): {}",
                crate::kueue::GROUP,
                crate::kueue::VERSION,
                short(&e)
            )
        })?;
        lists.push(
            list.items
                .iter()
                .map(|o| serde_json::to_value(o).expect("objects serialise"))
                .collect::<Vec<Value>>(),
        );
    }
    // Typed: only the fields allocation reads are kept of each Workload.
    let workloads = Api::<Workload>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map_err(|e| {
            format!(
                "cannot list Kueue Workloads ({}/{}): {}",
                crate::kueue::GROUP,
                crate::kueue::VERSION,
                short(&e)
            )
        })?
        .items;
    let cluster_queues = lists.pop().unwrap_or_default();
    let flavors = lists.pop().unwrap_or_default();
    Ok(KueueObjects {
        flavors,
        cluster_queues,
        workloads,
    })
}

fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}
