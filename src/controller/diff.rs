//! What to write: the planned Kueue objects against the live ones kaccel manages.
//! Pure, so invariant 4 (nothing changed -> zero writes) is tested without an API
//! server.
//!
//! An object is applied when it is missing, when what kaccel last applied differs
//! from what it wants now (an annotation holds a hash of the applied object, so a
//! field kaccel stops setting is removed too, even across restarts), or when the
//! live object no longer contains what kaccel wants (someone edited it by hand).
//! Fields other controllers or the API server add are ignored, and quantities are
//! compared by amount (`256Gi` == `274877906944`).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::k8s::labels::MANAGED_BY_LABEL;
use crate::k8s::names::fnv1a;
use crate::k8s::quantity::same_quantity;
use crate::plan::Plan;

pub const APPLIED_HASH_ANNOTATION: &str = "kaccel.io/applied-hash";

/// The kinds kaccel writes, in apply order (deletes run in reverse): the DRA
/// DeviceClasses of DRA-only flavors and DeviceTaintRules of failed DRA devices,
/// then the Kueue objects (a Topology before the flavors naming it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    DeviceClass,
    DeviceTaintRule,
    Topology,
    ResourceFlavor,
    Cohort,
    ClusterQueue,
    LocalQueue,
}

impl Kind {
    pub const ALL: [Kind; 7] = [
        Kind::DeviceClass,
        Kind::DeviceTaintRule,
        Kind::Topology,
        Kind::ResourceFlavor,
        Kind::Cohort,
        Kind::ClusterQueue,
        Kind::LocalQueue,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::DeviceClass => "DeviceClass",
            Kind::DeviceTaintRule => "DeviceTaintRule",
            Kind::Topology => "Topology",
            Kind::ResourceFlavor => "ResourceFlavor",
            Kind::Cohort => "Cohort",
            Kind::ClusterQueue => "ClusterQueue",
            Kind::LocalQueue => "LocalQueue",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub kind: Kind,
    pub namespace: Option<String>,
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.namespace {
            Some(ns) => write!(f, "{} {ns}/{}", self.kind.as_str(), self.name),
            None => write!(f, "{} {}", self.kind.as_str(), self.name),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Server-side apply this object (`create` when it does not exist yet).
    Apply {
        target: ObjectRef,
        object: Value,
        create: bool,
    },
    /// Delete and create again: a LocalQueue's `spec.clusterQueue` is immutable.
    Recreate { target: ObjectRef, object: Value },
    /// A managed object that is no longer wanted.
    Delete { target: ObjectRef },
    /// A change Kueue refuses, so not written: a ResourceFlavor's
    /// `topologyName`, node labels and tolerations are immutable once it has a
    /// topology, and deleting it waits for every ClusterQueue to drop it.
    Refused { target: ObjectRef, reason: String },
}

/// Planned objects as JSON, each annotated with the hash of itself.
pub fn desired_objects(plan: &Plan) -> BTreeMap<ObjectRef, Value> {
    let mut out = BTreeMap::new();
    let mut add = |kind: Kind, value: Value| {
        let name = value["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let namespace = value["metadata"]["namespace"].as_str().map(str::to_string);
        out.insert(
            ObjectRef {
                kind,
                namespace,
                name,
            },
            with_hash(value),
        );
    };
    for o in &plan.device_classes {
        add(Kind::DeviceClass, json(o));
    }
    for o in &plan.device_taint_rules {
        add(Kind::DeviceTaintRule, json(o));
    }
    for o in &plan.topologies {
        add(Kind::Topology, json(o));
    }
    for o in &plan.resource_flavors {
        add(Kind::ResourceFlavor, json(o));
    }
    for o in &plan.cohorts {
        add(Kind::Cohort, json(o));
    }
    for o in &plan.cluster_queues {
        add(Kind::ClusterQueue, json(o));
    }
    for o in &plan.local_queues {
        add(Kind::LocalQueue, json(o));
    }
    out
}

fn json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("Kueue objects serialise")
}

fn with_hash(mut value: Value) -> Value {
    // serde_json's map is ordered, so the text (and hash) is stable.
    let hash = format!("{:016x}", fnv1a(value.to_string().as_bytes()));
    let meta = value["metadata"]
        .as_object_mut()
        .expect("objects have metadata");
    let annotations = meta
        .entry("annotations")
        .or_insert_with(|| Value::Object(Default::default()));
    annotations[APPLIED_HASH_ANNOTATION] = Value::String(hash);
    value
}

/// Whether a live object was written by the installation `instance` (another
/// installation's objects are as foreign as anyone's).
pub fn is_managed(live: &Value, instance: &str) -> bool {
    live["metadata"]["labels"][MANAGED_BY_LABEL].as_str() == Some(instance)
}

/// Objects found in sync at the last diff: the applied hash kaccel wanted and the
/// live resourceVersion it was compared at. While neither moved the object is in
/// sync still, so a re-plan after one Node's change compares the few objects
/// that change, not every object kaccel manages.
#[derive(Debug, Default)]
pub struct InSync {
    at: std::collections::HashMap<ObjectRef, (String, String)>,
}

impl InSync {
    /// Whether `target`, wanted as `desired`, was in sync at `live_version`.
    pub fn holds(
        &self,
        target: &ObjectRef,
        desired: Option<&Value>,
        live_version: Option<&str>,
    ) -> bool {
        match (self.at.get(target), desired, live_version) {
            (Some((hash, version)), Some(desired), Some(live_version)) => {
                version == live_version && applied_hash(desired) == Some(hash.as_str())
            }
            _ => false,
        }
    }

    /// After a diff: objects wanted, compared (present in `live`) and left
    /// without an action are in sync at their live version; the rest is forgotten
    /// (compared again next time), as is anything no longer wanted.
    pub fn record(
        &mut self,
        desired: &BTreeMap<ObjectRef, Value>,
        live: &BTreeMap<ObjectRef, Value>,
        actions: &[Action],
    ) {
        let acted: std::collections::HashSet<&ObjectRef> =
            actions.iter().map(Action::target).collect();
        self.at
            .retain(|target, _| desired.contains_key(target) && !acted.contains(target));
        for (target, current) in live {
            if acted.contains(target) {
                continue;
            }
            let (Some(want), Some(version)) = (
                desired.get(target).and_then(applied_hash),
                current["metadata"]["resourceVersion"].as_str(),
            ) else {
                continue;
            };
            self.at
                .insert(target.clone(), (want.to_string(), version.to_string()));
        }
    }
}

fn applied_hash(object: &Value) -> Option<&str> {
    object["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].as_str()
}

impl Action {
    pub fn target(&self) -> &ObjectRef {
        match self {
            Action::Apply { target, .. }
            | Action::Recreate { target, .. }
            | Action::Delete { target }
            | Action::Refused { target, .. } => target,
        }
    }
}

/// The writes that bring `live` (managed objects only) to `desired`, in a safe order:
/// applies in kind order, then deletes in reverse kind order. Objects in `in_sync`
/// (left out of `live` by the caller) need nothing.
pub fn diff_skipping(
    desired: &BTreeMap<ObjectRef, Value>,
    live: &BTreeMap<ObjectRef, Value>,
    in_sync: &std::collections::HashSet<ObjectRef>,
    instance: &str,
) -> Vec<Action> {
    if in_sync.is_empty() {
        return diff(desired, live, instance);
    }
    let rest: BTreeMap<ObjectRef, Value> = desired
        .iter()
        .filter(|(target, _)| !in_sync.contains(*target))
        .map(|(target, v)| (target.clone(), v.clone()))
        .collect();
    diff(&rest, live, instance)
}

/// The writes that bring `live` (managed objects only) to `desired`, in a safe order:
/// applies in kind order, then deletes in reverse kind order.
pub fn diff(
    desired: &BTreeMap<ObjectRef, Value>,
    live: &BTreeMap<ObjectRef, Value>,
    instance: &str,
) -> Vec<Action> {
    let mut applies: Vec<Action> = Vec::new();
    for kind in Kind::ALL {
        let mut of_kind: Vec<(&ObjectRef, &Value)> =
            desired.iter().filter(|(r, _)| r.kind == kind).collect();
        if kind == Kind::Cohort {
            // Parents before children, so a child never names a missing parent.
            of_kind.sort_by_key(|(r, v)| (v["spec"]["parentName"].is_string(), (*r).clone()));
        }
        for (target, object) in of_kind {
            match live.get(target) {
                None => applies.push(Action::Apply {
                    target: target.clone(),
                    object: object.clone(),
                    create: true,
                }),
                Some(current) => {
                    if kind == Kind::LocalQueue
                        && current["spec"]["clusterQueue"] != object["spec"]["clusterQueue"]
                    {
                        applies.push(Action::Recreate {
                            target: target.clone(),
                            object: object.clone(),
                        });
                    } else if kind == Kind::ResourceFlavor
                        && let Some(reason) = immutable_topology_change(object, current)
                    {
                        applies.push(Action::Refused {
                            target: target.clone(),
                            reason,
                        });
                    } else if needs_apply(object, current) {
                        applies.push(Action::Apply {
                            target: target.clone(),
                            object: object.clone(),
                            create: false,
                        });
                    }
                }
            }
        }
    }
    // An object already being deleted (a Topology Kueue keeps while a flavor
    // names it) is not deleted again at every re-plan.
    let mut deletes: Vec<Action> = live
        .iter()
        .filter(|(r, v)| {
            !desired.contains_key(r)
                && is_managed(v, instance)
                && v["metadata"]["deletionTimestamp"].is_null()
        })
        .map(|(r, _)| Action::Delete { target: r.clone() })
        .collect();
    deletes.sort_by(|a, b| match (a, b) {
        (Action::Delete { target: x }, Action::Delete { target: y }) => {
            y.kind.cmp(&x.kind).then_with(|| x.cmp(y))
        }
        _ => std::cmp::Ordering::Equal,
    });
    applies.extend(deletes);
    applies
}

/// Why a ResourceFlavor cannot become `desired`: once it has a topology, Kueue
/// refuses any change of its `topologyName`, `nodeLabels` or `tolerations`.
/// The flavor keeps serving with what it has; the apply would only fail, and
/// with it every write after it.
fn immutable_topology_change(desired: &Value, live: &Value) -> Option<String> {
    let live_topology = live["spec"]["topologyName"].as_str()?;
    let empty_as_null = |v: &Value| match v {
        Value::Object(m) if m.is_empty() => Value::Null,
        Value::Array(a) if a.is_empty() => Value::Null,
        other => other.clone(),
    };
    let changed: Vec<&str> = ["topologyName", "nodeLabels", "tolerations"]
        .into_iter()
        .filter(|field| {
            empty_as_null(&desired["spec"][*field]) != empty_as_null(&live["spec"][*field])
        })
        .collect();
    if changed.is_empty() {
        return None;
    }
    Some(format!(
        "Kueue keeps a ResourceFlavor's {} as they are once it has a topology ({live_topology}), and deletes it only once no ClusterQueue names it; kaccel now plans {}, and leaves the flavor serving as it is rather than take its quota away (README: Topology)",
        changed.join(", "),
        changed
            .iter()
            .map(|f| format!("{f} {}", desired["spec"][*f]))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// The objects of kaccel's plan that `object` (of `kind`) names and would use: a
/// Cohort's parent, a ClusterQueue's cohort and flavors, a LocalQueue's
/// ClusterQueue. Writing it while one of them is someone else's object would put
/// the team's quota or queue on that object.
pub fn references(kind: Kind, object: &Value) -> Vec<ObjectRef> {
    let named = |kind: Kind, name: &Value| {
        name.as_str().map(|n| ObjectRef {
            kind,
            namespace: None,
            name: n.to_string(),
        })
    };
    let spec = &object["spec"];
    match kind {
        Kind::DeviceClass | Kind::DeviceTaintRule | Kind::Topology => vec![],
        Kind::ResourceFlavor => named(Kind::Topology, &spec["topologyName"])
            .into_iter()
            .collect(),
        Kind::Cohort => named(Kind::Cohort, &spec["parentName"])
            .into_iter()
            .collect(),
        Kind::ClusterQueue => named(Kind::Cohort, &spec["cohortName"])
            .into_iter()
            .chain(
                spec["resourceGroups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
                    .filter_map(|f| named(Kind::ResourceFlavor, &f["name"])),
            )
            .collect(),
        Kind::LocalQueue => named(Kind::ClusterQueue, &spec["clusterQueue"])
            .into_iter()
            .collect(),
    }
}

/// Who holds an object kaccel did not create, for the Conflict condition: its
/// `app.kubernetes.io/managed-by` label (another kaccel installation's instance,
/// for one) and owner references, else the field managers that wrote it.
pub fn holder_of(live: &Value) -> String {
    let meta = &live["metadata"];
    let owners: Vec<String> = meta["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            format!(
                "{} {}",
                o["kind"].as_str().unwrap_or("?"),
                o["name"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let managed_by = meta["labels"][MANAGED_BY_LABEL].as_str();
    match (managed_by, owners.is_empty()) {
        (Some(by), false) => return format!("managed by {by}, owned by {}", owners.join(", ")),
        (Some(by), true) => return format!("managed by {by}"),
        (None, false) => return format!("owned by {}", owners.join(", ")),
        (None, true) => {}
    }
    let mut managers: Vec<&str> = meta["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    managers.sort_unstable();
    managers.dedup();
    if managers.is_empty() {
        "created outside kaccel, no owner recorded".to_string()
    } else {
        format!("written by field manager {}", managers.join(", "))
    }
}

fn needs_apply(desired: &Value, live: &Value) -> bool {
    let hash = |v: &Value| v["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].clone();
    hash(desired) != hash(live) || !contains(live, desired)
}

/// Does `live` contain everything in `want`? Extra fields in `live` are fine.
pub fn contains(live: &Value, want: &Value) -> bool {
    match (want, live) {
        (Value::Object(w), Value::Object(l)) => w.iter().all(|(k, wv)| match l.get(k) {
            Some(lv) => contains(lv, wv),
            None => wv.is_null(),
        }),
        (Value::Array(w), Value::Array(l)) => {
            w.len() == l.len() && w.iter().zip(l).all(|(wv, lv)| contains(lv, wv))
        }
        (Value::String(w), Value::String(l)) => w == l || same_quantity(w, l),
        (Value::Null, Value::Null) => true,
        (w, l) => w == l,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::example_plan;
    use serde_json::json;

    /// What the API server gives back: our object plus defaults, status, server
    /// metadata and quantities in canonical form.
    fn as_stored(v: &Value) -> Value {
        let mut v = v.clone();
        v["metadata"]["uid"] = json!("1234");
        v["metadata"]["resourceVersion"] = json!("99");
        v["metadata"]["managedFields"] = json!([{"manager": "kaccel"}]);
        v["status"] = json!({"conditions": [{"type": "Active", "status": "True"}]});
        if let Some(spec) = v["spec"].as_object_mut() {
            spec.entry("preemption")
                .or_insert(json!({"reclaimWithinCohort": "Never"}));
        }
        canonicalise_memory(&mut v);
        v
    }

    fn canonicalise_memory(v: &mut Value) {
        match v {
            Value::Object(map) => {
                if map.get("name") == Some(&json!("memory"))
                    && let Some(Value::String(q)) = map.get_mut("nominalQuota")
                    && let Ok(bytes) = q.parse::<u64>()
                    && bytes > 0
                    && bytes.is_multiple_of(1024 * 1024)
                {
                    *q = format!("{}Mi", bytes / 1024 / 1024);
                }
                map.values_mut().for_each(canonicalise_memory);
            }
            Value::Array(a) => a.iter_mut().for_each(canonicalise_memory),
            _ => {}
        }
    }

    #[test]
    fn nothing_changed_means_no_writes() {
        let desired = desired_objects(&example_plan());
        let live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        assert_eq!(diff(&desired, &live, "kaccel"), vec![]);
    }

    #[test]
    fn nothing_changed_means_no_writes_with_topologies_too() {
        let desired = desired_objects(&crate::testkit::example_plan_with(
            &crate::plan::PlanOptions {
                topology_aware_scheduling: true,
                ..Default::default()
            },
        ));
        assert!(desired.keys().any(|r| r.kind == Kind::Topology));
        // As Kueue keeps them: its in-use finalizer on the Topology and the flavors.
        let live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| {
                let mut stored = as_stored(v);
                if matches!(r.kind, Kind::Topology | Kind::ResourceFlavor) {
                    stored["metadata"]["finalizers"] = json!(["kueue.x-k8s.io/resource-in-use"]);
                }
                (r.clone(), stored)
            })
            .collect();
        assert_eq!(diff(&desired, &live, "kaccel"), vec![]);
    }

    /// One reconcile's diff as the controller runs it: objects held in sync are
    /// left out of `live` and of the comparison.
    fn diff_with(
        in_sync: &mut InSync,
        desired: &BTreeMap<ObjectRef, Value>,
        stored: &BTreeMap<ObjectRef, Value>,
    ) -> (Vec<Action>, usize) {
        let mut skipped = std::collections::HashSet::new();
        let live: BTreeMap<ObjectRef, Value> = stored
            .iter()
            .filter(|(r, v)| {
                let holds = in_sync.holds(
                    r,
                    desired.get(*r),
                    v["metadata"]["resourceVersion"].as_str(),
                );
                if holds {
                    skipped.insert((*r).clone());
                }
                !holds
            })
            .map(|(r, v)| (r.clone(), v.clone()))
            .collect();
        let actions = diff_skipping(desired, &live, &skipped, "kaccel");
        in_sync.record(desired, &live, &actions);
        (actions, live.len())
    }

    #[test]
    fn objects_in_sync_are_not_compared_again_until_they_or_their_plan_move() {
        let desired = desired_objects(&example_plan());
        let mut stored: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        let mut in_sync = InSync::default();
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!((actions, compared), (vec![], stored.len()));
        // Nothing moved: nothing compared.
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!((actions, compared), (vec![], 0));

        // A hand edit moves the live object's resourceVersion: compared, restored.
        let cq = desired
            .keys()
            .find(|r| r.kind == Kind::ClusterQueue)
            .unwrap()
            .clone();
        stored.get_mut(&cq).unwrap()["spec"]["stopPolicy"] = json!("Hold");
        stored.get_mut(&cq).unwrap()["metadata"]["resourceVersion"] = json!("100");
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!(compared, 1);
        assert!(
            matches!(&actions[..], [Action::Apply { target, create: false, .. }] if *target == cq)
        );
        // Until the write lands it is compared each time (not held in sync).
        let (_, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!(compared, 1);

        // A plan that moves one object: that one is compared (and applied).
        stored.insert(cq.clone(), as_stored(&desired[&cq]));
        diff_with(&mut in_sync, &desired, &stored);
        let mut moved = desired.clone();
        let lq = desired
            .keys()
            .find(|r| r.kind == Kind::LocalQueue)
            .unwrap()
            .clone();
        let mut object = desired[&lq].clone();
        object["metadata"]["annotations"][APPLIED_HASH_ANNOTATION] = json!("0000000000000001");
        moved.insert(lq.clone(), object);
        let (actions, compared) = diff_with(&mut in_sync, &moved, &stored);
        assert_eq!(compared, 1);
        assert_eq!(actions.len(), 1);

        // An object no longer planned is still deleted.
        let mut fewer = desired.clone();
        fewer.remove(&lq);
        let (actions, _) = diff_with(&mut in_sync, &fewer, &stored);
        assert_eq!(actions, vec![Action::Delete { target: lq }]);
    }

    #[test]
    fn missing_objects_are_created_parents_first() {
        let desired = desired_objects(&example_plan());
        let actions = diff(&desired, &BTreeMap::new(), "kaccel");
        assert_eq!(actions.len(), desired.len());
        let kinds: Vec<Kind> = actions
            .iter()
            .map(|a| match a {
                Action::Apply { target, create, .. } => {
                    assert!(create);
                    target.kind
                }
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert!(
            kinds.is_sorted(),
            "flavors, cohorts, queues, local queues in order"
        );
        let first_cohort = actions
            .iter()
            .find_map(|a| match a {
                Action::Apply { target, object, .. } if target.kind == Kind::Cohort => Some(object),
                _ => None,
            })
            .unwrap();
        assert!(
            first_cohort["spec"]["parentName"].is_null(),
            "root Cohort first"
        );
    }

    #[test]
    fn a_hand_edit_is_restored_and_unmanaged_objects_are_left_alone() {
        let desired = desired_objects(&example_plan());
        let mut live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        let cq = desired
            .keys()
            .find(|r| r.kind == Kind::ClusterQueue)
            .unwrap()
            .clone();
        live.get_mut(&cq).unwrap()["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"] =
            json!("999");
        let foreign = ObjectRef {
            kind: Kind::ClusterQueue,
            namespace: None,
            name: "someone-elses".into(),
        };
        live.insert(
            foreign,
            json!({"metadata": {"name": "someone-elses", "labels": {}}}),
        );
        // Another installation's ClusterQueue (its own managed-by value).
        let other_installation = ObjectRef {
            kind: Kind::ClusterQueue,
            namespace: None,
            name: "team-b-queue".into(),
        };
        live.insert(
            other_installation,
            json!({"metadata": {"name": "team-b-queue", "labels": {"app.kubernetes.io/managed-by": "kaccel-b"}}}),
        );
        let actions = diff(&desired, &live, "kaccel");
        assert_eq!(actions.len(), 1, "{actions:?}");
        assert!(
            matches!(&actions[0], Action::Apply { target, create: false, .. } if *target == cq)
        );
    }

    #[test]
    fn a_changed_plan_is_applied_and_dropped_objects_deleted_children_first() {
        let plan = example_plan();
        let desired = desired_objects(&plan);
        let live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        // The class `inference` is deleted: its queues go, queues first.
        let mut smaller = desired.clone();
        smaller.retain(|r, v| {
            !(matches!(r.kind, Kind::ClusterQueue | Kind::LocalQueue)
                && v["metadata"]["labels"]["kaccel.io/class"] == "inference")
        });
        let actions = diff(&smaller, &live, "kaccel");
        assert!(!actions.is_empty());
        let kinds: Vec<Kind> = actions
            .iter()
            .map(|a| match a {
                Action::Delete { target } => target.kind,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(kinds.first(), Some(&Kind::LocalQueue));
        assert_eq!(kinds.last(), Some(&Kind::ClusterQueue));

        // A field kaccel stops setting is noticed through the hash even though the
        // live object still "contains" the new desired object.
        let mut changed = desired.clone();
        let key = changed
            .keys()
            .find(|r| r.kind == Kind::ClusterQueue)
            .unwrap()
            .clone();
        let mut obj = changed[&key].clone();
        obj["spec"]
            .as_object_mut()
            .unwrap()
            .remove("flavorFungibility");
        obj["metadata"]["annotations"]
            .as_object_mut()
            .unwrap()
            .remove(APPLIED_HASH_ANNOTATION);
        changed.insert(key.clone(), with_hash(obj));
        let actions = diff(&changed, &live, "kaccel");
        assert_eq!(actions.len(), 1);
    }

    #[test]
    fn a_flavor_with_a_topology_is_never_rewritten_with_another_and_says_why() {
        let desired = desired_objects(&crate::testkit::example_plan_with(
            &crate::plan::PlanOptions {
                topology_aware_scheduling: true,
                ..Default::default()
            },
        ));
        assert!(
            desired.keys().any(|r| r.kind == Kind::Topology),
            "the example fleet carries zone and rack labels"
        );
        let flavor = desired
            .iter()
            .find(|(r, v)| r.kind == Kind::ResourceFlavor && v["spec"]["topologyName"].is_string())
            .map(|(r, _)| r.clone())
            .expect("a flavor with a topology");
        let stored = |edit: &dyn Fn(&mut Value)| {
            let mut live: BTreeMap<ObjectRef, Value> = desired
                .iter()
                .map(|(r, v)| (r.clone(), as_stored(v)))
                .collect();
            edit(live.get_mut(&flavor).unwrap());
            live
        };

        // Created under another Topology: Kueue would refuse the change, so no write.
        let live = stored(&|f| f["spec"]["topologyName"] = json!("kaccel-zone-host-00000000"));
        let actions = diff(&desired, &live, "kaccel");
        match &actions[..] {
            [Action::Refused { target, reason }] => {
                assert_eq!(*target, flavor);
                assert!(
                    reason.contains("topologyName") && reason.contains("kaccel-zone-host-00000000"),
                    "{reason}"
                );
            }
            other => panic!("expected one refusal, got {other:?}"),
        }
        // Tolerations are frozen with it.
        let live = stored(&|f| f["spec"]["tolerations"] = json!([]));
        let actions = diff(&desired, &live, "kaccel");
        assert!(
            matches!(&actions[..], [Action::Refused { reason, .. }] if reason.contains("tolerations")),
            "{actions:?}"
        );
        // A flavor that had no topology yet may get one: Kueue allows adding it.
        let live = stored(&|f| {
            f["spec"].as_object_mut().unwrap().remove("topologyName");
        });
        let actions = diff(&desired, &live, "kaccel");
        assert!(
            matches!(&actions[..], [Action::Apply { target, create: false, .. }] if *target == flavor),
            "{actions:?}"
        );
    }

    #[test]
    fn an_object_already_being_deleted_is_not_deleted_again() {
        let desired = desired_objects(&example_plan());
        let mut live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        let old = ObjectRef {
            kind: Kind::Topology,
            namespace: None,
            name: "kaccel-zone-host-00000000".into(),
        };
        let mut topology = json!({"metadata": {"name": old.name,
            "labels": {MANAGED_BY_LABEL: "kaccel"}}, "spec": {"levels": []}});
        live.insert(old.clone(), topology.clone());
        assert_eq!(
            diff(&desired, &live, "kaccel"),
            vec![Action::Delete {
                target: old.clone()
            }]
        );
        // Kueue holds it while a flavor names it: nothing to write meanwhile.
        topology["metadata"]["deletionTimestamp"] = json!("2026-12-05T21:00:00Z");
        live.insert(old, topology);
        assert_eq!(diff(&desired, &live, "kaccel"), vec![]);
    }

    #[test]
    fn local_queue_pointing_elsewhere_is_recreated() {
        let desired = desired_objects(&example_plan());
        let mut live: BTreeMap<ObjectRef, Value> = desired
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        let lq = desired
            .keys()
            .find(|r| r.kind == Kind::LocalQueue)
            .unwrap()
            .clone();
        live.get_mut(&lq).unwrap()["spec"]["clusterQueue"] = json!("old-queue");
        let actions = diff(&desired, &live, "kaccel");
        assert!(matches!(&actions[..], [Action::Recreate { target, .. }] if *target == lq));
    }

    #[test]
    fn quantities_compare_by_amount() {
        assert!(contains(
            &json!({"q": "256Gi"}),
            &json!({"q": "274877906944"})
        ));
        assert!(!contains(
            &json!({"q": "255Gi"}),
            &json!({"q": "274877906944"})
        ));
        assert!(contains(&json!({"a": 1, "b": 2}), &json!({"a": 1})));
        assert!(!contains(&json!({"a": [1, 2]}), &json!({"a": [1]})));
    }

    #[test]
    fn the_holder_of_a_foreign_object_is_named() {
        let owned = json!({"metadata": {"ownerReferences": [{"kind": "Team", "name": "x"}]}});
        assert_eq!(holder_of(&owned), "owned by Team x");
        let labelled =
            json!({"metadata": {"labels": {"app.kubernetes.io/managed-by": "terraform"}}});
        assert_eq!(holder_of(&labelled), "managed by terraform");
        // Another kaccel installation's object: the installation and its owner.
        let other = json!({"metadata": {
            "labels": {"app.kubernetes.io/managed-by": "kaccel-b"},
            "ownerReferences": [{"kind": "CreditBudget", "name": "vision"}]}});
        assert_eq!(
            holder_of(&other),
            "managed by kaccel-b, owned by CreditBudget vision"
        );
        let written = json!({"metadata": {"managedFields": [{"manager": "kubectl-create"}, {"manager": "kubectl-create"}]}});
        assert_eq!(
            holder_of(&written),
            "written by field manager kubectl-create"
        );
        assert!(holder_of(&json!({})).contains("no owner recorded"));
    }
}
