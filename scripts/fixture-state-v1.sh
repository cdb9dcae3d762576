#!/bin/bash
# Writes the state dir of tests/compat.rs with a given binary: a checkpoint (graceful
# stop), then journal records with a reload among them, then kill -9.
# Usage: BIN=path/to/tidemark scripts/fixture-state-v1.sh OUT_DIR
set -euo pipefail
BIN=$(realpath "${BIN:-target/release/tidemark}")
OUT=$(realpath -m "${1:?output directory}")
mkdir -p "$OUT"
D=$(mktemp -d)
cd "$D"
PORT=$((20000 + RANDOM % 20000))
echo "listener $PORT 127.0.0.1
allow_anonymous true" > $D/mq.conf
mosquitto -c $D/mq.conf >/dev/null 2>&1 & MQ=$!
sleep 0.5
conf() { cat <<C
[gateway]
id = "fx"
state_dir = "$OUT"
[source]
url = "mqtt://127.0.0.1:$PORT"
client_id = "fx-in"
probe_after_ms = 0
[time]
policy = "device"
[sink]
url = "mqtt://127.0.0.1:$PORT"
[group_defaults]
out_of_orderness_ms = 1000
idle_timeout_ms = 1500
window = { kind = "tumbling", size_ms = 10000 }
[groups.hvac]
$1
C
}
conf 'idle_timeout_ms = 1500' > a.toml
conf 'idle_timeout_ms = 8000
out_of_orderness_ms = 3000
window = { kind = "tumbling", size_ms = 20000 }' > b.toml
T0=$(( $(date +%s%3N) - 50000 ))
pub() { # group device i
  mosquitto_pub -p $PORT -q 1 -t "sensors/$1/$2/reading" -m "{\"ts\":$((T0 + $3 * 1000)),\"seq\":$3,\"temp\":$(( $3 % 7 )).5}"
}
cp a.toml run.toml
$BIN run --config run.toml >log1 2>&1 & GW=$!
sleep 1.5
for i in $(seq 0 14); do pub hvac d1 $i; pub hvac d2 $i; pub line d3 $i; done
sleep 2
kill -TERM $GW; wait $GW || true
$BIN run --config run.toml >log2 2>&1 & GW=$!
sleep 1.5
for i in $(seq 15 24); do pub hvac d1 $i; pub line d3 $i; done
sleep 1.5
cp b.toml run.toml; kill -HUP $GW; sleep 1
for i in $(seq 25 44); do pub hvac d1 $i; pub hvac d2 $i; pub line d3 $i; done
sleep 2
kill -9 $GW; wait $GW || true
kill $MQ
# The journal is preallocated with zeros; its records are all in the first pages.
truncate -s 4096 "$OUT/tidemark.wal"
rm -rf "$D"
