#!/usr/bin/env python3
"""Table 1: the engine alone (no MQTT, no store): events/s with 10 000 devices
in 20 groups, JSON and CBOR payloads (`cargo bench --bench engine`, criterion).

Absolute speeds differ 3-4x between machines; read them beside the ratios of
tables 2 and 3, which are measured against a peer or the path's limit in one run.

Usage: python3 scripts/bench/engine.py
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

BATCH = 100_000  # events per criterion iteration (benches/engine.rs)


def main():
    subprocess.run(["cargo", "bench", "--bench", "engine", "--", "--noplot"], cwd=report.ROOT,
                   check=True)
    rows = []
    for fmt in ("json", "cbor"):
        est = os.path.join(report.ROOT, "target", "criterion", "engine", "on_message+tick", fmt,
                           "new", "estimates.json")
        with open(est) as f:
            e = json.load(f)
        # Criterion's own figure: the slope of time over iterations (robust to a stray
        # slow sample), the mean when it did not sample linearly.
        est = e.get("slope") or e["mean"]
        ns = est["point_estimate"]
        lo = est["confidence_interval"]["lower_bound"]
        hi = est["confidence_interval"]["upper_bound"]
        rows.append([fmt.upper(), f"{BATCH / ns * 1e9:,.0f}",
                     f"{BATCH / hi * 1e9:,.0f} - {BATCH / lo * 1e9:,.0f}",
                     f"{ns / BATCH:.0f}"])
    t = report.table(["payload", "events/s", "95% interval", "ns per event"], rows)
    print(t)
    body = f"""`Engine::on_message` + `on_tick` (every 200 ms of virtual time) on a warm state: 10 000
devices in 20 groups, each reading `{{"ts", "seq", "temp", "hum"}}` (JSON, or the same map in
CBOR), one per device per second, devices interleaved; 1-minute tumbling windows, calibrated
clocks, duplicate filter on. One core; criterion, 10 samples of 100 000 events.

{t}

Absolute figures differ 3-4x between machines: read them beside the ratios in tables 2 and 3,
measured against the path's limit and against peers on the same machine in one run.

Reproduce: `python3 scripts/bench/engine.py` (= `cargo bench --bench engine`)."""
    report.write_section(1, "Engine alone: events/s", body)


if __name__ == "__main__":
    main()
