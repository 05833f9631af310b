//! The part of Kueue's own manager Configuration (`config.kueue.x-k8s.io`, v1beta1
//! and v1beta2 alike) that decides whether Kueue counts DRA devices: its feature
//! gates and `resources.deviceClassMappings`. kaccel never writes it (it is
//! Kueue's, and Kueue reads it only when it starts); it reads it to tell the
//! platform team what is missing, and prints the snippet to add.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Kueue v0.17's gate for counting ResourceClaimTemplates (alpha, off by default).
pub const DRA_GATE_V017: &str = "DynamicResourceAllocation";
/// Its name from Kueue v0.18 on (beta, on by default there).
pub const DRA_GATE_V018: &str = "KueueDRAIntegration";
/// Kueue v0.17 accepts at most this many mappings (`validateDeviceClassMappings`).
pub const MAX_DEVICE_CLASS_MAPPINGS: usize = 16;
/// ... and at most this many DeviceClasses in one mapping.
pub const MAX_DEVICE_CLASSES_PER_MAPPING: usize = 8;
/// The ConfigMap key Kueue's install manifests mount as its config file.
pub const CONFIG_MAP_KEY: &str = "controller_manager_config.yaml";

/// The fields kaccel reads; everything else in the document is ignored.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Configuration {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub feature_gates: BTreeMap<String, bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Resources>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Resources {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_class_mappings: Vec<DeviceClassMapping>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transformations: Vec<ResourceTransformation>,
}

/// One `resources.transformations[]` entry: Kueue counts each unit of `input` a
/// pod requests as `outputs` (per unit) too, and with strategy `Retain` (the
/// default) keeps counting `input` itself. Applied to every Workload of the
/// cluster, before flavor assignment, and read only when Kueue starts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceTransformation {
    pub input: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<String>,
    /// Output resource -> quantity per unit of input (a Kubernetes quantity).
    #[serde(default)]
    pub outputs: BTreeMap<String, serde_json::Value>,
}

/// Kueue's strategy that keeps counting a transformation's input (its default).
pub const RETAIN: &str = "Retain";

impl ResourceTransformation {
    /// Whether Kueue keeps counting the input and counts one `output` per unit of
    /// it: what makes a quota of `output` bound the devices asked for by either name.
    pub fn retains_one_per_unit(&self, output: &str) -> bool {
        let retained = self.strategy.as_deref().unwrap_or(RETAIN) == RETAIN;
        let one = match self.outputs.get(output) {
            Some(serde_json::Value::String(q)) => q == "1",
            Some(serde_json::Value::Number(n)) => n.as_u64() == Some(1),
            _ => false,
        };
        retained && one
    }
}

/// One logical quota resource and the DeviceClasses whose claims count as it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeviceClassMapping {
    pub name: String,
    pub device_class_names: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
#[error("{source_name} is not a Kueue Configuration: {reason}")]
pub struct ConfigError {
    pub source_name: String,
    pub reason: String,
}

impl Configuration {
    /// Reads the YAML document Kueue reads (`--config`, or the ConfigMap key).
    pub fn parse(source_name: &str, yaml: &str) -> Result<Self, ConfigError> {
        serde_yaml::from_str::<Option<Self>>(yaml)
            .map(Option::unwrap_or_default)
            .map_err(|e| ConfigError {
                source_name: source_name.to_string(),
                reason: e.to_string(),
            })
    }

    /// Whether the document turns on DRA counting. An unset gate counts as off:
    /// that is Kueue v0.17's default (v0.18's renamed gate is on by default, but
    /// kaccel cannot see which Kueue reads the file, so it asks for it to be set).
    pub fn dra_gate_enabled(&self) -> bool {
        [DRA_GATE_V017, DRA_GATE_V018]
            .iter()
            .any(|g| self.feature_gates.get(*g) == Some(&true))
    }

    /// Input resource -> its transformation (Kueue refuses a configuration that
    /// lists one input twice).
    pub fn transformations(&self) -> BTreeMap<&str, &ResourceTransformation> {
        self.resources
            .iter()
            .flat_map(|r| &r.transformations)
            .map(|t| (t.input.as_str(), t))
            .collect()
    }

