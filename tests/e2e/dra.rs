//! DRA-only accelerators against the real kube-apiserver + Kueue: kaccel reads
//! the ResourceSlices a DRA driver publishes and writes, per flavor, a DeviceClass
//! whose CEL selector the API server compiles and stores.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::AcceleratorClass;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::ApiResource;
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::{Controller, class_with_budget, free_port};
use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(60);

fn device_classes(client: &Client) -> Api<DynamicObject> {
    Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
    )
}

/// Waits until `name` exists and `pred` holds (`support::wait_until` wants the
/// object there already).
async fn wait_for(
    api: &Api<DynamicObject>,
    name: &str,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Result<Value> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(obj) = api.get_opt(name).await? {
            let value = serde_json::to_value(&obj)?;
            if pred(&value) {
                return Ok(value);
            }
        }
        if std::time::Instant::now() > deadline {
            bail!("timed out after {WAIT:?} waiting for {name}: {what}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A Node published only through DRA (no device plugin): labelled with its
/// model, as the vendor's labeller or the platform team does.
fn dra_node(name: &str, model: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name,
            "kaccel.io/accelerator.model": model,
        }},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": "2026-12-01T00:00:00Z", "lastTransitionTime": "2026-12-01T00:00:00Z"}],
        },
    }))
    .expect("a Node")
}

/// Eight GPUs as NVIDIA's DRA driver publishes them (`deviceinfo.go`).
fn nvidia_slice(node: &str, product: &str) -> Value {
    let devices: Vec<Value> = (0..8)
        .map(|i| {
            json!({
                "name": format!("gpu-{i}"),
                "attributes": {
                    "type": {"string": "gpu"},
                    "uuid": {"string": format!("GPU-{node}-{i}")},
                    "productName": {"string": product},
                    "architecture": {"string": "Hopper"},
                    "driverVersion": {"version": "550.54.15"},
                    "cudaComputeCapability": {"version": "9.0.0"},
                },
                "capacity": {"memory": {"value": "81559Mi"}},
            })
        })
        .collect();
    json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-gpu.nvidia.com")},
        "spec": {
            "driver": "gpu.nvidia.com", "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    })
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
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &dra_node(&node, &model))
        .await
        .context("creating the DRA node")?;
    cleanup.add(None, ApiResource::erase::<Node>(&()), &node);
    let slices: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceSlice>(&()),
    );
    let slice = support::create(&slices, nvidia_slice(&node, &product)).await?;
    cleanup.add(
        None,
        ApiResource::erase::<k8s_openapi::api::resource::v1::ResourceSlice>(&()),
        &slice.name_any(),
    );

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
    class_with_budget(client, cleanup, &id, &class, 8).await?;

    let root = format!("root-{id}");
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-team-{id}"));
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
    cleanup.add(
        None,
        ApiResource::erase::<k8s_openapi::api::resource::v1::DeviceClass>(&()),
        &device_class,
    );
    cleanup.add(None, kueue("ResourceFlavor"), &flavor);
    cleanup.add(
        None,
        kueue("ClusterQueue"),
        &format!("team-{id}-{class_name}"),
    );
    let result = async {
        let dcs = device_classes(client);
        let written = wait_for(&dcs, &device_class, "kaccel writes it", |dc| {
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
        wait_for(&flavors, &flavor, "planned", |_| true).await?;

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
