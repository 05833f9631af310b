//! One fault per vendor through the whole health loop: a fake exporter per node
//! serves that vendor's real text format (names and labels as mapped in
//! `src/health/exporters/vendors.rs`), `kaccel run` scrapes it, and the test watches the
//! class status, the Kueue quota and the Node.
//!
//! - NVIDIA critical XID 79 -> Failed, quota drop, cordon + repair request; recovery.
//! - NVIDIA hot cards (88 °C everywhere) -> Warning: flavor demoted, no node action.
//! - AMD uncorrectable ECC -> Failed, quota drop, cordon; recovery.
//! - Ascend health 0 + fault code -> Failed, quota drop, cordon; recovery.
//! - Gaudi on-chip temperature >= 95 °C -> Degraded: quota drop; all cards hot ->
//!   `kaccel.io/unhealthy:NoSchedule` taint (no cordon); recovery removes it.
//!
//! Each test prints one `MEASURE` line per fault for the record.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::Node;
use kaccel::api::{AcceleratorClass, HealthCounts, ResolvedFlavor};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use crate::controller::{
    Controller, class_from_example, class_with_budget, ensure_example_nodes, free_port, wait_for,
};
use crate::health::{Answer, FakeExporter};
use crate::support::{self, Cleanup, kueue};

const WAIT: Duration = Duration::from_secs(30);

/// What one device reports. The default is a cool, healthy card.
#[derive(Clone, Copy, Debug)]
struct Dev {
    temp: f64,
    /// NVIDIA last XID (0 = none).
    xid: u64,
    /// Uncorrectable ECC errors.
    ecc: u64,
    /// The vendor's own verdict (AMD `gpu_health`, Ascend `npu_chip_info_health_status`).
    healthy: bool,
    /// Ascend fault code (0 = none).
    code: u64,
}

impl Default for Dev {
    fn default() -> Self {
        Dev {
            temp: 41.0,
            xid: 0,
            ecc: 0,
            healthy: true,
            code: 0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Vendor {
    Nvidia,
    Amd,
    Ascend,
    Gaudi,
}

impl Vendor {
    fn kind(self) -> &'static str {
        match self {
            Vendor::Nvidia => "dcgm-exporter",
            Vendor::Amd => "amd-device-metrics",
            Vendor::Ascend => "ascend-npu-exporter",
            Vendor::Gaudi => "gaudi-exporter",
        }
    }

    /// The extended resource of the flavor under test.
    fn resource(self) -> &'static str {
        match self {
            Vendor::Nvidia => "nvidia.com/gpu",
            Vendor::Amd => "amd.com/gpu",
            Vendor::Ascend => "huawei.com/Ascend910",
            Vendor::Gaudi => "habana.ai/gaudi",
        }
    }

    /// A part of the flavor's name (as the planner names it) and the node faulted.
    fn flavor_part(self) -> &'static str {
        match self {
            Vendor::Nvidia => "h100",
            Vendor::Amd => "mi300x",
            Vendor::Ascend => "ascend910",
            Vendor::Gaudi => "gaudi3",
        }
    }

    fn faulted_node(self) -> &'static str {
        match self {
            Vendor::Nvidia => "gpu-h100-01",
            Vendor::Amd => "gpu-mi300x-01",
            Vendor::Ascend => "npu-910b-01",
            Vendor::Gaudi => "hpu-gaudi3-01",
        }
    }

    /// Example nodes of this vendor's fleet, each with its number of physical
    /// devices (what its exporter lists).
    fn fleet(self) -> Vec<(String, u32)> {
        example_nodes()
            .into_iter()
            .filter_map(|n| {
                let name = n.name_any();
                let cap = |r: &str| -> Option<u32> {
                    n.status.as_ref()?.capacity.as_ref()?.get(r)?.0.parse().ok()
                };
                let physical = match self {
                    Vendor::Nvidia if name.starts_with("gpu-h100") => cap("nvidia.com/gpu")?,
                    // Whole cards, or CPX partitions: 8 per MI300X.
                    Vendor::Amd if name.starts_with("gpu-mi300x") => {
                        cap("amd.com/gpu").or_else(|| Some(cap("amd.com/cpx_nps4")? / 8))?
                    }
                    // A 910B server carries 8 chips, whole or split into vNPUs.
                    Vendor::Ascend => {
                        cap("huawei.com/Ascend910")?;
                        8
                    }
                    Vendor::Gaudi => cap("habana.ai/gaudi")?,
                    _ => return None,
                };
                Some((name, physical))
            })
            .collect()
    }

    /// The exporter's answer for `n` devices on `node`, in its own text format.
    fn body(self, node: &str, n: u32, dev: &dyn Fn(u32) -> Dev) -> String {
        match self {
            Vendor::Nvidia => dcgm_body(node, n, dev),
            Vendor::Amd => amd_body(node, n, dev),
            Vendor::Ascend => ascend_body(n, dev),
            Vendor::Gaudi => gaudi_body(node, n, dev),
        }
    }
}

