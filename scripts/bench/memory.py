#!/usr/bin/env python3
"""Table 4: memory of `tidemark run` (resident set, VmRSS) by fleet size, and over time.

Per size: a fresh gateway (1-minute tumbling windows, durable state, both
brokers mosquitto) takes 3 readings from each of N devices (`tidemark simulate`,
flat out), so every device has its state and an open window; RSS is read once
every message is committed. Then a steady fleet of 10 000 devices at 2 000 msg/s
(one reading per device every 5 s) for --minutes, RSS sampled every 30 s.

Usage: python3 scripts/bench/memory.py [--minutes 10]
"""
import argparse
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


def settled(gw, want):
    """RSS once `want` messages were taken and the gateway is quiet (outbox delivered)."""
    report.wait_for(lambda: (gw.metric("tidemark_received_total") or 0) >= want,
                    "gateway to take the load", every=0.1)
    report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox to drain", every=0.1)
    # The last commit and deliveries settle, and the gateway hands freed heap back
    # (1 s after the input goes quiet, and every 5 s).
    time.sleep(6)
    return gw.rss_mib()


def by_size(bin, n):
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-mem-")
    gw = report.Gateway(bin, state, src.url, up.url)
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
    idle = gw.rss_mib()
    if n:
        report.simulate(bin, src.url, "--devices", n, "--groups", GROUPS, "--rate", 0,
                        "--count", 3 * n, "--qos", 1, "--connections", 2)
    rss = settled(gw, 3 * n)
    db = os.path.getsize(os.path.join(state, "tidemark.redb")) / 2**20
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return idle, rss, db


def over_time(bin, minutes):
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-mem-")
    gw = report.Gateway(bin, state, src.url, up.url)
    src.wait_subscribed("tidemark-bench-in")
    load = threading.Thread(target=report.simulate, args=(
        bin, src.url, "--devices", 10_000, "--groups", GROUPS, "--rate", 2000,
        "--duration-s", int(minutes * 60), "--qos", 1, "--connections", 2))
    load.start()
    samples = []
    t0 = time.monotonic()
    while load.is_alive():
        time.sleep(30 - (time.monotonic() - t0) % 30)
        if not load.is_alive():
            break
        m = gw.metrics() or {}
        samples.append((time.monotonic() - t0, gw.rss_mib(), m.get("tidemark_received_total", 0),
                        m.get("tidemark_windows_emitted_total", 0)))
        print(f"  t={samples[-1][0]:.0f}s rss={samples[-1][1]:.1f} MiB "
              f"received={samples[-1][2]:.0f}", flush=True)
    load.join()
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return samples


def stop_peak(gw):
    """Stops the gateway (its last checkpoint included) and returns its peak RSS in MiB."""
    gw.proc.terminate()
    _, _, usage = os.wait4(gw.proc.pid, 0)
    gw.proc.returncode = 0
    return usage.ru_maxrss / 1024


def window_config(window_ms):
    """The config lines for tumbling windows of `window_ms` (0: the default 60 s)."""
    return (f'[group_defaults]\nwindow = {{ kind = "tumbling", size_ms = {window_ms} }}\n'
            if window_ms else "")


def steady_load(bin, url, devices, every_s, seconds):
    """`report.simulate` arguments: `devices` send one reading each every `every_s` s."""
    return (bin, url, "--devices", devices, "--groups", GROUPS,
            "--rate", max(1, round(devices / every_s)), "--duration-s", seconds,
            "--qos", 1, "--connections", 2)