    /// DeviceClass name -> the logical resource it is counted as.
    pub fn device_class_mappings(&self) -> BTreeMap<&str, &str> {
        self.resources
            .iter()
            .flat_map(|r| &r.device_class_mappings)
            .flat_map(|m| {
                m.device_class_names
                    .iter()
                    .map(move |c| (c.as_str(), m.name.as_str()))
            })
            .collect()
    }
}

/// What the running controller read of Kueue's configuration, for the planner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedConfiguration {
    /// Where it was read (`ConfigMap kueue-system/kueue-manager-config`, a path).
    pub source: String,
    /// The configuration, or why it could not be read.
    pub read: Result<Configuration, String>,
    /// The DRA gate is set on Kueue's command line (`--feature-gates`), which
    /// kaccel cannot see: do not ask for it in the file.
    pub gate_on_command_line: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_gates_and_mappings_of_a_kueue_v017_configuration() {
        // The shape of Kueue v0.17's test/e2e/config/dra controller_manager_config.yaml.
        let yaml = r#"
apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: kueue-system
health:
  healthProbeBindAddress: :8081
featureGates:
  DynamicResourceAllocation: true
resources:
  excludeResourcePrefixes: []
  deviceClassMappings:
  - name: foo
    deviceClassNames:
    - foo.example.com
    - bar.example.com
"#;
        let c = Configuration::parse("test", yaml).unwrap();
        assert!(c.dra_gate_enabled());
        let m = c.device_class_mappings();
        assert_eq!(m.get("foo.example.com"), Some(&"foo"));
        assert_eq!(m.get("bar.example.com"), Some(&"foo"));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn an_unset_or_false_gate_is_off_and_an_empty_document_is_an_empty_configuration() {
        let c =
            Configuration::parse("test", "featureGates:\n  KueueDRAIntegration: false\n").unwrap();
        assert!(!c.dra_gate_enabled());
        assert!(
            !Configuration::parse("t", "kind: Configuration\n")
                .unwrap()
                .dra_gate_enabled()
        );
        assert!(
            Configuration::parse("t", "")
                .unwrap()
                .device_class_mappings()
                .is_empty()
        );
        assert!(
            Configuration::parse("t", "featureGates:\n  KueueDRAIntegration: true\n")
                .unwrap()
                .dra_gate_enabled()
        );
    }

    #[test]
    fn reads_transformations_and_tells_a_retained_one_per_unit_count_from_others() {
        // The shape of Kueue v0.17's configuration_types.go (resources.transformations).
        let yaml = r#"
resources:
  transformations:
  - input: nvidia.com/gpu
    strategy: Retain
    outputs:
      kaccel.io/accelerator: "1"
  - input: amd.com/gpu
    outputs:
      kaccel.io/accelerator: 1
  - input: habana.ai/gaudi
    strategy: Replace
    outputs:
      kaccel.io/accelerator: "1"
  - input: google.com/tpu
    outputs:
      kaccel.io/accelerator: "4"
"#;
        let c = Configuration::parse("t", yaml).unwrap();
        let t = c.transformations();
        assert_eq!(t.len(), 4);
        let counts = |input: &str| t[input].retains_one_per_unit("kaccel.io/accelerator");
        assert!(counts("nvidia.com/gpu"));
        assert!(counts("amd.com/gpu"), "Retain is the default strategy");
        assert!(
            !counts("habana.ai/gaudi"),
            "Replace stops counting the vendor resource"
        );
        assert!(
            !counts("google.com/tpu"),
            "four per unit is not one device, one count"
        );
        assert!(!t["nvidia.com/gpu"].retains_one_per_unit("example.com/other"));
    }

    #[test]
    fn a_malformed_document_names_its_source() {
        let e = Configuration::parse(
            "ConfigMap kueue-system/kueue-manager-config",
            "resources: [",
        )
        .unwrap_err();
        assert!(e.to_string().starts_with(
            "ConfigMap kueue-system/kueue-manager-config is not a Kueue Configuration"
        ));
        let e = Configuration::parse("f", "resources:\n  deviceClassMappings:\n  - name: x\n")
            .unwrap_err();
        assert!(e.to_string().contains("deviceClassNames"), "{e}");
    }
}
