#!/usr/bin/env python3
"""Table 14: hot standby (docs/reference.md#standby--two-boards-one-gateway) — what a pair costs, measured beside one board alone in
the same run: the QoS 1 ack delay (receipt to PUBACK handed to the client; the pair adds the
standby's report), ingest msg/s flat out, bytes replicated to the standby per message, and
the standby's RSS at 10 000 devices.

Each row: fresh state dirs, mosquitto brokers (site and upstream), `tidemark simulate` at
QoS 1 into the site broker. "alone" is one gateway without [standby]; "pair" is two
(`node = "a"` active, `"b"` standby), measured on the active, the standby's RSS read from
/proc. Rows alternate alone/pair.

Usage: python3 scripts/bench/standby.py [--quick]
Env TIDEMARK=path picks the binary (default: a fresh release build).
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

GROUPS = "g0,g1,g2,g3,g4,g5,g6,g7,g8,g9"


def percentile(hist, q):
    """The bucket bound (s) holding the q-quantile of a cumulative histogram {le: count}."""
    rows = sorted((float("inf") if le == "+Inf" else float(le), n) for le, n in hist.items())
    total = rows[-1][1] if rows else 0
    for le, n in rows:
        if total and n >= q * total:
            return le
    return None


def ack_hist(m, before=None):
    h = {}
    for k, v in m.items():
        if k.startswith("tidemark_ack_delay_seconds_bucket"):
            le = k.split('le="', 1)[1].split('"', 1)[0]
            h[le] = v - (before or {}).get(le, 0)
    return h


def run(bin, pair, devices, count, rate, commit_ms):
    src, up = report.Mosquitto(), report.Mosquitto()
    root = tempfile.mkdtemp(prefix="tm-bench-pair-")
    # The [gateway] table is report.Gateway's: its keys go through the environment.
    env = dict(os.environ)
    if commit_ms:
        env["TIDEMARK__GATEWAY__COMMIT_INTERVAL_MS"] = str(commit_ms)
    extra = ""
    boards = []
    names = ["a", "b"] if pair else [None]
    key = os.path.join(root, "pair.key")
    if pair:
        # The pair's messages are sealed with this key (both boards share it).
        subprocess.run([bin, "pair", "keygen", "--out", key], check=True, capture_output=True)
    for name in names:
        sb = (f"[standby]\nenabled = true\nnode = \"{name}\"\nkey_file = \"{key}\"\n"
              if name else "")
        gw = report.Gateway(bin, os.path.join(root, name or "alone"), src.url, up.url,
                            extra=extra + sb, env=env, log="info",
                            log_file=os.path.join(root, f"{name or 'alone'}.log"))
        boards.append(gw)
        if name == "a":
            report.wait_for(lambda: "pair: this board is active" in open(gw.log_file).read(),
                            "a to be active")
    active = boards[0]
    report.wait_for(lambda: active.metric("tidemark_received_total") is not None, "metrics")
    if pair:
        report.wait_for(lambda: "the standby has every record" in open(active.log_file).read(),
                        "the standby to join", timeout=120)
    src.wait_subscribed("tidemark-bench-in")
    m0 = active.metrics()
    t0 = time.monotonic()
    report.simulate(bin, src.url, "--devices", devices, "--groups", GROUPS, "--rate", rate,
                    "--count", count, "--qos", 1, "--connections", 2)
    report.wait_for(lambda: (active.metric("tidemark_received_total") or 0) >= count,
                    "the gateway to take the load", every=0.05)
    took = time.monotonic() - t0
    # Every ack released: the histogram holds them all.
    report.wait_for(lambda: ack_hist(active.metrics(), ack_hist(m0)).get("+Inf", 0) >= count,
                    "acks", every=0.1)
    m1 = active.metrics()
    h = ack_hist(m1, ack_hist(m0))
    n = h.get("+Inf", 0)
    mean_ms = 1000 * (m1.get("tidemark_ack_delay_seconds_sum", 0)
                      - m0.get("tidemark_ack_delay_seconds_sum", 0)) / max(n, 1)
    repl = (m1.get("tidemark_pair_replicated_bytes_total", 0)
            - m0.get("tidemark_pair_replicated_bytes_total", 0))
    standby_rss = None
    if pair:
        time.sleep(3)
        standby_rss = boards[1].rss_mib()
    row = {
        "rate": count / took,
        "mean_ms": mean_ms,
        "p50": percentile(h, 0.5),
        "p99": percentile(h, 0.99),
        "repl_per_msg": repl / count if pair else None,
        "active_rss": active.rss_mib(),
        "standby_rss": standby_rss,
    }
    for gw in reversed(boards):
        gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(root, ignore_errors=True)
    return row


def fmt(v, f="{:.1f}"):
    return "–" if v is None else f.format(v)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    bin = report.tidemark_bin()
    report.ensure_mosquitto()
    shapes = [
        # (label, devices, messages, rate msg/s (0: flat out), commit_interval_ms)
        ("steady 200 msg/s, defaults", 1000, 6000, 200, None),
        ("steady 200 msg/s, commit 50 ms", 1000, 6000, 200, 50),
        ("flat out, 10 000 devices", 10_000, 100_000, 0, None),
    ]
    if a.quick:
        shapes = shapes[:1]
    rows = []
    for label, devices, count, rate, commit in shapes:
        for pair in (False, True):
            r = run(bin, pair, devices, count, rate, commit)
            print(label, "pair" if pair else "alone", r, flush=True)
            rows.append([label, "pair" if pair else "alone", fmt(r["rate"], "{:.0f}"),
                         fmt(r["mean_ms"]), fmt(r["p50"], "<= {:g} s"), fmt(r["p99"], "<= {:g} s"),
                         fmt(r["repl_per_msg"], "{:.0f}"), fmt(r["active_rss"]),
                         fmt(r["standby_rss"])])
    t = report.table(["shape", "board(s)", "ingest msg/s", "ack delay mean (ms)", "ack p50",
                      "ack p99", "replicated bytes/msg", "active RSS (MiB)", "standby RSS (MiB)"],
                     rows)
    print(t)
    if a.quick:
        return
    body = f"""One gateway alone and a pair (`[standby] enabled`, nodes "a" active and "b" standby, one site
broker), alternating, in one run. QoS 1 readings from `tidemark simulate` (JSON, 10 groups).
Ack delay: the gateway's `tidemark_ack_delay_seconds` histogram over the run (mean from its
sum; p50/p99 are the bucket bounds holding them). Ingest: messages over the time until the
active took the last one (flat-out rows: as fast as the simulator publishes). Replicated
bytes: `tidemark_pair_replicated_bytes_total` (records and snapshots published to the
standby) per message. Standby RSS: /proc VmRSS of the standby once the load is in.

{t}

Reproduce: `python3 scripts/bench/standby.py`."""
    report.write_section(14, "Hot standby: what a pair costs", body)


if __name__ == "__main__":
    main()
