//! The controller's configuration file: its fields, their defaults and loading.
//!
//! `config/kaccel.yaml` documents every knob. Every field has a default, so an
//! empty file (or none) is a working setup. The rules a file must satisfy are in
//! checks.rs.

mod checks;

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
    /// This installation's name among others in the cluster (see
    /// [`crate::k8s::instance`]): the `managed-by` value of what it writes, the
    /// `kaccel.io/instance` label of the classes and budgets it serves, and the
    /// default of the names below.
    pub instance: String,
    /// Server-side apply field manager for everything kaccel writes (empty: the
    /// instance).
    #[serde(default)]
    pub field_manager: String,
    /// Root Cohort that every team Cohort hangs under (empty: the instance).
    #[serde(default)]
    pub root_cohort: String,
    /// Quiet time after the last watch event before re-planning, in milliseconds:
    /// the events of one change (a label patch, a status write) become one plan.
    pub quiet_ms: u64,
    /// Least time between the starts of two re-plans, in milliseconds: a stream of
    /// events re-plans at most this often.
    pub debounce_ms: u64,
    /// Longest a burst of events may delay a re-plan, in milliseconds.
    pub max_delay_ms: u64,
    /// Re-plan at least this often even without events, in seconds (restores
    /// anything a missed event would have hidden).
    pub resync_seconds: u64,
    /// Address of the HTTP server for /healthz, /readyz and /metrics.
    pub http_address: SocketAddr,
    /// (Its own and the ledger's defaults, not the resolved `Config::default()`'s:
    /// their names derive from `instance`.)
    #[serde(default)]
    pub leader_election: LeaderElection,
    pub planner: Planner,
    /// Read DRA ResourceSlices (resource.k8s.io/v1) when the API server serves them.
    pub watch_resource_slices: bool,
    pub health: Health,
    #[serde(default)]
    pub ledger: Ledger,
    pub kueue: KueueSettings,
    pub webhook: Webhook,
    #[serde(default)]
    pub multi_kueue: MultiKueue,
}

/// Kueue MultiKueue: this cluster is the manager, and admitted work runs in the
/// worker clusters listed here. kaccel reads each worker's Nodes (never writes
/// there), plans quota over their union, writes Kueue's MultiKueueCluster per
/// worker, one MultiKueueConfig and the MultiKueue AdmissionCheck on every
/// ClusterQueue, and charges in this cluster's ledger with the worker named on
/// each entry. A config section, not a custom resource: a worker is reached
/// with credentials in Kueue's namespace (the Secret Kueue's MultiKueue reads
/// too), a cluster-admin decision made once per installation, not per team.
/// Adding a worker takes a restart (a rollout).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct MultiKueue {
    /// The worker clusters (empty: no MultiKueue; kaccel plans this cluster's Nodes).
    pub workers: Vec<Worker>,
    /// Kueue's namespace, where each worker's kubeconfig Secret is (Kueue reads
    /// it there; so does kaccel).
    pub kueue_namespace: String,
    /// The MultiKueue AdmissionCheck every ClusterQueue references, and the
    /// MultiKueueConfig it names (empty: `<instance>-multikueue`).
    pub admission_check_name: String,
}

/// One MultiKueue worker cluster.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Worker {
    /// The MultiKueueCluster's name, and the cluster named in ledger entries
    /// (a DNS label).
    pub name: String,
    /// The Secret in `kueueNamespace` whose key `kubeconfig` reaches the worker
    /// (credentials embedded: Kueue refuses file paths and exec plugins).
    pub kubeconfig_secret: String,
}

impl Default for MultiKueue {
    fn default() -> Self {
        MultiKueue {
            workers: Vec::new(),
            kueue_namespace: "kueue-system".into(),
            admission_check_name: String::new(),
        }
    }
}

impl MultiKueue {
    pub fn enabled(&self) -> bool {
        !self.workers.is_empty()
    }
}

