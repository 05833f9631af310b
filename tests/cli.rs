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

/// `--topology` plans as an installation with Topology Aware Scheduling on: the
/// example fleet's region/zone/rack labels become one Kueue Topology, every device
/// flavor names it, and the summary shows the large-training class's racks.
#[test]
fn plan_with_topology_shows_the_topology_objects_and_each_class_levels_blocks() {
    let out = kaccel(&["plan", "-f", "examples/", "--topology"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let docs: Vec<serde_json::Value> = serde_yaml::Deserializer::from_str(&stdout)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let topologies: Vec<&serde_json::Value> =
        docs.iter().filter(|d| d["kind"] == "Topology").collect();
    assert_eq!(
        topologies.len(),
        1,
        "one set of levels in the example fleet"
    );
    assert_eq!(
        docs[0]["kind"], "Topology",
        "applied before the flavors naming it"
    );
    let name = topologies[0]["metadata"]["name"].as_str().unwrap();
    let levels: Vec<&str> = topologies[0]["spec"]["levels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["nodeLabel"].as_str().unwrap())
        .collect();
    assert_eq!(
        levels,
        [
            "topology.kubernetes.io/region",
            "topology.kubernetes.io/zone",
            "topology.kaccel.io/rack",
            "kubernetes.io/hostname"
        ]
    );
    for flavor in docs.iter().filter(|d| d["kind"] == "ResourceFlavor") {
        let cpu = flavor["metadata"]["name"] == "cpu";
        assert_eq!(
            flavor["spec"]["topologyName"].as_str(),
            (!cpu).then_some(name),
            "{flavor}"
        );
    }
    let summary = kaccel(&["plan", "-f", "examples/", "--topology", "-o", "summary"]);
    let summary = String::from_utf8(summary.stdout).unwrap();
    assert!(
        summary.contains(&format!("{name:<48} topology.kubernetes.io/region > ")),
        "{summary}"
    );
    // gpu-h100-01/02 in rack-a1 (16 healthy), 03/04 in rack-b1 (7 + 8, one GPU
    // withdrawn by the device plugin): 16 is the most one Workload can get.
    let row = summary
        .lines()
        .find(|l| {
            l.starts_with("large-training")
                && l.contains("nvidia-h100-80gb-hbm3")
                && l.contains("topology.kaccel.io/rack")
        })
        .unwrap_or_else(|| panic!("no block row: {summary}"));
    let figures: Vec<&str> = row.split_whitespace().rev().take(2).collect();
    assert_eq!(figures, ["16", "2"], "{row}");
    assert!(summary.contains("CreditBudget language: GuaranteeSpansBlocks: the guarantee of 24 large-training devices fits in no single rack"), "{summary}");
    // Without the flag nothing of it is planned, and the class says how to turn it on.
    let plain = String::from_utf8(kaccel(&["plan", "-f", "examples/"]).stdout).unwrap();
    assert!(!plain.contains("kind: Topology") && !plain.contains("topologyName"));
    assert!(plain.contains("planner.topologyAwareScheduling is false"));
}

/// The plan of `examples/` is pinned byte for byte, so a refactor of the planner,
/// the parsers or the CLI that changes any object, field order or summary line
/// fails here. The pinned files were written by the planner before its split into
/// stages (issue 16); rewrite them with `KACCEL_BLESS=1 cargo test --test cli` only
/// for a change that is meant to alter the plan, and review the diff.
#[test]
fn plan_of_examples_is_byte_identical_to_the_pinned_output() {
    for (args, pinned) in [
        (
            &["plan", "-f", "examples/"][..],
            "tests/golden/plan-examples.yaml",
        ),
        (
            &["plan", "-f", "examples/", "-o", "json"][..],
            "tests/golden/plan-examples.json",
        ),
    ] {
        let out = kaccel(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(pinned);
        if std::env::var_os("KACCEL_BLESS").is_some() {
            std::fs::write(&path, &out.stdout).unwrap();
            continue;
        }
        let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{pinned}: {e}"));
        if out.stdout != want {
            let got = String::from_utf8_lossy(&out.stdout);
            let want = String::from_utf8_lossy(&want);
            let first = got
                .lines()
                .zip(want.lines())
                .position(|(g, w)| g != w)
                .unwrap_or_else(|| got.lines().count().min(want.lines().count()));
            panic!(
                "`kaccel {}` differs from {pinned} at line {}:\n  got:    {:?}\n  pinned: {:?}",
                args.join(" "),
                first + 1,
                got.lines().nth(first),
                want.lines().nth(first),
            );
        }
    }
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

/// A GKE TPU v6e node whose chips only the TPU DRA driver publishes (node label
/// `cloud.google.com/gke-tpu-dra-driver=true` turns GKE's device plugin off), and the
/// ResourceSlice the driver writes for it: kubernetes-sigs/dra-driver-google-tpu
/// v0.2.0 (b80d78e0), `cmd/tpu-dra-kubeletplugin/manager.go` `GetDevice` (attributes
/// `index`, `uuid` (one per node), `tpuGen`, `brand`, `accelerator`, `chipCount`,
/// `topology`; device names `accel<N>`). Both as `kubectl get -o yaml` prints them:
/// a `v1 List`.
const TPU_DRA_NODE: &str = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Node
    metadata:
      name: tpu-v6e-dra
      labels:
        cloud.google.com/gke-tpu-accelerator: tpu-v6e-slice
        cloud.google.com/gke-tpu-topology: 2x2
        cloud.google.com/gke-tpu-dra-driver: "true"
        node.kubernetes.io/instance-type: ct6e-standard-4t
    spec:
      taints: [{key: google.com/tpu, value: present, effect: NoSchedule}]
    status:
      capacity: {cpu: "180", memory: 720Gi}
      allocatable: {cpu: "179", memory: 700Gi}
      conditions: [{type: Ready, status: "True"}]
"#;

fn tpu_slice(devices: usize) -> String {
    let mut s = String::from(
        r#"
apiVersion: v1
kind: List
items:
  - apiVersion: resource.k8s.io/v1
    kind: ResourceSlice
    metadata: {name: tpu-v6e-dra-tpu.google.com-5wq2r}
    spec:
      driver: tpu.google.com
      nodeName: tpu-v6e-dra
      pool: {name: tpu-v6e-dra, generation: 1, resourceSliceCount: 1}
      devices:
"#,
    );
    for i in 0..devices {
        s.push_str(&format!(
            r#"        - name: accel{i}
          attributes:
            index: {{int: {i}}}
            uuid: {{string: tpu-25541d5c-7c31-8412-d7cb-c8ebff2fa5c9}}
            tpuGen: {{string: v6e}}
            brand: {{string: Google}}
            accelerator: {{string: tpu-v6e-slice}}
            chipCount: {{int: 4}}
            topology: {{string: 2x2}}
"#
        ));
    }
    s
}

/// `kaccel plan -f` reads ResourceSlices (and Lists of them) beside Nodes, merged as
/// the controller merges them: the DRA-only TPU node becomes a flavor pinned by GKE's
/// TPU labels, counted from its slice. Without the slice the node is unclassified.
#[test]
fn plan_reads_resource_slices_beside_nodes() {
    let node = scratch("tpu-dra-node", TPU_DRA_NODE);
    let slice = scratch("tpu-dra-slice", &tpu_slice(4));
    let classes = "examples/classes.yaml";
    let budgets = "examples/budgets.yaml";
    let (node, slice) = (node.to_str().unwrap(), slice.to_str().unwrap());

    let out = kaccel(&[
        "plan", "-f", classes, budgets, node, slice, "-o", "summary", "--strict",
    ]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("1 node(s), 4 device(s)"), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.starts_with("standard-training"))
        .unwrap_or_else(|| panic!("no standard-training row in {stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert!(cells[1].contains("tpu-v6e"), "{row}");
    // NODES 1, HEALTHY 4, CAPACITY 4.
    assert_eq!((cells[2], cells[3], cells[8]), ("1", "4", "4"), "{row}");
    assert!(!stdout.contains("Unclassified"), "{stdout}");

    let yaml = kaccel(&["plan", "-f", classes, budgets, node, slice]);
    let yaml = String::from_utf8(yaml.stdout).unwrap();
    let flavor: serde_yaml::Value = serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .find(|v: &serde_yaml::Value| {
            v["kind"] == "ResourceFlavor"
                && v["spec"]["nodeLabels"]["cloud.google.com/gke-tpu-accelerator"]
                    == "tpu-v6e-slice"
        })
        .unwrap_or_else(|| panic!("no TPU flavor in {yaml}"));
    assert_eq!(
        flavor["spec"]["nodeLabels"]["cloud.google.com/gke-tpu-topology"],
        "2x2"
    );
    // Its quota is in the class resource, which Kueue counts the claims of the
    // flavor's DeviceClass as (--kueue-config prints the mapping Kueue needs); a
    // class-level request is turned into the DeviceClass's implicit resource.
    let flavor_name = flavor["metadata"]["name"].as_str().unwrap();
    let resource = "kaccel.io/accelerator";
    assert!(
        yaml.contains(&format!("- {resource}\n")),
        "{resource} is not a covered resource:\n{yaml}"
    );
    assert_eq!(
        flavor["metadata"]["annotations"]["kaccel.io/device-resource"]
            .as_str()
            .unwrap(),
        format!("deviceclass.resource.kubernetes.io/{flavor_name}.kaccel.io")
    );
    assert!(
        yaml.contains(&format!("name: {flavor_name}.kaccel.io\n")),
        "{yaml}"
    );
    let snippet = kaccel(&[
        "plan",
        "-f",
        classes,
        budgets,
        node,
        slice,
        "--kueue-config",
    ]);
    assert!(snippet.status.success());
    let snippet = String::from_utf8(snippet.stdout).unwrap();
    let config: serde_yaml::Value = serde_yaml::from_str(&snippet).unwrap();
    assert_eq!(config["featureGates"]["DynamicResourceAllocation"], true);
    let mapping = &config["resources"]["deviceClassMappings"][0];
    assert_eq!(mapping["name"].as_str(), Some(resource), "{snippet}");
    assert_eq!(
        mapping["deviceClassNames"][0].as_str(),
        Some(format!("{flavor_name}.kaccel.io").as_str()),
        "{snippet}"
    );
    assert!(snippet.contains("restart"), "{snippet}");

    // The node alone: GKE's TPU labels say an accelerator is there, nothing reads it.
    let alone = kaccel(&["plan", "-f", classes, node, "-o", "summary", "--strict"]);
    assert!(!alone.status.success());
    let stdout = String::from_utf8(alone.stdout).unwrap();
    assert!(
        stdout.contains("node tpu-v6e-dra: cloud.google.com/gke-tpu-accelerator=tpu-v6e-slice"),
        "{stdout}"
    );
}

/// A ResourceSlice of an older API version is refused with the field and the fix.
#[test]
fn plan_refuses_a_beta_resource_slice_with_the_fix() {
    let old = scratch(
        "beta-slice",
        "apiVersion: resource.k8s.io/v1beta1\nkind: ResourceSlice\nmetadata: {name: s}\nspec: {driver: gpu.nvidia.com, nodeName: n, pool: {name: n, generation: 1, resourceSliceCount: 1}}\n",
    );
    let out = kaccel(&["plan", "-f", "examples/classes.yaml", old.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(
        err.contains("beta-slice.yaml")
            && err.contains("ResourceSlice \"s\"")
            && err.contains("resource.k8s.io/v1beta1")
            && err.contains("resourceslices.v1.resource.k8s.io"),
        "{err}"
    );
}

/// `kaccel inventory` lists what it cannot classify (node, source, count, reason),
/// as `kaccel plan -o summary` does: here a Qualcomm card no adapter reads and a
/// Gaudi device the Intel DRA driver names `Unknown` (gaudi-v0.7.2
/// `pkg/gaudi/device/device.go` `SetModelName`), beside a Gaudi2 it does know.
#[test]
fn inventory_lists_unclassified_devices() {
    let fleet = scratch(
        "inventory-unclassified",
        r#"
apiVersion: v1
kind: NodeList
items:
  - metadata: {name: qaic-01}
    status:
      capacity: {cpu: "64", qualcomm.com/qaic: "8"}
      allocatable: {cpu: "64", qualcomm.com/qaic: "8"}
  - metadata: {name: gaudi-dra-01}
    status:
      capacity: {cpu: "160"}
      allocatable: {cpu: "160"}
---
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata: {name: gaudi-dra-01-gaudi.intel.com-x7k2p}
spec:
  driver: gaudi.intel.com
  nodeName: gaudi-dra-01
  pool: {name: gaudi-dra-01, generation: 0, resourceSliceCount: 1}
  devices:
    - name: 0000-19-00-0-0x1020
      attributes:
        model: {string: Gaudi2}
        serial: {string: AN00000001}
        healthy: {bool: true}
        pciRoot: {string: "17"}
    - name: 0000-cb-00-0-0x1099
      attributes:
        model: {string: Unknown}
        serial: {string: AN00000008}
        healthy: {bool: true}
        pciRoot: {string: "c8"}
"#,
    );
    let out = kaccel(&["inventory", "--nodes", fleet.to_str().unwrap()]);
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let gaudi = stdout
        .lines()
        .find(|l| l.starts_with("gaudi-dra-01 ") && l.contains("Gaudi2"))
        .unwrap_or_else(|| panic!("no Gaudi2 row in {stdout}"));
    assert!(gaudi.contains("gaudi.intel.com"), "{gaudi}");
    assert!(
        stdout.contains("Unclassified: 9 accelerator device(s)"),
        "{stdout}"
    );
    let section: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("Unclassified:"))
        .take_while(|l| !l.is_empty())
        .collect();
    let row = |node: &str| -> Vec<&str> {
        section
            .iter()
            .find(|l| l.starts_with(node))
            .unwrap_or_else(|| panic!("no {node} row in {section:#?}"))
            .split_whitespace()
            .collect()
    };
    assert_eq!(row("qaic-01")[1..3], ["qualcomm.com/qaic", "8"]);
    assert_eq!(row("gaudi-dra-01")[1..4], ["gaudi.intel.com", "(DRA)", "1"]);
    assert!(row("gaudi-dra-01").contains(&"Unknown"), "{section:#?}");
}

/// `kaccel plan --kueue-config` on the examples asks Kueue to count every vendor
/// device resource as `kaccel.io/accelerator` too, and the e2e harness starts
/// Kueue with at least those (e2e/cluster.sh, E2E_CLASS_COUNTED): the snippet
/// the tests and the demo run under is the one a platform team is told to add.
#[test]
fn kueue_config_snippet_transforms_each_vendor_resource_and_the_harness_applies_it() {
    let out = kaccel(&["plan", "-f", "examples/", "--kueue-config"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let snippet = String::from_utf8(out.stdout).unwrap();
    let config: serde_yaml::Value = serde_yaml::from_str(&snippet).expect("the snippet is YAML");
    let transformations = config["resources"]["transformations"]
        .as_sequence()
        .expect("transformations");
    let mut inputs = Vec::new();
    for t in transformations {
        assert_eq!(t["strategy"], "Retain", "{t:?}");
        assert_eq!(t["outputs"]["kaccel.io/accelerator"], "1", "{t:?}");
        inputs.push(t["input"].as_str().unwrap().to_string());
    }
    for vendor in [
        "nvidia.com/gpu",
        "amd.com/gpu",
        "habana.ai/gaudi",
        "nvidia.com/mig-1g.10gb",
    ] {
        assert!(
            inputs.iter().any(|i| i == vendor),
            "{vendor} not in {inputs:?}"
        );
    }
    let harness =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("e2e/cluster.sh"))
            .unwrap();
    let line = harness
        .lines()
        .find(|l| l.starts_with("E2E_CLASS_COUNTED=("))
        .expect("E2E_CLASS_COUNTED in e2e/cluster.sh");
    let listed: Vec<&str> = line
        .trim_start_matches("E2E_CLASS_COUNTED=(")
        .trim_end_matches(')')
        .split_whitespace()
        .collect();
    for input in &inputs {
        assert!(
            listed.contains(&input.as_str()),
            "the harness's Kueue does not transform {input}: add it to E2E_CLASS_COUNTED"
        );
    }
}

/// `--instance` plans what that installation serves: the classes and budgets
/// labelled with it (the default instance also takes unlabelled ones), written
/// as its own (managed-by, root Cohort); a budget naming another installation's
/// class is told whose it is.
#[test]
fn plan_as_another_instance_takes_only_its_labelled_classes() {
    let objects = scratch(
        "instances",
        r#"apiVersion: kaccel.io/v1alpha1
kind: AcceleratorClass
metadata:
  name: team-b-mi300x
  labels: {kaccel.io/instance: team-b}
spec:
  sharing: Whole
  selector: {vendors: [amd]}
  credits: {perDeviceHour: "3"}
---
apiVersion: kaccel.io/v1alpha1
kind: AcceleratorClass
metadata:
  name: default-h100
spec:
  sharing: Whole
  selector: {vendors: [nvidia], minMemoryMiB: 80000}
  credits: {perDeviceHour: "4"}
---
apiVersion: kaccel.io/v1alpha1
kind: CreditBudget
metadata:
  name: team-b
  labels: {kaccel.io/instance: team-b}
spec:
  team: b
  namespaces: [team-b]
  classes:
    - {name: team-b-mi300x, guaranteedDevices: 8}
    - {name: default-h100, guaranteedDevices: 8}
  credits: {perPeriod: "1000", period: {start: "2026-12-01T00:00:00Z", days: 30}}
"#,
    );
    let path = objects.to_str().unwrap();
    let plan_as = |instance: &str| -> String {
        let out = kaccel(&[
            "plan",
            "-f",
            path,
            "--nodes",
            "examples/nodes.yaml",
            "--instance",
            instance,
            "-o",
            "json",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let team_b: serde_json::Value = serde_json::from_str(&plan_as("team-b")).unwrap();
    let text = team_b.to_string();
    assert!(
        text.contains("amd-instinct-mi300x"),
        "team-b's flavor: {text}"
    );
    assert!(
        !text.contains("h100"),
        "the default instance's class: {text}"
    );
    assert!(text.contains(r#""app.kubernetes.io/managed-by":"team-b""#));
    assert!(!text.contains(r#""app.kubernetes.io/managed-by":"kaccel""#));
    assert!(
        text.contains(r#""parentName":"team-b""#),
        "root Cohort: {text}"
    );
    let summary = kaccel(&[
        "plan",
        "-f",
        path,
        "--nodes",
        "examples/nodes.yaml",
        "--instance",
        "team-b",
        "-o",
        "summary",
    ]);
    let summary = String::from_utf8_lossy(&summary.stdout);
    assert!(
        summary.contains(
            r#"CreditBudget team-b: ClassNotFound: spec.classes: AcceleratorClass "default-h100" is served by the kaccel installation "kaccel""#
        ),
        "{summary}"
    );
    let default = plan_as("kaccel");
    assert!(
        default.contains("h100") && !default.contains("mi300x"),
        "{default}"
    );
    let bad = kaccel(&["plan", "-f", path, "--instance", "Team_B"]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--instance \"Team_B\": must be a DNS label")
    );
}
