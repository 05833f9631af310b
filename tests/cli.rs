//! `kaccel plan` and `kaccel crds` as a user runs them: the real binary, real files.

use std::path::PathBuf;
use std::process::{Command, Output};

fn kaccel(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kaccel"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kaccel runs")
}

fn scratch(name: &str, content: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kaccel-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, content).unwrap();
    path
}

#[test]
fn plan_on_examples_prints_applyable_yaml_and_a_summary() {
    let out = kaccel(&["plan", "-f", "examples/"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    for kind in ["ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue"] {
        assert!(
            stdout.contains(&format!("kind: {kind}")),
            "no {kind} in output"
        );
    }
    assert!(stdout.contains("# CLASS"), "summary missing");
    // Every non-comment document parses as YAML (so `| kubectl apply -f -` works).
    let docs: Vec<serde_yaml::Value> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    assert!(docs.len() > 20);
    // Deterministic: a second run prints the same bytes.
    let again = kaccel(&["plan", "-f", "examples/"]);
    assert_eq!(stdout, String::from_utf8(again.stdout).unwrap());
}

#[test]
fn invalid_class_names_file_object_and_field_and_prints_no_plan() {
    let path = scratch(
        "bad-class",
        r#"apiVersion: kaccel.io/v1alpha1
kind: AcceleratorClass
metadata: {name: broken}
spec:
  sharing: Partition
  credits: {perDeviceHour: "-2"}
"#,
    );
    let out = kaccel(&[
        "plan",
        "-f",
        path.to_str().unwrap(),
        "--nodes",
        "examples/nodes.yaml",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "printed a plan for invalid input");
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("bad-class.yaml"), "{err}");
    assert!(err.contains("AcceleratorClass \"broken\""), "{err}");
    assert!(err.contains("partitionProfile"), "{err}");
    assert!(err.contains("perDeviceHour"), "{err}");
}

#[test]
fn unknown_enum_value_and_bad_yaml_are_reported_not_panicked() {
    let path = scratch(
        "bad-enum",
        "apiVersion: kaccel.io/v1alpha1\nkind: AcceleratorClass\nmetadata: {name: vague}\nspec:\n  sharing: Shared\n  credits: {perDeviceHour: \"1\"}\n",
    );
    let out = kaccel(&["plan", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("vague") && err.contains("Shared"), "{err}");

    let path = scratch(
        "bad-yaml",
        "apiVersion: v1\nkind: Node\nmetadata: {name: [unclosed\n",
    );
    let out = kaccel(&["plan", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("bad-yaml.yaml") && err.contains("not valid YAML"),
        "{err}"
    );
}

#[test]
fn budget_errors_name_the_field() {
    let path = scratch(
        "bad-budget",
        r#"apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata: {name: empty}
spec:
  team: Vision Team
  namespaces: []
  classes: [{name: a}, {name: a}]
  credits: {perPeriod: "lots", period: {start: "2026-12-01T00:00:00Z", days: 30}}
"#,
    );
    let out = kaccel(&["plan", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    for field in [
        "spec.team",
        "spec.namespaces",
        "spec.classes",
        "spec.credits.perPeriod",
    ] {
        assert!(err.contains(field), "{field} not named in: {err}");
    }
}

#[test]
fn negative_top_up_is_refused_offline_with_the_crd_message() {
    let path = scratch(
        "negative-top-up",
        r#"apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata: {name: vision}
spec:
  team: vision
  namespaces: [vision]
  classes: [{name: inference}]
  credits:
    perPeriod: "100"
    period: {start: "2026-12-01T00:00:00Z", days: 30}
    topUps: [{name: q3-extra, credits: "-50", reason: clawback}]
"#,
    );
    let out = kaccel(&["plan", "-f", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("spec.credits.topUps[].credits must be a positive decimal")
            && err.contains("lower perPeriod"),
        "{err}"
    );
}

#[test]
fn crds_command_prints_both_crds() {
    let out = kaccel(&["crds"]);
    assert!(out.status.success());
    let s = String::from_utf8(out.stdout).unwrap();
    assert!(s.contains("name: acceleratorclasses.kaccel.io"));
    assert!(s.contains("name: creditbudgets.kaccel.io"));
}

/// A fleet with one accelerator kaccel cannot classify (a Qualcomm Cloud AI 100 card
/// through its device plugin's `qualcomm.com/qaic`, which no adapter reads): the
/// summary names it as unclassified, the plan still exits 0, and `--strict` exits
/// non-zero naming the node.
#[test]
fn plan_strict_fails_on_an_unclassified_accelerator() {
    let fleet = scratch(
        "unknown-accelerator",
        r#"
apiVersion: v1
kind: Node
metadata:
  name: qaic-01
  labels: {kaccel.io/pool: cpu}
status:
  capacity: {cpu: "64", memory: 512Gi, qualcomm.com/qaic: "8"}
  allocatable: {cpu: "64", memory: 512Gi, qualcomm.com/qaic: "8"}
  conditions: [{type: Ready, status: "True"}]
---
apiVersion: v1
kind: Node
metadata:
  name: cpu-01
  labels: {kaccel.io/pool: cpu}
status:
  capacity: {cpu: "32", memory: 128Gi}
  allocatable: {cpu: "32", memory: 128Gi}
  conditions: [{type: Ready, status: "True"}]
"#,
    );
    let classes = "examples/classes.yaml";
    let fleet = fleet.to_str().unwrap();
    let out = kaccel(&["plan", "-f", classes, fleet, "-o", "summary"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        stdout.contains("Unclassified: 8 accelerator device(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("node qaic-01: qualcomm.com/qaic (count 8)"),
        "{stdout}"
    );
    // The CPU pool counts cpu-01's 32 cores only, not the accelerator node's 64.
    let cpu_row = stdout
        .lines()
        .find(|l| l.starts_with("development-cpu"))
        .unwrap_or_else(|| panic!("no CPU class row in {stdout}"));
    assert!(cpu_row.split_whitespace().any(|c| c == "32"), "{cpu_row}");
    assert!(!cpu_row.split_whitespace().any(|c| c == "96"), "{cpu_row}");

    let strict = kaccel(&["plan", "-f", classes, fleet, "-o", "summary", "--strict"]);
    assert!(!strict.status.success(), "--strict must fail");
    let stderr = String::from_utf8_lossy(&strict.stderr);
    assert!(
        stderr.contains("--strict") && stderr.contains("qaic-01"),
        "{stderr}"
    );
    assert!(String::from_utf8_lossy(&strict.stdout).contains("Unclassified"));
}
