//! Class-level requests against the real kube-apiserver + Kueue, whose
//! configuration counts every vendor device resource as `kaccel.io/accelerator`
//! too (e2e/cluster.sh, `E2E_CLASS_COUNTED`): Workloads that name the class's
//! neutral resource land on the class's flavors in preference order, one device
//! is one count however it is asked for, the class's device counts are held,
//! and a ClusterQueue kaccel does not own that the transformation blocks is
//! reported (never written to).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use serde_json::{Value, json};

use crate::controller::{metric_sum, wait_for, wait_obj};
use crate::ledger::{Env, WAIT, admitted, device_workload, export, with_env};
use crate::support::{self, is_true, kueue};

const CLASS_RESOURCE: &str = "kaccel.io/accelerator";

/// An 8-device node of `vendor` ("nvidia" or "amd") whose product no other test
/// uses, labelled as the vendor's labeller does.
fn node(name: &str, vendor: &str, product: &str) -> Node {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let (labels, resource) = match vendor {
        "nvidia" => (
            json!({"kubernetes.io/hostname": name, "nvidia.com/gpu.present": "true",
                   "nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": "81559",
                   "nvidia.com/gpu.count": "8", "nvidia.com/gpu.family": "hopper",
                   "nvidia.com/gpu.compute.major": "9", "nvidia.com/gpu.compute.minor": "0"}),
            "nvidia.com/gpu",
        ),
        _ => (
            json!({"kubernetes.io/hostname": name, "amd.com/gpu.product-name": product,
                   "amd.com/gpu.family": "AI", "amd.com/gpu.vram": "192G",
                   "amd.com/gpu.device-id": "74a1"}),
            "amd.com/gpu",
        ),
    };
    support::ready_node(
        name,
        labels,
        json!({"cpu": "192", "memory": "2Ti", "pods": "110", resource: "8"}),
        &now,
    )
}

/// One pod asking for `units` of each of `resources` (requests = limits).
fn pod_workload(ns: &str, name: &str, queue: &str, resources: &[(&str, u32)]) -> Value {
    let mut w = device_workload(ns, name, queue, resources[0].0, resources[0].1, Some(60));
    for (resource, units) in &resources[1..] {
        let c = &mut w["spec"]["podSets"][0]["template"]["spec"]["containers"][0]["resources"];
        c["requests"][resource] = json!(units.to_string());
        c["limits"][resource] = json!(units.to_string());
    }
    w
}

/// The flavor and units of `resource` in the Workload's admission.
fn assigned(wl: &Value, resource: &str) -> Option<(String, String)> {
    let psa = wl.pointer("/status/admission/podSetAssignments/0")?;
    Some((
        psa["flavors"][resource].as_str()?.to_string(),
        psa["resourceUsage"][resource].as_str()?.to_string(),
    ))
}

fn class_condition<'a>(class: &'a Value, type_: &str) -> Option<&'a Value> {
    support::condition(class, type_)
}

/// A test's own fleet, class and team: one 8-GPU node per vendor of `vendors`
/// ("nvidia", "amd"), each of a product no other test uses; a class over those
/// products in that order of preference, 1 credit per device-second (2 on AMD),
/// with `extra` merged into its spec; and a budget guaranteeing all their devices.
struct TestClass {
    class: String,
    team: String,
    ns: String,
    products: Vec<String>,
}

async fn test_class(env: &mut Env, tag: &str, vendors: &[&str], extra: Value) -> Result<TestClass> {
    let id = env.id.clone();
    let nodes: Api<Node> = Api::all(env.client.clone());
    let mut products = Vec::new();
    for vendor in vendors {
        let product = match *vendor {
            "nvidia" => format!("NVIDIA-E2E-{}-{id}", tag.to_uppercase()),
            _ => format!("AMD_Instinct_E2E_{}_{id}", tag.to_uppercase()),
        };
        let name = format!("{tag}-{vendor}-{id}");
        nodes
            .create(&PostParams::default(), &node(&name, vendor, &product))
            .await
            .context("creating a test node")?;
        env.cleanup
            .add(None, ApiResource::erase::<Node>(&()), &name);
        products.push(product);
    }
    let overrides: Vec<Value> = products
        .iter()
        .filter(|p| p.starts_with("AMD"))
        .map(|p| json!({"model": p, "perDeviceHour": "7200"}))
        .collect();
    let class = format!("{tag}-{id}");
    let mut spec = json!({"sharing": "Whole",
                          "selector": {"models": products},
                          "credits": {"perDeviceHour": "3600", "modelOverrides": overrides}});
    if products.len() > 1 {
        spec["preference"] = json!(products);
    }
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
        spec.extend(extra.clone());
    }
    env.create_class(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class}, "spec": spec,
    }))
    .await?;
    let (team, ns) = (format!("team-{id}"), format!("ns-{id}"));
    env.create_budget(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": {"name": team},
        "spec": {"team": "e2e", "namespaces": [ns],
            "classes": [{"name": class, "guaranteedDevices": 8 * vendors.len()}],
            "credits": {"perPeriod": "1000000", "period": {"start": "2026-12-01T00:00:00Z", "days": 30}}},
    }))
    .await?;
    Ok(TestClass {
        class,
        team,
        ns,
        products,
    })
}

