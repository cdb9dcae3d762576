#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need, then runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
# The gateway tests start real mosquitto brokers (and use mosquitto_sub/pub nowhere else).
if ! command -v mosquitto >/dev/null 2>&1 && [ ! -x /usr/sbin/mosquitto ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y mosquitto mosquitto-clients
fi
# A packaged mosquitto may start as a service on 1883; the tests use their own brokers on free ports.
cargo test --locked -- --include-ignored
