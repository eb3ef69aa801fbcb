#!/usr/bin/env python3
"""Turns the per-node results of tests/bench/run.sh into a table on stdout,
results.json (one entry per node and metric, with the run's conditions),
results.md, and two SVG plots by matplotlib (memory vs pods,
startup-latency CDF). The memory-pressure row comes from OUT_DIR/pressure.json
when this run measured it (BENCH_PRESSURE=1: the full run does). Ratios are
computed within the run; nothing is asserted.

    report.py OUT_DIR QUICK SECONDS NODE.json...
"""
import json
import os
import platform
import subprocess
import sys
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out, quick, seconds = sys.argv[1], sys.argv[2] == "1", int(sys.argv[3])
nodes = []
for p in sys.argv[4:]:
    try:
        nodes.append(json.load(open(p)))
    except (OSError, ValueError):
        nodes.append({"node": os.path.basename(p)[:-5], "error": "no result"})
BASE = "kubelet-containerd"


def sh(cmd):
    try:
        return subprocess.run(cmd, shell=True, capture_output=True, text=True).stdout.strip()
    except OSError:
        return ""


mem_total = int(open("/proc/meminfo").read().split()[1]) // 1024
conditions = {
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "quick": quick,
    "run_seconds": seconds,
    "machine": f"{os.cpu_count()} cores, {mem_total} MiB, {platform.system()} {platform.release()}",
    "containerd": sh("containerd --version").split(" ")[2:3],
    "runc": sh("runc --version | head -1"),
    "note": "nodes run one after another on the same machine; figures are from this run only",
}

rows = []  # (metric, unit, {node: value})


def add(metric, unit, f):
    vals = {}
    for n in nodes:
        if "error" in n:
            vals[n["node"]] = None
            continue
        try:
            vals[n["node"]] = f(n)
        except (KeyError, IndexError, TypeError):
            vals[n["node"]] = None
    rows.append((metric, unit, vals))


def mem_at(n, pods, key):
    for m in n["memory"]:
        if m["pods"] == pods:
            return m[key] / 1024.0
    raise KeyError(pods)


add("agent binary", "MB", lambda n: n["agent_binary_bytes"] / 1e6)
add("runtime binaries (containerd, shim, runc; none in-process)", "MB", lambda n: n["runtime_binary_bytes"] / 1e6)
levels = sorted({m["pods"] for n in nodes if "error" not in n for m in n["memory"]})
for lv in levels:
    add(f"memory at {lv} pods: agent PSS", "MiB", lambda n, lv=lv: mem_at(n, lv, "agent_pss_kib"))
    add(f"memory at {lv} pods: runtime side PSS", "MiB", lambda n, lv=lv: mem_at(n, lv, "runtime_pss_kib"))
    add(f"memory at {lv} pods: node total PSS", "MiB",
        lambda n, lv=lv: mem_at(n, lv, "agent_pss_kib") + mem_at(n, lv, "runtime_pss_kib"))
    add(f"memory at {lv} pods: node total RSS", "MiB",
        lambda n, lv=lv: mem_at(n, lv, "agent_rss_kib") + mem_at(n, lv, "runtime_rss_kib"))
def cpu_at(n, pods, key):
    for c in n["cpu"]:
        if c["pods"] == pods:
            return c[key]
    return None


cpu_levels = sorted({c["pods"] for n in nodes if "error" not in n for c in n["cpu"]})
for lv in cpu_levels:
    label = f"idle at {lv} pods"
    add(f"CPU {label}: agent", "ms/min", lambda n, lv=lv: cpu_at(n, lv, "agent_cpu_ms_per_min"))
    add(f"CPU {label}: runtime side", "ms/min", lambda n, lv=lv: cpu_at(n, lv, "runtime_cpu_ms_per_min"))
    add(f"API requests {label}", "req/min", lambda n, lv=lv: cpu_at(n, lv, "api_requests_per_min"))
for lv in cpu_levels:
    label = f"idle at {lv} pods"
    for side, key in (("agent", "agent"), ("runtime side", "runtime"), ("node filesystem", "fs")):
        add(f"writes {label}: {side}", "KiB/min",
            lambda n, lv=lv, key=key: cpu_at(n, lv, f"{key}_write_bytes_per_min") / 1024.0)
for event, field in (("start", "writes_per_start"), ("deletion", "writes_per_delete")):
    for side, key in (("agent", "agent"), ("runtime side", "runtime"), ("node filesystem", "fs")):
        add(f"writes per pod {event}: {side}", "KiB",
            lambda n, field=field, key=key: n[field][f"{key}_bytes"] / 1024.0)
add("pod startup p50", "ms", lambda n: n["startup_p50_ms"])
add("pod startup p90", "ms", lambda n: n["startup_p90_ms"])
add("pod startup p99", "ms", lambda n: n["startup_p99_ms"])
for op in ("image_status", "run_podsandbox", "create_container", "start_container"):
    add(f"pod start, mean of the runtime call {op}", "ms",
        lambda n, op=op: n["start_breakdown"][op]["mean_ms"])
