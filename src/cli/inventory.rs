//! `kaccel inventory`: every accelerator group in the fleet as one table (or JSON):
//! vendor, model, node, sharing mode, partition profile, resource, capacity,
//! allocatable, health, plus what admitted Kueue Workloads hold.
//!
//! Allocation is reported per ResourceFlavor, not per node: an admitted Workload
//! names a flavor and an amount (`status.admission.podSetAssignments`), and which
//! node its pods land on is only known once they are bound. Each flavor row shows
//! the device variants its `nodeLabels` select on the inventory, so "allocated" can
//! be read against the capacity of exactly those devices.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::Write;
use std::path::PathBuf;

use crate::k8s::resources::kueue;
use clap::ValueEnum;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::Client;
use kube::api::{Api, DynamicObject, ListParams};
use serde::Serialize;
use serde_json::Value;

use super::load;
use crate::api::HealthCounts;
use crate::health::HealthSnapshot;
use crate::inventory::{DeviceVariant, Inventory, NodeInventory};
use crate::k8s::quantity::parse_count;
use crate::kueue::workload::Workload;

#[derive(clap::Args, Debug)]
pub struct InventoryArgs {
    /// Read Nodes (and DRA ResourceSlices) from these YAML files or folders (e.g.
    /// `kubectl get nodes,resourceslices -o yaml` output) instead of the cluster:
    /// works offline, without allocation.
    #[arg(long, num_args = 1..)]
    pub nodes: Vec<PathBuf>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = InventoryOutput::Table)]
    pub output: InventoryOutput,
    /// Per-device health from a running `kaccel run` (its HTTP address, e.g.
    /// http://127.0.0.1:8080): every device with status, reasons and readings, and
    /// every health source with whether it is usable.
    #[arg(long)]
    pub health_from: Option<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum InventoryOutput {
    /// One row per device group per node, then allocation per flavor.
    Table,
    /// The inventory model with health and allocation, as one JSON document.
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Load(Vec<load::LoadError>),
    #[error("{0}: no Node objects found")]
    NoNodes(String),
    #[error(
        "no cluster to read: {0}\nSet KUBECONFIG (or ~/.kube/config) to a cluster, or read Nodes from a file: kaccel inventory --nodes nodes.yaml"
    )]
    NoCluster(String),
    #[error(
        "cannot read per-device health: {0}\nIs `kaccel run` serving HTTP there (its --http-address)?"
    )]
    Health(String),
    #[error("cannot list {what} from {server}: {message}")]
    Api {
        what: &'static str,
        server: String,
        message: String,
    },
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// What `kaccel inventory` reports.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InventoryReport {
    /// Where the Nodes came from: the API server's URL, or the files read.
    pub source: String,
    /// The inventory model: `nodes`, keyed by node name.
    #[serde(flatten)]
    pub inventory: Inventory,
    /// Health per node and resource name. No health source is read yet: counts
    /// follow the Node alone (see [`HealthSnapshot::counts_for`]).
    pub health: BTreeMap<String, BTreeMap<String, HealthCounts>>,
    pub allocation: Allocation,
    /// Sources that were skipped, and why (e.g. ResourceSlices not served).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Per-device health from the controller (`--health-from`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub device_health: Option<DeviceHealth>,
}

/// What `kaccel run` serves at `/devices`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceHealth {
    pub observed_at: i64,
    pub sources: Vec<crate::health::policy::SourceState>,
    pub devices: Vec<crate::health::policy::DeviceView>,
}

