#!/usr/bin/env python3
"""Heap profile of `tidemark run` under the --steady load of memory.py, read at the settled point.

Runs the gateway under heaptrack, sends DEVICES readings every EVERY_S seconds for SECONDS
(tumbling windows of WINDOW_MS, default lateness), waits for the outbox to drain, then kills
the gateway: heaptrack lists every block still allocated as "leaked", which is the live heap
at that instant; its peak section is the heap at the peak.

Needs heaptrack and a binary with line tables, e.g.
  CARGO_PROFILE_RELEASE_STRIP=none CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \\
    CARGO_TARGET_DIR=/tmp/tgt-prof cargo build --release
  TIDEMARK=/tmp/tgt-prof/release/tidemark python3 scripts/bench/heap.py 10000 1 70 10000
then `heaptrack_print -f OUT.zst --print-leaks 1`.

Usage: heap.py DEVICES EVERY_S SECONDS WINDOW_MS [OUT]
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import memory  # noqa: E402
import report  # noqa: E402


def main():
    devices, every_s, seconds, window_ms = (int(x) for x in sys.argv[1:5])
    out = sys.argv[5] if len(sys.argv) > 5 else f"heap-{devices}"
    bin = report.tidemark_bin()
    work = tempfile.mkdtemp(prefix="tm-bench-heap-")
    wrap = os.path.join(work, "wrap.sh")
    with open(wrap, "w") as f:
        f.write(f'#!/bin/sh\nexec heaptrack -o {os.path.abspath(out)} {bin} "$@"\n')
    os.chmod(wrap, 0o755)
    report.ensure_mosquitto()
    src, up = report.Mosquitto(), report.Mosquitto()
    gw = report.Gateway(wrap, work, src.url, up.url, extra=memory.window_config(window_ms),
                        log_file=os.path.join(work, "gateway.log"))
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics",
                    every=0.5)
    report.simulate(*memory.steady_load(bin, src.url, devices, every_s, seconds))
    report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "outbox to drain",
                    every=0.2)
    # The last commit settles and freed heap is handed back (as memory.py waits).
    time.sleep(8)
    m = gw.metrics() or {}
    print(f"received {m.get('tidemark_received_total', 0):.0f}, "
          f"results {m.get('tidemark_windows_emitted_total', 0):.0f}", flush=True)
    # heaptrack's child is the gateway: killing it keeps what heaptrack recorded.
    pid = int(subprocess.check_output(["pgrep", "-n", "-f", f"run --config {gw.cfg}"]).split()[0])
    os.kill(pid, signal.SIGKILL)
    gw.proc.wait(timeout=300)
    src.stop()
    up.stop()
    shutil.rmtree(work, ignore_errors=True)
    print(f"heaptrack_print -f {out}.zst --print-leaks 1")


if __name__ == "__main__":
    main()
