#!/usr/bin/env python3
"""Table 11: a fleet of gateways on one box.

20 gateway processes (release build), each with its own source and sink link,
on one stock upstream mosquitto and one site broker. Measured in one run:
1. each gateway's RSS while idle (after 10 s), and the sum: what 20 on one box cost;
2. a document to all 20, alternating three times: 20 `fleet push` one after the
   other (the only way before `rollout`) vs one `fleet rollout --canary 2
   --batch 6 --desired` (its report's time from the first push to the last
   result, and the command's wall time, connect and discovery included).

Usage: python3 scripts/bench/fleet.py [--gateways 20] [--rounds 3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402


def config(path, gw, state, site, up, pub):
    with open(path, "w") as f:
        f.write(f"""[gateway]
id = "{gw}"
state_dir = "{state}"
[source]
url = "{site.url}"
client_id = "{gw}-in"
topics = ["sensors/+/+/reading"]
[sink]
url = "{up.url}"
client_id = "{gw}-out"
[log]
level = "warn"
[fleet]
enabled = true
trusted_keys = ["{pub}"]
confirm_s = 10
""")


def ls(bin, up):
    r = subprocess.run([bin, "fleet", "ls", "--url", up.url, "--json", "--wait-s", "1"],
                       capture_output=True, text=True, check=True)
    return json.loads(r.stdout)


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gateways", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    report.ensure_mosquitto()
    bin = report.tidemark_bin()
    work = tempfile.mkdtemp(prefix="tm-bench-fleet-")
    site, up = report.Mosquitto(stock=True), report.Mosquitto(stock=True)
    key = os.path.join(work, "op.key")
    subprocess.run([bin, "fleet", "keygen", "--out", key], check=True, capture_output=True)
    ids = [f"gw{i:02}" for i in range(1, a.gateways + 1)]
    procs = []
    for gw in ids:
        cfg = os.path.join(work, f"{gw}.toml")
        config(cfg, gw, os.path.join(work, f"{gw}-state"), site, up, key + ".pub")
        procs.append(report.spawn([bin, "run", "--config", cfg], stdout=subprocess.DEVNULL,
                                  stderr=open(os.path.join(work, f"{gw}.log"), "w")))
    report.wait_for(lambda: sum(r["state"] == "online" for r in ls(bin, up)) == len(ids),
                    "every gateway online", timeout=120, every=0.5)
    time.sleep(10)
    rss = [rss_mib(p.pid) for p in procs]

    doc = os.path.join(work, "doc.toml")
    push_ms, rollout_ms, rollout_wall_ms = [], [], []
    next_id = 1
    for _ in range(a.rounds):
        with open(doc, "w") as f:
            f.write(f'[groups.probe]\nwindow = {{ kind = "tumbling", size_ms = {1000 * next_id} }}\n')
        t0 = time.monotonic()
        for gw in ids:
            subprocess.run([bin, "fleet", "push", "--url", up.url, "--key", key, "--gateway", gw,
                            "--id", str(next_id), doc], check=True, capture_output=True)
        push_ms.append((time.monotonic() - t0) * 1000)
        next_id += 1
        with open(doc, "w") as f:
            f.write(f'[groups.probe]\nwindow = {{ kind = "tumbling", size_ms = {1000 * next_id} }}\n')
        t0 = time.monotonic()
        r = subprocess.run([bin, "fleet", "rollout", "--url", up.url, "--key", key, "--id",
                            str(next_id), "--all", "--canary", "2", "--batch", "6",
                            "--max-failures", "0", "--desired", "--json", doc],
                           check=True, capture_output=True, text=True)
        rollout_wall_ms.append((time.monotonic() - t0) * 1000)
        rep = json.loads(r.stdout)
        assert sum(g["result"] == "applied" for g in rep["gateways"]) == len(ids), rep
        rollout_ms.append(rep["took_ms"])
        next_id += 1
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=60)

    med = statistics.median
    rows = [
        [f"{len(ids)} × `fleet push`, one after the other", f"{med(push_ms):.0f}",
         f"{min(push_ms):.0f}–{max(push_ms):.0f}", "1.00×"],
        ["`fleet rollout --canary 2 --batch 6 --desired`: first push → last result",
         f"{med(rollout_ms):.0f}", f"{min(rollout_ms):.0f}–{max(rollout_ms):.0f}",
         f"{med(push_ms) / max(med(rollout_ms), 1):.1f}×"],
        ["the same, the whole command (connect, discovery, desired retained)",
         f"{med(rollout_wall_ms):.0f}", f"{min(rollout_wall_ms):.0f}–{max(rollout_wall_ms):.0f}",
         f"{med(push_ms) / max(med(rollout_wall_ms), 1):.1f}×"],
    ]
    body = (f"{len(ids)} gateways (release build) on one stock upstream mosquitto and one site "
            f"broker, idle (no readings); {a.rounds} rounds, pushes and rollouts alternating "
            "(`python3 scripts/bench/fleet.py`).\n\n"
            + report.table(["a document to every gateway", "median ms", "range ms", "speed vs pushes"], rows)
            + "\n\n"
            + report.table(["RSS while idle (10 s after start), MiB", "min", "median", "max", "sum"],
                           [[f"per gateway ({len(ids)})", f"{min(rss):.1f}", f"{med(rss):.1f}",
                             f"{max(rss):.1f}", f"{sum(rss):.1f}"]])
            + "\n")
    print(body)
    report.write_section(11, "Fleet: a rollout across 20 gateways on one box", body)


if __name__ == "__main__":
    main()
