#!/usr/bin/env python3
"""The module graph of the kinglet crate (`src/`), file by file, and its
cycles. An edge a -> b: a file of module a names module b (`use` or a
path), outside its unit tests. A module naming its own ancestor is not an
edge (a submodule using its parent's items is one package, as the files of
a Go package are); a parent naming its child is.

    tests/lint/modgraph.py           fails (exit 1) on a cycle, naming it
    tests/lint/modgraph.py --dot     the graph, for Graphviz
    tests/lint/modgraph.py --under pods   only modules under `pods`
"""
import os
import re
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src")


def modules():
    mods = {}
    for dp, _, files in os.walk(ROOT):
        for f in files:
            if not f.endswith(".rs") or f == "main.rs":
                continue
            rel = os.path.relpath(os.path.join(dp, f), ROOT)[:-3].split(os.sep)
            if rel[-1] in ("mod", "lib"):
                rel = rel[:-1]
            if rel and rel[-1] == "tests":
                continue  # a #[cfg(test)] module of its own
            mods["::".join(rel)] = os.path.join(dp, f)
    return mods


def strip(s):
    """Rust source with comments gone and literals emptied (`""`, `' '`),
    so braces and paths inside them do not count."""
    out, i, n = [], 0, len(s)
    while i < n:
        c = s[i]
        if s.startswith("//", i):
            i = s.find("\n", i)
            i = n if i < 0 else i
        elif s.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if s.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif s.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif (m := re.match(r'b?r(#*)"', s[i:])) and (i == 0 or not (s[i - 1].isalnum() or s[i - 1] == "_")):
            end = '"' + m.group(1)
            i = s.find(end, i + m.end())
            i = n if i < 0 else i + len(end)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and s[i] != '"':
                i += 2 if s[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'" and (m := re.match(r"'(\\.[^']*|[^\\'])'", s[i:])):
            i += m.end()
            out.append("' '")
        else:
            out.append(c)
            i += 1
    return "".join(out)


def code(path):
    """The file without comments and its `#[cfg(test)]` items."""
    s = strip(open(path).read())
    out, i = [], 0
    for m in re.finditer(r"#\[cfg\(test\)\]\s*(?:pub(?:\([a-z]+\))?\s+)?(mod|fn|use)\b", s):
        if m.start() < i:
            continue
        out.append(s[i : m.start()])
        semi = re.match(r"\s*\w+\s*;", s[m.end():])
        if m.group(1) == "use" or (m.group(1) == "mod" and semi):
            # `use …;` and a module in a file of its own (`mod tests;`).
            i = s.index(";", m.end()) + 1
            continue
        depth, j = 0, s.index("{", m.end())
        while True:
            depth += {"{": 1, "}": -1}.get(s[j], 0)
            j += 1
            if depth == 0:
                break
        i = j
    out.append(s[i:])
    return "".join(out)


def expand(prefix, rest):
    """`a::{b, c::{d}}` -> [a::b, a::c::d]."""
    rest = rest.strip()
    if not rest.startswith("{"):
        return [prefix + rest]
    inner, depth, cur, parts = rest[1:-1], 0, "", []
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
            continue
        depth += {"{": 1, "}": -1}.get(ch, 0)
        cur += ch
    parts.append(cur)
    out = []
    for p in parts:
        p = p.strip()
        if not p:
            continue
        head, sep, tail = p.partition("::")
        if p.startswith("{"):
            out += expand(prefix, p)
        elif sep and tail.startswith("{"):
            out += expand(prefix + head + "::", tail)
        else:
            out.append(prefix + p.split(" as ")[0])
    return out


PATH = re.compile(r"\b((?:crate|super|self)(?:::(?:super|[A-Za-z_][A-Za-z0-9_]*))*)::(\{[^;]*?\}(?=\s*;)|[A-Za-z_][A-Za-z0-9_]*)")


def edges(mods):
    g = {m: set() for m in mods}
    for m, path in mods.items():
        me = m.split("::") if m else []
        for hit in PATH.finditer(code(path)):
            for full in expand(hit.group(1) + "::", hit.group(2)):
                parts = full.split("::")
                if parts[0] == "crate":
                    cur, parts = [], parts[1:]
                else:
                    cur = list(me)
                    if parts[0] == "self":
                        parts = parts[1:]
                    while parts and parts[0] == "super":
                        cur, parts = cur[:-1], parts[1:]
                target = None
                for k in range(len(parts), -1, -1):
                    cand = "::".join(cur + parts[:k])
                    if cand in mods:
                        target = cand
                        break
                if target is None or target == m:
                    continue
                if m.startswith(target + "::") or target == "":
                    continue  # its own ancestor
                g[m].add(target)
    return g


def cycles(g):
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def main():
    mods = modules()
    g = edges(mods)
    under = sys.argv[sys.argv.index("--under") + 1] if "--under" in sys.argv else ""
    keep = lambda m: not under or m == under or m.startswith(under + "::")
    if "--dot" in sys.argv:
        print("digraph kinglet {\n  rankdir=LR;")
        for a in sorted(g):
            for b in sorted(g[a]):
                if keep(a) and keep(b):
                    print(f'  "{a}" -> "{b}";')
        print("}")
        return 0
    found = cycles(g)
    for c in found:
        print("import cycle: " + " <-> ".join(c), file=sys.stderr)
    n_edges = sum(len(v) for v in g.values())
    print(f"module graph: {len(mods)} modules, {n_edges} edges, {len(found)} cycles")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
