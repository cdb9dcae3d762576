#!/usr/bin/env python3
"""Table 8: the live status API under load (docs/reference.md#reload-sighup-systemctl-reload-tidemark).

A gateway holding 10 000 devices (10 groups, 1-minute windows) takes a fleet
publishing flat out (`tidemark simulate --rate 0`, QoS 1, two connections) twice
in the same run: once alone, once while a client asks the API 1 000 questions
one after another (status, device pages of 100 and 1 000, the offline filter,
one device, alerts). Reported: request latency p50/p99/max by kind, the ingest
rate of both passes (received_total over the time the pass took), RSS after each
pass, and whether every message sent was received.

Usage: python3 scripts/bench/status.py [--devices 10000] [--messages 300000] [--requests 1000]
"""
import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

GROUPS = "g0,g1,g2,g3,g4,g5,g6,g7,g8,g9"


def ingest(bin, gw, src, devices, n, seed):
    """Publishes n readings flat out; (msg/s the gateway took them at, messages sent)."""
    before = gw.metric("tidemark_received_total") or 0
    t0 = time.monotonic()
    s = report.simulate(bin, src.url, "--devices", devices, "--groups", GROUPS, "--rate", 0,
                        "--count", n, "--qos", 1, "--connections", 2, "--seed", seed)
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) >= before + s["sent"],
                    "gateway to take the pass", every=0.05)
    return s["sent"] / (time.monotonic() - t0), s["sent"]


def paths(devices):
    """The questions, in a fixed mix."""
    rnd = random.Random(1)
    while True:
        d = rnd.randrange(devices)
        yield "status", "/api/v1/status"
        yield "devices, page of 100", "/api/v1/devices?limit=100"
        yield "devices, page of 1000", f"/api/v1/devices?limit=1000&after=g{d % 10}/d{d:04}"
        yield "offline filter", "/api/v1/devices?state=offline&limit=1000"
        yield "one device", f"/api/v1/devices/g{d % 10}/d{d:04}"
        yield "alerts", "/api/v1/alerts?limit=100"


def ask(gw, want, devices, out, done):
    for kind, p in paths(devices):
        if len(out) >= want:
            break
        t0 = time.monotonic()
        with urllib.request.urlopen(f"http://127.0.0.1:{gw.http}{p}", timeout=30) as r:
            r.read()
        out.append((kind, (time.monotonic() - t0) * 1000))
    done.set()


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=10_000)
    ap.add_argument("--messages", type=int, default=300_000)
    ap.add_argument("--requests", type=int, default=1000)
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-status-")
    gw = report.Gateway(bin, state, src.url, up.url, extra="""[group_defaults]
window = { kind = "tumbling", size_ms = 60000 }
""")
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
    # Every device known, with a clock estimate and an open window.
    report.simulate(bin, src.url, "--devices", a.devices, "--groups", GROUPS, "--rate", 0,
                    "--count", 3 * a.devices, "--qos", 1, "--connections", 2)
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) >= 3 * a.devices,
                    "warm-up")
    rss_warm = gw.rss_mib()
    alone, sent_a = ingest(bin, gw, src, a.devices, a.messages, 2)
    rss_alone = gw.rss_mib()
    lat, done = [], threading.Event()
    asker = threading.Thread(target=ask, args=(gw, a.requests, a.devices, lat, done))
    t0 = time.monotonic()
    asker.start()
    beside, sent_b = ingest(bin, gw, src, a.devices, a.messages, 3)
    fleet_s = time.monotonic() - t0
    asked_during = len(lat)
    asker.join()
    rss_api = gw.rss_mib()
    received = gw.metric("tidemark_received_total")
    total = 3 * a.devices + sent_a + sent_b
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)

    rows = []
    for kind in sorted({k for k, _ in lat}):
        xs = [ms for k, ms in lat if k == kind]
        rows.append([kind, len(xs), f"{pct(xs, .5):.1f}", f"{pct(xs, .99):.1f}", f"{max(xs):.1f}"])
    xs = [ms for _, ms in lat]
    rows.append(["**all**", len(xs), f"{pct(xs, .5):.1f}", f"{pct(xs, .99):.1f}", f"{max(xs):.1f}"])
    t1 = report.table(["request", "n", "p50 ms", "p99 ms", "max ms"], rows)
    t2 = report.table(["pass", "ingest msg/s", "ratio", "RSS after (MiB)"], [
        ["fleet alone", f"{alone:,.0f}", "1.00", f"{rss_alone:.1f}"],
        [f"fleet + API client ({asked_during} of {len(lat)} requests during the pass)",
         f"{beside:,.0f}", f"{beside / alone:.2f}", f"{rss_api:.1f}"],
    ])
    lost = "nothing lost" if received == total else f"**{total - received:,.0f} not received**"
    print(t1)
    print(t2)
    body = f"""`tidemark run` (release build) holding {a.devices:,} devices in 10 groups (1-minute
tumbling windows; RSS {rss_warm:.1f} MiB after 3 readings each); two passes of {a.messages:,}
readings from `tidemark simulate --rate 0` (QoS 1, 2 connections, mosquitto), the first alone,
the second while one client asks the API {a.requests:,} questions back to back (the fleet pass
took {fleet_s:.1f} s). Latency is the client's, connect to last byte (one request per
connection). Ingest rate = readings / time until `tidemark_received_total` counted them.
Received {received:,.0f} of {total:,} sent: {lost}.

{t1}

{t2}

Reproduce: `python3 scripts/bench/status.py` (`--devices`, `--messages`, `--requests`)."""
    report.write_section(8, "Live status API under load", body)


if __name__ == "__main__":
    main()
