//! Stage 8, build objects: the Kueue objects, and the budget and class each ClusterQueue bills.

use crate::api::parsed::ParsedBudget;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use kube::{Resource, ResourceExt};

use crate::api::{self, AcceleratorClass, CreditBudget, DesiredCondition, ExhaustionPolicy};
use crate::kueue::{
    AdmissionCheckStrategyRule, AdmissionChecksStrategy, ClusterQueue, ClusterQueuePreemption,
    ClusterQueueSpec, Cohort, CohortSpec, FairSharing, FlavorFungibility, FlavorQuotas, LocalQueue,
    LocalQueueSpec, ResourceFlavor, ResourceFlavorSpec, ResourceGroup, ResourceQuota,
};

use super::flavors::{FlavorAcc, FlavorKey};
use super::{
    BUDGET_LABEL, BudgetReport, CLASS_LABEL, CPU, ClassReport, FLAVOR_LABEL, FlavorReport,
    MANAGED_BY_LABEL, MAX_FLAVORS_PER_GROUP, MEMORY, PlanOptions, TEAM_LABEL, cluster_queue_name,
    kueue_counting, name_of, status,
};
use crate::k8s::labels::{DEVICE_RESOURCE_ANNOTATION, MODEL_ANNOTATION, VENDOR_ANNOTATION};
use crate::k8s::names;

/// What the objects are built from: the outputs of the earlier stages.
pub(super) struct ObjectsInput<'a> {
    pub(super) flavors: &'a BTreeMap<FlavorKey, FlavorAcc>,
    pub(super) flavor_names: &'a BTreeMap<FlavorKey, String>,
    pub(super) flavor_reports: &'a BTreeMap<String, FlavorReport>,
    pub(super) class_by_name: &'a BTreeMap<String, &'a AcceleratorClass>,
    pub(super) class_reports: &'a BTreeMap<String, ClassReport>,
    pub(super) class_order: &'a BTreeMap<String, Vec<String>>,
    /// Budgets oldest first, as admitted.
    pub(super) budgets: &'a [&'a CreditBudget],
    /// Budgets in input order (see [`price_invalid_class_queues`]).
    pub(super) input_budgets: &'a [CreditBudget],
    pub(super) namespaces: &'a BTreeMap<String, Vec<String>>,
    pub(super) options: &'a PlanOptions,
    /// The last plan's LocalQueues, reused when these inputs call for the same.
    pub(super) kept_local_queues: Option<&'a LocalQueues>,
}

/// The Kueue objects, each list sorted by name (LocalQueues by namespace, name).
#[derive(Default)]
pub(super) struct KueueObjects {
    pub(super) resource_flavors: Vec<ResourceFlavor>,
    pub(super) cohorts: Vec<Cohort>,
    pub(super) cluster_queues: Vec<ClusterQueue>,
    pub(super) local_queues: LocalQueues,
    /// ClusterQueue -> (budget, class); see [`super::Plan::priced_queues`].
    pub(super) priced_queues: BTreeMap<String, (String, String)>,
}

