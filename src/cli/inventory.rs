//! `kaccel inventory`: every accelerator group in the fleet as one table (or JSON):
//! vendor, model, node, sharing mode, partition profile, resource, capacity,
//! allocatable, health, plus what admitted Kueue Workloads hold.
//!
//! Allocation is reported per ResourceFlavor, not per node: an admitted Workload
//! names a flavor and an amount (`status.admission.podSetAssignments`), and which
//! node its pods land on is only known once they are bound. Each flavor row shows
//! the device variants its `nodeLabels` select on the inventory, so "allocated" can
//! be read against the capacity of exactly those devices.
//!
//! `inventory/read.rs` reads the cluster, Node files or a running controller's
//! device health; `inventory/allocation.rs` computes what admitted Workloads hold
//! per flavor; `inventory/render.rs` writes the table or the JSON document;
//! `inventory/device.rs` is `--device`, one card's health changes and holders.

mod allocation;
pub mod device;
mod gather;
mod render;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::ValueEnum;
use serde::Serialize;

use super::load;
use crate::api::HealthCounts;
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;

pub use allocation::{Allocation, FlavorAllocation, KueueObjects, allocation};
pub use gather::{read_cluster, read_files};
pub use render::{render, write};

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
    /// One device (its UUID) instead of the fleet: its health and last status
    /// changes (with --health-from) and the admissions that held it (with --store).
    #[arg(long)]
    pub device: Option<String>,
    /// The credit ledger (sqlite:PATH or postgres://...), read for --device's holders.
    #[arg(long, env = "KACCEL_LEDGER_STORE")]
    pub store: Option<String>,
    /// With --device: holders of the last this many days.
    #[arg(long, default_value_t = 7)]
    pub days: u32,
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
    #[error("cannot read the ledger: {0}")]
    Ledger(String),
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
    /// The DeviceTaintRules kaccel holds on single DRA devices.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub taint_rules: Vec<HeldTaintRule>,
    /// The DRA devices pods hold through ResourceClaims (cluster mode).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub claimed: Vec<crate::inventory::holders::ClaimedDevice>,
}

/// A DeviceTaintRule kaccel wrote to take one DRA device out.
pub use crate::plan::device_quarantine::HeldRule as HeldTaintRule;

/// What `kaccel run` serves at `/devices`.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceHealth {
    pub observed_at: i64,
    pub sources: Vec<crate::health::policy::SourceState>,
    pub devices: Vec<crate::health::policy::DeviceView>,
    /// The DeviceTaintRules the controller holds on single DRA devices.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub taint_rules: Vec<HeldTaintRule>,
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
            taint_rules: Vec::new(),
            claimed: Vec::new(),
        }
    }
}