fn example_nodes() -> Vec<Node> {
    serde_yaml::Deserializer::from_str(include_str!("../../examples/nodes.yaml"))
        .filter_map(|d| serde::Deserialize::deserialize(d).ok())
        .collect()
}

fn allocatable(node: &str, resource: &str) -> u64 {
    example_nodes()
        .into_iter()
        .find(|n| n.name_any() == node)
        .and_then(|n| n.status?.allocatable?.get(resource)?.0.parse().ok())
        .unwrap_or(0)
}

/// Appends one metric family: HELP, TYPE and a sample per device.
fn family(
    s: &mut String,
    name: &str,
    help: &str,
    kind: &str,
    n: u32,
    labels: &dyn Fn(u32) -> String,
    value: &dyn Fn(u32) -> String,
) {
    s.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    for i in 0..n {
        s.push_str(&format!("{name}{{{}}} {}\n", labels(i), value(i)));
    }
}

/// dcgm-exporter (default counters) for H100s.
fn dcgm_body(node: &str, n: u32, dev: &dyn Fn(u32) -> Dev) -> String {
    let labels = |i: u32| {
        format!(
            "gpu=\"{i}\",UUID=\"GPU-{node}-{i:04}\",pci_bus_id=\"00000000:{:02X}:00.0\",device=\"nvidia{i}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"{node}\",DCGM_FI_DRIVER_VERSION=\"570.133.20\"",
            0x18 + i
        )
    };
    let mut s = String::new();
    family(
        &mut s,
        "DCGM_FI_DEV_GPU_TEMP",
        "GPU temperature (in C).",
        "gauge",
        n,
        &labels,
        &|i| format!("{}", dev(i).temp),
    );
    family(
        &mut s,
        "DCGM_FI_DEV_POWER_USAGE",
        "Power draw (in W).",
        "gauge",
        n,
        &labels,
        &|_| "312.5".into(),
    );
    family(
        &mut s,
        "DCGM_FI_DEV_GPU_UTIL",
        "GPU utilization (in %).",
        "gauge",
        n,
        &labels,
        &|_| "37".into(),
    );
    family(
        &mut s,
        "DCGM_FI_DEV_XID_ERRORS",
        "Value of the last XID error encountered.",
        "gauge",
        n,
        &labels,
        &|i| dev(i).xid.to_string(),
    );
    family(
        &mut s,
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        "Total number of double-bit volatile ECC errors.",
        "counter",
        n,
        &labels,
        &|i| dev(i).ecc.to_string(),
    );
    s
}

