//! Health read through a Prometheus query API: a fake Prometheus on loopback answers
//! `GET /api/v1/query` with dcgm-exporter series for the example H100 nodes, in the
//! JSON shape Prometheus uses; `kaccel run` with a `prometheus:` source drives Kueue
//! quotas and Node cordons on the real API server. Stale samples (old timestamps)
//! are not trusted: the devices become Unknown, and a fault inside them triggers
//! nothing (invariant 6).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kaccel::api::{AcceleratorClass, HealthCounts};
use kube::api::{Api, DynamicObject};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::controller::{
    Controller, class_from_example, class_with_budget, ensure_example_nodes, free_port, wait_for,
};
use crate::support::{self, Cleanup, kueue};

/// What the fake Prometheus answers.
#[derive(Clone, Debug)]
struct Answer {
    /// (node, gpu) pairs with a double-bit ECC error.
    ecc: Vec<(String, u32)>,
    /// Age of every sample, in seconds.
    age_seconds: f64,
    /// Answer as an instant vector instead of a range-selector matrix.
    vector: bool,
    /// Answer `{"status":"error"}` with HTTP 422.
    error: bool,
}

impl Answer {
    fn healthy() -> Answer {
        Answer {
            ecc: vec![],
            age_seconds: 0.5,
            vector: false,
            error: false,
        }
    }
}

struct FakePrometheus {
    port: u16,
    answer: Arc<Mutex<Answer>>,
    /// The decoded `query` parameter of the last request.
    last_query: Arc<Mutex<Option<String>>>,
}

impl FakePrometheus {
    async fn start(nodes: Vec<(String, u32)>) -> FakePrometheus {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let answer = Arc::new(Mutex::new(Answer::healthy()));
        let last_query = Arc::new(Mutex::new(None));
        let (shared, queries) = (answer.clone(), last_query.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut conn, _)) = listener.accept().await else {
                    return;
                };
                let current = shared.lock().unwrap().clone();
                let nodes = nodes.clone();
                let queries = queries.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 16384];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&buf[..n]).to_string();
                    let target = request.split(' ').nth(1).unwrap_or("").to_string();
                    let (status, body) = match target.strip_prefix("/api/v1/query?query=") {
                        None => (404, "404 page not found\n".to_string()),
                        Some(q) => {
                            *queries.lock().unwrap() = Some(percent_decode(q));
                            if current.error {
                                (
                                    422,
                                    json!({"status": "error", "errorType": "execution", "error": "query processing would load too many samples into memory"}).to_string(),
                                )
                            } else {
                                (200, series(&nodes, &current).to_string())
                            }
                        }
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = conn.write_all(head.as_bytes()).await;
                    let _ = conn.write_all(body.as_bytes()).await;
                });
            }
        });
        FakePrometheus {
            port,
            answer,
            last_query,
        }
    }

    fn set(&self, f: impl FnOnce(&mut Answer)) {
        f(&mut self.answer.lock().unwrap());
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(b) = s
                .get(i + 1..i + 3)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).to_string()
}

/// The dcgm-exporter series Prometheus holds for the nodes, as a query result.
fn series(nodes: &[(String, u32)], a: &Answer) -> Value {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let ts = now - a.age_seconds;
    let mut result = Vec::new();
    for (node, gpus) in nodes {
        for gpu in 0..*gpus {
            let ecc = a.ecc.iter().any(|(n, g)| n == node && *g == gpu);
            for (name, value) in [
                ("DCGM_FI_DEV_GPU_TEMP", "41"),
                ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", if ecc { "1" } else { "0" }),
                ("DCGM_FI_DEV_XID_ERRORS", "0"),
            ] {
                let metric = json!({
                    "__name__": name, "gpu": gpu.to_string(), "UUID": format!("GPU-{node}-{gpu:04}"),
                    "pci_bus_id": format!("00000000:{:02X}:00.0", 0x18 + gpu), "device": format!("nvidia{gpu}"),
                    "modelName": "NVIDIA H100 80GB HBM3", "Hostname": node, "DCGM_FI_DRIVER_VERSION": "550.54.15",
                    "instance": format!("{node}:9400"), "job": "dcgm-exporter",
                });
                result.push(if a.vector {
                    json!({"metric": metric, "value": [ts, value]})
                } else {
                    json!({"metric": metric, "values": [[ts - 1.0, value], [ts, value]]})
                });
            }
        }
    }
    let kind = if a.vector { "vector" } else { "matrix" };
    json!({"status": "success", "data": {"resultType": kind, "result": result}})
}

fn h100_nodes() -> Vec<(String, u32)> {
    kaccel::testkit::examples()
        .nodes
        .iter()
        .filter_map(|n| {
            let name = n.name_any();
            let cap = n
                .status
                .as_ref()?
                .capacity
                .as_ref()?
                .get("nvidia.com/gpu")?
                .0
                .parse()
                .ok()?;
            name.starts_with("gpu-h100").then_some((name, cap))
        })
        .collect()
}

