//! `kaccel run`: the thin I/O shell around the planner.
//!
//! Watches feed in-memory caches (reflectors). Any event marks the world dirty; after
//! a short quiet period (debounce) one reconcile runs, in named stages:
//! observe (snapshot the caches) -> plan (pure) -> diff (pure) -> apply (server-side
//! apply / delete, only what differs) -> status (only what differs) -> events.
//! Only the replica holding the leader Lease reconciles.
//!
//! Files by job: `run` (startup, leader election, the debounced loop), `watches`
//! (caches), `reconcile` (the stages in order), `apply`, `node_actions`, `status`,
//! `name_conflicts`, `pricing` (the ledger's inputs), `events`; `diff` is pure.

mod allocator;
mod apply;
pub mod config;
mod credits;
pub mod diff;
mod events;
mod health_poller;
mod http;
mod metrics;
mod name_conflicts;
mod node_actions;
mod pricing;
mod reconcile;
mod run;
mod status;
mod watches;

use kube::core::{ApiResource, GroupVersionKind};

pub use config::Config;
use diff::Kind;
// credits/ reaches these through `crate::controller::` / `super::`.
use events::publish_event;
use run::receiver_stream;
pub use run::run;
pub use status::LEDGER_IN_SYNC;

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
    #[error(
        "{target} already exists and is not kaccel's ({holder}): kaccel will not change an object it did not create; rename or delete it"
    )]
    Unmanaged { target: String, holder: String },
}

impl Error {
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Api { .. } => "api",
            Error::Connect(_) => "connect",
            Error::LeaderElection(_) => "leader_election",
            Error::Http { .. } => "http",
            Error::Unmanaged { .. } => "unmanaged_conflict",
        }
    }
}

fn api_err(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Error {
    let action = action.into();
    move |source| Error::Api { action, source }
}

fn kueue_resource(kind: Kind) -> ApiResource {
    ApiResource::from_gvk(&GroupVersionKind::gvk(
        crate::kueue::GROUP,
        crate::kueue::VERSION,
        kind.as_str(),
    ))
}