/// AMD device-metrics-exporter for MI300X (junction temperature only, as on MI3xx).
fn amd_body(node: &str, n: u32, dev: &dyn Fn(u32) -> Dev) -> String {
    let labels = |i: u32| {
        format!(
            "card_model=\"0x74a1\",card_series=\"AMD Instinct MI300X OAM\",card_vendor=\"Advanced Micro Devices, Inc. [AMD/ATI]\",driver_version=\"6.10.5\",gpu_compute_partition_type=\"spx\",gpu_memory_partition_type=\"nps1\",gpu_partition_id=\"0\",hostname=\"{node}\",vbios_version=\"113-M3000100-102\",gpu_id=\"{i}\",gpu_uuid=\"{i:02x}ff74a1-0000-1000-80a2-{:012x}\",serial_number=\"6923510001{i:02}\"",
            node.len() as u32 * 1000 + i
        )
    };
    let mut s = format!(
        "# HELP gpu_nodes_total Number of GPU nodes on the machine\n# TYPE gpu_nodes_total gauge\ngpu_nodes_total{{hostname=\"{node}\"}} {n}\n"
    );
    family(
        &mut s,
        "gpu_junction_temperature",
        "Hotspot (aka junction) temperature value in Celsius",
        "gauge",
        n,
        &labels,
        &|i| format!("{}", dev(i).temp),
    );
    family(
        &mut s,
        "gpu_power_usage",
        "GPU power usage in Watts",
        "gauge",
        n,
        &labels,
        &|_| "309".into(),
    );
    family(
        &mut s,
        "gpu_gfx_activity",
        "Graphics engine usage percentage (0 - 100)",
        "gauge",
        n,
        &labels,
        &|_| "12".into(),
    );
    family(
        &mut s,
        "gpu_ecc_correct_total",
        "Total Correctable ECC error count",
        "gauge",
        n,
        &labels,
        &|_| "0".into(),
    );
    family(
        &mut s,
        "gpu_ecc_uncorrect_total",
        "Total Uncorrectable ECC error count",
        "gauge",
        n,
        &labels,
        &|i| dev(i).ecc.to_string(),
    );
    family(
        &mut s,
        "gpu_health",
        "Health of the GPU (1 healthy, 0 unhealthy)",
        "gauge",
        n,
        &labels,
        &|i| u8::from(dev(i).healthy).to_string(),
    );
    s
}

/// Ascend npu-exporter (MindCluster) for 910B chips, with sample timestamps as it
/// writes them. It has no hostname label: the source names the node.
fn ascend_body(n: u32, dev: &dyn Fn(u32) -> Dev) -> String {
    let labels = |i: u32| {
        format!(
            "container_name=\"\",id=\"{i}\",model_name=\"Ascend910B3\",namespace=\"\",pod_name=\"\",pcie_bus_info=\"0000:{:02X}:00.0\",vdie_id=\"185011D4-21104518-A0C4ED94-14CC040A-5610{i:04}\"",
            0xC1 + i
        )
    };
    let ts = 1_723_621_883_587u64;
    let mut s = format!(
        "# HELP machine_npu_nums Amount of npu installed on the machine.\n# TYPE machine_npu_nums gauge\nmachine_npu_nums {n}\n"
    );
    family(
        &mut s,
        "npu_chip_info_error_code",
        "the npu error code",
        "gauge",
        n,
        &labels,
        &|i| format!("{} {ts}", dev(i).code),
    );
    family(
        &mut s,
        "npu_chip_info_health_status",
        "the npu health status",
        "gauge",
        n,
        &labels,
        &|i| format!("{} {ts}", u8::from(dev(i).healthy)),
    );
    family(
        &mut s,
        "npu_chip_info_temperature",
        "the npu temperature",
        "gauge",
        n,
        &labels,
        &|i| format!("{} {ts}", dev(i).temp),
    );
    family(
        &mut s,
        "npu_chip_info_power",
        "the npu power",
        "gauge",
        n,
        &labels,
        &|_| format!("95.5 {ts}"),
    );
    family(
        &mut s,
        "npu_chip_info_utilization",
        "the ai core utilization",
        "gauge",
        n,
        &labels,
        &|_| format!("0 {ts}"),
    );
    family(
        &mut s,
        "npu_chip_info_hbm_used_memory",
        "the npu hbm used memory, unit is 'MB'",
        "gauge",
        n,
        &labels,
        &|_| format!("3383 {ts}"),
    );
    family(
        &mut s,
        "npu_chip_info_hbm_ecc_double_bit_error_cnt",
        "HBM Double Bit Error Count",
        "gauge",
        n,
        &labels,
        &|i| format!("{} {ts}", dev(i).ecc),
    );
    s
}