def steady(bin, devices, every_s, seconds, window_ms=0):
    """RSS once every device's clock estimator is full: `devices` send one reading
    each every `every_s` seconds for `seconds`; RSS every 5 s, the peak (VmHWM), and
    the settled RSS once the load has stopped and the outbox is empty."""
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-mem-")
    gw = report.Gateway(bin, state, src.url, up.url, extra=window_config(window_ms))
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
    rate = max(1, round(devices / every_s))
    load = threading.Thread(target=report.simulate, args=steady_load(
        bin, src.url, devices, every_s, seconds))
    load.start()
    samples = []
    t0 = time.monotonic()
    while load.is_alive():
        time.sleep(5 - (time.monotonic() - t0) % 5)
        if load.is_alive():
            samples.append((time.monotonic() - t0, gw.rss_mib()))
            print(f"  t={samples[-1][0]:.0f}s rss={samples[-1][1]:.1f} MiB "
                  f"received={gw.metric('tidemark_received_total'):.0f}", flush=True)
    load.join()
    sent = gw.metric("tidemark_received_total")
    report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox to drain", every=0.1)
    time.sleep(6)
    m = gw.metrics() or {}
    out = {"devices": devices, "every_s": every_s, "seconds": seconds, "rate": rate,
           "window_ms": window_ms or 60000,
           "received": m.get("tidemark_received_total", sent),
           "windows": m.get("tidemark_windows_emitted_total", 0),
           "last_under_load": samples[-1][1] if samples else 0.0,
           "max_under_load": max((s[1] for s in samples), default=0.0),
           "peak": gw.rss_mib("VmHWM"), "settled": gw.rss_mib(),
           # The settled RSS split: heap and stacks, and the binary's and libraries' pages.
           "settled_anon": gw.rss_mib("RssAnon"), "settled_file": gw.rss_mib("RssFile")}
    # The stop's checkpoint writes every device changed since the last one.
    out["peak_with_stop"] = stop_peak(gw)
    # A restart marks every device changed (idleness clocks restart): restore, then
    # the checkpoint of all of them at the next stop.
    gw.start()
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "restart")
    time.sleep(6)
    out["restarted"] = gw.rss_mib()
    out["restart_peak_with_checkpoint"] = stop_peak(gw)
    out["state_file_mib"] = os.path.getsize(os.path.join(state, "tidemark.redb")) / 2**20
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--sizes", default="0,100,1000,10000,100000",
                    help="fleet sizes, comma-separated")
    ap.add_argument("--quick", action="store_true",
                    help="print the tables, write nothing (with --minutes 0: sizes only)")
    ap.add_argument("--steady", default="",
                    help="DEVICES:EVERY_S:SECONDS[:WINDOW_MS][,...]: only the steady-state rows, "
                         "printed (WINDOW_MS: tumbling window size, default the config's 60 s)")
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    if a.steady:
        for spec in a.steady.split(","):
            d, e, s, *w = spec.split(":")
            print(steady(bin, int(d), float(e), int(s), int(w[0]) if w else 0), flush=True)
        return
    rows = []
    for n in (int(x) for x in a.sizes.split(",")):
        idle, rss, db = by_size(bin, n)
        per = "" if n == 0 else f"{(rss - idle) * 1024 / n:.2f}"
        rows.append([f"{n:,}", f"{idle:.1f}", f"{rss:.1f}", per, f"{db:.1f}"])
        print(rows[-1], flush=True)
    t1 = report.table(["devices", "RSS at start (MiB)", "RSS with the fleet (MiB)",
                       "KiB per device", "state file (MiB)"], rows)
    if a.quick and a.minutes == 0:
        print(t1)
        return
    samples = over_time(bin, a.minutes)
    rss = [s[1] for s in samples]
    t2 = report.table(["minute", "RSS (MiB)", "messages taken", "windows emitted"],
                      [[f"{s[0] / 60:.1f}", f"{s[1]:.1f}", f"{s[2]:,.0f}", f"{s[3]:,.0f}"]
                       for s in samples])
    print(t1)
    print(t2)
    if a.quick:
        return
    body = f"""`tidemark run` (release build; durable state in redb; 1-minute tumbling windows; both
brokers mosquitto). By fleet size: each of N devices sends 3 readings (`tidemark simulate`,
flat out, 10 groups) so every device has its state and an open window; RSS (VmRSS) read once
every message is committed and every output delivered, 6 s later (the gateway hands freed
heap back to the kernel 1 s after its input goes quiet and every 5 s). Goal: <= 24 MiB at
10 000 devices, <= 128 MiB at 100 000.

{t1}

Over time: 10 000 devices at 2 000 msg/s (each device every 5 s) for {a.minutes:g} minutes,
windows closing and going upstream every minute; RSS every 30 s. Min {min(rss):.1f} MiB,
max {max(rss):.1f} MiB, first {rss[0]:.1f} MiB, last {rss[-1]:.1f} MiB.

{t2}

Reproduce: `python3 scripts/bench/memory.py` (`--minutes` shortens the second part)."""
    report.write_section(4, "Memory: RSS by fleet size and over a long run", body)


if __name__ == "__main__":
    main()
