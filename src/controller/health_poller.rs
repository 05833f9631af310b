//! The health loop's I/O: one polling task per health source feeding the shared
//! [`Tracker`], and node taints/cordons applied with optimistic concurrency.
//!
//! A source reads one exporter kind from one of three places:
//! - `url`: one exporter's /metrics; one tracker state named after the source.
//! - `prometheus`: one query per poll against a Prometheus query API
//!   (src/health/promql.rs); one state per node seen, `<source>/<node>`, so a node
//!   whose series went stale is Unknown on its own while the others stay trusted.
//! - `pods`: the exporter pods matching a label selector, listed every poll and
//!   scraped one by one; one state per node, `<source>/<node>`, dropped when the
//!   node's pod goes away.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use super::config::{Health, HealthSource, PodsSource, PrometheusSource, SourceEndpoint};
use super::metrics::{Metrics, SourceLabel};
use crate::health::exporters::{DeviceReading, ExporterKind, readings};
use crate::health::policy::{Policy, SourceState, Tracker};
use crate::health::scrape::Scraper;
use crate::health::{prom, promql};
use crate::plan::nodes::{
    CORDONED_ANNOTATION, NodeAction, REPAIR_ANNOTATION, TAINTED_ANNOTATION, UNHEALTHY_TAINT,
};

pub type SharedTracker = Arc<Mutex<Tracker>>;

pub fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

fn now_millis() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_millisecond()
}

/// A tracker with one state per configured `url` source (`prometheus` and `pods`
/// sources add one state per node as they find them).
pub fn tracker(config: &Health) -> SharedTracker {
    let mut t = Tracker::default();
    for s in &config.sources {
        if matches!(s.endpoint(), Some(SourceEndpoint::Url(_))) {
            t.sources.insert(
                s.name.clone(),
                SourceState {
                    name: s.name.clone(),
                    nodes: s.node.iter().cloned().collect(),
                    vendor: Some(s.kind.vendor()),
                    stale_after_seconds: s.stale_after_seconds,
                    ..Default::default()
                },
            );
        }
    }
    Arc::new(Mutex::new(t))
}

/// What the planner acts on, so a poll that changes nothing wakes nobody.
fn fingerprint(t: &Tracker, now: i64) -> Vec<String> {
    let mut f: Vec<String> = t
        .devices
        .values()
        .map(|d| format!("{}/{}:{:?}", d.node, d.device, d.status))
        .collect();
    f.extend(
        t.sources
            .values()
            .map(|s| format!("{}:{}:{}", s.name, s.usable(now), s.nodes.join(","))),
    );
    f
}

/// Name of the tracker state for one node of a `prometheus` or `pods` source.
pub fn node_state_name(source: &str, node: &str) -> String {
    format!("{source}/{node}")
}

/// Poll every source until the process ends; wake the reconcile loop (`wake`) when
/// what the planner sees changed.
pub fn spawn_pollers(
    client: &Client,
    config: &Health,
    tracker: SharedTracker,
    metrics: Metrics,
    wake: UnboundedSender<()>,
) {
    let scraper = Scraper::default();
    for source in config.sources.clone() {
        let poller = Poller {
            scraper: scraper.clone(),
            tracker: tracker.clone(),
            metrics: metrics.clone(),
            wake: wake.clone(),
            policy: config.policy.clone(),
            source,
        };
        let client = client.clone();
        tokio::spawn(async move {
            let mut tick =
                tokio::time::interval(Duration::from_secs(poller.source.interval_seconds));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Nodes a prometheus / pods source has states for.
            let mut known = BTreeSet::new();
            loop {
                tick.tick().await;
                let awake = match poller.source.endpoint() {
                    Some(SourceEndpoint::Url(url)) => poller.poll_url(url).await,
                    Some(SourceEndpoint::Prometheus(p)) => {
                        poller.poll_prometheus(p, &mut known).await
                    }
                    Some(SourceEndpoint::Pods(p)) => poller.poll_pods(&client, p, &mut known).await,
                    None => {
                        tracing::error!(source = %poller.source.name, "health source has no single endpoint (url, prometheus or pods): not polled");
                        return;
                    }
                };
                if !awake {
                    return;
                }
            }
        });
    }
}

