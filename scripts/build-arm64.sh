#!/usr/bin/env bash
# Cross-builds tidemark for 64-bit ARM without Docker (Debian multiarch Rust),
# then smoke-tests the binary under qemu. Needs root for the package install.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! [ -d /usr/lib/rustlib/aarch64-unknown-linux-gnu ]; then
  dpkg --add-architecture arm64
  apt-get update
  apt-get install -y rustc-web libstd-rust-web-dev:arm64 gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static
fi
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cross}"
cargo build --release --target aarch64-unknown-linux-gnu
bin="$CARGO_TARGET_DIR/aarch64-unknown-linux-gnu/release/tidemark"
qemu-aarch64-static -L /usr/aarch64-linux-gnu "$bin" replay --config tests/data/replay.toml \
  --input tests/data/capture.jsonl --drain-ms 300000 2>/dev/null | cmp - tests/data/replay_expected.jsonl
echo "built $bin ($(stat -c %s "$bin") bytes); replay under qemu matches tests/data/replay_expected.jsonl"
