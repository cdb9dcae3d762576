#!/usr/bin/env python3
"""Table 7: soak. A simulated fleet with churn for N minutes against `tidemark run`:
- every minute a new fleet joins for that minute (devices of 3 of 6 groups, so groups and
  devices come and go), 50 msg/s, QoS 1, 2 % duplicates, 1 % malformed;
- the upstream broker is down for 30 s every 5 minutes (store-and-forward);
- the gateway is restarted (SIGTERM) every 4 minutes;
printing, every 30 s: RSS, open fds, the outbox's deepest point in those 30 s (an upstream
outage fills it, store-and-forward empties it), state file + journal size, commits/s.
Flat memory, no fd growth and a bounded state file are the goals.

Usage: scripts/soak.sh [--minutes 30] [--write]   (--write: BENCHMARKS.md table 7)
Env TIDEMARK=path picks the binary (default: a fresh release build).
"""
import argparse
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402


def fds(pid):
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def disk_mib(path):
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.stat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                pass
    return total / 2**20


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--write", action="store_true")
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    source = report.Mosquitto()
    sink = report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-soak-")
    logs = tempfile.mkdtemp(prefix="tm-soak-log-")  # apart: the state dir's size is measured
    log = os.path.join(logs, "gateway.log")
    series = open(os.path.join(logs, "series.txt"), "w")
    print(f"gateway log: {log}; outbox depth per poll: {series.name}", flush=True)
    gw = report.Gateway(bin, state, source.url, sink.url, log="info", log_file=log, extra="""
[group_defaults]
window = { kind = "tumbling", size_ms = 10000 }
idle_timeout_ms = 10000
heartbeat_timeout_ms = 30000
allowed_lateness_ms = 5000
""")
    report.wait_for(lambda: gw.metrics() is not None, "the gateway's endpoint")
    start = time.monotonic()
    end = start + a.minutes * 60
    rows = []
    sims = []
    minute = -1
    restarts = outages = 0
    sink_down_until = None
    last_restart = start
    last_sample = (start, 0.0)
    next_sample = start
    deepest = 0
    while time.monotonic() < end:
        now = time.monotonic()
        m = int((now - start) // 60)
        if m != minute:
            minute = m
            groups = ",".join(f"s{(m + k) % 6}" for k in range(3))
            sims.append(report.spawn(
                [bin, "simulate", "--url", source.url, "--quiet", "--seed", str(m + 1),
                 "--devices", "200", "--groups", groups, "--rate", "50", "--duration-s", "60",
                 "--qos", "1", "--duplicates", "0.02", "--malformed", "0.01"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if sink_down_until is None and m % 5 == 4 and now - start - m * 60 < 1:
            sink.stop()
            outages += 1
            sink_down_until = now + 30
        if sink_down_until is not None and now >= sink_down_until:
            sink = report.Mosquitto(port=sink.port)
            sink_down_until = None
        if now - last_restart >= 240:
            gw.stop()
            gw.start()
            restarts += 1
            last_restart = now
            report.wait_for(lambda: gw.metrics() is not None, "the restarted gateway", timeout=120)
        met = gw.metrics() or {}
        depth = int(met.get("tidemark_outbox_depth", 0))
        deepest = max(deepest, depth)
        print(f"{now - start:.1f} {depth} {int(met.get('tidemark_received_total', 0))}", file=series)
        if now >= next_sample:
            next_sample += 30
            commits = sum(v for k, v in met.items() if k.startswith("tidemark_commits_total"))
            t0, c0 = last_sample
            # The counter restarts with the gateway: no rate across a restart.
            rate = f"{(commits - c0) / max(now - t0, 1e-9):.2f}" if commits >= c0 else "(restart)"
            last_sample = (now, commits)
            row = [f"{(now - start) / 60:.1f}", f"{gw.rss_mib():.1f}", fds(gw.proc.pid),
                   deepest, f"{disk_mib(state):.1f}",
                   rate, int(met.get("tidemark_received_total", 0)), restarts, outages]
            rows.append(row)
            deepest = 0
            print(" | ".join(str(c) for c in row), flush=True)
        time.sleep(0.2)
    for p in sims:
        p.wait()
    gw.stop()
    source.stop()
    if sink_down_until is None:
        sink.stop()
    header = ["minute", "RSS MiB", "open fds", "outbox deepest", "state dir MiB", "commits/s",
              "received (since start)", "restarts", "upstream outages"]
    body = report.table(header, rows)
    print(body)
    if a.write:
        report.write_section(7, f"Soak: {a.minutes:g} minutes of churn, outages and restarts",
                             __doc__.split("Usage")[0].strip() + "\n\n" + body)


if __name__ == "__main__":
    main()
