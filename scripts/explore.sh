#!/usr/bin/env bash
# The property tests with fresh random cases, ROUNDS times each (default 10). scripts/test.sh
# (the gate for a landing) runs them with one fixed seed, so a rare case found here
# becomes a named test (or a line in tests/*.proptest-regressions) instead of a random CI failure.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${ROUNDS:-10}
unset PROPTEST_RNG_SEED
tests=$(grep -l 'proptest!' tests/*.rs | xargs -n1 basename | sed 's/\.rs$//')
cargo test --no-run --tests -q
failed=0
for r in $(seq 1 "$rounds"); do
  for t in $tests; do
    if ! out=$(cargo test -q --test "$t" 2>&1); then
      echo "round $r: $t failed"; echo "$out" | grep -E 'minimal failing|panicked|left|right' | head -20
      failed=1
    fi
  done
  if ! out=$(cargo test -q --lib 2>&1); then
    echo "round $r: lib failed"; echo "$out" | grep -E 'minimal failing|panicked|left|right' | head -20
    failed=1
  fi
  echo "round $r done"
done
exit $failed
