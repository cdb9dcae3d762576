#!/usr/bin/env bash
# Builds tidemark for 64-bit ARM without Docker (Debian's multiarch Rust) and
# runs the unit, engine, replay and check suites under qemu-user:
#   1. the stripped `dist` binary (what the arm64 .deb ships) must be <= 7 MiB (6 until the database outputs: BENCHMARKS table 13);
#   2. its `replay` of the example capture must be byte-identical to x86's;
#   3. the test suites, cross-built, run under qemu (the binary they spawn too).
# Needs root for the one-time package install. armv7 goes through cross.toml.
set -euo pipefail
cd "$(dirname "$0")/.."
TRIPLE=aarch64-unknown-linux-gnu
# The multiarch libc6:arm64 (/lib/ld-linux-aarch64.so.1), not `-L /usr/aarch64-linux-gnu`:
# that cross ld.so with the multiarch libc it then finds hangs at the first thread.
QEMU="qemu-aarch64-static"
source scripts/arm64-toolchain.sh
# Debian's rustc carries the aarch64 std that rustup cannot download here.
export RUSTC=/usr/bin/rustc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$QEMU"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target/cross}"

cargo build --locked --profile dist --target $TRIPLE
bin="$CARGO_TARGET_DIR/$TRIPLE/dist/tidemark"
size=$(stat -c %s "$bin")
echo "aarch64 binary: $bin, $size bytes ($(awk "BEGIN{printf \"%.2f\", $size/1048576}") MiB, stripped)"
if [ "$size" -gt $((7 * 1024 * 1024)) ]; then
  echo "FAIL: aarch64 binary is larger than 7 MiB" >&2
  exit 1
fi

# The example capture, replayed on both architectures.
replay() { "$@" replay --config tests/data/replay.toml --input tests/data/capture.jsonl --drain-ms 300000 2>/dev/null; }
arm_out=$(mktemp)
trap 'rm -f "$arm_out"' EXIT
replay $QEMU "$bin" >"$arm_out"
cmp "$arm_out" tests/data/replay_expected.jsonl
x86_bin=""
for b in target/release/tidemark target/debug/tidemark; do
  if [ -x "$b" ]; then x86_bin=$b; break; fi
done
if [ -z "$x86_bin" ]; then
  cargo build --locked --release
  x86_bin=target/release/tidemark
fi
replay "$x86_bin" | cmp - "$arm_out"
echo "replay of tests/data/capture.jsonl: aarch64 (qemu) output byte-identical to x86 ($x86_bin) and to tests/data/replay_expected.jsonl ($(wc -l <"$arm_out") lines)"

# Unit, engine, replay and check suites on aarch64. The gateway suite (MQTT
# against mosquitto) runs natively in scripts/test.sh.
export TIDEMARK_TEST_RUNNER="$QEMU"
cargo test --locked --profile qemu-test --target $TRIPLE \
  --lib --test engine_scenarios --test engine_model --test engine_fuzz \
  --test skew_jitter --test alloc_free --test replay_cli --test durable_replay --test check_cli \
  -- --include-ignored
echo "aarch64 suites passed under qemu"