/// Builds every object. Each valid budget's report gets its cohort, queue names,
/// an `Exhausted` condition when its credits are held, and its `Ready` condition.
pub(super) fn build(
    input: &ObjectsInput<'_>,
    budget_reports: &mut BTreeMap<String, BudgetReport>,
) -> KueueObjects {
    let options = input.options;
    let mut objects = KueueObjects::default();
    for (key, name) in input.flavor_names {
        objects.resource_flavors.push(build_flavor(
            name,
            key,
            &input.flavor_reports[name],
            &input.flavors[key],
            input.class_by_name,
            &options.instance,
        ));
    }
    objects
        .resource_flavors
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    objects
        .cohorts
        .push(build_root_cohort(options, input.flavor_reports));
    let mut wanted_queues: Vec<WantedQueue<'_>> = Vec::new();

    for &budget in input.budgets {
        let bname = name_of(&budget.metadata);
        let report = budget_reports.get_mut(&bname).expect("budget report");
        let Some(weight) = report
            .amounts
            .as_ref()
            .filter(|_| report.valid)
            .map(|amounts| team_weight(amounts, budget.spec.credits.period.days))
        else {
            continue;
        };
        let team_cohort = names::bounded(&[&options.root_cohort, &bname], 253);
        objects.cohorts.push(Cohort {
            metadata: meta(
                &team_cohort,
                None,
                labels_for(&options.instance, Some(budget), None),
                owner_ref(budget),
            ),
            spec: CohortSpec {
                parent_name: Some(options.root_cohort.clone()),
                resource_groups: vec![],
                fair_sharing: Some(FairSharing {
                    weight: Some(weight),
                }),
            },
        });
        report.cohort = Some(team_cohort.clone());
        let held = options.held_budgets.get(&bname).copied();
        if let Some(policy) = held {
            report.conditions.push(DesiredCondition::new(
                api::EXHAUSTED,
                true,
                "CreditsExhausted",
                format!(
                    "the team's credits are used up: its ClusterQueues are on {} until credits return (new period or top-up)",
                    policy.as_str()
                ),
            ));
        }
        let namespaces: &[String] = input
            .namespaces
            .get(&bname)
            .map(Vec::as_slice)
            .unwrap_or_default();
        for grant in &budget.spec.classes {
            let Some(class) = input.class_by_name.get(&grant.name) else {
                continue;
            };
            if !input.class_reports[&grant.name].valid {
                continue;
            }
            let cq_name = cluster_queue_name(&bname, &grant.name);
            let order = input
                .class_order
                .get(&grant.name)
                .cloned()
                .unwrap_or_default();
            let cq = build_cluster_queue(
                &cq_name,
                &team_cohort,
                budget,
                class,
                &order,
                input.flavor_reports,
                &report.grants,
                namespaces,
                held,
                options,
            );
            objects.cluster_queues.push(cq);
            // A later queue of the same name replaces an earlier one here, as it
            // would among the sorted queues.
            objects
                .priced_queues
                .insert(cq_name.clone(), (bname.clone(), grant.name.clone()));
            report.cluster_queues.push(cq_name.clone());
            for ns in namespaces {
                wanted_queues.push(WantedQueue {
                    class: &grant.name,
                    namespace: ns,
                    budget,
                    cluster_queue: objects.cluster_queues.len() - 1,
                });
                report.local_queues.push(format!("{ns}/{}", grant.name));
            }
        }
        // Ready sums up this budget's conditions so far, including Exhausted.
        let ready = status::budget_ready(report);
        report.conditions.insert(0, ready);
    }
    objects.local_queues = LocalQueues::of(
        &wanted_queues,
        &objects.cluster_queues,
        &options.instance,
        input.kept_local_queues,
    );
    price_invalid_class_queues(
        &mut objects.priced_queues,
        input.input_budgets,
        input.class_reports,
    );
    objects
        .cohorts
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    objects
        .cluster_queues
        .sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    objects
}

/// A LocalQueue the budgets call for: the class's queue in one of the budget's
/// namespaces, pointing at the ClusterQueue at `cluster_queue` (in build order).
struct WantedQueue<'a> {
    class: &'a str,
    namespace: &'a str,
    budget: &'a CreditBudget,
    cluster_queue: usize,
}

/// The planned LocalQueues, sorted by namespace and name, kept whole between
/// plans: they follow from the budgets, their namespaces and the classes' validity
/// alone, so a Node or health change leaves every one as it was, and building them
/// afresh (1,600 in the fleet bench, each with its labels and owner reference)
/// was a fifth of a plan's heap allocations. [`super::plan_carrying`] takes the
/// last plan's and reuses them, unchanged, when the inputs call for exactly those.
#[derive(Clone, Debug, Default)]
pub struct LocalQueues {
    queues: Arc<Vec<LocalQueue>>,
    /// For each queue in the order the inputs produced it, where the sort put it;
    /// empty once the queues were edited (then never reused).
    sorted_at: Arc<Vec<u32>>,
}

impl std::ops::Deref for LocalQueues {
    type Target = [LocalQueue];

    fn deref(&self) -> &[LocalQueue] {
        &self.queues
    }
}

impl serde::Serialize for LocalQueues {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.queues.serialize(serializer)
    }
}

