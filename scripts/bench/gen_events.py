#!/usr/bin/env python3
"""Deterministic benchmark workload: N readings from D devices, written as a
tidemark capture (JSON lines) and as CSV (device,ts,temp) for the peers.

Each device reports every PERIOD ms; its readings reach the gateway after a
network delay of 0-3 s (so they arrive out of order, within a 5 s bound).
"""
import argparse
import json
import random

T0 = 1_764_480_000_000


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readings", type=int, default=2_000_000)
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--groups", type=int, default=20)
    ap.add_argument("--period-ms", type=int, default=6_000)
    ap.add_argument("--max-delay-ms", type=int, default=3_000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--capture", required=True)
    ap.add_argument("--csv", required=True)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    rounds = -(-a.readings // a.devices)
    events = []
    n = 0
    for r in range(rounds):
        for d in range(a.devices):
            if n == a.readings:
                break
            # Devices are spread over the period; readings wander by up to 3 s.
            ts = T0 + r * a.period_ms + d * a.period_ms // a.devices
            arrival = ts + rng.randrange(a.max_delay_ms + 1)
            temp = round(15.0 + 10.0 * rng.random(), 2)
            events.append((arrival, d, r, ts, temp))
            n += 1
    events.sort(key=lambda e: (e[0], e[1]))
    with open(a.capture, "w") as cap, open(a.csv, "w") as csv:
        for arrival, d, r, ts, temp in events:
            topic = f"sensors/g{d % a.groups}/dev{d}/reading"
            cap.write(json.dumps({"arrival": arrival, "topic": topic,
                                  "payload": {"ts": ts, "seq": r, "temp": temp}},
                                 separators=(",", ":")) + "\n")
            csv.write(f"dev{d},{ts},{temp}\n")


if __name__ == "__main__":
    main()
