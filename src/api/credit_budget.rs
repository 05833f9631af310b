use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A team's allowance: which AcceleratorClasses it may use, how many devices of
/// each it is guaranteed, and how many credits it may spend per period.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "kaccel.io",
    version = "v1alpha1",
    kind = "CreditBudget",
    plural = "creditbudgets",
    shortname = "cb",
    shortname = "budget",
    category = "kaccel",
    status = "CreditBudgetStatus",
    cel,
    printcolumn = r#"{"name":"Team","type":"string","jsonPath":".spec.team"}"#,
    printcolumn = r#"{"name":"Granted","type":"string","jsonPath":".status.granted"}"#,
    printcolumn = r#"{"name":"Reserved","type":"string","jsonPath":".status.reserved"}"#,
    printcolumn = r#"{"name":"Spent","type":"string","jsonPath":".status.spent"}"#,
    printcolumn = r#"{"name":"Remaining","type":"string","jsonPath":".status.remaining"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CreditBudgetSpec {
    /// The team this budget belongs to (a label value on everything kaccel creates for it).
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("spec.team must be a DNS label: lower-case letters, digits and '-', e.g. vision"))]
    pub team: String,

    /// Namespaces where the team's LocalQueues are created (one per class). A set:
    /// the API server rejects a repeated namespace.
    #[schemars(
        length(min = 1, max = 64),
        inner(
            length(min = 1, max = 63),
            regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
        )
    )]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(validation = Rule::new("size(self) > 0").message("spec.namespaces must list at least one namespace, e.g. [vision-research]"))]
    pub namespaces: Vec<String>,

    /// The AcceleratorClasses the team may use, keyed by name: the API server rejects
    /// a class named twice.
    #[schemars(length(min = 1, max = 32))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("size(self) > 0").message("spec.classes must name at least one AcceleratorClass the team may use"))]
    pub classes: Vec<ClassGrant>,

    pub credits: CreditAllowance,

    /// Fair-share weight among teams (decimal). Derived from credits per day when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,6}(\\\\.[0-9]{1,3})?$') && self.matches('[1-9]')").message("spec.fairShareWeight must be a positive decimal with at most 3 places, e.g. \"2\" or \"0.5\""))]
    pub fair_share_weight: Option<String>,

    /// What happens to new work when credits run out.
    #[serde(default)]
    pub on_exhaustion: ExhaustionPolicy,

    /// Whether the team may borrow idle capacity beyond its guarantees.
    #[serde(default = "default_true")]
    pub allow_borrowing: bool,
}

fn default_true() -> bool {
    true
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClassGrant {
    /// AcceleratorClass name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Devices of this class guaranteed to the team (nominal quota); 0 = borrow only.
    #[serde(default)]
    #[schemars(range(max = 1000000))]
    pub guaranteed_devices: u32,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreditAllowance {
    /// Credits granted each period, decimal with at most 6 places.
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,12}(\\\\.[0-9]{1,6})?$')").message("spec.credits.perPeriod must be a non-negative decimal with at most 6 places, e.g. \"5000\""))]
    pub per_period: String,
    pub period: Period,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Period {
    /// When the first period starts (RFC 3339).
    pub start: Time,
    /// Length of one period in days.
    #[schemars(range(min = 1, max = 366))]
    pub days: u32,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ExhaustionPolicy {
    /// Admitted work runs on; new work waits.
    #[default]
    Hold,
    /// New work waits and admitted work is evicted.
    HoldAndDrain,
}

impl ExhaustionPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ExhaustionPolicy::Hold => "Hold",
            ExhaustionPolicy::HoldAndDrain => "HoldAndDrain",
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreditBudgetStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Credits granted in the current period (decimal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub granted: Option<String>,
    /// Credits held by reservations of running work.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<String>,
    /// Credits spent (posted) in the current period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spent: Option<String>,
    /// granted - reserved - spent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining: Option<String>,
    /// Team cohort in Kueue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cohort: Option<String>,
    /// ClusterQueues kaccel manages for this budget (one per class).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cluster_queues: Vec<String>,
    /// LocalQueues, as `namespace/name`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_queues: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
