//! The Kueue objects kaccel manages, as their watches last delivered them, each
//! held as one compact JSON text.
//!
//! kube-runtime's reflector keeps a `DynamicObject` per object: a tree of
//! `serde_json` maps, each a B-tree node of eleven slots however few keys it
//! holds. At 5,000 Nodes, 50 classes and 200 budgets kaccel manages 4,300
//! objects (800 ClusterQueues with a resource group per flavor), and those
//! trees were a third of its heap: 34 MB (`e2e/bench-controller.sh scale`
//! under heaptrack). As text the same objects take a tenth of that. They are
//! read whole only when the diff compares one that may have moved (the
//! in-sync record skips the rest), when the budget pass compares queues with
//! the ledger, and for one ClusterQueue at an admission: parsing then costs
//! what turning the tree into a `Value` cost before.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::api::DynamicObject;
use kube::runtime::watcher;
use serde_json::Value;

use super::diff::live_fingerprint;

/// One object: what identifies it, and the rest as text.
#[derive(Debug)]
pub struct LiveObject {
    pub namespace: Option<String>,
    pub name: String,
    /// [`live_fingerprint`]: moves when what the diff reads moves, not at a
    /// status write.
    pub fingerprint: u64,
    json: Box<str>,
}

impl LiveObject {
    fn of(object: &DynamicObject) -> LiveObject {
        LiveObject {
            namespace: object.metadata.namespace.clone(),
            name: object.metadata.name.clone().unwrap_or_default(),
            fingerprint: live_fingerprint(object),
            // A DynamicObject is JSON already: it always serialises.
            json: serde_json::to_string(object)
                .expect("a watched object serialises")
                .into_boxed_str(),
        }
    }

    /// The object as JSON, as `serde_json::to_value` of the watched object gave it.
    pub fn value(&self) -> Value {
        self.read().expect("text written by serde_json parses")
    }

    /// The object read as `T`.
    pub fn read<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_str(&self.json)
    }
}

type Key = (Option<String>, String);

#[derive(Default)]
struct State {
    objects: HashMap<Key, Arc<LiveObject>>,
    /// Filled during a (re-)list and swapped in when it is done, as the
    /// reflector does: an object deleted while the watch was down is not in
    /// the new list.
    relisting: Option<HashMap<Key, Arc<LiveObject>>>,
}

/// Reads the cache; clones share it.
#[derive(Clone)]
pub struct ManagedCache {
    state: Arc<RwLock<State>>,
    ready: tokio::sync::watch::Receiver<bool>,
}

/// Feeds one watch's events into its [`ManagedCache`].
pub struct ManagedWriter {
    state: Arc<RwLock<State>>,
    ready: tokio::sync::watch::Sender<bool>,
}

/// An empty cache and its writer; the cache is ready after the first list.
pub fn managed_cache() -> (ManagedCache, ManagedWriter) {
    let state = Arc::new(RwLock::new(State::default()));
    let (ready_tx, ready_rx) = tokio::sync::watch::channel(false);
    (
        ManagedCache {
            state: state.clone(),
            ready: ready_rx,
        },
        ManagedWriter {
            state,
            ready: ready_tx,
        },
    )
}

fn key_of(object: &DynamicObject) -> Key {
    (
        object.metadata.namespace.clone(),
        object.metadata.name.clone().unwrap_or_default(),
    )
}

impl ManagedWriter {
    pub fn apply(&mut self, event: &watcher::Event<DynamicObject>) {
        let mut state = self.state.write().expect("managed cache lock");
        match event {
            watcher::Event::Init => state.relisting = Some(HashMap::new()),
            watcher::Event::InitApply(o) => {
                let object = Arc::new(LiveObject::of(o));
                state
                    .relisting
                    .get_or_insert_default()
                    .insert(key_of(o), object);
            }
            watcher::Event::InitDone => {
                if let Some(listed) = state.relisting.take() {
                    state.objects = listed;
                }
                drop(state);
                self.ready.send_replace(true);
            }
            watcher::Event::Apply(o) => {
                state.objects.insert(key_of(o), Arc::new(LiveObject::of(o)));
            }
            watcher::Event::Delete(o) => {
                state.objects.remove(&key_of(o));
            }
        }
    }
}

