"""The conformance report: reads the JUnit files ginkgo left in OUT and
writes OUT/table.txt (selected, passed, failed, each failure's first line),
also printed. Shared by run.sh and the VM lab's conformance suite.
   report.py OUT WALL_SECONDS LABEL
"""
import glob, os, sys, xml.etree.ElementTree as ET
out, wall, runtime = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cases = {}
# The CLI's merged report when there is one: a failing spec also leaves
# a per-process report (junit_01.xml) that would count everything twice.
# (and the serial pass's).
merged = [f for f in (f"{out}/junit.xml", f"{out}/junit-serial.xml") if os.path.exists(f)]
reports = merged or sorted(glob.glob(f"{out}/junit*.xml"))
for f in reports:
    for tc in ET.parse(f).getroot().iter("testcase"):
        name = tc.get("name", "")
        if name.startswith("[SynchronizedBeforeSuite]") or name.startswith("[SynchronizedAfterSuite]") \
                or name.startswith("[ReportAfterSuite]") or name.startswith("[ReportBeforeSuite]"):
            continue
        status = tc.get("status", "")
        fail = tc.find("failure")
        if fail is None:
            fail = tc.find("error")
        if tc.find("skipped") is not None or status == "skipped":
            state = "skipped"
        elif fail is not None or status in ("failed", "panicked", "timedout", "interrupted"):
            state = "failed"
        else:
            state = "passed"
        cause = ""
        if fail is not None:
            text = (fail.get("message") or fail.text or "").strip()
            cause = text.splitlines()[0][:200] if text else status
        # A pass that did not select a spec lists it as skipped: that
        # never hides what the other pass ran.
        if state == "skipped" and name in cases:
            continue
        cases[name] = (state, name, cause)
cases = list(cases.values())
selected = [c for c in cases if c[0] != "skipped"]
n = {s: sum(1 for c in cases if c[0] == s) for s in ("passed", "failed", "skipped")}
run = n["passed"] + n["failed"]
# Specs outside the selection are reported as skipped by ginkgo: the
# selection is what ran.
lines = [f"conformance ({runtime}): {len(selected)} specs selected and run, {n['passed']} passed, {n['failed']} failed "
         f"({100 * n['passed'] / max(1, run):.0f}%); wall time {wall} s"]
for state, name, cause in cases:
    if state == "failed":
        lines.append(f"FAIL {name}\n     {cause}")
open(f"{out}/table.txt", "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
