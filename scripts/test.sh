#!/usr/bin/env bash
# The project's test command (README, CI). Installs what the tests need, then runs them all.
set -euo pipefail
cd "$(dirname "$0")/.."
# Sizes checked, not hoped for: no source file over 600 lines (functions: clippy's too_many_lines).
long=$(find src tests benches -name '*.rs' -print0 | xargs -0 wc -l | awk '$2 != "total" && $1 > 600')
if [ -n "$long" ]; then
  echo "files over 600 lines (split them by responsibility):" >&2
  echo "$long" >&2
  exit 1
fi
# The gateway tests start real mosquitto brokers on free ports (a packaged service on 1883
# is not used) and make a private CA with openssl for the TLS test.
need=""
command -v mosquitto >/dev/null 2>&1 || [ -x /usr/sbin/mosquitto ] || need="$need mosquitto"
command -v mosquitto_passwd >/dev/null 2>&1 || need="$need mosquitto"
command -v mosquitto_sub >/dev/null 2>&1 || need="$need mosquitto-clients"
command -v openssl >/dev/null 2>&1 || need="$need openssl"
# tests/package.rs checks the packaged unit with systemd-analyze.
command -v systemd-analyze >/dev/null 2>&1 || need="$need systemd"
# tests/demo.rs runs the demo on a pseudo-terminal (util-linux `script`); tests and
# the demo signal processes with kill(1).
command -v script >/dev/null 2>&1 || need="$need bsdutils"
[ -x /usr/bin/kill ] || [ -x /bin/kill ] || need="$need procps"
# tests/clock_step.rs steps the gateway's wall clock with libfaketime.
command -v faketime >/dev/null 2>&1 || need="$need faketime"
# tests/status.rs renders the status page in a real browser (headless Chromium);
# tests/prometheus.rs scrapes a gateway with a real Prometheus and checks the rules with promtool.
command -v chromium >/dev/null 2>&1 || need="$need chromium"
command -v prometheus >/dev/null 2>&1 || need="$need prometheus"
# tests/netfault.rs runs the gateway in a network namespace (iproute2) and drops its
# packets with nftables (a blackholed link sends no RST).
command -v ip >/dev/null 2>&1 || [ -x /usr/sbin/ip ] || [ -x /sbin/ip ] || need="$need iproute2"
command -v nft >/dev/null 2>&1 || [ -x /usr/sbin/nft ] || need="$need nftables"
# tests/kernel_clock.rs denies adjtimex to the gateway with a seccomp filter (Debian's python3-seccomp).
ls /usr/lib/python3/dist-packages/seccomp*.so >/dev/null 2>&1 || need="$need python3-seccomp"
# tests/sparkplug.rs runs Eclipse Tahu's Node.js edge node.
command -v node >/dev/null 2>&1 || need="$need nodejs"
command -v npm >/dev/null 2>&1 || need="$need npm"
# tests/db_outputs.rs writes into real PostgreSQL and InfluxDB 1.x servers it starts itself.
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need="$need postgresql"
command -v influxd >/dev/null 2>&1 || need="$need influxdb"
command -v curl >/dev/null 2>&1 || need="$need curl"
command -v setpriv >/dev/null 2>&1 || need="$need util-linux"
if [ -n "$need" ]; then
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  # Another apt on the machine (unattended upgrades, a bench installing Java) holds the lock a while.
  $SUDO apt-get -o DPkg::Lock::Timeout=600 update
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get -o DPkg::Lock::Timeout=600 install -y $need
fi
# The Tahu edge node's packages, pinned by tests/sparkplug/package-lock.json.
(cd tests/sparkplug && npm ci --no-audit --no-fund)
# The .deb packages (amd64, arm64) that tests/package.rs inspects and installs into a scratch root.
bash scripts/build-deb.sh
# Property tests run one fixed family of cases here, the same on every machine, so a
# landing never hangs on a case drawn at random; scripts/explore.sh draws fresh ones.
export PROPTEST_RNG_SEED=${PROPTEST_RNG_SEED:-20261206}
cargo test --locked -- --include-ignored
