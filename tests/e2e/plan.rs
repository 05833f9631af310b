//! The planner's output against the real thing: kaccel's CRDs and CEL rules in the
//! API server, and the Kueue objects `kaccel plan` produces accepted by Kueue, which
//! then admits Workloads onto the flavor of the class they asked for.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use kaccel::api::{AcceleratorClass, CreditBudget};
use kaccel::cli::load::Loaded;
use kaccel::health::HealthSnapshot;
use kaccel::inventory::Inventory;
use kaccel::plan::{PlanInput, PlanOptions, plan};
use kube::Client;
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(60);

fn examples() -> Loaded {
    kaccel::testkit::examples()
}

fn workload(ns: &str, name: &str, queue: &str, count: u32, resource: &str, amount: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "queueName": queue, "podSets": [{
            "name": "main", "count": count,
            "template": { "spec": { "restartPolicy": "Never", "containers": [{
                "name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {
                    "requests": { "cpu": "1", "memory": "1Gi", resource: amount.to_string() },
                    "limits": { resource: amount.to_string() }
                }
            }]}}
        }]}
    })
}

fn admitted_flavor(obj: &Value, resource: &str) -> Option<String> {
    if !support::is_true(obj, "QuotaReserved") {
        return None;
    }
    obj.pointer("/status/admission/podSetAssignments/0/flavors")?
        .get(resource)?
        .as_str()
        .map(str::to_string)
}

