#!/usr/bin/env python3
"""Table 6: flash wear. Bytes the gateway writes to its disk (/proc/PID/io write_bytes, which
counts what reaches the block layer) per profile, scaled to a day, with commits, fdatasyncs
and the QoS 1 ack delay (time from receipt to the PUBACK being handed to the client).

Profiles (each on a fresh state dir, stock mosquitto brokers with only `listener` and
`allow_anonymous`, QoS 1 input, the gateway's defaults unless the row says otherwise):
- sensors:    500 devices, one JSON reading each every 10 s (50 msg/s)
- greenhouse: 600 sensors, one CBOR reading each every 5 min (2 msg/s)
- factory:    50 sensors at 20 Hz (1 000 msg/s)
- silent:     the sensors fleet after it stopped and its windows closed (nothing arriving)
- sweep:      the sensors profile at several `commit_interval_ms`

Usage: python3 scripts/bench/flash.py [--seconds 90] [--quick]
Env TIDEMARK=path picks the binary (default: a fresh release build).
"""
import argparse
import resource
import os
import shutil
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

GiB = 2**30


class StockMosquitto(report.Mosquitto):
    """mosquitto with its defaults (max_inflight_messages 20, max_queued_messages 1000)."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="tm-bench-mq-")
        os.chmod(self.dir, 0o777)
        self.port = report.free_port()
        conf = os.path.join(self.dir, "m.conf")
        with open(conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n"
                    f"log_dest file {self.dir}/m.log\nlog_type subscribe\n")
        self.proc = report.spawn([report.shutil_which("mosquitto"), "-c", conf],
                                 stdout=report.subprocess.DEVNULL,
                                 stderr=report.subprocess.DEVNULL)
        report.wait_for(lambda: report._connects(self.port), "mosquitto to listen")


def io(pid):
    with open(f"/proc/{pid}/io") as f:
        d = dict(line.split(": ") for line in f.read().splitlines())
    return int(d["write_bytes"])


def snap(gw):
    m = gw.metrics() or {}
    hist = {k: v for k, v in m.items() if k.startswith("tidemark_ack_delay_seconds_bucket")}
    return {
        "t": time.monotonic(),
        "bytes": io(gw.proc.pid),
        "commits": m.get('tidemark_commits_total{kind="journal"}', 0) + m.get('tidemark_commits_total{kind="checkpoint"}', 0),
        "received": m.get("tidemark_received_total", 0),
        "journal": m.get("tidemark_journal_bytes_total", 0),
        "checkpoints": m.get('tidemark_commits_total{kind="checkpoint"}', 0),
        "hist": hist,
    }


def p99(a, b):
    """99th percentile of the ack delay between two snapshots, from the histogram buckets."""
    if not b["hist"]:
        return None
    rows = []
    for k, v in b["hist"].items():
        le = k.split('le="', 1)[1].split('"', 1)[0]
        rows.append((float("inf") if le == "+Inf" else float(le), v - a["hist"].get(k, 0)))
    rows.sort()
    total = rows[-1][1]
    if total <= 0:
        return None
    for le, n in rows:
        if n >= 0.99 * total:
            return le
    return None


def profile(bin, name, devices, rate, fmt, seconds, env=None, warm=10):
    src, up = StockMosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-flash-")
    gw = report.Gateway(bin, state, src.url, up.url, env=env)
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metrics() is not None, "metrics")
    load = threading.Thread(target=report.simulate, args=(
        bin, src.url, "--devices", devices, "--groups", "g0,g1,g2,g3,g4", "--rate", rate,
        "--duration-s", seconds + warm, "--qos", 1, "--format", fmt, "--delay-ms", 20))
    load.start()
    time.sleep(warm)
    a = snap(gw)
    load.join()
    b = snap(gw)
    row = measure(name, a, b)
    silent = None
    if name == "sensors":
        # Windows close (60 s) and are purged (+30 s lateness), offline alerts (60 s) go out:
        # afterwards nothing changes that must be kept.
        time.sleep(150)
        c = snap(gw)
        time.sleep(seconds)
        silent = measure("silent (nothing arriving)", c, snap(gw))
    # The final checkpoint at stop writes every device (all were marked at start): the
    # largest a checkpoint gets. The gateway's lifetime writes come with its exit status.
    z = snap(gw)
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock
    gw.stop()
    life = (resource.getrusage(resource.RUSAGE_CHILDREN).ru_oublock - before) * 512
    row["checkpoint_kib"] = max(0, life - z["bytes"]) / 1024
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return row, silent


def measure(name, a, b):
    dt = b["t"] - a["t"]
    by = b["bytes"] - a["bytes"]
    n = b["received"] - a["received"]
    commits = b["commits"] - a["commits"]
    q = p99(a, b)
    journal = (b["journal"] - a["journal"]) / dt
    return {
        "journal_s": journal,
        "checkpoints": b["checkpoints"] - a["checkpoints"],
        "name": name,
        "kib_s": by / dt / 1024,
        "gib_day": by / dt * 86400 / GiB,
        "per_msg": by / n if n else None,
        "commits_s": commits / dt,
        "per_commit": by / commits / 1024 if commits else None,
        "p99": q,
        "msgs_s": n / dt,
    }


CHECKPOINT_BYTES = 4 << 20  # journal bytes between checkpoints (src/run/core.rs)


def fmt_row(r, label=None):
    per_msg = "—" if r["per_msg"] is None else f"{r['per_msg']:.0f} B"
    per_commit = "—" if r["per_commit"] is None else f"{r['per_commit']:.1f}"
    q = "—" if r["p99"] is None else f"≤ {r['p99']:g} s"
    ck = r.get("checkpoint_kib")
    if ck is None or r["journal_s"] <= 0:
        every, amort = "—", 0.0
    else:
        interval = CHECKPOINT_BYTES / r["journal_s"]
        every = f"{ck:,.0f} KiB every {interval / 60:,.0f} min"
        # A checkpoint inside the measured window is in the bytes already.
        amort = 0.0 if r["checkpoints"] else ck * 1024 / interval
    day = (r["kib_s"] * 1024 + amort) * 86400 / GiB
    return [label or r["name"], f"{r['msgs_s']:.1f}", f"{r['commits_s']:.2f}", per_commit,
            f"{r['kib_s']:.1f}", per_msg, every, f"**{day:.2f}**", q]


HEADER = ["profile", "msg/s", "commits/s", "KiB per commit", "written KiB/s", "per message",
          "checkpoint", "GiB/day (checkpoints included)", "p99 ack delay"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=int, default=90)
    ap.add_argument("--quick", action="store_true", help="sensors profile only, no table written")
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    rows = []
    sensors, silent = profile(bin, "sensors", 500, 50, "json", a.seconds)
    rows += [fmt_row(sensors, "500 devices every 10 s (JSON)"), fmt_row(silent)]
    print(report.table(HEADER, rows), flush=True)
    if a.quick:
        return
    gh, _ = profile(bin, "greenhouse", 600, 2, "cbor", a.seconds)
    rows.append(fmt_row(gh, "greenhouse: 600 sensors every 5 min (CBOR)"))
    env = dict(os.environ, TIDEMARK__GATEWAY__COMMIT_INTERVAL_MS="5000")
    gh5, _ = profile(bin, "greenhouse", 600, 2, "cbor", a.seconds, env=env)
    rows.append(fmt_row(gh5, "greenhouse, commit_interval_ms = 5000 (configs/greenhouse.toml)"))
    fa, _ = profile(bin, "factory", 50, 1000, "json", a.seconds)
    rows.append(fmt_row(fa, "factory: 50 sensors at 20 Hz (JSON)"))
    print(report.table(HEADER, rows), flush=True)
    sweep = []
    for ms in (50, 200, 500, 1000, 2000):
        env = dict(os.environ, TIDEMARK__GATEWAY__COMMIT_INTERVAL_MS=str(ms))
        r, _ = profile(bin, "sweep", 500, 50, "json", a.seconds // 2, env=env)
        sweep.append(fmt_row(r, f"commit_interval_ms = {ms}"))
        print(sweep[-1], flush=True)
    t1 = report.table(HEADER, rows)
    t2 = report.table(HEADER, sweep)
    print(t1)
    print(t2)
    body = f"""`tidemark run` (release build), stock mosquitto as the site broker (only `listener` and
`allow_anonymous`: max_inflight_messages 20, max_queued_messages 1000), `tidemark simulate`
publishing QoS 1 at the profile's rate. Written = the gateway's `/proc/PID/io` write_bytes
(bytes sent to the block device, page-cache writeback included) over {a.seconds} s after 10 s
of warm-up, scaled to a day. Commits from `tidemark_commits_total`; the p99 ack delay is the
histogram bucket (`tidemark_ack_delay_seconds`) holding the 99th percentile of the time from
receipt to the PUBACK. Goals: sensors profile <= 2 GiB/day (stretch 1), p99 ack <= 1.5 s;
silent fleet <= 0.1 GiB/day.

{t1}

Commit-interval sweep (sensors profile, {a.seconds // 2} s each):

{t2}

Reproduce: `python3 scripts/bench/flash.py` (`--quick`: the sensors rows only, nothing written)."""
    report.write_section(6, "Flash wear: bytes written per day", body)


if __name__ == "__main__":
    main()
