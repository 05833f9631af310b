//! The apply stage: write the diff's actions; a failure is a retry, a taken name or a missing namespace.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, stream};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::runtime::events::EventType;
use serde_json::Value;

use super::diff::{self, Action, Kind, ObjectRef, is_managed};
use super::reconcile::Reconciler;
use super::{Error, api_err, managed_resource};

/// What the apply stage leaves for the status stage.
pub(super) struct Applied {
    /// The first write that failed: the reconcile fails with it after status.
    pub(super) first_error: Option<Error>,
    /// Budget -> namespaces whose LocalQueues could not be created.
    pub(super) missing_namespaces: BTreeMap<String, BTreeSet<String>>,
    /// Planned names held by objects kaccel does not own -> who holds them.
    pub(super) taken: BTreeMap<ObjectRef, String>,
    /// Planned objects not written, with the taken object each would use.
    pub(super) held_up: Vec<(ObjectRef, ObjectRef)>,
}

/// Writes of one wave sent at once: one Node's change can move the quota of a
/// hundred ClusterQueues, and one write at a time (10-20 ms each) would hold the
/// affected quota back by seconds.
const WRITES_IN_FLIGHT: usize = 8;

/// `actions` cut into runs that may be written in any order: the same kind and
/// verb (and, for Cohorts, the same depth: parents before children). The diff's
/// order between runs is kept.
fn waves(actions: &[Action]) -> Vec<&[Action]> {
    let key = |a: &Action| match a {
        Action::Apply { target, object, .. } | Action::Recreate { target, object } => (
            target.kind,
            false,
            target.kind == Kind::Cohort && object["spec"]["parentName"].is_string(),
        ),
        Action::Delete { target } | Action::Refused { target, .. } => (target.kind, true, false),
    };
    actions.chunk_by(|a, b| key(a) == key(b)).collect()
}

impl Reconciler {
    /// Writes `actions` wave by wave (see [`waves`]), a few at once within a wave;
    /// an object that would use a name taken in an earlier wave is held up rather
    /// than written.
    pub(super) async fn apply_all(
        &self,
        actions: &[Action],
        live: &BTreeMap<ObjectRef, Value>,
    ) -> Applied {
        let mut first_error = None;
        // A LocalQueue whose namespace does not exist yet is not an error to retry
        // at once: it becomes a condition on its budget, and is tried again later.
        let mut missing_namespaces: BTreeMap<String, BTreeSet<String>> = Default::default();
        // Planned names held by objects kaccel does not own, and the planned objects
        // not written because they would use one of those.
        let mut taken: BTreeMap<ObjectRef, String> = BTreeMap::new();
        let mut held_up: Vec<(ObjectRef, ObjectRef)> = Vec::new();
        for wave in waves(actions) {
            let mut ready = Vec::with_capacity(wave.len());
            for action in wave {
                if let Action::Apply { target, object, .. } | Action::Recreate { target, object } =
                    action
                    && let Some(used) = diff::references(target.kind, object)
                        .into_iter()
                        .find(|r| taken.contains_key(r))
                {
                    held_up.push((target.clone(), used));
                    continue;
                }
                ready.push(action);
            }
            let results: Vec<(&Action, Result<(), Error>)> = stream::iter(ready)
                .map(|action| async move { (action, self.apply(action, live).await) })
                .buffer_unordered(WRITES_IN_FLIGHT)
                .collect()
                .await;
            for (action, result) in results {
                match result {
                    Ok(()) => {}
                    Err(Error::Unmanaged { target, holder }) => {
                        tracing::warn!(%target, %holder, "planned name taken by an object kaccel does not own; left unchanged");
                        if let Action::Apply { target, .. } = action {
                            taken.insert(target.clone(), holder);
                        }
                    }
                    Err(Error::Api {
                        source: kube::Error::Api(status),
                        ..
                    }) if status.code == 404 && is_local_queue(action) => {
                        if let Some((budget, ns)) = local_queue_budget(action) {
                            missing_namespaces.entry(budget).or_default().insert(ns);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "write failed");
                        first_error.get_or_insert(e);
                    }
                }
            }
        }
        Applied {
            first_error,
            missing_namespaces,
            taken,
            held_up,
        }
    }

