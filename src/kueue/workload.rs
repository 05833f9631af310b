//! The Workload as kaccel's credit check caches it: only the fields the check
//! and the reconciliation read, deserialised straight from the watch so a pod
//! template, managed fields or Kueue's per-pod requests are never kept.
//!
//! A cluster holds tens of thousands of finished Workloads until a retention
//! policy removes them; kaccel reads a handful of fields of each. The type has
//! `DynamicType = ()`, so the reflector's and the controller's object references
//! carry no per-object copy of the API resource either. It serialises back to
//! the same JSON shape (the same field names) the pure ledger functions read,
//! with every field it dropped absent.
//!
//! Containers are typed (the API server enforces Kueue's structural schema on
//! them); leaves the ledger validates itself (`count`, quantities, eviction
//! counts) stay JSON values, so a surprising value is reported by the ledger
//! with the field's name rather than failing the whole watch.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::NamespaceResourceScope;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{GROUP, VERSION};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: WorkloadSpec,
    #[serde(default)]
    pub status: WorkloadStatus,
}

impl kube::Resource for Workload {
    type DynamicType = ();
    type Scope = NamespaceResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Workload")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(GROUP)
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed(VERSION)
    }
    fn api_version(_: &()) -> Cow<'_, str> {
        Cow::Owned(crate::k8s::resources::kueue_api_version())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("workloads")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maximum_execution_time_seconds: Option<Value>,
    /// Per `spec.podSets[]`, the names of the resources its pods request (keys
    /// only, no template is kept): what tells a pod asking for one device by two
    /// names apart. Not serialised back (the cached form has no pod template).
    #[serde(default, rename = "podSets", skip_serializing)]
    pub pod_sets: Vec<PodSetResources>,
}

/// One podSet of a Workload as the cache keeps it: its name and the resource
/// names its containers (and init containers) request or limit.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSetResources {
    pub name: String,
    pub resources: std::collections::BTreeSet<String>,
    /// The ResourceClaimTemplates its pods' claims are made from
    /// (`resourceClaims[].resourceClaimTemplateName`).
    pub claim_templates: Vec<String>,
}