/// Intel Gaudi (habanalabs) metric exporter.
fn gaudi_body(node: &str, n: u32, dev: &dyn Fn(u32) -> Dev) -> String {
    let labels = |i: u32| {
        format!(
            "Serial=\"AN0905{i:04}\",UUID=\"01P0-HL3090A0-15-TNQ812-11-07-{i:02}\",device=\"AN0905{i:04}\",driver=\"1.19.1-6f47ddd\",fit=\"hl-gaudi3-1.19.1-fw-57.2.2\",id=\"{i}\",pod_name=\"\",pod_namespace=\"\",spi=\"hl-gaudi3-1.19.1-fw-57.2.2-sec-9\""
        )
    };
    let mut s = format!(
        "# HELP habanalabs_kube_info Kubernetes information of the exporter pod\n# TYPE habanalabs_kube_info gauge\nhabanalabs_kube_info{{hostname=\"{node}\",namespace=\"habana-system\",node=\"{node}\",pod_ip=\"10.42.3.17\",pod_name=\"habana-metric-exporter-ds-7x2kq\"}} 1\n"
    );
    family(
        &mut s,
        "habanalabs_temperature_onchip",
        "Temperature on chip (C)",
        "gauge",
        n,
        &labels,
        &|i| format!("{}", dev(i).temp),
    );
    family(
        &mut s,
        "habanalabs_temperature_threshold_gpu",
        "GPU temperature threshold (C)",
        "gauge",
        n,
        &labels,
        &|_| "95".into(),
    );
    family(
        &mut s,
        "habanalabs_power_mW",
        "Current power usage (mW)",
        "gauge",
        n,
        &labels,
        &|_| "231000".into(),
    );
    family(
        &mut s,
        "habanalabs_memory_used_bytes",
        "Used memory (bytes)",
        "gauge",
        n,
        &labels,
        &|_| "805306368".into(),
    );
    family(
        &mut s,
        "habanalabs_utilization",
        "Device utilization (%)",
        "gauge",
        n,
        &labels,
        &|_| "12".into(),
    );
    family(
        &mut s,
        "habanalabs_pending_rows_with_double_bit_ecc_errors",
        "Rows pending replacement after double-bit ECC errors",
        "gauge",
        n,
        &labels,
        &|_| "0".into(),
    );
    s
}

/// A running controller scraping one fake exporter per node of `vendor`.
struct Rig {
    vendor: Vendor,
    controller: Controller,
    /// (node, physical devices, exporter)
    exporters: Vec<(String, u32, FakeExporter)>,
    root: String,
    class: String,
    cq: String,
}

impl Rig {
    async fn start(
        client: &Client,
        cleanup: &mut Cleanup,
        vendor: Vendor,
        example: &str,
    ) -> Result<Rig> {
        ensure_example_nodes(client).await?;
        restore_nodes(client, vendor).await;
        let id = support::unique("hv");
        let class = format!("{example}-{id}");
        let (ns, team) = class_with_budget(
            client,
            cleanup,
            &id,
            &class_from_example(example, &class),
            4,
        )
        .await?;

        let mut exporters = Vec::new();
        for (node, n) in vendor.fleet() {
            let body = vendor.body(&node, n, &|_| Dev::default());
            exporters.push((node, n, FakeExporter::start(Answer::Metrics(body)).await));
        }
        let root = format!("root-{id}");
        let mut config = format!(
            "rootCohort: {root}\ndebounceMs: 50\nmaxDelayMs: 300\nwatchResourceSlices: false\nleaderElection:\n  enabled: false\nhealth:\n  policy:\n    holdDownSeconds: 2\n  sources:\n"
        );
        for (node, _, e) in &exporters {
            config.push_str(&format!(
                "    - {{name: {}-{node}, kind: {}, url: \"http://127.0.0.1:{}/metrics\", node: {node}, intervalSeconds: 1, staleAfterSeconds: 3, timeoutSeconds: 1}}\n",
                vendor.kind(),
                vendor.kind(),
                e.port
            ));
        }
        let controller = Controller::start(&format!("hv-{id}"), free_port(), &config);
        let cq = format!("{team}-{class}");
        cleanup.add(None, kueue("Cohort"), &root);
        cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
        cleanup.add(None, kueue("ClusterQueue"), &cq);
        cleanup.add(Some(&ns), kueue("LocalQueue"), &class);
        Ok(Rig {
            vendor,
            controller,
            exporters,
            root,
            class,
            cq,
        })
    }

    /// Serve `dev` on every device of `node`.
    fn set(&self, node: &str, dev: &dyn Fn(u32) -> Dev) {
        let (_, n, e) = self
            .exporters
            .iter()
            .find(|(x, _, _)| x == node)
            .expect("an exporter for the node");
        e.set(Answer::Metrics(self.vendor.body(node, *n, dev)));
    }

    fn set_all(&self, dev: &dyn Fn(u32) -> Dev) {
        for (node, _, _) in &self.exporters {
            self.set(node, dev);
        }
    }

