//! The rules a loaded configuration must satisfy, each naming its field and the fix.

use super::{Config, ConfigError, HealthSource};

/// One source's own rules: (field, message) for the first one broken.
fn validate_source(source: &HealthSource) -> Result<(), (&'static str, String)> {
    let err = |field, message: &str| Err((field, message.to_string()));
    if source.name.is_empty() || source.name.contains('/') {
        return err(
            "health.sources[].name",
            "must be non-empty and without `/` (per-node states are named <name>/<node>)",
        );
    }
    let set: Vec<&str> = [
        ("url", source.url.is_some()),
        ("prometheus", source.prometheus.is_some()),
        ("pods", source.pods.is_some()),
    ]
    .iter()
    .filter(|(_, on)| *on)
    .map(|(f, _)| *f)
    .collect();
    match set.as_slice() {
        [] => {
            return err(
                "health.sources[].url",
                "needs exactly one of url, prometheus or pods; it has none",
            );
        }
        [_] => {}
        [first, second, ..] => {
            let field = match *second {
                "prometheus" => "health.sources[].prometheus",
                _ => "health.sources[].pods",
            };
            return Err((
                field,
                format!(
                    "needs exactly one of url, prometheus or pods; it has {first} and {second}"
                ),
            ));
        }
    }
    if source.node.is_some() && source.url.is_none() {
        return err(
            "health.sources[].node",
            "only with url: prometheus and pods sources read each device's node",
        );
    }
    if let Some(url) = &source.url
        && !url.starts_with("http://")
    {
        return err(
            "health.sources[].url",
            "must be an http:// URL, e.g. http://10.0.0.5:9400/metrics",
        );
    }
    if let Some(p) = &source.prometheus {
        if !p.url.starts_with("http://") || p.url.contains(['?', '#']) || p.url.len() <= 7 {
            return err(
                "health.sources[].prometheus.url",
                "must be the http:// base URL of the query API, e.g. http://prometheus.monitoring:9090",
            );
        }
        if let Err(e) = crate::health::promql::selector_matchers(&p.selector) {
            return Err(("health.sources[].prometheus.selector", e));
        }
        match p.node_label(source.kind) {
            None => {
                return err(
                    "health.sources[].prometheus.nodeLabel",
                    "required for this exporter kind (it has no hostname label), e.g. kubernetes_node",
                );
            }
            Some(l) if !valid_label_name(l) => {
                return err(
                    "health.sources[].prometheus.nodeLabel",
                    "must be a Prometheus label name, e.g. Hostname or kubernetes_node",
                );
            }
            Some(_) => {}
        }
    }
    if let Some(p) = &source.pods {
        if p.namespace.is_empty() || !crate::k8s::names::valid_dns_subdomain(&p.namespace) {
            return err(
                "health.sources[].pods.namespace",
                "must be a namespace name, e.g. gpu-operator",
            );
        }
        if p.selector.trim().is_empty() {
            return err(
                "health.sources[].pods.selector",
                "must be a label selector, e.g. app=nvidia-dcgm-exporter",
            );
        }
        if p.port == 0 {
            return err("health.sources[].pods.port", "must be 1..65535");
        }
        if !p.path.starts_with('/') || p.path.contains(['?', '#', ' ']) {
            return err(
                "health.sources[].pods.path",
                "must be a URL path, e.g. /metrics",
            );
        }
    }
    if source.interval_seconds == 0 || source.timeout_seconds == 0 {
        return err(
            "health.sources[].intervalSeconds",
            "intervalSeconds and timeoutSeconds must be at least 1",
        );
    }
    if !(1024..=crate::health::prom::MAX_BODY_BYTES).contains(&source.max_response_bytes) {
        return err(
            "health.sources[].maxResponseBytes",
            "must be 1024..67108864 (64 MiB); an exporter of 8 GPUs answers about 100 KiB",
        );
    }
    if source.stale_after_seconds < source.interval_seconds as i64 {
        return err(
            "health.sources[].staleAfterSeconds",
            "must be at least intervalSeconds, or every source would always be stale",
        );
    }
    Ok(())
}

