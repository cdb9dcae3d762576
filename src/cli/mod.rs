//! The `tidemark` command line: arguments ([`args`]), one body per command
//! ([`commands`]), and one error type whose variants are the exit codes.

pub mod args;
pub mod commands;
pub mod inspect;
pub mod logging;

use std::path::PathBuf;
use std::process::ExitCode;

use tidemark::config::{self, Config};

/// Why a command did not succeed; the variant is the exit code (docs/reference.md#command-line).
pub enum Failure {
    /// Exit 2: a usage or config problem, printed as `error: ...` on stderr.
    Usage(String),
    /// Exit 2: already reported (every config problem on its own line).
    Reported,
    /// Exit 1: the command ran and failed; logged.
    Failed(String),
    /// Exit 1: the command ran and failed, printed as `error: ...` on stderr.
    Error(String),
    /// Exit 1: already reported (e.g. a pushed document that was not applied).
    NotDone,
}

impl Failure {
    /// Reports what is not reported yet; the exit code.
    pub fn exit(self) -> ExitCode {
        match self {
            Self::Usage(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
            Self::Reported => ExitCode::from(2),
            Self::Failed(e) => {
                tracing::error!("{e}");
                ExitCode::from(1)
            }
            Self::Error(e) => {
                eprintln!("error: {e}");
                ExitCode::from(1)
            }
            Self::NotDone => ExitCode::from(1),
        }
    }
}

/// The config with the remote layer kept in `state_dir` (docs/reference.md#remote-configuration-fleet); every
/// problem printed.
pub fn load_gateway(
    paths: &[PathBuf],
) -> Result<(Config, Option<tidemark::fleet::Remote>), Failure> {
    match config::load_gateway(paths) {
        Ok((cfg, remote, warning)) => {
            if let Some(w) = warning {
                eprintln!("warning: {w}");
            }
            for w in cfg.warnings() {
                eprintln!("warning: {w}");
            }
            Ok((cfg, remote))
        }
        Err(e) => {
            for p in &e.problems {
                eprintln!("error: {p}");
            }
            Err(Failure::Reported)
        }
    }
}

/// [`load_gateway`] without the remote layer's bookkeeping.
pub fn load(paths: &[PathBuf]) -> Result<Config, Failure> {
    load_gateway(paths).map(|(cfg, _)| cfg)
}
