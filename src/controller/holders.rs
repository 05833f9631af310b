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
use crate::inventory::{PublishedIds, newest_generations, published_ids};
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
    let mut ids = IdsCache::new();
    loop {
        if let Some(claims) = &claims {
            let claimed = claimed_with_ids(claims, slices.as_ref(), &mut ids);
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

/// What each claimed device's slice said of it, by the slice's resourceVersion:
/// a device is read again only when its slice changed.
type IdsCache = BTreeMap<DraDeviceId, (String, Option<PublishedIds>)>;

/// The devices pods hold through ResourceClaims, each with the node, UUID and PCI
/// address its ResourceSlice publishes (the newest generation of its pool).
fn claimed_with_ids(
    claims: &Store<ResourceClaim>,
    slices: Option<&Store<ResourceSlice>>,
    cache: &mut IdsCache,
) -> BTreeMap<DraDeviceId, ClaimedDevice> {
    let claims = claims.state();
    let mut claimed = claimed_devices(claims.iter().map(|c| c.as_ref()));
    cache.retain(|id, _| claimed.contains_key(id));
    if claimed.is_empty() {
        return claimed;
    }
    let slices = slices.map(|s| s.state()).unwrap_or_default();
    let newest = newest_generations(slices.iter().map(|s| s.as_ref()));
    let mut pools: BTreeMap<(&str, &str), Vec<&ResourceSlice>> = BTreeMap::new();
    for slice in &slices {
        let pool = (slice.spec.driver.as_str(), slice.spec.pool.name.as_str());
        if newest.get(&pool) == Some(&slice.spec.pool.generation) {
            pools.entry(pool).or_default().push(slice.as_ref());
        }
    }
    // Each pool's slices' versions: what a cached reading was taken from.
    let versions: BTreeMap<(&str, &str), String> = pools
        .iter()
        .map(|(k, slices)| {
            let version = slices
                .iter()
                .map(|s| s.metadata.resource_version.as_deref().unwrap_or_default())
                .collect::<Vec<_>>()
                .join(",");
            (*k, version)
        })
        .collect();
    for c in claimed.values_mut() {
        let key = (c.id.driver.as_str(), c.id.pool.as_str());
        let pool = pools.get(&key).map(Vec::as_slice).unwrap_or_default();
        let version = versions.get(&key).map(String::as_str).unwrap_or_default();
        let found = match cache.get(&c.id) {
            Some((seen, ids)) if seen == version => ids.clone(),
            _ => {
                let ids = pool
                    .iter()
                    .find_map(|slice| published_ids(slice, &c.id.device));
                cache.insert(c.id.clone(), (version.to_string(), ids.clone()));
                ids
            }
        };
        c.ids = found.unwrap_or_default();
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

#[cfg(test)]
mod tests {
    use kube::runtime::{reflector, watcher};
    use serde_json::json;

    use super::*;

    fn store<K>(objects: &[K]) -> Store<K>
    where
        K: kube::Resource<DynamicType = ()> + Clone + 'static,
    {
        let (reader, mut writer) = reflector::store();
        for o in objects {
            writer.apply_watcher_event(&watcher::Event::Apply(o.clone()));
        }
        reader
    }

    /// gpu-1 of node-a as NVIDIA's DRA driver publishes it, in a slice at `version`.
    fn slice(version: &str, uuid: &str) -> ResourceSlice {
        serde_json::from_value(json!({
            "metadata": {"name": "node-a-gpu", "resourceVersion": version},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": "node-a",
                     "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-1", "attributes": {
                         "type": {"string": "gpu"}, "uuid": {"string": uuid},
                         "productName": {"string": "NVIDIA H100 80GB HBM3"}}}]},
        }))
        .expect("a ResourceSlice")
    }

    fn claim() -> ResourceClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "train-0-gpus", "namespace": "ml"},
            "spec": {},
            "status": {"allocation": {"devices": {"results": [
                           {"request": "gpus", "driver": "gpu.nvidia.com", "pool": "node-a", "device": "gpu-1"}]}},
                       "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "u1"}]},
        }))
        .expect("a ResourceClaim")
    }

    #[test]
    fn a_claimed_device_is_tied_to_its_node_and_uuid_and_read_again_when_its_slice_changes() {
        let claims = store(&[claim()]);
        let mut cache = IdsCache::new();
        let uuid_of = |slices: &Store<ResourceSlice>, cache: &mut IdsCache| {
            let claimed = claimed_with_ids(&claims, Some(slices), cache);
            let c = claimed.values().next().expect("one claimed device").clone();
            (c.ids.node, c.ids.uuid, c.pods)
        };
        let v1 = store(&[slice("1", "GPU-aaaa")]);
        assert_eq!(
            uuid_of(&v1, &mut cache),
            (
                Some("node-a".into()),
                Some("GPU-aaaa".into()),
                vec!["train-0".to_string()]
            )
        );
        assert_eq!(cache.len(), 1);
        // A new version of the slice is read again (the cache is not trusted).
        let v2 = store(&[slice("2", "GPU-bbbb")]);
        assert_eq!(uuid_of(&v2, &mut cache).1.as_deref(), Some("GPU-bbbb"));
        // The slice gone: the device is still held, its identity unknown.
        let none = store::<ResourceSlice>(&[]);
        assert_eq!(
            uuid_of(&none, &mut cache),
            (None, None, vec!["train-0".to_string()])
        );
        // The claim released: nothing held, nothing cached.
        let released = claimed_with_ids(&store::<ResourceClaim>(&[]), Some(&v2), &mut cache);
        assert!(released.is_empty() && cache.is_empty());
    }
}
