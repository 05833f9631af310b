//! Which Kueue kaccel can work with: every field kaccel writes or reads must be in
//! the `v1beta2` schema the cluster's Kueue CRDs serve.
//!
//! Checked once at start (`kaccel run`), because an older Kueue fails late and
//! quietly: the API server prunes a field its schema lacks from what kaccel applies
//! (a ClusterQueue would lose its AdmissionCheck, and admit unchecked), and a status
//! field kaccel reads would read as empty. Refusing at start names the release to
//! install instead.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray,
};

use super::VERSION;

/// The Kueue releases the e2e suite passes on (`KUEUE_SUPPORTED_VERSIONS` in
/// `e2e/versions.env`; a test keeps the two equal), newest first.
pub const TESTED_RELEASES: &[&str] = &["v0.17.1", "v0.17.0", "v0.16.6"];

/// What to install, said in every refusal.
pub const SUPPORTED_RANGE: &str = "v0.16 or v0.17 (tested: v0.17.1, v0.17.0, v0.16.6)";

/// Each Kueue CRD kaccel uses, and the fields of its `v1beta2` schema it writes or
/// reads. `[]` steps into a list's items.
pub const REQUIRED_FIELDS: &[(&str, &[&str])] = &[
    (
        "resourceflavors.kueue.x-k8s.io",
        &["spec.nodeLabels", "spec.tolerations", "spec.topologyName"],
    ),
    ("topologies.kueue.x-k8s.io", &["spec.levels[].nodeLabel"]),
    (
        "cohorts.kueue.x-k8s.io",
        &[
            "spec.parentName",
            "spec.resourceGroups[].coveredResources",
            "spec.resourceGroups[].flavors[].resources[].nominalQuota",
            "spec.fairSharing.weight",
        ],
    ),
    (
        "clusterqueues.kueue.x-k8s.io",
        &[
            "spec.cohortName",
            "spec.namespaceSelector",
            "spec.resourceGroups[].coveredResources",
            "spec.resourceGroups[].flavors[].name",
            "spec.resourceGroups[].flavors[].resources[].name",
            "spec.resourceGroups[].flavors[].resources[].nominalQuota",
            "spec.resourceGroups[].flavors[].resources[].borrowingLimit",
            "spec.resourceGroups[].flavors[].resources[].lendingLimit",
            "spec.queueingStrategy",
            "spec.flavorFungibility.whenCanBorrow",
            "spec.flavorFungibility.whenCanPreempt",
            "spec.preemption.reclaimWithinCohort",
            "spec.stopPolicy",
            "spec.fairSharing.weight",
            "spec.admissionChecksStrategy.admissionChecks[].name",
            "status.flavorsReservation[].resources[].total",
            "status.flavorsReservation[].resources[].borrowed",
            "status.flavorsUsage[].resources[].total",
            "status.pendingWorkloads",
            "status.admittedWorkloads",
        ],
    ),
    (
        "localqueues.kueue.x-k8s.io",
        &["spec.clusterQueue", "spec.stopPolicy"],
    ),
    (
        "admissionchecks.kueue.x-k8s.io",
        &["spec.controllerName", "status.conditions"],
    ),
    (
        "workloads.kueue.x-k8s.io",
        &[
            "spec.active",
            "spec.queueName",
            "spec.maximumExecutionTimeSeconds",
            "spec.podSets[].name",
            "spec.podSets[].count",
            "spec.podSets[].template.spec.containers[].resources.requests",
            "spec.podSets[].template.spec.resourceClaims[].resourceClaimTemplateName",
            "status.conditions",
            "status.admission.clusterQueue",
            "status.admission.podSetAssignments[].name",
            "status.admission.podSetAssignments[].flavors",
            "status.admission.podSetAssignments[].resourceUsage",
            "status.admission.podSetAssignments[].count",
            "status.admissionChecks[].name",
            "status.admissionChecks[].state",
            "status.admissionChecks[].message",
            "status.schedulingStats.evictions[].count",
        ],
    ),
];

