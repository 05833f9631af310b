//! Who holds a device: the pod an exporter attributes it to, and the Kueue Workload,
//! ClusterQueue and team behind that pod.
//!
//! The pod comes from the vendor exporter (`DeviceReading::pod`). What Kueue says
//! about the pod is in its metadata, written by Kueue v0.17 at admission (constants in
//! kubernetes-sigs/kueue `pkg/constants/constants.go`, `apis/kueue/v1beta2/
//! topology_types.go`, `pkg/controller/jobs/pod/constants/constants.go`):
//! - annotation `kueue.x-k8s.io/workload`: the Workload's name (every integration,
//!   with the TopologyAwareScheduling gate, on by default since Kueue 0.14);
//! - label or annotation `kueue.x-k8s.io/pod-group-name` (pod groups and
//!   LeaderWorkerSet) and label `kueue.x-k8s.io/prebuilt-workload-name`: also the
//!   Workload's name;
//! - label `kueue.x-k8s.io/cluster-queue-name` (the AssignQueueLabelsForPods gate, on
//!   by default since 0.17; absent when the name is not a DNS label).
//!
//! On DRA nodes the pod comes from the ResourceClaim its devices were allocated to
//! (`status.allocation.devices.results`: driver, pool, device) and the pods the claim
//! is reserved for (`status.reservedFor`, written by kube-scheduler when it binds a
//! pod that uses the claim); an allocated claim reserved for no pod holds its devices
//! for nobody running, so it names no holder.
//!
//! The team is the `kaccel.io/team` label on the ClusterQueue kaccel made for it.
//! Whatever is not known stays None: a holder is never guessed.

use std::collections::BTreeMap;

use k8s_openapi::api::resource::v1::ResourceClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::PublishedIds;

/// Kueue's keys on an admitted pod.
pub const WORKLOAD_ANNOTATION: &str = "kueue.x-k8s.io/workload";
pub const POD_GROUP_NAME: &str = "kueue.x-k8s.io/pod-group-name";
pub const PREBUILT_WORKLOAD_LABEL: &str = "kueue.x-k8s.io/prebuilt-workload-name";
pub const CLUSTER_QUEUE_LABEL: &str = "kueue.x-k8s.io/cluster-queue-name";

/// What holds a device.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub namespace: String,
    pub pod: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The Kueue Workload the pod runs for (in the pod's namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_queue: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub team: Option<String>,
    /// The ResourceClaim (in the pod's namespace) the device was allocated through,
    /// on DRA nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<String>,
    /// Why the pod's facts are missing, when they are (e.g. "pod not found").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unresolved: Option<String>,
}

/// What a pod's metadata says about the Workload it runs for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodOwnership {
    pub workload: Option<String>,
    pub cluster_queue: Option<String>,
}

/// Read Kueue's annotation and labels on a pod.
pub fn pod_ownership(meta: &ObjectMeta) -> PodOwnership {
    let label = |key: &str| non_empty(meta.labels.as_ref(), key);
    let annotation = |key: &str| non_empty(meta.annotations.as_ref(), key);
    PodOwnership {
        workload: annotation(WORKLOAD_ANNOTATION)
            .or_else(|| label(POD_GROUP_NAME))
            .or_else(|| annotation(POD_GROUP_NAME))
            .or_else(|| label(PREBUILT_WORKLOAD_LABEL)),
        cluster_queue: label(CLUSTER_QUEUE_LABEL),
    }
}

fn non_empty(map: Option<&BTreeMap<String, String>>, key: &str) -> Option<String> {
    map?.get(key)
        .map(|v| v.trim())
        .filter(|v| !v.is_empty())
        .map(str::to_string)
}

/// A DRA device's identity in the cluster: what a claim's allocation names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DraDeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A DRA device allocated through a claim, and the pods the claim is reserved for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimedDevice {
    pub id: DraDeviceId,
    pub namespace: String,
    pub claim: String,
    /// Sorted; a claim shared by several pods names them all.
    pub pods: Vec<String>,
    /// The node and identities the driver publishes for the device (filled from
    /// its ResourceSlice; empty when the slice is gone or does not say).
    #[serde(flatten)]
    pub ids: PublishedIds,
}

impl ClaimedDevice {
    /// The name the ledger and `kaccel inventory --device` know it by: its UUID,
    /// else driver/pool/device.
    pub fn ledger_id(&self) -> String {
        self.ids
            .uuid
            .clone()
            .unwrap_or_else(|| format!("{}/{}/{}", self.id.driver, self.id.pool, self.id.device))
    }
}

/// The devices allocated through `claims` that pods hold: every allocation result
/// of a claim reserved for at least one pod. A device allocated twice (admin
/// access) keeps the first claim read.
pub fn claimed_devices<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
) -> BTreeMap<DraDeviceId, ClaimedDevice> {
    let mut claimed = BTreeMap::new();
    for claim in claims {
        let Some(status) = &claim.status else {
            continue;
        };
        let mut pods: Vec<String> = status
            .reserved_for
            .iter()
            .flatten()
            .filter(|r| {
                r.resource == "pods" && r.api_group.as_deref().unwrap_or_default().is_empty()
            })
            .map(|r| r.name.clone())
            .collect();
        if pods.is_empty() {
            continue;
        }
        pods.sort();
        pods.dedup();
        let results = status
            .allocation
            .iter()
            .filter_map(|a| a.devices.as_ref())
            .flat_map(|d| d.results.iter().flatten());
        for r in results {
            let id = DraDeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            };
            claimed.entry(id.clone()).or_insert_with(|| ClaimedDevice {
                id,
                namespace: claim.metadata.namespace.clone().unwrap_or_default(),
                claim: claim.metadata.name.clone().unwrap_or_default(),
                pods: pods.clone(),
                ids: PublishedIds::default(),
            });
        }
    }
    claimed
}