/// The pod webhook: rewrites `kaccel.io/accelerator` into the vendor resource of
/// the flavor Kueue placed the pod on (manifests/webhook.yaml registers it).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Webhook {
    /// Serve it (HTTPS) from every replica, leader or not.
    pub enabled: bool,
    pub address: SocketAddr,
    /// A folder with `tls.crt` and `tls.key` (a cert-manager Certificate's Secret,
    /// mounted): used as they are, and cert-manager injects the CA bundle. Empty:
    /// kaccel generates a CA and a serving certificate once, keeps them in
    /// `secret` (shared by every replica) and writes the CA bundle into
    /// `configurationName`.
    pub cert_dir: String,
    /// `NAMESPACE/NAME` of the Secret a generated certificate is kept in.
    pub secret: String,
    /// The names (DNS names or IP addresses) a generated certificate is for: the
    /// webhook Service's DNS names.
    pub hosts: Vec<String>,
    /// The MutatingWebhookConfiguration whose `caBundle` kaccel keeps set to
    /// its generated CA.
    pub configuration_name: String,
}

impl Default for Webhook {
    fn default() -> Self {
        Webhook {
            enabled: false,
            address: "0.0.0.0:9443".parse().expect("valid address"),
            cert_dir: String::new(),
            secret: "kaccel-system/kaccel-webhook-tls".into(),
            hosts: vec![
                "kaccel-webhook.kaccel-system.svc".into(),
                "kaccel-webhook.kaccel-system.svc.cluster.local".into(),
            ],
            configuration_name: "kaccel-pod-accelerator".into(),
        }
    }
}

impl Webhook {
    /// The Secret of a generated certificate: (namespace, name).
    pub fn secret_ref(&self) -> Option<(&str, &str)> {
        self.secret.split_once('/')
    }
}

/// Where kaccel reads Kueue's own manager Configuration, to check that Kueue
/// counts the DeviceClasses kaccel writes (only read while ResourceSlices are).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct KueueSettings {
    /// `NAMESPACE/NAME` of the ConfigMap Kueue's install mounts as its config
    /// (empty: none). Needs get/list/watch on ConfigMaps there (manifests/role.yaml).
    pub config_map: String,
    /// The key of that ConfigMap holding the Configuration document.
    pub config_map_key: String,
    /// A path to the Configuration file Kueue is started with; wins over
    /// `configMap` (re-read every reconcile).
    pub config_file: String,
    /// Kueue gets its DRA gate from `--feature-gates` on its command line, which
    /// kaccel cannot see: do not ask for it in the Configuration.
    pub dra_gate_on_command_line: bool,
}

impl Default for KueueSettings {
    fn default() -> Self {
        KueueSettings {
            config_map: "kueue-system/kueue-manager-config".into(),
            config_map_key: crate::kueue::config::CONFIG_MAP_KEY.into(),
            config_file: String::new(),
            dra_gate_on_command_line: false,
        }
    }
}

impl KueueSettings {
    /// The ConfigMap to watch: (namespace, name), when one is read.
    pub fn config_map_ref(&self) -> Option<(&str, &str)> {
        if !self.config_file.is_empty() {
            return None;
        }
        self.config_map.split_once('/')
    }
}

/// The credit ledger and its Kueue AdmissionCheck.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Ledger {
    /// Charge credits: every generated ClusterQueue references the AdmissionCheck
    /// below and kaccel answers it. Off by default: a check nobody answers would
    /// block all admission.
    pub enabled: bool,
    /// `sqlite:PATH` (default, one file) or `postgres://USER@HOST:PORT/DB`. The
    /// environment variable `KACCEL_LEDGER_STORE` wins, so a password can come
    /// from a Secret instead of this file.
    pub store: String,
    /// Name of the AdmissionCheck kaccel creates and every ClusterQueue references
    /// (empty: `<instance>-credits`).
    #[serde(default)]
    pub admission_check_name: String,
    /// `spec.controllerName` of that AdmissionCheck (empty: `kaccel.io/credits`,
    /// for another instance `kaccel.io/credits-<instance>`).
    #[serde(default)]
    pub controller_name: String,
    /// The finalizer on a charged Workload, so its final post happens even if
    /// kaccel was down when it finished or was deleted. Derived from the
    /// instance, never set by hand (a change would strand every charged
    /// Workload's finalizer).
    #[serde(skip)]
    pub finalizer: String,
    /// Usage of running work is posted at this interval (and at the end).
    pub post_interval_seconds: u64,
    /// Reservation horizon for Workloads without `spec.maximumExecutionTimeSeconds`
    /// when their budget sets no `spec.admission.defaultHorizonSeconds`.
    pub default_horizon_seconds: u64,
    /// Grants, budget status, exhaustion and the reconciliation against Kueue run
    /// at this interval.
    pub budget_interval_seconds: u64,
    /// A Workload waiting for credits is looked at again after this long; with the
    /// budget policy `Retry` it is also Kueue's `requeueAfterSeconds`.
    pub retry_after_seconds: u32,
}

