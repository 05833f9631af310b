//! Who holds each device: for every pod an exporter attributes a device to, read the
//! pod's metadata (Kueue's Workload annotation and queue labels) and the team label of
//! its ClusterQueue, and keep the result in the tracker for `/devices`.
//!
//! On DRA nodes, the pods come from the ResourceClaims devices are allocated
//! through (a watch kept to their allocation and reservations), each device tied to
//! its node, UUID and PCI address by its ResourceSlice, so the tracker can match it
//! to the exporter's reading and the ledger can name it.
//!
//! Only pods that exporters or claims name are read (one metadata GET when a pod first appears,
//! again every [`REFRESH_SECONDS`] while it holds a device), so the cost follows the
//! busy devices, never the cluster's pods. What cannot be read stays unresolved, with
//! why; nothing is guessed (`src/inventory/holders.rs`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::Store;
use kube::{Client, ResourceExt};

use super::health_poller::{SharedTracker, now_seconds};
use crate::inventory::holders::{
    ClaimedDevice, DraDeviceId, Holder, claimed_devices, holder, pod_ownership,
};
use crate::inventory::published_ids;
use crate::k8s::labels::TEAM_LABEL;

/// How often the resolver looks for newly attributed pods.
const INTERVAL: Duration = Duration::from_secs(5);
/// A resolved pod is read again after this long (its Workload may have changed
/// after an eviction and re-admission).
const REFRESH_SECONDS: i64 = 60;

/// Resolve holders until the process ends.
pub async fn run(
    client: Client,
    tracker: SharedTracker,
    claims: Option<Store<ResourceClaim>>,
    slices: Option<Store<ResourceSlice>>,
) {
    let mut resolved_at: BTreeMap<(String, String), i64> = BTreeMap::new();
    let mut teams: BTreeMap<String, (String, i64)> = BTreeMap::new();
    loop {
        if let Some(claims) = &claims {
            let claimed = claimed_with_ids(claims, slices.as_ref());
            tracker.lock().expect("tracker lock").set_claimed(claimed);
        }
        resolve_once(&client, &tracker, &mut resolved_at, &mut teams).await;
        tokio::time::sleep(INTERVAL).await;
    }
}

async fn resolve_once(
    client: &Client,
    tracker: &SharedTracker,
    resolved_at: &mut BTreeMap<(String, String), i64>,
    teams: &mut BTreeMap<String, (String, i64)>,
) {
    let now = now_seconds();
    let wanted = tracker.lock().expect("tracker lock").attributed_pods();
    resolved_at.retain(|k, _| wanted.contains(k));
    let mut found = Vec::new();
    for (namespace, pod) in &wanted {
        if resolved_at
            .get(&(namespace.clone(), pod.clone()))
            .is_some_and(|t| now - t < REFRESH_SECONDS)
        {
            continue;
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let h = match pods.get_metadata_opt(pod).await {
            Ok(Some(meta)) => {
                let ownership = pod_ownership(&meta.metadata);
                let mut known = BTreeMap::new();
                if let Some(cq) = &ownership.cluster_queue
                    && let Some(team) = team_of(client, cq, teams, now).await
                {
                    known.insert(cq.clone(), team);
                }
                holder(namespace, pod, None, Some(&ownership), &known)
            }
            Ok(None) => Holder {
                unresolved: Some("pod not found".into()),
                ..holder(namespace, pod, None, None, &BTreeMap::new())
            },
            Err(e) => {
                tracing::debug!(%namespace, %pod, error = %e, "cannot read an attributed pod");
                Holder {
                    unresolved: Some(format!("cannot read the pod: {e}")),
                    ..holder(namespace, pod, None, None, &BTreeMap::new())
                }
            }
        };
        resolved_at.insert((namespace.clone(), pod.clone()), now);
        found.push(h);
    }
    let mut t = tracker.lock().expect("tracker lock");
    t.holders.retain(|k, _| wanted.contains(k));
    for h in found {
        t.holders.insert((h.namespace.clone(), h.pod.clone()), h);
    }
}

/// The devices pods hold through ResourceClaims, each with the node, UUID and PCI
/// address its ResourceSlice publishes (the newest generation of its pool).
fn claimed_with_ids(
    claims: &Store<ResourceClaim>,
    slices: Option<&Store<ResourceSlice>>,
) -> BTreeMap<DraDeviceId, ClaimedDevice> {
    let claims = claims.state();
    let mut claimed = claimed_devices(claims.iter().map(|c| c.as_ref()));
    if claimed.is_empty() {
        return claimed;
    }
    let slices = slices.map(|s| s.state()).unwrap_or_default();
    let mut pools: BTreeMap<(&str, &str), Vec<&ResourceSlice>> = BTreeMap::new();
    for slice in &slices {
        let pool = pools
            .entry((slice.spec.driver.as_str(), slice.spec.pool.name.as_str()))
            .or_default();
        let newest = pool.first().map(|s| s.spec.pool.generation);
        match newest {
            Some(g) if g > slice.spec.pool.generation => {}
            Some(g) if g < slice.spec.pool.generation => *pool = vec![slice.as_ref()],
            _ => pool.push(slice.as_ref()),
        }
    }
    for c in claimed.values_mut() {
        let found = pools
            .get(&(c.id.driver.as_str(), c.id.pool.as_str()))
            .into_iter()
            .flatten()
            .find_map(|slice| published_ids(slice, &c.id.device));
        if let Some(ids) = found {
            c.node = ids.node;
            c.uuid = ids.uuid;
            c.pci_address = ids.pci_address;
        }
    }
    claimed
}

/// The `kaccel.io/team` label of a ClusterQueue (cached for [`REFRESH_SECONDS`]).
async fn team_of(
    client: &Client,
    cluster_queue: &str,
    teams: &mut BTreeMap<String, (String, i64)>,
    now: i64,
) -> Option<String> {
    if let Some((team, at)) = teams.get(cluster_queue)
        && now - at < REFRESH_SECONDS
    {
        return (!team.is_empty()).then(|| team.clone());
    }
    let api: Api<PartialObjectMeta<kube::api::DynamicObject>> = Api::all_with(
        client.clone(),
        &crate::k8s::resources::kueue("ClusterQueue"),
    );
    let team = match api.get_metadata_opt(cluster_queue).await {
        Ok(Some(cq)) => cq.labels().get(TEAM_LABEL).cloned().unwrap_or_default(),
        Ok(None) => String::new(),
        Err(e) => {
            tracing::debug!(%cluster_queue, error = %e, "cannot read a ClusterQueue");
            return None;
        }
    };
    teams.insert(cluster_queue.to_string(), (team.clone(), now));
    (!team.is_empty()).then_some(team)
}