/// One way the cluster's Kueue falls short of what kaccel needs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incompatible {
    #[error(
        "CustomResourceDefinition {crd} is not installed: install Kueue {SUPPORTED_RANGE}, whose CRDs kaccel writes and reads"
    )]
    NotInstalled { crd: String },
    #[error(
        "CustomResourceDefinition {crd} does not serve {VERSION} (it serves: {served}): upgrade Kueue to {SUPPORTED_RANGE}"
    )]
    NotServed { crd: String, served: String },
    #[error(
        "CustomResourceDefinition {crd} {VERSION} has no field {field}, which kaccel uses: upgrade Kueue to {SUPPORTED_RANGE}"
    )]
    MissingField { crd: String, field: String },
}

/// Every shortfall of the installed Kueue CRDs (`None`: that CRD is not installed),
/// in the order of [`REQUIRED_FIELDS`]; empty when kaccel can work with them.
pub fn check<'a>(
    installed: impl Fn(&str) -> Option<&'a CustomResourceDefinition>,
) -> Vec<Incompatible> {
    let mut problems = Vec::new();
    for (crd_name, fields) in REQUIRED_FIELDS {
        let Some(crd) = installed(crd_name) else {
            problems.push(Incompatible::NotInstalled {
                crd: crd_name.to_string(),
            });
            continue;
        };
        let versions = &crd.spec.versions;
        let Some(version) = versions.iter().find(|v| v.name == VERSION && v.served) else {
            let served: Vec<&str> = versions
                .iter()
                .filter(|v| v.served)
                .map(|v| v.name.as_str())
                .collect();
            problems.push(Incompatible::NotServed {
                crd: crd_name.to_string(),
                served: if served.is_empty() {
                    "none".into()
                } else {
                    served.join(", ")
                },
            });
            continue;
        };
        let root = version
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref());
        for field in *fields {
            if !root.is_some_and(|root| has_field(root, field)) {
                problems.push(Incompatible::MissingField {
                    crd: crd_name.to_string(),
                    field: field.to_string(),
                });
            }
        }
    }
    problems
}

