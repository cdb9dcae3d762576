"""Shared by the benchmark scripts: machine facts, tables, and writing one
section of BENCHMARKS.md (each script owns the section between its markers)."""
import os
import platform
import re
import subprocess
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
    dirty = " (uncommitted changes)" if sh(f"git -C {ROOT} status --porcelain -uno").strip() else ""
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
        later = [m for m in re.finditer(r"<!-- table (\d) begin -->", text) if int(m.group(1)) > n]
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