    async fn status(&self, client: &Client) -> Result<(HealthCounts, Vec<ResolvedFlavor>)> {
        let s = Api::<AcceleratorClass>::all(client.clone())
            .get(&self.class)
            .await?
            .status
            .unwrap_or_default();
        Ok((s.devices, s.flavors))
    }

    /// The class's flavor of this vendor as the class status reports it.
    async fn flavor(&self, client: &Client) -> Result<Option<ResolvedFlavor>> {
        Ok(self.status(client).await?.1.into_iter().find(|f| {
            f.name.contains(self.vendor.flavor_part()) && f.resource_name == self.vendor.resource()
        }))
    }

    /// Total nominal quota of the flavor's resource on `flavor` across every
    /// ClusterQueue and Cohort of this controller's tree (the root Cohort and what
    /// hangs under it).
    async fn quota(&self, client: &Client, flavor: &str) -> Result<u64> {
        let ours = |name: &str| name == self.root || name.starts_with(&format!("{}-", self.root));
        let mut total = 0;
        for kind in ["ClusterQueue", "Cohort"] {
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
            for o in api.list(&Default::default()).await?.items {
                let v = serde_json::to_value(&o)?;
                let tree = if kind == "Cohort" {
                    o.name_any()
                } else {
                    v["spec"]["cohortName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string()
                };
                if !ours(&tree) {
                    continue;
                }
                for rg in v["spec"]["resourceGroups"].as_array().into_iter().flatten() {
                    for f in rg["flavors"].as_array().into_iter().flatten() {
                        if f["name"] != flavor {
                            continue;
                        }
                        for r in f["resources"].as_array().into_iter().flatten() {
                            if r["name"] == self.vendor.resource() {
                                total += match &r["nominalQuota"] {
                                    Value::String(q) => q.parse::<u64>().with_context(|| {
                                        format!("nominalQuota {q} is not a device count")
                                    })?,
                                    Value::Number(q) => q.as_u64().unwrap_or(0),
                                    _ => 0,
                                };
                            }
                        }
                    }
                }
            }
        }
        Ok(total)
    }

    /// Flavor names of the class's ClusterQueue, in its preference order.
    async fn cq_order(&self, client: &Client) -> Result<Vec<String>> {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue("ClusterQueue"));
        let Some(cq) = api.get_opt(&self.cq).await? else {
            return Ok(Vec::new());
        };
        let v = serde_json::to_value(cq)?;
        Ok(v["spec"]["resourceGroups"][0]["flavors"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|f| f["name"].as_str().map(str::to_string))
            .collect())
    }

    /// Every source answered and the quota matches the flavor's healthy capacity:
    /// the quiet starting point. Returns the flavor name and its quota.
    async fn baseline(&self, client: &Client) -> Result<(String, u64)> {
        let flavor = wait_for("sources answered, flavor reported", WAIT, || async {
            Ok(self
                .flavor(client)
                .await?
                .filter(|f| f.devices.unknown == 0 && f.devices.failed == 0))
        })
        .await?;
        let quota = wait_for("quota = healthy capacity", WAIT, || async {
            let f = self.flavor(client).await?;
            let q = self.quota(client, &flavor.name).await?;
            Ok(f.filter(|f| q > 0 && q == u64::from(f.healthy_capacity))
                .map(|_| q))
        })
        .await?;
        for (node, _, _) in &self.exporters {
            assert_eq!(
                node_state(client, node).await?,
                NodeState::default(),
                "{node} is not clean at the start"
            );
        }
        Ok((flavor.name, quota))
    }
}

#[derive(Clone, Debug, Default, PartialEq)]
struct NodeState {
    cordoned: bool,
    tainted: bool,
    /// kaccel's own annotations present (`kaccel.io/cordoned`, `kaccel.io/tainted`,
    /// `kaccel.io/repair-request`).
    annotations: Vec<String>,
}

impl NodeState {
    fn action(&self) -> &'static str {
        match (self.cordoned, self.tainted) {
            (true, true) => "cordoned+tainted",
            (true, false) => "cordoned",
            (false, true) => "tainted",
            (false, false) => "none",
        }
    }
}

