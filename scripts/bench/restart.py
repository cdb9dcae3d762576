#!/usr/bin/env python3
"""Table 5: restart and store-and-forward.

1. Restart: a gateway whose state holds ~100 000 open windows (10 000 devices,
   100 ms tumbling windows kept for an hour of allowed lateness) and ~100 000
   undelivered outputs (the upstream broker was never reachable) is stopped;
   one reading is queued for it on the source broker; the time from process
   start to that reading processed and committed (the first `batch` commit
   with an ack in its debug log) is measured. Goal: < 1 s.
2. Drain: a gateway that built up an outbox of ~1 000 000 window results while
   the upstream broker was down; the broker comes up; the time until the outbox
   is empty (`tidemark_outbox_depth` = 0) gives the delivery rate.

Usage: python3 scripts/bench/restart.py [--outbox N]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

GROUPS = "g0,g1,g2,g3,g4,g5,g6,g7,g8,g9"


def inspect(bin, state):
    r = subprocess.run([bin, "inspect", "--state-dir", state, "--json"], capture_output=True,
                       text=True, check=True)
    return json.loads(r.stdout)


def open_windows(doc):
    return sum(len(d.get("open_windows", [])) for d in doc.get("devices", []))


def build(bin, state, src, sink_port, devices, messages, rate, lateness_ms, extra=""):
    """Fills a state: `messages` readings through a gateway whose uplink is down."""
    gw = report.Gateway(bin, state, src.url, f"mqtt://127.0.0.1:{sink_port}", extra=f"""
[group_defaults]
out_of_orderness_ms = 0
allowed_lateness_ms = {lateness_ms}
idle_timeout_ms = 2000
window = {{ kind = "tumbling", size_ms = 100 }}
{extra}""", sink_extra="outbox_max_messages = 5000000", env=dict(os.environ, RUST_LOG="tidemark=debug"))
    src.wait_subscribed("tidemark-bench-in")
    report.simulate(bin, src.url, "--devices", devices, "--groups", GROUPS, "--rate", rate,
                    "--count", messages, "--qos", 1, "--connections", 2)
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) >= messages,
                    "gateway to take the load", every=0.2)
    # Idle devices let the watermarks pass the last windows: every result is in the outbox.
    time.sleep(4)
    return gw


def restart(bin, a):
    src = report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-rs-")
    gw = build(bin, state, src, report.free_port(), 10_000, 100_000, 20_000, 3_600_000)
    gw.stop()
    doc = inspect(bin, state)
    windows, depth = open_windows(doc), doc.get("outbox", {}).get("depth", 0)
    times = []
    for _ in range(3):
        report.simulate(bin, src.url, "--devices", 1, "--groups", "g0", "--rate", 0,
                        "--count", 1, "--qos", 1, "--seed", 99 + len(times))
        first = threading.Event()
        gw.start()

        def watch(proc=gw.proc):
            for line in proc.stderr:
                if " batch" in line and "acks=0" not in line and "acks=" in line:
                    first.set()
                    return

        threading.Thread(target=watch, daemon=True).start()
        if not first.wait(60):
            sys.exit("no commit with an ack after restart")
        times.append(time.monotonic() - gw.started)
        gw.stop()
    size = os.path.getsize(os.path.join(state, "tidemark.redb")) / 2**20
    src.stop()
    shutil.rmtree(state, ignore_errors=True)
    return windows, depth, times, size


def drain(bin, a):
    src = report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-dr-")
    up_port = report.free_port()
    gw = build(bin, state, src, up_port, 10_000, a.outbox, 0, 0)
    depth = gw.metric("tidemark_outbox_depth")
    up = report.Mosquitto(port=up_port)
    t0 = time.monotonic()
    report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox to drain",
                    timeout=3600, every=0.1)
    dt = time.monotonic() - t0
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return depth, dt


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outbox", type=int, default=1_000_000)
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    windows, depth, times, size = restart(bin, a)
    print(f"restart: {windows} open windows, outbox {depth}, {times}", flush=True)
    ddepth, ddt = drain(bin, a)
    print(f"drain: {ddepth} in {ddt:.1f} s", flush=True)
    t = report.table(["what", "state", "result"], [
        ["restart: process start -> first reading processed and committed",
         f"{windows:,} open windows, {depth:,} outputs in the outbox, {size:.0f} MiB file",
         " / ".join(f"{x * 1000:.0f} ms" for x in times) + " (3 restarts)"],
        ["store-and-forward: outbox drained to a broker that came back",
         f"{ddepth:,.0f} outputs queued (window results, device status)", f"{ddt:.1f} s = {ddepth / ddt:,.0f} msg/s"],
    ])
    print(t)
    body = f"""Restart: the state was built by `tidemark run` from 100 000 readings of 10 000 devices with
100 ms tumbling windows kept for an hour of allowed lateness, the upstream broker never
reachable (so every result waits in the outbox); counts from `tidemark inspect --json`. One
reading is queued on the source broker for the gateway's kept session; time from process start
to the first commit that acknowledges it (its debug log). Goal: < 1 s.
Drain: {a.outbox:,} readings through a gateway whose upstream broker is down (100 ms windows,
no lateness: one result per reading waits in the outbox); then the broker starts; time until
`tidemark_outbox_depth` is 0 (QoS 1, each output removed once acknowledged).

{t}

Reproduce: `python3 scripts/bench/restart.py` (`--outbox` sets the drain's size)."""
    report.write_section(5, "Restart time and store-and-forward drain", body)


if __name__ == "__main__":
    main()
