#!/usr/bin/env bash
# Coverage-guided fuzzing of one decoder on the stable toolchain:
#   scripts/fuzz.sh TARGET [SECONDS]      (targets: src/fuzzing.rs TARGETS; default 60 s)
#   scripts/fuzz.sh --list
# libFuzzer (libfuzzer-sys) with SanitizerCoverage instrumentation and no
# sanitizer (they need nightly). The corpus grows in fuzz/corpus/TARGET; a
# crash is written to fuzz/artifacts/TARGET/ and the script exits non-zero:
# fix it, then keep the input in fuzz/corpus/TARGET/ as a regression case
# (the smoke test in tests/fuzz_smoke.rs replays every corpus file).
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
targets=(payload topic timestamp capture config sparkplug engine)
if [ "${1:-}" = "--list" ] || [ $# -lt 1 ]; then
  printf '%s\n' "${targets[@]}"
  [ $# -ge 1 ] && exit 0 || exit 2
fi
target=$1
seconds=${2:-60}
# What cargo-fuzz passes for `--sanitizer none`, all stable flags.
export RUSTFLAGS="${RUSTFLAGS:-} -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
 -Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Cdebug-assertions -Coverflow-checks"
# An explicit --target keeps the instrumentation out of build scripts (as cargo-fuzz does).
host=$(rustc -vV | sed -n 's/^host: //p')
cargo build --release --target "$host" --bin "$target"
mkdir -p "corpus/$target" "artifacts/$target"
exec "target/$host/release/$target" "corpus/$target" \
  -artifact_prefix="artifacts/$target/" -max_total_time="$seconds" -max_len=65536 \
  -print_final_stats=1 -timeout=10 -rss_limit_mb=2048