async fn node_state(client: &Client, name: &str) -> Result<NodeState> {
    let n = Api::<Node>::all(client.clone()).get(name).await?;
    let spec = n.spec.clone().unwrap_or_default();
    let mut annotations: Vec<String> = n
        .annotations()
        .keys()
        .filter(|k| k.starts_with("kaccel.io/"))
        .cloned()
        .collect();
    annotations.sort();
    Ok(NodeState {
        cordoned: spec.unschedulable.unwrap_or(false),
        tainted: spec
            .taints
            .unwrap_or_default()
            .iter()
            .any(|t| t.key == "kaccel.io/unhealthy"),
        annotations,
    })
}

/// Put the vendor's example nodes back as `examples/nodes.yaml` has them: no
/// cordon, the example's own taints only, no kaccel annotations. Runs with no
/// controller alive (before start, after the rig is dropped).
async fn restore_nodes(client: &Client, vendor: Vendor) {
    let api: Api<Node> = Api::all(client.clone());
    let names: Vec<String> = vendor.fleet().into_iter().map(|(n, _)| n).collect();
    for example in example_nodes() {
        if !names.contains(&example.name_any()) {
            continue;
        }
        let spec = example.spec.clone().unwrap_or_default();
        let patch = json!({
            "metadata": {"annotations": {"kaccel.io/cordoned": null, "kaccel.io/tainted": null, "kaccel.io/repair-request": null}},
            "spec": {"unschedulable": spec.unschedulable, "taints": spec.taints}
        });
        if let Err(e) = api
            .patch(
                &example.name_any(),
                &PatchParams::default(),
                &Patch::Merge(patch),
            )
            .await
        {
            eprintln!("restoring node {}: {e}", example.name_any());
        }
    }
}

/// Runs one vendor case with its own controller, then cleans up whatever happened.
async fn run_case<F>(vendor: Vendor, example: &str, case: F)
where
    F: AsyncFnOnce(&Client, &Rig) -> Result<()>,
{
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let mut flavors = Cleanup::default();
    let result = async {
        let rig = Rig::start(&client, &mut cleanup, vendor, example).await?;
        let r = case(&client, &rig).await;
        if r.is_err() {
            eprintln!("--- kaccel log:\n{}", rig.controller.log_tail());
        }
        // The ResourceFlavors the controller wrote for the class go last (Kueue
        // keeps them while a ClusterQueue uses them).
        for f in rig.status(&client).await.map(|s| s.1).unwrap_or_default() {
            flavors.add(None, kueue("ResourceFlavor"), &f.name);
        }
        r
        // The rig (and its controller) is dropped here, before the nodes are restored.
    }
    .await;
    restore_nodes(&client, vendor).await;
    cleanup.run(&client).await;
    flavors.run(&client).await;
    result.unwrap();
}

/// Fault -> Failed, node cordoned with a repair request, quota down by the node's
/// devices; then healthy again -> after hold-down uncordoned, annotations gone,
/// quota back. Prints the MEASURE line.
async fn failed_cycle(
    client: &Client,
    rig: &Rig,
    label: &str,
    fault: &dyn Fn(u32) -> Dev,
) -> Result<()> {
    let node = rig.vendor.faulted_node();
    let (flavor, before) = rig.baseline(client).await?;
    let expected = before - allocatable(node, rig.vendor.resource());

    let injected = Instant::now();
    rig.set(node, fault);
    let after = wait_for("Failed, cordoned, quota down", WAIT, || async {
        let state = node_state(client, node).await?;
        let (devices, _) = rig.status(client).await?;
        let q = rig.quota(client, &flavor).await?;
        Ok((state.cordoned && devices.failed >= 1 && q == expected).then_some(q))
    })
    .await?;
    let reaction = injected.elapsed();
    let (devices, _) = rig.status(client).await?;
    let f = rig.flavor(client).await?.context("flavor in status")?;
    assert!(f.devices.failed >= 1, "{f:?}");
    let state = node_state(client, node).await?;
    assert!(
        !state.tainted,
        "a single failed card must not taint: {state:?}"
    );
    let n = Api::<Node>::all(client.clone()).get(node).await?;
    let ann = n.annotations();
    assert_eq!(
        ann.get("kaccel.io/cordoned").map(String::as_str),
        Some("true")
    );
    let repair = ann
        .get("kaccel.io/repair-request")
        .context("no repair request")?;
    assert!(repair.contains("failed"), "{repair}");
    // No other node of the fleet was touched.
    for (other, _, _) in &rig.exporters {
        if other != node {
            assert_eq!(
                node_state(client, other).await?,
                NodeState::default(),
                "{other}"
            );
        }
    }

    let healed = Instant::now();
    rig.set(node, &|_| Dev::default());
    wait_for("uncordoned, quota back", WAIT, || async {
        let state = node_state(client, node).await?;
        let (devices, _) = rig.status(client).await?;
        let q = rig.quota(client, &flavor).await?;
        Ok((state == NodeState::default() && devices.failed == 0 && q == before).then_some(()))
    })
    .await?;
    let recovery = healed.elapsed();
    eprintln!(
        "MEASURE {label}: status=Failed (class devices {devices:?}) quota {before}->{after} node={} reaction {} ms recovery {} ms",
        state.action(),
        reaction.as_millis(),
        recovery.as_millis()
    );
    Ok(())
}

