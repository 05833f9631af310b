//! DRA-only accelerators against the real kube-apiserver + Kueue: kaccel reads
//! the ResourceSlices a DRA driver publishes and writes, per flavor, a DeviceClass
//! whose CEL selector the API server compiles and stores.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::AcceleratorClass;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::{Controller, Planned, class_with_queues, free_port, wait_obj};
use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(60);

fn device_classes(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
    )
}

/// A Node published only through DRA (no device plugin): labelled with its
/// model, as the vendor's labeller or the platform team does.
fn dra_node(name: &str, model: &str) -> Node {
    support::ready_node(
        name,
        json!({
            "kubernetes.io/hostname": name,
            "kaccel.io/accelerator.model": model,
        }),
        json!({"cpu": "64", "memory": "512Gi", "pods": "110"}),
        "2026-12-01T00:00:00Z",
    )
}

/// A DRA-only Node labelled with `model` and the ResourceSlice its driver
/// publishes for it; both are deleted by `cleanup`.
pub(crate) async fn publish(
    client: &Client,
    cleanup: &mut Cleanup,
    node: &str,
    model: &str,
    slice: Value,
) -> Result<()> {
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &dra_node(node, model))
        .await
        .context("creating the DRA node")?;
    cleanup.add(None, ApiResource::erase::<Node>(&()), node);
    let ar = ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceSlice>(&());
    let slices: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let created = support::create(&slices, slice).await?;
    cleanup.add(None, ar, &created.name_any());
    Ok(())
}

/// The DeviceClass and ResourceFlavor kaccel writes for `flavor`, deleted by
/// `cleanup` should the test end before kaccel removes them.
pub(crate) fn clean_flavor(cleanup: &mut Cleanup, flavor: &str) {
    cleanup.add(
        None,
        ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
        &format!("{flavor}.kaccel.io"),
    );
    cleanup.add(None, kueue("ResourceFlavor"), flavor);
}

/// A ResourceSlice of `driver` for `node`, its pool named after the node.
fn dra_slice(node: &str, driver: &str, devices: Vec<Value>) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}")},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
}

/// Eight GPUs as NVIDIA's DRA driver publishes them (`deviceinfo.go`), with the
/// UUIDs `tests/e2e/health.rs`'s fake dcgm-exporter reports for the node.
pub(crate) fn nvidia_slice(node: &str, product: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{node}-{i:04}")},
                    "productName": {"string": product},
                    "architecture": {"string": "Hopper"},
                    "driverVersion": {"version": "550.54.15"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                },
                "capacity": {"memory": {"value": "81559Mi"}},
            })
        })
        .collect();
    dra_slice(node, "gpu.nvidia.com", devices)
}

#[tokio::test]
async fn a_dra_only_flavor_gets_a_device_class_the_api_server_accepts() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = device_class_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn device_class_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = support::unique("dra");
    // A product only this test publishes, so no other test's class selects it.
    let product = format!("NVIDIA E2E {id}");
    let model = format!("NVIDIA-E2E-{id}");
    let node = format!("dra-{id}");
    publish(
        client,
        cleanup,
        &node,
        &model,
        nvidia_slice(&node, &product),
    )
    .await?;

    let class_name = format!("dra-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {
            "sharing": "Whole",
            "selector": {"models": [model], "minMemoryMiB": 80000, "minDriverVersion": "550"},
            "credits": {"perDeviceHour": "1"},
        },
    }))?;
    let Planned { root, .. } = class_with_queues(client, cleanup, &id, &class, 8).await?;
    let port = free_port();
    let controller = Controller::start(
        &format!("ctl-{id}"),
        port,
        &format!(
            "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nwatchResourceSlices: true\nleaderElection:\n  enabled: false\n"
        ),
    );
    let flavor = format!("nvidia-e2e-{}", id.to_lowercase());
    let device_class = format!("{flavor}.kaccel.io");
    clean_flavor(cleanup, &flavor);
    let result = async {
        let dcs = device_classes(client);
        let written = wait_obj(&dcs, &device_class, "kaccel writes it", |dc| {
            dc["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "kaccel"
        })
        .await?;
        let expression = written["spec"]["selectors"][0]["cel"]["expression"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        for pin in [
            "device.driver == \"gpu.nvidia.com\"".to_string(),
            format!("productName in [\"{product}\"]"),
            "memory.compareTo(quantity(\"80000Mi\")) >= 0".into(),
            "driverVersion.compareTo(semver(\"550.0.0\")) >= 0".into(),
        ] {
            if !expression.contains(&pin) {
                bail!("DeviceClass {device_class} selector lacks {pin}: {expression}");
            }
        }
        // The flavor Kueue schedules on is there too, counting the 8 devices.
        let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
        wait_obj(&flavors, &flavor, "planned", |_| true).await?;

        // The API server compiles a DeviceClass's CEL when it is written: it
        // refuses one that does not type-check, so the one above passed that.
        let refused = support::create(
            &dcs,
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                   "metadata": {"name": format!("broken-{id}.example.com")},
                   "spec": {"selectors": [{"cel": {"expression": "device.driver == 1"}}]}}),
        )
        .await;
        if refused.is_ok() {
            cleanup.add(
                None,
                ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
                &format!("broken-{id}.example.com"),
            );
            bail!("the API server accepted a DeviceClass whose CEL does not type-check");
        }

        // The class goes: its DeviceClass goes with it.
        Api::<AcceleratorClass>::all(client.clone())
            .delete(&class_name, &Default::default())
            .await?;
        let deadline = std::time::Instant::now() + WAIT;
        while dcs.get_opt(&device_class).await?.is_some() {
            if std::time::Instant::now() > deadline {
                bail!("DeviceClass {device_class} still there after its class was deleted");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

// ---------------------------------------------------------------------------
// Kueue counts claims of kaccel's DeviceClasses, and the ledger prices them.

/// The DRA flavor e2e/cluster.sh starts Kueue mapping (E2E_DRA_FLAVORS): the
/// flavor kaccel plans for `DRA_H100_MODEL`.
const DRA_H100_FLAVOR: &str = "nvidia-e2e-dra-h100";
const DRA_H100_MODEL: &str = "NVIDIA-E2E-DRA-H100";
const DRA_H100_PRODUCT: &str = "NVIDIA E2E DRA H100";

/// The Kueue configuration e2e/cluster.sh starts Kueue with, beside the kubeconfig.
pub(crate) fn kueue_config_file() -> String {
    let kubeconfig = std::env::var("KUBECONFIG").unwrap_or_default();
    std::path::Path::new(&kubeconfig)
        .with_file_name("kueue-config.yaml")
        .display()
        .to_string()
}

/// An 8-GPU node of `DRA_H100_MODEL` that only NVIDIA's DRA driver publishes, for
/// the flavor Kueue is started mapping: the node's name and the flavor's
/// DeviceClass (node, slice, DeviceClass and flavor deleted by the teardown).
async fn dra_h100_node(env: &mut crate::ledger::Env) -> Result<(String, String)> {
    let node = format!("dra-h100-{}", env.id);
    let client = env.client.clone();
    publish(
        &client,
        &mut env.cleanup,
        &node,
        DRA_H100_MODEL,
        nvidia_slice(&node, DRA_H100_PRODUCT),
    )
    .await?;
    clean_flavor(&mut env.cleanup, DRA_H100_FLAVOR);
    Ok((node, format!("{DRA_H100_FLAVOR}.kaccel.io")))
}

/// A class of the DRA H100s at 3600 credits per device-hour.
fn dra_h100_class(name: &str) -> Value {
    json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": name},
        "spec": {"sharing": "Whole", "selector": {"models": [DRA_H100_MODEL]},
                 "credits": {"perDeviceHour": "3600"}},
    })
}

fn claim_template(ns: &str, name: &str, device_class: &str, count: u32) -> Value {
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": device_class, "allocationMode": "ExactCount", "count": count}}]}}},
    })
}