impl LocalQueues {
    /// The queues to edit (tests, and callers that adjust a plan): no longer
    /// reusable by a later plan.
    pub fn make_mut(&mut self) -> &mut Vec<LocalQueue> {
        self.sorted_at = Arc::default();
        Arc::make_mut(&mut self.queues)
    }

    /// Whether `self` and `other` share their queues (one was reused from the other).
    pub fn shared_with(&self, other: &LocalQueues) -> bool {
        Arc::ptr_eq(&self.queues, &other.queues)
    }

    fn of(
        wanted: &[WantedQueue<'_>],
        cluster_queues: &[ClusterQueue],
        instance: &str,
        kept: Option<&LocalQueues>,
    ) -> Self {
        let cluster_queue_of = |w: &WantedQueue<'_>| {
            cluster_queues
                .get(w.cluster_queue)
                .and_then(|q| q.metadata.name.as_deref())
                .unwrap_or_default()
        };
        if let Some(kept) = kept
            && kept.queues.len() == wanted.len()
            && kept.sorted_at.len() == wanted.len()
            && wanted.iter().zip(kept.sorted_at.iter()).all(|(w, &at)| {
                kept.queues.get(at as usize).is_some_and(|q| {
                    q.metadata.name.as_deref() == Some(w.class)
                        && q.metadata.namespace.as_deref() == Some(w.namespace)
                        && q.spec.cluster_queue == cluster_queue_of(w)
                        && labels_are(
                            q.metadata.labels.as_ref(),
                            label_pairs(instance, Some(w.budget), Some(w.class)),
                        )
                        && owned_by(q.metadata.owner_references.as_ref(), w.budget)
                })
            })
        {
            // Each queue the inputs produce is the kept one at its sorted place,
            // so building and sorting them again would give the kept list.
            return kept.clone();
        }
        let built: Vec<LocalQueue> = wanted
            .iter()
            .map(|w| LocalQueue {
                metadata: meta(
                    w.class,
                    Some(w.namespace),
                    labels_for(instance, Some(w.budget), Some(w.class)),
                    owner_ref(w.budget),
                ),
                spec: LocalQueueSpec {
                    cluster_queue: cluster_queue_of(w).to_string(),
                    stop_policy: None,
                },
            })
            .collect();
        // A stable sort of positions: equal names keep their input order.
        let mut order: Vec<usize> = (0..built.len()).collect();
        order.sort_by(|&a, &b| {
            let (a, b) = (&built[a].metadata, &built[b].metadata);
            (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name))
        });
        let mut sorted_at = vec![0u32; built.len()];
        for (at, &from) in order.iter().enumerate() {
            sorted_at[from] = at as u32;
        }
        let mut slots: Vec<Option<LocalQueue>> = built.into_iter().map(Some).collect();
        let queues = order
            .into_iter()
            .filter_map(|from| slots.get_mut(from).and_then(Option::take))
            .collect();
        LocalQueues {
            queues: Arc::new(queues),
            sorted_at: Arc::new(sorted_at),
        }
    }
}

/// Adds the queues of grants whose class is invalid, which are not planned (kaccel
/// deletes them): Workloads still holding quota in them must get the class's own
/// error from the credit check rather than wait on a queue nobody pays for. Every
/// budget counts here, valid or not, in input order; a planned queue keeps its entry.
fn price_invalid_class_queues(
    priced_queues: &mut BTreeMap<String, (String, String)>,
    budgets: &[CreditBudget],
    class_reports: &BTreeMap<String, ClassReport>,
) {
    for budget in budgets {
        // name_any, like the controller that reads these names back.
        let name = budget.name_any();
        for grant in &budget.spec.classes {
            if class_reports.get(&grant.name).is_some_and(|c| !c.valid) {
                priced_queues
                    .entry(cluster_queue_name(&name, &grant.name))
                    .or_insert_with(|| (name.clone(), grant.name.clone()));
            }
        }
    }
}

fn meta(
    name: &str,
    namespace: Option<&str>,
    labels: BTreeMap<String, String>,
    owners: Vec<OwnerReference>,
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels),
        owner_references: (!owners.is_empty()).then_some(owners),
        ..Default::default()
    }
}

