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

    /// How kaccel's AdmissionCheck treats Workloads the budget cannot cover.
    #[serde(default)]
    pub admission: AdmissionPolicy,
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
    /// One-off grants on top of `perPeriod`, keyed by name. Each is credited once,
    /// in the period current when kaccel first sees it, and expires with that
    /// period's unused credits. Top-ups are immutable: to give more, add another
    /// with a new name.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    #[x_kube(validation = Rule::new("self.all(t, self.exists_one(u, u.name == t.name))").message("spec.credits.topUps[].name must be unique: give each top-up its own name"))]
    pub top_ups: Vec<TopUp>,
}

/// A one-off grant of credits, applied to the current period.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TopUp {
    /// Name of the top-up (a DNS label), unique within the budget; it names the
    /// ledger entry, so it must never be reused for a different amount.
    #[schemars(length(min = 1, max = 63))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')").message("spec.credits.topUps[].name must be a DNS label: lower-case letters, digits and '-', e.g. q3-extra"))]
    pub name: String,
    /// Credits granted, a positive decimal with at most 6 places.
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,12}(\\\\.[0-9]{1,6})?$') && self.matches('[1-9]')").message("spec.credits.topUps[].credits must be a positive decimal with at most 6 places, e.g. \"200\"; to take credits away, lower perPeriod"))]
    pub credits: String,
    /// Why the top-up was given (shown in the ledger entry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 256))]
    pub reason: Option<String>,
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

/// How kaccel's AdmissionCheck treats a Workload the budget cannot cover.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.overdraftLimit) || (has(self.whenRenewalShort) && self.whenRenewalShort == 'Overdraft')").message("spec.admission.overdraftLimit applies only with spec.admission.whenRenewalShort: Overdraft: set both, or remove overdraftLimit"))]
#[x_kube(validation = Rule::new("!has(self.whenRenewalShort) || self.whenRenewalShort != 'Overdraft' || has(self.overdraftLimit)").message("spec.admission.whenRenewalShort: Overdraft needs spec.admission.overdraftLimit, the credits the budget may go below zero, e.g. \"500\""))]
pub struct AdmissionPolicy {
    /// What the AdmissionCheck does when remaining credits do not cover a Workload.
    #[serde(default)]
    pub when_short: ShortPolicy,
    /// Reservation horizon, in seconds, for Workloads without
    /// spec.maximumExecutionTimeSeconds (1 to 31536000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31536000))]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 31536000").message("spec.admission.defaultHorizonSeconds must be between 1 and 31536000 (one year), e.g. 86400"))]
    pub default_horizon_seconds: Option<u64>,
    /// Whether what a Workload ran is refunded (a Correction entry) when Kueue
    /// preempts it or kaccel's health checks evict it for platform reasons.
    #[serde(default)]
    pub refund_preemption: bool,
    /// What happens when a running Workload's reservation must be renewed (every
    /// horizon) and the remaining credits do not cover the next term: Stop (the
    /// Workload is deactivated through Kueue, with an Event naming the
    /// shortfall) or Overdraft (it runs on into a recorded overdraft, down to
    /// overdraftLimit below zero, then stops).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_renewal_short: Option<RenewalShortPolicy>,
    /// With whenRenewalShort: Overdraft, how many credits `remaining` may go below
    /// zero, a non-negative decimal with at most 6 places.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 20))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]{1,12}(\\\\.[0-9]{1,6})?$')").message("spec.admission.overdraftLimit must be a non-negative decimal number of credits with at most 6 places, e.g. \"500\""))]
    pub overdraft_limit: Option<String>,
}

/// What happens to a running Workload whose next reservation term the budget
/// cannot cover.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum RenewalShortPolicy {
    /// Deactivate the Workload through Kueue (spec.active=false), with an Event.
    #[default]
    Stop,
    /// Renew into an overdraft, down to spec.admission.overdraftLimit below zero.
    Overdraft,
}

/// What kaccel's AdmissionCheck does with a Workload the budget cannot cover.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ShortPolicy {
    /// The check stays Pending with a message; the Workload keeps its quota
    /// reservation and is admitted as soon as credits cover it.
    #[default]
    Pending,
    /// The check goes to Retry: Kueue releases the quota and requeues the Workload.
    Retry,
}

impl ShortPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            ShortPolicy::Pending => "Pending",
            ShortPolicy::Retry => "Retry",
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
    /// Credits spent per hour over the last 24 hours (decimal).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burn_rate_per_hour: Option<String>,
    /// When remaining credits reach zero at the current burn rate; unset when
    /// nothing is burning.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub projected_exhaustion: Option<Time>,
    /// Start of the current period.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_start: Option<Time>,
    /// End of the current period (exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub period_end: Option<Time>,
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

#[cfg(test)]
mod tests {
    //! The rules added for top-ups and admission, evaluated client-side with the
    //! CEL rules the CRD carries.

    use super::*;