async fn node_state(nodes: &Api<Node>, name: &str) -> Result<(bool, bool)> {
    let n = nodes.get(name).await?;
    let spec = n.spec.unwrap_or_default();
    let tainted = spec
        .taints
        .unwrap_or_default()
        .iter()
        .any(|t| t.key == "kaccel.io/unhealthy");
    Ok((spec.unschedulable.unwrap_or(false), tainted))
}

/// Total nominal nvidia.com/gpu quota on H100 flavors across ClusterQueues and
/// Cohorts.
async fn h100_quota(client: &Client) -> Result<Option<u64>> {
    let mut total = 0u64;
    let mut seen = false;
    for kind in ["ClusterQueue", "Cohort"] {
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &kueue(kind));
        for o in api.list(&Default::default()).await?.items {
            let v = serde_json::to_value(o)?;
            for rg in v["spec"]["resourceGroups"].as_array().into_iter().flatten() {
                for f in rg["flavors"].as_array().into_iter().flatten() {
                    if !f["name"].as_str().is_some_and(|n| n.contains("h100")) {
                        continue;
                    }
                    for r in f["resources"].as_array().into_iter().flatten() {
                        if r["name"] == "nvidia.com/gpu" {
                            seen = true;
                            total += r["nominalQuota"]
                                .as_str()
                                .and_then(|q| q.parse::<u64>().ok())
                                .unwrap_or(0);
                        }
                    }
                }
            }
        }
    }
    Ok(seen.then_some(total))
}

async fn class_devices(classes: &Api<AcceleratorClass>, name: &str) -> Result<HealthCounts> {
    Ok(classes
        .get(name)
        .await?
        .status
        .map(|s| s.devices)
        .unwrap_or_default())
}

async fn uncordon_all(client: &Client) {
    crate::health::uncordon_all(client).await;
}

#[tokio::test]
async fn prometheus_source_drives_cordon_and_quota_and_stale_is_unknown() {
    let _serial = crate::support::serial().await;
    let client = support::client().await;
    let mut cleanup = Cleanup::default();
    let result = prometheus_source(&client, &mut cleanup).await;
    uncordon_all(&client).await;
    cleanup.run(&client).await;
    result.unwrap();
}

async fn prometheus_source(client: &Client, cleanup: &mut Cleanup) -> Result<()> {
    ensure_example_nodes(client).await?;
    let fleet = h100_nodes();
    anyhow::ensure!(fleet.len() >= 2, "the example fleet has H100 nodes");
    let id = support::unique("p");
    let class = format!("h100-{id}");
    let mut c = class_from_example("large-training", &class);
    c.spec.selector.models = vec!["*H100*".into()];
    let (ns, team) = class_with_budget(client, cleanup, &id, &c, 8).await?;

    let prometheus = FakePrometheus::start(fleet.clone()).await;
    let root = format!("root-{id}");
    let source = format!("prom-{id}");
    let config = format!(
        "rootCohort: {root}\ndebounceMs: 50\nmaxDelayMs: 300\nwatchResourceSlices: false\nleaderElection:\n  enabled: false\n\
         health:\n  policy:\n    holdDownSeconds: 2\n  sources:\n\
         \x20   - name: {source}\n      kind: dcgm-exporter\n\
         \x20     prometheus: {{url: \"http://127.0.0.1:{}\", selector: '{{job=\"dcgm-exporter\"}}'}}\n\
         \x20     intervalSeconds: 1\n      staleAfterSeconds: 3\n      timeoutSeconds: 1\n",
        prometheus.port
    );
    let controller = Controller::start(&format!("prom-{id}"), free_port(), &config);
    cleanup.add(None, kueue("Cohort"), &root);
    cleanup.add(None, kueue("Cohort"), &format!("{root}-{team}"));
    cleanup.add(None, kueue("ClusterQueue"), &format!("{team}-{class}"));
    cleanup.add(Some(&ns), kueue("LocalQueue"), &class);

    let r = phases(client, &prometheus, &controller, &fleet, &class, &source).await;
    if r.is_err() {
        eprintln!("--- kaccel log:\n{}", controller.log_tail());
    }
    r
}

