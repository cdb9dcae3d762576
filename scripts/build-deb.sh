#!/usr/bin/env bash
# Builds the .deb packages for amd64 and arm64 into target/debian/ with cargo-deb:
# the `dist` binary (stripped, size-optimised), the systemd unit, the service
# user (sysusers.d), /etc/tidemark/{tidemark,site}.toml as conffiles, docs and
# example sites. arm64 is cross-built without Docker (see scripts/build-arm64.sh).
# `cargo test --test package` checks what they contain.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIPLE=aarch64-unknown-linux-gnu
if ! command -v cargo-deb >/dev/null; then
  cargo install cargo-deb --locked --version 3.8.0
fi
source scripts/arm64-toolchain.sh
out=target/debian
mkdir -p "$out"
rm -f "$out"/tidemark_*.deb

cargo build --locked --profile dist
cargo deb --no-build --profile dist --no-strip --output "$out"

(
  export RUSTC=/usr/bin/rustc
  export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
  export CARGO_TARGET_DIR=target/cross
  cargo build --locked --profile dist --target $TRIPLE
  cargo deb --no-build --profile dist --no-strip --target $TRIPLE --output "$out"
)
ls -l "$out"/tidemark_*.deb
