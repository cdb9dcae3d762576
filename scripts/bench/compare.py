#!/usr/bin/env python3
"""Before/after in one run: `tidemark replay` of two builds on the table-3 workload
(2 M readings, 10 000 devices; time.policy = device and calibrated) and on
tests/data, rounds alternating; prints wall-clock medians, the ratio, and whether
the outputs are byte-identical.

Usage: scripts/bench/compare.py BEFORE_BIN AFTER_BIN [--rounds 3]
"""
import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

HERE = os.path.dirname(__file__)


def digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def replay(bin, cfg, cap, out, extra=()):
    t = time.monotonic()
    subprocess.run([bin, "replay", "--config", cfg, "--input", cap, "--output", out, *extra],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.monotonic() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    cap, _ = report.workload()
    w = report.WORK
    dev_cfg = os.path.join(HERE, "peers.toml")
    cal_cfg = os.path.join(w, "calibrated.toml")
    with open(dev_cfg) as f, open(cal_cfg, "w") as g:
        g.write(f.read().replace('policy = "device"', 'policy = "calibrated"'))
    root = os.path.join(HERE, "..", "..")
    data_cfg = os.path.join(root, "tests", "data", "replay.toml")
    data_cap = os.path.join(root, "tests", "data", "capture.jsonl")
    rows = []
    for name, cfg, c, extra in [
        ("table 3, policy = device", dev_cfg, cap, ("--flush",)),
        ("table 3, policy = calibrated", cal_cfg, cap, ("--flush",)),
    ]:
        times = {"before": [], "after": []}
        sums = {}
        for r in range(a.rounds):
            order = [("before", a.before), ("after", a.after)]
            if r % 2:
                order.reverse()
            for label, bin in order:
                out = os.path.join(w, f"compare-{label}.jsonl")
                times[label].append(replay(bin, cfg, c, out, extra))
                sums[label] = digest(out)
        b, f = statistics.median(times["before"]), statistics.median(times["after"])
        rows.append([name, f"{b:.2f}", f"{f:.2f}", f"{b / f:.2f}x",
                     "yes" if sums["before"] == sums["after"] else "NO"])
    if os.path.exists(data_cfg) and os.path.exists(data_cap):
        sums = {}
        for label, bin in [("before", a.before), ("after", a.after)]:
            out = os.path.join(w, f"compare-data-{label}.jsonl")
            replay(bin, data_cfg, data_cap, out, ("--drain-ms", "300000"))
            sums[label] = digest(out)
        rows.append(["tests/data capture", "-", "-", "-",
                     "yes" if sums["before"] == sums["after"] else "NO"])
    print(report.table(["workload", "before s (median)", "after s (median)",
                        "speed after/before", "outputs byte-identical"], rows))


if __name__ == "__main__":
    main()