    fn budget(extra_credits: &str, extra_spec: &str) -> CreditBudget {
        serde_yaml::from_str(&format!(
            "apiVersion: kaccel.io/v1alpha1\nkind: CreditBudget\nmetadata: {{name: b}}\nspec:\n  team: vision\n  namespaces: [a]\n  classes: [{{name: x}}]\n  credits: {{perPeriod: \"100\", period: {{start: \"2026-12-01T00:00:00Z\", days: 30}}{extra_credits}}}\n{extra_spec}"
        ))
        .expect("test YAML parses")
    }

    fn cel_error(b: &CreditBudget) -> String {
        match b.validate_cel() {
            Ok(()) => panic!("CEL accepted an invalid budget: {:?}", b.spec),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn defaults_and_valid_additions() {
        let b = budget("", "");
        assert!(b.spec.credits.top_ups.is_empty());
        assert_eq!(b.spec.admission, AdmissionPolicy::default());
        assert_eq!(b.spec.admission.when_short, ShortPolicy::Pending);
        assert!(!b.spec.admission.refund_preemption);
        let b = budget(
            ", topUps: [{name: q3-extra, credits: \"200.5\", reason: launch}, {name: b, credits: \"0.000001\"}]",
            "  admission: {whenShort: Retry, defaultHorizonSeconds: 86400, refundPreemption: true}",
        );
        b.validate_cel().unwrap();
        assert_eq!(b.spec.admission.when_short, ShortPolicy::Retry);
        assert_eq!(b.spec.admission.default_horizon_seconds, Some(86400));
        // Empty top-ups and a default admission policy are not written out.
        let json = serde_json::to_value(&budget("", "").spec).unwrap();
        assert!(json["credits"].get("topUps").is_none());
    }

    #[test]
    fn top_up_credits_must_be_positive() {
        for bad in ["-50", "0", "0.000", "1.2345678", "lots"] {
            let e = cel_error(&budget(
                &format!(", topUps: [{{name: extra, credits: \"{bad}\"}}]"),
                "",
            ));
            assert!(
                e.contains("spec.credits.topUps[].credits must be a positive decimal")
                    && e.contains("lower perPeriod"),
                "{bad}: {e}"
            );
        }
    }

    #[test]
    fn top_up_names_are_dns_labels_and_unique() {
        let e = cel_error(&budget(", topUps: [{name: Q3_Extra, credits: \"1\"}]", ""));
        assert!(
            e.contains("spec.credits.topUps[].name must be a DNS label"),
            "{e}"
        );
        let e = cel_error(&budget(
            ", topUps: [{name: a, credits: \"1\"}, {name: a, credits: \"2\"}]",
            "",
        ));
        assert!(
            e.contains("spec.credits.topUps[].name must be unique"),
            "{e}"
        );
    }

    #[test]
    fn horizon_is_bounded() {
        for bad in [0u64, 31_536_001] {
            let e = cel_error(&budget(
                "",
                &format!("  admission: {{defaultHorizonSeconds: {bad}}}"),
            ));
            assert!(
                e.contains("spec.admission.defaultHorizonSeconds"),
                "{bad}: {e}"
            );
        }
        budget("", "  admission: {defaultHorizonSeconds: 31536000}")
            .validate_cel()
            .unwrap();
    }

    #[test]
    fn renewal_policy_and_overdraft_limit_are_checked() {
        let b = budget(
            "",
            "  admission: {whenRenewalShort: Overdraft, overdraftLimit: \"500.5\"}",
        );
        b.validate_cel().unwrap();
        assert_eq!(
            b.spec.admission.when_renewal_short,
            Some(RenewalShortPolicy::Overdraft)
        );
        budget("", "  admission: {whenRenewalShort: Stop}")
            .validate_cel()
            .unwrap();
        for bad in ["lots", "-5", "1.2345678", ""] {
            let e = cel_error(&budget(
                "",
                &format!("  admission: {{whenRenewalShort: Overdraft, overdraftLimit: \"{bad}\"}}"),
            ));
            assert!(
                e.contains("spec.admission.overdraftLimit must be a non-negative decimal"),
                "{bad}: {e}"
            );
        }
        let e = cel_error(&budget("", "  admission: {whenRenewalShort: Overdraft}"));
        assert!(e.contains("needs spec.admission.overdraftLimit"), "{e}");
        let e = cel_error(&budget("", "  admission: {overdraftLimit: \"5\"}"));
        assert!(e.contains("applies only with"), "{e}");
    }

    #[test]
    fn status_additions_round_trip() {
        let s: CreditBudgetStatus = serde_json::from_value(serde_json::json!({
            "burnRatePerHour": "12.5",
            "projectedExhaustion": "2026-12-03T00:00:00Z",
            "periodStart": "2026-12-01T00:00:00Z",
            "periodEnd": "2026-12-31T00:00:00Z",
        }))
        .unwrap();
        assert_eq!(s.burn_rate_per_hour.as_deref(), Some("12.5"));
        let back = serde_json::to_value(&s).unwrap();
        assert_eq!(back["periodEnd"], "2026-12-31T00:00:00Z");
        assert!(
            serde_json::to_value(CreditBudgetStatus::default())
                .unwrap()
                .as_object()
                .unwrap()
                .is_empty()
        );
    }
}
