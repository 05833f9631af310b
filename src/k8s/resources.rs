//! The API groups, versions and resources kaccel reads and writes through the
//! dynamic client, built in one place so a version bump is one edit.

use kube::core::{ApiResource, GroupVersionKind};

/// Kueue's API group.
pub const KUEUE_GROUP: &str = "kueue.x-k8s.io";
/// The Kueue API version kaccel reads and writes (Kueue v0.17 serves it).
pub const KUEUE_VERSION: &str = "v1beta2";

/// A Kueue kind (`Workload`, `ClusterQueue`, `ResourceFlavor`, `AdmissionCheck`,
/// ...) as the dynamic client addresses it.
pub fn kueue(kind: &str) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(KUEUE_GROUP, KUEUE_VERSION, kind))
}

/// `resource.k8s.io/v1` DeviceClass: kaccel writes one per DRA-only flavor.
pub fn device_class() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&())
}

/// `resource.k8s.io/v1alpha3` DeviceTaintRules (the only version Kubernetes 1.35
/// serves them in, behind `--runtime-config`).
pub fn device_taint_rule() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::resource::v1alpha3::DeviceTaintRule>(&())
}

/// `kueue.x-k8s.io/v1beta2`, for the `apiVersion` of objects kaccel applies.
pub fn kueue_api_version() -> String {
    format!("{KUEUE_GROUP}/{KUEUE_VERSION}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kueue_resources_have_the_plurals_kueue_serves() {
        // The plurals of Kueue's CRDs (config/components/crd/bases in Kueue v0.17).
        for (kind, plural) in [
            ("Workload", "workloads"),
            ("ClusterQueue", "clusterqueues"),
            ("LocalQueue", "localqueues"),
            ("ResourceFlavor", "resourceflavors"),
            ("AdmissionCheck", "admissionchecks"),
            ("Cohort", "cohorts"),
        ] {
            let r = kueue(kind);
            assert_eq!(r.plural, plural);
            assert_eq!(r.api_version, "kueue.x-k8s.io/v1beta2");
            assert_eq!(r.kind, kind);
        }
        assert_eq!(kueue_api_version(), "kueue.x-k8s.io/v1beta2");
    }
}
