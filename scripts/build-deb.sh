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
if ! [ -d /usr/lib/rustlib/$TRIPLE ] || ! command -v aarch64-linux-gnu-gcc >/dev/null; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO dpkg --add-architecture arm64
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y rustc-web libstd-rust-web-dev:arm64 \
    gcc-aarch64-linux-gnu libc6-dev-arm64-cross libc6:arm64 qemu-user-static
fi
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