    async fn apply(&self, action: &Action, live: &BTreeMap<ObjectRef, Value>) -> Result<(), Error> {
        let ssa = PatchParams::apply(&self.config.field_manager).force();
        match action {
            Action::Apply {
                target,
                object,
                create,
            } => {
                let api = self.api_for(target);
                if *create
                    && let Some(existing) = api
                        .get_opt(&target.name)
                        .await
                        .map_err(api_err(format!("reading {target}")))?
                    && let existing = serde_json::to_value(&existing).unwrap_or_default()
                    && !is_managed(&existing, &self.config.instance)
                {
                    return Err(Error::Unmanaged {
                        target: target.to_string(),
                        holder: diff::holder_of(&existing),
                    });
                }
                let verb = if *create { "create" } else { "update" };
                self.own_writes.begin(target);
                let written = api.patch(&target.name, &ssa, &Patch::Apply(object)).await;
                self.own_writes.record(target, resource_version(&written));
                written.map_err(api_err(format!("applying {target}")))?;
                self.metrics.write(target.kind.as_str(), verb);
                tracing::info!(%target, verb, "applied");
                if target.kind == Kind::ResourceFlavor && *create {
                    self.event_for_object(
                        target,
                        EventType::Normal,
                        "FlavorCreated",
                        "created the ResourceFlavor",
                    )
                    .await;
                }
                if target.kind == Kind::ClusterQueue
                    && let Some(old) = live.get(target)
                    && device_quota(object) < device_quota(old)
                {
                    self.event_for_queue(
                        object,
                        EventType::Warning,
                        "QuotaReduced",
                        &format!(
                            "nominal device quota of {} lowered from {} to {} (healthy capacity or guarantees changed)",
                            target.name,
                            device_quota(old),
                            device_quota(object)
                        ),
                    )
                    .await;
                }
            }
            Action::Recreate { target, object } => {
                let api = self.api_for(target);
                api.delete(&target.name, &DeleteParams::default())
                    .await
                    .map_err(api_err(format!("deleting {target} to recreate it")))?;
                self.metrics.write(target.kind.as_str(), "delete");
                self.own_writes.begin(target);
                let written = api.patch(&target.name, &ssa, &Patch::Apply(object)).await;
                self.own_writes.record(target, resource_version(&written));
                written.map_err(api_err(format!("recreating {target}")))?;
                self.metrics.write(target.kind.as_str(), "create");
            }
            Action::Refused { target, reason } => {
                tracing::warn!(%target, reason, "not written: Kueue refuses the change");
                self.event_for_object(target, EventType::Warning, "ChangeRefused", reason)
                    .await;
            }
            Action::Delete { target } => {
                let api = self.api_for(target);
                match api.delete(&target.name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 404 => {}
                    Err(e) => return Err(api_err(format!("deleting {target}"))(e)),
                }
                self.metrics.write(target.kind.as_str(), "delete");
                tracing::info!(%target, "deleted (no longer planned)");
                if target.kind == Kind::ResourceFlavor {
                    self.event_for_object(
                        target,
                        EventType::Normal,
                        "FlavorRemoved",
                        "removed the ResourceFlavor: no class uses it any more",
                    )
                    .await;
                }
            }
        }
        Ok(())
    }

    fn api_for(&self, target: &ObjectRef) -> Api<DynamicObject> {
        let ar = managed_resource(target.kind);
        match &target.namespace {
            Some(ns) => Api::namespaced_with(self.client.clone(), ns, &ar),
            None => Api::all_with(self.client.clone(), &ar),
        }
    }
}

fn is_local_queue(action: &Action) -> bool {
    matches!(action, Action::Apply { target, .. } | Action::Recreate { target, .. } if target.kind == Kind::LocalQueue)
}

/// The budget (label) and namespace of a LocalQueue write.
fn local_queue_budget(action: &Action) -> Option<(String, String)> {
    let (Action::Apply { target, object, .. } | Action::Recreate { target, object }) = action
    else {
        return None;
    };
    let budget = object["metadata"]["labels"][crate::k8s::labels::BUDGET_LABEL].as_str()?;
    Some((budget.to_string(), target.namespace.clone()?))
}

/// Total nominal quota of device resources (not cpu/memory) in a ClusterQueue.
fn device_quota(cq: &Value) -> u64 {
    cq["spec"]["resourceGroups"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|rg| rg["flavors"].as_array().into_iter().flatten())
        .flat_map(|f| f["resources"].as_array().into_iter().flatten())
        .filter(|r| r["name"] != "cpu" && r["name"] != "memory")
        .filter_map(|r| r["nominalQuota"].as_str())
        .filter_map(|q| crate::k8s::quantity::parse_count(q).ok())
        .map(u64::from)
        .sum()
}