impl Default for Ledger {
    fn default() -> Self {
        Ledger {
            enabled: false,
            store: "sqlite:/var/lib/kaccel/ledger.db".into(),
            admission_check_name: String::new(),
            controller_name: String::new(),
            finalizer: String::new(),
            post_interval_seconds: 3600,
            default_horizon_seconds: 3600,
            budget_interval_seconds: 10,
            retry_after_seconds: 15,
        }
    }
}

impl Ledger {
    /// The store URL in force (`KACCEL_LEDGER_STORE` wins over the file).
    pub fn store_url(&self) -> String {
        std::env::var("KACCEL_LEDGER_STORE")
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| self.store.clone())
    }
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

/// One vendor exporter kind read from one place, on its own interval: exactly one
/// of `url` (one exporter's /metrics), `prometheus` (a Prometheus server that
/// scrapes the exporters) or `pods` (the exporter pods found by a label selector).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthSource {
    /// Unique; no `/` (per-node states are named `<name>/<node>`).
    pub name: String,
    /// Which exporter's metrics (mapping in src/health/exporters/vendors.rs).
    pub kind: ExporterKind,
    /// `http://host:port/metrics` of one exporter.
    #[serde(default)]
    pub url: Option<String>,
    /// The exporter's series, read through a Prometheus query API.
    #[serde(default)]
    pub prometheus: Option<PrometheusSource>,
    /// Every exporter pod matching a label selector, scraped one by one.
    #[serde(default)]
    pub pods: Option<PodsSource>,
    /// With `url` only: the node whose devices it reports; wins over the exporter's
    /// hostname label.
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default = "default_interval")]
    pub interval_seconds: u64,
    /// Readings older than this make the source's devices Unknown.
    #[serde(default = "default_stale_after")]
    pub stale_after_seconds: i64,
    /// The whole answer (headers and body) must arrive within this: a hung or
    /// dribbling exporter is cut here and its devices are Unknown.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u64,
    /// Answers longer than this are cut off unread and the source's devices are
    /// Unknown (default and most: 64 MiB, the parser's own limit).
    #[serde(default = "default_max_response_bytes")]
    pub max_response_bytes: usize,
}

/// Where a source reads from (exactly one, checked by [`Config::load`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum SourceEndpoint<'a> {
    Url(&'a str),
    Prometheus(&'a PrometheusSource),
    Pods(&'a PodsSource),
}

impl HealthSource {
    /// The one endpoint form set; None when the source has none or several.
    pub fn endpoint(&self) -> Option<SourceEndpoint<'_>> {
        match (&self.url, &self.prometheus, &self.pods) {
            (Some(u), None, None) => Some(SourceEndpoint::Url(u)),
            (None, Some(p), None) => Some(SourceEndpoint::Prometheus(p)),
            (None, None, Some(p)) => Some(SourceEndpoint::Pods(p)),
            _ => None,
        }
    }
}

/// A Prometheus server that already scrapes the exporter: one instant query per
/// poll, `{__name__=~"<the mapping's metrics>",<selector>}[<staleAfterSeconds>s]`
/// (src/health/promql.rs).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrometheusSource {
    /// Base URL of the query API, e.g. `http://prometheus.monitoring:9090`.
    pub url: String,
    /// Label matchers that pick this exporter's series, e.g. `{job="dcgm-exporter"}`.
    #[serde(default)]
    pub selector: String,
    /// Label that names a series' node. Default: the exporter's hostname label
    /// (dcgm-exporter `Hostname`, AMD `hostname`); required for Ascend and Gaudi.
    #[serde(default)]
    pub node_label: Option<String>,
}

impl PrometheusSource {
    pub fn node_label(&self, kind: ExporterKind) -> Option<&str> {
        self.node_label
            .as_deref()
            .or(crate::health::promql::default_node_label(kind))
    }
}

/// Exporter pods discovered by label selector, listed every interval; each
/// scheduled pod's node gets its own state (`<source>/<node>`).
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PodsSource {
    pub namespace: String,
    /// A label selector, e.g. `app=nvidia-dcgm-exporter`.
    pub selector: String,
    pub port: u16,
    #[serde(default = "default_metrics_path")]
    pub path: String,
}

