use std::process::ExitCode;

use clap::Parser;
use kaccel::cli::{Cli, Command, run_crds, run_plan};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut stdout = std::io::stdout().lock();
    let result = match &cli.command {
        Command::Plan(args) => run_plan(args, &mut stdout),
        Command::Crds { out } => run_crds(out.as_ref(), &mut stdout),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