/// A ResourceClaimTemplate in `ns`, deleted by `cleanup`.
async fn create_template(
    client: &Client,
    cleanup: &mut Cleanup,
    ns: &str,
    name: &str,
    device_class: &str,
    count: u32,
) -> Result<()> {
    let ar = ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>(&());
    let templates: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    support::create(&templates, claim_template(ns, name, device_class, count)).await?;
    cleanup.add(Some(ns), ar, name);
    Ok(())
}

/// One pod whose devices come from a claim made from `template`, at most `secs` s.
fn claim_workload(ns: &str, name: &str, queue: &str, template: &str, secs: u32) -> Value {
    json!({
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"queueName": queue, "maximumExecutionTimeSeconds": secs,
            "podSets": [{"name": "main", "count": 1, "template": {"spec": {
                "restartPolicy": "Never",
                "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": template}],
                "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                  "claims": [{"name": "gpus"}]}}]}}}]},
    })
}

fn usage_of(wl: &Value, resource: &str) -> Option<(String, String)> {
    let psa = wl.pointer("/status/admission/podSetAssignments/0")?;
    Some((
        psa["flavors"][resource].as_str()?.to_string(),
        psa["resourceUsage"][resource].as_str()?.to_string(),
    ))
}

#[tokio::test]
async fn a_claim_of_a_kaccel_device_class_is_counted_by_kueue_and_charged_like_a_device_plugin_request()
 {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    crate::ledger::with_env!("kdra", |env| claims_counted(&mut env, &store).await);
}

async fn claims_counted(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    use crate::ledger::{admitted, export};
    let id = env.id.clone();
    let client = env.client.clone();
    // An 8-GPU node published only by NVIDIA's DRA driver.
    let (_, device_class) = dra_h100_node(env).await?;

    // Two classes at the same rate: the DRA H100s, and the device-plugin H100s of
    // the example nodes; one budget for both.
    let dra_class = format!("dra-{id}");
    let plugin_class = format!("h100-{id}");
    env.create_class(dra_h100_class(&dra_class)).await?;
    env.class(&plugin_class).await?;
    let ns = format!("ns-{id}");
    let team = format!("team-{id}");
    env.create_budget(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": {"name": team},
        "spec": {"team": "e2e", "namespaces": [ns],
            "classes": [{"name": dra_class, "guaranteedDevices": 8},
                        {"name": plugin_class, "guaranteedDevices": 8}],
            "credits": {"perPeriod": "100000", "period": {"start": "2026-12-01T00:00:00Z", "days": 30}}},
    }))
    .await?;
    let kueue_config = kueue_config_file();
    env.start_with(store, |config| {
        config.replace("watchResourceSlices: false", "watchResourceSlices: true")
            + &format!("kueue:\n  configFile: {kueue_config}\n")
    });

    // kaccel's DeviceClass, the flavor's quota in the class resource, and
    // Kueue's configuration (as e2e/cluster.sh wrote it) maps the DeviceClass to it.
    let resource = "kaccel.io/accelerator".to_string();
    let dcs = device_classes(&client);
    wait_obj(&dcs, &device_class, "kaccel writes it", |_| true).await?;
    let classes: Api<DynamicObject> = Api::all_with(client.clone(), &crate::ledger::class_ar());
    let class_status = wait_obj(&classes, &dra_class, "Kueue counts its DeviceClass", |c| {
        support::condition(c, "KueueCountsDeviceClasses").is_some_and(|c| c["status"] == "True")
    })
    .await;
    let class_status = match class_status {
        Ok(v) => v,
        Err(e) => {
            let now = classes.get(&dra_class).await?;
            bail!("{e}: {:?}", now.data["status"]);
        }
    };
    let cq = format!("{team}-{dra_class}");
    let cqs = env.cqs.clone();
    wait_obj(&cqs, &cq, "quota in the class resource", |q| {
        q["spec"]["resourceGroups"][0]["coveredResources"]
            .as_array()
            .is_some_and(|r| r.iter().any(|r| r == resource.as_str()))
    })
    .await?;

    // Six of the eight through a claim: admitted onto the flavor, counted as the
    // class resource; four more do not fit and wait.
    for (name, count) in [("h100-x6", 6), ("h100-x4", 4)] {
        create_template(&client, &mut env.cleanup, &ns, name, &device_class, count).await?;
    }
    let wls = env.workloads(&ns);
    env.create_workload(claim_workload(&ns, "six", &dra_class, "h100-x6", 600))
        .await?;
    let six = support::wait_until(&wls, "six", "admitted", WAIT, admitted).await?;
    let (flavor, units) = usage_of(&six, &resource)
        .with_context(|| format!("six is admitted without {resource}: {}", six["status"]))?;
    ensure!(
        flavor == DRA_H100_FLAVOR && units == "6",
        "six: {flavor} {units}"
    );
    let reserving = format!("\"name\":\"{resource}\",\"total\":\"6\"");
    wait_obj(&cqs, &cq, "reserves 6 of the class resource", |q| {
        q["status"]["flavorsReservation"]
            .to_string()
            .contains(&reserving)
    })
    .await?;
    env.create_workload(claim_workload(&ns, "four", &dra_class, "h100-x4", 600))
        .await?;
    // The equivalent device-plugin request, for the ledger.
    env.create_workload(crate::ledger::device_workload(
        &ns,
        "plugin-six",
        &plugin_class,
        "nvidia.com/gpu",
        6,
        Some(600),
    ))
    .await?;
    support::wait_until(&wls, "plugin-six", "admitted", WAIT, admitted).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let four = serde_json::to_value(wls.get("four").await?)?;
    ensure!(
        !admitted(&four),
        "four (4 more of 8 with 6 held) was admitted: {}",
        four["status"]
    );

    // One device, one count: two more asked for by the class resource fit (6 + 2
    // of 8) and are placed on the DRA flavor; then one more by either name waits.
    env.create_workload(crate::ledger::device_workload(
        &ns,
        "class-two",
        &dra_class,
        &resource,
        2,
        Some(600),
    ))
    .await?;
    let two = support::wait_until(&wls, "class-two", "admitted", WAIT, admitted).await?;
    ensure!(
        usage_of(&two, &resource) == Some((DRA_H100_FLAVOR.into(), "2".into())),
        "class-two: {}",
        two["status"]["admission"]
    );
    env.create_workload(crate::ledger::device_workload(
        &ns,
        "class-one",
        &dra_class,
        &resource,
        1,
        Some(600),
    ))
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    for name in ["four", "class-one"] {
        let w = serde_json::to_value(wls.get(name).await?)?;
        ensure!(
            !admitted(&w),
            "{name} was admitted beside 6 claimed + 2 class-requested of 8: {}",
            w["status"]
        );
    }

    // The ledger: the claim is priced like the device-plugin request, to the
    // micro-credit.
    let entries = export(store, Some(&team))?;
    let reserve_of = |workload: &str| -> Option<(i64, String)> {
        entries
            .iter()
            .find(|e| e["kind"] == "Reserve" && e["workload"] == workload)
            .map(|e| {
                (
                    e["credits"].as_i64().unwrap_or_default(),
                    e["resource"].as_str().unwrap_or_default().to_string(),
                )
            })
    };
    let (dra_credits, dra_resource) = reserve_of("six").context("no Reserve for six")?;
    let (plugin_credits, plugin_resource) =
        reserve_of("plugin-six").context("no Reserve for plugin-six")?;
    // Counted by Kueue as the class resource, priced as a line naming the
    // DeviceClass's flavor (FOCUS shows the DeviceClass).
    ensure!(
        dra_resource == format!("dra.kaccel.io/{DRA_H100_FLAVOR}"),
        "six reserved on {dra_resource}"
    );
    ensure!(plugin_resource == "nvidia.com/gpu", "{plugin_resource}");
    ensure!(
        dra_credits == plugin_credits && dra_credits == 6 * 600 * 1_000_000,
        "six reserved {dra_credits} micro-credits, plugin-six {plugin_credits}"
    );
    eprintln!(
        "MEASURE DRA claim of 6 x {DRA_H100_FLAVOR} admitted and reserved {dra_credits} micro-credits = device-plugin 6 x nvidia.com/gpu {plugin_credits}; {}",
        support::condition(&class_status, "KueueCountsDeviceClasses")
            .map(|c| c["message"].to_string())
            .unwrap_or_default()
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// One class over a mixed fleet: device-plugin NVIDIA nodes and DRA-only AMD nodes.

/// The AMD DRA flavor e2e/cluster.sh starts Kueue mapping (E2E_DRA_FLAVORS).
const DRA_MI300X_FLAVOR: &str = "amd-e2e-dra-mi300x";
const DRA_MI300X_MODEL: &str = "AMD-E2E-DRA-MI300X";

/// Eight GPUs as AMD's DRA driver publishes them (`gpu.amd.com`: productName,
/// family, partitionProfile, pciAddr, driverVersion; capacity memory).
fn amd_slice(node: &str, product: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "productName": {"string": product},
                    "family": {"string": "CDNA3"},
                    "partitionProfile": {"string": "spx_nps1"},
                    "pciAddr": {"string": format!("0000:{:02x}:00.0", 0x0c + i * 0x16)},
                    "driverVersion": {"version": "6.10.5"},
                },
                "capacity": {"memory": {"value": "192Gi"}},
            })
        })
        .collect();
    dra_slice(node, "gpu.amd.com", devices)
}