impl InventoryReport {
    /// Take per-device health from a running controller: group counts then follow
    /// the controller's sources (the same snapshot its planner uses).
    pub async fn with_health_from(mut self, address: &str) -> Result<Self, InventoryError> {
        let url = format!("{}/devices", address.trim_end_matches('/'));
        let (status, body) = crate::health::scrape::Scraper::default()
            .get(&url, std::time::Duration::from_secs(5))
            .await
            .map_err(|e| InventoryError::Health(format!("{url}: {e}")))?;
        if status != 200 {
            return Err(InventoryError::Health(format!("{url}: HTTP {status}")));
        }
        let health: DeviceHealth = serde_json::from_str(&body).map_err(|e| {
            InventoryError::Health(format!("{url}: not a kaccel /devices answer: {e}"))
        })?;
        let mut tracker = crate::health::policy::Tracker::default();
        for s in &health.sources {
            tracker.sources.insert(s.name.clone(), s.clone());
        }
        for d in &health.devices {
            let d = &d.device;
            tracker
                .devices
                .insert((d.node.clone(), d.device.clone()), d.clone());
        }
        let snapshot = tracker.snapshot(&self.inventory, health.observed_at);
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

impl InventoryReport {
    pub fn new(source: String, inventory: Inventory, allocation: Allocation) -> Self {
        let snapshot = HealthSnapshot::default();
        let mut health: BTreeMap<String, BTreeMap<String, HealthCounts>> = BTreeMap::new();
        for (node, group) in inventory.groups() {
            health.entry(node.name.clone()).or_default().insert(
                group.variant.resource_name.clone(),
                snapshot.counts_for(node, group),
            );
        }
        InventoryReport {
            source,
            inventory,
            health,
            allocation,
            notes: Vec::new(),
            device_health: None,
        }
    }
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

/// The Kueue objects allocation is computed from: flavors and queues as JSON,
/// Workloads typed.
#[derive(Clone, Debug, Default)]
pub struct KueueObjects {
    pub flavors: Vec<Value>,
    pub cluster_queues: Vec<Value>,
    pub workloads: Vec<Workload>,
}

fn short(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        other => other.to_string(),
    }
}

/// Whether a resource name is a device (an extended resource such as
/// `nvidia.com/gpu`), not cpu, memory, pods, ephemeral storage or hugepages.
fn is_device_resource(name: &str) -> bool {
    name.contains('/') && !name.starts_with("kubernetes.io/") && !name.starts_with("hugepages-")
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
    for flavor in flavors {
        let Some(name) = flavor.pointer("/metadata/name").and_then(Value::as_str) else {
            continue;
        };
        selectors.insert(name.to_string(), labels_of(flavor));
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
            for (node, group) in inventory.groups() {
                if group.variant.resource_name == resource && selects(selector, node) {
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
                let Some(resource) = quota["name"].as_str() else {
                    continue;
                };
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
        let mut counted: BTreeSet<(String, String)> = BTreeSet::new();
        let assignments = wl
            .status
            .admission
            .iter()
            .flat_map(|a| &a.pod_set_assignments);
        for psa in assignments {
            let usage = psa.resource_usage.iter().flatten();
            for (resource, quantity) in usage {
                if !is_device_resource(resource) {
                    continue;
                }
                let Some(flavor) = psa.flavors.as_ref().and_then(|f| f.get(resource)) else {
                    warnings.push(format!(
                        "Workload {name}: {resource} has usage but no flavor"
                    ));
                    continue;
                };
                let amount = match quantity.as_str().map(parse_count) {
                    Some(Ok(n)) => u64::from(n),
                    Some(Err(e)) => {
                        warnings.push(format!("Workload {name}: {resource}: {e}"));
                        continue;
                    }
                    None => {
                        warnings.push(format!(
                            "Workload {name}: {resource}: quantity is not a string"
                        ));
                        continue;
                    }
                };
                let key = (flavor.to_string(), resource.clone());
                let row = rows
                    .entry(key.clone())
                    .or_insert_with(|| new_row(flavor, resource));
                row.allocated += amount;
                if counted.insert(key) {
                    row.workloads += 1;
                }
            }
        }
    }
    Allocation {
        unavailable: None,
        flavors: rows.into_values().collect(),
        warnings,
    }
}

fn selects(selector: &BTreeMap<String, String>, node: &NodeInventory) -> bool {
    selector
        .iter()
        .all(|(k, v)| node.labels.get(k).is_some_and(|l| l == v))
}

pub fn write(
    report: &InventoryReport,
    output: InventoryOutput,
    out: &mut impl Write,
) -> Result<(), InventoryError> {
    match output {
        InventoryOutput::Table => write!(out, "{}", render(report))?,
        InventoryOutput::Json => writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(report).expect("the inventory serialises")
        )?,
    }
    Ok(())
}

fn node_state(node: &NodeInventory) -> &'static str {
    match (node.ready, node.unschedulable) {
        (Some(true), false) => "Ready",
        (Some(true), true) => "Ready,Cordoned",
        (Some(false), false) => "NotReady",
        (Some(false), true) => "NotReady,Cordoned",
        (None, false) => "Unknown",
        (None, true) => "Unknown,Cordoned",
    }
}

fn variant_text(v: &DeviceVariant) -> String {
    match &v.partition_profile {
        Some(p) => format!("{} {} {} {p}", v.vendor.as_str(), v.model, v.sharing),
        None => format!("{} {} {}", v.vendor.as_str(), v.model, v.sharing),
    }
}

/// The human table.
pub fn render(report: &InventoryReport) -> String {
    let inv = &report.inventory;
    let mut s = String::new();
    let with_devices = inv.nodes.values().filter(|n| n.has_accelerators()).count();
    let groups = inv.groups().count();
    let devices: u64 = inv.groups().map(|(_, g)| u64::from(g.capacity)).sum();
    let _ = writeln!(
        s,
        "kaccel inventory of {}: {} node(s), {} with accelerators; {} device(s) in {} group(s)",
        report.source,
        inv.nodes.len(),
        with_devices,
        devices,
        groups
    );
    let _ = writeln!(
        s,
        "Health: no health source is read yet; counts follow the Node (withdrawn by the device plugin = DEGRADED, Node not Ready = UNKNOWN)."
    );
    let _ = writeln!(s);
    let mut rows = vec![
        [
            "NODE",
            "STATE",
            "VENDOR",
            "MODEL",
            "SHARING",
            "PROFILE",
            "RESOURCE",
            "CAPACITY",
            "ALLOCATABLE",
            "HEALTHY",
            "WARNING",
            "DEGRADED",
            "FAILED",
            "UNKNOWN",
        ]
        .map(String::from)
        .to_vec(),
    ];
    for (node, group) in inv.groups() {
        let v = &group.variant;
        let h = report
            .health
            .get(&node.name)
            .and_then(|m| m.get(&v.resource_name))
            .copied()
            .unwrap_or_default();
        rows.push(vec![
            node.name.clone(),
            node_state(node).into(),
            v.vendor.as_str().into(),
            v.model.clone(),
            v.sharing.to_string(),
            v.partition_profile.clone().unwrap_or_else(|| "-".into()),
            v.resource_name.clone(),
            group.capacity.to_string(),
            group.allocatable.to_string(),
            h.healthy.to_string(),
            h.warning.to_string(),
            h.degraded.to_string(),
            h.failed.to_string(),
            h.unknown.to_string(),
        ]);
    }
    let unclassified: Vec<_> = inv.unclassified().collect();
    if rows.len() == 1 && unclassified.is_empty() {
        let _ = writeln!(s, "No accelerators found on any Node.");
    } else if rows.len() == 1 {
        let _ = writeln!(s, "No accelerator kaccel can classify on any Node.");
    } else {
        table(&mut s, &rows, 7);
    }
    if !unclassified.is_empty() {
        // The same entries `kaccel plan -o summary` lists and the
        // kaccel_inventory_unclassified_devices metric counts.
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "Unclassified: {} accelerator device(s) kaccel cannot classify; offered to no class, not CPU-only capacity:",
            inv.unclassified_device_count()
        );
        let mut rows = vec![
            [
                "NODE",
                "SOURCE (resource, DRA driver or label)",
                "COUNT",
                "REASON",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for (node, u) in unclassified {
            rows.push(vec![
                node.name.clone(),
                u.source.clone(),
                u.count.to_string(),
                u.reason.clone(),
            ]);
        }
        unclassified_table(&mut s, &rows);
    }

    let _ = writeln!(s);
    let alloc = &report.allocation;
    let _ = writeln!(
        s,
        "Allocated by admitted Kueue Workloads, per ResourceFlavor (Kueue assigns a flavor, not a node; nodes are known only once pods are bound):"
    );
    if let Some(why) = &alloc.unavailable {
        let _ = writeln!(s, "  allocation {why}");
    } else if alloc.flavors.is_empty() {
        let _ = writeln!(
            s,
            "  no ResourceFlavor selects these devices, and no Workload holds any."
        );
    } else {
        let mut rows = vec![
            [
                "FLAVOR",
                "RESOURCE",
                "DEVICES (vendor model sharing profile)",
                "NODES",
                "CAPACITY",
                "ALLOCATABLE",
                "ALLOCATED",
                "WORKLOADS",
            ]
            .map(String::from)
            .to_vec(),
        ];
        for f in &alloc.flavors {
            let variants = if f.variants.is_empty() {
                "(selects no such devices)".to_string()
            } else {
                f.variants
                    .iter()
                    .map(variant_text)
                    .collect::<Vec<_>>()
                    .join("; ")
            };
            rows.push(vec![
                f.flavor.clone(),
                f.resource_name.clone(),
                variants,
                f.nodes.to_string(),
                f.capacity.to_string(),
                f.allocatable.to_string(),
                f.allocated.to_string(),
                f.workloads.to_string(),
            ]);
        }
        table(&mut s, &rows, 3);
    }

    let warnings: Vec<String> = inv
        .nodes
        .values()
        .flat_map(|n| {
            n.warnings
                .iter()
                // Listed under "Unclassified" above.
                .filter(|w| !w.starts_with("unclassified accelerator "))
                .map(move |w| format!("Node {}: {w}", n.name))
        })
        .chain(alloc.warnings.iter().cloned())
        .chain(report.notes.iter().cloned())
        .collect();
    if let Some(h) = &report.device_health {
        // A silent source's devices read e.g. "Failed (last seen T, source stale
        // since T')": the column is as wide as its longest entry.
        let statuses: Vec<String> = h
            .devices
            .iter()
            .map(|v| {
                if v.status_text.is_empty() {
                    format!("{:?}", v.device.status)
                } else {
                    v.status_text.clone()
                }
            })
            .collect();
        let width = statuses
            .iter()
            .map(|t| t.chars().count())
            .max()
            .unwrap_or(0)
            .max(9);
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<20} {:<28} {:<7} {:<width$} {:>6} {:<22} REASONS",
            "NODE", "DEVICE", "VENDOR", "STATUS", "TEMP", "SOURCE"
        );
        for (view, status) in h.devices.iter().zip(&statuses) {
            let d = &view.device;
            let _ = writeln!(
                s,
                "{:<20} {:<28} {:<7} {:<width$} {:>6} {:<22} {}",
                d.node,
                d.reading.uuid.as_deref().unwrap_or(&d.device),
                d.vendor.map(|v| v.as_str()).unwrap_or("-"),
                status,
                d.reading
                    .temperature_c
                    .map(|t| format!("{t:.0}C"))
                    .unwrap_or_else(|| "-".into()),
                d.source,
                d.reasons.join("; ")
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "{:<32} {:<7} PROBLEM", "HEALTH SOURCE", "USABLE");
        for src in &h.sources {
            let _ = writeln!(
                s,
                "{:<32} {:<7} {}",
                src.name,
                src.usable(h.observed_at),
                src.problem(h.observed_at).unwrap_or_default()
            );
        }
    }
    if !warnings.is_empty() {
        let _ = writeln!(s);
        let _ = writeln!(s, "Notes:");
        for w in warnings {
            let _ = writeln!(s, "  {w}");
        }
    }
    s
}

/// NODE, SOURCE and COUNT aligned; the (long) reason runs to the end of the line.
fn unclassified_table(s: &mut String, rows: &[Vec<String>]) {
    let width = |c: usize| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0);
    let (w0, w1, w2) = (width(0), width(1), width(2));
    for row in rows {
        let _ = writeln!(
            s,
            "{:<w0$}  {:<w1$}  {:>w2$}  {}",
            row[0], row[1], row[2], row[3]
        );
    }
}

/// Aligned columns; columns from `first_numeric` on are right-aligned.
fn table(s: &mut String, rows: &[Vec<String>], first_numeric: usize) {
    let columns = rows[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            if c >= first_numeric {
                let _ = write!(line, "{cell:>w$}", w = widths[c]);
            } else {
                let _ = write!(line, "{cell:<w$}", w = widths[c]);
            }
        }
        let _ = writeln!(s, "{}", line.trim_end());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const FLEET: &str = include_str!("../../examples/nodes.yaml");

    fn fleet() -> Inventory {
        let nodes: Vec<Node> = serde_yaml::Deserializer::from_str(FLEET)
            .filter_map(|d| {
                let v: serde_yaml::Value = serde::Deserialize::deserialize(d).ok()?;
                (v.get("kind")?.as_str()? == "Node")
                    .then(|| serde_yaml::from_value(v).expect("example Node parses"))
            })
            .collect();
        Inventory::from_nodes(&nodes)
    }

    fn h100_flavor() -> Value {
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
            "metadata": {"name": "h100"},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
        })
    }

    fn workload(name: &str, flavor: &str, gpus: &str, conditions: &[(&str, &str)]) -> Workload {
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": name, "namespace": "team"},
            "status": {
                "conditions": conditions.iter().map(|(t, s)| json!({"type": t, "status": s})).collect::<Vec<_>>(),
                "admission": {"clusterQueue": "cq", "podSetAssignments": [{
                    "name": "main",
                    "flavors": {"nvidia.com/gpu": flavor, "cpu": "cpu-flavor"},
                    "resourceUsage": {"nvidia.com/gpu": gpus, "cpu": "16"}
                }]}
            }
        }))
        .expect("a Workload")
    }

    #[test]
    fn table_lists_every_group_with_health_and_counts() {
        let inv = fleet();
        let expected_groups = inv.groups().count();
        let report = InventoryReport::new("examples/nodes.yaml".into(), inv, Allocation::default());
        let text = render(&report);
        let header = text
            .lines()
            .find(|l| l.starts_with("NODE"))
            .expect("header row");
        for column in [
            "VENDOR",
            "MODEL",
            "SHARING",
            "PROFILE",
            "RESOURCE",
            "CAPACITY",
            "ALLOCATABLE",
            "HEALTHY",
            "DEGRADED",
            "UNKNOWN",
        ] {
            assert!(header.contains(column), "{column} missing: {header}");
        }
        let rows: Vec<&str> = text
            .lines()
            .skip_while(|l| !l.starts_with("NODE"))
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        assert_eq!(rows.len(), expected_groups, "{text}");
        // gpu-h100-04: one GPU withdrawn by the device plugin -> 8 / 7, 7 healthy, 1 degraded.
        let h100_04: Vec<&str> = rows
            .iter()
            .find(|r| r.starts_with("gpu-h100-04 "))
            .expect("gpu-h100-04 row")
            .split_whitespace()
            .collect();
        assert_eq!(
            h100_04,
            [
                "gpu-h100-04",
                "Ready",
                "nvidia",
                "NVIDIA-H100-80GB-HBM3",
                "Whole",
                "-",
                "nvidia.com/gpu",
                "8",
                "7",
                "7",
                "0",
                "1",
                "0",
                "0"
            ]
        );
        // Columns line up: every row is as wide as the header or narrower only by
        // trailing cells, and the numeric columns end at the same offset.
        let end = header.len();
        assert!(rows.iter().all(|r| r.len() == end), "ragged table:\n{text}");
    }

    #[test]
    fn partitions_show_their_profile() {
        let report = InventoryReport::new("f".into(), fleet(), Allocation::default());
        let text = render(&report);
        let partition_rows: Vec<&str> =
            text.lines().filter(|l| l.contains(" Partition ")).collect();
        assert!(!partition_rows.is_empty(), "{text}");
        for row in partition_rows {
            let cells: Vec<&str> = row.split_whitespace().collect();
            assert_ne!(cells[5], "-", "a partition row without a profile: {row}");
        }
    }

    #[test]
    fn allocation_sums_admitted_unfinished_workloads_per_flavor() {
        let inv = fleet();
        let workloads = [
            workload(
                "a",
                "h100",
                "8",
                &[("QuotaReserved", "True"), ("Admitted", "True")],
            ),
            workload("b", "h100", "4", &[("Admitted", "True")]),
            // Pending, finished, and quota-only workloads hold nothing.
            workload("c", "h100", "8", &[("QuotaReserved", "False")]),
            workload(
                "d",
                "h100",
                "8",
                &[("Admitted", "True"), ("Finished", "True")],
            ),
            workload(
                "e",
                "h100",
                "8",
                &[("QuotaReserved", "True"), ("Admitted", "False")],
            ),
            // A flavor that is gone still shows what it holds.
            workload("f", "gone", "2", &[("Admitted", "True")]),
        ];
        let a = allocation(
            &inv,
            &KueueObjects {
                flavors: vec![h100_flavor()],
                cluster_queues: vec![],
                workloads: workloads.to_vec(),
            },
        );
        assert!(a.unavailable.is_none());
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        let h100 = a
            .flavors
            .iter()
            .find(|f| f.flavor == "h100" && f.resource_name == "nvidia.com/gpu")
            .expect("h100 row");
        assert_eq!((h100.allocated, h100.workloads), (12, 2));
        assert_eq!(h100.variants.len(), 1);
        assert_eq!(h100.variants[0].model, "NVIDIA-H100-80GB-HBM3");
        let h100_groups: Vec<_> = inv
            .groups()
            .filter(|(_, g)| g.variant == h100.variants[0])
            .collect();
        assert_eq!(h100.nodes as usize, h100_groups.len());
        assert_eq!(
            h100.capacity,
            h100_groups
                .iter()
                .map(|(_, g)| u64::from(g.capacity))
                .sum::<u64>()
        );
        let gone = a
            .flavors
            .iter()
            .find(|f| f.flavor == "gone")
            .expect("gone row");
        assert_eq!((gone.allocated, gone.capacity), (2, 0));
        assert!(gone.variants.is_empty());
        // cpu is not a device.
        assert!(a.flavors.iter().all(|f| f.resource_name != "cpu"));

        let report = InventoryReport::new("cluster".into(), inv, a);
        let text = render(&report);
        let row = text
            .lines()
            .find(|l| l.starts_with("h100 "))
            .expect("h100 allocation row");
        assert!(row.contains("nvidia NVIDIA-H100-80GB-HBM3 Whole"), "{row}");
        let last_two: Vec<&str> = row.split_whitespace().rev().take(2).collect();
        assert_eq!(last_two, ["2", "12"], "ALLOCATED 12, WORKLOADS 2: {row}");
    }

    #[test]
    fn idle_rows_come_from_cluster_queue_quotas_only() {
        let mig_whole = json!({
            "metadata": {"name": "a100"},
            "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}}
        });
        let cq = json!({
            "metadata": {"name": "cq"},
            "spec": {"resourceGroups": [{
                "coveredResources": ["cpu", "nvidia.com/gpu", "amd.com/gpu"],
                "flavors": [{"name": "a100", "resources": [
                    {"name": "cpu", "nominalQuota": "8"},
                    {"name": "nvidia.com/gpu", "nominalQuota": "4"},
                    {"name": "amd.com/gpu", "nominalQuota": "0"}
                ]}]
            }]}
        });
        let a = allocation(
            &fleet(),
            &KueueObjects {
                flavors: vec![mig_whole, h100_flavor()],
                cluster_queues: vec![cq],
                workloads: vec![],
            },
        );
        // The MIG partitions on the same nodes are not this flavor's, nor is the
        // zero amd.com/gpu quota Kueue makes the group list; h100 has no quota
        // anywhere and no workload, so no row.
        let rows: Vec<(&str, &str, u64, u64)> = a
            .flavors
            .iter()
            .map(|f| {
                (
                    f.flavor.as_str(),
                    f.resource_name.as_str(),
                    f.capacity,
                    f.allocated,
                )
            })
            .collect();
        assert_eq!(rows, [("a100", "nvidia.com/gpu", 4, 0)]);
    }

    #[test]
    fn bad_quantities_are_warnings_not_panics() {
        let a = allocation(
            &fleet(),
            &KueueObjects {
                flavors: vec![h100_flavor()],
                cluster_queues: vec![],
                workloads: vec![workload("x", "h100", "1.5", &[("Admitted", "True")])],
            },
        );
        assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
        assert!(a.warnings[0].contains("team/x"), "{:?}", a.warnings);
    }

    #[test]
    fn unavailable_allocation_says_so() {
        let report = InventoryReport::new(
            "cluster".into(),
            fleet(),
            Allocation {
                unavailable: Some("source unavailable: cannot list Kueue Workloads".into()),
                ..Default::default()
            },
        );
        let text = render(&report);
        assert!(
            text.contains("allocation source unavailable: cannot list Kueue Workloads"),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["allocation"]["flavors"], json!([]));
        assert!(json["allocation"]["unavailable"].is_string());
    }

    #[test]
    fn json_carries_the_model_health_and_allocation() {
        let report = InventoryReport::new("f".into(), fleet(), Allocation::default());
        let json = serde_json::to_value(&report).unwrap();
        let node = &json["nodes"]["gpu-h100-04"];
        assert_eq!(
            node["groups"][0]["variant"]["resourceName"],
            "nvidia.com/gpu"
        );
        assert_eq!(node["groups"][0]["allocatable"], 7);
        assert_eq!(
            json["health"]["gpu-h100-04"]["nvidia.com/gpu"]["degraded"],
            1
        );
        assert!(json["allocation"].is_object());
    }

    /// The inventory lists what `kaccel plan -o summary` lists as unclassified: node,
    /// source, count and reason, beside the classified groups.
    #[test]
    fn unclassified_devices_are_listed() {
        let nodes: Vec<Node> = [
            // No adapter reads qualcomm.com/qaic.
            "metadata: {name: qaic-01}\nstatus: {capacity: {cpu: \"64\", qualcomm.com/qaic: \"8\"}, allocatable: {cpu: \"64\", qualcomm.com/qaic: \"8\"}}",
            // GPU feature discovery's presence label, but no device plugin.
            "metadata: {name: nv-no-plugin, labels: {nvidia.com/gpu.present: \"true\"}}\nstatus: {capacity: {cpu: \"64\"}, allocatable: {cpu: \"64\"}}",
        ]
        .iter()
        .map(|y| serde_yaml::from_str(y).unwrap())
        .collect();
        let inv = Inventory::from_nodes(&nodes);
        let report = InventoryReport::new("f".into(), inv, Allocation::default());
        let text = render(&report);
        assert!(
            text.contains("No accelerator kaccel can classify on any Node."),
            "{text}"
        );
        assert!(
            text.contains("Unclassified: 9 accelerator device(s)"),
            "{text}"
        );
        let row = |node: &str| -> Vec<&str> {
            text.lines()
                .find(|l| l.starts_with(node))
                .unwrap_or_else(|| panic!("no row for {node}:\n{text}"))
                .split_whitespace()
                .collect()
        };
        assert_eq!(row("qaic-01 ")[1..3], ["qualcomm.com/qaic", "8"]);
        assert!(row("qaic-01 ").contains(&"adapter"), "{text}");
        assert_eq!(
            row("nv-no-plugin ")[1..3],
            ["nvidia.com/gpu.present=true", "0"]
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["nodes"]["qaic-01"]["unclassified"][0]["source"],
            "qualcomm.com/qaic"
        );
    }

    #[test]
    fn empty_fleet_says_so() {
        let report = InventoryReport::new("f".into(), Inventory::default(), Allocation::default());
        assert!(render(&report).contains("No accelerators found on any Node."));
    }
}
