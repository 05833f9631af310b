//! The health loop's I/O: one polling task per exporter feeding the shared
//! [`Tracker`], and node taints/cordons applied with optimistic concurrency.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedSender;

use super::config::{Health, HealthSource};
use super::metrics::{Metrics, SourceLabel};
use crate::health::exporters::readings;
use crate::health::policy::{SourceState, Tracker};
use crate::health::prom;
use crate::health::scrape::Scraper;
use crate::plan::nodes::{
    CORDONED_ANNOTATION, NodeAction, REPAIR_ANNOTATION, TAINTED_ANNOTATION, UNHEALTHY_TAINT,
};

pub type SharedTracker = Arc<Mutex<Tracker>>;

pub fn now_seconds() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_second()
}

/// A tracker with one state per configured source.
pub fn tracker(config: &Health) -> SharedTracker {
    let mut t = Tracker::default();
    for s in &config.sources {
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

/// Poll every source until the process ends; wake the reconcile loop (`wake`) when
/// what the planner sees changed.
pub fn spawn_pollers(
    config: &Health,
    tracker: SharedTracker,
    metrics: Metrics,
    wake: UnboundedSender<()>,
) {
    let scraper = Scraper::default();
    for source in config.sources.clone() {
        let tracker = tracker.clone();
        let metrics = metrics.clone();
        let wake = wake.clone();
        let scraper = scraper.clone();
        let policy = config.policy.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(source.interval_seconds));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                let result = poll(&scraper, &source).await;
                let now = now_seconds();
                let label = SourceLabel {
                    source: source.name.clone(),
                };
                let changed = {
                    let mut t = tracker.lock().expect("tracker lock");
                    let before = fingerprint(&t, now);
                    match result {
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
                            t.observe(&source.name, found, now, &policy);
                            metrics.source_up.get_or_create(&label).set(1);
                            metrics.source_last_success.get_or_create(&label).set(now);
                        }
                        Err(e) => {
                            tracing::warn!(source = %source.name, error = %e, "health source unusable: its devices are Unknown");
                            t.fail(&source.name, e);
                            metrics.source_up.get_or_create(&label).set(0);
                            metrics.source_errors.get_or_create(&label).inc();
                        }
                    }
                    fingerprint(&t, now) != before
                };
                if changed && wake.send(()).is_err() {
                    return;
                }
            }
        });
    }
}

async fn poll(
    scraper: &Scraper,
    source: &HealthSource,
) -> Result<Vec<crate::health::exporters::DeviceReading>, String> {
    let body = scraper
        .fetch(&source.url, Duration::from_secs(source.timeout_seconds))
        .await
        .map_err(|e| e.to_string())?;
    let samples = prom::parse(&body).map_err(|e| format!("unparseable: {e}"))?;
    let mut found = readings(source.kind, &samples, source.node.as_deref());
    if let Some(node) = &source.node {
        for r in &mut found {
            r.node = Some(node.clone());
        }
    }
    if found.is_empty() {
        return Err("no device metrics in the answer".into());
    }
    Ok(found)
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
