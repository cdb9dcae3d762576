#!/usr/bin/env python3
"""Table 3b: `replay` against its physical-limit anchor, a bare loop.

The table-3 workload (2 000 000 readings, 10 000 devices, 1-minute windows, 5 s
bound; scripts/bench/gen_events.py) through `tidemark replay` (scripts/bench/
peers.toml, `policy = "device"`) built with the `release` and `dist` profiles,
and through benches/bare_loop.rs: a single-threaded loop doing the least the job
needs (borrowed serde_json parse, hash-map lookup, fold into 1-minute windows,
per-device watermark, JSON lines out; no calibration, dedup or durability).
Runs alternate, --rounds each; wall time and CPU time (user + sys) per run,
medians; the ratios are bare / tidemark (above 1: tidemark is faster).

Usage: python3 scripts/bench/bare.py [--rounds 3] [--no-dist] [--no-write]
"""
import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def bare_binary():
    r = subprocess.run(["cargo", "bench", "--bench", "bare_loop", "--no-run",
                        "--message-format=json"], cwd=report.ROOT, check=True,
                       capture_output=True, text=True)
    for line in r.stdout.splitlines():
        m = json.loads(line)
        if m.get("reason") == "compiler-artifact" and m.get("target", {}).get("name") == "bare_loop" \
                and m.get("executable"):
            return m["executable"]
    sys.exit("no bare_loop executable")


def dist_binary(opt_level=None):
    """The `dist` build (what the .deb ships); with `opt_level`, that profile at another
    opt-level (CARGO_PROFILE_DIST_OPT_LEVEL) in a target dir of its own."""
    env, target = dict(os.environ), os.path.join(report.ROOT, "target")
    if opt_level:
        env["CARGO_PROFILE_DIST_OPT_LEVEL"] = opt_level
        target = os.path.join(target, f"dist-opt-{opt_level}")
    subprocess.run(["cargo", "build", "--profile", "dist", "--quiet", "--target-dir", target],
                   cwd=report.ROOT, check=True, env=env)
    return os.path.join(target, "dist", "tidemark")


def timed(cmd):
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        sys.exit(f"{cmd[0]} failed:\n{r.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, r.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-dist", action="store_true")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--dist-opt-levels", default="",
                    help="also the dist profile at these opt-levels, e.g. 3,2 (the shipped one is s)")
    a = ap.parse_args()
    cap, _ = report.workload()
    cfg = os.path.join(HERE, "peers.toml")
    out = os.path.join(report.WORK, "bare-replay.jsonl")
    runs = {"bare loop": lambda: [bare_binary_path, cap],
            "tidemark replay (release)": lambda: [release, "replay", "--config", cfg, "--input", cap,
                                                  "--flush", "--output", out]}
    bare_binary_path = bare_binary()
    release = report.tidemark_bin()
    if not a.no_dist:
        dist = dist_binary()
        runs["tidemark replay (dist)"] = lambda: [dist, "replay", "--config", cfg, "--input", cap,
                                                  "--flush", "--output", out]
    sizes = {"tidemark replay (release)": os.path.getsize(release)}
    if not a.no_dist:
        sizes["tidemark replay (dist)"] = os.path.getsize(dist)
    for level in filter(None, a.dist_opt_levels.split(",")):
        b = dist_binary(level)
        name = f"tidemark replay (dist, opt-level {level})"
        runs[name] = lambda b=b: [b, "replay", "--config", cfg, "--input", cap, "--flush",
                                  "--output", out]
        sizes[name] = os.path.getsize(b)
    times = {k: [] for k in runs}
    for _ in range(a.rounds):
        for name, cmd in runs.items():
            wall, cpu, stdout = timed(cmd())
            times[name].append((wall, cpu))
            if name == "bare loop":
                bare = json.loads(stdout.strip().splitlines()[-1])
    med = lambda xs: statistics.median(xs)
    bw = med([w for w, _ in times["bare loop"]])
    bc = med([c for _, c in times["bare loop"]])
    rows = []
    for name, ts in times.items():
        w, c = med([w for w, _ in ts]), med([c for _, c in ts])
        size = f"{sizes[name] / 2**20:.1f}" if name in sizes else "–"
        rows.append([name, f"{w:.2f}", f"{min(x for x, _ in ts):.2f}-{max(x for x, _ in ts):.2f}",
                     f"{c:.2f}", f"{bw / w:.2f}x", f"{bc / c:.2f}x", size])
    body = (f"{bare['readings']:,} readings from 10 000 devices (the table-3 workload), "
            f"{a.rounds} rounds alternating; the bare loop emitted {bare['windows']:,} windows "
            "(`python3 scripts/bench/bare.py`). Ratios: bare / tidemark, wall and CPU (user + sys); "
            "goals >= 1.2x wall, >= 0.8x CPU.\n\n"
            + report.table(["run", "wall s (median)", "range", "CPU s (median)", "speed vs bare (wall)",
                            "per CPU second vs bare", "binary MiB"], rows) + "\n")
    print(body)
    if not a.no_write:
        report.write_section(13, "Replay against a bare loop (the physical-limit anchor)", body)


if __name__ == "__main__":
    main()