/// The class's ClusterQueue once Active with both flavors, and their names in
/// preference order (NVIDIA, then AMD).
async fn two_flavor_queue(env: &Env, t: &TestClass) -> Result<(Value, String, String)> {
    let cq = format!("{}-{}", t.team, t.class);
    let queue = wait_obj(&env.cqs.clone(), &cq, "two flavors", |q| {
        q["spec"]["resourceGroups"][0]["flavors"]
            .as_array()
            .is_some_and(|f| f.len() == 2)
            && is_true(q, "Active")
    })
    .await?;
    let flavor = |i: usize| {
        queue["spec"]["resourceGroups"][0]["flavors"][i]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let (nv_flavor, amd_flavor) = (flavor(0), flavor(1));
    Ok((queue, nv_flavor, amd_flavor))
}

#[tokio::test]
async fn a_class_request_lands_by_preference_counts_once_and_is_held_to_the_class_counts() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("kcls", |env| class_requests(&mut env, &store).await);
}

async fn class_requests(env: &mut Env, store: &str) -> Result<()> {
    let id = env.id.clone();
    let client = env.client.clone();
    let t = test_class(
        env,
        "cls",
        &["nvidia", "amd"],
        json!({"devicesPerPod": [4, 8]}),
    )
    .await?;
    let (class, team, ns) = (t.class.clone(), t.team.clone(), t.ns.clone());
    let (nv_product, amd_product) = (t.products[0].clone(), t.products[1].clone());
    let kueue_config = crate::dra::kueue_config_file();
    env.start_with(store, |config| {
        config + &format!("kueue:\n  configFile: {kueue_config}\n")
    });

    // The ClusterQueue covers the class resource beside both vendor resources,
    // with the same quota as each flavor's own resource.
    let cqs = env.cqs.clone();
    let (queue, nv_flavor, amd_flavor) = two_flavor_queue(env, &t).await?;
    ensure!(
        nv_flavor.contains("nvidia") && amd_flavor.contains("amd"),
        "preference order: {nv_flavor}, {amd_flavor}"
    );
    let quotas = |flavor: usize| -> BTreeMap<String, String> {
        queue["spec"]["resourceGroups"][0]["flavors"][flavor]["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["name"].as_str().is_some_and(|n| n.contains('/')))
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or_default().to_string(),
                    r["nominalQuota"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    };
    let want = |vendor: &str| {
        let mut m = BTreeMap::from([
            ("nvidia.com/gpu".to_string(), "0".to_string()),
            ("amd.com/gpu".to_string(), "0".to_string()),
            (CLASS_RESOURCE.to_string(), "8".to_string()),
        ]);
        m.insert(vendor.to_string(), "8".to_string());
        m
    };
    ensure!(quotas(0) == want("nvidia.com/gpu"), "{:?}", quotas(0));
    ensure!(quotas(1) == want("amd.com/gpu"), "{:?}", quotas(1));

    // kaccel read the harness's Kueue configuration: it transforms both.
    let classes = Api::<DynamicObject>::all_with(client.clone(), &crate::ledger::class_ar());
    let counted = wait_obj(&classes, &class, "KueueCountsClassRequests", |c| {
        class_condition(c, "KueueCountsClassRequests").is_some()
    })
    .await?;
    let c = class_condition(&counted, "KueueCountsClassRequests").unwrap();
    ensure!(c["status"] == "True", "{c}");

    let wls = env.workloads(&ns);
    // The class's counts: 3 per pod is refused, naming the class and the counts.
    env.create_workload(pod_workload(&ns, "three", &class, &[(CLASS_RESOURCE, 3)]))
        .await?;
    // One pod asking by both names: Kueue could not count it once; refused.
    env.create_workload(pod_workload(
        &ns,
        "both",
        &class,
        &[("nvidia.com/gpu", 4), (CLASS_RESOURCE, 4)],
    ))
    .await?;
    for (name, needles) in [
        (
            "three",
            vec![
                format!("AcceleratorClass {class} allows 4 or 8 device(s) per pod"),
                "asks for 3 per pod".to_string(),
            ],
        ),
        (
            "both",
            vec!["asks for devices as both kaccel.io/accelerator and nvidia.com/gpu".to_string()],
        ),
    ] {
        // Kueue deactivates a Workload whose check is Rejected, and resets the
        // check (its message with it) to Pending: the user reads kaccel's reason
        // in a Warning Event on the Workload.
        let wl = support::wait_until(&wls, name, "deactivated", WAIT, |w| {
            w["spec"]["active"] == false
        })
        .await?;
        ensure!(
            wl["status"]["conditions"]
                .to_string()
                .contains("kaccel-credits, were rejected"),
            "{name}: {}",
            wl["status"]
        );
        let message =
            support::event_note(&client, &ns, None, name, "CreditCheckRejected", WAIT).await?;
        for needle in &needles {
            ensure!(message.contains(needle.as_str()), "{name}: {message}");
        }
    }
    // Their quota goes back (what the job integration does once Kueue evicts a
    // deactivated Workload) before the next ones.
    for name in ["three", "both"] {
        let wl = support::get_json(&wls, name).await?;
        support::release_quota(&wls, name, &wl).await?;
        support::wait_until(&wls, name, "no quota held", WAIT, |w| {
            !is_true(w, "QuotaReserved")
        })
        .await?;
    }

    // 4 by the vendor name and 4 by the class name fill the NVIDIA flavor ...
    env.create_workload(pod_workload(
        &ns,
        "vendor",
        &class,
        &[("nvidia.com/gpu", 4)],
    ))
    .await?;
    let vendor = support::wait_until(&wls, "vendor", "admitted", WAIT, admitted).await?;
    ensure!(
        assigned(&vendor, "nvidia.com/gpu") == Some((nv_flavor.clone(), "4".into()))
            && assigned(&vendor, CLASS_RESOURCE) == Some((nv_flavor.clone(), "4".into())),
        "Kueue counts the vendor request as the class resource too: {}",
        vendor["status"]["admission"]
    );
    env.create_workload(pod_workload(&ns, "class-a", &class, &[(CLASS_RESOURCE, 4)]))
        .await?;
    let a = support::wait_until(&wls, "class-a", "admitted", WAIT, admitted).await?;
    ensure!(
        assigned(&a, CLASS_RESOURCE) == Some((nv_flavor.clone(), "4".into())),
        "the first preference while it has room: {}",
        a["status"]["admission"]
    );
    // ... so the next class request goes to the AMD flavor: Kueue saw 8 of 8
    // NVIDIA devices in use through both names together.
    env.create_workload(pod_workload(&ns, "class-b", &class, &[(CLASS_RESOURCE, 4)]))
        .await?;
    let b = support::wait_until(&wls, "class-b", "admitted", WAIT, admitted).await?;
    ensure!(
        assigned(&b, CLASS_RESOURCE) == Some((amd_flavor.clone(), "4".into())),
        "NVIDIA full (4 by nvidia.com/gpu + 4 by {CLASS_RESOURCE}): {}",
        b["status"]["admission"]
    );
    // The user reads where it went and why in the check's message.
    let placed = crate::ledger::check_message(&b);
    ensure!(
        placed.contains(&format!(
            "{class}: on {amd_flavor} ({amd_product}); {nv_flavor} full: "
        )) && crate::ledger::check_message(&a).contains(&format!(
            "{class}: on {nv_flavor} ({nv_product}), its first preference"
        )),
        "{placed}"
    );
    // One more NVIDIA device by its own name waits, though only 4 of 8 are
    // counted as nvidia.com/gpu: the class resource bounds both names.
    env.create_workload(pod_workload(
        &ns,
        "vendor-2",
        &class,
        &[("nvidia.com/gpu", 4)],
    ))
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let waiting = support::get_json(&wls, "vendor-2").await?;
    ensure!(
        !is_true(&waiting, "QuotaReserved"),
        "a ninth NVIDIA device was admitted: {}",
        waiting["status"]
    );

    // The ledger charges each device once, at its own model's rate: 4 + 4 NVIDIA
    // devices at 1 credit/s and 4 AMD devices at 2 credits/s, for 60 s.
    let entries = export(store, Some(&team))?;
    let reserve_of = |wl: &Value| -> (u64, i64) {
        entries
            .iter()
            .filter(|e| e["kind"] == "Reserve" && e["workloadUid"] == wl["metadata"]["uid"])
            .fold((0, 0), |(units, credits), e| {
                (
                    units + e["deviceUnits"].as_u64().unwrap_or(0),
                    credits + e["credits"].as_i64().unwrap_or(0),
                )
            })
    };
    let micros = crate::ledger::MICROS;
    ensure!(
        reserve_of(&vendor) == (4, 240 * micros),
        "vendor: {:?}",
        reserve_of(&vendor)
    );
    ensure!(
        reserve_of(&a) == (4, 240 * micros),
        "class-a: {:?}",
        reserve_of(&a)
    );
    ensure!(
        reserve_of(&b) == (4, 480 * micros),
        "class-b: {:?}",
        reserve_of(&b)
    );
    let nvidia_units: u64 = entries
        .iter()
        .filter(|e| e["kind"] == "Reserve" && e["flavor"] == nv_flavor.as_str())
        .map(|e| e["deviceUnits"].as_u64().unwrap_or(0))
        .sum();
    ensure!(nvidia_units == 8, "NVIDIA devices charged: {nvidia_units}");
    eprintln!(
        "MEASURE class requests: 4 x nvidia.com/gpu + 4 x {CLASS_RESOURCE} on {nv_flavor} (full at 8), \
         the next 4 x {CLASS_RESOURCE} on {amd_flavor}; 12 devices charged, a ninth NVIDIA request waits"
    );

    // A ClusterQueue kaccel does not own, covering nvidia.com/gpu but not the
    // class resource: Kueue admits none of its NVIDIA work, and kaccel says so.
    let foreign = format!("foreign-{id}");
    let foreign_cq = json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
        "metadata": {"name": foreign},
        "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                 "resourceGroups": [{"coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                    "flavors": [{"name": nv_flavor, "resources": [
                        {"name": "cpu", "nominalQuota": "64"},
                        {"name": "memory", "nominalQuota": "512Gi"},
                        {"name": "nvidia.com/gpu", "nominalQuota": "8"}]}]}]}
    });
    support::create(&cqs, foreign_cq).await?;
    env.cleanup.add(None, kueue("ClusterQueue"), &foreign);
    let lq_api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &kueue("LocalQueue"));
    support::create(
        &lq_api,
        json!({"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
               "metadata": {"name": foreign, "namespace": ns},
               "spec": {"clusterQueue": foreign}}),
    )
    .await?;
    env.cleanup.add(Some(&ns), kueue("LocalQueue"), &foreign);
    env.create_workload(pod_workload(
        &ns,
        "legacy",
        &foreign,
        &[("nvidia.com/gpu", 1)],
    ))
    .await?;
    let blocked = wait_obj(&classes, &class, "ForeignQueuesBlocked True", |c| {
        class_condition(c, "ForeignQueuesBlocked").is_some_and(|b| b["status"] == "True")
    })
    .await?;
    let message = class_condition(&blocked, "ForeignQueuesBlocked").unwrap()["message"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    ensure!(
        message.contains(&format!("{foreign} (nvidia.com/gpu)")),
        "{message}"
    );
    let metrics = env.controller().metrics().unwrap_or_default();
    ensure!(
        metric_sum(&metrics, "kaccel_foreign_cluster_queue_blocked") == 1,
        "{}",
        metrics
            .lines()
            .filter(|l| l.contains("foreign"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let legacy = wait_for("Kueue says why the legacy Workload waits", WAIT, || async {
        let wl = support::get_json(&wls, "legacy").await?;
        let text = wl["status"]["conditions"].to_string();
        Ok(text.contains(CLASS_RESOURCE).then_some(wl))
    })
    .await?;
    ensure!(!is_true(&legacy, "QuotaReserved"), "{}", legacy["status"]);
    // kaccel never wrote to it.
    let after = support::get_json(&cqs, &foreign).await?;
    ensure!(
        after["spec"]["resourceGroups"][0]["coveredResources"]
            == json!(["cpu", "memory", "nvidia.com/gpu"]),
        "{}",
        after["spec"]
    );
    eprintln!(
        "MEASURE foreign queue: {foreign} reported blocked by the transformation; Kueue: {}",
        support::condition(&legacy, "QuotaReserved")
            .map(|c| c["message"].to_string())
            .unwrap_or_default()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// The pod webhook: the class resource becomes the placed flavor's vendor resource.

fn mwc_ar() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration>(
        &(),
    )
}

/// manifests/webhook.yaml's MutatingWebhookConfiguration (its rules and
/// matchConditions as shipped), named `name`, with only the webhooks named in
/// `hooks`, each calling kaccel at `base_url` + its path, and only for objects
/// of namespace `ns` (the cluster is shared with other tests).
fn test_webhook_configuration(
    name: &str,
    base_url: &str,
    ns: &str,
    hooks: &[&str],
) -> Result<Value> {
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/webhook.yaml"),
    )?;
    let mut mwc: Value = serde_yaml::Deserializer::from_str(&text)
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .map(|v: serde_yaml::Value| serde_json::to_value(v).expect("YAML is JSON"))
        .find(|v: &Value| v["kind"] == "MutatingWebhookConfiguration")
        .context("no MutatingWebhookConfiguration in manifests/webhook.yaml")?;
    mwc["metadata"]["name"] = json!(name);
    let mut kept = Vec::new();
    for mut hook in mwc["webhooks"].as_array().cloned().unwrap_or_default() {
        if !hooks.iter().any(|h| hook["name"] == *h) {
            continue;
        }
        let path = hook["clientConfig"]["service"]["path"]
            .as_str()
            .context("a webhook without a service path")?
            .to_string();
        hook["clientConfig"] = json!({"url": format!("{base_url}{path}")});
        hook["namespaceSelector"] = json!({"matchLabels": {"kubernetes.io/metadata.name": ns}});
        kept.push(hook);
    }
    anyhow::ensure!(
        kept.len() == hooks.len(),
        "manifests/webhook.yaml lacks one of {hooks:?}"
    );
    mwc["webhooks"] = Value::Array(kept);
    Ok(mwc)
}

/// The pod webhook's name in manifests/webhook.yaml.
pub(crate) const POD_HOOK: &str = "pods.accelerator.kaccel.io";
/// The Workload webhook's (the credit check's finalizer at creation).
pub(crate) const WORKLOAD_HOOK: &str = "workloads.credits.kaccel.io";

/// The test's copy of manifests/webhook.yaml, registered for namespace `ns`
/// and calling a kaccel to be started with `config` (torn down by the cleanup).
pub(crate) struct TestWebhook {
    pub(crate) name: String,
    /// The `webhook:` section of kaccel's configuration.
    pub(crate) config: String,
}

impl TestWebhook {
    /// The pod webhook alone.
    pub(crate) async fn register(env: &mut Env, ns: &str) -> Result<TestWebhook> {
        let client = env.client.clone();
        TestWebhook::register_hooks(&client, &mut env.cleanup, ns, &[POD_HOOK]).await
    }

    /// The webhooks named in `hooks`.
    pub(crate) async fn register_hooks(
        client: &kube::Client,
        cleanup: &mut support::Cleanup,
        ns: &str,
        hooks: &[&str],
    ) -> Result<TestWebhook> {
        // The ServiceAccount admission plugin wants the namespace's default
        // account, which kube-controller-manager's ServiceAccount controller creates.
        let sas: Api<DynamicObject> = Api::namespaced_with(
            client.clone(),
            ns,
            &ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(&()),
        );
        wait_obj(&sas, "default", "the default ServiceAccount", |_| true).await?;
        let port = crate::controller::free_port();
        // The names manifests/ grants kaccel (its ClusterRole and Role): the
        // configuration and Secret of the shipped defaults. One test at a time.
        let name = "kaccel-pod-accelerator".to_string();
        let mwcs: Api<DynamicObject> = Api::all_with(client.clone(), &mwc_ar());
        if mwcs.get_opt(&name).await?.is_some() {
            mwcs.delete(&name, &Default::default()).await?;
        }
        support::create(
            &mwcs,
            test_webhook_configuration(&name, &format!("https://127.0.0.1:{port}"), ns, hooks)?,
        )
        .await?;
        cleanup.add(None, mwc_ar(), &name);
        let config = format!(
            "webhook:\n  enabled: true\n  address: 127.0.0.1:{port}\n  secret: kaccel-system/kaccel-webhook-tls\n  \
             hosts: [\"127.0.0.1\", localhost]\n  configurationName: {name}\n"
        );
        Ok(TestWebhook { name, config })
    }

    /// kaccel writes its generated CA into every webhook of the configuration
    /// once it serves.
    pub(crate) async fn wait_for_ca_bundle(&self, client: &kube::Client) -> Result<()> {
        let mwcs: Api<DynamicObject> = Api::all_with(client.clone(), &mwc_ar());
        wait_obj(&mwcs, &self.name, "caBundle written", |m| {
            m["webhooks"].as_array().is_some_and(|hooks| {
                hooks.iter().all(|h| {
                    h["clientConfig"]["caBundle"]
                        .as_str()
                        .is_some_and(|b| !b.is_empty())
                })
            })
        })
        .await?;
        Ok(())
    }
}

/// What the API server answers a dry-run create of `workload` with: the
/// webhooks are called, nothing is stored.
pub(crate) async fn dry_run_create(wls: &Api<DynamicObject>, workload: &Value) -> Result<Value> {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    Ok(serde_json::to_value(
        wls.create(&dry_run, &support::object(workload.clone()))
            .await?,
    )?)
}

/// Waits until kaccel's Workload webhook puts the credit check's finalizer on
/// `probe` (a dry run): its caches know the probe's LocalQueue and ClusterQueue
/// from then on.
pub(crate) async fn wait_for_workload_finalizer(
    wls: &Api<DynamicObject>,
    probe: &Value,
) -> Result<()> {
    wait_for(
        "the Workload webhook puts the finalizer on",
        WAIT,
        || async {
            Ok(crate::ledger::has_finalizer(&dry_run_create(wls, probe).await?).then_some(()))
        },
    )
    .await
}

/// A pod as the Job controller creates it from a Job Kueue admitted: Kueue's
/// podset label and workload annotation, and the flavor's nodeSelector.
fn job_pod(name: &str, workload: Option<&str>, node_selector: Value, limits: Value) -> Value {
    let mut pod = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"kueue.x-k8s.io/podset": "main"}},
        "spec": {"restartPolicy": "Never", "nodeSelector": node_selector,
                 "automountServiceAccountToken": false,
                 "containers": [{"name": "train", "image": "ghcr.io/acme/train:cuda",
                                 "resources": {"limits": limits}}]}
    });
    if let Some(w) = workload {
        pod["metadata"]["annotations"] = json!({"kueue.x-k8s.io/workload": w});
    }
    pod
}

