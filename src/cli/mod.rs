//! `kaccel` subcommands.

pub mod inventory;
pub mod ledger;
pub mod load;
pub(crate) mod summary;

use std::io::Write;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

use crate::health::HealthSnapshot;
use crate::inventory::Inventory;
use crate::plan::{Plan, PlanInput, PlanOptions, plan, served_by};

#[derive(Parser, Debug)]
#[command(name = "kaccel", version, about = "A mixed GPU/NPU fleet behind Kueue")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Show the Kueue objects kaccel would write for AcceleratorClass, CreditBudget,
    /// Node and ResourceSlice YAML, without a cluster. Output is YAML (pipe it to `kubectl apply -f -`)
    /// followed by a summary as YAML comments.
    Plan(PlanArgs),
    /// Run the controller against the cluster of the current kubeconfig (or the
    /// in-cluster service account).
    Run {
        /// Configuration file (see config/kaccel.yaml); defaults apply without one.
        #[arg(long, env = "KACCEL_CONFIG")]
        config: Option<PathBuf>,
        /// Turn leader election off (single replica, local runs).
        #[arg(long)]
        no_leader_election: bool,
        /// Override the HTTP address for /healthz, /readyz, /metrics.
        #[arg(long)]
        http_address: Option<std::net::SocketAddr>,
        /// Serve the pod webhook (`webhook.enabled`), as manifests/deployment.yaml does.
        #[arg(long)]
        webhook: bool,
    },
    /// Show the accelerator inventory of the cluster of the current kubeconfig (or of
    /// Node YAML with --nodes): one row per device group per node with vendor, model,
    /// sharing mode, partition profile, resource, capacity, allocatable and health.
    /// Allocation (devices held by admitted Kueue Workloads) is shown per
    /// ResourceFlavor, not per node: Kueue assigns a Workload a flavor, and the nodes
    /// are known only once its pods are bound.
    Inventory(inventory::InventoryArgs),
    /// Print a deterministic synthetic fleet of Nodes as YAML (for benchmarks and
    /// load tests against a local control plane).
    #[command(hide = true)]
    GenerateFleet {
        #[arg(long, default_value_t = 5000)]
        nodes: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
    },
    /// The credit ledger: export entries (CSV, FOCUS 1.2, JSON lines) and verify
    /// balances.
    Ledger(ledger::LedgerArgs),
    /// Print kaccel's CustomResourceDefinitions (or write them into a folder).
    Crds {
        /// Write one file per CRD into this folder instead of printing.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// Files or folders (searched recursively for .yaml/.yml) with AcceleratorClasses,
    /// CreditBudgets, Nodes and DRA ResourceSlices (resource.k8s.io/v1), as single
    /// objects or Lists. Other kinds are skipped.
    #[arg(short = 'f', long = "filename", required = true, num_args = 1..)]
    pub files: Vec<PathBuf>,
    /// Extra Node and ResourceSlice YAML (e.g. `kubectl get nodes,resourceslices -o
    /// yaml` output).
    #[arg(long)]
    pub nodes: Vec<PathBuf>,
    /// What to print.
    #[arg(short, long, value_enum, default_value_t = Output::Yaml)]
    pub output: Output,
    /// Reference this AdmissionCheck from every ClusterQueue (as `kaccel run` does when
    /// the credit ledger is on).
    #[arg(long)]
    pub admission_check: Option<String>,
    /// Plan as this installation (config `instance`): only the classes and
    /// budgets it serves (label kaccel.io/instance; the default instance also
    /// takes unlabelled ones), its managed-by value and root Cohort.
    #[arg(long, default_value = crate::k8s::instance::DEFAULT_INSTANCE)]
    pub instance: String,
    /// Exit non-zero when any node has an accelerator kaccel cannot classify (the
    /// plan is still printed; the summary lists them under "Unclassified").
    #[arg(long)]
    pub strict: bool,
    /// Print, instead of the objects, what to add to Kueue's own Configuration so it
    /// counts the claims of every DeviceClass in the plan (its feature gate and
    /// `resources.deviceClassMappings`).
    #[arg(long)]
    pub kueue_config: bool,
    /// Plan with Topology Aware Scheduling on (config
    /// `planner.topologyAwareScheduling`): Kueue Topology objects, each device
    /// flavor's `topologyName`, and each class level's blocks.
    #[arg(long)]
    pub topology: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum Output {
    /// Kueue objects as YAML, then the summary as comments.
    Yaml,
    /// Kueue objects as one JSON document.
    Json,
    /// Only the summary table.
    Summary,
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Load(Vec<load::LoadError>),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "--instance {0:?}: must be a DNS label (lower-case letters, digits and '-') of at most 40 characters, e.g. kaccel"
    )]
    Instance(String),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    #[error(
        "--strict: {count} unclassified accelerator device(s) on node(s) {nodes}: kaccel offers them to no class; see the summary's Unclassified section for the fix"
    )]
    Unclassified { count: u64, nodes: String },
}