/// An 8-GPU node of `DRA_MI300X_MODEL` that only AMD's DRA driver publishes, for
/// the flavor Kueue is started mapping: the node's name and the flavor's
/// DeviceClass (node, slice, DeviceClass and flavor deleted by the teardown).
async fn dra_mi300x_node(env: &mut crate::ledger::Env) -> Result<(String, String)> {
    let node = format!("dra-mi300x-{}", env.id);
    let client = env.client.clone();
    publish(
        &client,
        &mut env.cleanup,
        &node,
        DRA_MI300X_MODEL,
        amd_slice(&node, "AMD E2E DRA MI300X"),
    )
    .await?;
    clean_flavor(&mut env.cleanup, DRA_MI300X_FLAVOR);
    Ok((node, format!("{DRA_MI300X_FLAVOR}.kaccel.io")))
}

#[tokio::test]
async fn one_class_over_device_plugin_nvidia_and_dra_only_amd_nodes_admits_on_both() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    crate::ledger::with_env!("kmix", |env| mixed_fleet(&mut env, &store).await);
}

async fn mixed_fleet(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    use crate::ledger::admitted;
    let id = env.id.clone();
    let client = env.client.clone();
    let (_, device_class) = dra_mi300x_node(env).await?;

    let class = format!("mixed-{id}");
    env.create_class(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class},
        "spec": {"sharing": "Whole",
                 "selector": {"models": ["NVIDIA-H100-80GB-HBM3", DRA_MI300X_MODEL]},
                 "preference": ["*H100*", "*MI300X*"],
                 "credits": {"perDeviceHour": "3600"}},
    }))
    .await?;
    let ns = format!("ns-{id}");
    let team = format!("team-{id}");
    env.create_budget(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": {"name": team},
        "spec": {"team": "e2e", "namespaces": [ns],
            "classes": [{"name": class, "guaranteedDevices": 16}],
            "credits": {"perPeriod": "100000", "period": {"start": "2026-12-01T00:00:00Z", "days": 30}}},
    }))
    .await?;
    let kueue_config = kueue_config_file();
    env.start_with(store, |config| {
        config.replace("watchResourceSlices: false", "watchResourceSlices: true")
            + &format!("kueue:\n  configFile: {kueue_config}\n")
    });

    // Both flavors resolve into the class's one ClusterQueue: the H100s in
    // nvidia.com/gpu (and the class resource), the MI300Xs in the class resource.
    let amd_resource = "kaccel.io/accelerator";
    let cq = format!("{team}-{class}");
    let cqs = env.cqs.clone();
    let queue = wait_obj(&cqs, &cq, "both flavors, the H100s first", |q| {
        let flavors = q["spec"]["resourceGroups"][0]["flavors"].to_string();
        flavors.find("nvidia-h100-80gb-hbm3") < flavors.find(DRA_MI300X_FLAVOR)
            && flavors.contains(DRA_MI300X_FLAVOR)
    })
    .await?;
    let covered = queue["spec"]["resourceGroups"][0]["coveredResources"].clone();
    ensure!(
        covered.as_array().is_some_and(
            |r| r.iter().any(|r| r == amd_resource) && r.iter().any(|r| r == "nvidia.com/gpu")
        ),
        "covered: {covered}"
    );

    create_template(
        &client,
        &mut env.cleanup,
        &ns,
        "mi300x-x4",
        &device_class,
        4,
    )
    .await?;
    // A claim of the MI300X DeviceClass is counted as the class resource, so
    // Kueue takes the class's first flavor with room (the H100s), where it could
    // never be given its devices: kaccel's check refuses it and says how to pin it.
    let wls = env.workloads(&ns);
    env.create_workload(claim_workload(
        &ns,
        "amd-unpinned",
        &class,
        "mi300x-x4",
        600,
    ))
    .await?;
    let unpinned = support::wait_until(&wls, "amd-unpinned", "deactivated", WAIT, |w| {
        w["spec"]["active"] == false
    })
    .await?;
    let note = support::event_note(
        &client,
        &ns,
        None,
        "amd-unpinned",
        "CreditCheckRejected",
        WAIT,
    )
    .await?;
    ensure!(
        note.contains(&format!("claims devices of DeviceClass {device_class}"))
            && note.contains("Kueue placed it on flavor nvidia-h100-80gb-hbm3")
            && note.contains(&format!(
                "nodeSelector of ResourceFlavor {DRA_MI300X_FLAVOR}"
            )),
        "{note}; {}",
        unpinned["status"]
    );
    // Its quota goes back before the next ones (the job integration's part once
    // Kueue evicts a deactivated Workload).
    support::release_quota(&wls, "amd-unpinned", &unpinned).await?;
    support::wait_until(&wls, "amd-unpinned", "no quota held", WAIT, |w| {
        !support::is_true(w, "QuotaReserved")
    })
    .await?;

    // Pinned to its flavor's nodes, Kueue places it on the MI300Xs.
    let rfs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
    let amd_labels =
        support::get_json(&rfs, DRA_MI300X_FLAVOR).await?["spec"]["nodeLabels"].clone();
    let mut pinned = claim_workload(&ns, "amd", &class, "mi300x-x4", 600);
    pinned["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"] = amd_labels;
    env.create_workload(pinned).await?;
    env.create_workload(crate::ledger::device_workload(
        &ns,
        "nvidia",
        &class,
        "nvidia.com/gpu",
        4,
        Some(600),
    ))
    .await?;
    let amd = support::wait_until(&wls, "amd", "admitted", WAIT, admitted).await?;
    let nvidia = support::wait_until(&wls, "nvidia", "admitted", WAIT, admitted).await?;
    ensure!(
        usage_of(&amd, amd_resource) == Some((DRA_MI300X_FLAVOR.into(), "4".into())),
        "the claim was admitted as {}",
        amd["status"]["admission"]
    );
    let on = usage_of(&nvidia, "nvidia.com/gpu");
    ensure!(
        on == Some(("nvidia-h100-80gb-hbm3".into(), "4".into())),
        "the device-plugin request was admitted as {}",
        nvidia["status"]["admission"]
    );
    eprintln!(
        "MEASURE mixed fleet: an unpinned MI300X claim placed on the H100s is refused naming the fix; pinned, 4 x {DRA_MI300X_FLAVOR} by claim and 4 x nvidia-h100-80gb-hbm3 by device plugin admitted in one ClusterQueue"
    );
    Ok(())
}