impl ManagedCache {
    /// Every object held.
    pub fn state(&self) -> Vec<Arc<LiveObject>> {
        let state = self.state.read().expect("managed cache lock");
        state.objects.values().cloned().collect()
    }

    /// The object `namespace`/`name` (namespace None for cluster-scoped kinds).
    pub fn get(&self, namespace: Option<&str>, name: &str) -> Option<Arc<LiveObject>> {
        let state = self.state.read().expect("managed cache lock");
        state
            .objects
            .get(&(namespace.map(str::to_string), name.to_string()))
            .cloned()
    }

    /// Waits until the first list is in.
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.clone();
        let _ = ready.wait_for(|r| *r).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(namespace: Option<&str>, name: &str, version: &str, spec: Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": if namespace.is_some() { "LocalQueue" } else { "ClusterQueue" },
            "metadata": {
                "name": name, "namespace": namespace, "resourceVersion": version,
                "labels": {"app.kubernetes.io/managed-by": "kaccel"},
                "annotations": {"kaccel.io/applied-hash": "0123456789abcdef"},
            },
            "spec": spec,
            "status": {"flavorsReservation": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "8"}]}]},
        }))
        .unwrap()
    }

    fn names(cache: &ManagedCache) -> Vec<String> {
        let mut n: Vec<String> = cache.state().iter().map(|o| o.name.clone()).collect();
        n.sort();
        n
    }

    #[test]
    fn an_object_reads_back_as_the_watch_delivered_it() {
        let spec = json!({"cohortName": "root", "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "8", "borrowingLimit": null}]}]}]});
        let watched = object(None, "cq-a", "41", spec);
        let (cache, mut writer) = managed_cache();
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(watched.clone()));
        writer.apply(&watcher::Event::InitDone);
        let held = cache.get(None, "cq-a").expect("held");
        assert_eq!(held.value(), serde_json::to_value(&watched).unwrap());
        assert_eq!(held.fingerprint, live_fingerprint(&watched));
        assert_eq!(
            held.read::<DynamicObject>().unwrap().data,
            watched.data,
            "typed reads see the same object"
        );
        // Namespaced objects are keyed by namespace too.
        assert!(cache.get(Some("ns"), "cq-a").is_none());
    }

    #[test]
    fn the_cache_follows_the_watch_and_a_relist_forgets_what_is_gone() {
        let (cache, mut writer) = managed_cache();
        assert!(!ready(&cache), "not ready before the first list");
        writer.apply(&watcher::Event::Init);
        for name in ["a", "b"] {
            writer.apply(&watcher::Event::InitApply(object(
                Some("ns"),
                name,
                "1",
                json!({}),
            )));
        }
        // Nothing is swapped in before the list is complete.
        assert!(cache.state().is_empty());
        writer.apply(&watcher::Event::InitDone);
        assert!(ready(&cache));
        assert_eq!(names(&cache), ["a", "b"]);
        writer.apply(&watcher::Event::Apply(object(
            Some("ns"),
            "b",
            "2",
            json!({"clusterQueue": "x"}),
        )));
        writer.apply(&watcher::Event::Apply(object(
            Some("other"),
            "b",
            "3",
            json!({}),
        )));
        writer.apply(&watcher::Event::Delete(object(
            Some("ns"),
            "a",
            "1",
            json!({}),
        )));
        assert_eq!(names(&cache), ["b", "b"]);
        let b = cache.get(Some("ns"), "b").unwrap();
        assert_eq!(
            (
                b.value()["metadata"]["resourceVersion"].as_str(),
                b.value()["spec"]["clusterQueue"].as_str()
            ),
            (Some("2"), Some("x"))
        );
        // A re-list after the watch was down: only what it lists is left.
        writer.apply(&watcher::Event::Init);
        writer.apply(&watcher::Event::InitApply(object(
            Some("ns"),
            "c",
            "4",
            json!({}),
        )));
        writer.apply(&watcher::Event::InitDone);
        assert_eq!(names(&cache), ["c"]);
    }

    /// Whether `wait_until_ready` returns at once.
    fn ready(cache: &ManagedCache) -> bool {
        *cache.ready.borrow()
    }
}
