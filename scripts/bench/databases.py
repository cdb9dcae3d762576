#!/usr/bin/env python3
"""Table 15: the database outputs against the physical limit, in one run.

A 10 000-device fleet sends 3 readings each (`tidemark simulate`, flat out); its
10 s windows close together once the fleet goes idle: a close burst of 10 000
results. Per output (PostgreSQL 15, InfluxDB 1.6, both from Debian, started here
as an unprivileged user on free ports) a fresh gateway with only that output
(`sink.plain = false`) writes the burst; rows/s is the burst over the time from
its commit (`tidemark_windows_emitted_total` reaching it) to the output's last
confirmation (`tidemark_output_written_total`). The bare path writes the same
rows the same way, right after, in the same run: multi-row `INSERT ... ON
CONFLICT` statements of `batch_max` rows through one psql session, and
line-protocol POSTs of `batch_max` points over one keep-alive HTTP connection.
Latency: each row's `written_at` minus the burst's commit (p50/p99). RSS: the
gateway's after the burst, against the same run with only the MQTT uplink.

Usage: python3 scripts/bench/databases.py [--devices 10000]
"""
import argparse
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import report  # noqa: E402

RULES = """[time]
policy = "device"
[group_defaults]
window = { kind = "tumbling", size_ms = 10000 }
idle_timeout_ms = 1000
"""


def as_nobody(cmd):
    return (["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"] + cmd
            if os.geteuid() == 0 else cmd)


def owned(path):
    os.makedirs(path, exist_ok=True)
    if os.geteuid() == 0:
        subprocess.run(["chown", "-R", "nobody:nogroup", path], check=True)
    return path


def pg_bin(name):
    root = "/usr/lib/postgresql"
    return os.path.join(root, sorted(os.listdir(root))[-1], "bin", name)