// ---------------------------------------------------------------------------
// One failed DRA GPU out by a DeviceTaintRule; its seven neighbours keep working.

fn device_taint_rules(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::resource::v1alpha3::DeviceTaintRule>(&()),
    )
}

/// The nominal quota of `resource` on the first flavor of a ClusterQueue.
fn nominal(cq: &Value, resource: &str) -> Option<u64> {
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == resource)?["nominalQuota"]
        .as_str()?
        .parse()
        .ok()
}

/// kaccel's DeviceTaintRules (its label), as (pool, device) pairs.
async fn kaccel_rules(client: &Client) -> Result<Vec<(String, String)>> {
    let list = device_taint_rules(client)
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=kaccel"))
        .await?;
    Ok(list
        .items
        .iter()
        .map(|r| {
            let s = &r.data["spec"]["deviceSelector"];
            (
                s["pool"].as_str().unwrap_or_default().to_string(),
                s["device"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect())
}

#[tokio::test]
async fn one_failed_dra_gpu_is_tainted_alone_and_its_node_keeps_scheduling() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = quarantine_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn quarantine_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    use crate::health::{Answer, FakeExporter, dcgm};
    let id = support::unique("dtr");
    let node = format!("dra-h100-{id}");
    publish(
        client,
        cleanup,
        &node,
        DRA_H100_MODEL,
        nvidia_slice(&node, DRA_H100_PRODUCT),
    )
    .await?;
    let rule_ar = ApiResource::erase::<k8s_openapi::api::resource::v1alpha3::DeviceTaintRule>(&());
    let rules = device_taint_rules(client);
    // Someone else's rule on a neighbour: kaccel must never touch it.
    let foreign_name = format!("ops-{id}");
    let foreign = support::create(
        &rules,
        json!({"apiVersion": "resource.k8s.io/v1alpha3", "kind": "DeviceTaintRule",
               "metadata": {"name": foreign_name},
               "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": node, "device": "gpu-6"},
                        "taint": {"key": "example.com/maintenance", "effect": "None"}}}),
    )
    .await?;
    cleanup.add(None, rule_ar.clone(), &foreign_name);
    let device_class = format!("{DRA_H100_FLAVOR}.kaccel.io");
    clean_flavor(cleanup, DRA_H100_FLAVOR);

    let class_name = format!("dra-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole", "selector": {"models": [DRA_H100_MODEL]},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned {
        ns,
        root,
        cluster_queue: cq,
        ..
    } = class_with_queues(client, cleanup, &id, &class, 8).await?;

    let exporter = FakeExporter::start(Answer::Metrics(dcgm(&node, 8, &[]))).await;
    let hold_down: u32 = 2;
    let config = format!(
        "rootCohort: {root}\ndebounceMs: 50\nmaxDelayMs: 300\nwatchResourceSlices: true\n\
         leaderElection:\n  enabled: false\nkueue:\n  configFile: {}\n\
         health:\n  policy:\n    holdDownSeconds: {hold_down}\n  sources:\n    \
         - {{name: dcgm-{node}, kind: dcgm-exporter, url: \"http://127.0.0.1:{}/metrics\", node: {node}, intervalSeconds: 1, staleAfterSeconds: 3, timeoutSeconds: 1}}\n",
        kueue_config_file(),
        exporter.port
    );
    let controller = Controller::start(&format!("ctl-{id}"), free_port(), &config);
    let resource = "kaccel.io/accelerator";
    let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
    let nodes: Api<Node> = Api::all(client.clone());
    let result = async {
        wait_obj(&cqs, &cq, "8 healthy DRA GPUs in quota", |q| {
            nominal(q, resource) == Some(8)
        })
        .await?;

        // GPU 3 takes a double-bit ECC error: one rule, for exactly that device.
        let injected = std::time::Instant::now();
        exporter.set(Answer::Metrics(dcgm(&node, 8, &[3])));
        let deadline = std::time::Instant::now() + WAIT;
        loop {
            let held = kaccel_rules(client).await?;
            if !held.is_empty() {
                ensure!(
                    held == [(node.clone(), "gpu-3".to_string())],
                    "kaccel's rules: {held:?}"
                );
                break;
            }
            ensure!(std::time::Instant::now() < deadline, "no DeviceTaintRule after {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let taken_out_ms = injected.elapsed().as_millis();
        let written = wait_obj(&cqs, &cq, "quota down by exactly one", |q| {
            nominal(q, resource) == Some(7)
        })
        .await?;
        ensure!(nominal(&written, resource) == Some(7));
        let n = nodes.get(&node).await?;
        let cordoned = n.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
        let tainted = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == "kaccel.io/unhealthy"));
        ensure!(!cordoned && !tainted, "the node was cordoned ({cordoned}) or tainted ({tainted})");
        // `kaccel inventory` shows the rule on that device, and so does the
        // controller's /devices (what `--health-from` reads).
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kaccel"))
            .args(["inventory", "--health-from", &format!("http://127.0.0.1:{}", controller.port), "-o", "json"])
            .output()
            .await?;
        ensure!(out.status.success(), "kaccel inventory: {}", String::from_utf8_lossy(&out.stderr));
        let inventory: Value = serde_json::from_slice(&out.stdout)?;
        let held = inventory["taintRules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| r["pool"] == node.as_str())
            .map(|r| (r["device"].as_str().unwrap_or_default().to_string(), r["effect"].clone()))
            .collect::<Vec<_>>();
        ensure!(
            held == [("gpu-3".to_string(), json!("NoSchedule"))],
            "kaccel inventory shows {held:?} on {node}"
        );
        ensure!(
            inventory["deviceHealth"]["taintRules"]
                .as_array()
                .is_some_and(|r| r.iter().any(|r| r["pool"] == node.as_str() && r["device"] == "gpu-3")),
            "/devices does not show the rule: {}",
            inventory["deviceHealth"]["taintRules"]
        );
        let rule = rules
            .list(&kube::api::ListParams::default().labels("app.kubernetes.io/managed-by=kaccel"))
            .await?
            .items
            .remove(0);
        ensure!(
            rule.data["spec"]["taint"]["effect"] == "NoSchedule"
                && rule.data["spec"]["taint"]["key"] == "kaccel.io/unhealthy"
                && rule.data["spec"]["deviceSelector"]["driver"] == "gpu.nvidia.com",
            "rule: {}",
            rule.data["spec"]
        );

        // The real allocator honours the rule: eight of the node's GPUs cannot be
        // had, seven can, and never GPU 3 (the foreign rule's effect is None).
        let eight = probe(client, &ns, "eight", &node, &device_class, Some(8)).await?;
        ensure!(eight.is_none(), "kube-scheduler allocated 8 with GPU 3 tainted: {eight:?}");
        let allocated = probe(client, &ns, "seven-devices", &node, &device_class, Some(7)).await?;
        let healthy: Vec<String> = (0..8)
            .filter(|i| *i != 3)
            .map(|i| format!("{node}/gpu-{i}"))
            .collect();
        ensure!(
            allocated.as_ref() == Some(&healthy),
            "kube-scheduler allocated {allocated:?} for 7, expected every GPU but 3"
        );

        // Seven of the node's GPUs through one claim: admitted.
        create_template(client, cleanup, &ns, "h100-x7", &device_class, 7).await?;
        let wls: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &kueue("Workload"));
        support::create(&wls, claim_workload(&ns, "seven", &class_name, "h100-x7", 600)).await?;
        cleanup.add(Some(&ns), kueue("Workload"), "seven");
        let seven = support::wait_until(&wls, "seven", "admitted", WAIT, |w| {
            support::is_true(w, "Admitted")
        })
        .await?;
        ensure!(usage_of(&seven, resource) == Some((DRA_H100_FLAVOR.into(), "7".into())));

        // The exporter goes silent: the rule stays (a silent exporter never
        // returns a failed card to service).
        exporter.set(Answer::Dead);
        tokio::time::sleep(Duration::from_secs(5)).await;
        ensure!(
            kaccel_rules(client).await? == [(node.clone(), "gpu-3".to_string())],
            "the rule changed while the exporter was silent"
        );
        // Healthy again: after the hold-down the rule goes and the quota is back.
        let recovered = std::time::Instant::now();
        exporter.set(Answer::Metrics(dcgm(&node, 8, &[])));
        let deadline = std::time::Instant::now() + WAIT;
        while !kaccel_rules(client).await?.is_empty() {
            ensure!(std::time::Instant::now() < deadline, "the rule is still there after {WAIT:?}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let released_ms = recovered.elapsed().as_millis();
        ensure!(
            released_ms >= u128::from(hold_down) * 1000,
            "removed after {released_ms} ms, before the {hold_down} s hold-down"
        );
        wait_obj(&cqs, &cq, "quota back to 8", |q| nominal(q, resource) == Some(8)).await?;

        // Someone else's rule: untouched throughout.
        let now = rules.get(&foreign_name).await?;
        ensure!(
            now.metadata.resource_version == foreign.metadata.resource_version,
            "kaccel changed someone else's DeviceTaintRule"
        );
        eprintln!(
            "MEASURE DRA GPU fault -> 1 DeviceTaintRule + quota 8->7, node schedulable, in {taken_out_ms} ms; healthy -> rule removed in {released_ms} ms (hold-down {hold_down} s)"
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

// ---------------------------------------------------------------------------
// Bad input: a requirement the driver's attributes cannot express.

#[tokio::test]
async fn a_requirement_the_driver_cannot_express_is_named_and_no_device_class_is_written() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = unexpressible_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn unexpressible_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = support::unique("drabad");
    let product = format!("NVIDIA E2E {id}");
    let model = format!("NVIDIA-E2E-{id}");
    let node = format!("dra-{id}");
    // A driver build that publishes its version as a plain string: CEL cannot
    // compare it with semver().
    let mut published = nvidia_slice(&node, &product);
    for device in published["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        device["attributes"]["driverVersion"] = json!({"string": "550.54.15"});
    }
    publish(client, cleanup, &node, &model, published).await?;
    let class_name = format!("drabad-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole", "selector": {"models": [model], "minDriverVersion": "550"},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned { root, .. } = class_with_queues(client, cleanup, &id, &class, 8).await?;
    let flavor = format!("nvidia-e2e-{}", id.to_lowercase());
    clean_flavor(cleanup, &flavor);
    let device_class = format!("{flavor}.kaccel.io");
    let controller = Controller::start(
        &format!("ctl-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nwatchResourceSlices: true\nleaderElection:\n  enabled: false\n"
        ),
    );
    let result = async {
        let classes: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::erase::<AcceleratorClass>(&()));
        let status = wait_obj(&classes, &class_name, "DeviceClassesReady=False", |c| {
            support::condition(c, "DeviceClassesReady").is_some_and(|c| c["status"] == "False")
        })
        .await?;
        let message = support::condition(&status, "DeviceClassesReady")
            .map(|c| c["message"].as_str().unwrap_or_default().to_string())
            .unwrap_or_default();
        ensure!(
            message.contains("spec.selector.minDriverVersion") && message.contains("as a string"),
            "the condition does not name the field and why: {message}"
        );
        // The flavor is planned (its quota waits for a DeviceClass); none is written.
        let flavors: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ResourceFlavor"));
        wait_obj(&flavors, &flavor, "planned", |_| true).await?;
        ensure!(
            device_classes(client)
                .get_opt(&device_class)
                .await?
                .is_none(),
            "a DeviceClass was written for a requirement CEL cannot express"
        );
        eprintln!("MEASURE unexpressible requirement -> DeviceClassesReady=False: {message}");
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

// ---------------------------------------------------------------------------
// The real allocator: kube-scheduler evaluates kaccel's DeviceClass CEL.

/// kube-scheduler's one profile in the harness (e2e/cluster.sh): only pods that
/// name it are scheduled.
const SCHEDULER: &str = "kaccel-e2e-scheduler";

fn claim_ar() -> ApiResource {
    ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceClaim>(&())
}

/// A ResourceClaim for `count` devices of `device_class`, or all of them on the
/// node the pod lands on when `None`.
fn resource_claim(ns: &str, name: &str, device_class: &str, count: Option<u32>) -> Value {
    let exactly = match count {
        Some(n) => {
            json!({"deviceClassName": device_class, "allocationMode": "ExactCount", "count": n})
        }
        None => json!({"deviceClassName": device_class, "allocationMode": "All"}),
    };
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": exactly}]}},
    })
}

/// What kube-scheduler made of a probe: the devices allocated to its claim (the
/// pod bound), or `None` when it found the pod unschedulable.
type Placement = Option<Vec<String>>;

/// A pod pinned to `node` that needs the devices of a fresh claim (`count` of
/// `device_class`, or all): created, waited on until kube-scheduler binds it or
/// finds it unschedulable, then deleted with its claim.
async fn probe(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    device_class: &str,
    count: Option<u32>,
) -> Result<Placement> {
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &claim_ar());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    support::create(&claims, resource_claim(ns, name, device_class, count)).await?;
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"schedulerName": SCHEDULER, "restartPolicy": "Never",
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpus", "resourceClaimName": name}],
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m"}, "claims": [{"name": "gpus"}]}}]},
    }))?;
    // The namespace's default ServiceAccount comes from kube-controller-manager
    // a moment after the namespace: retry until admission finds it.
    crate::controller::wait_for("the probe pod created", WAIT, || async {
        Ok(pods
            .create(&PostParams::default(), &pod)
            .await
            .ok()
            .map(|_| ()))
    })
    .await?;
    let placement = crate::controller::wait_for(
        &format!("kube-scheduler decides on {name}"),
        WAIT,
        || async {
            let p = pods.get(name).await?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
            if bound.is_some() {
                let claim = claims.get(name).await?;
                let results = claim.data["status"]["allocation"]["devices"]["results"].clone();
                let mut devices: Vec<String> = results
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|r| {
                        format!(
                            "{}/{}",
                            r["pool"].as_str().unwrap_or_default(),
                            r["device"].as_str().unwrap_or_default()
                        )
                    })
                    .collect();
                devices.sort();
                return Ok(Some(Some(devices)));
            }
            let unschedulable = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                });
            Ok(unschedulable.then_some(None))
        },
    )
    .await;
    // A pod bound to a node with no kubelet is only gone when deleted at once.
    let _ = pods
        .delete(
            name,
            &kube::api::DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await;
    let _ = claims.delete(name, &Default::default()).await;
    crate::controller::wait_for(&format!("{name} and its claim gone"), WAIT, || async {
        let gone = pods.get_opt(name).await?.is_none() && claims.get_opt(name).await?.is_none();
        Ok(gone.then_some(()))
    })
    .await?;
    placement
}