/// The resourceVersion a write's answer carries (none when it failed).
fn resource_version<E>(written: &Result<DynamicObject, E>) -> Option<&str> {
    written.as_ref().ok()?.metadata.resource_version.as_deref()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn apply(kind: Kind, name: &str, object: Value) -> Action {
        Action::Apply {
            target: ObjectRef {
                kind,
                namespace: None,
                name: name.into(),
            },
            object,
            create: false,
        }
    }

    #[test]
    fn waves_keep_kinds_verbs_and_cohort_depths_apart_in_the_diffs_order() {
        let root = json!({"spec": {}});
        let child = json!({"spec": {"parentName": "root"}});
        let actions = vec![
            apply(Kind::ResourceFlavor, "a", json!({})),
            apply(Kind::ResourceFlavor, "b", json!({})),
            apply(Kind::Cohort, "root", root),
            apply(Kind::Cohort, "team-a", child.clone()),
            apply(Kind::Cohort, "team-b", child),
            apply(Kind::ClusterQueue, "q1", json!({})),
            apply(Kind::ClusterQueue, "q2", json!({})),
            Action::Delete {
                target: ObjectRef {
                    kind: Kind::ClusterQueue,
                    namespace: None,
                    name: "old".into(),
                },
            },
        ];
        let sizes: Vec<usize> = waves(&actions).iter().map(|w| w.len()).collect();
        assert_eq!(sizes, [2, 1, 2, 2, 1]);
        let flattened: Vec<&Action> = waves(&actions).into_iter().flatten().collect();
        assert_eq!(flattened, actions.iter().collect::<Vec<_>>(), "order kept");
    }

    fn queue(groups: Value) -> Value {
        json!({"metadata": {"name": "team-a-h100"}, "spec": {"resourceGroups": groups}})
    }

    #[test]
    fn device_quota_sums_the_devices_of_every_flavor_and_ignores_cpu_and_memory() {
        let cq = queue(json!([
            {"coveredResources": ["cpu", "memory", "nvidia.com/gpu"], "flavors": [
                {"name": "h100", "resources": [
                    {"name": "cpu", "nominalQuota": "64"},
                    {"name": "memory", "nominalQuota": "512Gi"},
                    {"name": "nvidia.com/gpu", "nominalQuota": "8"}
                ]},
                {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "4"}]}
            ]},
            {"coveredResources": ["amd.com/gpu"], "flavors": [
                {"name": "mi300", "resources": [{"name": "amd.com/gpu", "nominalQuota": "2"}]}
            ]}
        ]));
        assert_eq!(device_quota(&cq), 14);
        let only_cpu = queue(json!([{"flavors": [{"name": "f", "resources": [
            {"name": "cpu", "nominalQuota": "100"},
            {"name": "memory", "nominalQuota": "512Mi"}
        ]}]}]));
        assert_eq!(device_quota(&only_cpu), 0);
        // Nothing to count, or not a count: zero rather than a panic.
        assert_eq!(device_quota(&json!({})), 0);
        let unreadable = queue(json!([{"flavors": [{"name": "f", "resources": [
            {"name": "nvidia.com/gpu", "nominalQuota": "half"}
        ]}]}]));
        assert_eq!(device_quota(&unreadable), 0);
    }

    #[test]
    fn a_local_queue_write_names_its_budget_and_namespace() {
        let target = ObjectRef {
            kind: Kind::LocalQueue,
            namespace: Some("ml-research".into()),
            name: "h100".into(),
        };
        let object = json!({"metadata": {
            "name": "h100", "namespace": "ml-research",
            "labels": {(crate::k8s::labels::BUDGET_LABEL): "team-a"}
        }});
        let apply = Action::Apply {
            target: target.clone(),
            object: object.clone(),
            create: true,
        };
        let recreate = Action::Recreate {
            target: target.clone(),
            object: object.clone(),
        };
        for action in [&apply, &recreate] {
            assert!(is_local_queue(action), "{action:?}");
            assert_eq!(
                local_queue_budget(action),
                Some(("team-a".to_string(), "ml-research".to_string()))
            );
        }
        // A delete creates nothing: a missing namespace is no budget's problem.
        let delete = Action::Delete {
            target: target.clone(),
        };
        assert!(!is_local_queue(&delete));
        assert_eq!(local_queue_budget(&delete), None);
        let cluster_queue = Action::Apply {
            target: ObjectRef {
                kind: Kind::ClusterQueue,
                namespace: None,
                name: "team-a-h100".into(),
            },
            object: object.clone(),
            create: true,
        };
        assert!(!is_local_queue(&cluster_queue));
        // Without the budget label or a namespace there is nobody to tell.
        let unlabelled = Action::Apply {
            target: target.clone(),
            object: json!({"metadata": {"name": "h100"}}),
            create: false,
        };
        assert_eq!(local_queue_budget(&unlabelled), None);
        let no_namespace = Action::Apply {
            target: ObjectRef {
                namespace: None,
                ..target
            },
            object,
            create: false,
        };
        assert_eq!(local_queue_budget(&no_namespace), None);
    }
}
