//! Start-up check of the cluster's Kueue (`crate::kueue::compat`): read the CRDs
//! kaccel uses once, refuse to run on one that lacks a field kaccel writes or reads.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use std::time::{Duration, Instant};

use kube::{Api, Client};

use super::Error;
use crate::kueue::compat;

/// How long an API server that does not answer yet (kaccel started beside it) is
/// waited for before the check gives up.
const UNREACHABLE_FOR_AT_MOST: Duration = Duration::from_secs(120);

pub async fn check_kueue(client: &Client) -> Result<(), Error> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut installed = Vec::with_capacity(compat::REQUIRED_FIELDS.len());
    let give_up = Instant::now() + UNREACHABLE_FOR_AT_MOST;
    let mut backoff = Duration::from_secs(1);
    for (name, _) in compat::REQUIRED_FIELDS {
        let crd = loop {
            match api.get_opt(name).await {
                Ok(crd) => break crd,
                // Not answering yet, or overloaded: wait; a refusal (403) or any
                // other answer is final and said at once.
                Err(e) if transient(&e) && Instant::now() < give_up => {
                    tracing::warn!(crd = %name, error = %e, retry_in = ?backoff, "cannot read Kueue's CRD yet");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Err(e) => {
                    return Err(super::api_err(format!(
                        "reading CustomResourceDefinition {name} (kaccel checks Kueue's schema at start: \
                         grant get on it, as manifests/clusterrole.yaml does)"
                    ))(e));
                }
            }
        };
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

/// A failure worth waiting out: no connection, or the API server busy or starting.
fn transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => matches!(status.code, 429 | 500 | 502 | 503 | 504),
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_unreachable_or_busy_api_server_is_waited_for() {
        let answered = |code: u16| {
            kube::Error::Api(Box::new(
                kube::core::Status::failure("x", "X").with_code(code),
            ))
        };
        assert!(transient(&answered(503)));
        assert!(transient(&answered(429)));
        assert!(!transient(&answered(403)), "RBAC missing: said at once");
        assert!(!transient(&answered(404)));
        assert!(transient(&kube::Error::Service(Box::new(
            std::io::Error::other("connection refused")
        ))));
    }
}