struct Poller {
    scraper: Scraper,
    tracker: SharedTracker,
    metrics: Metrics,
    wake: UnboundedSender<()>,
    policy: Policy,
    source: HealthSource,
}

impl Poller {
    fn timeout(&self) -> Duration {
        Duration::from_secs(self.source.timeout_seconds)
    }

    /// Change the tracker; wake the reconcile loop when the planner's view changed.
    /// False once the reconcile loop is gone.
    fn update(&self, now: i64, change: impl FnOnce(&mut Tracker)) -> bool {
        let changed = {
            let mut t = self.tracker.lock().expect("tracker lock");
            let before = fingerprint(&t, now);
            change(&mut t);
            fingerprint(&t, now) != before
        };
        !changed || self.wake.send(()).is_ok()
    }

    fn report(&self, state: &str, result: Result<(), &str>, now: i64) {
        let label = SourceLabel {
            source: state.to_string(),
        };
        match result {
            Ok(()) => {
                self.metrics.source_up.get_or_create(&label).set(1);
                self.metrics
                    .source_last_success
                    .get_or_create(&label)
                    .set(now);
            }
            Err(e) => {
                tracing::warn!(source = %state, error = %e, "health source unusable: its devices are Unknown (those last seen Failed or Degraded stay out)");
                self.metrics.source_up.get_or_create(&label).set(0);
                self.metrics.source_errors.get_or_create(&label).inc();
            }
        }
    }

    fn forget_metrics(&self, state: &str) {
        let label = SourceLabel {
            source: state.to_string(),
        };
        self.metrics.source_up.remove(&label);
        self.metrics.source_errors.remove(&label);
        self.metrics.source_last_success.remove(&label);
    }

