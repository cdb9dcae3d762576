#!/usr/bin/env python3
"""Table 2: end to end on this machine, against the physical limit of the path.

mosquitto <- `tidemark simulate` (QoS 1, as fast as the broker takes it) and
either a bare `mosquitto_sub -q 1` (the limit: a subscriber that does nothing)
or `tidemark run` (QoS 1 in, durable commits, acks held until committed,
outputs to a second mosquitto at QoS 1). Each consumer is subscribed before
the load starts; its rate is the load divided by the time from the first
publish until it has taken every message. Runs alternate, three each; the
median is reported.

Usage: python3 scripts/bench/end_to_end.py [--messages N] [--devices N]
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402


def load(bin, url, a):
    return ["--devices", a.devices, "--groups", "g0,g1,g2,g3,g4,g5,g6,g7,g8,g9",
            "--rate", 0, "--count", a.messages, "--qos", 1, "--connections", a.connections]


def bare(bin, a):
    mq = report.Mosquitto()
    sub = report.spawn([report.shutil_which("mosquitto_sub"), "-h", "127.0.0.1", "-p",
                        str(mq.port), "-q", "1", "-t", "sensors/#", "-C", str(a.messages),
                        "-i", "bare-sub"], stdout=subprocess.DEVNULL)
    mq.wait_subscribed("bare-sub")
    t0 = time.monotonic()
    summary = report.simulate(bin, mq.url, *load(bin, mq.url, a))
    sub.wait()
    dt = time.monotonic() - t0
    mq.stop()
    return dt, summary


def bare_drain(bin, a):
    """The same load queued first (subscriber away, session kept), then drained."""
    mq = report.Mosquitto()
    sub_cmd = [report.shutil_which("mosquitto_sub"), "-h", "127.0.0.1", "-p", str(mq.port),
               "-q", "1", "-t", "sensors/#", "-i", "bare-drain", "-c"]
    first = report.spawn(sub_cmd + ["-C", "1", "-W", "2"], stdout=subprocess.DEVNULL)
    mq.wait_subscribed("bare-drain")
    first.kill()
    first.wait()
    report.simulate(bin, mq.url, *load(bin, mq.url, a))
    t0 = time.monotonic()
    subprocess.run(sub_cmd + ["-C", str(a.messages)], stdout=subprocess.DEVNULL, check=True)
    dt = time.monotonic() - t0
    mq.stop()
    return dt


def gateway_drain(bin, a, protocol):
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-e2e-")
    gw = report.Gateway(bin, state, src.url, up.url, source_extra=f'protocol = "{protocol}"')
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "gateway metrics")
    base = gw.metric("tidemark_received_total")
    gw.stop()
    report.simulate(bin, src.url, *load(bin, src.url, a))
    gw.start()
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) - base >= a.messages,
                    "gateway to drain the backlog", every=0.01)
    dt = time.monotonic() - gw.started
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return dt


def gateway(bin, a, protocol):
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-e2e-")
    gw = report.Gateway(bin, state, src.url, up.url, source_extra=f'protocol = "{protocol}"')
    report.wait_for(lambda: gw.metric('tidemark_connected{link="source"}') == 1
                    and gw.metric('tidemark_connected{link="sink"}') == 1, "gateway connected")
    base = gw.metric("tidemark_received_total")
    t0 = time.monotonic()
    summary = report.simulate(bin, src.url, *load(bin, src.url, a))
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) - base >= a.messages,
                    "gateway to take every message", every=0.01)
    dt = time.monotonic() - t0
    m = gw.metrics()
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return dt, summary, m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--devices", type=int, default=1_000)
    ap.add_argument("--connections", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    res = {"bare": [], "v5": [], "v311": [], "bare_drain": [], "v5_drain": [], "v311_drain": []}
    pub = []
    last = None
    for _ in range(a.rounds):
        dt, s = bare(bin, a)
        res["bare"].append(dt)
        pub.append(s["rate"])
        for proto in ("v5", "v311"):
            dt, s, last = gateway(bin, a, proto)
            res[proto].append(dt)
            pub.append(s["rate"])
        res["bare_drain"].append(bare_drain(bin, a))
        for proto in ("v5", "v311"):
            res[f"{proto}_drain"].append(gateway_drain(bin, a, proto))
        print({k: [round(x, 2) for x in v] for k, v in res.items()}, flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    rate = {k: a.messages / v for k, v in med.items()}
    rows = []
    for mode, sfx in (("live load", ""), ("queued backlog", "_drain")):
        b = rate["bare" + sfx]
        rows += [
            [mode, "mosquitto -> bare `mosquitto_sub -q 1`", f"{med['bare' + sfx]:.2f}",
             f"{b:,.0f}", "1.00"],
            [mode, "mosquitto -> `tidemark run` (source v5) -> mosquitto",
             f"{med['v5' + sfx]:.2f}", f"{rate['v5' + sfx]:,.0f}", f"{rate['v5' + sfx] / b:.2f}"],
            [mode, "mosquitto -> `tidemark run` (source v3.1.1) -> mosquitto",
             f"{med['v311' + sfx]:.2f}", f"{rate['v311' + sfx]:,.0f}",
             f"{rate['v311' + sfx] / b:.2f}"],
        ]
    t = report.table(["load", "path", "seconds (median of %d)" % a.rounds, "msg/s",
                      "ratio to bare"], rows)
    print(t)
    body = f"""{a.messages:,} QoS 1 readings from {a.devices:,} devices in 10 groups (JSON), published
by `tidemark simulate --rate 0` over {a.connections} connections as fast as mosquitto takes them,
to a consumer subscribed beforehand: a bare `mosquitto_sub -q 1` (the physical limit of the
path: it takes each message and does nothing with it), or `tidemark run` with durability on
(journal commits at most once per second, sooner when 4096 acks are held on v5 or 20 on
v3.1.1; each QoS 1 ack held until the commit that holds its effect), window
results and status going to a second mosquitto at QoS 1. Time: from the first publish until the
consumer has taken every message (the gateway's `tidemark_received_total` on its HTTP endpoint).
"Queued backlog": the same load published while the consumer is away (its session kept by the
broker), then drained from consumer process start (the gateway restores its state first) — the
consumer's own limit rather than the publisher's. Rounds alternate; medians. Goal: >= 0.8 of the bare subscriber's rate. All processes share the
machine's cores (publisher, broker(s), consumer).

{t}

Publisher rate while loading (all runs): {min(pub):,.0f}-{max(pub):,.0f} msg/s. Gateway counters
after the last run: received {last.get('tidemark_received_total', 0):,.0f}, accepted
{last.get('tidemark_accepted_total', 0):,.0f}, windows emitted
{last.get('tidemark_windows_emitted_total', 0):,.0f}.

Reproduce: `python3 scripts/bench/end_to_end.py` (builds the release binary, installs
mosquitto when missing)."""
    report.write_section(2, "End to end: simulate -> mosquitto -> run -> upstream, vs a bare subscriber",
                         body)


if __name__ == "__main__":
    main()