impl<'de> Deserialize<'de> for PodSetResources {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::IgnoredAny;
        // Only the names are read; every value is skipped without being kept.
        #[derive(Deserialize)]
        struct Raw {
            #[serde(default)]
            name: Option<String>,
            #[serde(default)]
            template: Option<Template>,
        }
        #[derive(Deserialize)]
        struct Template {
            #[serde(default)]
            spec: Option<PodSpec>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct PodSpec {
            #[serde(default)]
            containers: Option<Vec<Container>>,
            #[serde(default)]
            init_containers: Option<Vec<Container>>,
            #[serde(default)]
            resource_claims: Option<Vec<PodClaim>>,
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct PodClaim {
            #[serde(default)]
            resource_claim_template_name: Option<String>,
        }
        #[derive(Deserialize)]
        struct Container {
            #[serde(default)]
            resources: Option<Requirements>,
        }
        #[derive(Deserialize)]
        struct Requirements {
            #[serde(default)]
            requests: Option<BTreeMap<String, IgnoredAny>>,
            #[serde(default)]
            limits: Option<BTreeMap<String, IgnoredAny>>,
        }
        let raw = Raw::deserialize(deserializer)?;
        let mut spec = raw.template.and_then(|t| t.spec);
        let claim_templates = spec
            .as_mut()
            .and_then(|s| s.resource_claims.take())
            .into_iter()
            .flatten()
            .filter_map(|c| c.resource_claim_template_name)
            .collect();
        let containers = spec
            .into_iter()
            .flat_map(|s| s.containers.into_iter().chain(s.init_containers).flatten());
        let resources = containers
            .filter_map(|c| c.resources)
            .flat_map(|r| r.requests.into_iter().chain(r.limits).flatten())
            .map(|(name, _)| name)
            .collect();
        Ok(PodSetResources {
            // Kueue defaults the name to "main".
            name: raw.name.unwrap_or_else(|| "main".to_string()),
            resources,
            claim_templates,
        })
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadStatus {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<Admission>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admission_checks: Vec<AdmissionCheckState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling_stats: Option<SchedulingStats>,
    /// The MultiKueue worker cluster that admitted it (set by the manager's
    /// Kueue once dispatched; immutable from then on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
}

/// A Workload condition without its message (Kueue's can run to a paragraph,
/// and the ledger reads only type, status, reason and time).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Admission {
    #[serde(default)]
    pub cluster_queue: String,
    #[serde(default)]
    pub pod_set_assignments: Vec<PodSetAssignment>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSetAssignment {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flavors: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_usage: Option<BTreeMap<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<Value>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionCheckState {
    pub name: String,
    #[serde(default)]
    pub state: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedulingStats {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evictions: Vec<EvictionCount>,
}

/// One `schedulingStats.evictions[]` item: its count (the admission number is 1
/// + their total) and reason (whether every eviction was a deactivation).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EvictionCount {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<Value>,
}

impl Workload {
    /// Drops, before the Workload is cached, what deserialisation could not
    /// skip: managed fields, labels, owner references, annotations that are not
    /// `keep_annotation_prefix`'s, and the resources of each podSet that
    /// `keep_resource` does not count (CPU and memory, for the ledger).
    pub fn slim(&mut self, keep_annotation_prefix: &str, keep_resource: impl Fn(&str) -> bool) {
        let meta = &mut self.metadata;
        meta.managed_fields = None;
        meta.labels = None;
        // Only the controller (the Job a Workload was made for) is kept: the
        // credit check tells it where its pods were placed.
        if let Some(owners) = meta.owner_references.as_mut() {
            owners.retain(|o| o.controller == Some(true));
            owners.truncate(1);
            for o in owners.iter_mut() {
                o.block_owner_deletion = None;
            }
        }
        if meta.owner_references.as_ref().is_some_and(Vec::is_empty) {
            meta.owner_references = None;
        }
        if let Some(annotations) = meta.annotations.as_mut() {
            annotations.retain(|k, _| k.starts_with(keep_annotation_prefix));
            if annotations.is_empty() {
                meta.annotations = None;
            }
        }
        for pod_set in &mut self.spec.pod_sets {
            pod_set.resources.retain(|r| keep_resource(r));
        }
        if let Some(admission) = self.status.admission.as_mut() {
            for assignment in &mut admission.pod_set_assignments {
                if let Some(usage) = assignment.resource_usage.as_mut() {
                    usage.retain(|r, _| keep_resource(r));
                }
                if let Some(flavors) = assignment.flavors.as_mut() {
                    flavors.retain(|r, _| keep_resource(r));
                }
            }
        }
    }

    /// Keeps only what identifies the object (name, namespace, uid,
    /// resourceVersion, deletionTimestamp): the form of a Workload the credit
    /// check has nothing to do with, such as a cluster's finished history.
    pub fn keep_identity_only(&mut self) {
        let meta = std::mem::take(&mut self.metadata);
        *self = Workload {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                deletion_timestamp: meta.deletion_timestamp,
                ..ObjectMeta::default()
            },
            ..Workload::default()
        };
    }

    /// Whether the Workload carries finalizer `name`.
    pub fn has_finalizer(&self, name: &str) -> bool {
        self.metadata.finalizers.iter().flatten().any(|f| f == name)
    }

    /// Whether AdmissionCheck `name` is on the Workload, in any state.
    pub fn has_check(&self, name: &str) -> bool {
        self.status.admission_checks.iter().any(|c| c.name == name)
    }

    /// Whether condition `type_` is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.status
            .conditions
            .iter()
            .any(|c| c.type_ == type_ && c.status == "True")
    }

    /// Condition `type_`, if Kueue set it.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.status.conditions.iter().find(|c| c.type_ == type_)
    }

    /// AdmissionCheck `name`'s state on the Workload, if it is there.
    pub fn check(&self, name: &str) -> Option<&AdmissionCheckState> {
        self.status.admission_checks.iter().find(|c| c.name == name)
    }

    /// Whether ClusterQueue `cluster_queue` (its JSON as the API server serves
    /// it) calls for AdmissionCheck `check` on this Workload's admission, as
    /// Kueue decides it (`workload.AdmissionChecksForWorkload`, v0.16 and
    /// v0.17): a rule of `spec.admissionChecksStrategy` names the check, and its
    /// `onFlavors` (every flavor of the queue when empty) share one with the
    /// admission; an admission without flavors gets every check. False while
    /// the Workload has no admission, or one to another queue.
    pub fn check_called_for(&self, cluster_queue: &Value, check: &str) -> bool {
        let Some(admission) = &self.status.admission else {
            return false;
        };
        if cluster_queue["metadata"]["name"].as_str() != Some(admission.cluster_queue.as_str()) {
            return false;
        }
        let spec = &cluster_queue["spec"];
        let names = |list: &Value| -> Vec<String> {
            list.as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f.as_str().or_else(|| f["name"].as_str()))
                .map(str::to_string)
                .collect()
        };
        let Some(rule) = spec["admissionChecksStrategy"]["admissionChecks"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|rule| rule["name"].as_str() == Some(check))
        else {
            return false;
        };
        let mut rule_flavors = names(&rule["onFlavors"]);
        if rule_flavors.is_empty() {
            rule_flavors = spec["resourceGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|group| names(&group["flavors"]))
                .collect();
        }
        let mut admitted_on = admission
            .pod_set_assignments
            .iter()
            .flat_map(|a| a.flavors.iter().flatten())
            .map(|(_, flavor)| flavor)
            .peekable();
        admitted_on.peek().is_none() || admitted_on.any(|f| rule_flavors.contains(f))
    }

