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
    let problems: Vec<String> = crate::plan::validate_budget(&dup.spec)
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
