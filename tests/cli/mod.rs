//! The `tidemark` binary under test.

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
