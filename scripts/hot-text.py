#!/usr/bin/env python3
"""Regenerates contrib/link/hot-text.ld: the functions a gateway executes, laid out
together at the start of the binary's text (build.rs passes the script to the linker
for release-based builds).

The kernel maps a binary's code into the resident set in blocks of 64 KiB or more
(fault-around, large page-cache folios): code the gateway runs, scattered among code
it never runs (tools, the embedded broker, the database outputs, TLS), kept nearly
all 5.6 MiB of text resident. Clustered, the text resident is what runs.

How: build `dist` with symbols, run the gateway under callgrind through a typical
life (start, 10 000 devices with 10 s windows and results going up, metrics scraped,
devices falling silent, a graceful stop, a restart that restores, a stop), and write
one pattern per executed function, hottest first. The patterns leave out the
per-instance hashes of mangled names, so the list holds across builds, targets and
toolchains; a function it lacks (new code) is only laid out with the cold text.

Needs valgrind and mosquitto. Run it after changes to the gateway's hot paths:
  python3 scripts/hot-text.py            # rewrites contrib/link/hot-text.ld
  python3 scripts/hot-text.py --check    # prints what the current list misses
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts", "bench"))
import report  # noqa: E402

SCRIPT = os.path.join(ROOT, "contrib", "link", "hot-text.ld")
# Code picked by CPU features at run time: valgrind's CPU lacks AVX-512, so the
# variants the gateway runs on a real CPU are taken whole (redb's page checksums).
DISPATCHED = ["_ZN4redb10tree_store10page_store4xxh3", "_ZN9crc32fast"]
LIFE = """[group_defaults]
window = { kind = "tumbling", size_ms = 10000 }
idle_timeout_ms = 3000
heartbeat_timeout_ms = 5000
"""


def build(target_dir):
    env = dict(os.environ, CARGO_PROFILE_DIST_STRIP="none", CARGO_TARGET_DIR=target_dir)
    subprocess.run(["cargo", "build", "--locked", "--profile", "dist"], cwd=ROOT, env=env,
                   check=True)
    return os.path.join(target_dir, "dist", "tidemark")


def scrape(gw):
    """What an operator's tools read: /metrics and the status API."""
    gw.metrics()
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{gw.http}/api/v1/status", timeout=5).read()
    except OSError:
        pass


def life(binary, out):
    """The gateway under callgrind: one output file per process start."""
    wrap = os.path.join(out, "callgrind.sh")
    with open(wrap, "w") as f:
        f.write("#!/bin/sh\nexec valgrind --tool=callgrind --demangle=no --dump-instr=no "
                f"--callgrind-out-file={out}/cg.%p {binary} \"$@\"\n")
    os.chmod(wrap, 0o755)
    src, up = report.Mosquitto(), report.Mosquitto()
    gw = report.Gateway(wrap, os.path.join(out, "state"), src.url, up.url, extra=LIFE)
    try:
        src.wait_subscribed("tidemark-bench-in")
        report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
        load = threading.Thread(target=report.simulate, args=(
            binary, src.url, "--devices", 10000, "--groups", 10, "--rate", 2500,
            "--duration-s", 40, "--qos", 1, "--connections", 2))
        load.start()
        while load.is_alive():
            time.sleep(2)
            scrape(gw)
        load.join()
        report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox", every=0.5)
        # Windows close, devices and groups fall silent: offline alerts go up.
        report.wait_for(lambda: (gw.metric("tidemark_alerts_total") or 0) > 0
                        or time.monotonic() - gw.started > 600, "alerts", every=1)
        time.sleep(10)
        scrape(gw)
        gw.stop()
        gw.start()
        report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "restart")
        time.sleep(5)
        scrape(gw)
        gw.stop()
    finally:
        gw.proc.kill()
        src.stop()
        up.stop()
    return glob.glob(os.path.join(out, "cg.*"))


