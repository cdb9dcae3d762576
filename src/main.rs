//! The `tidemark` command line.

use std::process::ExitCode;

use clap::Parser;

mod cli;

use cli::Failure;
use cli::args::{Cli, Command, RunArgs};

fn main() -> ExitCode {
    tidemark::sys::memory::tune();
    tidemark::sys::private_files();
    let cli = Cli::parse();
    let command = match (cli.command, cli.config) {
        (Some(c), top) if top.is_empty() => c,
        (None, config) if !config.is_empty() => Command::Run(RunArgs { config }),
        (Some(_), _) => {
            return Failure::Usage(
                "--config goes after the subcommand (e.g. `tidemark run --config FILE`)".into(),
            )
            .exit();
        }
        (None, _) => {
            return Failure::Usage(
                "a subcommand or --config FILE is required (see `tidemark --help`)".into(),
            )
            .exit();
        }
    };
    match cli::commands::dispatch(command, cli.log_format) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => f.exit(),
    }
}