#[tokio::test]
async fn the_schedulers_allocator_gives_a_device_class_exactly_its_flavors_devices() {
    let _serial = support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = allocator_flow(&client, &mut cleanup).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn allocator_flow(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    let id = support::unique("alloc");
    let product = format!("NVIDIA E2E {id}");
    let model = format!("NVIDIA-E2E-{id}");
    // The class's node: eight GPUs of its model on a driver new enough.
    let good = format!("dra-{id}-a");
    publish(
        client,
        cleanup,
        &good,
        &model,
        nvidia_slice(&good, &product),
    )
    .await?;
    // The same model on a driver older than the class allows.
    let old = format!("dra-{id}-b");
    let mut old_slice = nvidia_slice(&old, &product);
    for d in old_slice["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        d["attributes"]["driverVersion"] = json!({"version": "535.104.5"});
    }
    publish(client, cleanup, &old, &model, old_slice).await?;
    // Another model (more memory, another product name).
    let other = format!("dra-{id}-c");
    let mut other_slice = nvidia_slice(&other, &format!("{product} NVL"));
    for d in other_slice["spec"]["devices"]
        .as_array_mut()
        .into_iter()
        .flatten()
    {
        d["capacity"]["memory"] = json!({"value": "143771Mi"});
    }
    publish(
        client,
        cleanup,
        &other,
        &format!("{model}-NVL"),
        other_slice,
    )
    .await?;
    // Every NVIDIA device, for the control: the probes that find nothing through
    // kaccel's class must find devices through this one.
    let any_nvidia = format!("any-nvidia-{}.example.com", id.to_lowercase());
    let dc_ar = ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&());
    support::create(
        &device_classes(client),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": any_nvidia},
               "spec": {"selectors": [{"cel": {"expression": "device.driver == \"gpu.nvidia.com\""}}]}}),
    )
    .await?;
    cleanup.add(None, dc_ar, &any_nvidia);

    let class_name = format!("alloc-{id}");
    let class: AcceleratorClass = serde_json::from_value(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": class_name},
        "spec": {"sharing": "Whole",
                 "selector": {"models": [model], "minMemoryMiB": 80000, "minDriverVersion": "550"},
                 "credits": {"perDeviceHour": "1"}},
    }))?;
    let Planned {
        ns,
        root,
        cluster_queue: cq,
        ..
    } = class_with_queues(client, cleanup, &id, &class, 4).await?;
    let flavor = format!("nvidia-e2e-{}", id.to_lowercase());
    clean_flavor(cleanup, &flavor);
    let device_class = format!("{flavor}.kaccel.io");
    let controller = Controller::start(
        &format!("ctl-{id}"),
        free_port(),
        &format!(
            "rootCohort: {root}\ndebounceMs: 100\nmaxDelayMs: 500\nwatchResourceSlices: true\nleaderElection:\n  enabled: false\n"
        ),
    );
    let result = async {
        wait_obj(&device_classes(client), &device_class, "kaccel writes it", |_| true).await?;
        // The quota is the flavor's devices: node a's eight, not the old driver's.
        let resource = "kaccel.io/accelerator";
        let cqs: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
        let classes: Api<DynamicObject> =
            Api::all_with(client.clone(), &ApiResource::erase::<AcceleratorClass>(&()));
        wait_obj(&classes, &class_name, "its flavor counted", |c| {
            c["status"]["flavors"].to_string().contains(&flavor)
        })
        .await?;
        let queue = wait_obj(&cqs, &cq, "quota in the flavor's DRA resource", |q| {
            q["spec"]["resourceGroups"][0]["coveredResources"].to_string().contains(resource)
        })
        .await?;
        let root_quota = Api::<DynamicObject>::all_with(client.clone(), &kueue("Cohort"))
            .get(&root)
            .await?;
        let nominal_in = |o: &Value| -> u64 {
            o["spec"]["resourceGroups"]
                .as_array()
                .into_iter()
                .flatten()
                .flat_map(|g| g["flavors"].as_array().into_iter().flatten())
                .filter(|f| f["name"] == flavor.as_str())
                .flat_map(|f| f["resources"].as_array().into_iter().flatten())
                .filter(|r| r["name"] == resource)
                .filter_map(|r| r["nominalQuota"].as_str()?.parse::<u64>().ok())
                .sum()
        };
        let planned = nominal_in(&queue) + nominal_in(&root_quota.data);
        ensure!(planned == 8, "quota of {flavor}: {planned} (queue + root cohort), the allocator can give 8");

        // All of the class's devices on node a: exactly its eight.
        let all_good = probe(client, &ns, "all-a", &good, &device_class, None).await?;
        let expected: Vec<String> = (0..8).map(|i| format!("{good}/gpu-{i}")).collect();
        ensure!(all_good.as_ref() == Some(&expected), "node a through {device_class}: {all_good:?}");
        // Not one device of the old driver or of the other model.
        for (node, what) in [(&old, "the old driver"), (&other, "the other model")] {
            let through_class = probe(client, &ns, &format!("one-{node}"), node, &device_class, Some(1)).await?;
            ensure!(through_class.is_none(), "{what}'s node gave {through_class:?} through {device_class}");
            let control = probe(client, &ns, &format!("ctl-{node}"), node, &any_nvidia, Some(1)).await?;
            ensure!(control.is_some_and(|d| d.len() == 1), "{what}'s node gave nothing through {any_nvidia}: the probe proves nothing");
        }
        eprintln!(
            "MEASURE kube-scheduler allocated through {device_class}: node a all 8, the old driver's node 0, the other model's node 0 (1 each through {any_nvidia}); quota {planned}"
        );
        Ok(())
    }
    .await;
    if result.is_err() {
        eprintln!("kaccel log:\n{}", controller.log_tail());
    }
    result
}