fn default_metrics_path() -> String {
    "/metrics".into()
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

fn default_max_response_bytes() -> usize {
    crate::health::prom::MAX_BODY_BYTES
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct LeaderElection {
    pub enabled: bool,
    /// Empty: `<instance>-controller`.
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
    /// Kueue Topology objects and flavors' `topologyName` where nodes carry
    /// topology labels (Kueue's Topology Aware Scheduling).
    pub topology_aware_scheduling: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            instance: crate::k8s::instance::DEFAULT_INSTANCE.into(),
            field_manager: String::new(),
            root_cohort: String::new(),
            quiet_ms: 2,
            debounce_ms: 250,
            max_delay_ms: 2000,
            resync_seconds: 300,
            http_address: "0.0.0.0:8080".parse().expect("valid address"),
            leader_election: LeaderElection::default(),
            planner: Planner::default(),
            watch_resource_slices: true,
            health: Health::default(),
            ledger: Ledger::default(),
            kueue: KueueSettings::default(),
            webhook: Webhook::default(),
            multi_kueue: MultiKueue::default(),
        }
        .with_instance_names()
    }
}

impl Default for LeaderElection {
    fn default() -> Self {
        LeaderElection {
            enabled: true,
            lease_name: String::new(),
            lease_namespace: "kaccel-system".into(),
            lease_duration_seconds: 15,
            renew_grace_seconds: 10,
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
            topology_aware_scheduling: defaults.topology_aware_scheduling,
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
        let config = config.with_instance_names();
        config.validate(&shown)?;
        Ok(config)
    }

    /// Fills every name left empty with the one derived from `instance`.
    pub fn with_instance_names(mut self) -> Config {
        use crate::k8s::instance;
        let name = self.instance.clone();
        let fill = |field: &mut String, derived: String| {
            if field.is_empty() {
                *field = derived;
            }
        };
        fill(&mut self.field_manager, name.clone());
        fill(&mut self.root_cohort, name.clone());
        fill(
            &mut self.leader_election.lease_name,
            instance::lease_name(&name),
        );
        fill(
            &mut self.ledger.admission_check_name,
            instance::admission_check_name(&name),
        );
        fill(
            &mut self.ledger.controller_name,
            instance::credits_controller_name(&name),
        );
        self.ledger.finalizer = instance::credits_finalizer(&name);
        fill(
            &mut self.multi_kueue.admission_check_name,
            format!("{name}-multikueue"),
        );
        self
    }

    pub fn plan_options(&self) -> PlanOptions {
        PlanOptions {
            instance: self.instance.clone(),
            root_cohort: self.root_cohort.clone(),
            unknown_counts_as_capacity: self.planner.unknown_counts_as_capacity,
            demote_warning_percent: self.planner.demote_warning_percent,
            queueing_strategy: self.planner.queueing_strategy.clone(),
            topology_aware_scheduling: self.planner.topology_aware_scheduling,
            admission_check: self
                .ledger
                .enabled
                .then(|| self.ledger.admission_check_name.clone()),
            multikueue_check: self
                .multi_kueue
                .enabled()
                .then(|| self.multi_kueue.admission_check_name.clone()),
            ..PlanOptions::default()
        }
    }

    pub fn debounce(&self) -> Duration {
        Duration::from_millis(self.debounce_ms)
    }

    pub fn quiet(&self) -> Duration {
        Duration::from_millis(self.quiet_ms)
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
    fn another_instance_derives_its_own_names_unless_set() {
        let c = load_text("instance", "instance: kaccel-b\n").unwrap();
        assert_eq!(c.field_manager, "kaccel-b");
        assert_eq!(c.root_cohort, "kaccel-b");
        assert_eq!(c.leader_election.lease_name, "kaccel-b-controller");
        assert_eq!(c.ledger.admission_check_name, "kaccel-b-credits");
        assert_eq!(c.ledger.controller_name, "kaccel.io/credits-kaccel-b");
        assert_eq!(c.ledger.finalizer, "kaccel.io/credits-kaccel-b");
        assert_eq!(c.plan_options().instance, "kaccel-b");
        // Sections present but without the names derive them too; a name set
        // by hand wins.
        let c = load_text(
            "instance-set",
            "instance: kaccel-b\nrootCohort: org\nleaderElection:\n  enabled: true\nledger:\n  enabled: true\n  admissionCheckName: team-b-check\n",
        )
        .unwrap();
        assert_eq!(c.root_cohort, "org");
        assert_eq!(c.leader_election.lease_name, "kaccel-b-controller");
        assert_eq!(c.ledger.admission_check_name, "team-b-check");
        assert_eq!(c.ledger.finalizer, "kaccel.io/credits-kaccel-b");
        assert_eq!(
            c.plan_options().admission_check.as_deref(),
            Some("team-b-check")
        );
    }

    pub(super) fn load_text(name: &str, text: &str) -> Result<Config, ConfigError> {
        let dir = std::env::temp_dir().join(format!("kaccel-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{name}.yaml"));
        std::fs::write(&path, text).unwrap();
        Config::load(Some(&path))
    }

    pub(super) fn sources(items: &str) -> String {
        format!("health:\n  sources:\n{items}")
    }

    #[test]
    fn the_three_source_forms_load() {
        let c = load_text(
            "forms",
            &sources(concat!(
                "    - {name: one, kind: dcgm-exporter, url: \"http://10.0.0.5:9400/metrics\", node: n1}\n",
                "    - name: prom\n",
                "      kind: dcgm-exporter\n",
                "      prometheus: {url: \"http://prometheus:9090\", selector: '{job=\"dcgm-exporter\"}'}\n",
                "    - name: prom-npu\n",
                "      kind: ascend-npu-exporter\n",
                "      prometheus: {url: \"http://prometheus:9090\", nodeLabel: kubernetes_node}\n",
                "    - name: pods\n",
                "      kind: dcgm-exporter\n",
                "      pods: {namespace: gpu-operator, selector: app=nvidia-dcgm-exporter, port: 9400}\n",
            )),
        )
        .unwrap();
        let s = &c.health.sources;
        assert_eq!(
            s[0].endpoint(),
            Some(SourceEndpoint::Url("http://10.0.0.5:9400/metrics"))
        );
        let Some(SourceEndpoint::Prometheus(p)) = s[1].endpoint() else {
            panic!("{:?}", s[1]);
        };
        assert_eq!(p.selector, "{job=\"dcgm-exporter\"}");
        assert_eq!(p.node_label(s[1].kind), Some("Hostname"), "dcgm default");
        let Some(SourceEndpoint::Prometheus(p)) = s[2].endpoint() else {
            panic!("{:?}", s[2]);
        };
        assert_eq!(p.node_label(s[2].kind), Some("kubernetes_node"));
        let Some(SourceEndpoint::Pods(p)) = s[3].endpoint() else {
            panic!("{:?}", s[3]);
        };
        assert_eq!((p.port, p.path.as_str()), (9400, "/metrics"));
    }

    #[test]
    fn plan_options_carry_the_planner_settings_and_the_check_only_with_the_ledger() {
        let mut config = Config {
            root_cohort: "org".into(),
            planner: Planner {
                unknown_counts_as_capacity: !Planner::default().unknown_counts_as_capacity,
                demote_warning_percent: 40,
                queueing_strategy: "StrictFIFO".into(),
                topology_aware_scheduling: false,
            },
            ..Config::default()
        };
        let options = config.plan_options();
        assert_eq!(options.root_cohort, "org");
        assert_eq!(
            options.unknown_counts_as_capacity,
            config.planner.unknown_counts_as_capacity
        );
        assert_eq!(options.demote_warning_percent, 40);
        assert_eq!(options.queueing_strategy, "StrictFIFO");
        assert!(!options.topology_aware_scheduling);
        assert_eq!(options.admission_check, None, "nobody would answer it");
        config.ledger.enabled = true;
        config.ledger.admission_check_name = "credits".into();
        assert_eq!(
            config.plan_options().admission_check.as_deref(),
            Some("credits")
        );
    }

    #[test]
    fn timings_are_durations_and_a_zero_resync_still_ticks() {
        let config = Config {
            debounce_ms: 250,
            max_delay_ms: 2000,
            resync_seconds: 0,
            ..Config::default()
        };
        assert_eq!(config.debounce(), Duration::from_millis(250));
        assert_eq!(config.max_delay(), Duration::from_secs(2));
        assert_eq!(config.resync(), Duration::from_secs(1));
        assert_eq!(Config::default().resync(), Duration::from_secs(300));
    }
}
