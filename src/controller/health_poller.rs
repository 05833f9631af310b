//! Health polling: one task per source on its own interval, feeding the shared [`Tracker`].
//!
//! A poll wakes the reconcile loop only when what the planner sees changed.
//!
//! A source reads one exporter kind from one of three places:
//! - `url`: one exporter's /metrics; one tracker state named after the source.
//! - `prometheus`: one query per poll against a Prometheus query API
//!   (src/health/promql.rs); one state per node seen, `<source>/<node>`, so a node
//!   whose series went stale is Unknown on its own while the others stay trusted.
//! - `pods`: the exporter pods matching a label selector, listed every poll and
//!   scraped one by one; one state per node, `<source>/<node>`, dropped when the
//!   node's pod goes away.
//!
//! What one poll of each form reads and records is in `sources.rs`; the node
//! taints/cordons the health decides are in `node_actions.rs`.

mod sources;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kube::Client;
use tokio::sync::mpsc::UnboundedSender;

use super::config::{Health, HealthSource, SourceEndpoint};
use super::metrics::{Metrics, SourceLabel};
use crate::health::policy::{Policy, SourceState, TrackedDevice, Tracker};
use crate::health::scrape::Scraper;

// credits/ reads the eviction annotation from here.

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

/// What the planner acts on, hashed, so a poll that changes nothing wakes nobody.
/// A hash, not the strings: each of 500 exporters polled every 5 s takes it twice,
/// and formatting them cost 30 ms of CPU a poll. With `node`, only that node's
/// devices are hashed (a change confined to one node's exporter moves nothing
/// else): hashing the fleet's devices at every poll of one node's exporter made
/// each poll cost the whole fleet. Every source's usability is hashed either way,
/// because a source goes stale with time, and any poll notices that.
fn fingerprint(t: &Tracker, now: i64, node: Option<&str>) -> u64 {
    use std::hash::{BuildHasher, Hash, Hasher};
    let mut h = crate::k8s::names::FINGERPRINTS.build_hasher();
    let devices: Box<dyn Iterator<Item = &TrackedDevice>> = match node {
        Some(node) => Box::new(
            t.devices
                .range((node.to_string(), String::new())..)
                .take_while(move |((n, _), _)| n == node)
                .map(|(_, d)| &**d),
        ),
        None => Box::new(t.devices.values().map(|d| &**d)),
    };
    for d in devices {
        d.node.hash(&mut h);
        d.device.hash(&mut h);
        d.status.hash(&mut h);
        // Firmware too: a class's allow-list turns on it.
        d.reading.firmware_version.hash(&mut h);
    }
    for s in t.sources.values() {
        s.name.hash(&mut h);
        s.usable(now).hash(&mut h);
        s.nodes.hash(&mut h);
    }
    h.finish()
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
    let count = config.sources.len();
    for (index, source) in config.sources.iter().cloned().enumerate() {
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
            // Every source is polled at once at start (the first plan waits for
            // their answers), then at its own phase of the interval.
            let period = Duration::from_secs(poller.source.interval_seconds);
            let start = tokio::time::Instant::now();
            let mut tick =
                tokio::time::interval_at(start + poll_phase(index, count, period), period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            // Nodes a prometheus / pods source has states for.
            let mut known = BTreeSet::new();
            loop {
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
                tick.tick().await;
            }
        });
    }
}