fn labels_for(
    instance: &str,
    budget: Option<&CreditBudget>,
    class: Option<&str>,
) -> BTreeMap<String, String> {
    label_pairs(instance, budget, class)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The labels of a planned object, as pairs (their keys differ): what
/// `labels_for` builds and `labels_are` checks.
fn label_pairs<'a>(
    instance: &'a str,
    budget: Option<&'a CreditBudget>,
    class: Option<&'a str>,
) -> impl Iterator<Item = (&'static str, &'a str)> {
    let of_budget = budget.into_iter().flat_map(|b| {
        [
            (BUDGET_LABEL, b.metadata.name.as_deref().unwrap_or_default()),
            (TEAM_LABEL, b.spec.team.as_str()),
        ]
    });
    std::iter::once((MANAGED_BY_LABEL, instance))
        .chain(of_budget)
        .chain(class.map(|c| (CLASS_LABEL, c)))
}

/// `labels` are exactly `pairs`.
fn labels_are<'a>(
    labels: Option<&BTreeMap<String, String>>,
    pairs: impl Iterator<Item = (&'static str, &'a str)>,
) -> bool {
    let Some(labels) = labels else {
        return false;
    };
    let mut count = 0;
    pairs
        .inspect(|_| count += 1)
        .all(|(k, v)| labels.get(k).map(String::as_str) == Some(v))
        && labels.len() == count
}

/// `owners` are what `owner_ref(obj)` gives (as `meta` stores it).
fn owned_by<K: Resource<DynamicType = ()>>(owners: Option<&Vec<OwnerReference>>, obj: &K) -> bool {
    let meta = obj.meta();
    match (&meta.uid, &meta.name, owners.map(Vec::as_slice)) {
        (Some(uid), Some(name), Some([o])) => {
            o.uid == *uid
                && o.name == *name
                && o.api_version == K::api_version(&())
                && o.kind == K::kind(&())
                && o.controller == Some(true)
                && o.block_owner_deletion.is_none()
        }
        (Some(_), Some(_), _) => false,
        (_, _, owners) => owners.is_none(),
    }
}

/// Owner reference to a kaccel object, when it came from the API server (has a UID).
fn owner_ref<K: Resource<DynamicType = ()>>(obj: &K) -> Vec<OwnerReference> {
    let meta = obj.meta();
    match (&meta.uid, &meta.name) {
        (Some(uid), Some(name)) => vec![OwnerReference {
            api_version: K::api_version(&()).to_string(),
            kind: K::kind(&()).to_string(),
            name: name.clone(),
            uid: uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }],
        _ => vec![],
    }
}

fn build_flavor(
    name: &str,
    key: &FlavorKey,
    report: &FlavorReport,
    acc: &FlavorAcc,
    classes: &BTreeMap<String, &AcceleratorClass>,
    instance: &str,
) -> ResourceFlavor {
    let mut labels = labels_for(instance, None, None);
    labels.insert(FLAVOR_LABEL.into(), name.to_string());
    // A flavor shared by several classes is owned by each of them (no controller
    // owner), so it goes away only when the last class using it does.
    let owners: Vec<OwnerReference> = acc
        .classes
        .iter()
        .filter_map(|c| classes.get(c))
        .flat_map(|c| owner_ref(*c))
        .map(|mut o| {
            o.controller = None;
            o
        })
        .collect();
    let mut metadata = meta(name, None, labels, owners);
    // What the pod webhook needs to place a class-level request on this flavor.
    if kueue_counting::counts_as_class_resource(report) {
        let mut annotations = BTreeMap::from([
            (
                DEVICE_RESOURCE_ANNOTATION.to_string(),
                kueue_counting::pod_resource(report),
            ),
            (MODEL_ANNOTATION.to_string(), report.model.clone()),
        ]);
        if let Some(vendor) = report.vendor {
            annotations.insert(VENDOR_ANNOTATION.to_string(), vendor.as_str().to_string());
        }
        metadata.annotations = Some(annotations);
    }
    ResourceFlavor {
        metadata,
        spec: ResourceFlavorSpec {
            node_labels: key.node_labels(),
            tolerations: report
                .tolerated_taint_keys
                .iter()
                .map(|k| k8s_openapi::api::core::v1::Toleration {
                    key: Some(k.clone()),
                    operator: Some("Exists".into()),
                    effect: Some("NoSchedule".into()),
                    ..Default::default()
                })
                .collect(),
            topology_name: report.topology.as_ref().map(|t| t.name.clone()),
        },
    }
}

