//! One poll of each source form (url, prometheus, pods) and how its answer updates the tracker.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use super::{Poller, node_state_name, now_millis, now_seconds};
use crate::controller::config::{HealthSource, PodsSource, PrometheusSource};
use crate::health::exporters::{DeviceReading, ExporterKind, readings};
use crate::health::scrape::Scraper;
use crate::health::{prom, promql};

impl Poller {
    pub(super) async fn poll_url(&self, url: &str) -> bool {
        let source = &self.source;
        let result = scrape_exporter(
            &self.scraper,
            source.kind,
            url,
            source.node.as_deref(),
            self.timeout(),
            source.max_response_bytes,
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

    pub(super) async fn poll_prometheus(
        &self,
        p: &PrometheusSource,
        known: &mut BTreeSet<String>,
    ) -> bool {
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

    pub(super) async fn poll_pods(
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
                        source.max_response_bytes,
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
    max_bytes: usize,
) -> Result<Vec<DeviceReading>, String> {
    let body = scraper
        .fetch(url, timeout, max_bytes)
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
        .get(&url, timeout, source.max_response_bytes)
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