/// A holder from the exporter's pod and what is known of it. `teams` maps a
/// ClusterQueue to the team its `kaccel.io/team` label names.
pub fn holder(
    namespace: &str,
    pod: &str,
    container: Option<&str>,
    ownership: Option<&PodOwnership>,
    teams: &BTreeMap<String, String>,
) -> Holder {
    let cluster_queue = ownership.and_then(|o| o.cluster_queue.clone());
    Holder {
        namespace: namespace.to_string(),
        pod: pod.to_string(),
        container: container.map(str::to_string),
        workload: ownership.and_then(|o| o.workload.clone()),
        team: cluster_queue.as_ref().and_then(|cq| teams.get(cq).cloned()),
        cluster_queue,
        claim: None,
        unresolved: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)], annotations: &[(&str, &str)]) -> ObjectMeta {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        ObjectMeta {
            labels: map(labels),
            annotations: map(annotations),
            ..Default::default()
        }
    }

    #[test]
    fn a_job_pod_names_its_workload_and_cluster_queue() {
        // A batch/Job pod as Kueue v0.17 leaves it: the Job's template got the
        // podset label, the queue labels and the workload annotation at admission.
        let m = meta(
            &[
                ("batch.kubernetes.io/job-name", "train"),
                ("kueue.x-k8s.io/podset", "main"),
                ("kueue.x-k8s.io/local-queue-name", "large-training"),
                ("kueue.x-k8s.io/cluster-queue-name", "ml-large-training"),
            ],
            &[("kueue.x-k8s.io/workload", "job-train-3f2a1")],
        );
        let o = pod_ownership(&m);
        assert_eq!(o.workload.as_deref(), Some("job-train-3f2a1"));
        assert_eq!(o.cluster_queue.as_deref(), Some("ml-large-training"));
        let teams = BTreeMap::from([("ml-large-training".to_string(), "ml".to_string())]);
        let h = holder("ml", "train-0-abcde", Some("main"), Some(&o), &teams);
        assert_eq!(h.team.as_deref(), Some("ml"));
        assert_eq!(h.workload.as_deref(), Some("job-train-3f2a1"));
    }

    #[test]
    fn pod_groups_and_prebuilt_workloads_name_theirs_too() {
        let group = meta(&[("kueue.x-k8s.io/pod-group-name", "grp-1")], &[]);
        assert_eq!(pod_ownership(&group).workload.as_deref(), Some("grp-1"));
        let lws = meta(&[("kueue.x-k8s.io/prebuilt-workload-name", "lws-0")], &[]);
        assert_eq!(pod_ownership(&lws).workload.as_deref(), Some("lws-0"));
    }

    /// A claim as kube-scheduler leaves it after binding `pods` (k8s.io/api
    /// resource/v1 `ResourceClaimStatus`).
    fn claim(name: &str, devices: &[&str], reserved_for: serde_json::Value) -> ResourceClaim {
        let results: Vec<serde_json::Value> = devices
            .iter()
            .map(|d| serde_json::json!({"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": d}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {"deviceClassName": "x.kaccel.io"}}]}},
            "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved_for},
        }))
        .expect("a ResourceClaim")
    }

    #[test]
    fn an_allocated_claim_names_the_pods_it_is_reserved_for() {
        let held = claim(
            "train-0-gpus-x7k2p",
            &["gpu-0", "gpu-1"],
            serde_json::json!([{"resource": "pods", "name": "train-0", "uid": "u1"},
                               {"resource": "pods", "name": "train-0b", "uid": "u2"}]),
        );
        // Allocated, but the pod is gone: no holder.
        let idle = claim("idle", &["gpu-2"], serde_json::json!([]));
        // Reserved for something that is not a pod: not a pod holder.
        let other = claim(
            "other",
            &["gpu-3"],
            serde_json::json!([{"apiGroup": "example.com", "resource": "pods", "name": "x", "uid": "u3"}]),
        );
        let claimed = claimed_devices([&held, &idle, &other]);
        assert_eq!(
            claimed
                .keys()
                .map(|k| k.device.as_str())
                .collect::<Vec<_>>(),
            ["gpu-0", "gpu-1"]
        );
        let gpu0 = &claimed[&DraDeviceId {
            driver: "gpu.nvidia.com".into(),
            pool: "node-a".into(),
            device: "gpu-0".into(),
        }];
        assert_eq!(gpu0.pods, ["train-0", "train-0b"]);
        assert_eq!(
            (gpu0.namespace.as_str(), gpu0.claim.as_str()),
            ("ml", "train-0-gpus-x7k2p")
        );
        assert_eq!(gpu0.ledger_id(), "gpu.nvidia.com/node-a/gpu-0");
        let known = ClaimedDevice {
            ids: PublishedIds {
                uuid: Some("GPU-1".into()),
                ..Default::default()
            },
            ..gpu0.clone()
        };
        assert_eq!(known.ledger_id(), "GPU-1");
    }

    #[test]
    fn nothing_known_is_nothing_guessed() {
        let o = pod_ownership(&meta(&[("app", "x")], &[("kueue.x-k8s.io/workload", " ")]));
        assert_eq!(o, PodOwnership::default());
        let h = holder("ns", "p", None, Some(&o), &BTreeMap::new());
        assert_eq!((h.workload, h.cluster_queue, h.team), (None, None, None));
        // A ClusterQueue kaccel does not know has no team.
        let o = PodOwnership {
            workload: Some("w".into()),
            cluster_queue: Some("foreign".into()),
        };
        assert_eq!(
            holder("ns", "p", None, Some(&o), &BTreeMap::new()).team,
            None
        );
    }
}