fn build_root_cohort(options: &PlanOptions, reports: &BTreeMap<String, FlavorReport>) -> Cohort {
    let resource_groups = if reports.is_empty() {
        vec![]
    } else {
        let flavors: Vec<&FlavorReport> = reports.values().take(MAX_FLAVORS_PER_GROUP).collect();
        let covered = covered_resources(flavors.iter().copied());
        vec![ResourceGroup {
            flavors: flavors
                .iter()
                .map(|r| FlavorQuotas {
                    name: r.name.clone(),
                    resources: quotas_for(&covered, r, r.spare, None),
                })
                .collect(),
            covered_resources: covered,
        }]
    };
    Cohort {
        metadata: meta(
            &options.root_cohort,
            None,
            labels_for(&options.instance, None, None),
            vec![],
        ),
        spec: CohortSpec {
            parent_name: None,
            resource_groups,
            fair_sharing: None,
        },
    }
}

/// Device resources of the flavors (sorted), the class resource when a flavor is
/// asked for by it, then cpu and memory: Kueue refuses a workload that requests a
/// resource its ClusterQueue does not cover.
fn covered_resources<'a>(flavors: impl Iterator<Item = &'a FlavorReport>) -> Vec<String> {
    let mut class_resource = false;
    let devices: BTreeSet<String> = flavors
        .inspect(|r| class_resource |= kueue_counting::counts_as_class_resource(r))
        .map(|r| r.resource_name.clone())
        .filter(|r| r != CPU && r != api::CLASS_RESOURCE)
        .collect();
    devices
        .into_iter()
        .chain(class_resource.then(|| api::CLASS_RESOURCE.to_string()))
        .chain([CPU.to_string(), MEMORY.to_string()])
        .collect()
}

/// Quotas of one flavor for every covered resource: `amount` units of the flavor's
/// own resource and of the class resource (when the flavor is asked for by it),
/// the matching share of its CPU and memory, and 0 of the others.
fn quotas_for(
    covered: &[String],
    flavor: &FlavorReport,
    amount: u64,
    borrowing_limit: Option<u64>,
) -> Vec<ResourceQuota> {
    let share =
        |total: u64| -> u64 { per_device(total, flavor.healthy_capacity).saturating_mul(amount) };
    let is_cpu_pool = flavor.resource_name == CPU;
    covered
        .iter()
        .map(|r| {
            let nominal = if r == CPU {
                cpu_quantity(if is_cpu_pool {
                    amount * 1000
                } else {
                    share(flavor.cpu_millis)
                })
            } else if r == MEMORY {
                Quantity(share(flavor.memory_bytes).to_string())
            } else if *r == flavor.resource_name {
                Quantity(amount.to_string())
            } else if r == api::CLASS_RESOURCE && kueue_counting::counts_as_class_resource(flavor) {
                // The same devices again: Kueue counts each vendor unit as the class
                // resource too, so this quota bounds both names together.
                Quantity(amount.to_string())
            } else {
                Quantity("0".into())
            };
            ResourceQuota {
                name: r.clone(),
                nominal_quota: nominal,
                borrowing_limit: borrowing_limit.map(|b| Quantity(b.to_string())),
                lending_limit: None,
            }
        })
        .collect()
}

/// A flavor's CPU (millicores) or memory (bytes) per healthy device, rounded down
/// to 8 significant bits. Quotas are `amount` times it: one Node's change moves the
/// flavor's average by a hair, and an exact average would rewrite every
/// ClusterQueue holding the flavor for it (132 of 800 for one relabelled node of
/// 5,000). Rounding down keeps every sum within the flavor's capacity and costs
/// under 0.4 %.
pub(super) fn per_device(total: u64, healthy_devices: u64) -> u64 {
    if healthy_devices == 0 {
        return 0;
    }
    let exact = total / healthy_devices;
    let step = match exact >> 8 {
        0 => 1,
        coarse => 1u64 << (63 - coarse.leading_zeros()),
    };
    exact - exact % step
}