#[tokio::test]
async fn planned_objects_are_accepted_by_kueue_and_admit_onto_the_class_flavor() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = plan_apply_admit(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn plan_apply_admit(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let mut loaded = examples();
    // Unique budgets, namespaces and root Cohort, so the test is independent of others.
    let id = support::unique("p");
    for b in &mut loaded.budgets {
        let name = format!("{}-{id}", b.metadata.name.as_ref().unwrap());
        b.metadata.name = Some(name);
        for ns in &mut b.spec.namespaces {
            *ns = format!("{ns}-{id}");
        }
    }
    let inventory = Inventory::from_nodes(&loaded.nodes);
    let options = PlanOptions {
        root_cohort: format!("kaccel-{id}"),
        ..Default::default()
    };
    let health = HealthSnapshot::default();
    let planned = plan(&PlanInput {
        classes: &loaded.classes,
        budgets: &loaded.budgets,
        inventory: &inventory,
        health: &health,
        options: &options,
    });

    for b in &loaded.budgets {
        for ns in &b.spec.namespaces {
            support::namespace(client, ns).await?;
            cleanup.add_namespace(ns);
        }
    }
    let ssa = PatchParams::apply("kaccel-e2e").force();
    let apply = |kind: &'static str, value: Value| {
        let client = client.clone();
        let ssa = ssa.clone();
        async move {
            let obj = support::object(value);
            let name = obj.metadata.name.clone().unwrap();
            let api: Api<DynamicObject> = match &obj.metadata.namespace {
                Some(ns) => Api::namespaced_with(client, ns, &kueue(kind)),
                None => Api::all_with(client, &kueue(kind)),
            };
            api.patch(&name, &ssa, &Patch::Apply(&obj))
                .await
                .with_context(|| format!("Kueue refused {kind} {name}"))?;
            Ok::<_, anyhow::Error>((obj.metadata.namespace, name))
        }
    };
    // Flavors are shared cluster-wide by name; only delete what this test created.
    let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    for f in &planned.resource_flavors {
        let name = f.metadata.name.clone().unwrap();
        let existed = flavors.get_opt(&name).await?.is_some();
        apply("ResourceFlavor", serde_json::to_value(f)?).await?;
        if !existed {
            cleanup.add(None, kueue("ResourceFlavor"), &name);
        }
    }
    for c in &planned.cohorts {
        let (_, name) = apply("Cohort", serde_json::to_value(c)?).await?;
        cleanup.add(None, kueue("Cohort"), &name);
    }
    for q in &planned.cluster_queues {
        let (_, name) = apply("ClusterQueue", serde_json::to_value(q)?).await?;
        cleanup.add(None, kueue("ClusterQueue"), &name);
    }
    for q in planned.local_queues.iter() {
        let (ns, name) = apply("LocalQueue", serde_json::to_value(q)?).await?;
        cleanup.add(ns.as_deref(), kueue("LocalQueue"), &name);
    }

    // Kueue accepts every planned ClusterQueue: all flavors exist, quotas are valid.
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    for q in &planned.cluster_queues {
        let name = q.metadata.name.as_ref().unwrap();
        if q.spec.resource_groups.is_empty() {
            continue;
        }
        support::wait_until(&cqs, name, "Active", WAIT, |o| {
            support::is_true(o, "Active")
        })
        .await?;
    }

    // The language team asks large-training for 2 x 8 NVIDIA GPUs: H100 (first in
    // the class's preference order) is where Kueue must put it.
    let lang_ns = format!("language-{id}");
    let wl: Api<DynamicObject> = Api::namespaced_with(client.clone(), &lang_ns, &kueue("Workload"));
    support::create(
        &wl,
        workload(
            &lang_ns,
            "h100-job",
            "large-training",
            2,
            "nvidia.com/gpu",
            8,
        ),
    )
    .await?;
    cleanup.add(Some(&lang_ns), kueue("Workload"), "h100-job");
    let obj = support::wait_until(&wl, "h100-job", "admitted", WAIT, |o| {
        admitted_flavor(o, "nvidia.com/gpu").is_some()
    })
    .await?;
    let flavor = admitted_flavor(&obj, "nvidia.com/gpu").unwrap();
    if flavor != "nvidia-h100-80gb-hbm3" {
        bail!("h100-job admitted on {flavor}, expected nvidia-h100-80gb-hbm3");
    }

    // An AMD request in the same class lands on the MI300X flavor.
    support::create(
        &wl,
        workload(&lang_ns, "amd-job", "large-training", 1, "amd.com/gpu", 4),
    )
    .await?;
    cleanup.add(Some(&lang_ns), kueue("Workload"), "amd-job");
    let obj = support::wait_until(&wl, "amd-job", "admitted", WAIT, |o| {
        admitted_flavor(o, "amd.com/gpu").is_some()
    })
    .await?;
    let flavor = admitted_flavor(&obj, "amd.com/gpu").unwrap();
    if !flavor.contains("mi300x") {
        bail!("amd-job admitted on {flavor}, expected the MI300X flavor");
    }

    // More than the whole healthy H100 fleet (31 schedulable): never admitted.
    support::create(
        &wl,
        workload(
            &lang_ns,
            "too-big",
            "large-training",
            5,
            "nvidia.com/gpu",
            8,
        ),
    )
    .await?;
    cleanup.add(Some(&lang_ns), kueue("Workload"), "too-big");
    let pending = support::wait_until(
        &wl,
        "too-big",
        "QuotaReserved=False with a reason",
        WAIT,
        |o| support::condition(o, "QuotaReserved").is_some_and(|c| c["status"] == "False"),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = support::get_json(&wl, "too-big").await?;
    if support::is_true(&still, "QuotaReserved") {
        bail!(
            "too-big was admitted beyond healthy capacity: {}",
            still["status"]
        );
    }
    let message = support::condition(&pending, "QuotaReserved").unwrap()["message"].to_string();
    eprintln!("too-big waits: {message}");
    Ok(())
}

#[tokio::test]
async fn api_server_enforces_the_cel_rules_with_field_messages() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let name = support::unique("cel");
    let bad: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": name },
        "spec": { "sharing": "Partition", "credits": { "perDeviceHour": "-1" } }
    }))
    .unwrap();
    let err = classes
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("the API server accepted a Partition class without a profile");
    let text = err.to_string();
    assert!(
        text.contains("spec.selector.partitionProfile is required"),
        "{text}"
    );
    assert!(text.contains("perDeviceHour"), "{text}");

    // A rate that parses but that the ledger cannot price (a year of one device
    // would overflow its amounts) is refused at apply time too.
    let too_large: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": name },
        "spec": { "sharing": "Whole", "credits": { "perDeviceHour": "999999999999" } }
    }))
    .unwrap();
    let err = classes
        .create(&PostParams::default(), &too_large)
        .await
        .expect_err("the API server accepted a rate above the largest the ledger prices");
    assert!(
        err.to_string()
            .contains("spec.credits.perDeviceHour must be a non-negative decimal below 1000000000"),
        "{err}"
    );

    let budgets: Api<CreditBudget> = Api::all(client.clone());
    let bad: CreditBudget = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": { "name": name },
        "spec": { "team": "t", "namespaces": ["a", "a"], "classes": [{"name": "x"}],
                  "credits": { "perPeriod": "10", "period": { "start": "2026-12-01T00:00:00Z", "days": 30 } } }
    }))
    .unwrap();
    let err = budgets
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("the API server accepted a budget with a repeated namespace");
    assert!(err.to_string().contains("Duplicate value"), "{err}");

    // A valid class is stored and reads back unchanged.
    let good: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": { "name": name },
        "spec": { "sharing": "Partition", "selector": { "partitionProfile": "1g.10gb" },
                  "credits": { "perDeviceHour": "0.25" } }
    }))
    .unwrap();
    let created = classes.create(&PostParams::default(), &good).await.unwrap();
    assert_eq!(created.spec, good.spec);
    classes.delete(&name, &Default::default()).await.unwrap();
}
