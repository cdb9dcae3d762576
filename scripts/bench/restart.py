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
import re
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


def build(bin, state, src, sink_port, devices, messages, rate, lateness_ms, extra="",
          sink_extra="", log_file=None):
    """Fills a state: `messages` readings through a gateway whose uplink is down."""
    gw = report.Gateway(bin, state, src.url, f"mqtt://127.0.0.1:{sink_port}", extra=f"""
[group_defaults]
out_of_orderness_ms = 0
allowed_lateness_ms = {lateness_ms}
idle_timeout_ms = 2000
window = {{ kind = "tumbling", size_ms = 100 }}
{extra}""", sink_extra="outbox_max_messages = 5000000\n" + sink_extra, env=dict(os.environ, RUST_LOG="tidemark=debug"),
        log_file=log_file)
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


def drain(bin, a, one_way_s=0.0, stock=True, n=None, window=None):
    """Outbox drain to a stock mosquitto, directly or through a delaying proxy: the time from
    the uplink's connection to an empty outbox. Also returns one delivered (topic, payload)."""
    src = report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-dr-")
    up_port = report.free_port()
    proxy = report.DelayProxy(up_port, one_way_s) if one_way_s else None
    log = os.path.join(tempfile.mkdtemp(prefix="tm-bench-drlog-"), "gateway.log")
    gw = build(bin, state, src, proxy.port if proxy else up_port, 10_000, n or a.outbox, 0, 0,
               sink_extra=f"max_inflight = {window or a.max_inflight}"
               if (window or a.max_inflight) else "",
               log_file=log)
    depth = gw.metric("tidemark_outbox_depth")
    up = report.Mosquitto(port=up_port, stock=stock)
    sample = subprocess.Popen(["mosquitto_sub", "-p", str(up_port), "-t", "tidemark/+/windows/#",
                               "-C", "1", "-v"], stdout=subprocess.PIPE, text=True)
    report.wait_for(lambda: gw.metric('tidemark_connected{link="sink"}') == 1, "uplink",
                    timeout=120, every=0.05)
    t0 = time.monotonic()
    report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox to drain",
                    timeout=3600, every=0.1)
    dt = time.monotonic() - t0
    topic, payload = sample.communicate(timeout=30)[0].strip().split(" ", 1)
    gw.stop()
    with open(log) as f:
        limit = re.search(r"max_inflight=(\d+) broker_receive_maximum=(\d+)", f.read())
    shutil.rmtree(os.path.dirname(log), ignore_errors=True)
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return depth, dt, (topic, payload), limit.groups() if limit else ("?", "?")


def mosquitto_pub(n, topic, payload):
    """`mosquitto_pub -q 1` sending n copies of one output to a stock mosquitto: seconds."""
    up = report.Mosquitto(stock=True)
    lines = os.path.join(up.dir, "lines")
    with open(lines, "w") as f:
        f.write((payload + "\n") * n)
    t = time.monotonic()
    with open(lines) as f:
        subprocess.run(["mosquitto_pub", "-p", str(up.port), "-q", "1", "-t", topic, "-l"],
                       stdin=f, check=True)
    dt = time.monotonic() - t
    up.stop()
    return dt


def inflight(limits):
    """The window a connection used: the smaller of the gateway's and the broker's."""
    try:
        return min(int(limits[0]), int(limits[1]))
    except ValueError:
        return "?"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outbox", type=int, default=1_000_000)
    ap.add_argument("--max-inflight", type=int, default=0,
                    help="the gateway's sink.max_inflight (default: its own)")
    ap.add_argument("--drain-only", action="store_true", help="the drain rows only, nothing written")
    ap.add_argument("--stock-proxy", type=int, default=1_000,
                    help="readings for the stock broker behind the proxy (its limit: ~100 msg/s)")
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    if not a.drain_only:
        windows, depth, times, size = restart(bin, a)
        print(f"restart: {windows} open windows, outbox {depth}, {times}", flush=True)
    ddepth, ddt, (topic, payload), limits = drain(bin, a)
    print(f"drain: {ddepth} in {ddt:.1f} s; window {limits}", flush=True)
    mdt = mosquitto_pub(int(ddepth), topic, payload)
    print(f"mosquitto_pub: {ddepth} in {mdt:.1f} s", flush=True)
    # A broker that takes any number unacknowledged (max_inflight_messages 0): the
    # gateway's own window is what a long round trip meets.
    odepth, odt, _, olimits = drain(bin, a, stock=False)
    print(f"drain, unlimited broker: {odepth} in {odt:.1f} s; window {olimits}", flush=True)
    pdepth, pdt, _, plimits = drain(bin, a, one_way_s=0.1, stock=False)
    print(f"drain through 200 ms, unlimited broker: {pdepth} in {pdt:.1f} s", flush=True)
    wdepth, wdt, _, wlimits = drain(bin, a, one_way_s=0.1, stock=False, window=16384)
    print(f"drain through 200 ms, window 16384: {wdepth} in {wdt:.1f} s", flush=True)
    sdepth, sdt, _, slimits = drain(bin, a, one_way_s=0.1, n=a.stock_proxy)
    print(f"drain through 200 ms, stock broker: {sdepth} in {sdt:.1f} s", flush=True)
    rate, mrate, orate = ddepth / ddt, ddepth / mdt, odepth / odt
    prate, srate, wrate = pdepth / pdt, sdepth / sdt, wdepth / wdt
    drain_rows = [
        ["store-and-forward: outbox drained to a stock mosquitto that came back",
         f"{ddepth:,.0f} outputs queued (window results, device status); in flight at most "
         f"{inflight(limits)} (sink.max_inflight {limits[0]}, the broker's Receive Maximum "
         f"{limits[1]})",
         f"{ddt:.1f} s = {rate:,.0f} msg/s = {rate / mrate:.2f}x mosquitto_pub"],
        ["the same messages from `mosquitto_pub -q 1 -l` to a stock mosquitto",
         f"{ddepth:,.0f} lines of one window result ({len(payload)} bytes)",
         f"{mdt:.1f} s = {mrate:,.0f} msg/s"],
        ["drained to a mosquitto with `max_inflight_messages 0` (no Receive Maximum)",
         f"{odepth:,.0f} outputs queued; in flight at most {olimits[0]} "
         f"(Receive Maximum {olimits[1]})",
         f"{odt:.1f} s = {orate:,.0f} msg/s"],
        ["the same through a proxy adding 100 ms each way (200 ms round trip)",
         f"{pdepth:,.0f} outputs queued; in flight at most {plimits[0]}",
         f"{pdt:.1f} s = {prate:,.0f} msg/s = {prate / orate:.2f}x the direct drain"],
        ["the same with `sink.max_inflight = 16384`",
         f"{wdepth:,.0f} outputs queued; in flight at most {wlimits[0]}",
         f"{wdt:.1f} s = {wrate:,.0f} msg/s = {wrate / orate:.2f}x the direct drain"],
        ["a stock mosquitto through the same proxy",
         f"{sdepth:,.0f} outputs queued; in flight at most {slimits[1]} (its Receive Maximum)",
         f"{sdt:.1f} s = {srate:,.0f} msg/s = {srate / rate:.3f}x its direct drain"],
    ]
    if a.drain_only:
        print(report.table(["what", "state", "result"], drain_rows))
        return
    t = report.table(["what", "state", "result"], [
        ["restart: process start -> first reading processed and committed",
         f"{windows:,} open windows, {depth:,} outputs in the outbox, {size:.0f} MiB file",
         " / ".join(f"{x * 1000:.0f} ms" for x in times) + " (3 restarts)"],
    ] + drain_rows)
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
