//! The controller's configuration file (`config/kaccel.yaml` documents every knob).
//! Every field has a default, so an empty file (or none) is a working setup.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::health::exporters::ExporterKind;
use crate::health::policy::{NodeConditionRule, Policy, default_node_condition_rules};
use crate::plan::PlanOptions;
use crate::plan::nodes::NodeActionPolicy;

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Config {
    /// Server-side apply field manager for everything kaccel writes.
    pub field_manager: String,
    /// Root Cohort that every team Cohort hangs under.
    pub root_cohort: String,
    /// Quiet time after the last watch event before re-planning, in milliseconds.
    pub debounce_ms: u64,
    /// Longest a burst of events may delay a re-plan, in milliseconds.
    pub max_delay_ms: u64,
    /// Re-plan at least this often even without events, in seconds (restores
    /// anything a missed event would have hidden).
    pub resync_seconds: u64,
    /// Address of the HTTP server for /healthz, /readyz and /metrics.
    pub http_address: SocketAddr,
    pub leader_election: LeaderElection,
    pub planner: Planner,
    /// Read DRA ResourceSlices (resource.k8s.io/v1) when the API server serves them.
    pub watch_resource_slices: bool,
    pub health: Health,
}

/// The health feedback loop: where device health comes from, how signals map to a
/// status, and what kaccel does to nodes.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Health {
    pub sources: Vec<HealthSource>,
    pub node_conditions: Vec<NodeConditionRule>,
    pub policy: Policy,
    pub actions: NodeActionPolicy,
}

impl Default for Health {
    fn default() -> Self {
        Health {
            sources: vec![],
            node_conditions: default_node_condition_rules(),
            policy: Policy::default(),
            actions: NodeActionPolicy::default(),
        }
    }
}

/// One exporter endpoint, scraped on its own interval.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthSource {
    pub name: String,
    pub kind: ExporterKind,
    /// `http://host:port/metrics`.
    pub url: String,
    /// The node whose devices it reports; wins over the exporter's hostname label.
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default = "default_interval")]
    pub interval_seconds: u64,
    /// Readings older than this make the source's devices Unknown.
    #[serde(default = "default_stale_after")]
    pub stale_after_seconds: i64,
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
}

fn default_interval() -> u64 {
    5
}

fn default_stale_after() -> i64 {
    30
}

fn default_timeout() -> u64 {
    3
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElection {
    pub enabled: bool,
    pub lease_name: String,
    /// Namespace of the Lease; the `POD_NAMESPACE` environment variable wins when set.
    pub lease_namespace: String,
    /// Seconds a leader's lease stays valid without renewal: the worst-case handover
    /// time after a leader dies without releasing it.
    pub lease_duration_seconds: u64,
    /// Seconds before expiry at which the leader renews.
    pub renew_grace_seconds: u64,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Planner {
    pub unknown_counts_as_capacity: bool,
    pub demote_warning_percent: u32,
    pub queueing_strategy: String,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            field_manager: "kaccel".into(),
            root_cohort: "kaccel".into(),
            debounce_ms: 250,
            max_delay_ms: 2000,
            resync_seconds: 300,
            http_address: "0.0.0.0:8080".parse().expect("valid address"),
            leader_election: LeaderElection::default(),
            planner: Planner::default(),
            watch_resource_slices: true,
            health: Health::default(),
        }
    }
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            enabled: true,
            lease_name: "kaccel-controller".into(),
            lease_namespace: "kaccel-system".into(),
            lease_duration_seconds: 15,
            renew_grace_seconds: 5,
        }
    }
}

