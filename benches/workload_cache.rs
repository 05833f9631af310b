//! Heap bytes per cached Workload, the credit check's cache as kube-runtime's
//! reflector holds it, for the representations kaccel has used (a measurement,
//! printed; not a test):
//!
//! - `DynamicObject`, whole (no slimming);
//! - `DynamicObject`, pod templates, managed fields and foreign annotations
//!   removed after parsing (kaccel before the typed view);
//! - `kueue::workload::Workload`, the typed slim view (kaccel now, for a
//!   Workload the check works on: charged, or waiting on the check);
//! - the same type, identity only (what kaccel held, until 2026-12-06, of a
//!   finished Workload whose settlement is done and of one the check is not
//!   on; such Workloads are not held at all now).
//!
//! The Workloads are finished Job Workloads as Kueue v0.17 leaves them (fields
//! per `apis/kueue/v1beta2/workload_types.go`), each with an 8-GPU pod template,
//! five conditions with Kueue's messages, an admission and the credit check.
//!
//!   cargo bench --bench workload_cache [-- N]      # default 20000

use kaccel::kueue::workload::Workload;
use kube::api::DynamicObject;
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher::Event;
use serde_json::{Value, json};

#[path = "support/counting_alloc.rs"]
mod counting_alloc;

#[global_allocator]
static ALLOCATOR: counting_alloc::Counting = counting_alloc::Counting;

fn finished_workload(i: usize) -> String {
    let t = |m: usize| format!("2026-11-{:02}T{:02}:{:02}:00Z", 1 + i % 28, i % 24, m);
    let cond = |type_: &str, reason: &str, message: &str, m: usize| {
        json!({"type": type_, "status": "True", "reason": reason, "message": message,
               "lastTransitionTime": t(m), "observedGeneration": 1})
    };
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {
            "name": format!("job-train-{i:06}-5f2c1"), "namespace": "vision-research",
            "uid": format!("4f7c1a2e-0000-4000-8000-{i:012}"), "resourceVersion": format!("{}", 100_000 + i),
            "generation": 2, "creationTimestamp": t(0),
            "labels": {"kueue.x-k8s.io/job-uid": format!("9a1b-{i}"), "kueue.x-k8s.io/queue-name": "large-training"},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": format!("train-{i}"),
                                 "uid": format!("9a1b-{i}"), "controller": true, "blockOwnerDeletion": true}],
            "annotations": {"kaccel.io/credit-reservation": "{\"budget\":\"vision\",\"admission\":1,\"admitted_at\":1764547200,\"horizon_seconds\":3600,\"lines\":[{\"flavor\":\"nvidia-h100-80gb-hbm3\",\"resource\":\"nvidia.com/gpu\",\"units\":8,\"rate\":4000000,\"rate_card\":\"rc-0123456789abcdef\"}]}"},
            "managedFields": [
                {"manager": "kueue", "operation": "Update", "apiVersion": "kueue.x-k8s.io/v1beta2", "time": t(0), "fieldsType": "FieldsV1",
                 "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:kueue.x-k8s.io/job-uid": {}}, "f:ownerReferences": {}}, "f:spec": {"f:podSets": {}, "f:queueName": {}}}},
                {"manager": "kueue-admission", "operation": "Apply", "apiVersion": "kueue.x-k8s.io/v1beta2", "time": t(1), "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:admission": {"f:clusterQueue": {}, "f:podSetAssignments": {}}, "f:conditions": {}}}},
                {"manager": "kaccel", "operation": "Apply", "apiVersion": "kueue.x-k8s.io/v1beta2", "time": t(1), "fieldsType": "FieldsV1", "subresource": "status",
                 "fieldsV1": {"f:status": {"f:admissionChecks": {"k:{\"name\":\"kaccel-credits\"}": {".": {}, "f:message": {}, "f:state": {}}}}}}
            ]
        },
        "spec": {
            "active": true, "queueName": "large-training", "priority": 0, "priorityClassSource": "",
            "podSets": [{"name": "main", "count": 1, "template": {"metadata": {}, "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "trainer", "image": "registry.example.com/vision/trainer:2026.11",
                    "command": ["python", "-m", "train", "--config", "/etc/train/config.yaml"],
                    "env": [{"name": "NCCL_DEBUG", "value": "WARN"}, {"name": "EPOCHS", "value": "12"}],
                    "resources": {"requests": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/train"}]}],
                "volumes": [{"name": "config", "configMap": {"name": "train-config"}}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}}]
        },
        "status": {
            "conditions": [
                cond("QuotaReserved", "QuotaReserved", "Quota reserved in ClusterQueue vision-research-large-training", 1),
                cond("Admitted", "Admitted", "The workload is admitted", 1),
                cond("PodsReady", "PodsReady", "All pods reached readiness and the workload is running", 2),
                cond("Finished", "Succeeded", "Job finished successfully", 59),
                {"type": "Requeued", "status": "True", "reason": "Admitted", "message": "The workload is admitted", "lastTransitionTime": t(1)}
            ],
            "admission": {"clusterQueue": "vision-research-large-training", "podSetAssignments": [{
                "name": "main", "count": 1,
                "flavors": {"cpu": "cpu-default", "memory": "cpu-default", "nvidia.com/gpu": "nvidia-h100-80gb-hbm3"},
                "resourceUsage": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}}]},
            "admissionChecks": [{"name": "kaccel-credits", "state": "Ready", "lastTransitionTime": t(1),
                "message": "reserved 32 credits of budget vision for the first 3600s, renewed every 3600s while it runs (rate card rc-0123456789abcdef)"}],
            "resourceRequests": [{"name": "main", "resources": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "8"}}],
            "accumulatedPastExecutionTimeSeconds": 3480
        }
    })
    .to_string()
}

