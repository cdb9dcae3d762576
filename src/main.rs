//! The `tidemark` command line.

use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tidemark::config::{self, Config, LogFormat};
use tidemark::engine::Engine;
use tidemark::replay::{self, Replayer};

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
    /// Run the engine on a recorded capture (JSON lines) with a virtual clock.
    Replay {
        /// Configuration file (TOML).
        #[arg(long)]
        config: PathBuf,
        /// Capture: one `{"arrival": ms, "topic": ..., "payload": {...}}` per line.
        #[arg(long)]
        input: PathBuf,
        /// Output JSON lines (default: standard output).
        #[arg(long)]
        output: Option<PathBuf>,
        /// Keep the virtual clock ticking this long past the last record.
        #[arg(long, default_value_t = 0)]
        drain_ms: u64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Replay {
            config,
            input,
            output,
            drain_ms,
        } => {
            let Some(cfg) = load(&config) else {
                return ExitCode::from(2);
            };
            init_logging(&cfg, cli.log_format);
            replay_cmd(&cfg, &input, output.as_deref(), drain_ms)
        }
    }
}

fn load(path: &Path) -> Option<Config> {
    match config::load(path) {
        Ok(cfg) => Some(cfg),
        Err(e) => {
            for p in &e.problems {
                eprintln!("error: {p}");
            }
            None
        }
    }
}

fn init_logging(cfg: &Config, format: Option<LogFormat>) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&cfg.log_level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format.unwrap_or(cfg.log_format) {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn check(path: &Path) -> ExitCode {
    match load(path) {
        Some(cfg) => {
            print!("{}", cfg.effective_toml());
            ExitCode::SUCCESS
        }
        None => ExitCode::from(2),
    }
}

fn replay_cmd(cfg: &Config, input: &Path, output: Option<&Path>, drain_ms: u64) -> ExitCode {
    let reader = match File::open(input) {
        Ok(f) => BufReader::new(f),
        Err(e) => {
            tracing::error!(file = %input.display(), "cannot open replay input: {e}");
            return ExitCode::from(1);
        }
    };
    let writer: Box<dyn Write> = match output {
        None => Box::new(std::io::stdout().lock()),
        Some(p) => match File::create(p) {
            Ok(f) => Box::new(f),
            Err(e) => {
                tracing::error!(file = %p.display(), "cannot create replay output: {e}");
                return ExitCode::from(1);
            }
        },
    };
    let tick = i64::try_from(cfg.tick_interval_ms).unwrap_or(i64::MAX);
    let drain = i64::try_from(drain_ms).unwrap_or(i64::MAX);
    let mut r = Replayer::new(
        Engine::new(cfg),
        cfg.topic_prefix.clone(),
        tick,
        BufWriter::new(writer),
    );
    if let Err(e) = replay::replay_all(reader, &mut r, drain) {
        tracing::error!("replay failed: {e}");
        return ExitCode::from(1);
    }
    match r.finish() {
        Ok((engine, s)) => {
            let c = engine.counters();
            tracing::info!(
                records = s.records,
                outputs = s.outputs,
                ticks = s.ticks,
                accepted = c.accepted,
                late = c.late,
                duplicates = c.duplicates,
                windows = c.windows_emitted,
                "replay finished"
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("writing replay output: {e}");
            ExitCode::from(1)
        }
    }
}
