#!/usr/bin/env python3
"""Table 12: adaptive watermarks (docs/reference.md#group_defaults-and-groupsname "Adaptive bound" / "Adaptive lateness").

Four captures of 200 devices in 4 groups, 1 reading/s each, written here
(seeded) and replayed with `tidemark replay --timed` (the virtual time of each
output), 10 s tumbling windows, allowed lateness 30 s, `[time] policy = "device"`:
  steady       network delay exponential, mean 100 ms
  spike        the same, but for 10 minutes every delay is 20-40 s, then back
  backlog      every hour 10 % of the devices go silent for 5 minutes, then
               upload their backlog in order (5 ms apart)
  populations  80 % of the devices with the steady delays, 20 % with 5-15 s
Fixed bounds 200 ms, 1 s, 5 s, 30 s, 120 s are the anchors; "auto" sets both
`out_of_orderness_ms` and `allowed_lateness_ms` to "auto" with the defaults.

Per run: completeness = share of the readings counted in their window's
revision 0; latency = for each window, the virtual time its revision 0 came
out minus the window's end (median, p99); revisions emitted; late readings.
For the spike: how long after its end the median latency per minute is back
within 1.5x the steady trace's.

Usage: python3 scripts/bench/adaptive.py [--minutes 120] [--keep DIR]
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

T0 = 1_764_480_000_000
DEVICES = 200
GROUPS = 4
FIXED = [200, 1_000, 5_000, 30_000, 120_000]


def delays(trace, rng, minutes):
    """(device, k, event, arrival) of every reading of the trace."""
    spike = (55 * 60_000, 65 * 60_000)
    slow = set(rng.sample(range(DEVICES), DEVICES // 5))
    silences = []  # (from, to, devices)
    for h in range(minutes // 60 + 1):
        start = h * 3_600_000 + 30 * 60_000
        if start + 300_000 < minutes * 60_000:
            silences.append((start, start + 300_000, set(rng.sample(range(DEVICES), DEVICES // 10))))
    out = []
    for d in range(DEVICES):
        phase = d * 1000 // DEVICES
        backlog = 0
        for k in range(minutes * 60):
            rel = k * 1000 + phase
            e = T0 + rel
            delay = rng.expovariate(1 / 100.0)
            if trace == "spike" and spike[0] <= rel < spike[1]:
                delay = rng.uniform(20_000, 40_000)
            elif trace == "populations" and d in slow:
                delay = rng.uniform(5_000, 15_000)
            arrival = e + int(delay)
            if trace == "backlog":
                for lo, hi, devs in silences:
                    if d in devs and lo <= rel < hi:
                        # Buffered on the device, sent in order when the silence ends.
                        arrival = T0 + hi + backlog * 5 + d % 5
                        backlog += 1
                        break
                else:
                    backlog = 0
            out.append((arrival, d, k, e))
    out.sort()
    return out


def write_capture(path, readings):
    with open(path, "w") as f:
        for arrival, d, k, e in readings:
            f.write(json.dumps({"arrival": arrival, "topic": f"sensors/g{d % GROUPS}/d{d}/reading",
                                "payload": {"ts": e, "seq": k, "v": 1}},
                               separators=(",", ":")) + "\n")


def config(path, state, bound, lateness, policy="device", window_ms=10_000):
    q = lambda v: f'"{v}"' if v == "auto" else str(v)
    with open(path, "w") as f:
        f.write(f"""[gateway]
