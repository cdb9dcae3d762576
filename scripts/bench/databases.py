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
        self.name = "postgres"
        data = self.data = os.path.join(owned(root), "data")
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

    def stop(self):
        self.proc.send_signal(2)
        self.proc.wait()

    def rate(self, n):
        """Rows/s of a burst of `n` by the database's clock: the rows of every batch
        but the last over the time from the first batch's start to the last's."""
        q = "SELECT count(*) FROM tidemark_windows"
        report.wait_for(lambda: int(self.try_sql("site", q) or 0) >= n, "the burst in PostgreSQL", every=0.05)
        out = self.sql("site", "SELECT extract(epoch from written_at), count(*) FROM tidemark_windows "
                               "GROUP BY written_at ORDER BY written_at")
        batches = [(float(t), int(c)) for t, c in (line.split("|") for line in out.splitlines())]
        return (n - batches[-1][1]) / (batches[-1][0] - batches[0][0])

    def start(self):
        self.proc = report.spawn(as_nobody([pg_bin("postgres"), "-D", self.data, "-p", str(self.port),
                                            "-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report.wait_for(lambda: self.try_sql("postgres", "SELECT 1") is not None, "postgres", every=0.05)


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
        self.name, self.conf = "influx", conf
        self.start()
        self.query("CREATE DATABASE tidemark")

    def start(self):
        self.proc = report.spawn(as_nobody(["influxd", "run", "-config", self.conf]),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        report.wait_for(lambda: self.request("GET", "/ping")[0] == 204, "influxd", every=0.05)

    def stop(self):
        self.proc.terminate()
        self.proc.wait()

    def rate(self, n, measurement="tidemark_windows"):
        """Points/s of a burst of `n`, from the first point seen (polled over one
        keep-alive connection) to the last."""
        from urllib.parse import quote
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        path = "/query?db=tidemark&q=" + quote(f"SELECT count(readings) FROM {measurement}")

        def count():
            c.request("GET", path)
            body = json.loads(c.getresponse().read())
            series = body["results"][0].get("series")
            return series[0]["values"][0][1] if series else 0
        first = 0
        while first == 0:
            first = count()
        t0 = time.time()
        while (last := count()) < n:
            pass
        return (last - first) / (time.time() - t0)

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
        status, body = self.request("POST", f"/query?db=tidemark&epoch=ms&q={quote(q)}")
        return json.loads(body) if status == 200 else None

    def url(self):
        return f"http://127.0.0.1:{self.port}"


def burst(bin, n, output_extra, db=None):
    """A fresh gateway takes a close burst of `n` windows while `db` is down (its
    entries wait in the outbox), then `db` comes up: (rows/s from the output's
    first confirmed batch to its last, RSS MiB after). Without `db`: the MQTT uplink."""
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-db-")
    gw = report.Gateway(bin, state, src.url, up.url, extra=RULES + output_extra,
                        sink_extra="plain = false" if db else "")
    src.wait_subscribed("tidemark-bench-in")
    report.wait_for(lambda: gw.metric("tidemark_received_total") is not None, "metrics")
    if db:
        db.stop()
    report.simulate(bin, src.url, "--devices", n, "--rate", 0, "--count", 3 * n, "--qos", 1,
                    "--connections", 2)
    report.wait_for(lambda: (gw.metric("tidemark_windows_emitted_total") or 0) >= n,
                    "the close burst", every=0.05)
    rate = None
    if db:
        db.start()
        rate = db.rate(n)
    else:
        report.wait_for(lambda: gw.metric("tidemark_outbox_depth") == 0, "the uplink to drain", every=0.05)
    time.sleep(6)
    rss = gw.rss_mib()
    gw.stop()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    return rate, rss


def latency(bin, pg, seconds=20):
    """Steady fleet, 1 s windows, MQTT and PostgreSQL both on: per result, the time from
    its arrival upstream (the commit that made it) to its row being visible (polled
    every 10 ms): p50, p99 in ms."""
    src, up = report.Mosquitto(), report.Mosquitto()
    state = tempfile.mkdtemp(prefix="tm-bench-db-")
    rules = RULES.replace("size_ms = 10000", "size_ms = 1000")
    gw = report.Gateway(bin, state, src.url, up.url,
                        extra=rules + f'[sink.postgres]\nenabled = true\nurl = "{pg.url()}"\n')
    src.wait_subscribed("tidemark-bench-in")
    port = up.url.rsplit(":", 1)[1]
    sub = report.spawn(["mosquitto_sub", "-p", port, "-t", "tidemark/bench/windows/#", "-F", "%U %p"],
                       stdout=subprocess.PIPE, text=True)
    arrived = {}

    def read():
        for line in sub.stdout:
            at, payload = line.split(" ", 1)
            try:
                arrived[json.loads(payload)["id"]] = float(at)
            except (ValueError, KeyError):
                pass
    import threading
    threading.Thread(target=read, daemon=True).start()
    seen, stop = {}, []

    def poll():
        last = "-infinity"
        while not stop:
            out = pg.sql("site", f"SELECT result_id, written_at FROM tidemark_windows WHERE written_at > '{last}'")
            now = time.time()
            for line in out.splitlines():
                rid, w = line.split("|")
                seen.setdefault(rid, now)
                last = max(last, w) if last != "-infinity" else w
            time.sleep(0.01)
    t = threading.Thread(target=poll, daemon=True)
    t.start()
    report.simulate(bin, src.url, "--devices", 1000, "--rate", 1000, "--duration-s", seconds, "--qos", 1)
    time.sleep(5)
    stop.append(1)
    t.join()
    gw.stop()
    sub.kill()
    src.stop()
    up.stop()
    shutil.rmtree(state, ignore_errors=True)
    lat = sorted((seen[i] - arrived[i]) * 1000 for i in seen if i in arrived)
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(0.99 * len(lat)))], len(lat)


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

    def write():
        for i in range(0, len(lines), batch):
            c.request("POST", "/write?db=tidemark&precision=ms", body="\n".join(lines[i:i + batch]))
            r = c.getresponse()
            answer = r.read()
            assert r.status == 204, (r.status, answer[:300], lines[i][:300])
    import threading
    w = threading.Thread(target=write)
    w.start()
    # Timed as the output is: from the first point seen to the last, polled the same way.
    rate = ix.rate(len(lines), "bare_windows")
    w.join()
    return rate, len(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--devices", type=int, default=10_000)
    a = ap.parse_args()
    n = a.devices
    bin = report.tidemark_bin()
    root = tempfile.mkdtemp(prefix="tm-bench-dbs-")
    os.chmod(root, 0o755)  # the databases run as nobody below it
    pg, ix = Postgres(os.path.join(root, "pg")), Influx(os.path.join(root, "influx"))

    _, base_rss = burst(bin, n, "")
    pg_rate, pg_rss = burst(bin, n, f'[sink.postgres]\nenabled = true\nurl = "{pg.url()}"\n', pg)
    bare_pg_s, pg_rows = bare_pg(pg, 1000)
    ix_rate, ix_rss = burst(bin, n, f'[sink.influx]\nenabled = true\nurl = "{ix.url()}"\n', ix)
    bare_ix_rate, ix_points = bare_influx(ix, 5000)
    pg.sql("site", "TRUNCATE tidemark_windows")
    p50, p99, matched = latency(bin, pg)

    rows = [
        ["PostgreSQL 15 (`batch_max` 1000)", f"{pg_rate:,.0f} rows/s", f"{pg_rows / bare_pg_s:,.0f} rows/s",
         f"{pg_rate / (pg_rows / bare_pg_s):.2f}x", f"{p50:.0f} / {p99:.0f} ms ({matched:,} results)",
         f"{pg_rss - base_rss:+.1f} MiB"],
        ["InfluxDB 1.6 (`batch_max` 5000)", f"{ix_rate:,.0f} points/s", f"{bare_ix_rate:,.0f} points/s",
         f"{ix_rate / bare_ix_rate:.2f}x", "-", f"{ix_rss - base_rss:+.1f} MiB"],
    ]
    body = report.table(["output", "tidemark", "bare path, same rows", "ratio (goal >= 0.7x)",
                         "result upstream -> row visible p50 / p99", "RSS vs MQTT only"], rows)
    body += (f"\n\nA close burst of {n:,} windows (10 000 devices x 3 readings, 10 s windows, every window "
             f"closing as the fleet goes idle) written while the database is down, then the database comes up: "
             f"rows/s from the output's first confirmed batch to its last (`tidemark_output_written_total`, "
             f"polled every 2 ms). RSS: after the burst, against the same run with only the MQTT uplink "
             f"({base_rss:.1f} MiB). The bare paths: PostgreSQL, multi-row `INSERT ... ON "
             f"CONFLICT DO UPDATE ... WHERE excluded.revision > t.revision` of 1000 rows per statement through one "
             f"psql session ({pg_rows:,} rows, {bare_pg_s:.2f} s); InfluxDB, line-protocol POSTs of 5000 points "
             f"over one keep-alive connection ({ix_points:,} points), timed as the output is: from the first point seen to the last (a count polled over one keep-alive connection). Latency: a steady fleet (1 000 "
             f"devices, 1 000 readings/s, 1 s windows) with MQTT and PostgreSQL both on; per result, from its "
             f"arrival upstream (the commit that made it) to its row being visible in PostgreSQL (polled every "
             f"10 ms).\n\n"
             f"Command: `python3 scripts/bench/databases.py --devices {n}`")
    print(body)
    report.write_section(15, "Database outputs against the bare write path", body)
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