def executed(files):
    """Function names executed, with their own instruction counts."""
    cost = collections.Counter()
    for path in files:
        names, cur, skip = {}, None, False
        for line in open(path, errors="replace"):
            m = re.match(r"^(c?fn)=\((\d+)\)(?: (.*))?$", line.rstrip("\n"))
            if m:
                kind, i, n = m.groups()
                if n:
                    names[i] = n
                if kind == "fn":
                    cur = names.get(i)
                    cost[cur] += 0
                else:
                    cost[names.get(i)] += 0
                continue
            if line.startswith("calls="):
                skip = True  # the next line is the call's inclusive cost
            elif line[:1].isdigit() or line[:1] in "+-*":
                if not skip and cur:
                    parts = line.split()
                    if len(parts) >= 2:
                        cost[cur] += int(parts[1])
                skip = False
    return cost


def text_symbols(binary):
    nm = subprocess.run(["nm", "-S", "--defined-only", binary], capture_output=True,
                        text=True, check=True).stdout
    sizes = {}
    for line in nm.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            sizes[p[3]] = int(p[1], 16)
    return sizes


def pattern(name):
    """A section pattern without the hashes that change between builds and targets."""
    # LTO renames the local copies it makes: `.llvm.N` and `.N` suffixes.
    base = re.sub(r"(\.llvm)?\.[0-9]+$", "", name)
    if base.startswith("_ZN"):
        return re.sub(r"17h[0-9a-f]{16}E$", "17h*E", base) + "*"
    if base.startswith("_R"):
        return re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", base) + "*"
    return base + ("*" if base != name else "")


def matches(pat, name):
    return re.fullmatch(re.escape(pat).replace(r"\*", ".*"), name) is not None


def main():
    a = argparse.ArgumentParser()
    a.add_argument("--check", action="store_true", help="report what the current list misses")
    a.add_argument("--target-dir", default=os.path.join(ROOT, "target", "hot-text"))
    args = a.parse_args()
    binary = build(args.target_dir)
    sizes = text_symbols(binary)
    with tempfile.TemporaryDirectory(prefix="tm-hot-text-") as out:
        cost = executed(life(binary, out))
    hot = sorted((n for n in cost if n in sizes), key=lambda n: -cost[n])
    print(f"executed: {len(hot)} functions, {sum(sizes[n] for n in hot) / 2**20:.2f} MiB "
          f"of {sum(sizes.values()) / 2**20:.2f} MiB of text")
    if args.check:
        have = re.findall(r"\*\(\.text\.(\S+) ", open(SCRIPT).read())
        exact = {p for p in have if "*" not in p}
        globs = [p for p in have if "*" in p]
        missed = [n for n in hot if pattern(n) not in exact
                  and not any(n.startswith(g.split("*")[0]) and matches(g, n) for g in globs)]
        print(f"not in {os.path.relpath(SCRIPT, ROOT)}: {len(missed)} functions, "
              f"{sum(sizes[n] for n in missed) / 1024:.1f} KiB")
        for n in missed[:40]:
            print("  " + n)
        return 1 if missed else 0
    pats, seen = [], set()
    for n in hot:
        p = pattern(n)
        if p not in seen:
            seen.add(p)
            pats.append(p)
    os.makedirs(os.path.dirname(SCRIPT), exist_ok=True)
    with open(SCRIPT, "w") as f:
        f.write("/* Generated by scripts/hot-text.py: the functions a gateway runs, hottest first,\n"
                "   laid out before the rest of the text (docs/reference.md, \"Memory\"). */\n"
                "SECTIONS\n{\n  .text.hot : {\n")
        for p in pats:
            f.write(f"    *(.text.{p} .text.unlikely.{p})\n")
        for p in DISPATCHED:
            f.write(f"    *(.text.{p}* .text.unlikely.{p}*)\n")
        # ring's assembly comes in objects without a section per function.
        f.write("    *sha256*(.text)\n  }\n}\nINSERT BEFORE .text;\n")
    print(f"wrote {os.path.relpath(SCRIPT, ROOT)}: {len(pats)} patterns")
    return 0


if __name__ == "__main__":
    sys.exit(main())
