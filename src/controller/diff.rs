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

use kube::api::DynamicObject;
use serde_json::Value;

use crate::k8s::labels::MANAGED_BY_LABEL;
use crate::k8s::names::{FINGERPRINTS, Fnv1a};
use crate::k8s::quantity::same_quantity;
use crate::plan::Plan;
use std::hash::BuildHasher;

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

/// One planned object, borrowed from the plan. Its JSON is built only when a
/// diff compares or writes it: a re-plan after one Node's change builds the few
/// objects that moved, not the thousands kaccel manages.
#[derive(Clone, Copy, Debug)]
enum Planned<'p> {
    DeviceClass(&'p k8s_openapi::api::resource::v1::DeviceClass),
    DeviceTaintRule(&'p k8s_openapi::api::resource::v1alpha3::DeviceTaintRule),
    Topology(&'p crate::kueue::Topology),
    ResourceFlavor(&'p crate::kueue::ResourceFlavor),
    Cohort(&'p crate::kueue::Cohort),
    ClusterQueue(&'p crate::kueue::ClusterQueue),
    LocalQueue(&'p crate::kueue::LocalQueue),
}

/// `$body` with `$object` bound to the planned object, whatever its type.
macro_rules! with_planned {
    ($planned:expr, $object:ident => $body:expr) => {
        match $planned {
            Planned::DeviceClass($object) => $body,
            Planned::DeviceTaintRule($object) => $body,
            Planned::Topology($object) => $body,
            Planned::ResourceFlavor($object) => $body,
            Planned::Cohort($object) => $body,
            Planned::ClusterQueue($object) => $body,
            Planned::LocalQueue($object) => $body,
        }
    };
}

impl<'p> Planned<'p> {
    fn kind(self) -> Kind {
        match self {
            Planned::DeviceClass(_) => Kind::DeviceClass,
            Planned::DeviceTaintRule(_) => Kind::DeviceTaintRule,
            Planned::Topology(_) => Kind::Topology,
            Planned::ResourceFlavor(_) => Kind::ResourceFlavor,
            Planned::Cohort(_) => Kind::Cohort,
            Planned::ClusterQueue(_) => Kind::ClusterQueue,
            Planned::LocalQueue(_) => Kind::LocalQueue,
        }
    }

    fn reference(self) -> ObjectRef {
        let metadata = with_planned!(self, object => &object.metadata);
        ObjectRef {
            kind: self.kind(),
            namespace: metadata.namespace.clone(),
            name: metadata.name.clone().unwrap_or_default(),
        }
    }

    fn labels(self) -> Option<&'p BTreeMap<String, String>> {
        with_planned!(self, object => object.metadata.labels.as_ref())
    }

    /// A hash of the object's JSON (written into `text`, a buffer reused from
    /// object to object): equal while the plan wants the same object. Held in
    /// memory only, so any hash will do: foldhash reads the text a word at a
    /// time, where FNV-1a, fed by the serialiser, took a byte at a time.
    fn fingerprint(self, text: &mut Vec<u8>) -> u64 {
        text.clear();
        with_planned!(self, object => serde_json::to_writer(&mut *text, object))
            .expect("Kueue objects serialise");
        FINGERPRINTS.hash_one(text.as_slice())
    }

    /// The object as JSON, annotated with the hash of itself.
    fn value(self) -> Value {
        with_hash(with_planned!(self, object => json(object)))
    }
}

/// A planned object and the fingerprint of its JSON.
#[derive(Clone, Copy, Debug)]
pub struct DesiredObject<'p> {
    planned: Planned<'p>,
    pub fingerprint: u64,
}

impl<'p> DesiredObject<'p> {
    /// As JSON, annotated with its applied hash (built now).
    pub fn value(&self) -> Value {
        self.planned.value()
    }

    pub fn labels(&self) -> Option<&'p BTreeMap<String, String>> {
        self.planned.labels()
    }
}

/// Every object a plan wants, by reference.
#[derive(Debug, Default)]
pub struct DesiredObjects<'p> {
    objects: BTreeMap<ObjectRef, DesiredObject<'p>>,
}

impl<'p> DesiredObjects<'p> {
    pub fn of(plan: &'p Plan) -> Self {
        let planned = (plan.device_classes.iter().map(Planned::DeviceClass))
            .chain(plan.device_taint_rules.iter().map(Planned::DeviceTaintRule))
            .chain(plan.topologies.iter().map(Planned::Topology))
            .chain(plan.resource_flavors.iter().map(Planned::ResourceFlavor))
            .chain(plan.cohorts.iter().map(Planned::Cohort))
            .chain(plan.cluster_queues.iter().map(Planned::ClusterQueue))
            .chain(plan.local_queues.iter().map(Planned::LocalQueue));
        let mut text = Vec::with_capacity(16 * 1024);
        DesiredObjects {
            objects: planned
                .map(|planned| {
                    let object = DesiredObject {
                        planned,
                        fingerprint: planned.fingerprint(&mut text),
                    };
                    (planned.reference(), object)
                })
                .collect(),
        }
    }

    pub fn get(&self, target: &ObjectRef) -> Option<&DesiredObject<'p>> {
        self.objects.get(target)
    }

    pub fn contains(&self, target: &ObjectRef) -> bool {
        self.objects.contains_key(target)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ObjectRef> {
        self.objects.keys()
    }

    /// As JSON, the objects a diff compares: all but those in `in_sync`.
    pub fn values_except(
        &self,
        in_sync: &std::collections::HashSet<&ObjectRef>,
    ) -> BTreeMap<ObjectRef, Value> {
        self.objects
            .iter()
            .filter(|(target, _)| !in_sync.contains(target))
            .map(|(target, object)| (target.clone(), object.value()))
            .collect()
    }
}

/// Every planned object as JSON, each annotated with the hash of itself.
pub fn desired_objects(plan: &Plan) -> BTreeMap<ObjectRef, Value> {
    DesiredObjects::of(plan).values_except(&Default::default())
}

fn json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("Kueue objects serialise")
}

fn with_hash(mut value: Value) -> Value {
    // serde_json's map is ordered, so the text (and hash) is stable.
    let mut text_hash = Fnv1a::default();
    serde_json::to_writer(&mut text_hash, &value).expect("JSON values serialise");
    let hash = format!("{:016x}", text_hash.0);
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

/// A hash of what [`diff`] reads of a live object kaccel wants: the parts a
/// planned object sets (its kind, labels, annotations and owner references, and
/// its spec: all outside the metadata but the status). Not its resourceVersion,
/// managedFields or finalizers: Kueue writes the status of every queue kaccel
/// creates soon after (and its in-use finalizer), and of a ClusterQueue at every
/// admission, and none of that moves what the diff compares. Keyed on the
/// resourceVersion, the first re-plan after start-up compared 1,865 of the 2,612
/// objects of the fleet bench again (a 73-176 ms diff, against 6-8 ms).
pub fn live_fingerprint(object: &DynamicObject) -> u64 {
    let meta = &object.metadata;
    let spec_and_the_rest: Option<Vec<(&String, &Value)>> = object
        .data
        .as_object()
        .map(|data| data.iter().filter(|(key, _)| *key != "status").collect());
    let read = (
        &object.types,
        &meta.labels,
        &meta.annotations,
        &meta.owner_references,
        spec_and_the_rest,
    );
    let mut text = Vec::with_capacity(1024);
    serde_json::to_writer(&mut text, &read).expect("a watched object serialises");
    FINGERPRINTS.hash_one(text.as_slice())
}

/// Objects found in sync at the last diff: the fingerprint of the object kaccel
/// wanted and the [`live_fingerprint`] it was compared at. While neither moved
/// the object is in sync still, so a re-plan after one Node's change compares
/// (and builds as JSON) the few objects that change, not every object kaccel
/// manages.
#[derive(Debug, Default)]
pub struct InSync {
    at: std::collections::HashMap<ObjectRef, (u64, u64)>,
}

impl InSync {
    /// Whether `target`, live with `live_fingerprint`, is still in sync with what
    /// `desired` wants: it was at the last diff, and neither moved since. If so
    /// `desired`'s key for it joins `skipped` (not built as JSON, not compared).
    pub fn skips<'d>(
        &self,
        desired: &'d DesiredObjects,
        target: &ObjectRef,
        live_fingerprint: u64,
        skipped: &mut std::collections::HashSet<&'d ObjectRef>,
    ) -> bool {
        let (Some((fingerprint, compared_at)), Some((key, want))) =
            (self.at.get(target), desired.objects.get_key_value(target))
        else {
            return false;
        };
        let holds = *compared_at == live_fingerprint && *fingerprint == want.fingerprint;
        if holds {
            skipped.insert(key);
        }
        holds
    }

    /// After a diff: objects wanted, compared (in `compared`, with their
    /// [`live_fingerprint`]) and left without an action are in sync as they are
    /// live; the rest is forgotten (compared again next time), as is anything no
    /// longer wanted.
    pub fn record(
        &mut self,
        desired: &DesiredObjects,
        compared: &BTreeMap<ObjectRef, u64>,
        actions: &[Action],
    ) {
        let acted: std::collections::HashSet<&ObjectRef> =
            actions.iter().map(Action::target).collect();
        self.at
            .retain(|target, _| desired.contains(target) && !acted.contains(target));
        for (target, live_fingerprint) in compared {
            if acted.contains(target) {
                continue;
            }
            let Some(want) = desired.get(target) else {
                continue;
            };
            self.at
                .insert(target.clone(), (want.fingerprint, *live_fingerprint));
        }
    }
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
    /// left out of `live`, of the JSON built and of the comparison.
    fn diff_with(
        in_sync: &mut InSync,
        desired: &DesiredObjects,
        stored: &BTreeMap<ObjectRef, Value>,
    ) -> (Vec<Action>, usize) {
        let mut skipped = std::collections::HashSet::new();
        let live: BTreeMap<ObjectRef, Value> = stored
            .iter()
            .filter(|(r, v)| !in_sync.skips(desired, r, fingerprint(v), &mut skipped))
            .map(|(r, v)| (r.clone(), v.clone()))
            .collect();
        let compared = desired.values_except(&skipped);
        let actions = diff(&compared, &live, "kaccel");
        let compared_live = live.iter().map(|(r, v)| (r.clone(), fingerprint(v)));
        in_sync.record(desired, &compared_live.collect(), &actions);
        (actions, live.len())
    }

    /// The live fingerprint of a stored object, as the watch cache takes it.
    fn fingerprint(stored: &Value) -> u64 {
        let watched: DynamicObject = serde_json::from_value(stored.clone()).unwrap();
        live_fingerprint(&watched)
    }

    #[test]
    fn objects_in_sync_are_not_compared_again_until_they_or_their_plan_move() {
        let plan = example_plan();
        let desired = DesiredObjects::of(&plan);
        let mut stored: BTreeMap<ObjectRef, Value> = desired_objects(&plan)
            .iter()
            .map(|(r, v)| (r.clone(), as_stored(v)))
            .collect();
        let mut in_sync = InSync::default();
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!((actions, compared), (vec![], stored.len()));
        // Nothing moved: nothing compared.
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!((actions, compared), (vec![], 0));

        // Kueue's status writes (its first status, every admission) and its
        // in-use finalizer move the resourceVersion and managedFields, not what
        // the diff reads: still in sync, nothing compared.
        for (target, object) in stored.iter_mut() {
            object["metadata"]["resourceVersion"] = json!("250");
            object["metadata"]["managedFields"] =
                json!([{"manager": "kaccel"}, {"manager": "kueue", "subresource": "status"}]);
            object["metadata"]["finalizers"] = json!(["kueue.x-k8s.io/resource-in-use"]);
            object["status"] = json!({"pendingWorkloads": target.name.len()});
        }
        let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
        assert_eq!((actions, compared), (vec![], 0));

        // A label or annotation edited by hand: compared, and put back.
        let rf = desired
            .keys()
            .find(|r| r.kind == Kind::ResourceFlavor)
            .unwrap()
            .clone();
        let before_edit = stored[&rf].clone();
        for (edit, key) in [
            ("labels", MANAGED_BY_LABEL),
            ("annotations", APPLIED_HASH_ANNOTATION),
        ] {
            stored.get_mut(&rf).unwrap()["metadata"][edit][key] = json!("edited");
            let (actions, compared) = diff_with(&mut in_sync, &desired, &stored);
            assert_eq!(compared, 1, "{edit}");
            assert!(
                matches!(&actions[..], [Action::Apply { target, create: false, .. }] if *target == rf),
                "{edit}: {actions:?}"
            );
            stored.insert(rf.clone(), before_edit.clone());
            diff_with(&mut in_sync, &desired, &stored);
        }

        // A hand edit of the spec: compared, restored.
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
        stored.insert(cq.clone(), as_stored(&desired.get(&cq).unwrap().value()));
        diff_with(&mut in_sync, &desired, &stored);
        let mut moved_plan = plan.clone();
        let moved_queue = &mut moved_plan.local_queues.make_mut()[0];
        let lq = ObjectRef {
            kind: Kind::LocalQueue,
            namespace: moved_queue.metadata.namespace.clone(),
            name: moved_queue.metadata.name.clone().unwrap(),
        };
        moved_queue
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "moved".into());
        let moved = DesiredObjects::of(&moved_plan);
        let (actions, compared) = diff_with(&mut in_sync, &moved, &stored);
        assert_eq!(compared, 1);
        assert!(
            matches!(&actions[..], [Action::Apply { target, create: false, .. }] if *target == lq),
            "{actions:?}"
        );

        // An object no longer planned is still deleted.
        let mut fewer_plan = plan.clone();
        fewer_plan.local_queues.make_mut().remove(0);
        let fewer = DesiredObjects::of(&fewer_plan);
        let (actions, _) = diff_with(&mut in_sync, &fewer, &stored);
        assert_eq!(actions, vec![Action::Delete { target: lq }]);
    }

    #[test]
    fn an_objects_fingerprint_follows_its_json_and_the_applied_hash() {
        // What the in-sync record keys on must move whenever the JSON written
        // (and its applied hash) would, and only then.
        let plan = example_plan();
        let once = DesiredObjects::of(&plan);
        let again = DesiredObjects::of(&plan);
        for target in once.keys() {
            assert_eq!(
                once.get(target).unwrap().fingerprint,
                again.get(target).unwrap().fingerprint
            );
        }
        let mut changed_plan = plan.clone();
        let queue = &mut changed_plan.cluster_queues[0];
        let cq = ObjectRef {
            kind: Kind::ClusterQueue,
            namespace: None,
            name: queue.metadata.name.clone().unwrap(),
        };
        queue.spec.resource_groups[0].flavors[0].resources[0].nominal_quota =
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("12345".into());
        let changed = DesiredObjects::of(&changed_plan);
        for target in once.keys() {
            let (before, after) = (once.get(target).unwrap(), changed.get(target).unwrap());
            let hash = |o: &DesiredObject| {
                o.value()["metadata"]["annotations"][APPLIED_HASH_ANNOTATION].clone()
            };
            assert_eq!(
                before.fingerprint == after.fingerprint,
                *target != cq,
                "{target}"
            );
            assert_eq!(hash(before) == hash(after), *target != cq, "{target}");
        }
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
