"""Every C code block of README.md and docs/*.md compiles, and no Markdown link leaves the
repository (issue 22). The blocks of one file are compiled together, in order, as one translation
unit after `#include <tdist/tdist.h>` and `<tdist/testing.h>`: a block that starts with a top-level
construct (an #include, a function, TD_TEST, TD_MP_ENTRY) is pasted as it is; a block of statements
becomes the body of a function with `rank` and `world_size` in scope. A line holding only "..."
marks an elision and is dropped. TD_TEST_MAIN() blocks are compiled too (once per file).
    python3 tests/docs/check_snippets.py <repo-root> <c-compiler>"""
import os
import re
import subprocess
import sys
import tempfile

root, cc = sys.argv[1], sys.argv[2]
files = [os.path.join(root, "README.md")] + sorted(
    os.path.join(root, "docs", f) for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
toplevel = re.compile(r"^(#include|#define|static |int |void |td_status |TD_TEST|TD_MP_ENTRY|typedef |struct )")
failures = 0
for path in files:
    text = open(path, encoding="utf-8").read()
    rel = os.path.relpath(path, root)
    for m in re.finditer(r"\]\(([^)\s]+)\)", text):
        target = m.group(1).split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            if target.startswith(("http:", "https:", "file:")):
                print(f"{rel}: link leaves the repository: {m.group(1)}")
                failures += 1
            continue
        full = os.path.normpath(os.path.join(os.path.dirname(path), target))
        if not full.startswith(os.path.abspath(root)) and not full.startswith(root):
            print(f"{rel}: link leaves the repository: {m.group(1)}")
            failures += 1
        elif not os.path.exists(full):
            print(f"{rel}: link to a missing file: {m.group(1)}")
            failures += 1
    blocks = re.findall(r"```c\n(.*?)```", text, re.S)
    if not blocks:
        continue
    unit = ["#include <tdist/tdist.h>", "#include <tdist/testing.h>", "#include <stdio.h>",
            "#include <stdlib.h>", ""]
    for i, block in enumerate(blocks):
        lines = [l for l in block.splitlines() if l.strip() != "..."]
        first = next((l for l in lines if l.strip()), "")
        unit.append(f"#line 1 \"{rel} block {i + 1}\"")
        if toplevel.match(first):
            unit.extend(lines)
        else:
            unit.append(f"static void doc_snippet_{i}(int rank, int world_size)")
            unit.append("{")
            unit.append("    (void)rank; (void)world_size;")
            unit.extend(lines)
            unit.append("}")
    with tempfile.NamedTemporaryFile("w", suffix=".c", delete=False) as f:
        f.write("\n".join(unit) + "\n")
        src = f.name
    try:
        r = subprocess.run([cc, "-std=gnu11", "-fsyntax-only", "-Wall", "-Werror", "-Wno-unused-function",
                            "-Wno-unused-variable", "-Wno-unused-but-set-variable",
                            "-I", os.path.join(root, "include"), src], capture_output=True, text=True)
        if r.returncode != 0:
            print(f"{rel}: its C blocks do not compile:\n{r.stderr}")
            failures += 1
    finally:
        os.unlink(src)
if failures:
    print(f"{failures} problem(s)")
    sys.exit(1)
print(f"every C block in README.md and docs/ compiles; every link stays in the repository ({len(files)} files)")