#[tokio::test]
async fn the_pod_webhook_gives_a_class_pod_its_flavors_vendor_resource_and_settings() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("kwh", |env| pod_webhook(&mut env, &store).await);
}

/// What the webhook tests share: a class over one 8-GPU NVIDIA and one 8-GPU AMD
/// node with settings per vendor, kaccel serving the webhook, the test's copy of
/// manifests/webhook.yaml registered.
struct WebhookFixture {
    ns: String,
    class: String,
    pods: Api<DynamicObject>,
    nv_flavor: String,
    amd_flavor: String,
    nv_labels: Value,
    amd_labels: Value,
    webhook_config: String,
}

async fn webhook_fixture(env: &mut Env, store: &str) -> Result<WebhookFixture> {
    let client = env.client.clone();
    let t = test_class(
        env,
        "wh",
        &["nvidia", "amd"],
        json!({"devicesPerPod": [8], "podSettings": [
            {"vendors": ["amd"], "image": "ghcr.io/acme/train:rocm",
             "env": [{"name": "HSA_FORCE_FINE_GRAIN_PCIE", "value": "1"}],
             "tolerations": [{"key": "amd.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]},
            {"vendors": ["nvidia"], "env": [{"name": "NCCL_DEBUG", "value": "WARN"}]}
        ]}),
    )
    .await?;
    let ns = t.ns.clone();
    let webhook = TestWebhook::register(env, &ns).await?;
    let webhook_config = webhook.config.clone();
    env.start_with(store, |config| config + &webhook_config);
    webhook.wait_for_ca_bundle(&client).await?;

    let (_, nv_flavor, amd_flavor) = two_flavor_queue(env, &t).await?;
    let rfs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    let node_labels = |rf: &Value| rf["spec"]["nodeLabels"].clone();
    let nv_labels = node_labels(&support::get_json(&rfs, &nv_flavor).await?);
    let amd_labels = node_labels(&support::get_json(&rfs, &amd_flavor).await?);

    let pods: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &ns,
        &ApiResource::erase::<k8s_openapi::api::core::v1::Pod>(&()),
    );
    Ok(WebhookFixture {
        ns,
        class: t.class,
        pods,
        nv_flavor,
        amd_flavor,
        nv_labels,
        amd_labels,
        webhook_config,
    })
}

/// Workloads `first` (on NVIDIA) and `second` (on AMD), 8 devices each by the
/// class name, admitted.
async fn first_and_second(env: &mut Env, ns: &str, class: &str) -> Result<()> {
    let wls = env.workloads(ns);
    for name in ["first", "second"] {
        env.create_workload(pod_workload(ns, name, class, &[(CLASS_RESOURCE, 8)]))
            .await?;
        support::wait_until(&wls, name, "admitted", WAIT, admitted).await?;
    }
    Ok(())
}

async fn pod_webhook(env: &mut Env, store: &str) -> Result<()> {
    let WebhookFixture {
        ns,
        class,
        pods,
        nv_flavor,
        amd_flavor,
        nv_labels,
        amd_labels,
        webhook_config,
        ..
    } = webhook_fixture(env, store).await?;
    first_and_second(env, &ns, &class).await?;

    let eight = json!({CLASS_RESOURCE: "8"});
    let created = support::create(
        &pods,
        job_pod("first-pod", Some("first"), nv_labels.clone(), eight.clone()),
    )
    .await?;
    let first = serde_json::to_value(created)?;
    let train = &first["spec"]["containers"][0];
    ensure!(
        train["resources"]["limits"] == json!({"nvidia.com/gpu": "8"})
            && train["resources"]["requests"] == json!({"nvidia.com/gpu": "8"}),
        "the NVIDIA pod: {}",
        train["resources"]
    );
    ensure!(
        train["image"] == "ghcr.io/acme/train:cuda",
        "{}",
        train["image"]
    );
    ensure!(
        train["env"] == json!([{"name": "NCCL_DEBUG", "value": "WARN"}]),
        "{}",
        train["env"]
    );
    ensure!(
        first["spec"]["nodeSelector"] == nv_labels,
        "{}",
        first["spec"]["nodeSelector"]
    );

    let created = support::create(
        &pods,
        job_pod(
            "second-pod",
            Some("second"),
            amd_labels.clone(),
            eight.clone(),
        ),
    )
    .await?;
    let second = serde_json::to_value(created)?;
    let train = &second["spec"]["containers"][0];
    ensure!(
        train["resources"]["limits"] == json!({"amd.com/gpu": "8"}),
        "the AMD pod: {}",
        train["resources"]
    );
    ensure!(
        train["image"] == "ghcr.io/acme/train:rocm",
        "{}",
        train["image"]
    );
    ensure!(
        train["env"] == json!([{"name": "HSA_FORCE_FINE_GRAIN_PCIE", "value": "1"}]),
        "{}",
        train["env"]
    );
    let tolerations = second["spec"]["tolerations"].to_string();
    ensure!(tolerations.contains("amd.com/gpu"), "{tolerations}");

    // A pod whose nodeSelector is not its Workload's flavor (not made from
    // Kueue's current admission): refused, never given the wrong vendor resource.
    let refused = pods
        .create(
            &PostParams::default(),
            &support::object(job_pod(
                "mismatched",
                Some("first"),
                amd_labels.clone(),
                eight.clone(),
            )),
        )
        .await;
    let message = match refused {
        Err(kube::Error::Api(e)) => e.message,
        other => anyhow::bail!("a pod placed against its admission was created: {other:?}"),
    };
    ensure!(
        message.contains(&format!("does not carry flavor {nv_flavor}'s nodeLabels")),
        "{message}"
    );
    // A pod asking for the class resource that Kueue did not admit: refused,
    // with the reason, never created with a resource no node has.
    let refused = pods
        .create(
            &PostParams::default(),
            &support::object(job_pod("stray", None, json!({}), eight.clone())),
        )
        .await;
    let message = match refused {
        Err(kube::Error::Api(e)) => e.message,
        other => anyhow::bail!("a pod Kueue never admitted was created: {other:?}"),
    };
    ensure!(message.contains("Kueue has not admitted it"), "{message}");
    // A pod without the class resource never reaches kaccel (matchConditions).
    let before = metric_sum(
        &env.controller().metrics().unwrap_or_default(),
        "kaccel_pod_webhook_answers_total",
    );
    let plain = support::create(
        &pods,
        job_pod("plain", None, json!({}), json!({"cpu": "1"})),
    )
    .await?;
    ensure!(
        serde_json::to_value(plain)?["spec"]["containers"][0]["resources"]["limits"]
            == json!({"cpu": "1"})
    );
    let after = metric_sum(
        &env.controller().metrics().unwrap_or_default(),
        "kaccel_pod_webhook_answers_total",
    );
    ensure!(
        after == before,
        "a plain pod was sent to the webhook ({before} -> {after})"
    );
    eprintln!(
        "MEASURE pod webhook: {CLASS_RESOURCE}: 8 -> nvidia.com/gpu: 8 on {nv_flavor}, amd.com/gpu: 8 + ROCm image on {amd_flavor}; {after} reviews answered"
    );

    // kaccel down: pods asking for the class resource are refused (fail closed),
    // other pods are created as before.
    env.controller().kill();
    let refused = pods
        .create(
            &PostParams::default(),
            &support::object(job_pod("while-down", Some("first"), nv_labels, eight)),
        )
        .await;
    ensure!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.message.contains("failed calling webhook")),
        "with the webhook down: {refused:?}"
    );
    support::create(
        &pods,
        job_pod("plain-while-down", None, json!({}), json!({"cpu": "1"})),
    )
    .await?;
    // Back up, so the teardown's Workloads are settled by kaccel.
    env.start_with(store, |config| config + &webhook_config);
    Ok(())
}

