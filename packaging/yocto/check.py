#!/usr/bin/env python3
"""Checks meta-kinglet without bitbake (neither bitbake nor
openembedded-core can be installed on this build machine), as far as a
script can:

- layer.conf sets what a layer must, and its BBFILES globs find the recipes;
- each recipe sets SUMMARY, LICENSE, LIC_FILES_CHKSUM, SRC_URI, uses the
  current override syntax (`:append`, `:${PN}`, never `_append`), names its
  version as Cargo.toml does, and its inline Python compiles;
- every `file://` in SRC_URI exists in the recipe's files/ for each
  architecture (the binaries: the static ELF of that machine, as
  prepare.sh copies them);
- the layer's copies of the unit, config, conflist, tmpfiles and networkd
  file are the repo's own;
- do_install, with the variables expanded as oe-core sets them, runs in a
  scratch dir and installs the files the unit and README name, with the
  modes the CIS benchmark asks for;
- the kernel fragment is only CONFIG_X=y|m lines.

Usage: check.py [ARCH...] (x86_64, aarch64, armv7; default all three):
the binaries are checked for the arches named, whose static builds must be
there (CI builds x86_64 only; the ARM ones are the VM lab's).

Exit status 1 and one line per problem if any.
"""

import glob
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
LAYER = os.path.join(HERE, "meta-kinglet")
ARCHES = {"x86_64": "x86-64", "aarch64": "ARM aarch64", "armv7": "ARM, EABI5"}
CHECKED = [a for a in sys.argv[1:] if a in ARCHES] or list(ARCHES)
problems = []


def problem(msg):
    problems.append(msg)


def assignments(text):
    """VAR -> value of `VAR = "..."` (also += .= ?=), continuation lines joined."""
    text = text.replace("\\\n", " ")
    out = {}
    for m in re.finditer(r'^([A-Za-z0-9_:${}\[\]-]+)\s*(\?\?=|\?=|\+=|\.=|=|:=)\s*"(.*)"\s*$', text, re.M):
        out.setdefault(m.group(1), []).append(m.group(3))
    return out


def check_layer():
    text = open(os.path.join(LAYER, "conf/layer.conf")).read()
    a = assignments(text)
    for var in ["BBFILE_COLLECTIONS", "BBFILE_PATTERN_kinglet", "BBFILE_PRIORITY_kinglet",
                "LAYERSERIES_COMPAT_kinglet", "BBFILES", "LAYERDEPENDS_kinglet"]:
        if var not in a:
            problem(f"layer.conf: {var} not set")
    recipes = []
    for g in " ".join(a.get("BBFILES", [])).split():
        recipes += glob.glob(g.replace("${LAYERDIR}", LAYER))
    if not any(r.endswith(".bb") for r in recipes):
        problem("layer.conf: BBFILES finds no recipe")
    return recipes


def cargo_version():
    m = re.search(r'^version = "(.*)"', open(os.path.join(REPO, "Cargo.toml")).read(), re.M)
    return m.group(1)


def check_recipe(path):
    text = open(path).read()
    name = os.path.basename(path)
    a = assignments(text)
    for var in ["SUMMARY", "LICENSE", "LIC_FILES_CHKSUM", "SRC_URI"]:
        if var not in a:
            problem(f"{name}: {var} not set")
    for m in re.finditer(r"^\s*([A-Za-z0-9_${}]+_(append|prepend|remove|\$\{PN\}))\b", text, re.M):
        problem(f"{name}: old override syntax {m.group(1)} (use ':')")
    if name != f"kinglet_{cargo_version()}.bb":
        problem(f"{name}: the version is not Cargo.toml's {cargo_version()}")
    for m in re.finditer(r"\$\{@(.*?)\}\"", text):
        try:
            compile(m.group(1), name, "eval")
        except SyntaxError as e:
            problem(f"{name}: inline python does not compile: {e}")
    if "inherit systemd" not in text or "SYSTEMD_SERVICE:${PN}" not in a:
        problem(f"{name}: not a systemd recipe (inherit systemd, SYSTEMD_SERVICE:${{PN}})")
    files = os.path.join(os.path.dirname(path), "files")
    uris = " ".join(a.get("SRC_URI", [])).split()
    for arch, machine in ARCHES.items():
        if arch not in CHECKED:
            continue
        for uri in uris:
            f = uri.replace("${KINGLET_ARCH}", arch)
            if not f.startswith("file://"):
                continue
            p = os.path.join(files, f[len("file://"):])
            if not os.path.exists(p):
                problem(f"{name}: SRC_URI {f} ({arch}) is not in files/ (packaging/yocto/prepare.sh)")
            elif "${KINGLET_ARCH}" in uri:
                desc = subprocess.run(["file", "-b", p], capture_output=True, text=True).stdout
                if machine not in desc or "statically linked" not in desc:
                    problem(f"{name}: {f} is not a static {arch} ELF: {desc.strip()}")
    return text, files