add("pod deletion p50", "ms", lambda n: n["delete_p50_ms"])
add("pod deletion p90", "ms", lambda n: n["delete_p90_ms"])
pressure = {}
if os.environ.get("BENCH_PRESSURE") == "1":
    try:
        pressure = json.load(open(os.path.join(out, "pressure.json")))
    except (OSError, ValueError):
        pass


def reaction(n, rate, key):
    rs = pressure.get(n["node"])
    r = next((r for r in rs if r["rate_mib_s"] == rate), None)
    return r[key]


for rate in (20, 100, 500):
    add(f"memory pressure {rate} MiB/s: crossing → eviction decided", "ms",
        lambda n, rate=rate: reaction(n, rate, "cross_to_decision_ms"))
    add(f"memory pressure {rate} MiB/s: crossing → memory freed", "ms",
        lambda n, rate=rate: reaction(n, rate, "cross_to_freed_ms"))
    add(f"memory pressure {rate} MiB/s: kernel OOM kills", "count",
        lambda n, rate=rate: reaction(n, rate, "oom_kills"))
NOT_MEASURED = ("not measured in this run: the full run (tests/bench/run.sh) and "
                "tests/bench/run.sh --pressure measure it" if not pressure else
                "no reaction measured (the pod was not evicted; see oom kills)")

names = [n["node"] for n in nodes]


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.1f}" if abs(v) < 100 else f"{v:.0f}"
    return str(v)


def ratio(v, base):
    if v is None or base in (None, 0):
        return None
    return v / base


# stdout table
header = ["metric", "unit"] + names + [f"{n}/{BASE}" for n in names if n != BASE]
table = []
for metric, unit, vals in rows:
    line = [metric, unit] + [fmt(vals.get(n)) for n in names]
    for n in names:
        if n != BASE:
            r = ratio(vals.get(n), vals.get(BASE))
            line.append("-" if r is None else f"{r:.2f}")
    table.append(line)
widths = [max(len(str(r[i])) for r in table + [header]) for i in range(len(header))]
print(f"machine: {conditions['machine']}; run took {seconds} s{' (quick)' if quick else ''}")
for r in [header] + table:
    print("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w) for i, (c, w) in enumerate(zip(r, widths))))

os.makedirs(out, exist_ok=True)
results = []
for metric, unit, vals in rows:
    for n in names:
        e = {"node": n, "metric": metric, "unit": unit, "value": vals.get(n)}
        if vals.get(n) is None:
            e["status"] = (NOT_MEASURED if metric.startswith("memory pressure")
                           else "not measured in this run")
        r = ratio(vals.get(n), vals.get(BASE))
        if n != BASE and r is not None:
            e["ratio_to_" + BASE.replace("-", "_")] = r
        results.append(e)
for n in nodes:
    if "error" in n:
        results.append({"node": n["node"], "metric": "error", "value": None, "status": n["error"]})
json.dump({"conditions": conditions, "results": results,
           "raw": {n["node"]: n for n in nodes}}, open(os.path.join(out, "results.json"), "w"), indent=1)

with open(os.path.join(out, "results.md"), "w") as f:
    f.write(f"Machine: {conditions['machine']}; {conditions['date']}; "
            f"{'quick run' if quick else 'full run'} ({seconds} s). Ratios are to {BASE}, within this run.\n\n")
    f.write("| " + " | ".join(header) + " |\n")
    f.write("|" + "---|" * len(header) + "\n")
    for r in table:
        f.write("| " + " | ".join(str(c) for c in r) + " |\n")
    f.write("\n![memory vs pods](memory.svg) ![startup latency](startup.svg)\n")
    if pressure:
        f.write("\n![memory-pressure reaction](pressure.svg)\n")

COLORS = {"kubelet-containerd": "#d62728", "kinglet-oci": "#2ca02c", "kinglet-cri": "#1f77b4"}


def plot(path, title, xlabel, ylabel, series):
    """series: {name: [(x, y), ...]}; a line chart with a legend (SVG)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in series.items():
        if pts:
            xs, ys = zip(*pts)
            ax.plot(xs, ys, marker="o" if len(pts) < 20 else None, label=name,
                    color=COLORS.get(name, "black"))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


plot(os.path.join(out, "memory.svg"), "Node memory (agent + runtime side, PSS) vs pods",
         "sleeping pods", "MiB",
         {n["node"]: [(m["pods"], (m["agent_pss_kib"] + m["runtime_pss_kib"]) / 1024.0) for m in n["memory"]]
          for n in nodes if "error" not in n})
plot(os.path.join(out, "startup.svg"), "Pod startup latency (created → Running), CDF",
         "ms", "% of pods",
         {n["node"]: [(v, 100.0 * (i + 1) / len(n["startup_ms"])) for i, v in enumerate(sorted(n["startup_ms"]))]
          for n in nodes if "error" not in n and n.get("startup_ms")})
print(f"wrote {out}/results.json, results.md, memory.svg, startup.svg")