// ---------------------------------------------------------------------------
// Who holds a DRA GPU: the pod its ResourceClaim is reserved for.

#[tokio::test]
async fn a_dra_jobs_gpus_are_held_by_its_pod_and_named_in_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    crate::ledger::with_env!("kdhold", |env| dra_holders(&mut env, &store).await);
}

/// A Job whose pod asks for two DRA H100s through a claim template: Kueue admits
/// it, the ResourceClaim controller makes its claim, kube-scheduler allocates two
/// GPUs and binds the pod. The exporter of the node attributes no pod (as on a
/// DRA node whose exporter lacks the kubelet's pod-resources view): the claim
/// tells kaccel who holds the two GPUs, and the ledger names them.
async fn dra_holders(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    use crate::health::{Answer, FakeExporter, dcgm, dcgm_source, inventory_at};
    let id = env.id.clone();
    let client = env.client.clone();
    let (node, device_class) = dra_h100_node(env).await?;
    let class = format!("dra-{id}");
    env.create_class(dra_h100_class(&class)).await?;
    let ns = format!("ns-{id}");
    let budget = format!("b-{id}");
    env.create_budget(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": {"name": budget},
        "spec": {"team": "vision", "namespaces": [ns],
            "classes": [{"name": class, "guaranteedDevices": 8}],
            "credits": {"perPeriod": "100000", "period": {"start": "2026-12-01T00:00:00Z", "days": 30}}},
    }))
    .await?;
    let exporter = FakeExporter::start(Answer::Metrics(dcgm(&node, 8, &[]))).await;
    let kueue_config = kueue_config_file();
    let port = exporter.port;
    env.start_with(store, |config| {
        config.replace("watchResourceSlices: false", "watchResourceSlices: true")
            + &format!("kueue:\n  configFile: {kueue_config}\n")
            + &format!("health:\n  sources:\n{}", dcgm_source(&node, port))
    });
    wait_obj(
        &device_classes(&client),
        &device_class,
        "kaccel writes it",
        |_| true,
    )
    .await?;
    create_template(&client, &mut env.cleanup, &ns, "h100-x2", &device_class, 2).await?;
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    support::create(
        &jobs,
        json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "finetune", "namespace": ns,
                         "labels": {"kueue.x-k8s.io/queue-name": class}},
            "spec": {"parallelism": 1, "completions": 1, "suspend": true,
                "template": {"spec": {"schedulerName": SCHEDULER, "restartPolicy": "Never",
                    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "h100-x2"}],
                    "containers": [{"name": "main", "image": "ghcr.io/acme/train:cuda",
                        "resources": {"requests": {"cpu": "1", "memory": "1Gi"},
                                      "claims": [{"name": "gpus"}]}}]}}},
        }),
    )
    .await?;
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &claim_ar());
    let mut pod_name = String::new();
    let result = async {
        let pod = support::job_pod(&pods, "finetune", WAIT).await?;
        pod_name = pod.name_any();
        let workload = pod
            .annotations()
            .get("kueue.x-k8s.io/workload")
            .cloned()
            .unwrap_or_default();
        env.track_workload(&ns, &workload);
        // Bound by kube-scheduler, its claim allocated two of the node's GPUs.
        let (claim, gpus) = crate::controller::wait_for("the pod bound, its claim allocated", WAIT, || async {
            let p = pods.get(&pod_name).await?;
            let bound = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let claim = p
                .status
                .as_ref()
                .and_then(|s| s.resource_claim_statuses.as_ref())
                .and_then(|c| c.first())
                .and_then(|c| c.resource_claim_name.clone());
            let (Some(bound), Some(claim)) = (bound, claim) else {
                return Ok(None);
            };
            ensure!(bound == node, "bound to {bound}");
            let c = claims.get(&claim).await?;
            let mut gpus: Vec<String> = c.data["status"]["allocation"]["devices"]["results"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|r| r["device"].as_str().map(str::to_string))
                .collect();
            gpus.sort();
            Ok((gpus.len() == 2).then_some((claim, gpus)))
        })
        .await?;
        let mut expected: Vec<String> = gpus
            .iter()
            .map(|g| format!("GPU-{node}-{:04}", g.trim_start_matches("gpu-").parse::<u32>().unwrap_or(99)))
            .collect();
        expected.sort();

        // /devices: the two GPUs are held by the pod, through its claim, for its
        // Workload, queue and team; the other six by nobody.
        let cq = format!("{budget}-{class}");
        let port = env.controller().port;
        let held = crate::controller::wait_for("the GPUs' holder resolved", WAIT, || async {
            let inv = inventory_at(port).await.unwrap_or_default();
            let on_node: Vec<Value> = inv["deviceHealth"]["devices"]
                .as_array()
                .into_iter()
                .flatten()
                .filter(|d| d["node"] == node.as_str())
                .cloned()
                .collect();
            let held: Vec<Value> = on_node
                .iter()
                .filter(|d| d["holder"]["workload"].is_string())
                .cloned()
                .collect();
            Ok((on_node.len() == 8 && held.len() == 2).then_some((held, on_node)))
        })
        .await;
        let (held, on_node) = held?;
        let mut held_uuids: Vec<String> = held
            .iter()
            .map(|d| d["reading"]["uuid"].as_str().unwrap_or_default().to_string())
            .collect();
        held_uuids.sort();
        ensure!(held_uuids == expected, "held {held_uuids:?}, allocated {expected:?}");
        for d in &held {
            let h = &d["holder"];
            ensure!(
                h["pod"] == pod_name.as_str()
                    && h["namespace"] == ns.as_str()
                    && h["claim"] == claim.as_str()
                    && h["workload"] == workload.as_str()
                    && h["clusterQueue"] == cq.as_str()
                    && h["team"] == "vision",
                "holder {h} (pod {pod_name}, claim {claim}, Workload {workload}, queue {cq})"
            );
        }
        ensure!(
            on_node.iter().filter(|d| d["holder"].is_null()).count() == 6,
            "six GPUs are held by nobody: {on_node:?}"
        );

        // `kaccel inventory` on the cluster reads the claims itself.
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kaccel"))
            .args(["inventory", "-o", "json"])
            .output()
            .await?;
        ensure!(out.status.success(), "kaccel inventory: {}", String::from_utf8_lossy(&out.stderr));
        let inventory: Value = serde_json::from_slice(&out.stdout)?;
        let mut listed: Vec<String> = inventory["claimed"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["id"]["pool"] == node.as_str() && c["claim"] == claim.as_str())
            .filter(|c| c["pods"] == json!([pod_name]))
            .filter_map(|c| c["id"]["device"].as_str().map(str::to_string))
            .collect();
        listed.sort();
        ensure!(listed == gpus, "kaccel inventory lists {listed:?} as held by {pod_name}, allocated {gpus:?}");

        // The settlement names the two GPUs.
        let workloads = env.workloads(&ns);
        let uid = workloads.get(&workload).await?.metadata.uid.unwrap_or_default();
        crate::ledger::finish(&workloads, &workload).await?;
        let posts = crate::ledger::posts_of(store, &uid, WAIT).await?;
        for post in &posts {
            ensure!(post["devices"] == json!(expected), "the Post names the GPUs the claim held: {post}");
        }
        eprintln!(
            "MEASURE DRA Job {workload}: claim {claim} allocated {gpus:?} by kube-scheduler; /devices holder pod {pod_name}, queue {cq}, team vision; Post devices {expected:?}"
        );
        Ok(())
    }
    .await;
    support::delete_job(&jobs, "finetune").await?;
    delete_bound_pods_and_claims(&client, &ns).await?;
    result
}