    /// The state for one node of this source, created on first sight.
    fn node_state<'t>(&self, t: &'t mut Tracker, node: &str) -> &'t mut SourceState {
        let name = node_state_name(&self.source.name, node);
        t.sources
            .entry(name.clone())
            .or_insert_with(|| SourceState {
                name,
                nodes: vec![node.to_string()],
                vendor: Some(self.source.kind.vendor()),
                stale_after_seconds: self.source.stale_after_seconds,
                ..Default::default()
            })
    }

    async fn poll_url(&self, url: &str) -> bool {
        let source = &self.source;
        let result = scrape_exporter(
            &self.scraper,
            source.kind,
            url,
            source.node.as_deref(),
            self.timeout(),
        )
        .await;
        let now = now_seconds();
        self.report(
            &source.name,
            result.as_ref().map(|_| ()).map_err(String::as_str),
            now,
        );
        self.update(now, |t| match result {
            Ok(found) => {
                if let Some(state) = t.sources.get_mut(&source.name)
                    && source.node.is_none()
                {
                    // No configured node: cover the nodes the exporter names.
                    let mut nodes: Vec<String> =
                        found.iter().filter_map(|r| r.node.clone()).collect();
                    nodes.sort();
                    nodes.dedup();
                    state.nodes = nodes;
                }
                t.observe(&source.name, found, now, &self.policy);
            }
            Err(e) => t.fail(&source.name, e, now),
        })
    }

    async fn poll_prometheus(&self, p: &PrometheusSource, known: &mut BTreeSet<String>) -> bool {
        let source = &self.source;
        let Some(node_label) = p.node_label(source.kind) else {
            // Config validation refuses this; never guess a node.
            tracing::error!(source = %source.name, "prometheus source without nodeLabel: not polled");
            return false;
        };
        let result = query_prometheus(&self.scraper, source, p, self.timeout()).await;
        let now_ms = now_millis();
        let now = now_ms.div_euclid(1000);
        // A usable answer: nodes with fresh readings, nodes gone stale.
        let outcome = result.and_then(|samples| {
            let split = promql::by_node(
                source.kind,
                samples,
                node_label,
                now_ms,
                source.stale_after_seconds,
            );
            if !split.fresh.is_empty() {
                return Ok(split);
            }
            Err(if let Some(age) = split.stale.values().min() {
                known.extend(split.stale.keys().cloned());
                format!(
                    "stale: the newest sample is {age}s old (staleAfterSeconds {})",
                    source.stale_after_seconds
                )
            } else if split.without_node > 0 {
                format!("no series carries the node label {node_label:?} (set nodeLabel)")
            } else if split.stale_samples > 0 {
                "stale: every sample is older than staleAfterSeconds".to_string()
            } else {
                "no device series in the answer (empty result)".to_string()
            })
        });
        self.report(
            &source.name,
            outcome.as_ref().map(|_| ()).map_err(String::as_str),
            now,
        );
        self.update(now, |t| match outcome {
            Err(e) => {
                for node in known.iter() {
                    self.node_state(t, node);
                    let state = node_state_name(&source.name, node);
                    t.fail(&state, e.clone(), now);
                    self.report(&state, Err(&e), now);
                }
            }
            Ok(split) => {
                if split.without_node > 0 {
                    tracing::debug!(source = %source.name, series = split.without_node, label = %node_label, "series without the node label ignored");
                }
                let window = source.stale_after_seconds;
                let mut seen = BTreeSet::new();
                for (node, found) in split.fresh {
                    self.node_state(t, &node);
                    let state = node_state_name(&source.name, &node);
                    t.observe(&state, found, now, &self.policy);
                    self.report(&state, Ok(()), now);
                    seen.insert(node);
                }
                for (node, age) in split.stale {
                    self.node_state(t, &node);
                    let state = node_state_name(&source.name, &node);
                    let e = format!(
                        "stale: the newest sample is {age}s old (staleAfterSeconds {window})"
                    );
                    t.fail(&state, e.clone(), now);
                    self.report(&state, Err(&e), now);
                    seen.insert(node);
                }
                for node in known.iter().filter(|n| !seen.contains(*n)) {
                    let state = node_state_name(&source.name, node);
                    let e = format!("no samples for this node in the last {window}s");
                    t.fail(&state, e.clone(), now);
                    self.report(&state, Err(&e), now);
                }
                known.extend(seen);
            }
        })
    }

    async fn poll_pods(
        &self,
        client: &Client,
        p: &PodsSource,
        known: &mut BTreeSet<String>,
    ) -> bool {
        let source = &self.source;
        let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
        let listed = api
            .list(&ListParams::default().labels(&p.selector))
            .await
            .map_err(|e| format!("listing exporter pods failed: {e}"));
        let endpoints = match listed {
            Ok(list) => pod_endpoints(&list.items, p.port, &p.path),
            Err(e) => {
                let now = now_seconds();
                self.report(&source.name, Err(&e), now);
                return self.update(now, |t| {
                    for node in known.iter() {
                        let state = node_state_name(&source.name, node);
                        t.fail(&state, e.clone(), now);
                        self.report(&state, Err(&e), now);
                    }
                });
            }
        };
        let scrapes = endpoints.iter().map(|ep| async {
            match &ep.target {
                Ok(url) => {
                    scrape_exporter(
                        &self.scraper,
                        source.kind,
                        url,
                        Some(&ep.node),
                        self.timeout(),
                    )
                    .await
                }
                Err(why) => Err(why.clone()),
            }
        });
        let results = futures::future::join_all(scrapes).await;
        let now = now_seconds();
        let listing = if endpoints.is_empty() {
            Err(format!(
                "no scheduled pods match {:?} in namespace {}",
                p.selector, p.namespace
            ))
        } else {
            Ok(())
        };
        self.report(
            &source.name,
            listing.as_ref().map_err(String::as_str).copied(),
            now,
        );
        let current: BTreeSet<String> = endpoints.iter().map(|e| e.node.clone()).collect();
        let awake = self.update(now, |t| {
            // A node whose exporter pod went away: its state and devices go too,
            // except devices it last reported Failed or Degraded (they stay out).
            for node in known.iter().filter(|n| !current.contains(*n)) {
                let state = node_state_name(&source.name, node);
                t.remove_source(&state, now);
                self.forget_metrics(&state);
                tracing::info!(source = %state, "exporter pod gone: dropped its health state");
            }
            for (ep, result) in endpoints.iter().zip(results) {
                self.node_state(t, &ep.node);
                let state = node_state_name(&source.name, &ep.node);
                self.report(
                    &state,
                    result.as_ref().map(|_| ()).map_err(String::as_str),
                    now,
                );
                match result {
                    Ok(found) => t.observe(&state, found, now, &self.policy),
                    Err(e) => t.fail(&state, format!("{}: {e}", ep.pod), now),
                }
            }
        });
        *known = current;
        awake
    }
}