#[tokio::test]
async fn nvidia_critical_xid_fails_cordons_and_recovers() {
    let _serial = support::serial().await;
    run_case(Vendor::Nvidia, "large-training", async |client, rig| {
        failed_cycle(client, rig, "nvidia-xid79", &|i| Dev {
            xid: if i == 2 { 79 } else { 0 },
            ..Dev::default()
        })
        .await
    })
    .await;
}

#[tokio::test]
async fn nvidia_hot_cards_demote_the_flavor_without_node_action() {
    let _serial = support::serial().await;
    run_case(Vendor::Nvidia, "large-training", async |client, rig| {
        let (h100, before) = rig.baseline(client).await?;
        let order = wait_for("H100 first in the queue", WAIT, || async {
            let o = rig.cq_order(client).await?;
            Ok((o.first() == Some(&h100) && o.len() > 1).then_some(o))
        })
        .await?;
        eprintln!("queue order before: {order:?}");

        let injected = Instant::now();
        rig.set_all(&|_| Dev {
            temp: 88.0,
            ..Dev::default()
        });
        let order = wait_for("H100 demoted", WAIT, || async {
            let f = rig.flavor(client).await?;
            let o = rig.cq_order(client).await?;
            let moved = o.first().is_some_and(|first| *first != h100) && o.contains(&h100);
            Ok((f.is_some_and(|f| f.demoted) && moved).then_some(o))
        })
        .await?;
        let reaction = injected.elapsed();
        eprintln!("queue order demoted: {order:?}");
        let (devices, flavors) = rig.status(client).await?;
        assert!(devices.warning >= 1, "{devices:?}");
        assert_eq!(devices.failed, 0, "{devices:?}");
        assert_eq!(
            flavors.last().map(|f| &f.name),
            Some(&h100),
            "class status lists the demoted flavor last: {flavors:?}"
        );
        // Warning is no reason to take anything out: give the loop a few rounds.
        tokio::time::sleep(Duration::from_secs(3)).await;
        let after = rig.quota(client, &h100).await?;
        assert_eq!(after, before, "Warning must not shrink quota");
        for (node, _, _) in &rig.exporters {
            assert_eq!(node_state(client, node).await?, NodeState::default(), "{node}");
        }

        let healed = Instant::now();
        rig.set_all(&|_| Dev::default());
        wait_for("demotion lifted", WAIT, || async {
            let f = rig.flavor(client).await?;
            let o = rig.cq_order(client).await?;
            Ok((f.is_some_and(|f| !f.demoted) && o.first() == Some(&h100)).then_some(()))
        })
        .await?;
        let recovery = healed.elapsed();
        eprintln!(
            "MEASURE nvidia-hot-88C-all-H100: status=Warning (class devices {devices:?}, H100 demoted, queue first {}) quota {before}->{after} node=none reaction {} ms recovery {} ms",
            order[0],
            reaction.as_millis(),
            recovery.as_millis()
        );
        Ok(())
    })
    .await;
}

#[tokio::test]
async fn amd_uncorrectable_ecc_fails_cordons_and_recovers() {
    let _serial = support::serial().await;
    run_case(Vendor::Amd, "large-training", async |client, rig| {
        failed_cycle(client, rig, "amd-ecc-uncorrect", &|i| Dev {
            ecc: if i == 5 { 2 } else { 0 },
            ..Dev::default()
        })
        .await
    })
    .await;
}

