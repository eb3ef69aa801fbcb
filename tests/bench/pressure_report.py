#!/usr/bin/env python3
"""Turns the memory-pressure runs of tests/bench/run.sh (pressure.py, one
JSON per node) into OUT/pressure.json, a Markdown table (pressure.md) and a
plot (pressure.svg: crossing → decision and crossing → memory freed per ramp
and node, log scale, kernel OOM kills marked). Asserts nothing.

    pressure_report.py OUT_DIR NODE.pressure.json...
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

out = sys.argv[1]
nodes = {}
for path in sys.argv[2:]:
    name = os.path.basename(path).split(".")[0]
    try:
        nodes[name] = json.load(open(path))
    except (OSError, ValueError):
        nodes[name] = "no result"
os.makedirs(out, exist_ok=True)
json.dump(nodes, open(os.path.join(out, "pressure.json"), "w"), indent=1)


def early(r):
    """Evicted before the sampler saw the working set cross the level: the
    agent's own reading crossed first (it counts a little more)."""
    return r.get("cross_to_decision_ms") is None and r.get("reason") == "Evicted"


def kills(r):
    """The kernel OOM kills of a run; a container the kernel killed is one
    at least (on cgroup v1 the kill is counted in the killed task's cgroup,
    which went with the pod before runs of an older pressure.py read it)."""
    n = r.get("oom_kills", 0)
    if r.get("reason") == "OOMKilled" and n == 0:
        return "≥ 1 OOM kill (the container's OOMKilled)"
    return f"{n} OOM kills"


def cell(r):
    ms = lambda v: "none" if v is None else f"{v} ms"
    if early(r):
        return (f"evicted before the sampled crossing (peak {r['peak_bytes'] >> 20} MiB), "
                f"{kills(r)}")
    return (f"{ms(r['cross_to_decision_ms'])} / {ms(r['cross_to_freed_ms'])}, "
            f"{kills(r)}, {r['reason'] or r['phase']}")


rates = sorted({r["rate_mib_s"] for rs in nodes.values() if isinstance(rs, list) for r in rs})
rows = ["| ramp | " + " | ".join(nodes) + " |", "| --- |" + " --- |" * len(nodes)]
for rate in rates:
    cells = []
    for rs in nodes.values():
        r = next((r for r in rs if r["rate_mib_s"] == rate), None) if isinstance(rs, list) else None
        cells.append(cell(r) if r else "n/a")
    rows.append(f"| {rate} MiB/s | " + " | ".join(cells) + " |")
table = "\n".join(rows)
print("memory pressure: threshold crossed → eviction decided / memory freed\n" + table)
with open(os.path.join(out, "pressure.md"), "w") as f:
    f.write(table + "\n\n![memory-pressure reaction](pressure.svg)\n")

COLORS = {"kubelet-containerd": "#d62728", "kinglet-oci": "#2ca02c", "kinglet-cri": "#1f77b4"}
fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
width = 0.8 / max(1, len(nodes))
for ax, key, title in zip(axes, ["cross_to_decision_ms", "cross_to_freed_ms"],
                          ["threshold crossed → eviction decided", "threshold crossed → memory freed"]):
    for k, (name, rs) in enumerate(nodes.items()):
        if not isinstance(rs, list):
            continue
        xs, ys, ooms = [], [], []
        for i, rate in enumerate(rates):
            r = next((r for r in rs if r["rate_mib_s"] == rate), None)
            if r is None:
                continue
            # A reaction never measured (the OOM killer won) is drawn at
            # the top, hatched.
            # Evicted before the sampled crossing: drawn at the floor.
            v = 0 if early(r) else r.get(key)
            xs.append(i + k * width)
            ys.append(max(1, v) if v is not None else 20000)
            ooms.append(r.get("oom_kills", 0) > 0 or r.get("reason") == "OOMKilled" or v is None)
        bars = ax.bar(xs, ys, width, label=name, color=COLORS.get(name, "grey"))
        for b, oom in zip(bars, ooms):
            if oom:
                b.set_hatch("//")
                b.set_alpha(0.5)
    ax.set_yscale("log")
    ax.set_xticks([i + width * (len(nodes) - 1) / 2 for i in range(len(rates))])
    ax.set_xticklabels([f"{r} MiB/s" for r in rates])
    ax.set_title(title, fontsize=10)
    ax.grid(axis="y", alpha=0.3)
axes[0].set_ylabel("ms (log scale; hatched: kernel OOM kill)")
axes[1].legend(fontsize=8)
fig.suptitle("Memory-pressure reaction, pods' cgroup capped at 600 MiB, threshold 150 MiB")
fig.tight_layout()
fig.savefig(os.path.join(out, "pressure.svg"))
print(f"wrote {out}/pressure.json, pressure.md, pressure.svg")
