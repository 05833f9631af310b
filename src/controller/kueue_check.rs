//! Start-up check of the cluster's Kueue (`crate::kueue::compat`): read the CRDs
//! kaccel uses once, refuse to run on one that lacks a field kaccel writes or reads.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{Api, Client};

use super::Error;
use crate::kueue::compat;

pub async fn check_kueue(client: &Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut installed = Vec::with_capacity(compat::REQUIRED_FIELDS.len());
    for (name, _) in compat::REQUIRED_FIELDS {
        let crd = api.get_opt(name).await.map_err(super::api_err(format!(
            "reading CustomResourceDefinition {name} (kaccel checks Kueue's schema at start: \
             grant get on it, as manifests/clusterrole.yaml does)"
        )))?;
        installed.extend(crd);
    }
    let problems = compat::check(|name| {
        installed
            .iter()
            .find(|crd| crd.metadata.name.as_deref() == Some(name))
    });
    if problems.is_empty() {
        tracing::info!(
            crds = compat::REQUIRED_FIELDS.len(),
            "Kueue's CRDs serve every field kaccel uses"
        );
        return Ok(());
    }
    for problem in &problems {
        tracing::error!("{problem}");
    }
    Err(Error::KueueIncompatible(
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; "),
    ))
}
