//! The CustomResourceDefinitions, generated from the Rust types. `crds/` holds the
//! committed copy; a test fails when it drifts from what these functions produce.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::api::{AcceleratorClass, CreditBudget};

/// Every CRD kaccel owns, with the file name it is committed under in `crds/`.
pub fn all() -> Vec<(&'static str, CustomResourceDefinition)> {
    vec![
        ("acceleratorclasses.kaccel.io.yaml", AcceleratorClass::crd()),
        ("creditbudgets.kaccel.io.yaml", CreditBudget::crd()),
    ]
}

/// One CRD as the YAML committed in `crds/`.
pub fn to_yaml(crd: &CustomResourceDefinition) -> String {
    serde_yaml::to_string(crd).expect("a CRD always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `crds/` must be exactly what the types generate: regenerate with
    /// `cargo run -- crds --out crds` after changing src/api.
    #[test]
    fn committed_crds_match_the_rust_types() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/crds");
        for (file, crd) in all() {
            let path = format!("{dir}/{file}");
            let committed = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{path}: {e}; run `cargo run -- crds --out crds`"));
            assert_eq!(
                committed,
                to_yaml(&crd),
                "{path} drifted from src/api: run `cargo run -- crds --out crds` and commit"
            );
        }
    }

    #[test]
    fn crds_carry_cel_rules_and_printer_columns() {
        for (file, crd) in all() {
            let yaml = to_yaml(&crd);
            assert!(
                yaml.contains("x-kubernetes-validations"),
                "{file} has no CEL rules"
            );
            assert!(
                yaml.contains("additionalPrinterColumns"),
                "{file} has no columns"
            );
            assert_eq!(crd.spec.scope, "Cluster", "{file} must be cluster-scoped");
        }
    }
}
