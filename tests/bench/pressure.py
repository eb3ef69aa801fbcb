#!/usr/bin/env python3
"""Memory-pressure reaction of one node (prints figures, asserts nothing).

    pressure.py ADMIN_KUBECONFIG NODE AGENT_LOG PODS_CGROUP_DIR OUT.json RATE...

The node's pods' cgroup is capped (node allocatable) and has a hard
threshold `allocatableMemory.available<150Mi`. For each RATE (MiB/s) a
BestEffort pod allocates anonymous memory at that rate; a sampler reads the
pods' cgroup every 5 ms and records:
  - cross:    the working set (usage - total_inactive_file) passing the
              threshold level (limit - 150 MiB);
  - decision: the agent's eviction log line (kinglet: "evicting"; kubelet:
              "Eviction manager: must evict pod(s) to reclaim"), timestamped
              by the agent itself;
  - freed:    the working set back under the level - 100 MiB;
  - oom_kills: the cgroup's kernel OOM kills during the run (the OOM killer
              won the race when > 0);
and whether the pod ended Evicted or OOMKilled.
"""
import datetime
import json
import os
import re
import subprocess
import sys
import time

MI = 1 << 20
THRESHOLD = 150 * MI


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def working_set(cg):
    usage = read(os.path.join(cg, "memory.usage_in_bytes")) or read(os.path.join(cg, "memory.current"))
    if not usage.strip():
        return None
    stat = read(os.path.join(cg, "memory.stat"))
    inactive = 0
    for line in stat.splitlines():
        k, _, v = line.partition(" ")
        if k in ("total_inactive_file", "inactive_file"):
            inactive = int(v)
            if k == "total_inactive_file":
                break
    return int(usage) - inactive


def limit_of(cg):
    v = (read(os.path.join(cg, "memory.limit_in_bytes")) or read(os.path.join(cg, "memory.max"))).strip()
    return int(v) if v.isdigit() else None


def oom_kills(cg):
    """Kernel OOM kills in the cgroup and below (v1 counts a kill in the
    cgroup of the task killed, so the subtree is summed; v2's
    memory.events is hierarchical already)."""
    total = 0
    for d, _, _ in os.walk(cg):
        text = read(os.path.join(d, "memory.oom_control"))
        if not text and d == cg:
            text = read(os.path.join(d, "memory.events"))
        m = re.search(r"^oom_kill (\d+)", text, re.M)
        total += int(m.group(1)) if m else 0
    return total


def wait_no_pressure(admin, node):
    """The previous run's MemoryPressure must have cleared (transition
    period), or admission refuses the next BestEffort pod."""
    for _ in range(300):
        r = kubectl(admin, "get", "node", node, "-o",
                    "jsonpath={.status.conditions[?(@.type==\"MemoryPressure\")].status}")
        if r.stdout.strip() == "False":
            return
        time.sleep(0.2)


def kubectl(admin, *args, stdin=None):
    return subprocess.run(["kubectl", "--kubeconfig", admin, *args], input=stdin, capture_output=True, text=True)


KLOG = re.compile(r"^[IWE](\d\d)(\d\d) (\d\d:\d\d:\d\d\.\d+)")


def log_time(line):
    """The agent's own timestamp of a log line, as Unix seconds."""
    iso = line.split(" ", 1)[0]
    if iso.endswith("Z") and "T" in iso:
        return datetime.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()
    m = KLOG.match(line)
    if m:
        year = datetime.datetime.now().year
        dt = datetime.datetime.strptime(f"{year}{m.group(1)}{m.group(2)} {m.group(3)[:15]}", "%Y%m%d %H:%M:%S.%f")
        return dt.replace(tzinfo=datetime.datetime.now().astimezone().tzinfo).timestamp()
    return None


def decision_after(log, offset):
    with open(log, errors="replace") as f:
        f.seek(offset)
        for line in f:
            if "evicting pod=" in line or "must evict pod(s)" in line:
                return log_time(line)
    return None


def run(admin, node, log, cg, rate, first):
    name = f"{node}-hog-{rate}"
    per_tenth = max(1, rate // 10)
    script = ("awk 'BEGIN{ b=sprintf(\"%1048576s\",\"\"); for(i=0;;i++){ a[i]=b i; "
              f"if(i%{per_tenth}=={per_tenth - 1}) system(\"sleep 0.1\") }} }}'")
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"bench": "kinglet"}},
           "spec": {"nodeName": node, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                    "containers": [{"name": "hog", "image": "kinglet.test/busybox:1",
                                    "command": ["sh", "-c", script]}]}}
    if not first:
        # The last run's condition reaches the API within a status update
        # (10 s) and holds for the transition period (10 s).
        time.sleep(22)
    wait_no_pressure(admin, node)
    limit = limit_of(cg)
    level = limit - THRESHOLD
    ooms = oom_kills(cg)
    offset = os.path.getsize(log)
    kubectl(admin, "create", "-f", "-", stdin=json.dumps(pod))
    cross = freed = None
    peak = 0
    deadline = time.time() + 120
    while time.time() < deadline:
        ws = working_set(cg)
        now = time.time()
        if ws is not None:
            peak = max(peak, ws)
            if cross is None and ws >= level:
                cross = now
            if cross is not None and freed is None and ws < level - 100 * MI:
                freed = now
                break
        time.sleep(0.005)
    phase = reason = ""
    for _ in range(100):
        r = kubectl(admin, "get", "pod", name, "-o", "json")
        if r.returncode == 0:
            st = json.loads(r.stdout).get("status", {})
            phase = st.get("phase", "")
            reason = st.get("reason", "")
            for c in st.get("containerStatuses", []):
                t = (c.get("state") or {}).get("terminated") or {}
                if t.get("reason") == "OOMKilled":
                    reason = reason or "OOMKilled"
            if phase in ("Failed", "Succeeded"):
                break
        time.sleep(0.2)
    decision = decision_after(log, offset)
    kills = oom_kills(cg) - ooms
    # On cgroup v1 the kill is counted in the killed task's cgroup, which
    # goes with the pod before it can be read: a container the kernel
    # killed is one kill at least.
    if reason == "OOMKilled":
        kills = max(kills, 1)
    kubectl(admin, "delete", "pod", name, "--grace-period=0", "--force", "--wait=false")
    # Let the node settle: memory back, the pod gone.
    for _ in range(150):
        ws = working_set(cg)
        if ws is not None and ws < level - 200 * MI:
            break
        time.sleep(0.2)
    time.sleep(2)
    ms = lambda a, b: round((a - b) * 1000) if a is not None and b is not None else None
    return {"rate_mib_s": rate, "limit_bytes": limit, "peak_bytes": peak,
            "cross_to_decision_ms": ms(decision, cross), "cross_to_freed_ms": ms(freed, cross),
            "oom_kills": kills, "phase": phase, "reason": reason}


def main():
    admin, node, log, cg, out = sys.argv[1:6]
    rates = [int(r) for r in sys.argv[6:]] or [20, 100, 500]
    results = []
    for i, rate in enumerate(rates):
        r = run(admin, node, log, cg, rate, i == 0)
        print(f"pressure {node} {rate} MiB/s: {r}", file=sys.stderr)
        results.append(r)
    json.dump(results, open(out, "w"), indent=1)


if __name__ == "__main__":
    main()
