//! The pod rewrite of class-level requests, as pure functions: a pod that asks
//! for `kaccel.io/accelerator: N` and that Kueue placed on a flavor gets that
//! flavor's vendor resource instead (`nvidia.com/gpu: N`, `amd.com/gpu: N`, ...;
//! on a DRA-only flavor the implicit extended resource of its DeviceClass,
//! `deviceclass.resource.kubernetes.io/<flavor>.kaccel.io: N`, which the
//! scheduler turns into a claim of exactly that flavor's devices), and the
//! settings its class declares for that vendor or model. The I/O (TLS,
//! the AdmissionReview, where the flavor is read from) is in
//! `controller::pod_webhook`.
//!
//! The flavor comes from what Kueue decided (the Workload's admission), never
//! from a guess: a pod whose placement cannot be read is refused, naming the
//! class, rather than created with a resource no node has.

use serde_json::{Value, json};

pub mod finalizer;

use crate::api::{self, Vendor, VendorPodSettings};
use crate::k8s::names::glob_match;

/// The container lists of a pod spec that can ask for devices.
const CONTAINER_LISTS: [&str; 2] = ["initContainers", "containers"];

/// Where Kueue placed a pod and what that flavor's devices are.
#[derive(Clone, Debug, PartialEq)]
pub struct Placement<'a> {
    /// The AcceleratorClass of the pod's queue.
    pub class: &'a str,
    pub flavor: &'a str,
    /// The resource the flavor's devices are published under.
    pub vendor_resource: &'a str,
    pub vendor: Option<Vendor>,
    pub model: &'a str,
    /// The class's settings for this vendor or model, if it declares any.
    pub settings: Option<&'a VendorPodSettings>,
}

/// Why a pod asking for the class resource cannot be created as it is.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "container {container:?} asks for both {class_resource} and {vendor_resource}: ask for its devices by one name",
        class_resource = api::CLASS_RESOURCE
    )]
    TwoNames {
        container: String,
        vendor_resource: String,
    },
    #[error("the pod is not an object with spec.containers")]
    NotAPod,
}

/// Whether a container (or init container) of `pod` asks for the class resource.
pub fn asks_for_class_resource(pod: &Value) -> bool {
    containers(pod).any(|(_, _, c)| {
        ["requests", "limits"]
            .iter()
            .any(|s| c["resources"][s].get(api::CLASS_RESOURCE).is_some())
    })
}

fn containers(pod: &Value) -> impl Iterator<Item = (&'static str, usize, &Value)> {
    CONTAINER_LISTS.into_iter().flat_map(move |list| {
        pod["spec"][list]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
            .map(move |(i, c)| (list, i, c))
    })
}

/// The first settings entry whose vendors and models both match (empty lists
/// match anything).
pub fn settings_for<'a>(
    settings: &'a [VendorPodSettings],
    vendor: Option<Vendor>,
    model: &str,
) -> Option<&'a VendorPodSettings> {
    settings.iter().find(|s| {
        (s.vendors.is_empty() || vendor.is_some_and(|v| s.vendors.contains(&v)))
            && (s.models.is_empty() || s.models.iter().any(|m| glob_match(m, model)))
    })
}

/// A JSON Pointer token (RFC 6901): `~` and `/` escaped.
fn token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// The JSON patch (RFC 6902) that puts `pod` on `placement`: in every container
/// that asks for the class resource, its requests and limits move to the
/// vendor resource (same quantity), and the class's settings for the vendor are
/// applied (env added where the container does not set the variable, image
/// replaced; tolerations added, `runtimeClassName` set where the pod sets none).
/// An empty patch when the pod asks for no class resource.
pub fn rewrite(pod: &Value, placement: &Placement<'_>) -> Result<Vec<Value>, Refusal> {
    if !pod["spec"]["containers"].is_array() {
        return Err(Refusal::NotAPod);
    }
    let class = token(api::CLASS_RESOURCE);
    let vendor = token(placement.vendor_resource);
    let mut ops = Vec::new();
    for (list, i, c) in containers(pod) {
        let mut asks = false;
        for section in ["requests", "limits"] {
            let Some(quantity) = c["resources"][section].get(api::CLASS_RESOURCE) else {
                continue;
            };
            if c["resources"][section]
                .get(placement.vendor_resource)
                .is_some()
            {
                return Err(Refusal::TwoNames {
                    container: c["name"].as_str().unwrap_or_default().to_string(),
                    vendor_resource: placement.vendor_resource.to_string(),
                });
            }
            asks = true;
            let base = format!("/spec/{list}/{i}/resources/{section}");
            ops.push(json!({"op": "remove", "path": format!("{base}/{class}")}));
            ops.push(json!({"op": "add", "path": format!("{base}/{vendor}"), "value": quantity}));
        }
        let Some(settings) = placement.settings.filter(|_| asks) else {
            continue;
        };
        let base = format!("/spec/{list}/{i}");
        if let Some(image) = &settings.image {
            ops.push(json!({"op": "replace", "path": format!("{base}/image"), "value": image}));
        }
        let set: Vec<&str> = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| e["name"].as_str())
            .collect();
        let added: Vec<Value> = settings
            .env
            .iter()
            .filter(|e| !set.contains(&e.name.as_str()))
            .map(|e| json!({"name": e.name, "value": e.value}))
            .collect();
        if !added.is_empty() {
            if c["env"].is_array() {
                for e in added {
                    ops.push(json!({"op": "add", "path": format!("{base}/env/-"), "value": e}));
                }
            } else {
                ops.push(json!({"op": "add", "path": format!("{base}/env"), "value": added}));
            }
        }
    }
    if let Some(settings) = placement.settings.filter(|_| !ops.is_empty()) {
        let existing = pod["spec"]["tolerations"].as_array();
        let added: Vec<Value> = settings
            .tolerations
            .iter()
            .filter_map(|t| serde_json::to_value(t).ok())
            .filter(|t| !existing.is_some_and(|e| e.contains(t)))
            .collect();
        if !added.is_empty() {
            if existing.is_some() {
                for t in added {
                    ops.push(json!({"op": "add", "path": "/spec/tolerations/-", "value": t}));
                }
            } else {
                ops.push(json!({"op": "add", "path": "/spec/tolerations", "value": added}));
            }
        }
        if let Some(runtime) = &settings.runtime_class_name
            && pod["spec"]["runtimeClassName"].is_null()
        {
            ops.push(json!({"op": "add", "path": "/spec/runtimeClassName", "value": runtime}));
        }
    }
    Ok(ops)
}

/// What the webhook answers.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// Admit the pod unchanged.
    Allow,
    /// Admit it with this JSON patch.
    Patch(Vec<Value>),
    /// Refuse it with this message (HTTP 403 in the review's status).
    Deny(String),
}

/// The `admission.k8s.io/v1` AdmissionReview response for request `uid`.
pub fn review_response(uid: &str, answer: &Answer) -> Value {
    let mut response = json!({"uid": uid, "allowed": !matches!(answer, Answer::Deny(_))});
    match answer {
        Answer::Allow => {}
        Answer::Patch(ops) if ops.is_empty() => {}
        Answer::Patch(ops) => {
            use base64::Engine as _;
            let patch = serde_json::to_vec(ops).expect("a JSON patch serialises");
            response["patchType"] = json!("JSONPatch");
            response["patch"] = json!(base64::engine::general_purpose::STANDARD.encode(patch));
        }
        Answer::Deny(message) => {
            response["status"] = json!({"code": 403, "reason": "Forbidden", "message": message});
        }
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})
}

#[cfg(test)]
mod tests;