/// When source `index` of `count` polls the second time, after its first poll at
/// start: its share of the interval, so that the sources' polls are spread over
/// it (as Prometheus spreads its scrapes), never more than an interval after the
/// first. Polled all at once, 500 exporters were a burst of parsing every
/// interval, and a change that met it (a failure is read in one) waited on it.
fn poll_phase(index: usize, count: usize, period: Duration) -> Duration {
    let count = count.max(1) as u32;
    let index = (index as u32).min(count - 1);
    period * (index + 1) / count
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
        // One exporter at a configured node: every reading it gives is put on
        // that node, so its answer changes that node's devices only.
        let node = match self.source.endpoint() {
            Some(SourceEndpoint::Url(_)) => self.source.node.as_deref(),
            _ => None,
        };
        let changed = {
            let mut t = self.tracker.lock().expect("tracker lock");
            let before = fingerprint(&t, now, node);
            change(&mut t);
            fingerprint(&t, now, node) != before
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::config::{PodsSource, PrometheusSource};
    use crate::health::exporters::ExporterKind;
    use crate::health::policy::testing;

    #[test]
    fn sources_poll_at_their_own_phase_of_the_interval() {
        let period = Duration::from_secs(5);
        // 500 exporters: one poll every 10 ms, not 500 at once every 5 s.
        let phases: Vec<Duration> = (0..500).map(|i| poll_phase(i, 500, period)).collect();
        assert_eq!(phases[0], Duration::from_millis(10));
        assert_eq!(phases[1], Duration::from_millis(20));
        assert!(
            phases
                .windows(2)
                .all(|w| w[1] - w[0] == Duration::from_millis(10))
        );
        // Never more than an interval after the first poll at start.
        assert_eq!(phases[499], period);
        // One source polls at its interval, as it always did.
        assert_eq!(poll_phase(0, 1, period), period);
        assert_eq!(poll_phase(0, 0, period), period);
    }

    fn source(name: &str) -> HealthSource {
        HealthSource {
            name: name.into(),
            kind: ExporterKind::DcgmExporter,
            url: None,
            prometheus: None,
            pods: None,
            node: None,
            interval_seconds: 5,
            stale_after_seconds: 45,
            timeout_seconds: 3,
            max_response_bytes: crate::health::prom::MAX_BODY_BYTES,
        }
    }

    /// How a fake exporter on loopback answers each scrape.
    #[derive(Clone, Copy, Debug)]
    enum Exporter {
        /// A dcgm-exporter body for the 8 GPUs of the watched node, all healthy.
        Healthy,
        /// The same body, padded with comments far past the limit.
        Oversized,
        /// Headers promising a large body, then one byte every 100 ms.
        SlowLoris,
        /// Takes the connection and reads the request, never answers.
        Silent,
    }

    async fn serve(mode: Exporter) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/metrics", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let Ok((mut stream, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    let mut request = [0u8; 1024];
                    let _ = stream.read(&mut request).await;
                    let mut body: String = (0..8)
                        .map(|gpu| {
                            format!("DCGM_FI_DEV_GPU_TEMP{{gpu=\"{gpu}\",UUID=\"GPU-{gpu}\"}} 40\n")
                        })
                        .collect();
                    match mode {
                        Exporter::Healthy => {}
                        Exporter::Oversized => body += &"# padding\n".repeat(100_000),
                        Exporter::SlowLoris => {
                            let head = "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n";
                            let _ = stream.write_all(head.as_bytes()).await;
                            for byte in body.bytes().cycle() {
                                if stream.write_all(&[byte]).await.is_err() {
                                    return;
                                }
                                tokio::time::sleep(Duration::from_millis(100)).await;
                            }
                        }
                        Exporter::Silent => {
                            tokio::time::sleep(Duration::from_secs(3600)).await;
                            return;
                        }
                    }
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        url
    }

    /// A poller of the watched node's one source (`testing::SOURCE`).
    fn poller(url: &str, tracker: SharedTracker) -> Poller {
        let mut registry = prometheus_client::registry::Registry::default();
        let (wake, _) = tokio::sync::mpsc::unbounded_channel();
        Poller {
            scraper: Scraper::default(),
            tracker,
            metrics: Metrics::register(&mut registry),
            wake,
            policy: Policy::default(),
            source: HealthSource {
                url: Some(url.into()),
                node: Some(testing::NODE.into()),
                timeout_seconds: 1,
                max_response_bytes: 64 * 1024,
                ..source(testing::SOURCE)
            },
        }
    }

    #[tokio::test]
    async fn a_huge_a_dribbling_or_a_silent_exporter_is_cut_and_its_cards_are_unknown() {
        for (mode, error) in [
            (
                Exporter::Oversized,
                "answer longer than 65536 bytes (maxResponseBytes): cut off unread",
            ),
            (Exporter::SlowLoris, "no answer within 1s"),
            (Exporter::Silent, "no answer within 1s"),
        ] {
            let tracker: SharedTracker = Arc::new(std::sync::Mutex::new(testing::watched()));
            let healthy = poller(&serve(Exporter::Healthy).await, tracker.clone());
            healthy
                .poll_url(healthy.source.url.as_deref().unwrap())
                .await;
            let now = now_seconds();
            let seen = testing::counts(&tracker.lock().unwrap(), testing::fleet(), now);
            assert_eq!((seen.healthy, seen.unknown), (8, 0), "{mode:?}: first poll");

            let hostile = poller(&serve(mode).await, tracker.clone());
            // Cut at the limit: the poll ends (the test's own bound is only there
            // so a regression fails instead of hanging).
            tokio::time::timeout(
                Duration::from_secs(30),
                hostile.poll_url(hostile.source.url.as_deref().unwrap()),
            )
            .await
            .unwrap_or_else(|_| panic!("{mode:?}: the poll never ended"));
            let t = tracker.lock().unwrap();
            assert_eq!(
                t.sources[testing::SOURCE].last_error.as_deref(),
                Some(error),
                "{mode:?}"
            );
            let seen = testing::counts(&t, testing::fleet(), now_seconds());
            assert_eq!(
                (seen.healthy, seen.unknown),
                (0, 8),
                "{mode:?}: the cards are Unknown, not still healthy"
            );
        }
    }

    #[test]
    fn the_tracker_starts_with_one_state_per_url_source() {
        let health = Health {
            sources: vec![
                HealthSource {
                    url: Some("http://10.0.0.5:9400/metrics".into()),
                    node: Some("gpu-1".into()),
                    ..source("one")
                },
                HealthSource {
                    url: Some("http://10.0.0.6:9400/metrics".into()),
                    ..source("shared")
                },
                HealthSource {
                    prometheus: Some(PrometheusSource {
                        url: "http://prometheus:9090".into(),
                        selector: String::new(),
                        node_label: None,
                    }),
                    ..source("prom")
                },
                HealthSource {
                    pods: Some(PodsSource {
                        namespace: "gpu-operator".into(),
                        selector: "app=dcgm".into(),
                        port: 9400,
                        path: "/metrics".into(),
                    }),
                    ..source("pods")
                },
            ],
            ..Health::default()
        };
        let shared = tracker(&health);
        let t = shared.lock().unwrap();
        assert_eq!(t.sources.keys().collect::<Vec<_>>(), ["one", "shared"]);
        let one = &t.sources["one"];
        assert_eq!(one.nodes, ["gpu-1"]);
        assert_eq!(one.vendor, Some(ExporterKind::DcgmExporter.vendor()));
        assert_eq!(one.stale_after_seconds, 45);
        // No configured node: the exporter's hostname label says, once polled.
        assert!(t.sources["shared"].nodes.is_empty());
        assert_eq!(node_state_name("prom", "gpu-2"), "prom/gpu-2");
    }

    #[test]
    fn only_a_change_the_planner_sees_changes_the_fingerprint() {
        let now = 1_000;
        let mut t = Tracker::default();
        t.sources.insert(
            "one".into(),
            SourceState {
                name: "one".into(),
                nodes: vec!["gpu-1".into()],
                last_success_at: Some(now),
                stale_after_seconds: 30,
                ..Default::default()
            },
        );
        let before = fingerprint(&t, now, None);
        assert_eq!(fingerprint(&t, now, None), before);
        // Bookkeeping the planner does not read: no wake-up.
        t.sources.get_mut("one").unwrap().failing_since = Some(now);
        assert_eq!(fingerprint(&t, now, None), before);
        // The source became unusable: its devices turn Unknown.
        t.sources.get_mut("one").unwrap().last_error = Some("timeout".into());
        assert_ne!(fingerprint(&t, now, None), before);
        t.sources.get_mut("one").unwrap().last_error = None;
        assert_eq!(fingerprint(&t, now, None), before);
        // It now covers another node.
        t.sources.get_mut("one").unwrap().nodes.push("gpu-2".into());
        assert_ne!(fingerprint(&t, now, None), before);
    }

    #[test]
    fn one_nodes_poll_hashes_that_nodes_devices_and_every_sources_usability() {
        use crate::health::exporters::DeviceReading;
        let now = 1_000;
        let policy = Policy::default();
        let mut t = Tracker::default();
        for node in ["gpu-1", "gpu-2"] {
            t.sources.insert(
                node.into(),
                SourceState {
                    name: node.into(),
                    nodes: vec![node.into()],
                    stale_after_seconds: 30,
                    ..Default::default()
                },
            );
            let readings = (0..2)
                .map(|i| DeviceReading {
                    node: Some(node.into()),
                    device: format!("{i}"),
                    temperature_c: Some(50.0),
                    ..Default::default()
                })
                .collect();
            t.observe(node, readings, now, &policy);
        }
        let status = |t: &mut Tracker, node: &str, status| {
            t.devices
                .get_mut(&(node.to_string(), "1".to_string()))
                .unwrap()
                .status = status;
        };
        let before = fingerprint(&t, now, Some("gpu-1"));
        // Another node's device is not what gpu-1's exporter changes.
        status(&mut t, "gpu-2", crate::health::DeviceStatus::Failed);
        assert_eq!(fingerprint(&t, now, Some("gpu-1")), before);
        assert_ne!(
            fingerprint(&t, now, None),
            fingerprint(&t, now, Some("gpu-1"))
        );
        // Its own node's devices are.
        status(&mut t, "gpu-1", crate::health::DeviceStatus::Failed);
        assert_ne!(fingerprint(&t, now, Some("gpu-1")), before);
        status(&mut t, "gpu-1", crate::health::DeviceStatus::Healthy);
        assert_eq!(fingerprint(&t, now, Some("gpu-1")), before);
        // Every source's staleness, whichever node polled: a silent exporter's
        // devices turn Unknown at the next poll of any.
        assert_ne!(fingerprint(&t, now + 31, Some("gpu-1")), before);
    }
}