    /// Annotation `key`, if set.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }

    /// `spec.active`, which Kueue defaults to true.
    pub fn active(&self) -> bool {
        self.spec.active.unwrap_or(true)
    }

    /// The MultiKueue worker it was dispatched to (`status.clusterName`); empty
    /// when it runs here or is not dispatched yet.
    pub fn cluster_name(&self) -> &str {
        self.status.cluster_name.as_deref().unwrap_or_default()
    }

    /// The ClusterQueue the Workload is admitted to (`status.admission`), if any.
    pub fn cluster_queue(&self) -> Option<&str> {
        self.status
            .admission
            .as_ref()
            .map(|a| a.cluster_queue.as_str())
    }

    /// `spec.maximumExecutionTimeSeconds` when it is a positive integer: Kueue
    /// deactivates the Workload after it.
    pub fn maximum_execution_seconds(&self) -> Option<u64> {
        self.spec
            .maximum_execution_time_seconds
            .as_ref()
            .and_then(Value::as_u64)
            .filter(|s| *s > 0)
    }

    /// Whether Kueue counts the Workload in its ClusterQueue's usage: the typed
    /// twin of `ledger::lifecycle::counted_by_kueue` (quota reserved, not
    /// finished, and not deactivated-and-evicted), for filtering the cache
    /// without building JSON.
    pub fn counted_by_kueue(&self) -> bool {
        self.is_true("QuotaReserved")
            && !self.is_true("Finished")
            && (self.active() || !self.is_true("Evicted"))
    }