fn valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl Config {
    pub(super) fn validate(&self, path: &str) -> Result<(), ConfigError> {
        let invalid = |field, message: &str| ConfigError::Invalid {
            path: path.to_string(),
            field,
            message: message.to_string(),
        };
        if !crate::k8s::instance::valid_instance(&self.instance) {
            return Err(invalid(
                "instance",
                "must be a DNS label (lower-case letters, digits and '-') of at most 40 characters, e.g. kaccel or kaccel-team-b",
            ));
        }
        if !crate::k8s::names::valid_dns_subdomain(&self.root_cohort) {
            return Err(invalid(
                "rootCohort",
                "must be a DNS subdomain, e.g. kaccel",
            ));
        }
        if self.max_delay_ms < self.debounce_ms {
            return Err(invalid("maxDelayMs", "must be at least debounceMs"));
        }
        if self.max_delay_ms < self.quiet_ms {
            return Err(invalid("maxDelayMs", "must be at least quietMs"));
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
            validate_source(source).map_err(|(field, message)| ConfigError::Invalid {
                path: path.to_string(),
                field,
                message: format!("source {:?}: {message}", source.name),
            })?;
        }
        let mut rule_names = std::collections::BTreeSet::new();
        for rule in &self.health.policy.trend_rules {
            if !rule_names.insert(rule.name.as_str()) {
                return Err(invalid(
                    "health.policy.trendRules[].name",
                    &format!("rule names must be unique; {:?} is used twice", rule.name),
                ));
            }
            if let Some((field, message)) = rule.problem() {
                let field = match field {
                    "name" => "health.policy.trendRules[].name",
                    "function" => "health.policy.trendRules[].function",
                    "above" => "health.policy.trendRules[].above",
                    "windowSeconds" => "health.policy.trendRules[].windowSeconds",
                    "threshold" => "health.policy.trendRules[].threshold",
                    _ => "health.policy.trendRules[].status",
                };
                return Err(invalid(field, &message));
            }
        }
        if self.health.actions.max_share_percent > 100 {
            return Err(invalid("health.actions.maxSharePercent", "must be 0..100"));
        }
        if self.planner.demote_warning_percent > 100 {
            return Err(invalid("planner.demoteWarningPercent", "must be 0..100"));
        }
        let multi_kueue = &self.multi_kueue;
        let mut workers = std::collections::BTreeSet::new();
        for worker in &multi_kueue.workers {
            if !crate::k8s::names::valid_dns_label(&worker.name) {
                return Err(invalid(
                    "multiKueue.workers[].name",
                    &format!(
                        "{:?} must be a DNS label (lower-case letters, digits and '-'), e.g. worker-eu-1",
                        worker.name
                    ),
                ));
            }
            if !workers.insert(worker.name.as_str()) {
                return Err(invalid(
                    "multiKueue.workers[].name",
                    &format!("names must be unique; {:?} is listed twice", worker.name),
                ));
            }
            if !crate::k8s::names::valid_dns_subdomain(&worker.kubeconfig_secret) {
                return Err(invalid(
                    "multiKueue.workers[].kubeconfigSecret",
                    &format!(
                        "worker {:?}: must name a Secret in multiKueue.kueueNamespace (a DNS subdomain), e.g. {}-kubeconfig",
                        worker.name, worker.name
                    ),
                ));
            }
        }
        if multi_kueue.workers.len() > 20 {
            return Err(invalid(
                "multiKueue.workers",
                "Kueue's MultiKueueConfig takes at most 20 clusters",
            ));
        }
        if !crate::k8s::names::valid_dns_label(&multi_kueue.kueue_namespace) {
            return Err(invalid(
                "multiKueue.kueueNamespace",
                "must be a namespace name, e.g. kueue-system",
            ));
        }
        if !crate::k8s::names::valid_dns_subdomain(&multi_kueue.admission_check_name) {
            return Err(invalid(
                "multiKueue.admissionCheckName",
                "must be a DNS subdomain, e.g. kaccel-multikueue",
            ));
        }
        let ledger = &self.ledger;
        if !crate::k8s::names::valid_dns_subdomain(&ledger.admission_check_name) {
            return Err(invalid(
                "ledger.admissionCheckName",
                "must be a DNS subdomain, e.g. kaccel-credits",
            ));
        }
        if ledger.controller_name.is_empty() || !ledger.controller_name.contains('/') {
            return Err(invalid(
                "ledger.controllerName",
                "must be a domain-prefixed path, e.g. kaccel.io/credits",
            ));
        }
        if ledger.post_interval_seconds < 60 {
            return Err(invalid(
                "ledger.postIntervalSeconds",
                "must be at least 60 (one post per interval per running workload)",
            ));
        }
        if ledger.default_horizon_seconds == 0 {
            return Err(invalid(
                "ledger.defaultHorizonSeconds",
                "must be positive, e.g. 3600",
            ));
        }
        if ledger.budget_interval_seconds == 0 || ledger.retry_after_seconds == 0 {
            return Err(invalid(
                "ledger.budgetIntervalSeconds",
                "ledger.budgetIntervalSeconds and ledger.retryAfterSeconds must be positive",
            ));
        }
        let kueue = &self.kueue;
        if kueue.config_file.is_empty() && !kueue.config_map.is_empty() {
            let valid = kueue.config_map.split_once('/').is_some_and(|(ns, name)| {
                crate::k8s::names::valid_dns_subdomain(ns)
                    && crate::k8s::names::valid_dns_subdomain(name)
            });
            if !valid {
                return Err(invalid(
                    "kueue.configMap",
                    "must be NAMESPACE/NAME, e.g. kueue-system/kueue-manager-config (or empty to read none)",
                ));
            }
            if kueue.config_map_key.is_empty() {
                return Err(invalid(
                    "kueue.configMapKey",
                    "must name the key holding Kueue's Configuration, e.g. controller_manager_config.yaml",
                ));
            }
        }
        let url = ledger.store_url();
        let sqlite_path = url
            .strip_prefix("sqlite:")
            .map(|p| p.trim_start_matches("//"));
        let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
        if !(postgres || sqlite_path.is_some_and(|p| !p.is_empty())) {
            return Err(invalid(
                "ledger.store",
                "must be sqlite:PATH (a file) or postgres://USER@HOST:PORT/DB",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{load_text, sources};
    use super::*;

    #[test]
    fn bad_sources_name_the_field() {
        let cases = [
            (
                "    - {name: a, kind: dcgm-exporter}\n",
                "health.sources[].url",
                "has none",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", prometheus: {url: \"http://p:9090\"}}\n",
                "health.sources[].prometheus",
                "has url and prometheus",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", pods: {namespace: n, selector: a=b, port: 1}}\n",
                "health.sources[].pods",
                "has url and pods",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, node: n, prometheus: {url: \"http://p:9090\"}}\n",
                "health.sources[].node",
                "only with url",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, prometheus: {url: \"https://p:9090\"}}\n",
                "health.sources[].prometheus.url",
                "http://",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, prometheus: {url: \"http://p:9090\", selector: 'job=\"x\"'}}\n",
                "health.sources[].prometheus.selector",
                "braces",
            ),
            (
                "    - {name: a, kind: gaudi-exporter, prometheus: {url: \"http://p:9090\"}}\n",
                "health.sources[].prometheus.nodeLabel",
                "required",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, prometheus: {url: \"http://p:9090\", nodeLabel: \"k8s-node\"}}\n",
                "health.sources[].prometheus.nodeLabel",
                "label name",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, pods: {namespace: gpu-operator, selector: \"\", port: 9400}}\n",
                "health.sources[].pods.selector",
                "label selector",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, pods: {namespace: gpu-operator, selector: a=b, port: 0}}\n",
                "health.sources[].pods.port",
                "1..65535",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, pods: {namespace: gpu-operator, selector: a=b, port: 9400, path: metrics}}\n",
                "health.sources[].pods.path",
                "URL path",
            ),
            (
                "    - {name: a/b, kind: dcgm-exporter, url: \"http://x:1/metrics\"}\n",
                "health.sources[].name",
                "without `/`",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, pods: {namespace: gpu-operator, selector: a=b, port: 9400, typo: 1}}\n",
                "typo",
                "unknown field",
            ),
        ];
        for (i, (items, field, message)) in cases.iter().enumerate() {
            let err = load_text(&format!("src{i}"), &sources(items))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{items}: {err}");
            assert!(err.contains(message), "{items}: {err}");
        }
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

    #[test]
    fn bad_settings_name_the_field() {
        let mut cases = vec![
            ("instance: Team_B\n", "instance", "must be a DNS label"),
            ("instance: \"\"\n", "instance", "must be a DNS label"),
            (
                "instance: a-very-long-installation-name-of-41-chars\n",
                "instance",
                "at most 40",
            ),
            ("rootCohort: Not_A_Name\n", "rootCohort", "DNS subdomain"),
            (
                "debounceMs: 500\nmaxDelayMs: 100\n",
                "maxDelayMs",
                "at least debounceMs",
            ),
            (
                "health:\n  actions:\n    maxSharePercent: 101\n",
                "health.actions.maxSharePercent",
                "0..100",
            ),
            (
                "health:\n  policy:\n    trendRules:\n      - {name: hot, signal: temperature, function: durationAbove, windowSeconds: 600, threshold: 300, status: Degraded}\n",
                "health.policy.trendRules[].above",
                "needs `above`",
            ),
            (
                "health:\n  policy:\n    trendRules:\n      - {name: ecc, signal: eccCorrectable, function: count, windowSeconds: 600, threshold: 3, status: Degraded}\n",
                "health.policy.trendRules[].function",
                "use one of increase, rate, latest",
            ),
            (
                "health:\n  policy:\n    trendRules:\n      - {name: a, signal: xid, function: count, windowSeconds: 60, threshold: 3, status: Failed}\n      - {name: a, signal: xid, function: count, windowSeconds: 60, threshold: 3, status: Failed}\n",
                "health.policy.trendRules[].name",
                "used twice",
            ),
            (
                "planner:\n  demoteWarningPercent: 101\n",
                "planner.demoteWarningPercent",
                "0..100",
            ),
            (
                "ledger:\n  admissionCheckName: Bad_Name\n",
                "ledger.admissionCheckName",
                "DNS subdomain",
            ),
            (
                "ledger:\n  controllerName: kaccel\n",
                "ledger.controllerName",
                "domain-prefixed",
            ),
            (
                "ledger:\n  postIntervalSeconds: 59\n",
                "ledger.postIntervalSeconds",
                "at least 60",
            ),
            (
                "ledger:\n  defaultHorizonSeconds: 0\n",
                "ledger.defaultHorizonSeconds",
                "must be positive",
            ),
            (
                "ledger:\n  retryAfterSeconds: 0\n",
                "ledger.budgetIntervalSeconds",
                "retryAfterSeconds must be positive",
            ),
            (
                "kueue:\n  configMap: kueue-manager-config\n",
                "kueue.configMap",
                "NAMESPACE/NAME",
            ),
            (
                "kueue:\n  configMapKey: \"\"\n",
                "kueue.configMapKey",
                "must name the key",
            ),
        ];
        // KACCEL_LEDGER_STORE wins over the file; only without it is the file's store checked.
        if std::env::var_os("KACCEL_LEDGER_STORE").is_none() {
            cases.push((
                "ledger:\n  store: \"mysql://db/kaccel\"\n",
                "ledger.store",
                "sqlite:PATH",
            ));
            cases.push((
                "ledger:\n  store: \"sqlite://\"\n",
                "ledger.store",
                "sqlite:PATH",
            ));
        }
        for (i, (text, field, message)) in cases.iter().enumerate() {
            let err = load_text(&format!("setting{i}"), text)
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{text}: {err}");
            assert!(err.contains(message), "{text}: {err}");
        }
        // The leader-election rule does not apply when it is off.
        let off = "leaderElection:\n  enabled: false\n  leaseDurationSeconds: 5\n  renewGraceSeconds: 5\n";
        assert!(load_text("le-off", off).is_ok());
    }

    #[test]
    fn more_bad_sources_name_the_field() {
        let cases = [
            (
                concat!(
                    "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\"}\n",
                    "    - {name: a, kind: dcgm-exporter, url: \"http://y:1/metrics\"}\n",
                ),
                "health.sources[].name",
                "unique",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"https://x:1/metrics\"}\n",
                "health.sources[].url",
                "http:// URL",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, pods: {namespace: Bad_NS, selector: a=b, port: 9400}}\n",
                "health.sources[].pods.namespace",
                "namespace name",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", intervalSeconds: 0}\n",
                "health.sources[].intervalSeconds",
                "at least 1",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", intervalSeconds: 60, staleAfterSeconds: 30}\n",
                "health.sources[].staleAfterSeconds",
                "at least intervalSeconds",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", maxResponseBytes: 100}\n",
                "health.sources[].maxResponseBytes",
                "1024..67108864",
            ),
            (
                "    - {name: a, kind: dcgm-exporter, url: \"http://x:1/metrics\", maxResponseBytes: 67108865}\n",
                "health.sources[].maxResponseBytes",
                "1024..67108864",
            ),
        ];
        for (i, (items, field, message)) in cases.iter().enumerate() {
            let err = load_text(&format!("more-src{i}"), &sources(items))
                .unwrap_err()
                .to_string();
            assert!(err.contains(field), "{items}: {err}");
            assert!(err.contains(message), "{items}: {err}");
        }
    }

    #[test]
    fn a_node_label_must_be_a_prometheus_label_name() {
        for good in ["Hostname", "kubernetes_node", "_node", "n1"] {
            assert!(valid_label_name(good), "{good}");
        }
        for bad in ["", "1node", "k8s-node", "node.name", "nöde"] {
            assert!(!valid_label_name(bad), "{bad}");
        }
    }
}
