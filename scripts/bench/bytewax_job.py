#!/usr/bin/env python3
"""Table 3 peer: Bytewax, 1 worker, 1-minute tumbling event-time windows per
device with 5 s out-of-orderness (EventClock wait), count/min/max/mean.
Run: python -m bytewax.run bytewax_job:flow  (BENCH_IN, BENCH_OUT in env)."""
import os
from datetime import datetime, timedelta, timezone

import bytewax.operators as op
from bytewax.connectors.files import FileSink, FileSource
from bytewax.dataflow import Dataflow
from bytewax.operators.windowing import EventClock, TumblingWindower, fold_window

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def parse(line):
    device, ts, temp = line.split(",")
    return device, (int(ts), float(temp))


def add(acc, v):
    n, lo, hi, total = acc
    t = v[1]
    return (n + 1, min(lo, t), max(hi, t), total + t)


def merge(a, b):
    return (a[0] + b[0], min(a[1], b[1]), max(a[2], b[2]), a[3] + b[3])


def render(item):
    device, (wid, (n, lo, hi, total)) = item
    # FileSink takes (key, line); it has one partition.
    return "out", f"{device},{wid},{n},{lo},{hi},{total / n}"


flow = Dataflow("tidemark_peer")
lines = op.input("in", flow, FileSource(os.environ["BENCH_IN"]))
readings = op.map("parse", lines, parse)
# Watermark = largest timestamp - 5 s. A fixed "system" clock: by default the
# watermark also advances with wall time, which closes windows early when a
# recorded input is processed slower than it was produced.
clock = EventClock(
    lambda v: EPOCH + timedelta(milliseconds=v[0]),
    wait_for_system_duration=timedelta(seconds=5),
    now_getter=lambda: EPOCH,
    to_system_utc=lambda _: None,
)
windower = TumblingWindower(length=timedelta(minutes=1), align_to=EPOCH)
windows = fold_window(
    "window", readings, clock, windower, lambda: (0, float("inf"), float("-inf"), 0.0), add, merge
)
op.output("out", op.map("render", windows.down, render), FileSink(os.environ["BENCH_OUT"]))