fn cpu_quantity(millis: u64) -> Quantity {
    if millis.is_multiple_of(1000) {
        Quantity((millis / 1000).to_string())
    } else {
        Quantity(format!("{millis}m"))
    }
}

/// Team weight: explicit, or credits per day (so a team with twice the budget gets
/// twice the share of idle capacity).
fn team_weight(amounts: &ParsedBudget, period_days: u32) -> Quantity {
    if let Some(weight) = amounts.fair_share_weight {
        return Quantity(format!("{}m", weight.micros() / 1000));
    }
    let per_day_milli = amounts.per_period.micros() / 1000 / u64::from(period_days.max(1));
    Quantity(format!("{per_day_milli}m"))
}

#[allow(clippy::too_many_arguments)]
fn build_cluster_queue(
    name: &str,
    team_cohort: &str,
    budget: &CreditBudget,
    class: &AcceleratorClass,
    order: &[String],
    reports: &BTreeMap<String, FlavorReport>,
    grants: &BTreeMap<(String, String), u64>,
    namespaces: &[String],
    held: Option<ExhaustionPolicy>,
    options: &PlanOptions,
) -> ClusterQueue {
    let class_name = name_of(&class.metadata);
    let flavors: Vec<&FlavorReport> = order
        .iter()
        .take(MAX_FLAVORS_PER_GROUP)
        .map(|f| &reports[f])
        .collect();
    let resource_groups = if flavors.is_empty() {
        vec![]
    } else {
        let covered = covered_resources(flavors.iter().copied());
        let borrowing = (!budget.spec.allow_borrowing).then_some(0);
        vec![ResourceGroup {
            flavors: flavors
                .iter()
                .map(|r| FlavorQuotas {
                    name: r.name.clone(),
                    resources: quotas_for(
                        &covered,
                        r,
                        grants
                            .get(&(class_name.clone(), r.name.clone()))
                            .copied()
                            .unwrap_or(0),
                        borrowing,
                    ),
                })
                .collect(),
            covered_resources: covered,
        }]
    };
    ClusterQueue {
        metadata: meta(
            name,
            None,
            labels_for(&options.instance, Some(budget), Some(&class_name)),
            owner_ref(budget),
        ),
        spec: ClusterQueueSpec {
            cohort_name: Some(team_cohort.to_string()),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".into(),
                    operator: "In".into(),
                    values: Some(namespaces.to_vec()),
                }]),
                match_labels: None,
            }),
            resource_groups,
            queueing_strategy: Some(options.queueing_strategy.clone()),
            // Try every flavor before borrowing or preempting, so the preference
            // order (healthy flavors first) is what decides placement.
            flavor_fungibility: Some(FlavorFungibility {
                when_can_borrow: Some("TryNextFlavor".into()),
                when_can_preempt: Some("TryNextFlavor".into()),
            }),
            // A guarantee is nominal quota that others may borrow while it is
            // idle; Kueue's default (`Never`) would never give it back, so the
            // owner reclaims it by preempting borrowers.
            preemption: Some(ClusterQueuePreemption {
                reclaim_within_cohort: Some("Any".into()),
            }),
            stop_policy: Some(held.map(|p| p.as_str()).unwrap_or("None").to_string()),
            fair_sharing: None,
            admission_checks_strategy: admission_checks(options),
        },
        status: None,
    }
}

/// The credit check, then MultiKueue's (both on every flavor), when set.
fn admission_checks(options: &PlanOptions) -> Option<AdmissionChecksStrategy> {
    let admission_checks: Vec<AdmissionCheckStrategyRule> = [
        options.admission_check.as_ref(),
        options.multikueue_check.as_ref(),
    ]
    .into_iter()
    .flatten()
    .map(|name| AdmissionCheckStrategyRule { name: name.clone() })
    .collect();
    (!admission_checks.is_empty()).then_some(AdmissionChecksStrategy { admission_checks })
}

#[cfg(test)]
mod tests;