class Postgres:
    def __init__(self, root):
        data = os.path.join(owned(root), "data")
        subprocess.run(as_nobody([pg_bin("initdb"), "-U", "tidemark", "--auth=trust", "--no-sync", "-D", data]),
                       check=True, capture_output=True)
        self.port = report.free_port()
        self.proc = report.spawn(as_nobody([pg_bin("postgres"), "-D", data, "-p", str(self.port),
                                            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report.wait_for(lambda: self.try_sql("postgres", "SELECT 1") is not None, "postgres", every=0.2)
        self.sql("postgres", "CREATE DATABASE site")

    def try_sql(self, db, sql, file=None):
        cmd = [pg_bin("psql"), "-X", "-At", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-U", "tidemark",
               "-p", str(self.port), "-d", db]
        cmd += ["-f", file] if file else ["-c", sql]
        r = subprocess.run(cmd, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None

    def sql(self, db, sql, file=None):
        out = self.try_sql(db, sql, file)
        if out is None:
            raise SystemExit(f"psql failed: {sql or file}")
        return out

    def url(self):
        return f"postgresql://tidemark@127.0.0.1:{self.port}/site"


class Influx:
    def __init__(self, root):
        owned(root)
        self.port = report.free_port()
        conf = os.path.join(root, "influxdb.conf")
        with open(conf, "w") as f:
            f.write(f'reporting-disabled = true\nbind-address = "127.0.0.1:{report.free_port()}"\n'
                    f'[meta]\ndir = "{root}/meta"\n[data]\ndir = "{root}/data"\nwal-dir = "{root}/wal"\n'
                    f'query-log-enabled = false\n[http]\nbind-address = "127.0.0.1:{self.port}"\n'
                    f'log-enabled = false\n[monitor]\nstore-enabled = false\n')
        owned(root)
        self.proc = report.spawn(as_nobody(["influxd", "run", "-config", conf]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report.wait_for(lambda: self.request("GET", "/ping")[0] == 204, "influxd", every=0.2)
        self.query("CREATE DATABASE tidemark")

    def request(self, method, path, body=None):
        try:
            c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            c.request(method, path, body=body)
            r = c.getresponse()
            return r.status, r.read()
        except OSError:
            return 0, b""

    def query(self, q):
        from urllib.parse import quote
        status, body = self.request("POST", f"/query?db=tidemark&q={quote(q)}")
        return json.loads(body) if status == 200 else None

    def url(self):
        return f"http://127.0.0.1:{self.port}"


def burst(bin, n, output_extra, plain):
    """A fresh gateway writes a close burst of `n` windows: (seconds from commit to
    the output's last confirmation, commit time, RSS MiB after)."""
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-db-")
    gw = report.Gateway(bin, state, src.url, up.url, extra=RULES + output_extra,
                        sink_extra=f"plain = {'true' if plain else 'false'}")
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
    report.simulate(bin, src.url, "--devices", n, "--rate", 0, "--count", 3 * n, "--qos", 1,
                    "--connections", 2)
    report.wait_for(lambda: (gw.metric("tidemark_windows_emitted_total") or 0) >= n,
                    "the close burst", every=0.005)
    closed = time.time()
    key = None
    for k in ("postgres", "influx"):
        if k in output_extra:
            key = f'tidemark_output_written_total{{output="{k}"}}'
    if key:
        report.wait_for(lambda: (gw.metric(key) or 0) >= n, "the output to confirm the burst", every=0.005)
    else:
        report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "the uplink to drain", every=0.005)
    took = time.time() - closed
    time.sleep(6)
    rss = gw.rss_mib()
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return took, closed, rss


def bare_pg(pg, batch):
    """The same rows by multi-row INSERT ... ON CONFLICT through one psql session: seconds."""
    pg.sql("site", "CREATE TABLE bare (LIKE tidemark_windows INCLUDING ALL)")
    rows = pg.sql("site", "SELECT json_agg(t) FROM tidemark_windows t")
    rows = json.loads(rows)
    path = os.path.join(tempfile.mkdtemp(prefix="tm-bench-bare-"), "bare.sql")
    with open(path, "w") as f:
        for i in range(0, len(rows), batch):
            values = ",".join(
                "({})".format(",".join([
                    q(r["result_id"]), q(r["gateway"]), q(r["group_id"]), q(r["device"]),
                    q(r["window_start"]) + "::timestamptz", q(r["window_end"]) + "::timestamptz",
                    str(r["revision"]), str(r["readings"]), str(r["heartbeats"]),
                    q(json.dumps(r["metrics"])) + "::jsonb", "now()"]))
                for r in rows[i:i + batch])
            f.write(f"INSERT INTO bare AS t VALUES {values} ON CONFLICT (gateway, group_id, device, window_start) "
                    "DO UPDATE SET revision = excluded.revision, readings = excluded.readings, "
                    "metrics = excluded.metrics WHERE excluded.revision > t.revision;\n")
    t = time.time()
    pg.sql("site", None, file=path)
    return time.time() - t, len(rows)


def q(s):
    return "'" + str(s).replace("'", "''") + "'"


def bare_influx(ix, batch):
    """The same points by line-protocol POSTs over one keep-alive connection: seconds."""
    res = ix.query("SELECT * FROM tidemark_windows GROUP BY *")
    lines = []
    for s in res["results"][0].get("series", []):
        tags = ",".join(f"{k}={v}" for k, v in sorted(s["tags"].items()) if v)
        cols = s["columns"]
        for v in s["values"]:
            fields = ",".join(f"{c}={x}i" if c in ("revision", "readings", "heartbeats") or c.endswith("_count")
                              else f"{c}={float(x)!r}" for c, x in zip(cols[1:], v[1:]) if x is not None)
            ts = v[0]
            lines.append(f"bare_windows,{tags} {fields} {ts}")
    c = http.client.HTTPConnection("127.0.0.1", ix.port, timeout=60)
    t = time.time()
    for i in range(0, len(lines), batch):
        c.request("POST", "/write?db=tidemark&precision=ms", body="\n".join(lines[i:i + batch]))
        r = c.getresponse()
        r.read()
        assert r.status == 204, r.status
    return time.time() - t, len(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=10_000)
    a = ap.parse_args()
    n = a.devices
    bin = report.tidemark_bin()
    root = tempfile.mkdtemp(prefix="tm-bench-dbs-")
    pg, ix = Postgres(os.path.join(root, "pg")), Influx(os.path.join(root, "influx"))

    base_s, _, base_rss = burst(bin, n, "", True)
    pg_s, pg_closed, pg_rss = burst(bin, n, f'[sink.postgres]\nenabled = true\nurl = "{pg.url()}"\n', False)
    lat = pg.sql("site", "SELECT json_agg(extract(epoch from written_at)) FROM tidemark_windows")
    lat = sorted((float(x) - pg_closed) * 1000 for x in json.loads(lat))
    bare_pg_s, pg_rows = bare_pg(pg, 1000)
    ix_s, _, ix_rss = burst(bin, n, f'[sink.influx]\nenabled = true\nurl = "{ix.url()}"\n', False)
    bare_ix_s, ix_points = bare_influx(ix, 5000)

    def pct(p):
        return lat[min(len(lat) - 1, int(p * len(lat)))]

    rows = [
        ["PostgreSQL 15 (`batch_max` 1000)", f"{n / pg_s:,.0f} rows/s", f"{pg_rows / bare_pg_s:,.0f} rows/s",
         f"{(n / pg_s) / (pg_rows / bare_pg_s):.2f}x", f"{pct(0.5):.0f} / {pct(0.99):.0f} ms",
         f"{pg_rss - base_rss:+.1f} MiB"],
        ["InfluxDB 1.6 (`batch_max` 5000)", f"{n / ix_s:,.0f} points/s", f"{ix_points / bare_ix_s:,.0f} points/s",
         f"{(n / ix_s) / (ix_points / bare_ix_s):.2f}x", "-", f"{ix_rss - base_rss:+.1f} MiB"],
    ]
    body = report.table(["output", "tidemark", "bare path, same rows", "ratio (goal >= 0.7x)",
                         "window close -> row visible p50 / p99", "RSS vs MQTT only"], rows)
    body += (f"\n\nA close burst of {n:,} windows (10 000 devices x 3 readings, 10 s windows, every window "
             f"closing at once when the fleet goes idle). Baseline (MQTT uplink only): burst delivered in "
             f"{base_s:.2f} s, RSS {base_rss:.1f} MiB. The bare paths: PostgreSQL, multi-row `INSERT ... ON "
             f"CONFLICT DO UPDATE ... WHERE excluded.revision > t.revision` of 1000 rows per statement through one "
             f"psql session ({pg_rows:,} rows, {bare_pg_s:.2f} s); InfluxDB, line-protocol POSTs of 5000 points "
             f"over one keep-alive connection ({ix_points:,} points, {bare_ix_s:.2f} s). Latency: each row's "
             f"`written_at` (its transaction's start) minus the moment the burst was committed.\n\n"
             f"Command: `python3 scripts/bench/databases.py --devices {n}`")
    print(body)
    report.write_section(15, "Database outputs against the bare write path", body)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
