//! DeviceClasses: the CEL kaccel writes, evaluated with a CEL interpreter that
//! implements Kubernetes' `quantity()` and `semver()` libraries (kube-cel), selects
//! exactly the devices the planner put in each flavor.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::core::cel::{KubeCelExt, cel};
use proptest::prelude::*;
use serde_json::{Value as Json, json};

use super::*;
use crate::api::{CreditBudget, SharingMode};
use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::plan::Plan;
use crate::plan::tests::{budget, class, run_with_slices};

// ---------------------------------------------------------------- CEL, as the scheduler runs it

/// The DRA drivers' domains: a selector naming one a device does not publish sees
/// an empty map there, as in Kubernetes (`k8s.io/dynamic-resource-allocation/cel`).
const DOMAINS: [&str; 5] = [
    "gpu.nvidia.com",
    "gpu.amd.com",
    "gaudi.intel.com",
    "gpu.intel.com",
    "tpu.google.com",
];

struct Cel {
    context: cel::Context<'static>,
}

impl Cel {
    fn new() -> Self {
        Cel {
            context: cel::Context::default().with_all(),
        }
    }

    /// `semver(s)` / `quantity(s)` as the registered functions build them.
    fn opaque(&self, function: &str, s: &str) -> cel::Value {
        let mut scope = self.context.new_inner_scope();
        scope.add_variable_from_value("s", s.to_string());
        cel::Program::compile(&format!("{function}(s)"))
            .expect("compiles")
            .execute(&scope)
            .unwrap_or_else(|e| panic!("{function}({s:?}): {e:?}"))
    }

    /// The `device` variable for one published device of `driver`.
    fn device(&self, driver: &str, device: &Json) -> cel::Value {
        let split = |name: &str| match name.split_once('/') {
            Some((domain, id)) => (domain.to_string(), id.to_string()),
            None => (driver.to_string(), name.to_string()),
        };
        let mut attributes: HashMap<String, HashMap<String, cel::Value>> = HashMap::new();
        let mut capacity: HashMap<String, HashMap<String, cel::Value>> = HashMap::new();
        for domain in DOMAINS {
            attributes.entry(domain.into()).or_default();
            capacity.entry(domain.into()).or_default();
        }
        for (name, a) in device["attributes"].as_object().into_iter().flatten() {
            let value = if let Some(i) = a["int"].as_i64() {
                cel::Value::Int(i)
            } else if let Some(b) = a["bool"].as_bool() {
                cel::Value::Bool(b)
            } else if let Some(s) = a["string"].as_str() {
                cel::Value::from(s.to_string())
            } else {
                self.opaque("semver", a["version"].as_str().expect("a version"))
            };
            let (domain, id) = split(name);
            attributes.entry(domain).or_default().insert(id, value);
        }
        for (name, c) in device["capacity"].as_object().into_iter().flatten() {
            let (domain, id) = split(name);
            let value = self.opaque("quantity", c["value"].as_str().expect("a quantity"));
            capacity.entry(domain).or_default().insert(id, value);
        }
        let device: HashMap<&str, cel::Value> = HashMap::from([
            ("driver", cel::Value::from(driver.to_string())),
            ("attributes", cel::Value::from(attributes)),
            ("capacity", cel::Value::from(capacity)),
        ]);
        cel::Value::from(device)
    }

    /// Whether `expression` selects the device; an evaluation error is an error,
    /// never "no": the scheduler aborts the pod's attempt on one.
    fn selects(&self, expression: &str, device: cel::Value) -> Result<bool, String> {
        let program = cel::Program::compile(expression).map_err(|e| format!("{e:?}"))?;
        let mut scope = self.context.new_inner_scope();
        scope.add_variable_from_value("device", device);
        match program.execute(&scope) {
            Ok(cel::Value::Bool(b)) => Ok(b),
            Ok(other) => Err(format!("not a bool: {other:?}")),
            Err(e) => Err(format!("{e:?}")),
        }
    }
}

// ---------------------------------------------------------------- fleets

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }))
    .expect("a Node")
}

/// The model label a platform team (or the vendor's labeller) puts on a node.
fn labelled(mut node: Node, model: &str) -> Node {
    node.metadata
        .labels
        .get_or_insert_default()
        .insert(crate::inventory::MODEL_LABEL.into(), model.into());
    node
}