/// The latency the webhook adds to a pod's creation: the same pod created
/// `KACCEL_BENCH_PODS` times (default 1,000) asking for the class resource (sent
/// to kaccel, which reads the Workload and rewrites it) and asking for the
/// vendor resource (not sent), interleaved, create request -> response. A
/// measurement (e2e/bench-webhook.sh), not a test.
#[tokio::test]
#[ignore = "measurement: run through e2e/bench-webhook.sh"]
async fn webhook_latency_per_pod_creation() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("kwhb", |env| webhook_latency(&mut env, &store).await);
}

async fn webhook_latency(env: &mut Env, store: &str) -> Result<()> {
    let WebhookFixture {
        ns,
        class,
        pods,
        nv_labels,
        ..
    } = webhook_fixture(env, store).await?;
    first_and_second(env, &ns, &class).await?;
    let n: usize = std::env::var("KACCEL_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let mut with = Vec::with_capacity(n);
    let mut without = Vec::with_capacity(n);
    for i in 0..n {
        for (class_name, samples) in [(true, &mut with), (false, &mut without)] {
            let limits = if class_name {
                json!({CLASS_RESOURCE: "8"})
            } else {
                json!({"nvidia.com/gpu": "8"})
            };
            let pod = job_pod(
                &format!("{}-{i}", if class_name { "class" } else { "vendor" }),
                Some("first"),
                nv_labels.clone(),
                limits,
            );
            let started = Instant::now();
            let created = pods
                .create(&PostParams::default(), &support::object(pod))
                .await?;
            samples.push(started.elapsed().as_secs_f64() * 1000.0);
            let limits =
                &serde_json::to_value(created)?["spec"]["containers"][0]["resources"]["limits"];
            ensure!(limits == &json!({"nvidia.com/gpu": "8"}), "{limits}");
        }
    }
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() as f64 - 1.0) * q).round() as usize];
        (at(0.5), at(0.99))
    };
    let (with_p50, with_p99) = stats(&mut with);
    let (without_p50, without_p99) = stats(&mut without);
    eprintln!("MEASURE with the webhook ({n} pods): p50 {with_p50:.2} ms, p99 {with_p99:.2} ms");
    eprintln!(
        "MEASURE without (vendor resource, not sent): p50 {without_p50:.2} ms, p99 {without_p99:.2} ms"
    );
    eprintln!(
        "MEASURE added by the webhook: p50 {:+.2} ms, p99 {:+.2} ms",
        with_p50 - without_p50,
        with_p99 - without_p99
    );
    let metrics = env.controller().metrics().unwrap_or_default();
    for line in metrics.lines().filter(|l| {
        l.starts_with("kaccel_pod_webhook_seconds_sum")
            || l.starts_with("kaccel_pod_webhook_seconds_count")
    }) {
        eprintln!("MEASURE {line}");
    }
    Ok(())
}