impl Default for Planner {
    fn default() -> Self {
        let defaults = PlanOptions::default();
        Planner {
            unknown_counts_as_capacity: defaults.unknown_counts_as_capacity,
            demote_warning_percent: defaults.demote_warning_percent,
            queueing_strategy: defaults.queueing_strategy,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config file {path}: {field}: {message}")]
    Invalid {
        path: String,
        field: &'static str,
        message: String,
    },
}

impl Config {
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let Some(path) = path else {
            return Ok(Config::default());
        };
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: shown.clone(),
            source,
        })?;
        let config: Config = if text.trim().is_empty() {
            Config::default()
        } else {
            serde_yaml::from_str(&text).map_err(|e| ConfigError::Parse {
                path: shown.clone(),
                message: e.to_string(),
            })?
        };
        config.validate(&shown)?;
        Ok(config)
    }

    fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let invalid = |field, message: &str| ConfigError::Invalid {
            path: path.to_string(),
            field,
            message: message.to_string(),
        };
        if self.field_manager.is_empty() {
            return Err(invalid("fieldManager", "must not be empty"));
        }
        if !crate::plan::names::valid_dns_subdomain(&self.root_cohort) {
            return Err(invalid(
                "rootCohort",
                "must be a DNS subdomain, e.g. kaccel",
            ));
        }
        if self.max_delay_ms < self.debounce_ms {
            return Err(invalid("maxDelayMs", "must be at least debounceMs"));
        }
        let le = &self.leader_election;
        if le.enabled && le.renew_grace_seconds >= le.lease_duration_seconds {
            return Err(invalid(
                "leaderElection.renewGraceSeconds",
                "must be below leaseDurationSeconds, or the leader could never renew in time",
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for source in &self.health.sources {
            if !names.insert(source.name.as_str()) {
                return Err(invalid("health.sources[].name", "names must be unique"));
            }
            if !source.url.starts_with("http://") {
                return Err(invalid(
                    "health.sources[].url",
                    "must be an http:// URL, e.g. http://10.0.0.5:9400/metrics",
                ));
            }
            if source.interval_seconds == 0 || source.timeout_seconds == 0 {
                return Err(invalid(
                    "health.sources[].intervalSeconds",
                    "intervalSeconds and timeoutSeconds must be at least 1",
                ));
            }
            if source.stale_after_seconds < source.interval_seconds as i64 {
                return Err(invalid(
                    "health.sources[].staleAfterSeconds",
                    "must be at least intervalSeconds, or every source would always be stale",
                ));
            }
        }
        if self.health.actions.max_share_percent > 100 {
            return Err(invalid("health.actions.maxSharePercent", "must be 0..100"));
        }
        if self.planner.demote_warning_percent > 100 {
            return Err(invalid("planner.demoteWarningPercent", "must be 0..100"));
        }
        Ok(())
    }

    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            root_cohort: self.root_cohort.clone(),
            unknown_counts_as_capacity: self.planner.unknown_counts_as_capacity,
            demote_warning_percent: self.planner.demote_warning_percent,
            queueing_strategy: self.planner.queueing_strategy.clone(),
            ..PlanOptions::default()
        }
    }

    pub fn debounce(&self) -> Duration {
        Duration::from_millis(self.debounce_ms)
    }

    pub fn max_delay(&self) -> Duration {
        Duration::from_millis(self.max_delay_ms)
    }

    pub fn resync(&self) -> Duration {
        Duration::from_secs(self.resync_seconds.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documented_config_file_is_the_default() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/config/kaccel.yaml");
        let loaded = Config::load(Some(Path::new(path))).unwrap();
        assert_eq!(
            loaded,
            Config::default(),
            "config/kaccel.yaml must show the defaults"
        );
    }

    #[test]
    fn bad_config_names_the_field() {
        let dir = std::env::temp_dir().join(format!("kaccel-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bad.yaml");
        std::fs::write(
            &path,
            "leaderElection:\n  leaseDurationSeconds: 5\n  renewGraceSeconds: 5\n",
        )
        .unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("leaderElection.renewGraceSeconds"), "{err}");
        std::fs::write(&path, "debounceMS: 5\n").unwrap();
        let err = Config::load(Some(&path)).unwrap_err().to_string();
        assert!(err.contains("debounceMS"), "{err}");
    }
}
