//! Reading vendor exporter metrics through a Prometheus server's query API
//! (`GET /api/v1/query`) instead of scraping each exporter: clusters usually scrape
//! the exporters already.
//!
//! Pure: this module builds the query and its URL, reads the JSON answer into
//! [`Sample`]s (the same shape the text parser produces, so
//! [`crate::health::exporters::readings`] maps both) and splits them by node with
//! their age. The HTTP fetch is [`crate::health::scrape::Scraper`]'s; the polling
//! loop is in `src/controller/health_poller.rs`.
//!
//! One query per source selects only the series the exporter mapping reads:
//! `{__name__=~"A|B|...",<selector matchers>}[<staleAfterSeconds>s]`. It is a range
//! selector on purpose: for an instant vector Prometheus answers with the
//! *evaluation* time and keeps returning a series' last value for its lookback
//! (5 minutes) after the exporter went away, so its timestamp says nothing about
//! freshness. A range selector returns the raw samples of the window with their own
//! timestamps, and nothing for a series that stopped. Both answer shapes (`vector`
//! and `matrix`) are read; samples older than `staleAfterSeconds` are dropped either
//! way (invariant 6: never the last value seen).
//!
//! Never panics on any input (property-tested); an answer that is not a successful
//! vector or matrix is a [`QueryError`], never "no samples".
//!
//! Building the query and its URL is `promql/request.rs`, reading the answer
//! `promql/answer.rs`; this file splits the samples by node.

mod answer;
mod request;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use super::exporters::{DeviceReading, ExporterKind, readings};
use super::prom::Sample;

pub use answer::{QueryError, parse};
pub use request::{name_regex, query, query_url, selector_matchers, selects};

/// The label that names a series' node when the source does not configure one:
/// the exporter's own hostname label. Ascend's and Gaudi's exporters have none
/// (configure `nodeLabel`, e.g. the `node` label a relabelling rule adds).
pub fn default_node_label(kind: ExporterKind) -> Option<&'static str> {
    match kind {
        ExporterKind::DcgmExporter => Some("Hostname"),
        ExporterKind::AmdDeviceMetrics => Some("hostname"),
        ExporterKind::AscendNpuExporter | ExporterKind::GaudiExporter => None,
    }
}

/// A query answer split by node.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ByNode {
    /// Nodes with fresh samples: their device readings (node set to the node).
    pub fresh: BTreeMap<String, Vec<DeviceReading>>,
    /// Nodes whose every sample is older than the staleness limit: the age of their
    /// newest sample, in seconds.
    pub stale: BTreeMap<String, i64>,
    /// Samples dropped for having no node label.
    pub without_node: usize,
    /// Stale samples dropped (on any node).
    pub stale_samples: usize,
}

/// Split samples by the value of `node_label`, drop those older than
/// `stale_after_seconds` at `now_ms`, and map each node's fresh samples to device
/// readings. A sample without a timestamp counts as fresh. The node label wins over
/// the exporter's own hostname label, so devices on different nodes never merge.
pub fn by_node(
    kind: ExporterKind,
    samples: Vec<Sample>,
    node_label: &str,
    now_ms: i64,
    stale_after_seconds: i64,
) -> ByNode {
    let limit_ms = stale_after_seconds.saturating_mul(1000);
    let mut fresh: BTreeMap<String, Vec<Sample>> = BTreeMap::new();
    let mut newest_stale: BTreeMap<String, i64> = BTreeMap::new();
    let mut out = ByNode::default();
    for s in samples {
        let Some(node) = s.label(node_label).map(str::trim).filter(|n| !n.is_empty()) else {
            out.without_node += 1;
            continue;
        };
        let node = node.to_string();
        match s.timestamp_ms {
            Some(t) if now_ms.saturating_sub(t) > limit_ms => {
                out.stale_samples += 1;
                let newest = newest_stale.entry(node).or_insert(t);
                *newest = (*newest).max(t);
            }
            _ => fresh.entry(node).or_default().push(s),
        }
    }
    for (node, t) in newest_stale {
        if !fresh.contains_key(&node) {
            out.stale.insert(node, now_ms.saturating_sub(t) / 1000);
        }
    }
    for (node, samples) in fresh {
        let mut found = readings(kind, &samples, Some(&node));
        for r in &mut found {
            r.node = Some(node.clone());
        }
        if !found.is_empty() {
            out.fresh.insert(node, found);
        }
    }
    out
}
