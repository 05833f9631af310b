//! The few Kueue `v1beta2` types kaccel writes and reads, hand-written and minimal.
//! Field names follow Kueue v0.17's `apis/kueue/v1beta2`. Fields kaccel does not
//! set are omitted; server-side apply leaves them to their other owners.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

pub mod compat;
pub mod config;
pub mod workload;

pub use crate::k8s::resources::{KUEUE_GROUP as GROUP, KUEUE_VERSION as VERSION};

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "ResourceFlavor",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ResourceFlavorSpec {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tolerations: Vec<Toleration>,
    /// The Topology Kueue's Topology Aware Scheduling places this flavor's pods
    /// by. Kueue makes it immutable once set, and with it `nodeLabels` and
    /// `tolerations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology_name: Option<String>,
}

/// A Kueue Topology: the node labels that form its levels, widest first
/// (`kubernetes.io/hostname` only last). Immutable once created.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Topology",
    plural = "topologies",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpec {
    pub levels: Vec<TopologyLevelSpec>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopologyLevelSpec {
    pub node_label: String,
}

impl Topology {
    /// Its levels' node labels, widest first.
    pub fn level_labels(&self) -> Vec<&str> {
        self.spec
            .levels
            .iter()
            .map(|l| l.node_label.as_str())
            .collect()
    }
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "Cohort",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct CohortSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_name: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_groups: Vec<ResourceGroup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_sharing: Option<FairSharing>,
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "ClusterQueue",
    schema = "disabled",
    status = "ClusterQueueStatus"
)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort_name: Option<String>,
    /// kaccel always sets a selector: the budget's namespaces, so no other
    /// namespace can reach the team's quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_groups: Vec<ResourceGroup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queueing_strategy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavor_fungibility: Option<FlavorFungibility>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<ClusterQueuePreemption>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_policy: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_sharing: Option<FairSharing>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission_checks_strategy: Option<AdmissionChecksStrategy>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceGroup {
    pub covered_resources: Vec<String>,
    pub flavors: Vec<FlavorQuotas>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorQuotas {
    pub name: String,
    pub resources: Vec<ResourceQuota>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceQuota {
    pub name: String,
    pub nominal_quota: Quantity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub borrowing_limit: Option<Quantity>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lending_limit: Option<Quantity>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FairSharing {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<Quantity>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorFungibility {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_can_borrow: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_can_preempt: Option<String>,
}

/// When Kueue may preempt admitted Workloads to admit one of this queue's.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueuePreemption {
    /// `Never` (Kueue's default), `LowerPriority` or `Any`: whether a Workload
    /// that fits the queue's nominal quota may take back quota lent to the cohort.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_within_cohort: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionChecksStrategy {
    pub admission_checks: Vec<AdmissionCheckStrategyRule>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckStrategyRule {
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterQueueStatus {
    #[serde(default)]
    pub flavors_reservation: Vec<FlavorUsage>,
    #[serde(default)]
    pub flavors_usage: Vec<FlavorUsage>,
    #[serde(default)]
    pub pending_workloads: i32,
    #[serde(default)]
    pub admitted_workloads: i32,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FlavorUsage {
    pub name: String,
    #[serde(default)]
    pub resources: Vec<ResourceUsage>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ResourceUsage {
    pub name: String,
    #[serde(default)]
    pub total: Option<Quantity>,
    #[serde(default)]
    pub borrowed: Option<Quantity>,
}

/// What the ledger's drift check reads of a ClusterQueue: its name, its labels
/// (the budget it belongs to) and `status.flavorsReservation`. Read at every
/// budget pass from the JSON text of each managed ClusterQueue, so the parser
/// skips the spec (every flavor's quotas) instead of building it as a tree to
/// drop: 800 queues as `serde_json::Value` trees were 26 MB a pass.
#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
pub struct ClusterQueueReservations {
    pub metadata: NameAndLabels,
    /// Of the status, only `flavorsReservation` is in the managed cache's text.
    #[serde(default)]
    pub status: Option<ClusterQueueStatus>,
}

#[derive(Deserialize, Clone, Debug, Default, PartialEq)]
pub struct NameAndLabels {
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

impl ClusterQueueReservations {
    pub fn label(&self, key: &str) -> Option<&str> {
        self.metadata.labels.as_ref()?.get(key).map(String::as_str)
    }

    /// What Kueue holds, flavor by flavor (empty before its first status write).
    pub fn flavors_reservation(&self) -> &[FlavorUsage] {
        self.status.as_ref().map_or(&[], |s| &s.flavors_reservation)
    }
}

#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "kueue.x-k8s.io",
    version = "v1beta2",
    kind = "LocalQueue",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LocalQueueSpec {
    pub cluster_queue: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_policy: Option<String>,
}