    /// The JSON the ledger's pure functions read (apiVersion and kind included).
    pub fn to_value(&self) -> Value {
        let mut v = serde_json::to_value(self).expect("a Workload serialises");
        if let Some(map) = v.as_object_mut() {
            map.insert(
                "apiVersion".into(),
                Value::String(crate::k8s::resources::kueue_api_version()),
            );
            map.insert("kind".into(), Value::String("Workload".into()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A finished Workload as Kueue v0.17 leaves it (fields per
    /// `apis/kueue/v1beta2/workload_types.go`), with a Job's pod template.
    fn finished() -> Value {
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {
                "name": "job-train-1a2b3", "namespace": "vision", "uid": "u-1",
                "resourceVersion": "812", "generation": 2,
                "creationTimestamp": "2026-12-01T00:00:00Z",
                "labels": {"kueue.x-k8s.io/job-uid": "j-1"},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j-1", "controller": true, "blockOwnerDeletion": true},
                                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "other", "uid": "c-1"}],
                "annotations": {"kaccel.io/credit-reservation": "{\"budget\":\"vision\"}", "other.io/x": "y"},
                "finalizers": ["kaccel.io/credits"],
                "managedFields": [{"manager": "kueue", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {}}}]
            },
            "spec": {
                "active": true, "queueName": "training", "priority": 0,
                "maximumExecutionTimeSeconds": 3600,
                "podSets": [{"name": "main", "count": 2, "template": {"spec": {"containers": [{"name": "c", "image": "i", "resources": {"requests": {"nvidia.com/gpu": "8"}}}]}}}]
            },
            "status": {
                "conditions": [
                    {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved", "message": "Quota reserved in ClusterQueue vision", "lastTransitionTime": "2026-12-01T00:00:01Z", "observedGeneration": 1},
                    {"type": "Finished", "status": "True", "reason": "Succeeded", "message": "Job finished successfully", "lastTransitionTime": "2026-12-01T01:00:00Z"}
                ],
                "admission": {"clusterQueue": "vision", "podSetAssignments": [{
                    "name": "main", "count": 2,
                    "flavors": {"cpu": "default", "nvidia.com/gpu": "h100"},
                    "resourceUsage": {"cpu": "16", "memory": "128Gi", "nvidia.com/gpu": "16"}
                }]},
                "admissionChecks": [{"name": "kaccel-credits", "state": "Ready", "message": "reserved", "lastTransitionTime": "2026-12-01T00:00:02Z"}],
                "resourceRequests": [{"name": "main", "resources": {"nvidia.com/gpu": "8"}}],
                "schedulingStats": {"evictions": [{"reason": "Preempted", "underlyingCause": "", "count": 2}]}
            }
        })
    }

    #[test]
    fn keeps_exactly_what_the_ledger_reads() {
        let mut w: Workload = serde_json::from_value(finished()).unwrap();
        w.slim("kaccel.io/", |r| r.contains('/'));
        let v = w.to_value();
        assert_eq!(
            v["metadata"]["annotations"],
            json!({"kaccel.io/credit-reservation": "{\"budget\":\"vision\"}"})
        );
        assert!(v["metadata"].get("managedFields").is_none());
        assert!(v["metadata"].get("labels").is_none());
        // The controller (the Job, told where its pods went) alone.
        assert_eq!(
            v["metadata"]["ownerReferences"],
            json!([{"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j-1", "controller": true}])
        );
        assert_eq!(v["metadata"]["finalizers"], json!(["kaccel.io/credits"]));
        assert_eq!(v["metadata"]["uid"], "u-1");
        assert!(v["spec"].get("podSets").is_none());
        assert_eq!(v["spec"]["maximumExecutionTimeSeconds"], 3600);
        assert!(v["status"].get("resourceRequests").is_none());
        assert!(v["status"]["conditions"][0].get("message").is_none());
        assert_eq!(v["status"]["conditions"][1]["reason"], "Succeeded");
        assert_eq!(
            v["status"]["admission"]["podSetAssignments"][0],
            json!({"name": "main", "count": 2, "flavors": {"nvidia.com/gpu": "h100"}, "resourceUsage": {"nvidia.com/gpu": "16"}})
        );
        assert_eq!(v["status"]["admissionChecks"][0]["state"], "Ready");
        assert_eq!(
            v["status"]["schedulingStats"],
            json!({"evictions": [{"reason": "Preempted", "count": 2}]})
        );
        assert_eq!(v["kind"], "Workload");
    }

    #[test]
    fn the_ledger_reads_the_same_from_the_slim_form() {
        use crate::ledger::admission::{admission_number, horizon_seconds, usage_from_workload};
        use crate::ledger::lifecycle::{
            check_state, condition, counted_by_kueue, is_finished, record_of,
        };
        // Everything the typed form can hold, against what the cache keeps.
        let full: Workload = serde_json::from_value(finished()).unwrap();
        let mut slim = full.clone();
        slim.slim(
            "kaccel.io/",
            crate::ledger::admission::is_accelerator_resource,
        );
        assert_ne!(full, slim, "slimming dropped something");
        assert_eq!(
            usage_from_workload(&full).unwrap(),
            usage_from_workload(&slim).unwrap()
        );
        assert_eq!(
            admission_number(&full).unwrap(),
            admission_number(&slim).unwrap()
        );
        assert_eq!(horizon_seconds(&full, 60), horizon_seconds(&slim, 60));
        for type_ in ["QuotaReserved", "Finished", "Evicted"] {
            assert_eq!(condition(&full, type_), condition(&slim, type_));
        }
        assert_eq!(
            check_state(&full, "kaccel-credits"),
            check_state(&slim, "kaccel-credits")
        );
        assert_eq!(counted_by_kueue(&full), counted_by_kueue(&slim));
        assert_eq!(is_finished(&full), is_finished(&slim));
        assert_eq!(record_of(&full).is_err(), record_of(&slim).is_err());
    }

    #[test]
    fn counted_by_kueue_agrees_with_the_ledgers_reading() {
        for bits in 0u8..32 {
            let on = |b: u8| {
                if bits & (1 << b) != 0 {
                    "True"
                } else {
                    "False"
                }
            };
            let v = json!({
                "metadata": {"name": "w"},
                "spec": {"active": bits & 16 == 0},
                "status": {"conditions": [
                    {"type": "QuotaReserved", "status": on(0)},
                    {"type": "Finished", "status": on(1)},
                    {"type": "Evicted", "status": on(2)},
                    {"type": "Admitted", "status": on(3)},
                ]}
            });
            let w: Workload = serde_json::from_value(v.clone()).unwrap();
            assert_eq!(
                w.counted_by_kueue(),
                crate::ledger::lifecycle::counted_by_kueue(&w),
                "{v}"
            );
        }
    }

    #[test]
    fn the_view_reads_what_kueue_wrote() {
        let w: Workload = serde_json::from_value(finished()).unwrap();
        assert_eq!(w.cluster_queue(), Some("vision"));
        assert_eq!(w.maximum_execution_seconds(), Some(3600));
        assert!(w.active());
        let finished = w.condition("Finished").expect("Finished condition");
        assert_eq!(finished.status, "True");
        assert_eq!(finished.reason.as_deref(), Some("Succeeded"));
        assert_eq!(
            finished.last_transition_time.as_deref(),
            Some("2026-12-01T01:00:00Z")
        );
        assert!(w.condition("Evicted").is_none());
        assert_eq!(
            w.check("kaccel-credits").map(|c| c.state.as_str()),
            Some("Ready")
        );
        assert!(w.check("another").is_none());
        assert_eq!(w.annotation("other.io/x"), Some("y"));
        assert!(w.annotation("absent.io/x").is_none());
        assert!(w.has_finalizer("kaccel.io/credits"));

        // Kueue's defaults and the values it does not constrain.
        let bare: Workload = serde_json::from_value(json!({
            "metadata": {"name": "w"},
            "spec": {"maximumExecutionTimeSeconds": 0}
        }))
        .unwrap();
        assert!(bare.active(), "spec.active defaults to true");
        assert_eq!(bare.maximum_execution_seconds(), None, "0 sets no limit");
        assert_eq!(bare.cluster_queue(), None);
        let odd: Workload = serde_json::from_value(json!({
            "metadata": {"name": "w"},
            "spec": {"active": false, "maximumExecutionTimeSeconds": "soon"}
        }))
        .unwrap();
        assert!(!odd.active());
        assert_eq!(odd.maximum_execution_seconds(), None);
    }

    #[test]
    fn a_new_inactive_workload_has_no_status() {
        let w: Workload = serde_json::from_value(json!({
            "metadata": {"name": "w", "namespace": "n"},
            "spec": {"active": false, "queueName": "q", "podSets": []}
        }))
        .unwrap();
        assert_eq!(w.spec.active, Some(false));
        assert_eq!(w.to_value()["status"], json!({}));
    }

    /// A ClusterQueue as the API server serves it (Kueue v0.17's
    /// `apis/kueue/v1beta2/clusterqueue_types.go`: `onFlavors` is a list of
    /// flavor names), with the given admission-check rules.
    fn queue(rules: Value) -> Value {
        json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
            "metadata": {"name": "vision"},
            "spec": {
                "resourceGroups": [
                    {"coveredResources": ["cpu"], "flavors": [{"name": "default", "resources": []}]},
                    {"coveredResources": ["nvidia.com/gpu"], "flavors": [
                        {"name": "h100", "resources": []}, {"name": "a100", "resources": []}]}
                ],
                "admissionChecksStrategy": {"admissionChecks": rules}
            }
        })
    }