/// Scrape one exporter's /metrics into device readings; a configured `node` wins
/// over the exporter's hostname label.
async fn scrape_exporter(
    scraper: &Scraper,
    kind: ExporterKind,
    url: &str,
    node: Option<&str>,
    timeout: Duration,
) -> Result<Vec<DeviceReading>, String> {
    let body = scraper
        .fetch(url, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let samples = prom::parse(&body).map_err(|e| format!("unparseable: {e}"))?;
    let mut found = readings(kind, &samples, node);
    if let Some(node) = node {
        for r in &mut found {
            r.node = Some(node.to_string());
        }
    }
    if found.is_empty() {
        return Err("no device metrics in the answer".into());
    }
    Ok(found)
}

/// One query against the Prometheus API: the samples, or why the answer is unusable
/// (unreachable, HTTP error with Prometheus' own message, not a query result).
async fn query_prometheus(
    scraper: &Scraper,
    source: &HealthSource,
    p: &PrometheusSource,
    timeout: Duration,
) -> Result<Vec<prom::Sample>, String> {
    let q = promql::query(source.kind, &p.selector, source.stale_after_seconds)?;
    let url = promql::query_url(&p.url, &q);
    let (status, body) = scraper
        .get(&url, timeout)
        .await
        .map_err(|e| e.to_string())?;
    let parsed = promql::parse(&body);
    match (status, parsed) {
        (200, Ok(samples)) => Ok(samples),
        (200, Err(e)) => Err(e.to_string()),
        (status, Err(promql::QueryError::Prometheus(e))) => Err(format!("HTTP {status}: {e}")),
        (status, _) => Err(format!("answered HTTP {status}")),
    }
}

/// One exporter endpoint found from pods: the node it reports, the pod, and the URL
/// to scrape, or why there is none (the pod is not running).
#[derive(Clone, Debug, PartialEq)]
pub struct PodEndpoint {
    pub node: String,
    pub pod: String,
    pub target: Result<String, String>,
}

/// Which pod to scrape on each node. Pods not yet scheduled (no `spec.nodeName`)
/// are skipped: they report no node. Per node, prefer a Running pod with an IP,
/// then one not being deleted, then the newest (a DaemonSet rollout briefly has
/// two). A node whose only pod is not Running gets an endpoint without a URL: its
/// exporter is down, so its devices are Unknown, not forgotten.
pub fn pod_endpoints(pods: &[Pod], port: u16, path: &str) -> Vec<PodEndpoint> {
    type Rank = (bool, bool, Option<k8s_openapi::jiff::Timestamp>);
    let mut best: BTreeMap<String, (Rank, &Pod)> = BTreeMap::new();
    for pod in pods {
        let Some(node) = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .filter(|n| !n.is_empty())
        else {
            continue;
        };
        let rank: Rank = (
            pod_ip(pod).is_some(),
            pod.metadata.deletion_timestamp.is_none(),
            pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        );
        let better = match best.get(node) {
            None => true,
            Some((r, p)) => (&rank, pod.name_any()) > (r, p.name_any()),
        };
        if better {
            best.insert(node.to_string(), (rank, pod));
        }
    }
    best.into_iter()
        .map(|(node, (_, pod))| {
            let target = match pod_ip(pod) {
                Some(ip) if ip.contains(':') => Ok(format!("http://[{ip}]:{port}{path}")),
                Some(ip) => Ok(format!("http://{ip}:{port}{path}")),
                None => {
                    let phase = pod
                        .status
                        .as_ref()
                        .and_then(|s| s.phase.as_deref())
                        .unwrap_or("Pending");
                    Err(format!("exporter pod is {phase}, not Running with an IP"))
                }
            };
            PodEndpoint {
                node,
                pod: pod.name_any(),
                target,
            }
        })
        .collect()
}

/// The IP of a Running pod.
fn pod_ip(pod: &Pod) -> Option<&str> {
    let status = pod.status.as_ref()?;
    (status.phase.as_deref() == Some("Running"))
        .then_some(())
        .and(status.pod_ip.as_deref())
        .filter(|ip| !ip.is_empty())
}

/// Apply one node action. The patch is guarded by the resourceVersion just read:
/// a concurrent change makes it fail and the next reconcile decides again. Only
/// kaccel's own taint key and annotations are touched.
pub async fn apply_node_action(client: &Client, action: &NodeAction) -> Result<(), kube::Error> {
    let api: Api<Node> = Api::all(client.clone());
    let node = api.get(action.node()).await?;
    let mut taints: Vec<Taint> = node
        .spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default();
    let mut annotations = node.annotations().clone();
    let mut ops: Vec<Value> = vec![json!({
        "op": "test", "path": "/metadata/resourceVersion", "value": node.resource_version()
    })];
    match action {
        NodeAction::Taint { .. } => {
            taints.push(Taint {
                key: UNHEALTHY_TAINT.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            });
            annotations.insert(TAINTED_ANNOTATION.into(), "true".into());
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Untaint { .. } => {
            taints.retain(|t| t.key != UNHEALTHY_TAINT);
            annotations.remove(TAINTED_ANNOTATION);
            ops.push(json!({"op": "add", "path": "/spec/taints", "value": taints}));
        }
        NodeAction::Cordon { reason, .. } => {
            annotations.insert(CORDONED_ANNOTATION.into(), "true".into());
            annotations.insert(
                REPAIR_ANNOTATION.into(),
                json!({"reason": reason, "since": k8s_openapi::jiff::Timestamp::now().to_string(), "by": "kaccel"}).to_string(),
            );
            ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": true}));
        }
        NodeAction::Uncordon { .. } => {
            annotations.remove(CORDONED_ANNOTATION);
            annotations.remove(REPAIR_ANNOTATION);
            ops.push(json!({"op": "add", "path": "/spec/unschedulable", "value": false}));
        }
    }
    ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": annotations}));
    // Annotations are written as a whole map (no JSON-pointer escaping of keys);
    // the resourceVersion test makes that safe against concurrent writers.
    let patch = serde_json::from_value(Value::Array(ops)).expect("a valid JSON patch");
    api.patch(
        action.node(),
        &PatchParams::default(),
        &Patch::Json::<()>(patch),
    )
    .await?;
    Ok(())
}

/// On a Workload kaccel evicted: which node and why.
pub const EVICTED_FOR_ANNOTATION: &str = "kaccel.io/evicted-for";
/// On a Workload kaccel deactivated and will activate again once Kueue evicted it.
pub const REQUEUE_ANNOTATION: &str = "kaccel.io/requeue";

fn workload_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        crate::kueue::GROUP,
        crate::kueue::VERSION,
        "Workload",
    ))
}