def check_copies(files):
    for copy, src in [("kinglet.service", "systemd/kinglet.service"),
                      ("config.yaml", "packaging/config.yaml"),
                      ("10-kinglet.conflist", "packaging/common/10-kinglet.conflist"),
                      ("kinglet.tmpfiles", "packaging/common/kinglet.tmpfiles"),
                      ("kinglet.network", "packaging/common/kinglet.network")]:
        if open(os.path.join(files, copy), "rb").read() != open(os.path.join(REPO, src), "rb").read():
            problem(f"files/{copy} differs from {src}: copy it again")


OE_VARS = {"bindir": "/usr/bin", "sysconfdir": "/etc", "systemd_system_unitdir": "/usr/lib/systemd/system",
           "nonarch_libdir": "/usr/lib", "KINGLET_ARCH": "x86_64"}


def check_install(text, files):
    m = re.search(r"^do_install\(\) \{\n(.*?)^\}", text, re.M | re.S)
    if not m:
        problem("recipe: no do_install")
        return
    with tempfile.TemporaryDirectory() as d:
        body = m.group(1)
        for k, v in dict(OE_VARS, S=files, D=d).items():
            body = body.replace("${" + k + "}", v)
        left = re.findall(r"\$\{[^}]*\}", body)
        if left:
            problem(f"do_install: variables oe-core would not set here: {left}")
            return
        r = subprocess.run(["sh", "-euc", body], capture_output=True, text=True)
        if r.returncode != 0:
            problem(f"do_install fails: {r.stderr.strip()}")
            return
        unit = open(os.path.join(files, "kinglet.service")).read()
        exec_start = re.search(r"^ExecStart=(\S+)", unit, re.M).group(1)
        config = re.search(r"--config (\S+)", unit).group(1)
        want = {exec_start: 0o755, config: 0o600, "/etc/kinglet": 0o700, "/etc/kinglet/manifests": 0o700,
                "/usr/lib/systemd/system/kinglet.service": 0o644,
                "/etc/cni/net.d/10-kinglet.conflist": 0o644, "/usr/lib/tmpfiles.d/kinglet.conf": 0o644,
                "/usr/lib/systemd/network/05-kinglet.network": 0o644}
        for p, mode in want.items():
            full = d + p
            if not os.path.exists(full):
                problem(f"do_install: {p} not installed")
            elif os.stat(full).st_mode & 0o7777 != mode:
                problem(f"do_install: {p} mode {oct(os.stat(full).st_mode & 0o7777)}, want {oct(mode)}")
        conffiles = " ".join(assignments(text).get("CONFFILES:${PN}", []))
        for c in [config, "/etc/cni/net.d/10-kinglet.conflist"]:
            if c.replace("/etc", "${sysconfdir}", 1) not in conffiles:
                problem(f"recipe: {c} is not a conffile")


def check_kernel_fragment():
    for cfg in glob.glob(os.path.join(LAYER, "recipes-kernel/linux/*/*.cfg")):
        for i, line in enumerate(open(cfg), 1):
            line = line.strip()
            if line and not line.startswith("#") and not re.fullmatch(r"CONFIG_[A-Z0-9_]+=[ym]", line):
                problem(f"{os.path.basename(cfg)}:{i}: not CONFIG_X=y|m: {line}")


def main():
    unknown = [a for a in sys.argv[1:] if a not in ARCHES]
    if unknown:
        print(f"meta-kinglet: unknown arch {unknown[0]} (x86_64, aarch64, armv7)", file=sys.stderr)
        return 2
    recipes = check_layer()
    for r in recipes:
        if r.endswith(".bb"):
            text, files = check_recipe(r)
            check_copies(files)
            check_install(text, files)
    check_kernel_fragment()
    for p in problems:
        print(f"meta-kinglet: {p}", file=sys.stderr)
    if problems:
        return 1
    print(f"meta-kinglet: layer.conf, {len(recipes)} recipe files, SRC_URI for {', '.join(CHECKED)}, "
          "do_install run, kernel fragment: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
