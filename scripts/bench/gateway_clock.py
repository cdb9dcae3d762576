#!/usr/bin/env python3
"""The gateway's own clock far off, through the real binary's `replay` on
captures that carry `mono` and `synced` as `tidemark capture` writes them:
10 true-clock devices at 1 Hz, one 17 min fast, one 2 h off, network delay
5 ms + exponential (mean 150 ms), the kernel unsynchronized until NTP steps
the clock right after 2-5 minutes; 10 minutes per run. Prints a table
(markdown). TIDEMARK picks the binary (default target/release/tidemark).

    python3 scripts/bench/gateway_clock.py
"""
import json
import os
import random
import subprocess
import sys
import tempfile

T0 = 1_764_480_000_000
MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
RUN = 10 * MIN
WINDOW = 10_000
BIN = os.environ.get("TIDEMARK", "target/release/tidemark")

CONFIG = f"""[gateway]
id = "gw"
[group_defaults]
window = {{ kind = "tumbling", size_ms = {WINDOW} }}
"""


def capture(error, seed):
    rng = random.Random(seed)
    devices = [(f"c{i}", 0) for i in range(10)] + [("fast", 17 * MIN), ("off", 2 * HOUR)]
    step = T0 + rng.randint(2 * MIN, 5 * MIN)
    msgs = []
    for name, offset in devices:
        t = T0 + rng.randint(0, 999)
        while t < T0 + RUN:
            delay = 5 + min(int(rng.expovariate(1 / 150)), 2000)
            msgs.append((t + delay, name, t, offset))
            t += 1000
    msgs.sort()
    lines = []
    for arrival, name, sent, offset in msgs:
        stepped = arrival >= step
        lines.append(json.dumps({
            "arrival": arrival + (0 if stepped else error),
            "mono": arrival - T0 + 3 * DAY,
            "synced": stepped,
            "topic": f"sensors/g/{name}/reading",
            "payload": {"ts": sent + offset, "temp": 1},
        }))
    truth = [(name, sent) for _, name, sent, _ in msgs if name.startswith("c")]
    return "\n".join(lines) + "\n", truth, step - T0


def run(error, seed):
    text, truth, step = capture(error, seed)
    with tempfile.TemporaryDirectory() as d:
        cfg = os.path.join(d, "c.toml")
        inp = os.path.join(d, "capture.jsonl")
        open(cfg, "w").write(CONFIG)
        open(inp, "w").write(text)
        out = subprocess.run(
            [BIN, "replay", "--config", cfg, "--input", inp, "--drain-ms", "120000"],
            capture_output=True, text=True, check=True,
        ).stdout
    windows, late, alerts, wrong, ok = {}, 0, {}, 0, 0
    for line in out.splitlines():
        o = json.loads(line)
        t, p = o["topic"], o["payload"]
        if "/windows/" in t:
            key = (p["device"], p["start"])
            if key not in windows or p["revision"] >= windows[key][0]:
                windows[key] = (p["revision"], p["count"])
        elif "/late/" in t and p["device"].startswith("c"):
            late += 1
        elif (t.startswith("tidemark/gw/alerts/") and p["device"].startswith("c")
              and (p["type"] != "offline" or p["at"] <= T0 + RUN)):
            # After the run the fleet is silent: offline then is right.
            alerts[p["type"]] = alerts.get(p["type"], 0) + 1
        elif t == "tidemark/gw/alerts":
            wrong += p["type"] == "gateway_clock"
            ok += p["type"] == "gateway_clock_ok"
    expected = {}
    for name, sent in truth:
        k = (name, sent // WINDOW * WINDOW)
        expected[k] = expected.get(k, 0) + 1
    on_true = sum(min(n, windows.get(k, (0, 0))[1]) for k, n in expected.items())
    return 100.0 * on_true / len(truth), late, alerts, wrong, ok, step


def fmt(e):
    sign = "-" if e < 0 else "+"
    a = abs(e)
    for unit, name in ((DAY, "day"), (HOUR, "h"), (MIN, "min")):
        if a % unit == 0:
            n = a // unit
            return f"{sign}{n} {name}{'s' if name == 'day' and n > 1 else ''}"
    return f"{sign}{a // 1000} s"


def main():
    errors = [-3 * HOUR, -10 * MIN, 10 * MIN, -DAY, -30 * DAY, DAY, 7 * DAY, 30 * DAY, DAY + 10 * MIN]
    print(f"binary: {BIN}")
    print("| gateway error | step at | on true time | late | false device alerts | gateway_clock / ok |")
    print("|---|---|---|---|---|---|")
    for i, e in enumerate(errors):
        pct, late, alerts, wrong, ok, step = run(e, 100 + i)
        a = ", ".join(f"{n} {k}" for k, n in sorted(alerts.items())) or "0"
        print(f"| {fmt(e)} | {step // 1000} s | {pct:.1f} % | {late} | {a} | {wrong} / {ok} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
