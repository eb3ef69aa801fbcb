#!/usr/bin/env python3
"""Runs the workspace's test binaries two at a time.

The end-to-end binaries mostly wait (for pods, probes, timeouts), so two of
them side by side use the machine's two cores better than cargo's one
binary after another. Each binary's output goes to target/tests/<name>.log
and is printed whole when it ends, so the summary (`test result:` lines)
reads as cargo's. The binaries that measure the machine run alone: the
quick bench (its figures) and eviction (memory, disk and PID pressure of
the whole host).

Usage: tests/parallel.py [--jobs N] [--skip NAME]... [--only NAME]...
(after the binaries are built:
cargo test --workspace --no-run --message-format=json > target/tests/build.json)
"""

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

# A binary still running after this long is killed and fails (its log says
# how far it got).
TIMEOUT = 1800

# Binaries that must have the machine to themselves.
ALONE = {"e2e_bench", "e2e_eviction"}

# Seconds each took on a cold CI run (2026-12-07, docs/ci.md): the longest
# start first, so that two slots end together. A binary not named here
# counts as 30 s.
WEIGHT = {
    "e2e_pods": 144, "e2e_certificates": 137, "e2e_faults": 119,
    "e2e_kubelet_api": 117, "e2e_probes": 88, "e2e_api_pods": 75,
    "e2e_churn": 49, "e2e_packaging": 44, "e2e_hostile": 33,
    "e2e_devices": 28, "e2e_volumes": 27, "e2e_hostile_api": 23,
    "e2e_images": 26, "kinglet(lib)": 12, "e2e_resize": 12,
    "e2e_cri": 10, "e2e_apiserver_restart": 10,
}


def binaries(build_json):
    """(name, executable, package dir) of every test binary cargo built."""
    out = []
    for line in Path(build_json).read_text().splitlines():
        try:
            m = json.loads(line)
        except json.JSONDecodeError:
            continue
        if m.get("reason") != "compiler-artifact" or not m.get("executable"):
            continue
        if not m.get("profile", {}).get("test"):
            continue
        t = m["target"]
        pkg_dir = str(Path(m["manifest_path"]).parent)
        if "lib" in t["kind"] or "bin" in t["kind"]:
            name = f"{t['name']}({t['kind'][0]})"
        else:
            name = t["name"]
        out.append((name, m["executable"], pkg_dir))
    return out


def start(job, logs):
    name, exe, pkg_dir = job
    env = dict(os.environ, CARGO_MANIFEST_DIR=pkg_dir)
    log = open(logs / f"{name}.log", "wb")
    p = subprocess.Popen(
        [exe, "--nocapture"], cwd=pkg_dir, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    timer = threading.Timer(TIMEOUT, p.kill)
    timer.daemon = True
    timer.start()
    return p, log, time.monotonic()


def finish(job, proc, log, began, logs):
    log.close()
    secs = time.monotonic() - began
    print(f"     Running {job[0]} ({job[1]}), {secs:.0f} s, exit {proc.returncode}", flush=True)
    sys.stdout.write((logs / f"{job[0]}.log").read_text(errors="replace"))
    sys.stdout.flush()
    return proc.returncode == 0


def run(jobs, slots, logs):
    """Runs `jobs` in order, `slots` at a time; True when all passed."""
    ok = True
    queue = list(jobs)
    running = []
    while queue or running:
        while queue and len(running) < slots:
            job = queue.pop(0)
            running.append((job, *start(job, logs)))
        # Whichever ends first; its status is taken here, so Popen's own
        # wait() is not called on it.
        pid, status = os.wait()
        for r in running:
            if r[1].pid == pid:
                r[1].returncode = os.waitstatus_to_exitcode(status)
                running.remove(r)
                ok &= finish(r[0], r[1], r[2], r[3], logs)
                break
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--build-json", default="target/tests/build.json")
    ap.add_argument("--skip", action="append", default=[], help="a binary not to run")
    ap.add_argument("--only", action="append", default=[], help="run just these binaries")
    a = ap.parse_args()
    logs = Path("target/tests").resolve()
    logs.mkdir(parents=True, exist_ok=True)
    all_jobs = [
        j for j in binaries(a.build_json)
        if j[0] not in a.skip and (not a.only or j[0] in a.only)
    ]
    if not all_jobs:
        sys.exit(f"no test binaries to run in {a.build_json}")
    alone = [j for j in all_jobs if j[0] in ALONE]
    paired = sorted(
        (j for j in all_jobs if j[0] not in ALONE),
        key=lambda j: -WEIGHT.get(j[0], 30),
    )
    ok = run(alone, 1, logs)
    ok &= run(paired, a.jobs, logs)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