/// What kaccel did before the typed view: parse whole, then remove.
fn slim_dynamic(w: &mut DynamicObject) {
    w.metadata.managed_fields = None;
    if let Some(a) = w.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("kaccel.io/"));
    }
    if let Some(spec) = w.data.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("podSets");
    }
    if let Some(status) = w.data.get_mut("status").and_then(Value::as_object_mut) {
        status.remove("resourceRequests");
    }
}

fn measure<K, F>(name: &str, texts: &[String], dyntype: K::DynamicType, parse: F)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Clone + Eq + std::hash::Hash,
    F: Fn(&str) -> K,
{
    let before = counting_alloc::live_bytes();
    let mut writer = Writer::<K>::new(dyntype);
    for text in texts {
        writer.apply_watcher_event(&Event::Apply(parse(text)));
    }
    let reader = writer.as_reader();
    let bytes = counting_alloc::live_bytes() - before;
    println!(
        "| {name} | {} | {:.1} MiB | {} B |",
        reader.len(),
        bytes as f64 / 1_048_576.0,
        bytes / texts.len() as isize
    );
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(20_000);
    let texts: Vec<String> = (0..n).map(finished_workload).collect();
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "kueue.x-k8s.io",
        "v1beta2",
        "Workload",
    ));
    println!("| cache of {n} finished Workloads | objects | heap | per Workload |");
    println!("|---|---|---|---|");
    measure::<DynamicObject, _>("DynamicObject, whole", &texts, resource.clone(), |t| {
        serde_json::from_str(t).expect("a Workload")
    });
    measure::<DynamicObject, _>(
        "DynamicObject, slimmed after parsing (before)",
        &texts,
        resource,
        |t| {
            let mut w: DynamicObject = serde_json::from_str(t).expect("a Workload");
            slim_dynamic(&mut w);
            w
        },
    );
    measure::<Workload, _>(
        "typed slim view (a Workload the check works on)",
        &texts,
        (),
        |t| {
            let mut w: Workload = serde_json::from_str(t).expect("a Workload");
            w.slim(
                "kaccel.io/",
                kaccel::ledger::admission::is_accelerator_resource,
            );
            w
        },
    );
    measure::<Workload, _>(
        "identity only (before: settled history, Workloads without the check)",
        &texts,
        (),
        |t| {
            let w: Workload = serde_json::from_str(t).expect("a Workload");
            let mut stub = Workload::default();
            stub.metadata.name = w.metadata.name;
            stub.metadata.namespace = w.metadata.namespace;
            stub.metadata.uid = w.metadata.uid;
            stub.metadata.resource_version = w.metadata.resource_version;
            stub
        },
    );
}
