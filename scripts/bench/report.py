"""Shared by the benchmark scripts: machine facts, tables, and writing one
section of BENCHMARKS.md (each script owns the section between its markers)."""
import os
import platform
import re
import subprocess
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(ROOT, "BENCHMARKS.md")
WORK = os.path.join(ROOT, "target", "bench")


def sh(cmd, **kw):
    return subprocess.run(cmd, shell=True, check=True, text=True, capture_output=True, **kw).stdout


def machine():
    cpu = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) // 1024
    commit = sh(f"git -C {ROOT} rev-parse --short HEAD").strip()
    code = "src Cargo.toml Cargo.lock benches"
    dirty = (" (uncommitted changes)"
             if sh(f"git -C {ROOT} status --porcelain -uno -- {code}").strip() else "")
    rustc = sh("rustc --version").strip()
    return (f"{cpu}, {os.cpu_count()} cores, {mem} MiB RAM, Linux {platform.release()}, "
            f"{rustc}; tidemark {commit}{dirty}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def table(header, rows):
    cols = [header] + [[str(c) for c in r] for r in rows]
    width = [max(len(r[i]) for r in cols) for i in range(len(header))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |"
    out = [line(cols[0]), "|" + "|".join("-" * (w + 2) for w in width) + "|"]
    out += [line(r) for r in cols[1:]]
    return "\n".join(out)


def write_section(n, title, body):
    """Replaces table `n`'s section of BENCHMARKS.md (creating the file if needed)."""
    begin, end = f"<!-- table {n} begin -->", f"<!-- table {n} end -->"
    text = open(DOC).read() if os.path.exists(DOC) else "# Benchmarks\n"
    section = f"{begin}\n## {n}. {title}\n\nMachine: {machine()}\n\n{body.strip()}\n{end}"
    if begin in text:
        text = re.sub(re.escape(begin) + ".*?" + re.escape(end), lambda _: section, text, flags=re.S)
    else:
        # Keep the sections in table order.
        later = [m for m in re.finditer(r"<!-- table (\d+) begin -->", text) if int(m.group(1)) > n]
        at = later[0].start() if later else len(text)
        text = text[:at].rstrip("\n") + "\n\n" + section + "\n\n" + text[at:].lstrip("\n")
    with open(DOC, "w") as f:
        f.write(text.rstrip("\n") + "\n")
    print(f"wrote section {n} of {DOC}")


def tidemark_bin():
    """The release binary, built if needed (TIDEMARK overrides)."""
    if os.environ.get("TIDEMARK"):
        return os.environ["TIDEMARK"]
    subprocess.run(["cargo", "build", "--release", "--quiet"], cwd=ROOT, check=True)
    return os.path.join(ROOT, "target", "release", "tidemark")


def workload(readings=2_000_000, devices=10_000):
    """The generated capture and CSV (cached under target/bench)."""
    os.makedirs(WORK, exist_ok=True)
    cap = os.path.join(WORK, f"capture-{readings}-{devices}.jsonl")
    csv = os.path.join(WORK, f"events-{readings}-{devices}.csv")
    if not (os.path.exists(cap) and os.path.exists(csv)):
        subprocess.run(["python3", os.path.join(ROOT, "scripts", "bench", "gen_events.py"),
                        "--readings", str(readings), "--devices", str(devices),
                        "--capture", cap + ".tmp", "--csv", csv], check=True)
        os.rename(cap + ".tmp", cap)
    return cap, csv


# --- processes the benchmarks start -------------------------------------------------

import atexit  # noqa: E402
import socket  # noqa: E402
import tempfile  # noqa: E402
import urllib.request  # noqa: E402


_children = []


def spawn(cmd, **kw):
    """Popen, killed when the script exits whatever happens."""
    p = subprocess.Popen(cmd, **kw)
    _children.append(p)
    return p


@atexit.register
def _reap():
    for p in _children:
        if p.poll() is None:
            p.kill()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_mosquitto():
    if not (shutil_which("mosquitto") and shutil_which("mosquitto_sub")):
        subprocess.run("apt-get update -q && apt-get install -y -q mosquitto mosquitto-clients",
                       shell=True, check=True)


def shutil_which(name):
    import shutil
    return shutil.which(name) or (os.path.exists(f"/usr/sbin/{name}") and f"/usr/sbin/{name}")


class Mosquitto:
    """A mosquitto on a free loopback port with unbounded queues (nothing dropped);
    `stock`: its defaults, only a listener and anonymous access."""

    def __init__(self, port=None, stock=False):
        self.dir = tempfile.mkdtemp(prefix="tm-bench-mq-")
        os.chmod(self.dir, 0o777)
        self.port = port or free_port()
        conf = os.path.join(self.dir, "m.conf")
        with open(conf, "w") as f:
            f.write(f"listener {self.port} 127.0.0.1\nallow_anonymous true\n")
            if not stock:
                f.write("max_queued_messages 0\nmax_inflight_messages 0\nmessage_size_limit 0\n")
            f.write(f"log_dest file {self.dir}/m.log\nlog_type subscribe\n")
        self.proc = spawn([shutil_which("mosquitto"), "-c", conf],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _connects(self.port), "mosquitto to listen")

    def wait_subscribed(self, client_id):
        """Until the broker logged a subscription of `client_id`."""
        def seen():
            try:
                with open(os.path.join(self.dir, "m.log")) as f:
                    return any(f"{client_id} " in line for line in f)
            except OSError:
                return False
        wait_for(seen, f"{client_id} to subscribe")

    @property
    def url(self):
        return f"mqtt://127.0.0.1:{self.port}"

    def stop(self):
        self.proc.terminate()
        self.proc.wait()


class DelayProxy:
    """A TCP proxy on a free loopback port that holds every byte `one_way_s` in each
    direction before passing it on: a long uplink (this kernel has no netem)."""

    def __init__(self, target_port, one_way_s):
        import asyncio
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def pump(reader, writer):
            q = asyncio.Queue()

            async def send():
                while True:
                    due, data = await q.get()
                    if data is None:
                        writer.close()
                        return
                    await asyncio.sleep(max(0.0, due - self.loop.time()))
                    writer.write(data)
                    await writer.drain()
            sender = asyncio.ensure_future(send())
            while True:
                data = await reader.read(1 << 16)
                q.put_nowait((self.loop.time() + one_way_s, data or None))
                if not data:
                    break
            await sender

        async def conn(r1, w1):
            try:
                r2, w2 = await asyncio.open_connection("127.0.0.1", target_port)
            except OSError:
                w1.close()
                return
            await asyncio.gather(pump(r1, w2), pump(r2, w1), return_exceptions=True)

        async def main():
            self.server = await asyncio.start_server(conn, "127.0.0.1", self.port)
            ready.set()
            await self.server.serve_forever()

        self.thread = threading.Thread(
            target=lambda: self.loop.run_until_complete(main()), daemon=True)
        self.thread.start()
        ready.wait(10)


def _connects(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
        return True
    except OSError:
        return False


def wait_for(cond, what, timeout=600, every=0.02):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


class Gateway:
    """`tidemark run` with its HTTP endpoint on; `extra` is appended to the config."""

    def __init__(self, bin, state_dir, source_url, sink_url, extra="", log="warn", env=None,
                 source_extra="", sink_extra="", log_file=None):
        self.http = free_port()
        self.cfg = os.path.join(state_dir, "bench.toml")
        os.makedirs(state_dir, exist_ok=True)
        with open(self.cfg, "w") as f:
            f.write(f"""[gateway]
id = "bench"
state_dir = "{state_dir}"
[source]
url = "{source_url}"
{source_extra}
[sink]
url = "{sink_url}"
{sink_extra}
[metrics]
listen = "127.0.0.1:{self.http}"
[log]
level = "{log}"
{extra}
""")
        self.bin = bin
        self.env = env
        # A log file, or a pipe for the caller to read (an unread pipe would stall the gateway).
        self.log_file = log_file
        self.start()

    def start(self):
        self.started = time.monotonic()
        err = open(self.log_file, "a") if self.log_file else subprocess.PIPE
        self.proc = spawn([self.bin, "run", "--config", self.cfg],
                          stdout=subprocess.DEVNULL, stderr=err, text=True, env=self.env)

    def metrics(self):
        """Prometheus samples as {name{labels}: value}, or None while not serving."""
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{self.http}/metrics", timeout=2).read()
        except OSError:
            return None
        out = {}
        for line in text.decode().splitlines():
            if line and not line.startswith("#"):
                k, v = line.rsplit(" ", 1)
                out[k] = float(v)
        return out

    def metric(self, name):
        m = self.metrics()
        return None if m is None else m.get(name)

    def rss_mib(self, field="VmRSS"):
        """A memory line of /proc/PID/status in MiB (VmHWM: the peak)."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
        return 0.0

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=120)


def simulate(bin, url, *args):
    """`tidemark simulate` to completion; returns its JSON summary."""
    r = subprocess.run([bin, "simulate", "--url", url, "--quiet", *map(str, args)],
                       capture_output=True, text=True, check=True)
    import json
    return json.loads(r.stdout.strip().splitlines()[-1])
