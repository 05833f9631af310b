//! `kaccel run`: the thin I/O shell around the planner.
//!
//! Watches feed in-memory caches (reflectors). Any event marks the world dirty; after
//! a short quiet period one reconcile runs (paced: see `run::Pace`), in named stages:
//! observe (snapshot the caches) -> plan (pure) -> diff (pure) -> apply (server-side
//! apply / delete, only what differs) -> status (only what differs) -> events.
//! Only the replica holding the leader Lease reconciles.
//!
//! Files by job: `run` (startup, leader election, the paced loop), `watches`
//! (caches), `reconcile` (the stages in order), `apply`, `node_actions`, `status`,
//! `name_conflicts`, `pricing` (the ledger's inputs), `events`; `diff` is pure.

pub(crate) mod allocator;
mod apply;
pub mod config;
mod credits;
pub mod diff;
mod events;
mod health_poller;
mod holders;
mod http;
mod kueue_check;
mod managed_cache;
mod metrics;
mod multikueue;
mod name_conflicts;
mod node_actions;
mod pod_webhook;
mod pricing_snapshot;
mod reconcile;
mod run;
mod status_writes;
mod watches;

use kube::core::ApiResource;

pub use config::Config;
use diff::Kind;
// credits/ reaches these through `crate::controller::` / `super::`.
use events::publish_event;
use run::receiver_stream;
pub use run::run;
pub use status_writes::LEDGER_IN_SYNC;

/// Failures a platform engineer can act on; `metric_label` names each in metrics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API error during {action}: {source}")]
    Api {
        action: String,
        #[source]
        source: kube::Error,
    },
    #[error("cannot reach the cluster: {0}")]
    Connect(String),
    #[error("leader election failed: {0}")]
    LeaderElection(String),
    #[error("HTTP server on {address} failed: {source}")]
    Http {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("pod webhook: {0}")]
    Webhook(String),
    #[error("the installed Kueue lacks what kaccel needs: {0}")]
    KueueIncompatible(String),
    #[error(
        "{target} already exists and is not this kaccel installation's ({holder}): kaccel will not change an object it did not create; rename or delete it"
    )]
    Unmanaged { target: String, holder: String },
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            // A denial is the operator's to fix (RBAC, the node guard): its own label.
            Error::Api {
                source: kube::Error::Api(status),
                ..
            } if status.code == 403 => "forbidden",
            Error::Api { .. } => "api",
            Error::Connect(_) => "connect",
            Error::LeaderElection(_) => "leader_election",
            Error::Http { .. } => "http",
            Error::Unmanaged { .. } => "unmanaged_conflict",
            Error::Webhook(_) => "webhook",
            Error::KueueIncompatible(_) => "kueue_incompatible",
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

/// The API resource of a kind kaccel writes.
fn managed_resource(kind: Kind) -> ApiResource {
    match kind {
        Kind::DeviceClass => crate::k8s::resources::device_class(),
        Kind::DeviceTaintRule => crate::k8s::resources::device_taint_rule(),
        kind => crate::k8s::resources::kueue(kind.as_str()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_is_counted_under_its_own_label() {
        let api = Error::Api {
            action: "applying ClusterQueue x".into(),
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("not found", "NotFound").with_code(404),
            )),
        };
        let http = Error::Http {
            address: "127.0.0.1:8080".parse().unwrap(),
            source: std::io::Error::from(std::io::ErrorKind::AddrInUse),
        };
        let denied = Error::Api {
            action: "patching Node n".into(),
            source: kube::Error::Api(Box::new(
                kube::core::Status::failure("nodes \"n\" is forbidden", "Forbidden").with_code(403),
            )),
        };
        let unmanaged = Error::Unmanaged {
            target: "ClusterQueue x".into(),
            holder: "managed by terraform".into(),
        };
        let labels: Vec<&str> = [
            api,
            denied,
            Error::Connect("no kubeconfig".into()),
            Error::LeaderElection("lost the Lease".into()),
            http,
            unmanaged,
        ]
        .iter()
        .map(Error::metric_label)
        .collect();
        assert_eq!(
            labels,
            [
                "api",
                "forbidden",
                "connect",
                "leader_election",
                "http",
                "unmanaged_conflict"
            ]
        );
    }

    #[test]
    fn a_refused_write_says_what_kaccel_was_doing() {
        let e = api_err("applying ClusterQueue team-a")(kube::Error::Api(Box::new(
            kube::core::Status::failure("forbidden", "Forbidden").with_code(403),
        )));
        assert!(
            matches!(&e, Error::Api { action, .. } if action == "applying ClusterQueue team-a")
        );
        assert!(
            e.to_string()
                .contains("during applying ClusterQueue team-a"),
            "{e}"
        );
    }

    #[test]
    fn managed_objects_are_addressed_by_kind_in_their_group() {
        let plurals: Vec<(String, String)> = Kind::ALL
            .into_iter()
            .map(|kind| {
                let ar = managed_resource(kind);
                let (group, version) = match kind {
                    Kind::DeviceClass => ("resource.k8s.io", "v1"),
                    Kind::DeviceTaintRule => ("resource.k8s.io", "v1alpha3"),
                    _ => (crate::kueue::GROUP, crate::kueue::VERSION),
                };
                assert_eq!((ar.group.as_str(), ar.version.as_str()), (group, version));
                assert_eq!(ar.kind, kind.as_str());
                (ar.kind, ar.plural)
            })
            .collect();
        assert_eq!(
            plurals,
            [
                ("DeviceClass", "deviceclasses"),
                ("DeviceTaintRule", "devicetaintrules"),
                ("Topology", "topologies"),
                ("ResourceFlavor", "resourceflavors"),
                ("Cohort", "cohorts"),
                ("ClusterQueue", "clusterqueues"),
                ("LocalQueue", "localqueues"),
            ]
            .map(|(k, p)| (k.to_string(), p.to_string()))
        );
    }
}
