//! The CEL rules, evaluated client-side with the same rules the CRDs carry (the e2e
//! suite checks that the real API server enforces them too).

use kube::CustomResourceExt;

use super::*;

fn class(spec_yaml: &str) -> AcceleratorClass {
    serde_yaml::from_str(&format!(
        "apiVersion: kaccel.io/v1alpha1\nkind: AcceleratorClass\nmetadata: {{name: c}}\nspec:\n{spec_yaml}"
    ))
    .expect("test YAML parses")
}

fn budget(spec_yaml: &str) -> CreditBudget {
    serde_yaml::from_str(&format!(
        "apiVersion: kaccel.io/v1alpha1\nkind: CreditBudget\nmetadata: {{name: b}}\nspec:\n{spec_yaml}"
    ))
    .expect("test YAML parses")
}

fn cel_error(result: Result<(), impl std::fmt::Display>) -> String {
    match result {
        Ok(()) => panic!("CEL accepted an invalid object"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn valid_examples_pass_cel() {
    let c = class(
        "  sharing: Partition\n  selector: {partitionProfile: 1g.10gb}\n  credits: {perDeviceHour: \"0.25\"}",
    );
    c.validate_cel().unwrap();
    let b = budget(
        "  team: vision\n  namespaces: [a, b]\n  classes: [{name: x, guaranteedDevices: 2}]\n  credits: {perPeriod: \"100\", period: {start: \"2026-12-01T00:00:00Z\", days: 30}}",
    );
    b.validate_cel().unwrap();
}

#[test]
fn partition_requires_profile_and_only_partition_has_one() {
    let e =
        cel_error(class("  sharing: Partition\n  credits: {perDeviceHour: \"1\"}").validate_cel());
    assert!(
        e.contains("spec.selector.partitionProfile is required"),
        "{e}"
    );
    let e = cel_error(
        class("  sharing: Whole\n  selector: {partitionProfile: 1g.10gb}\n  credits: {perDeviceHour: \"1\"}").validate_cel(),
    );
    assert!(e.contains("only valid with spec.sharing: Partition"), "{e}");
}

#[test]
fn cpu_only_selects_no_accelerators() {
    let e = cel_error(
        class("  sharing: CpuOnly\n  selector: {vendors: [nvidia]}\n  credits: {perDeviceHour: \"1\"}").validate_cel(),
    );
    assert!(e.contains("CpuOnly"), "{e}");
}

#[test]
fn rates_must_be_non_negative_decimals() {
    // 1000000000 parses as credits but is above the ledger's largest rate.
    for bad in ["-1", "1.2345678", "abc", "", "1000000000", "999999999999"] {
        let e = cel_error(
            class(&format!(
                "  sharing: Whole\n  credits: {{perDeviceHour: \"{bad}\"}}"
            ))
            .validate_cel(),
        );
        assert!(e.contains("spec.credits.perDeviceHour"), "{bad}: {e}");
    }
    let e = cel_error(
        class("  sharing: Whole\n  credits: {perDeviceHour: \"1\", modelOverrides: [{model: x, perDeviceHour: \"-3\"}]}").validate_cel(),
    );
    assert!(e.contains("modelOverrides"), "{e}");
    let e = cel_error(
        class("  sharing: Whole\n  credits: {perDeviceHour: \"1\", modelOverrides: [{model: x, perDeviceHour: \"5000000000\"}]}").validate_cel(),
    );
    assert!(e.contains("below 1000000000"), "{e}");
    class("  sharing: Whole\n  credits: {perDeviceHour: \"999999999.999999\"}")
        .validate_cel()
        .unwrap();
}

#[test]
fn version_constraints_are_dotted_numbers() {
    let e = cel_error(
        class("  sharing: Whole\n  selector: {minComputeCapability: \"nine\"}\n  credits: {perDeviceHour: \"1\"}").validate_cel(),
    );
    assert!(e.contains("minComputeCapability"), "{e}");
}

#[test]
fn budget_rules_name_their_fields() {
    let base = |ns: &str, classes: &str, per_period: &str, team: &str| {
        budget(&format!(
            "  team: {team}\n  namespaces: {ns}\n  classes: {classes}\n  credits: {{perPeriod: \"{per_period}\", period: {{start: \"2026-12-01T00:00:00Z\", days: 30}}}}"
        ))
    };
    let e = cel_error(base("[]", "[{name: x}]", "1", "t").validate_cel());
    assert!(e.contains("spec.namespaces"), "{e}");
    // Repeats are rejected by the list types (set / map keyed by name), which the
    // API server enforces; the planner's own check covers files read offline.
    let crd = serde_json::to_value(CreditBudget::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(spec["namespaces"]["x-kubernetes-list-type"], "set");
    assert_eq!(spec["classes"]["x-kubernetes-list-type"], "map");
    assert_eq!(spec["classes"]["x-kubernetes-list-map-keys"][0], "name");
    let dup = base("[a, a]", "[{name: x}, {name: x}]", "1", "t");
    let problems: Vec<String> = crate::api::parsed::validate_budget(&dup.spec)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        problems.iter().any(|p| p.contains("spec.namespaces[1]")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("spec.classes[1].name")),
        "{problems:?}"
    );
    let e = cel_error(base("[a]", "[{name: x}]", "-5", "t").validate_cel());
    assert!(e.contains("spec.credits.perPeriod"), "{e}");
    let e = cel_error(base("[a]", "[{name: x}]", "1", "Team_A").validate_cel());
    assert!(e.contains("spec.team"), "{e}");
}

/// The CRD's CEL rules and the parser (`api::parsed`) reject the same specs,
/// over every field a CEL rule constrains, each with valid and invalid values
/// (fields only the parser can check, such as NVIDIA-only constraints on an AMD
/// class, are held valid here). The parser must hold the rules where a cluster
/// runs an older CRD, and the CEL rules must reject at apply time what the
/// planner would mark Invalid.
mod cel_and_parser_agree {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use crate::api::parsed::{parse_budget, parse_class};

    fn pick(values: &'static [&'static str]) -> impl Strategy<Value = String> {
        proptest::sample::select(values).prop_map(str::to_string)
    }

    fn maybe(values: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
        proptest::option::of(pick(values))
    }

    const RATES: &[&str] = &[
        "2.5",
        "0",
        "999999999.999999",
        "1000000000",
        "0000000001",
        "-1",
        "1.",
        "abc",
        "1.1234567",
        "01",
        "",
    ];
    const VERSIONS: &[&str] = &[
        "8.0",
        "8",
        "12.4",
        "550.54.15",
        "1.2.3.4",
        "1.2.3.4.5",
        "a.b",
        "8.",
        "",
    ];
    const PATTERNS: &[&str] = &["*H100*", "", "MI300X"];

    prop_compose! {
        fn arb_class()(
            sharing in pick(&["Whole", "Partition", "TimeShare", "CpuOnly"]),
            profile in maybe(&["1g.10gb"]),
            nvidia in any::<bool>(),
            model in maybe(PATTERNS),
            long_model in any::<bool>(),
            capability in maybe(VERSIONS),
            driver in maybe(VERSIONS),
            cuda in maybe(VERSIONS),
            preference in maybe(PATTERNS),
            rate in pick(RATES),
            override_rate in maybe(RATES),
        ) -> Value {
            let mut selector = json!({});
            if let Some(p) = profile { selector["partitionProfile"] = json!(p); }
            if nvidia { selector["vendors"] = json!(["nvidia"]); }
            if let Some(m) = model {
                selector["models"] = json!([if long_model { "x".repeat(129) } else { m }]);
            }
            if let Some(v) = capability { selector["minComputeCapability"] = json!(v); }
            if let Some(v) = driver { selector["minDriverVersion"] = json!(v); }
            if let Some(v) = cuda { selector["minCudaVersion"] = json!(v); }
            let mut credits = json!({"perDeviceHour": rate});
            if let Some(r) = override_rate {
                credits["modelOverrides"] = json!([{"model": "*H100*", "perDeviceHour": r}]);
            }
            let mut spec = json!({"sharing": sharing, "selector": selector, "credits": credits});
            if let Some(p) = preference { spec["preference"] = json!([p]); }
            json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "AcceleratorClass",
                   "metadata": {"name": "c"}, "spec": spec})
        }
    }

    prop_compose! {
        fn arb_budget()(
            team in pick(&["vision", "Vision", "-x", "a-b"]),
            namespaces in any::<bool>(),
            classes in any::<bool>(),
            per_period in pick(&["100", "0", "1.5", "123456789012", "1234567890123", "-1", "1.1234567", "abc"]),
            weight in maybe(&["2", "0.5", "0", "123456", "1234567", "2.5000", "0.001", "0.0001", "abc"]),
            renewal in maybe(&["Stop", "Overdraft"]),
            limit in maybe(&["500", "0", "abc"]),
            horizon in proptest::option::of(proptest::sample::select(&[0u64, 1, 86_400, 31_536_000, 31_536_001][..])),
            top_up_name in maybe(&["q3", "Q3", "-x"]),
            top_up_credits in pick(&["200", "0", "abc", "0.5"]),
            twice in any::<bool>(),
        ) -> Value {
            let mut admission = json!({});
            if let Some(r) = renewal { admission["whenRenewalShort"] = json!(r); }
            if let Some(l) = limit { admission["overdraftLimit"] = json!(l); }
            if let Some(h) = horizon { admission["defaultHorizonSeconds"] = json!(h); }
            let mut credits = json!({"perPeriod": per_period,
                                     "period": {"start": "2026-12-01T00:00:00Z", "days": 30}});
            if let Some(name) = top_up_name {
                let top_up = json!({"name": name, "credits": top_up_credits});
                let mut top_ups = vec![top_up.clone()];
                if twice { top_ups.push(top_up); }
                credits["topUps"] = json!(top_ups);
            }
            let mut spec = json!({
                "team": team,
                "namespaces": if namespaces { json!(["vision"]) } else { json!([]) },
                "classes": if classes { json!([{"name": "x"}]) } else { json!([]) },
                "credits": credits,
                "admission": admission,
            });
            if let Some(w) = weight { spec["fairShareWeight"] = json!(w); }
            json!({"apiVersion": "kaccel.io/v1alpha1", "kind": "CreditBudget",
                   "metadata": {"name": "b"}, "spec": spec})
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn on_classes(object in arb_class()) {
            let class: AcceleratorClass = serde_json::from_value(object.clone()).unwrap();
            let cel = class.validate_cel();
            let parsed = parse_class(&class.spec, None);
            prop_assert_eq!(cel.is_err(), !parsed.is_valid(),
                "CEL: {:?}\nparser: {:?}\n{}", cel.err().map(|e| e.to_string()), parsed.errors, object);
        }

        #[test]
        fn on_budgets(object in arb_budget()) {
            let budget: CreditBudget = serde_json::from_value(object.clone()).unwrap();
            let cel = budget.validate_cel();
            let parsed = parse_budget(&budget.spec);
            prop_assert_eq!(cel.is_err(), parsed.is_err(),
                "CEL: {:?}\nparser: {:?}\n{}", cel.err().map(|e| e.to_string()), parsed.err(), object);
        }
    }
}