/// Evict the admitted Workloads whose pods run on `node`: a pod belongs to the
/// Workload that owns it or its controller (Job, JobSet, ...). Kueue does the
/// eviction when kaccel deactivates the Workload (`spec.active: false`).
pub async fn evict_workloads_on(
    client: &Client,
    node: &str,
    reason: &str,
) -> Result<Vec<String>, kube::Error> {
    use k8s_openapi::api::core::v1::Pod;
    use kube::api::{DynamicObject, ListParams};
    let pods: Api<Pod> = Api::all(client.clone());
    let on_node = pods
        .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
        .await?;
    let mut owners: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    for pod in &on_node.items {
        let ns = pod.namespace().unwrap_or_default();
        let set = owners.entry(ns).or_default();
        set.extend(pod.metadata.uid.clone());
        set.extend(pod.owner_references().iter().map(|o| o.uid.clone()));
    }
    let mut evicted = Vec::new();
    for (ns, uids) in owners {
        let workloads: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &workload_resource());
        for wl in workloads.list(&ListParams::default()).await?.items {
            let v = serde_json::to_value(&wl).unwrap_or_default();
            let owned = wl.owner_references().iter().any(|o| uids.contains(&o.uid));
            let admitted = !v["status"]["admission"].is_null();
            let active = v["spec"]["active"].as_bool().unwrap_or(true);
            if !(owned && admitted && active) {
                continue;
            }
            let name = wl.name_any();
            let patch = json!({
                "metadata": {"annotations": {
                    EVICTED_FOR_ANNOTATION: format!("{node}: {reason}"),
                    REQUEUE_ANNOTATION: "true",
                }},
                "spec": {"active": false},
            });
            workloads
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            evicted.push(format!("{ns}/{name}"));
        }
    }
    Ok(evicted)
}