/// Whether `path` (dot-separated, `[]` into a list's items) is in the schema. A
/// node that keeps unknown fields accepts any path below it, as the API server does.
fn has_field(root: &JSONSchemaProps, path: &str) -> bool {
    let mut node = root;
    for step in path.split('.') {
        if node.x_kubernetes_preserve_unknown_fields == Some(true) {
            return true;
        }
        let (name, into_items) = match step.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (step, false),
        };
        let Some(child) = node.properties.as_ref().and_then(|p| p.get(name)) else {
            return false;
        };
        node = child;
        if into_items {
            match &node.items {
                Some(JSONSchemaPropsOrArray::Schema(items)) => node = items,
                _ => return false,
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CRD serving `v1beta2` with just `fields` (each with its list steps), as a
    /// Kueue CRD carrying exactly those would.
    fn crd_with(name: &str, fields: &[&str]) -> CustomResourceDefinition {
        let mut root = serde_json::json!({"type": "object", "properties": {}});
        for field in fields {
            let mut node = &mut root;
            for step in field.split('.') {
                let (key, list) = match step.strip_suffix("[]") {
                    Some(key) => (key, true),
                    None => (step, false),
                };
                let props = node["properties"].as_object_mut().unwrap();
                let child = props.entry(key).or_insert_with(|| {
                    if list {
                        serde_json::json!({"type": "array", "items": {"type": "object", "properties": {}}})
                    } else {
                        serde_json::json!({"type": "object", "properties": {}})
                    }
                });
                node = if list { &mut child["items"] } else { child };
            }
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": name},
            "spec": {
                "group": "kueue.x-k8s.io",
                "names": {"kind": "X", "plural": name.split('.').next().unwrap()},
                "scope": "Cluster",
                "versions": [
                    {"name": "v1beta1", "served": true, "storage": false},
                    {"name": "v1beta2", "served": true, "storage": true,
                     "schema": {"openAPIV3Schema": root}}
                ]
            }
        }))
        .unwrap()
    }

    fn complete() -> Vec<CustomResourceDefinition> {
        REQUIRED_FIELDS
            .iter()
            .map(|(name, fields)| crd_with(name, fields))
            .collect()
    }

    fn check_of(crds: &[CustomResourceDefinition]) -> Vec<Incompatible> {
        check(|name| {
            crds.iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))
        })
    }

    #[test]
    fn crds_carrying_every_field_pass() {
        assert_eq!(check_of(&complete()), vec![]);
    }

    #[test]
    fn each_missing_field_is_named_with_its_crd() {
        for (crd_name, fields) in REQUIRED_FIELDS {
            for (i, missing) in fields.iter().enumerate() {
                let mut crds = complete();
                let others: Vec<&str> = fields
                    .iter()
                    .enumerate()
                    .filter(|(j, _)| *j != i)
                    .map(|(_, f)| *f)
                    .collect();
                let at = crds
                    .iter()
                    .position(|c| c.metadata.name.as_deref() == Some(crd_name))
                    .unwrap();
                crds[at] = crd_with(crd_name, &others);
                // Every listed path ends at a leaf: dropping one drops no other.
                let problems = check_of(&crds);
                assert_eq!(
                    problems,
                    vec![Incompatible::MissingField {
                        crd: crd_name.to_string(),
                        field: missing.to_string()
                    }],
                    "{crd_name} without {missing}"
                );
                let message = problems[0].to_string();
                assert!(
                    message.contains(missing) && message.contains("upgrade Kueue to v0.16"),
                    "{message}"
                );
            }
        }
    }

    #[test]
    fn a_crd_not_installed_or_not_serving_v1beta2_is_named() {
        let mut crds = complete();
        crds.retain(|c| c.metadata.name.as_deref() != Some("cohorts.kueue.x-k8s.io"));
        let cq = crds
            .iter_mut()
            .find(|c| c.metadata.name.as_deref() == Some("clusterqueues.kueue.x-k8s.io"))
            .unwrap();
        cq.spec.versions[1].served = false;
        let problems = check_of(&crds);
        assert_eq!(
            problems,
            vec![
                Incompatible::NotInstalled {
                    crd: "cohorts.kueue.x-k8s.io".into()
                },
                Incompatible::NotServed {
                    crd: "clusterqueues.kueue.x-k8s.io".into(),
                    served: "v1beta1".into()
                },
            ]
        );
        assert!(
            problems[1]
                .to_string()
                .contains("does not serve v1beta2 (it serves: v1beta1)")
        );
    }

    #[test]
    fn a_list_step_needs_items_and_unknown_fields_accept_any_path() {
        let crd = crd_with("x", &["spec.groups"]);
        let root = crd.spec.versions[1]
            .schema
            .as_ref()
            .unwrap()
            .open_api_v3_schema
            .as_ref()
            .unwrap();
        assert!(has_field(root, "spec.groups"));
        assert!(
            !has_field(root, "spec.groups[].name"),
            "an object is no list"
        );
        assert!(!has_field(root, "spec.other"));
        let mut open = root.clone();
        open.properties
            .as_mut()
            .unwrap()
            .get_mut("spec")
            .unwrap()
            .x_kubernetes_preserve_unknown_fields = Some(true);
        assert!(has_field(&open, "spec.anything[].at.all"));
    }

    #[test]
    fn the_tested_releases_are_those_the_e2e_scripts_run() {
        let versions_env = include_str!("../../e2e/versions.env");
        let supported = versions_env
            .lines()
            .find_map(|l| l.strip_prefix("KUEUE_SUPPORTED_VERSIONS="))
            .expect("KUEUE_SUPPORTED_VERSIONS in e2e/versions.env")
            .trim_matches('"');
        assert_eq!(supported.split(' ').collect::<Vec<_>>(), TESTED_RELEASES);
        let default = versions_env
            .lines()
            .find_map(|l| l.strip_prefix("KUEUE_VERSION="))
            .unwrap();
        assert_eq!(default, TESTED_RELEASES[0], "the suite runs the newest");
        assert!(SUPPORTED_RANGE.contains(&TESTED_RELEASES.join(", ")));
    }
}
