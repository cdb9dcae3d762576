//! The `tidemark` binary under test: every launch goes through here.

use std::process::Command;

/// `tidemark` as cargo built it for this test run. With `TIDEMARK_TEST_RUNNER`
/// set (e.g. `qemu-aarch64-static` for a cross-built
/// binary, see `scripts/build-arm64.sh`) the binary runs through that command.
pub fn tidemark() -> Command {
    let bin = env!("CARGO_BIN_EXE_tidemark");
    match std::env::var("TIDEMARK_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => {
            let mut parts = runner.split_whitespace();
            let mut cmd = Command::new(parts.next().unwrap_or_default());
            cmd.args(parts).arg(bin);
            cmd
        }
        _ => Command::new(bin),
    }
}

/// The command line that starts `tidemark` (the runner's words, then the
/// binary), for launches wrapped in another command (`ip netns exec`, `script`).
pub fn tidemark_argv() -> Vec<String> {
    let bin = env!("CARGO_BIN_EXE_tidemark").to_owned();
    match std::env::var("TIDEMARK_TEST_RUNNER") {
        Ok(runner) if !runner.trim().is_empty() => runner
            .split_whitespace()
            .map(str::to_owned)
            .chain([bin])
            .collect(),
        _ => vec![bin],
    }
}