#[tokio::test]
async fn ascend_fault_code_fails_cordons_and_recovers() {
    let _serial = support::serial().await;
    run_case(Vendor::Ascend, "standard-training", async |client, rig| {
        // 0x80E01801: health status 0 with an active fault code.
        failed_cycle(client, rig, "ascend-health0-0x80E01801", &|i| {
            if i == 3 {
                Dev {
                    healthy: false,
                    code: 0x80E0_1801,
                    ..Dev::default()
                }
            } else {
                Dev::default()
            }
        })
        .await
    })
    .await;
}

#[tokio::test]
async fn gaudi_hot_cards_degrade_then_taint_and_recover() {
    let _serial = support::serial().await;
    run_case(Vendor::Gaudi, "standard-training", async |client, rig| {
        let node = rig.vendor.faulted_node();
        let (flavor, before) = rig.baseline(client).await?;
        let hot = Dev {
            temp: 97.0,
            ..Dev::default()
        };

        // One hot card: Degraded, one device less in quota, the node stays in.
        let injected = Instant::now();
        rig.set(node, &|i| if i == 0 { hot } else { Dev::default() });
        let one = wait_for("one card Degraded, quota - 1", WAIT, || async {
            let (d, _) = rig.status(client).await?;
            let q = rig.quota(client, &flavor).await?;
            Ok((d.degraded >= 1 && q == before - 1).then_some(q))
        })
        .await?;
        let reaction = injected.elapsed();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let state = node_state(client, node).await?;
        assert_eq!(state, NodeState::default(), "one Degraded card must not take the node out");
        let (devices, _) = rig.status(client).await?;
        let healed = Instant::now();
        rig.set(node, &|_| Dev::default());
        wait_for("quota back", WAIT, || async {
            let (d, _) = rig.status(client).await?;
            Ok((d.degraded == 0 && rig.quota(client, &flavor).await? == before).then_some(()))
        })
        .await?;
        eprintln!(
            "MEASURE gaudi-hot-97C-one-card: status=Degraded (class devices {devices:?}) quota {before}->{one} node=none reaction {} ms recovery {} ms",
            reaction.as_millis(),
            healed.elapsed().as_millis()
        );

        // Every card hot: the node is tainted NoSchedule (not cordoned), its devices
        // leave quota.
        let expected = before - allocatable(node, rig.vendor.resource());
        let injected = Instant::now();
        rig.set(node, &|_| hot);
        let all = wait_for("tainted, quota down", WAIT, || async {
            let state = node_state(client, node).await?;
            let q = rig.quota(client, &flavor).await?;
            Ok((state.tainted && q == expected).then_some(q))
        })
        .await?;
        let reaction = injected.elapsed();
        let state = node_state(client, node).await?;
        if state.cordoned {
            bail!("Degraded cards must taint, not cordon: {state:?}");
        }
        let n = Api::<Node>::all(client.clone()).get(node).await?;
        let taint = n
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default()
            .into_iter()
            .find(|t| t.key == "kaccel.io/unhealthy")
            .context("taint")?;
        assert_eq!(taint.effect, "NoSchedule");
        assert_eq!(
            n.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("kaccel.io/tainted"))
                .map(String::as_str),
            Some("true")
        );
        let (devices, _) = rig.status(client).await?;
        assert!(devices.degraded >= 8, "{devices:?}");

        let healed = Instant::now();
        rig.set(node, &|_| Dev::default());
        wait_for("untainted, quota back", WAIT, || async {
            let state = node_state(client, node).await?;
            let q = rig.quota(client, &flavor).await?;
            Ok((state == NodeState::default() && q == before).then_some(()))
        })
        .await?;
        // The example's own vendor taint is still there: kaccel removed only its own.
        let taints = Api::<Node>::all(client.clone())
            .get(node)
            .await?
            .spec
            .and_then(|s| s.taints)
            .unwrap_or_default();
        assert!(taints.iter().any(|t| t.key == "habana.ai/gaudi"), "{taints:?}");
        eprintln!(
            "MEASURE gaudi-hot-97C-all-cards: status=Degraded (class devices {devices:?}) quota {before}->{all} node={} reaction {} ms recovery {} ms",
            state.action(),
            reaction.as_millis(),
            healed.elapsed().as_millis()
        );
        Ok(())
    })
    .await;
}
