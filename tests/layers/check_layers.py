#!/usr/bin/env python3
"""The layering that docs/architecture.md states, checked on the built objects.

Reads every object file of the library (nm) and checks, at the level of functions and data that one
file needs and another defines:
  - src/transport needs nothing defined in src/pg, src/coll or src/backends (collectives and
    backends use transports, never the reverse);
  - src/coll needs nothing defined in src/backends (its group completes operations through the
    backend contract, td_work_done, like any backend);
  - within src/coll, within src/pg, within src/transport: no circle of files (A needs B and B,
    directly or through others of the same folder, needs A).
Also reads the sources: no file of src/transport includes a header of src/pg, src/coll,
src/backends or tdist/pg.h, tdist/backend.h.
Prints each violation and exits 1 if there is one.

    python3 tests/layers/check_layers.py OBJECTS SOURCE_DIR
OBJECTS: the library's object folder (build/plain/src/CMakeFiles/tdist_objects.dir), or its object
files joined by ':' (what CTest passes); SOURCE_DIR: the repository's src/.
"""
import os
import re
import subprocess
import sys

objdir, srcdir = sys.argv[1], sys.argv[2]
if os.path.isdir(objdir):
    paths = [os.path.join(r, n) for r, _, names in os.walk(objdir) for n in names]
else:
    paths = objdir.split(":")
files = {}  # "transport/tcp.c" -> (defined set, undefined set)
for path in paths:
    if not path.endswith(".c.o") or "tdist_objects.dir/" not in path:
        continue
    rel = path.split("tdist_objects.dir/", 1)[1][: -len(".o")]
    out = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        f = line.split()
        if len(f) == 2 and f[0] == "U":
            undefined.add(f[1])
        elif len(f) == 3 and f[1] in "TDRBVWGS":
            defined.add(f[2])
    files[rel] = (defined, undefined)
if not any(k.startswith("transport/") for k in files):
    sys.exit("check_layers: no objects of src/transport under %s" % objdir)

owner = {}
for rel, (defined, _) in files.items():
    for s in defined:
        owner.setdefault(s, rel)

def folder(rel):
    parts = rel.split("/")
    return parts[0] if len(parts) > 1 else ""

def needs(rel):
    """The files rel needs, with the symbols of each."""
    out = {}
    for s in files[rel][1]:
        o = owner.get(s)
        if o and o != rel:
            out.setdefault(o, []).append(s)
    return out

need = {rel: needs(rel) for rel in files}
bad = []
forbidden = {"transport": ("pg", "coll", "backends"), "coll": ("backends",)}
for rel in sorted(files):
    below = forbidden.get(folder(rel), ())
    for o, syms in sorted(need[rel].items()):
        if folder(o) in below:
            bad.append("src/%s needs src/%s (%s): %s may not use %s" % (rel, o, ", ".join(sorted(syms)[:3]), folder(rel),
                                                                       folder(o)))

for group in ("coll", "pg", "transport"):
    members = sorted(r for r in files if folder(r) == group)
    edges = {r: {o for o in need[r] if folder(o) == group} for r in members}
    reported = set()
    for start in members:  # a circle: a path from a file back to itself; each set of files once
        seen, stack = set(), [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in sorted(edges[node]):
                if nxt == start and frozenset(path) not in reported:
                    reported.add(frozenset(path))
                    bad.append("a circle in src/%s: %s" % (group, " -> ".join(path + [start])))
                elif nxt != start and nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, path + [nxt]))

inc = re.compile(r'#\s*include\s*[<"]([^>"]+)[>"]')
for name in sorted(os.listdir(os.path.join(srcdir, "transport"))):
    if not name.endswith((".c", ".h")):
        continue
    for n, line in enumerate(open(os.path.join(srcdir, "transport", name)), 1):
        m = inc.search(line)
        if m and (m.group(1).split("/")[0] in ("pg", "coll", "backends") or m.group(1) in ("tdist/pg.h", "tdist/backend.h")):
            bad.append("src/transport/%s:%d includes %s" % (name, n, m.group(1)))

for b in bad:
    print(b)
print("check_layers: %d object files, %d violations" % (len(files), len(bad)))
sys.exit(1 if bad else 0)