id = "bench"
state_dir = "{state}"
[time]
policy = "{policy}"
[group_defaults]
window = {{ kind = "tumbling", size_ms = {window_ms} }}
out_of_orderness_ms = {q(bound)}
allowed_lateness_ms = {q(lateness)}
""")


def run(bin, cfg, capture, out):
    subprocess.run([bin, "replay", "--config", cfg, "--input", capture, "--output", out,
                    "--drain-ms", "300000", "--timed"], check=True)
    first = {}  # window (group, device, start) -> (end, at, count)
    revisions = late = 0
    with open(out) as f:
        for line in f:
            o = json.loads(line)
            t = o["topic"]
            if "/windows/" in t:
                p = o["payload"]
                if p["revision"] == 0:
                    first[(p["group"], p["device"], p["start"])] = (p["end"], o["at"], p["count"])
                else:
                    revisions += 1
            elif "/late/" in t:
                late += 1
    return first, revisions, late


def summarize(first, revisions, late, total):
    lat = sorted(at - end for end, at, _ in first.values())
    counted = sum(c for _, _, c in first.values())
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0
    return {"complete": counted / total, "median": statistics.median(lat) if lat else 0,
            "p99": p99, "revisions": revisions, "late": late, "windows": len(first)}


def recovery(first, steady_median, minutes):
    """Seconds after the spike's end until the per-minute median latency is within 1.5x steady."""
    end = T0 + 65 * 60_000
    last = T0 + (minutes - 1) * 60_000  # the windows closed by the drain are left out
    by_minute = {}
    for w_end, at, _ in first.values():
        if end < w_end <= last:
            by_minute.setdefault((w_end - end) // 60_000, []).append(at - w_end)
    for m in sorted(by_minute):
        if statistics.median(by_minute[m]) <= 1.5 * steady_median and all(
                statistics.median(by_minute[n]) <= 1.5 * steady_median
                for n in by_minute if n > m):
            return m * 60
    return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=int, default=120)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--keep", help="keep captures and outputs in this directory")
    ap.add_argument("--traces", default="steady,spike,backlog,populations")
    ap.add_argument("--no-write", action="store_true", help="print only, do not touch BENCHMARKS.md")
    ap.add_argument("--policy", default="device", help="[time] policy (device | calibrated | arrival)")
    ap.add_argument("--window-ms", type=int, default=10_000)
    a = ap.parse_args()
    bin = report.tidemark_bin()
    work = a.keep or tempfile.mkdtemp(prefix="tm-bench-adaptive-")
    os.makedirs(work, exist_ok=True)
    configs = [(f"fixed {b} ms", b, 30_000) for b in FIXED] + [("auto", "auto", "auto")]
    results = {}
    for trace in a.traces.split(","):
        rng = random.Random(f"{a.seed}-{trace}")
        readings = delays(trace, rng, a.minutes)
        capture = os.path.join(work, f"{trace}.jsonl")
        write_capture(capture, readings)
        for name, bound, lateness in configs:
            cfg = os.path.join(work, f"{trace}-{name.replace(' ', '_')}.toml")
            config(cfg, os.path.join(work, "state"), bound, lateness, a.policy, a.window_ms)
            first, revs, late = run(bin, cfg, capture, cfg.replace(".toml", ".out"))
            s = summarize(first, revs, late, len(readings))
            s["first"] = first
            s["total"] = len(readings)
            results[(trace, name)] = s
            print(f"{trace:12} {name:16} complete {100 * s['complete']:8.4f} %  median "
                  f"{s['median'] / 1000:7.2f} s  p99 {s['p99'] / 1000:7.2f} s  revisions "
                  f"{revs:6}  late {late:6}", flush=True)
    rows, verdicts = [], []
    steady_best = None
    for trace in a.traces.split(","):
        fixed_ok = [results[(trace, f"fixed {b} ms")] for b in FIXED
                    if results[(trace, f"fixed {b} ms")]["complete"] >= 0.999]
        anchor = fixed_ok[0]["median"] if fixed_ok else None
        if trace == "steady":
            steady_best = min(results[(trace, f"fixed {b} ms")]["median"] for b in FIXED)
        for name, _, _ in configs:
            s = results[(trace, name)]
            ratio = f"{s['median'] / anchor:.2f}x" if anchor else "-"
            rows.append([trace, name, f"{100 * s['complete']:.3f}", f"{s['median'] / 1000:.1f}",
                         f"{s['p99'] / 1000:.1f}", s["revisions"], s["late"],
                         f"{100 * s['late'] / s['total']:.3f}", ratio])
        auto = results[(trace, "auto")]
        if trace == "backlog":
            goal = steady_best and auto["median"] <= 1.25 * steady_best
            ok = auto["late"] <= 0.001 * auto["total"] and goal
            verdicts.append(f"backlog: late {auto['late']} = {100 * auto['late'] / auto['total']:.3f} % "
                            f"of readings (goal <= 0.1 %), median {auto['median'] / 1000:.2f} s vs the steady "
                            f"trace's best {steady_best / 1000 if steady_best else float('nan'):.2f} s "
                            f"(goal <= 1.25x): {'met' if ok else 'NOT met'}")
        elif anchor:
            ok = auto["complete"] >= 0.999 and auto["median"] <= 1.25 * anchor
            verdicts.append(f"{trace}: completeness {100 * auto['complete']:.3f} % (goal >= 99.9 %), median "
                            f"{auto['median'] / 1000:.2f} s = {auto['median'] / anchor:.2f}x the smallest fixed "
                            f"bound reaching 99.9 % (goal <= 1.25x): {'met' if ok else 'NOT met'}")
        if trace == "spike" and steady_best:
            r = recovery(auto["first"], results[("steady", "auto")]["median"]
                         if ("steady", "auto") in results else steady_best, a.minutes)
            verdicts.append(f"spike: per-minute median latency back within 1.5x steady {r} s after the "
                            f"spike ended (goal <= horizon_s = 900 s)")
    body = (f"{DEVICES} devices in {GROUPS} groups, 1 reading/s, {a.minutes}-minute traces, 10 s tumbling "
            "windows, lateness 30 s (fixed rows), `policy = \"device\"`, `tidemark replay --timed` "
            "(`python3 scripts/bench/adaptive.py`). Latency: the virtual time a window's revision 0 came "
            "out minus its end; vs anchor: median latency over that of the smallest fixed bound reaching "
            "99.9 % on the trace.\n\n"
            + report.table(["trace", "bound", "complete %", "median s", "p99 s", "revisions", "late",
                            "late %", "vs anchor"], rows)
            + "\n\n" + "\n".join(f"- {v}" for v in verdicts) + "\n")
    print(body)
    if not a.no_write:
        report.write_section(12, "Adaptive watermarks: fixed bounds vs \"auto\" on four delay shapes", body)


if __name__ == "__main__":
    main()