/// One Job manifest, `kaccel.io/accelerator: 8` in the class's queue, submitted
/// twice: Kueue suspends, admits (H100 first, then MI300X) and resumes each; the
/// Job controller creates the pods, and the webhook gives each its flavor's
/// vendor resource and the class's settings for that vendor.
#[tokio::test]
async fn one_job_manifest_runs_on_whichever_vendor_the_class_admits() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("kjob", |env| one_job_manifest(&mut env, &store).await);
}

async fn one_job_manifest(env: &mut Env, store: &str) -> Result<()> {
    let result = jobs_through_the_webhook(env, store).await;
    // The Jobs go before the teardown deletes their Workloads: while a Job
    // exists, Kueue makes it a new Workload, which would hold quota (and a
    // ClusterQueue) after this test.
    let jobs: Api<DynamicObject> = Api::namespaced_with(
        env.client.clone(),
        &format!("ns-{}", env.id),
        &support::job_ar(),
    );
    for name in ["train-1", "train-2"] {
        support::delete_job(&jobs, name).await?;
    }
    result
}

async fn jobs_through_the_webhook(env: &mut Env, store: &str) -> Result<()> {
    let WebhookFixture {
        ns,
        class,
        pods,
        nv_flavor,
        amd_flavor,
        nv_labels,
        amd_labels,
        ..
    } = webhook_fixture(env, store).await?;
    let client = env.client.clone();
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    let workloads = env.workloads(&ns);
    let manifest = |name: &str| support::gpu_job(&ns, name, &class, CLASS_RESOURCE, 8);
    let mut placed = Vec::new();
    for (name, flavor, labels, resource) in [
        ("train-1", &nv_flavor, &nv_labels, "nvidia.com/gpu"),
        ("train-2", &amd_flavor, &amd_labels, "amd.com/gpu"),
    ] {
        support::create(&jobs, manifest(name)).await?;
        // Kueue's Workload for the Job, settled by the teardown.
        let workload = wait_for(&format!("Kueue's Workload of Job {name}"), WAIT, || async {
            let list = workloads.list(&Default::default()).await?;
            Ok(list.items.into_iter().find(|w| {
                w.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .any(|o| o.kind == "Job" && o.name == name)
            }))
        })
        .await?;
        let workload_name = workload.metadata.name.clone().unwrap_or_default();
        env.track_workload(&ns, &workload_name);
        let admitted_wl =
            support::wait_until(&workloads, &workload_name, "admitted", WAIT, admitted).await?;
        // The Job controller's pod, as the webhook left it.
        let pod = support::job_pod(&pods, name, WAIT).await?;
        let pod = serde_json::to_value(pod)?;
        let train = &pod["spec"]["containers"][0];
        ensure!(
            train["resources"]["limits"] == json!({resource: "8"})
                && train["resources"]["requests"][resource] == "8"
                && train["resources"]["requests"].get(CLASS_RESOURCE).is_none(),
            "Job {name}'s pod: {}",
            train["resources"]
        );
        ensure!(
            pod["spec"]["nodeSelector"] == *labels,
            "{}",
            pod["spec"]["nodeSelector"]
        );
        ensure!(
            assigned(&admitted_wl, CLASS_RESOURCE).map(|(f, _)| f) == Some(flavor.clone()),
            "{}",
            admitted_wl["status"]["admission"]
        );
        placed.push((name, pod, admitted_wl));
    }
    let amd_pod = &placed[1].1;
    ensure!(
        amd_pod["spec"]["containers"][0]["image"] == "ghcr.io/acme/train:rocm",
        "the class's ROCm build on AMD: {}",
        amd_pod["spec"]["containers"][0]["image"]
    );
    ensure!(placed[0].1["spec"]["containers"][0]["image"] == "ghcr.io/acme/train:cuda");
    // The ledger prices each at its own model's rate: 8 devices for the default
    // one-hour horizon at 1 credit/s (NVIDIA) and 2 credits/s (AMD).
    let entries = export(store, None)?;
    let reserved = |wl: &Value| -> i64 {
        entries
            .iter()
            .filter(|e| e["kind"] == "Reserve" && e["workloadUid"] == wl["metadata"]["uid"])
            .map(|e| e["credits"].as_i64().unwrap_or(0))
            .sum()
    };
    let micros = crate::ledger::MICROS;
    ensure!(
        reserved(&placed[0].2) == 8 * 3600 * micros,
        "{}",
        reserved(&placed[0].2)
    );
    ensure!(
        reserved(&placed[1].2) == 2 * 8 * 3600 * micros,
        "{}",
        reserved(&placed[1].2)
    );
    // Each Job is told where it went and why, in an Event its user reads.
    let mut placed_notes = Vec::new();
    for (name, needles) in [
        (
            "train-1",
            vec![
                format!("on {nv_flavor}"),
                "its first preference".to_string(),
            ],
        ),
        (
            "train-2",
            vec![
                format!("on {amd_flavor}"),
                format!("{nv_flavor} full: 8/8 in use"),
            ],
        ),
    ] {
        let note = support::event_note(&client, &ns, Some("Job"), name, "Placed", WAIT).await?;
        for needle in &needles {
            ensure!(
                note.contains(needle.as_str()),
                "Job {name}'s Placed Event: {note}"
            );
        }
        placed_notes.push(note);
    }
    eprintln!(
        "MEASURE one Job manifest: train-1 -> {nv_flavor} with nvidia.com/gpu: 8, train-2 -> {amd_flavor} with amd.com/gpu: 8 and the ROCm image; Events: {placed_notes:?}"
    );
    Ok(())
}