/// The model a node's devices are read as (`inventory::dra::groups::model_name`),
/// for its label.
fn model_of(driver: &str, devices: &[Json]) -> Option<String> {
    let attribute = match driver {
        "gpu.nvidia.com" | "gpu.amd.com" => "productName",
        "tpu.google.com" => "accelerator",
        _ => "model",
    };
    let product = devices
        .iter()
        .find_map(|d| d["attributes"][attribute]["string"].as_str())
        .filter(|p| *p != "Unknown")?;
    let words: Vec<&str> = product.split_whitespace().collect();
    Some(words.join(if driver == "gpu.intel.com" { "_" } else { "-" }))
}

fn slice(node: &str, driver: &str, devices: Vec<Json>) -> ResourceSlice {
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": format!("{node}-{driver}")},
        "spec": {
            "driver": driver, "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }))
    .expect("a ResourceSlice")
}

fn string(s: &str) -> Json {
    json!({"string": s})
}

fn version(s: &str) -> Json {
    json!({"version": s})
}

/// An NVIDIA DRA GPU as the driver publishes it (`deviceinfo.go`: `type`,
/// `productName`, `architecture`, `driverVersion`, `cudaComputeCapability`,
/// `cudaDriverVersion`; capacity `memory`).
fn nvidia_gpu(name: &str, product: &str, memory: &str, driver_version: &str) -> Json {
    json!({
        "name": name,
        "attributes": {
            "type": string("gpu"), "uuid": string(&format!("GPU-{name}")),
            "productName": string(product), "architecture": string("Hopper"),
            "driverVersion": version(driver_version),
            "cudaComputeCapability": version("9.0.0"), "cudaDriverVersion": version("12.4.0"),
        },
        "capacity": {"memory": {"value": memory}},
    })
}

fn run(
    classes: &[AcceleratorClass],
    budgets: &[CreditBudget],
    nodes: &[Node],
    slices: &[ResourceSlice],
) -> (Plan, Inventory) {
    run_with_slices(classes, budgets, nodes, slices, &HealthSnapshot::default())
}

fn expression(dc: &DeviceClass) -> &str {
    &dc.spec.selectors.as_ref().unwrap()[0]
        .cel
        .as_ref()
        .unwrap()
        .expression
}

// ---------------------------------------------------------------- examples

#[test]
fn semver_bounds_mirror_the_matchers_version_comparison() {
    for (want, major_minor, bound) in [
        ("550", false, Some("550.0.0")),
        ("550.54", false, Some("550.54.0")),
        ("v550.54.15", false, Some("550.54.15")),
        ("550.54.15.1", false, Some("550.54.16")),
        ("550.54.15.0", false, Some("550.54.15")),
        ("8.0", true, Some("8.0.0")),
        ("8", true, Some("8.0.0")),
        // The matcher reads a device's compute capability as major.minor: 8.0.1
        // is only met by 8.1.
        ("8.0.1", true, Some("8.1.0")),
        ("8.x", true, None),
        ("", false, None),
    ] {
        assert_eq!(
            semver_bound(want, major_minor).as_deref(),
            bound,
            "{want} {major_minor}"
        );
    }
}

/// Two H100 nodes and one H200 node, DRA only: one DeviceClass per flavor, owned
/// by kaccel, its selector pinning the driver, the device type and the product, and
/// the class's minimum memory and driver version.
#[test]
fn a_dra_only_fleet_gets_one_device_class_per_flavor() {
    // Labelled with their model, so each flavor selects only its nodes (the
    // planner's purity check; the DeviceClass pins the devices on them).
    let nodes = [
        labelled(node("h100-a"), "NVIDIA-H100-80GB-HBM3"),
        labelled(node("h100-b"), "NVIDIA-H100-80GB-HBM3"),
        labelled(node("h200-a"), "NVIDIA-H200"),
    ];
    let gpus = |product: &str, memory: &str| {
        (0..8)
            .map(|i| nvidia_gpu(&format!("gpu-{i}"), product, memory, "550.54.15"))
            .collect::<Vec<_>>()
    };
    let slices = [
        slice(
            "h100-a",
            "gpu.nvidia.com",
            gpus("NVIDIA H100 80GB HBM3", "81559Mi"),
        ),
        slice(
            "h100-b",
            "gpu.nvidia.com",
            gpus("NVIDIA H100 80GB HBM3", "81559Mi"),
        ),
        slice("h200-a", "gpu.nvidia.com", gpus("NVIDIA H200", "143771Mi")),
    ];
    let mut large = class(
        "large",
        SharingMode::Whole,
        crate::api::HardwareSelector {
            min_memory_mib: Some(80_000),
            min_driver_version: Some("550".into()),
            ..Default::default()
        },
    );
    large.spec.selector.vendors = vec![crate::api::Vendor::Nvidia];
    let budgets = [budget("team", &["team"], &[("large", 24)])];
    let (plan, _) = run(&[large], &budgets, &nodes, &slices);
    let names: Vec<&str> = plan
        .device_classes
        .iter()
        .map(|d| d.metadata.name.as_deref().unwrap())
        .collect();
    assert_eq!(
        names,
        ["nvidia-h100-80gb-hbm3.kaccel.io", "nvidia-h200.kaccel.io"]
    );
    let h100 = &plan.device_classes[0];
    assert_eq!(
        h100.metadata.labels.as_ref().unwrap()[MANAGED_BY_LABEL],
        crate::k8s::instance::DEFAULT_INSTANCE
    );
    assert_eq!(
        expression(h100),
        r#"device.driver == "gpu.nvidia.com" && has(device.attributes["gpu.nvidia.com"].type) && device.attributes["gpu.nvidia.com"].type in ["gpu"] && has(device.attributes["gpu.nvidia.com"].productName) && device.attributes["gpu.nvidia.com"].productName in ["NVIDIA H100 80GB HBM3"] && (!has(device.attributes["gpu.nvidia.com"].profile) || device.attributes["gpu.nvidia.com"].profile == "") && has(device.capacity["gpu.nvidia.com"].memory) && device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80000Mi")) >= 0 && has(device.attributes["gpu.nvidia.com"].driverVersion) && device.attributes["gpu.nvidia.com"].driverVersion.compareTo(semver("550.0.0")) >= 0"#
    );
    // The printed plan carries them first, as resource.k8s.io/v1 objects.
    let objects = crate::cli::plan_objects(&plan);
    assert_eq!(objects[0]["apiVersion"], "resource.k8s.io/v1");
    assert_eq!(objects[0]["kind"], "DeviceClass");
    assert!(plan.device_class_problems.is_empty());
}

/// A driver that publishes its version as a plain string: CEL cannot compare it,
/// so no DeviceClass, and the class says which field and why.
#[test]
fn a_requirement_cel_cannot_express_is_named_and_writes_nothing() {
    let nodes = [node("h100-a")];
    let mut gpu = nvidia_gpu("gpu-0", "NVIDIA H100 80GB HBM3", "81559Mi", "550.54.15");
    gpu["attributes"]["driverVersion"] = string("550.54.15");
    let slices = [slice("h100-a", "gpu.nvidia.com", vec![gpu])];
    let large = class(
        "large",
        SharingMode::Whole,
        crate::api::HardwareSelector {
            min_driver_version: Some("550".into()),
            ..Default::default()
        },
    );
    let budgets = [budget("team", &["team"], &[("large", 1)])];
    let (plan, _) = run(&[large], &budgets, &nodes, &slices);
    assert!(plan.device_classes.is_empty());
    assert_eq!(
        plan.resource_flavors.len(),
        1,
        "the flavor itself is planned"
    );
    let problem = &plan.device_class_problems[0];
    assert_eq!(problem.field, "spec.selector.minDriverVersion");
    let condition = plan.classes["large"]
        .conditions
        .iter()
        .find(|c| c.type_ == crate::api::DEVICE_CLASSES_READY)
        .expect("a DeviceClassesReady condition");
    assert!(!condition.status);
    assert!(
        condition.message.contains("spec.selector.minDriverVersion")
            && condition.message.contains("as a string"),
        "{}",
        condition.message
    );
}

// ---------------------------------------------------------------- property

/// Products per driver with the memory and architecture every device of the
/// product publishes (one product, one board).
const NVIDIA_PRODUCTS: [(&str, &str, &str); 3] = [
    ("NVIDIA H100 80GB HBM3", "81559Mi", "Hopper"),
    ("NVIDIA A100-SXM4-40GB", "40960Mi", "Ampere"),
    ("NVIDIA L4", "23034Mi", "Ada Lovelace"),
];
const AMD_PRODUCTS: [(&str, &str, &str); 2] = [
    ("AMD Instinct MI300X", "196592Mi", "AMD_CDNA_3"),
    ("AMD Instinct MI210", "65520Mi", "AMD_CDNA_2"),
];
const INTEL_GPU_MODELS: [(&str, &str, &str); 2] = [
    ("Max 1550", "131072Mi", "Data Center GPU Max"),
    ("Flex 170", "16384Mi", "Data Center GPU Flex"),
];
const GAUDI_MODELS: [&str; 2] = ["Gaudi2", "Gaudi3"];
const TPU_TYPES: [&str; 2] = ["tpu-v5-lite-podslice", "tpu-v6e-slice"];
const DRIVER_VERSIONS: [&str; 3] = ["535.104.5", "550.54.15", "560.28.3"];

/// One node's devices of one driver, as that driver publishes them, with a few
/// of the things real fleets have: MIG beside whole GPUs, an unknown model, a
/// version published as a string, memory not reported.
fn arb_node_devices() -> impl Strategy<Value = (&'static str, Vec<Json>)> {
    (0usize..5, 0usize..3, 1usize..5, any::<u16>()).prop_map(|(driver, product, count, bits)| {
        let bit = |b: u16| bits & (1 << b) != 0;
        let driver_version = DRIVER_VERSIONS[(bits as usize >> 8) % DRIVER_VERSIONS.len()];
        let version_value = |v: &str| if bit(0) { string(v) } else { version(v) };
        let mut devices = Vec::new();
        for i in 0..count {
            let name = format!("dev-{i}");
            let device = match driver {
                0 => {
                    let (product, memory, arch) = NVIDIA_PRODUCTS[product % 3];
                    let mig = bit(1) && i % 2 == 1;
                    let mut d = json!({
                        "name": name,
                        "attributes": {
                            "type": string(if mig { "mig" } else { "gpu" }),
                            "productName": string(product),
                            "architecture": string(arch),
                            "driverVersion": version_value(driver_version),
                            "cudaComputeCapability": version(if arch == "Hopper" { "9.0.0" } else { "8.0.0" }),
                            "cudaDriverVersion": version("12.4.0"),
                        },
                        "capacity": {"memory": {"value": if mig { "10240Mi" } else { memory }}},
                    });
                    if mig {
                        d["attributes"]["profile"] = string(if bit(2) { "1g.10gb" } else { "2g.20gb" });
                    }
                    if bit(3) && i == 0 {
                        d["attributes"].as_object_mut().unwrap().remove("productName");
                    }
                    d
                }
                1 => {
                    let (product, memory, family) = AMD_PRODUCTS[product % 2];
                    let mut d = json!({
                        "name": name,
                        "attributes": {
                            "type": string("amdgpu"),
                            "productName": string(product),
                            "family": string(family),
                            "driverVersion": version_value("6.8.5"),
                        },
                        "capacity": {"memory": {"value": memory}},
                    });
                    if bit(4) {
                        d["attributes"]["partitionProfile"] = string(if bit(5) { "cpx_nps4" } else { "spx_nps1" });
                        d["attributes"]["type"] = string("amdgpu-partition");
                    }
                    d
                }
                2 => {
                    let (model, memory, family) = INTEL_GPU_MODELS[product % 2];
                    json!({
                        "name": name,
                        "attributes": {
                            "type": string(if bit(6) && i == 1 { "vf" } else { "gpu" }),
                            "model": string(if bit(7) && i == 0 { "Unknown" } else { model }),
                            "family": string(family),
                        },
                        "capacity": {"memory": {"value": if bit(9) { "0" } else { memory }}},
                    })
                }
                3 => json!({
                    "name": name,
                    "attributes": {
                        "model": string(GAUDI_MODELS[product % 2]),
                        "healthy": {"bool": !(bit(10) && i == 0)},
                    },
                }),
                _ => json!({
                    "name": name,
                    "attributes": {
                        "index": {"int": i},
                        "accelerator": string(TPU_TYPES[product % 2]),
                    },
                }),
            };
            devices.push(device);
        }
        let driver = ["gpu.nvidia.com", "gpu.amd.com", "gpu.intel.com", "gaudi.intel.com", "tpu.google.com"][driver];
        (driver, devices)
    })
}

/// A class's hard requirements, each present one time in four (more and most
/// classes match nothing).
fn arb_requirements() -> impl Strategy<Value = crate::api::HardwareSelector> {
    let some = |p: f64| p;
    (
        prop::option::weighted(
            some(0.25),
            prop::sample::select(vec![16_000u64, 40_000, 80_000, 100_000]),
        ),
        prop::option::weighted(
            some(0.25),
            prop::sample::subsequence(
                vec![
                    "hopper",
                    "Ampere",
                    "cdna3",
                    "AMD_CDNA_3",
                    "xe-hpc",
                    "xe-hpg",
                ],
                1..3,
            ),
        ),
        prop::option::weighted(
            some(0.25),
            prop::sample::select(vec!["8.0", "8.6", "9.0", "9.0.1"]),
        ),
        prop::option::weighted(
            some(0.25),
            prop::sample::select(vec!["12.0", "12.4.1", "13"]),
        ),
        prop::option::weighted(
            some(0.25),
            prop::sample::select(vec!["535", "550.54.15", "550.54.16", "6.8", "560.28.3.1"]),
        ),
    )
        .prop_map(|(memory, architectures, compute, cuda, driver)| {
            crate::api::HardwareSelector {
                min_memory_mib: memory,
                architectures: architectures
                    .unwrap_or_default()
                    .into_iter()
                    .map(String::from)
                    .collect(),
                min_compute_capability: compute.map(String::from),
                min_cuda_version: cuda.map(String::from),
                min_driver_version: driver.map(String::from),
                ..Default::default()
            }
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    /// Random DRA-only fleets of every driver kaccel reads and random classes: on
    /// every node of a flavor, its DeviceClass's CEL selects exactly the flavor's
    /// devices there, and evaluates without error on every device of the fleet;
    /// a DRA-only flavor without a DeviceClass is one whose class is told why.
    #[test]
    fn device_class_cel_selects_exactly_the_flavors_devices(
        fleet in prop::collection::vec((arb_node_devices(), any::<bool>()), 1..7),
        requirements in prop::collection::vec((arb_requirements(), 0usize..3), 1..4),
    ) {
        let mut nodes = Vec::new();
        let mut slices = Vec::new();
        let mut published: BTreeMap<String, (String, Vec<Json>)> = BTreeMap::new();
        for (i, ((driver, devices), label)) in fleet.into_iter().enumerate() {
            let name = format!("node-{i}");
            // Mostly labelled with the model (else the purity check refuses
            // flavors sharing a driver's class, and there is less to check).
            nodes.push(match model_of(driver, &devices) {
                Some(model) if label || i % 3 != 0 => labelled(node(&name), &model),
                _ => node(&name),
            });
            slices.push(slice(&name, driver, devices.clone()));
            published.insert(name, (driver.to_string(), devices));
        }
        let sharing = [SharingMode::Whole, SharingMode::Partition, SharingMode::Whole];
        let classes: Vec<AcceleratorClass> = requirements
            .into_iter()
            .enumerate()
            .map(|(i, (selector, s))| class(&format!("c{i}"), sharing[s], selector))
            .collect();
        let grants: Vec<(String, u32)> = classes
            .iter()
            .map(|c| (c.metadata.name.clone().unwrap(), 1000))
            .collect();
        let grants: Vec<(&str, u32)> = grants.iter().map(|(c, n)| (c.as_str(), *n)).collect();
        let budgets = [budget("team", &["team"], &grants)];
        let (plan, inventory) = run(&classes, &budgets, &nodes, &slices);

        let cel = Cel::new();
        let with_problem: BTreeSet<&str> =
            plan.device_class_problems.iter().map(|p| p.flavor.as_str()).collect();
        for p in &plan.device_class_problems {
            let condition = plan.classes[&p.class]
                .conditions
                .iter()
                .find(|c| c.type_ == crate::api::DEVICE_CLASSES_READY);
            prop_assert!(condition.is_some_and(|c| c.message.contains(&p.field)));
        }
        let by_flavor: BTreeMap<&str, &DeviceClass> = plan
            .device_classes
            .iter()
            .map(|d| (d.metadata.labels.as_ref().unwrap()[FLAVOR_LABEL].as_str(), d))
            .collect();
        for (fname, flavor) in &plan.flavors {
            if !crate::inventory::is_dra_device_class(&flavor.resource_name) {
                continue;
            }
            let Some(dc) = by_flavor.get(fname.as_str()) else {
                prop_assert!(with_problem.contains(fname.as_str()), "flavor {} has no DeviceClass and no problem", fname);
                continue;
            };
            let expression = expression(dc);
            prop_assert!(expression.len() <= 10 * 1024, "over the API server's 10 KiB limit");
            // Every node the flavor's nodeLabels select (Kueue may place a pod on
            // any of them): the devices there of the flavor's variant that the
            // planner's matcher passes for one of the flavor's classes, no other.
            let passes = |g: &crate::inventory::DeviceGroup| {
                flavor.classes.iter().any(|name| {
                    let class = classes.iter().find(|c| c.metadata.name.as_ref() == Some(name)).unwrap();
                    crate::plan::hardware::hardware_mismatch(
                        &class.spec.selector,
                        class.spec.sharing,
                        &crate::plan::hardware::Signature::of(g),
                    )
                    .is_none()
                })
            };
            let selected_nodes = inventory.nodes.values().filter(|n| {
                n.labels.carries_all(&flavor.node_labels)
            });
            for inv in selected_nodes {
                let node_name = &inv.name;
                let mine: BTreeSet<&str> = inv
                    .groups
                    .iter()
                    .filter(|g| {
                        passes(g)
                            && g.variant.model == flavor.model
                            && g.variant.sharing == flavor.sharing
                            && g.variant.partition_profile == flavor.partition_profile
                            && g.variant.resource_name == flavor.resource_name
                    })
                    .flat_map(|g| g.devices.iter().map(|d| d.name.as_str()))
                    .collect();
                let (driver, devices) = &published[node_name];
                let mut selected = BTreeSet::new();
                for d in devices {
                    let chosen = cel.selects(expression, cel.device(driver, d));
                    prop_assert!(chosen.is_ok(), "{} on {}/{}: {:?}", expression, node_name, d["name"], chosen);
                    if chosen.unwrap() {
                        selected.insert(d["name"].as_str().unwrap());
                    }
                }
                prop_assert_eq!(&selected, &mine, "flavor {} on {}: {}", fname, node_name, expression);
            }
            // Never an error on any other device of the fleet, whatever its driver.
            for (node_name, (driver, devices)) in &published {
                for d in devices {
                    let outcome = cel.selects(expression, cel.device(driver, d));
                    prop_assert!(outcome.is_ok(), "{} on {}/{}: {:?}", expression, node_name, d["name"], outcome);
                }
            }
        }
    }
}

/// A flavor whose devices publish so many spellings of their product that the
/// selector would pass the API server's 10 KiB limit: no DeviceClass, and the
/// class says why, instead of an apply that fails every pass.
#[test]
fn a_selector_over_the_api_servers_limit_is_refused() {
    let nodes = [labelled(node("h100-a"), "NVIDIA-H100-80GB-HBM3")];
    // One product, spelled 400 ways (case and spacing: the same model to the reader).
    let devices: Vec<Json> = (0..400)
        .map(|i| {
            let spelling: String = "NVIDIA H100 80GB HBM3"
                .chars()
                .enumerate()
                .map(|(j, c)| {
                    if (i >> (j % 9)) & 1 == 1 {
                        c.to_ascii_lowercase()
                    } else {
                        c
                    }
                })
                .collect();
            let mut d = nvidia_gpu(
                &format!("gpu-{i}"),
                &format!("{spelling}{}", " ".repeat(i / 256)),
                "81559Mi",
                "550.54.15",
            );
            d["name"] = json!(format!("gpu-{i}"));
            d
        })
        .collect();
    let slices = [slice("h100-a", "gpu.nvidia.com", devices)];
    let large = class("large", SharingMode::Whole, Default::default());
    let budgets = [budget("team", &["team"], &[("large", 1)])];
    let (plan, _) = run(&[large], &budgets, &nodes, &slices);
    assert!(plan.device_classes.is_empty());
    let problem = &plan.device_class_problems[0];
    assert_eq!(problem.field, "spec.selector");
    assert!(problem.message.contains("10240"), "{}", problem.message);
}

// ---------------------------------------------------------------- Kueue counting

/// One H100 node and one H200 node, DRA only, one class over both.
fn two_dra_flavors() -> (
    Vec<AcceleratorClass>,
    Vec<CreditBudget>,
    Vec<Node>,
    Vec<ResourceSlice>,
) {
    let nodes = vec![
        labelled(node("h100-a"), "NVIDIA-H100-80GB-HBM3"),
        labelled(node("h200-a"), "NVIDIA-H200"),
    ];
    let gpus = |product: &str, memory: &str| {
        (0..8)
            .map(|i| nvidia_gpu(&format!("gpu-{i}"), product, memory, "550.54.15"))
            .collect::<Vec<_>>()
    };
    let slices = vec![
        slice(
            "h100-a",
            "gpu.nvidia.com",
            gpus("NVIDIA H100 80GB HBM3", "81559Mi"),
        ),
        slice("h200-a", "gpu.nvidia.com", gpus("NVIDIA H200", "143771Mi")),
    ];
    let mut large = class("large", SharingMode::Whole, Default::default());
    large.spec.selector.vendors = vec![crate::api::Vendor::Nvidia];
    let budgets = vec![budget("team", &["team"], &[("large", 12)])];
    (vec![large], budgets, nodes, slices)
}

fn plan_observing(config: Option<crate::kueue::config::ObservedConfiguration>) -> Plan {
    let (classes, budgets, nodes, slices) = two_dra_flavors();
    let inventory = Inventory::from_nodes_and_slices(&nodes, &slices);
    let options = crate::plan::PlanOptions {
        kueue_configuration: config,
        ..Default::default()
    };
    crate::plan::plan(&crate::plan::PlanInput {
        classes: &classes,
        budgets: &budgets,
        inventory: &inventory,
        health: &HealthSnapshot::default(),
        options: &options,
    })
}

fn observed(yaml: &str) -> crate::kueue::config::ObservedConfiguration {
    crate::kueue::config::ObservedConfiguration {
        source: "file /etc/kueue/config.yaml".into(),
        read: crate::kueue::config::Configuration::parse("f", yaml).map_err(|e| e.reason),
        gate_on_command_line: false,
    }
}

fn counts_condition(plan: &Plan) -> Option<&crate::api::DesiredCondition> {
    plan.classes["large"]
        .conditions
        .iter()
        .find(|c| c.type_ == crate::api::KUEUE_COUNTS_DEVICE_CLASSES)
}

/// One device, one count on DRA: each DRA-only flavor's quota is in the class
/// resource alone (claims of its DeviceClass are mapped to it, class-level
/// requests are it), never above its healthy devices (invariant 1); Kueue's
/// snippet maps every kaccel DeviceClass in one entry; the flavor tells the pod
/// webhook to turn a class request into its DeviceClass's implicit resource.
#[test]
fn dra_flavors_are_counted_as_the_class_resource() {
    let plan = plan_observing(None);
    let cq = &plan.cluster_queues[0];
    let group = &cq.spec.resource_groups[0];
    assert_eq!(
        group.covered_resources,
        [crate::api::CLASS_RESOURCE, "cpu", "memory"]
    );
    let mut granted = 0;
    for flavor in &group.flavors {
        for r in flavor
            .resources
            .iter()
            .filter(|r| r.name == crate::api::CLASS_RESOURCE)
        {
            let n: u64 = r.nominal_quota.0.parse().unwrap();
            assert!(n <= plan.flavors[&flavor.name].healthy_capacity);
            granted += n;
        }
    }
    assert_eq!(granted, 12);
    assert_eq!(
        plan.flavors["nvidia-h200"].resource_name,
        crate::api::CLASS_RESOURCE
    );
    let rf = plan
        .resource_flavors
        .iter()
        .find(|f| f.metadata.name.as_deref() == Some("nvidia-h200"))
        .unwrap();
    assert_eq!(
        rf.metadata.annotations.as_ref().unwrap()[crate::k8s::labels::DEVICE_RESOURCE_ANNOTATION],
        "deviceclass.resource.kubernetes.io/nvidia-h200.kaccel.io"
    );
    let mappings = crate::plan::kueue_counting::mappings(&plan.device_classes);
    let snippet = crate::plan::kueue_counting::configuration_snippet(&mappings, &[]);
    assert!(snippet.contains(
        "  - name: kaccel.io/accelerator\n    deviceClassNames:\n    - nvidia-h100-80gb-hbm3.kaccel.io\n    - nvidia-h200.kaccel.io\n"
    ), "{snippet}");
    assert_eq!(mappings.len(), 1);
    // No transformation of the class resource into itself.
    assert!(crate::plan::kueue_counting::transformations(&plan.flavors).is_empty());
    // Without an observed configuration the planner says nothing about Kueue.
    assert!(counts_condition(&plan).is_none());
}

/// The printed snippet, pasted into Kueue's configuration, is what the check
/// wants; anything less is named.
#[test]
fn the_kueue_check_names_what_kueues_configuration_lacks() {
    let bare = plan_observing(None);
    let snippet = crate::plan::kueue_counting::configuration_snippet(
        &crate::plan::kueue_counting::mappings(&bare.device_classes),
        &crate::plan::kueue_counting::transformations(&bare.flavors),
    );
    let ok = plan_observing(Some(observed(&format!(
        "apiVersion: config.kueue.x-k8s.io/v1beta2\nkind: Configuration\n{snippet}"
    ))));
    let c = counts_condition(&ok).expect("a condition");
    assert!(c.status, "{c:?}");
    assert_eq!(c.reason, "Mapped");

    // No gate, one mapping missing, one pointing elsewhere.
    let partial = plan_observing(Some(observed(
        "resources:\n  deviceClassMappings:\n  - name: kaccel.io/accelerator\n    deviceClassNames: [nvidia-h200.kaccel.io]\n  - name: example.com/gpu\n    deviceClassNames: [nvidia-h100-80gb-hbm3.kaccel.io]\n",
    )));
    let c = counts_condition(&partial).expect("a condition");
    assert!(!c.status);
    assert_eq!(c.reason, "DeviceClassNotMapped");
    assert!(
        c.message
            .contains("featureGates.DynamicResourceAllocation: true"),
        "{}",
        c.message
    );
    assert!(
        c.message.contains("DeviceClass nvidia-h100-80gb-hbm3.kaccel.io is mapped to example.com/gpu, not kaccel.io/accelerator"),
        "{}",
        c.message
    );
    assert!(!c.message.contains("add nvidia-h200"), "{}", c.message);
    let missing = plan_observing(Some(observed(
        "featureGates:\n  DynamicResourceAllocation: true\n",
    )));
    let c = counts_condition(&missing).expect("a condition");
    assert!(
        c.message.contains("add nvidia-h200.kaccel.io to the deviceClassNames of the resources.deviceClassMappings entry named kaccel.io/accelerator"),
        "{}",
        c.message
    );
    assert!(!c.message.contains("featureGates"), "{}", c.message);
    // A gate on Kueue's command line is taken on the platform team's word.
    let mut flags = observed(
        "resources:\n  deviceClassMappings:\n  - name: kaccel.io/accelerator\n    deviceClassNames: [nvidia-h200.kaccel.io, nvidia-h100-80gb-hbm3.kaccel.io]\n",
    );
    flags.gate_on_command_line = true;
    assert!(
        counts_condition(&plan_observing(Some(flags)))
            .unwrap()
            .status
    );
    // Unreadable: said so, with the source.
    let unreadable = plan_observing(Some(crate::kueue::config::ObservedConfiguration {
        source: "ConfigMap kueue-system/kueue-manager-config".into(),
        read: Err("not found".into()),
        gate_on_command_line: false,
    }));
    let c = counts_condition(&unreadable).expect("a condition");
    assert!(!c.status);
    assert_eq!(c.reason, "KueueConfigurationUnreadable");
    assert!(
        c.message
            .contains("ConfigMap kueue-system/kueue-manager-config")
    );
}

#[test]
fn a_dra_flavors_pod_resource_is_its_device_classs_implicit_extended_resource() {
    let plan = plan_observing(None);
    let dra = &plan.flavors["nvidia-h200"];
    assert_eq!(
        crate::plan::kueue_counting::pod_resource(dra),
        "deviceclass.resource.kubernetes.io/nvidia-h200.kaccel.io"
    );
    assert!(crate::plan::kueue_counting::is_dra_flavor(dra));
    // The ledger prices the class resource as an accelerator.
    assert!(crate::ledger::admission::is_accelerator_resource(
        crate::api::CLASS_RESOURCE
    ));
}

#[test]
fn a_dra_ledger_line_names_its_device_class() {
    use crate::plan::kueue_counting::{device_class_of_resource, dra_line_resource};
    assert_eq!(
        device_class_of_resource(&dra_line_resource("nvidia-h200")).as_deref(),
        Some("nvidia-h200.kaccel.io")
    );
    assert_eq!(device_class_of_resource("nvidia.com/gpu"), None);
    assert_eq!(device_class_of_resource("kaccel.io/accelerator"), None);
    assert_eq!(device_class_of_resource("dra.kaccel.io/"), None);
    assert_eq!(device_class_of_resource("dra.kaccel.iox/a"), None);
}