/// Activate again the Workloads kaccel deactivated, once Kueue has evicted them
/// (their admission is gone): they queue for healthy capacity like any other.
pub async fn requeue_evicted(client: &Client) -> Result<(Vec<String>, usize), kube::Error> {
    use kube::api::{DynamicObject, ListParams};
    let workloads: Api<DynamicObject> = Api::all_with(client.clone(), &workload_resource());
    let mut requeued = Vec::new();
    let mut waiting = 0;
    for wl in workloads.list(&ListParams::default()).await?.items {
        if wl.annotations().get(REQUEUE_ANNOTATION).map(String::as_str) != Some("true") {
            continue;
        }
        let v = serde_json::to_value(&wl).unwrap_or_default();
        if !v["status"]["admission"].is_null() {
            waiting += 1; // Kueue has not evicted it yet
            continue;
        }
        let ns = wl.namespace().unwrap_or_default();
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &workload_resource());
        let patch = json!({
            "metadata": {"annotations": {REQUEUE_ANNOTATION: null}},
            "spec": {"active": true},
        });
        api.patch(
            &wl.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&patch),
        )
        .await?;
        requeued.push(format!("{ns}/{}", wl.name_any()));
    }
    Ok((requeued, waiting))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(
        name: &str,
        node: Option<&str>,
        phase: &str,
        ip: Option<&str>,
        created: i64,
        deleting: bool,
    ) -> Pod {
        serde_json::from_value(json!({
            "metadata": {
                "name": name, "namespace": "gpu-operator",
                "creationTimestamp": k8s_openapi::jiff::Timestamp::from_second(created).unwrap().to_string(),
                "deletionTimestamp": deleting.then_some("2026-01-01T00:00:00Z"),
            },
            "spec": {"nodeName": node, "containers": []},
            "status": {"phase": phase, "podIP": ip},
        }))
        .unwrap()
    }

    #[test]
    fn one_endpoint_per_node_from_running_pods() {
        let pods = vec![
            pod(
                "dcgm-a",
                Some("node-a"),
                "Running",
                Some("10.0.0.5"),
                100,
                false,
            ),
            // Rollout on node b: the old pod is terminating, the new one runs.
            pod(
                "dcgm-b-old",
                Some("node-b"),
                "Running",
                Some("10.0.1.5"),
                100,
                true,
            ),
            pod(
                "dcgm-b-new",
                Some("node-b"),
                "Running",
                Some("10.0.1.6"),
                200,
                false,
            ),
            // Node c: the new pod is not up yet; the old one still serves.
            pod(
                "dcgm-c-old",
                Some("node-c"),
                "Running",
                Some("10.0.2.5"),
                100,
                false,
            ),
            pod("dcgm-c-new", Some("node-c"), "Pending", None, 200, false),
            // Node d: only a crashed pod.
            pod("dcgm-d", Some("node-d"), "Failed", None, 100, false),
            // Not scheduled: no node to speak for.
            pod("dcgm-x", None, "Pending", None, 100, false),
            // IPv6.
            pod(
                "dcgm-e",
                Some("node-e"),
                "Running",
                Some("fd00::5"),
                100,
                false,
            ),
        ];
        let eps = pod_endpoints(&pods, 9400, "/metrics");
        let got: Vec<(&str, &str, Result<&str, &str>)> = eps
            .iter()
            .map(|e| {
                (
                    e.node.as_str(),
                    e.pod.as_str(),
                    e.target.as_deref().map_err(String::as_str),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                ("node-a", "dcgm-a", Ok("http://10.0.0.5:9400/metrics")),
                ("node-b", "dcgm-b-new", Ok("http://10.0.1.6:9400/metrics")),
                ("node-c", "dcgm-c-old", Ok("http://10.0.2.5:9400/metrics")),
                (
                    "node-d",
                    "dcgm-d",
                    Err("exporter pod is Failed, not Running with an IP")
                ),
                ("node-e", "dcgm-e", Ok("http://[fd00::5]:9400/metrics")),
            ]
        );
        assert!(pod_endpoints(&[], 9400, "/metrics").is_empty());
    }
}