pub fn run_plan(args: &PlanArgs, out: &mut impl Write) -> Result<(), CliError> {
    let mut paths = args.files.clone();
    paths.extend(args.nodes.iter().cloned());
    let loaded = load::load(&paths).map_err(CliError::Load)?;
    let inventory = Inventory::from_nodes_and_slices(&loaded.nodes, &loaded.slices);
    let health = HealthSnapshot::default();
    if !crate::k8s::instance::valid_instance(&args.instance) {
        return Err(CliError::Instance(args.instance.clone()));
    }
    let served = served_by(&args.instance, &loaded.classes, &loaded.budgets);
    let options = PlanOptions {
        admission_check: args.admission_check.clone(),
        instance: args.instance.clone(),
        root_cohort: args.instance.clone(),
        classes_elsewhere: served.classes_elsewhere,
        topology_aware_scheduling: args.topology,
        ..Default::default()
    };
    let plan = plan(&PlanInput {
        classes: &served.classes,
        budgets: &served.budgets,
        inventory: &inventory,
        health: &health,
        options: &options,
    });
    if args.kueue_config {
        let mappings = crate::plan::kueue_counting::mappings(&plan.device_classes);
        let transformations = crate::plan::kueue_counting::transformations(&plan.flavors);
        write!(
            out,
            "{}",
            crate::plan::kueue_counting::configuration_snippet(&mappings, &transformations)
        )?;
        return Ok(());
    }
    match args.output {
        Output::Yaml => {
            write!(out, "{}", plan_yaml(&plan))?;
            for line in summary::render(&plan, &inventory).lines() {
                writeln!(out, "# {line}")?;
            }
        }
        Output::Json => {
            let objects = plan_objects(&plan);
            let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": objects});
            writeln!(
                out,
                "{}",
                serde_json::to_string_pretty(&list).expect("plan serialises")
            )?;
        }
        Output::Summary => write!(out, "{}", summary::render(&plan, &inventory))?,
    }
    if args.strict && inventory.unclassified().next().is_some() {
        let nodes: std::collections::BTreeSet<&str> = inventory
            .unclassified()
            .map(|(n, _)| n.name.as_str())
            .collect();
        return Err(CliError::Unclassified {
            count: inventory.unclassified_device_count(),
            nodes: nodes.into_iter().collect::<Vec<_>>().join(", "),
        });
    }
    Ok(())
}

/// Every object of the plan, in apply order (flavors and cohorts before the queues
/// that name them).
pub fn plan_objects(plan: &Plan) -> Vec<serde_json::Value> {
    fn json<T: serde::Serialize>(object: &T) -> serde_json::Value {
        serde_json::to_value(object).expect("Kueue objects serialise")
    }
    let mut objects: Vec<serde_json::Value> = plan.device_classes.iter().map(json).collect();
    objects.extend(plan.topologies.iter().map(json));
    objects.extend(plan.resource_flavors.iter().map(json));
    objects.extend(plan.cohorts.iter().map(json));
    objects.extend(plan.cluster_queues.iter().map(json));
    objects.extend(plan.local_queues.iter().map(json));
    objects
}

pub fn plan_yaml(plan: &Plan) -> String {
    let mut out = String::new();
    for object in plan_objects(plan) {
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&object).expect("Kueue objects serialise"));
    }
    out
}

pub fn run_crds(out_dir: Option<&PathBuf>, out: &mut impl Write) -> Result<(), CliError> {
    for (file, crd) in crate::crds::all() {
        let yaml = crate::crds::to_yaml(&crd);
        match out_dir {
            Some(dir) => {
                let path = dir.join(file);
                std::fs::write(&path, yaml).map_err(|source| CliError::Write { path, source })?;
            }
            None => write!(out, "---\n{yaml}")?,
        }
    }
    Ok(())
}

pub fn run_generate_fleet(nodes: usize, seed: u64, out: &mut impl Write) -> Result<(), CliError> {
    for node in crate::inventory::synthetic::generate_fleet(nodes, seed) {
        write!(
            out,
            "---\n{}",
            serde_yaml::to_string(&node).expect("Nodes serialise")
        )?;
    }
    Ok(())
}
