//! Tests of the pod rewrite: the patch applied to real pod JSON, as the API
//! server applies it.

use super::*;
use crate::api::PodEnvVar;
use k8s_openapi::api::core::v1::Toleration;

/// A pod as the Job controller creates it once Kueue admitted the Job: the
/// flavor's nodeSelector injected, the class resource in requests and limits.
fn pod() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"generateName": "train-", "namespace": "language",
                     "labels": {"kueue.x-k8s.io/podset": "main"},
                     "annotations": {"kueue.x-k8s.io/workload": "job-train-1a2b3"}},
        "spec": {
            "nodeSelector": {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM"},
            "initContainers": [{"name": "fetch", "image": "busybox",
                                "resources": {"requests": {"cpu": "1"}}}],
            "containers": [
                {"name": "train", "image": "ghcr.io/acme/train:cuda",
                 "env": [{"name": "EPOCHS", "value": "3"}, {"name": "HIP_VISIBLE_DEVICES", "value": "0"}],
                 "resources": {"requests": {"cpu": "16", "kaccel.io/accelerator": "8"},
                               "limits": {"kaccel.io/accelerator": "8"}}},
                {"name": "sidecar", "image": "ghcr.io/acme/log:1",
                 "resources": {"requests": {"cpu": "100m"}}}
            ]
        }
    })
}

fn rocm() -> VendorPodSettings {
    VendorPodSettings {
        vendors: vec![Vendor::Amd],
        env: vec![
            PodEnvVar {
                name: "HIP_VISIBLE_DEVICES".into(),
                value: "all".into(),
            },
            PodEnvVar {
                name: "HSA_FORCE_FINE_GRAIN_PCIE".into(),
                value: "1".into(),
            },
        ],
        tolerations: vec![Toleration {
            key: Some("amd.com/gpu".into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        }],
        image: Some("ghcr.io/acme/train:rocm".into()),
        ..Default::default()
    }
}

fn placement(settings: Option<&VendorPodSettings>) -> Placement<'_> {
    Placement {
        class: "large-training",
        flavor: "amd-instinct-mi300x-oam",
        vendor_resource: "amd.com/gpu",
        vendor: Some(Vendor::Amd),
        model: "AMD_Instinct_MI300X_OAM",
        settings,
    }
}

/// `ops` applied to a copy of `pod` (also used by the finalizer's tests).
pub(super) fn applied(pod: &Value, ops: &[Value]) -> Value {
    let patch: json_patch::Patch =
        serde_json::from_value(Value::Array(ops.to_vec())).expect("a JSON patch");
    let mut out = pod.clone();
    json_patch::patch(&mut out, &patch).expect("the patch applies");
    out
}

#[test]
fn the_class_resource_becomes_the_flavors_vendor_resource_with_the_vendors_settings() {
    let pod = pod();
    assert!(asks_for_class_resource(&pod));
    let settings = rocm();
    let ops = rewrite(&pod, &placement(Some(&settings))).unwrap();
    let out = applied(&pod, &ops);
    let train = &out["spec"]["containers"][0];
    assert_eq!(
        train["resources"],
        json!({"requests": {"cpu": "16", "amd.com/gpu": "8"}, "limits": {"amd.com/gpu": "8"}})
    );
    assert_eq!(train["image"], "ghcr.io/acme/train:rocm");
    // The container's own HIP_VISIBLE_DEVICES is kept; the missing one added.
    assert_eq!(
        train["env"],
        json!([{"name": "EPOCHS", "value": "3"}, {"name": "HIP_VISIBLE_DEVICES", "value": "0"},
               {"name": "HSA_FORCE_FINE_GRAIN_PCIE", "value": "1"}])
    );
    // Containers that ask for no devices are untouched.
    assert_eq!(out["spec"]["containers"][1], pod["spec"]["containers"][1]);
    assert_eq!(out["spec"]["initContainers"], pod["spec"]["initContainers"]);
    assert_eq!(
        out["spec"]["tolerations"],
        json!([{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}])
    );
    assert!(!asks_for_class_resource(&out));
    // Kueue's placement (the nodeSelector) is left as Kueue wrote it.
    assert_eq!(out["spec"]["nodeSelector"], pod["spec"]["nodeSelector"]);
}

#[test]
fn without_settings_only_the_resource_moves_and_a_pod_without_the_class_resource_is_untouched() {
    let pod = pod();
    let nvidia = Placement {
        vendor_resource: "nvidia.com/gpu",
        vendor: Some(Vendor::Nvidia),
        model: "NVIDIA-H100-80GB-HBM3",
        flavor: "nvidia-h100-80gb-hbm3",
        ..placement(None)
    };
    let out = applied(&pod, &rewrite(&pod, &nvidia).unwrap());
    let mut want = pod.clone();
    want["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "16", "nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}});
    assert_eq!(out, want);

    let mut plain = pod.clone();
    plain["spec"]["containers"][0]["resources"] = json!({"limits": {"nvidia.com/gpu": "8"}});
    assert!(!asks_for_class_resource(&plain));
    assert_eq!(rewrite(&plain, &nvidia).unwrap(), Vec::<Value>::new());
    // Settings apply only to a pod the webhook placed.
    let settings = rocm();
    assert_eq!(
        rewrite(&plain, &placement(Some(&settings))).unwrap(),
        Vec::<Value>::new()
    );
}