    #[test]
    fn a_check_is_called_for_as_kueue_lists_it() {
        // Slimmed, as the credit check caches it: the flavors must survive.
        let mut w: Workload = serde_json::from_value(finished()).unwrap();
        w.slim("kaccel.io/", |r| r.contains('/'));
        let check = "kaccel-credits";
        // As kaccel generates its queues: the rule alone, every flavor.
        assert!(w.check_called_for(&queue(json!([{"name": check}])), check));
        assert!(w.check_called_for(&queue(json!([{"name": "other"}, {"name": check}])), check));
        assert!(!w.check_called_for(&queue(json!([{"name": "other"}])), check));
        assert!(!w.check_called_for(&queue(json!([])), check));
        let mut no_strategy = queue(json!([]));
        no_strategy["spec"]
            .as_object_mut()
            .unwrap()
            .remove("admissionChecksStrategy");
        assert!(!w.check_called_for(&no_strategy, check));
        // onFlavors: only an admission on one of them.
        let on = |flavors: Value| queue(json!([{"name": check, "onFlavors": flavors}]));
        assert!(w.check_called_for(&on(json!(["h100"])), check));
        assert!(!w.check_called_for(&on(json!(["a100"])), check));
        assert!(w.check_called_for(&on(json!([])), check));
        // Another queue's spec says nothing about this admission.
        let mut other = queue(json!([{"name": check}]));
        other["metadata"]["name"] = json!("robotics");
        assert!(!w.check_called_for(&other, check));
        // An admission without flavors gets every check the queue lists.
        let mut flavorless = w.clone();
        for a in &mut flavorless
            .status
            .admission
            .as_mut()
            .unwrap()
            .pod_set_assignments
        {
            a.flavors = None;
        }
        assert!(flavorless.check_called_for(&on(json!(["a100"])), check));
        // No admission: Kueue has not reserved quota.
        let mut waiting = w.clone();
        waiting.status.admission = None;
        assert!(!waiting.check_called_for(&queue(json!([{"name": check}])), check));
    }
}