async fn phases(
    client: &Client,
    prometheus: &FakePrometheus,
    controller: &Controller,
    fleet: &[(String, u32)],
    class: &str,
    source: &str,
) -> Result<()> {
    let classes: Api<AcceleratorClass> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client.clone());
    let total: u32 = fleet.iter().map(|(_, c)| c).sum();
    let wait = Duration::from_secs(30);
    let metric =
        |state: &str, value: u8| format!("kaccel_health_source_up{{source=\"{state}\"}} {value}");

    // 1. Every node's series fresh: devices healthy (one example node has a GPU its
    //    plugin withdrew: Degraded), one state per node.
    let healthy = wait_for("healthy devices from Prometheus", wait, || async {
        let d = class_devices(&classes, class).await?;
        Ok((d.healthy + d.degraded == total && d.unknown == 0).then_some(d))
    })
    .await?;
    let quota_before = wait_for("H100 quota", wait, || async { h100_quota(client).await }).await?;
    let query = prometheus
        .last_query
        .lock()
        .unwrap()
        .clone()
        .unwrap_or_default();
    eprintln!("healthy {healthy:?}, quota {quota_before}, query {query}");
    assert!(
        query.starts_with("{__name__=~\"DCGM_FI_DEV_GPU_TEMP|")
            && query.ends_with(",job=\"dcgm-exporter\"}[3s]"),
        "one query, the mapping's metrics under the selector, over the staleness window: {query}"
    );
    let m = controller.metrics().unwrap_or_default();
    for (node, _) in fleet {
        assert!(
            m.contains(&metric(&format!("{source}/{node}"), 1)),
            "per-node state for {node}:\n{m}"
        );
    }

    // 2. An uncorrectable ECC error on one GPU of node 0 in the query answer:
    //    Failed, node cordoned, quota reduced.
    let n0 = fleet[0].0.clone();
    prometheus.set(|a| a.ecc = vec![(n0.clone(), 3)]);
    wait_for("node 0 cordoned", wait, || async {
        Ok(node_state(&nodes, &n0).await?.0.then_some(()))
    })
    .await?;
    let quota_fault = wait_for("quota reduced", wait, || async {
        Ok(h100_quota(client).await?.filter(|q| *q < quota_before))
    })
    .await?;
    // The class's status is written after the quota and the cordon, in the same
    // re-plan: wait for it rather than read it the moment the quota moved.
    wait_for("the class counts the failed GPU", wait, || async {
        Ok((class_devices(&classes, class).await?.failed >= 1).then_some(()))
    })
    .await?;
    eprintln!(
        "ECC fault via Prometheus: node {n0} cordoned, quota {quota_before} -> {quota_fault}"
    );

    // 3. Fault cleared: after the hold-down kaccel uncordons what it cordoned.
    prometheus.set(|a| a.ecc.clear());
    wait_for("node 0 uncordoned, quota back", wait, || async {
        let cordoned = node_state(&nodes, &n0).await?.0;
        let quota = h100_quota(client).await?;
        Ok((!cordoned && quota == Some(quota_before)).then_some(()))
    })
    .await?;

    // 4. Prometheus keeps answering, but with samples a minute old (the exporters
    //    stopped) that even carry a fault: nothing is trusted. Every device Unknown,
    //    no cordon, no taint, the source and every node state reported down.
    let n1 = fleet[1].0.clone();
    prometheus.set(|a| {
        a.age_seconds = 60.0;
        a.vector = true;
        a.ecc = vec![(n1.clone(), 0)];
    });
    let d = wait_for("devices Unknown on stale samples", wait, || async {
        let d = class_devices(&classes, class).await?;
        Ok((d.healthy == 0 && d.failed == 0 && d.unknown > 0).then_some(d))
    })
    .await?;
    eprintln!("stale: {d:?}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    for (node, _) in fleet {
        assert_eq!(
            node_state(&nodes, node).await?,
            (false, false),
            "stale samples led to a node action on {node}"
        );
    }
    let m = controller.metrics().unwrap_or_default();
    assert!(
        m.contains(&metric(source, 0)),
        "source not reported down:\n{m}"
    );
    for (node, _) in fleet {
        assert!(
            m.contains(&metric(&format!("{source}/{node}"), 0)),
            "{node} not reported down"
        );
    }
    assert_eq!(
        h100_quota(client).await?,
        Some(quota_before),
        "Unknown counts as capacity: quota unchanged"
    );

    // 5. A Prometheus error answer: still Unknown, still no action.
    prometheus.set(|a| a.error = true);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = class_devices(&classes, class).await?;
    assert!(d.healthy == 0 && d.failed == 0 && d.unknown > 0, "{d:?}");
    for (node, _) in fleet {
        assert_eq!(node_state(&nodes, node).await?, (false, false));
    }
    assert!(
        controller.log_tail().contains("too many samples"),
        "Prometheus' own error message is logged"
    );

    // 6. Fresh again: healthy.
    prometheus.set(|a| *a = Answer::healthy());
    wait_for("healthy again", wait, || async {
        let d = class_devices(&classes, class).await?;
        Ok((d.healthy + d.degraded == total && d.unknown == 0).then_some(()))
    })
    .await?;
    Ok(())
}