/// Pods bound to simulated nodes (no kubelet) go only when deleted at once, and
/// their claims (no garbage collector here) by hand: every one of `ns`.
async fn delete_bound_pods_and_claims(client: &Client, ns: &str) -> Result<()> {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let now = kube::api::DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    for p in pods.list(&Default::default()).await?.items {
        let _ = pods.delete(&p.name_any(), &now).await;
    }
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &claim_ar());
    for c in claims.list(&Default::default()).await?.items {
        let _ = claims.delete(&c.name_any(), &Default::default()).await;
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// A class-level request on a DRA fleet: `kaccel.io/accelerator: 8`, no claim.

#[tokio::test]
async fn a_class_request_on_a_dra_fleet_is_given_exactly_its_flavors_devices_by_the_scheduler() {
    let dir = tempfile::tempdir().unwrap();
    let store = format!("sqlite:{}", dir.path().join("ledger.db").display());
    crate::ledger::with_env!("kdreq", |env| dra_class_requests(&mut env, &store).await);
}

/// Two DRA-only classes (H100s on one node, MI300Xs on another), one budget,
/// kaccel serving the pod webhook. The same Job manifest asking for
/// `kaccel.io/accelerator: 8` in each class's queue: Kueue admits it onto the
/// class's flavor, kaccel's webhook turns the request into the implicit extended
/// resource of that flavor's DeviceClass, and kube-scheduler (DRAExtendedResource)
/// makes the pod a claim of exactly that DeviceClass's devices and binds it. Each
/// class gets only its own cards, all of one variant; a ninth H100 asked for
/// waits rather than taking an MI300X; the ledger prices each at its own rate.
async fn dra_class_requests(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    let client = env.client.clone();
    let ns = format!("ns-{}", env.id);
    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    let result = dra_class_requests_flow(env, store).await;
    for job in ["train-h100", "train-mi300x", "train-h100-more"] {
        let _ = support::delete_job(&jobs, job).await;
    }
    delete_bound_pods_and_claims(&client, &ns).await?;
    result
}

async fn dra_class_requests_flow(env: &mut crate::ledger::Env, store: &str) -> Result<()> {
    use crate::class_requests::TestWebhook;
    use crate::ledger::admitted;
    let id = env.id.clone();
    let client = env.client.clone();
    let (h100_node, h100_class_dc) = dra_h100_node(env).await?;
    let (mi300x_node, mi300x_dc) = dra_mi300x_node(env).await?;

    let h100_class = format!("dra-h100-{id}");
    let mi300x_class = format!("dra-mi300x-{id}");
    env.create_class(dra_h100_class(&h100_class)).await?;
    env.create_class(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
        "metadata": {"name": mi300x_class},
        "spec": {"sharing": "Whole", "selector": {"models": [DRA_MI300X_MODEL]},
                 "credits": {"perDeviceHour": "7200"},
                 "podSettings": [{"vendors": ["amd"], "image": "ghcr.io/acme/train:rocm"}]},
    }))
    .await?;
    let ns = format!("ns-{id}");
    env.create_budget(json!({
        "apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
        "metadata": {"name": format!("b-{id}")},
        "spec": {"team": "vision", "namespaces": [ns],
            "classes": [{"name": h100_class, "guaranteedDevices": 8},
                        {"name": mi300x_class, "guaranteedDevices": 8}],
            "credits": {"perPeriod": "1000000", "period": {"start": "2026-12-01T00:00:00Z", "days": 30}}},
    }))
    .await?;
    let webhook = TestWebhook::register(env, &ns).await?;
    let kueue_config = kueue_config_file();
    env.start_with(store, |config| {
        config.replace("watchResourceSlices: false", "watchResourceSlices: true")
            + &format!("kueue:\n  configFile: {kueue_config}\n")
            + &webhook.config
    });
    webhook.wait_for_ca_bundle(&client).await?;
    let dcs = device_classes(&client);
    for dc in [&h100_class_dc, &mi300x_dc] {
        wait_obj(&dcs, dc, "kaccel writes it", |_| true).await?;
    }
    let cqs = env.cqs.clone();
    for class in [&h100_class, &mi300x_class] {
        wait_obj(
            &cqs,
            &format!("b-{id}-{class}"),
            "8 in the class resource",
            |q| nominal(q, "kaccel.io/accelerator") == Some(8),
        )
        .await?;
    }

    let jobs: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &support::job_ar());
    let job = |name: &str, class: &str, count: u32| {
        let mut j = support::gpu_job(&ns, name, class, "kaccel.io/accelerator", count);
        j["spec"]["template"]["spec"]["schedulerName"] = json!(SCHEDULER);
        j
    };
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let claims: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &claim_ar());
    let workloads = env.workloads(&ns);
    let micros = crate::ledger::MICROS;
    let mut measured = Vec::new();
    for (name, class, node, driver, dc, flavor, per_second) in [
        (
            "train-h100",
            &h100_class,
            &h100_node,
            "gpu.nvidia.com",
            &h100_class_dc,
            DRA_H100_FLAVOR,
            1,
        ),
        (
            "train-mi300x",
            &mi300x_class,
            &mi300x_node,
            "gpu.amd.com",
            &mi300x_dc,
            DRA_MI300X_FLAVOR,
            2,
        ),
    ] {
        support::create(&jobs, job(name, class, 8)).await?;
        let pod = support::job_pod(&pods, name, WAIT).await?;
        let workload = pod
            .annotations()
            .get("kueue.x-k8s.io/workload")
            .cloned()
            .unwrap_or_default();
        env.track_workload(&ns, &workload);
        // The webhook asked for the flavor's DeviceClass by its implicit name.
        let implicit = format!("deviceclass.resource.kubernetes.io/{dc}");
        let pod_json = serde_json::to_value(&pod)?;
        let main = &pod_json["spec"]["containers"][0];
        ensure!(
            main["resources"]["limits"] == json!({&implicit: "8"})
                && main["resources"]["requests"][&implicit] == "8"
                && main["resources"]["requests"]
                    .get("kaccel.io/accelerator")
                    .is_none(),
            "Job {name}'s pod: {}",
            main["resources"]
        );
        // kube-scheduler made it a claim of that DeviceClass, allocated on the
        // flavor's node, and bound it there.
        let pod_name = pod.name_any();
        let devices = crate::controller::wait_for(
            &format!("{name} bound, its devices allocated"),
            WAIT,
            || async {
                let p = pods.get(&pod_name).await?;
                let Some(bound) = p.spec.as_ref().and_then(|s| s.node_name.clone()) else {
                    return Ok(None);
                };
                ensure!(bound == *node, "{name} bound to {bound}, not {node}");
                let owned = claims
                    .list(&Default::default())
                    .await?
                    .items
                    .into_iter()
                    .find(|c| {
                        c.owner_references().iter().any(|o| o.name == pod_name)
                            && c.annotations()
                                .get("resource.kubernetes.io/extended-resource-claim")
                                .map(String::as_str)
                                == Some("true")
                    });
                let Some(claim) = owned else { return Ok(None) };
                let results: Vec<Value> = claim.data["status"]["allocation"]["devices"]["results"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                Ok((!results.is_empty()).then_some((claim.data["spec"].clone(), results)))
            },
        )
        .await?;
        let (spec, results) = devices;
        ensure!(
            spec.to_string()
                .contains(&format!("\"deviceClassName\":\"{dc}\"")),
            "{name}'s claim asks for another DeviceClass: {spec}"
        );
        ensure!(
            results.len() == 8,
            "{name}: {} devices allocated",
            results.len()
        );
        for r in &results {
            ensure!(
                r["driver"] == driver && r["pool"] == node.as_str(),
                "{name} was given a device of another variant or node: {r}"
            );
        }
        let admitted_wl =
            support::wait_until(&workloads, &workload, "admitted", WAIT, admitted).await?;
        ensure!(
            usage_of(&admitted_wl, "kaccel.io/accelerator")
                == Some((flavor.to_string(), "8".into())),
            "{name}: {}",
            admitted_wl["status"]["admission"]
        );
        if driver == "gpu.amd.com" {
            ensure!(
                main["image"] == "ghcr.io/acme/train:rocm",
                "the class's AMD image: {}",
                main["image"]
            );
        }
        // The ledger: 8 devices for the default one-hour horizon at the class's rate.
        let uid = admitted_wl["metadata"]["uid"].clone();
        let reserved =
            crate::controller::wait_for(&format!("{name}'s reservation"), WAIT, || async {
                let sum: i64 = crate::ledger::export(store, None)?
                    .iter()
                    .filter(|e| e["kind"] == "Reserve" && e["workloadUid"] == uid)
                    .map(|e| e["credits"].as_i64().unwrap_or(0))
                    .sum();
                Ok((sum > 0).then_some(sum))
            })
            .await?;
        ensure!(
            reserved == per_second * 8 * 3600 * micros,
            "{name} reserved {reserved} micro-credits"
        );
        measured.push(format!(
            "{name} -> {flavor}: 8 x {driver} on {node} via {implicit}, {reserved} micro-credits"
        ));
    }
    // The H100s are all held: one more asked for by the class resource waits for
    // them (Kueue's one quota), never reaching the MI300X class's idle cards.
    support::create(&jobs, job("train-h100-more", &h100_class, 1)).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = workloads
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .find(|w| {
            w.owner_references()
                .iter()
                .any(|o| o.kind == "Job" && o.name == "train-h100-more")
        });
    let waiting = waiting.context("no Workload for train-h100-more")?;
    env.track_workload(&ns, &waiting.name_any());
    ensure!(
        !admitted(&waiting.data),
        "a ninth H100 was admitted: {}",
        waiting.data["status"]
    );
    eprintln!(
        "MEASURE DRA class requests: {}; a ninth H100 waits",
        measured.join("; ")
    );
    Ok(())
}
