#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need, then runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --locked -- --include-ignored
