use std::process::ExitCode;

use clap::Parser;
use kaccel::cli::{Cli, Command, inventory, run_crds, run_generate_fleet, run_plan};
use kaccel::controller::{self, Config};

#[cfg(feature = "mimalloc")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Only the one-shot commands lock stdout: the controller logs to it from
    // several threads.
    let result: Result<(), String> = match &cli.command {
        Command::Plan(args) => {
            run_plan(args, &mut std::io::stdout().lock()).map_err(|e| e.to_string())
        }
        Command::Crds { out } => {
            run_crds(out.as_ref(), &mut std::io::stdout().lock()).map_err(|e| e.to_string())
        }
        Command::Inventory(args) => run_inventory(args),
        Command::Ledger(args) => kaccel::cli::ledger::run(args),
        Command::GenerateFleet { nodes, seed } => {
            run_generate_fleet(*nodes, *seed, &mut std::io::stdout().lock())
                .map_err(|e| e.to_string())
        }
        Command::Run {
            config,
            no_leader_election,
            http_address,
            webhook,
        } => run_controller(
            config.as_deref(),
            *no_leader_election,
            *http_address,
            *webhook,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run_inventory(args: &inventory::InventoryArgs) -> Result<(), String> {
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    if let Some(device) = &args.device {
        let since = k8s_openapi::jiff::Timestamp::now().as_second() - i64::from(args.days) * 86_400;
        let report = runtime
            .block_on(inventory::device::read(
                device,
                args.health_from.as_deref(),
                args.store.as_deref(),
                since,
            ))
            .map_err(|e| e.to_string())?;
        return inventory::device::write(&report, args.output, &mut std::io::stdout().lock())
            .map_err(|e| e.to_string());
    }
    let report = if args.nodes.is_empty() {
        runtime.block_on(inventory::read_cluster())
    } else {
        inventory::read_files(&args.nodes)
    }
    .map_err(|e| e.to_string())?;
    let report = match &args.health_from {
        Some(address) => runtime
            .block_on(report.with_health_from(address))
            .map_err(|e| e.to_string())?,
        None => report,
    };
    inventory::write(&report, args.output, &mut std::io::stdout().lock()).map_err(|e| e.to_string())
}

fn run_controller(
    path: Option<&std::path::Path>,
    no_leader_election: bool,
    http_address: Option<std::net::SocketAddr>,
    webhook: bool,
) -> Result<(), String> {
    let mut config = Config::load(path).map_err(|e| e.to_string())?;
    config.webhook.enabled |= webhook;
    if no_leader_election {
        config.leader_election.enabled = false;
    }
    if let Some(address) = http_address {
        config.http_address = address;
    }
    // Structured logs: KACCEL_LOG_FORMAT=json for one JSON object per line (as in
    // the Deployment), human-readable text otherwise; RUST_LOG filters.
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,kube=warn".into());
    if std::env::var("KACCEL_LOG_FORMAT").as_deref() == Ok("json") {
        tracing_subscriber::fmt()
            .json()
            .with_env_filter(filter)
            .init();
    } else {
        tracing_subscriber::fmt().with_env_filter(filter).init();
    }
    let runtime = tokio::runtime::Runtime::new().map_err(|e| e.to_string())?;
    runtime
        .block_on(controller::run(config))
        .map_err(|e| e.to_string())
}