#[test]
fn an_init_container_asking_for_devices_is_rewritten_too_and_two_names_are_refused() {
    let mut pod = pod();
    pod["spec"]["initContainers"][0]["resources"] =
        json!({"limits": {"kaccel.io/accelerator": "1"}});
    let out = applied(&pod, &rewrite(&pod, &placement(None)).unwrap());
    assert_eq!(
        out["spec"]["initContainers"][0]["resources"],
        json!({"limits": {"amd.com/gpu": "1"}})
    );
    pod["spec"]["containers"][0]["resources"]["limits"]["amd.com/gpu"] = json!("8");
    let refused = rewrite(&pod, &placement(None)).unwrap_err();
    assert_eq!(
        refused.to_string(),
        "container \"train\" asks for both kaccel.io/accelerator and amd.com/gpu: ask for its devices by one name"
    );
    assert_eq!(
        rewrite(&json!({"spec": {}}), &placement(None)),
        Err(Refusal::NotAPod)
    );
}

#[test]
fn the_first_matching_settings_entry_wins() {
    let cuda = VendorPodSettings {
        vendors: vec![Vendor::Nvidia],
        image: Some("cuda".into()),
        ..Default::default()
    };
    let h100 = VendorPodSettings {
        models: vec!["*H100*".into()],
        image: Some("h100".into()),
        ..Default::default()
    };
    let any = VendorPodSettings {
        image: Some("any".into()),
        ..Default::default()
    };
    let list = [h100.clone(), cuda.clone(), rocm(), any.clone()];
    let pick = |vendor, model| settings_for(&list, vendor, model).and_then(|s| s.image.clone());
    assert_eq!(
        pick(Some(Vendor::Nvidia), "NVIDIA-H100-80GB-HBM3").as_deref(),
        Some("h100")
    );
    assert_eq!(
        pick(Some(Vendor::Nvidia), "NVIDIA-L40S").as_deref(),
        Some("cuda")
    );
    assert_eq!(
        pick(Some(Vendor::Amd), "AMD_Instinct_MI300X_OAM").as_deref(),
        Some("ghcr.io/acme/train:rocm")
    );
    assert_eq!(pick(Some(Vendor::Intel), "Gaudi3").as_deref(), Some("any"));
    assert_eq!(settings_for(&[cuda], Some(Vendor::Amd), "x"), None);
}

#[test]
fn review_responses_carry_the_uid_a_base64_json_patch_or_a_403() {
    let ops = vec![json!({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"})];
    let r = review_response("u-1", &Answer::Patch(ops.clone()));
    assert_eq!(r["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(r["response"]["uid"], "u-1");
    assert_eq!(r["response"]["allowed"], true);
    assert_eq!(r["response"]["patchType"], "JSONPatch");
    use base64::Engine as _;
    let patch = base64::engine::general_purpose::STANDARD
        .decode(r["response"]["patch"].as_str().unwrap())
        .unwrap();
    assert_eq!(serde_json::from_slice::<Vec<Value>>(&patch).unwrap(), ops);
    let allow = review_response("u-2", &Answer::Patch(vec![]));
    assert!(allow["response"].get("patch").is_none());
    assert_eq!(allow["response"]["allowed"], true);
    let deny = review_response("u-3", &Answer::Deny("no".into()));
    assert_eq!(deny["response"]["allowed"], false);
    assert_eq!(deny["response"]["status"]["code"], 403);
    assert_eq!(deny["response"]["status"]["message"], "no");
}

#[test]
fn the_runtime_class_is_set_only_where_the_pod_names_none() {
    let pod = pod();
    let nvidia = VendorPodSettings {
        vendors: vec![Vendor::Nvidia],
        runtime_class_name: Some("nvidia".into()),
        ..Default::default()
    };
    let placed = Placement {
        vendor_resource: "nvidia.com/gpu",
        vendor: Some(Vendor::Nvidia),
        model: "NVIDIA-H100-80GB-HBM3",
        flavor: "nvidia-h100-80gb-hbm3",
        ..placement(Some(&nvidia))
    };
    let out = applied(&pod, &rewrite(&pod, &placed).unwrap());
    assert_eq!(out["spec"]["runtimeClassName"], "nvidia");
    let mut own = pod.clone();
    own["spec"]["runtimeClassName"] = json!("kata");
    let out = applied(&own, &rewrite(&own, &placed).unwrap());
    assert_eq!(out["spec"]["runtimeClassName"], "kata");
}