/// One device, one count on a class of exactly one 8-GPU flavor: 4 by
/// `nvidia.com/gpu`, then 4 and 4 by `kaccel.io/accelerator` in the same queue:
/// exactly two are admitted, the third waits, and the ledger charges 8 devices.
#[tokio::test]
async fn on_one_flavor_of_eight_a_third_request_of_four_waits_however_it_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    with_env!("kone", |env| one_count(&mut env, &store).await);
}

async fn one_count(env: &mut Env, store: &str) -> Result<()> {
    let TestClass {
        class, team, ns, ..
    } = test_class(env, "one", &["nvidia"], json!({})).await?;
    env.start(store);
    let cq = format!("{team}-{class}");
    wait_obj(&env.cqs.clone(), &cq, "Active", |q| is_true(q, "Active")).await?;
    let wls = env.workloads(&ns);
    let mut admitted_uids = Vec::new();
    for (name, resource) in [
        ("by-vendor", "nvidia.com/gpu"),
        ("by-class", CLASS_RESOURCE),
    ] {
        env.create_workload(pod_workload(&ns, name, &class, &[(resource, 4)]))
            .await?;
        let wl = support::wait_until(&wls, name, "admitted", WAIT, admitted).await?;
        admitted_uids.push(wl["metadata"]["uid"].clone());
    }
    env.create_workload(pod_workload(&ns, "third", &class, &[(CLASS_RESOURCE, 4)]))
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let third = support::get_json(&wls, "third").await?;
    ensure!(
        !is_true(&third, "QuotaReserved"),
        "a ninth to twelfth device was admitted on an 8-device flavor: {}",
        third["status"]
    );
    let entries = export(store, Some(&team))?;
    let charged: u64 = entries
        .iter()
        .filter(|e| e["kind"] == "Reserve")
        .map(|e| e["deviceUnits"].as_u64().unwrap_or(0))
        .sum();
    ensure!(charged == 8, "devices charged: {charged} ({entries:?})");
    ensure!(
        entries
            .iter()
            .filter(|e| e["kind"] == "Reserve")
            .all(|e| admitted_uids.contains(&e["workloadUid"])),
        "the waiting Workload reserved credits"
    );
    Ok(())
}
