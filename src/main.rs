//! The `tidemark` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidemark::config::{self, LogFormat};

#[derive(Parser)]
#[command(
    name = "tidemark",
    version,
    about = "Event-time edge gateway for MQTT sensor fleets"
)]
struct Cli {
    /// Log line format (overrides `[log] format`).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Validate a config and print the effective configuration (secrets masked).
    Check {
        /// Configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match config::load(path) {
        Ok(cfg) => {
            print!("{}", cfg.effective_toml());
            ExitCode::SUCCESS
        }
        Err(e) => {
            for p in &e.problems {
                eprintln!("error: {p}");
            }
            ExitCode::from(2)
        }
    }
}
