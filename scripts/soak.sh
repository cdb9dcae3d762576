#!/usr/bin/env bash
# A bounded soak of `tidemark run`: scripts/soak.sh [--minutes N] [--write]
# (see scripts/bench/soak.py; --write puts its table into BENCHMARKS.md).
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench/soak.py "$@"
