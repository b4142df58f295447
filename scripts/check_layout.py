#!/usr/bin/env python3
"""Checks the source layout rules of docs/development.md:

1. The top-level folders include each other without a cycle (tests/, fuzz/, bench/ and examples/
   may include anything). Prints, for each folder, the folders it includes.
2. Inside each folder, its subfolders and the files directly in it include each other without a
   cycle (a subfolder is one node, each file at the folder's top is one): a subfolder may use the
   folder's interfaces and the folder's files may use the subfolders, but not round a loop.
3. No function outside tests and generated tables is longer than 150 lines: C and C++ measured
   by lizard (https://github.com/terryyin/lizard, installed by scripts/setup.sh), textual
   includes (.inc) measured as C++; Python (def and async def, methods and nested functions
   included) measured by the standard ast module, from the def line to the end of the body.
4. No C, C++ or Python file outside tests and generated tables is longer than 800 lines, except
   those OVERSIZED lists, each held at its length there until it is split (and then taken off
   the list).

Exit status 1 names every violation.
"""
import ast
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXEMPT_TOP = {"tests", "fuzz", "bench", "examples"}
GENERATED = {"lib/unicode/unicode_tables.cc"}
MAX_FUNCTION_LINES = 150
MAX_FILE_LINES = 800
# Files over MAX_FILE_LINES, none allowed to grow (none at present).
OVERSIZED: dict[str, int] = {}


def sources():
    files = subprocess.check_output(["git", "ls-files"], cwd=ROOT, text=True).split()
    return [f for f in files if re.search(r"\.(cc|h|cu|cuh|inc)$", f) and "/" in f]


def python_sources():
    """The tracked Python files outside the exempt folders."""
    files = subprocess.check_output(["git", "ls-files", "*.py"], cwd=ROOT, text=True).splitlines()
    return [f for f in files if f.split("/")[0] not in EXEMPT_TOP]


def includes(files):
    """{file: the quoted includes of it} for every file outside the exempt folders."""
    out = {}
    for f in files:
        if f.split("/")[0] in EXEMPT_TOP:
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            out[f] = [m.group(1) for line in fh
                      if (m := re.match(r'\s*#\s*include\s+"([^"]+)"', line))]
    return out


def folder_graph(files, incs):
    tops = {f.split("/")[0] for f in files}
    graph = collections.defaultdict(set)
    for f, included in incs.items():
        top = f.split("/")[0]
        for inc in included:
            other = inc.split("/")[0]
            if "/" in inc and other in tops and other != top:
                graph[top].add(other)
    return graph


def in_folder_graphs(incs):
    """{top: {node: nodes it includes}}, a node being "top/sub/" or a file at the top level."""
    def node(path):
        parts = path.split("/")
        return f"{parts[0]}/{parts[1]}/" if len(parts) > 2 else path

    graphs = collections.defaultdict(lambda: collections.defaultdict(set))
    for f, included in incs.items():
        top = f.split("/")[0]
        for inc in included:
            if inc.split("/")[0] == top and node(inc) != node(f):
                graphs[top][node(f)].add(node(inc))
    return graphs


def find_cycle(graph):
    state = {}
    stack = []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def long_functions(files):
    try:
        import lizard
    except ImportError:
        sys.exit("check_layout: lizard is not installed (bash scripts/setup.sh installs it)")
    out = []
    for f in files:
        if f.split("/")[0] in EXEMPT_TOP or f in GENERATED:
            continue
        path = os.path.join(ROOT, f)
        if f.endswith(".inc"):  # lizard knows the language by the name
            with open(path, errors="replace") as fh:
                info = lizard.analyze_file.analyze_source_code(f + ".cc", fh.read())
        else:
            info = lizard.analyze_file(path)
        for fn in info.function_list:
            if fn.length > MAX_FUNCTION_LINES:
                out.append(f"{f}:{fn.start_line}: {fn.name} is {fn.length} lines")
    return out


def long_python_functions(files):
    out = []
    for f in files:
        if f in GENERATED:
            continue
        with open(os.path.join(ROOT, f), encoding="utf-8", errors="replace") as fh:
            try:
                tree = ast.parse(fh.read(), f)
            except SyntaxError as e:
                sys.exit(f"check_layout: {f} is not valid Python: {e}")
        functions = [n for n in ast.walk(tree)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for fn in sorted(functions, key=lambda n: n.lineno):
            length = fn.end_lineno - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                out.append(f"{f}:{fn.lineno}: {fn.name} is {length} lines")
    return out


def long_files(files):
    out = []
    for f in files:
        if f.split("/")[0] in EXEMPT_TOP or f in GENERATED:
            continue
        with open(os.path.join(ROOT, f), errors="replace") as fh:
            n = sum(1 for _ in fh)
        limit = OVERSIZED.get(f, MAX_FILE_LINES)
        if n > limit:
            out.append(f"{f} is {n} lines (at most {limit})")
        elif f in OVERSIZED and n <= MAX_FILE_LINES:
            out.append(f"{f} is {n} lines now: take it off OVERSIZED")
    for f in sorted(set(OVERSIZED) - set(files)):
        out.append(f"{f} is listed in OVERSIZED but is not in the repository")
    return out


def main():
    files = sources()
    incs = includes(files)
    graph = folder_graph(files, incs)
    for top in sorted(graph):
        print(f"{top} -> {' '.join(sorted(graph[top]))}")
    errors = []
    cycle = find_cycle(graph)
    if cycle:
        errors.append("folder cycle: " + " -> ".join(cycle))
    for top, inner in sorted(in_folder_graphs(incs).items()):
        cycle = find_cycle(inner)
        if cycle:
            errors.append(f"cycle inside {top}/: " + " -> ".join(cycle))
    python = python_sources()
    errors += [f"longer than {MAX_FUNCTION_LINES} lines: {e}"
               for e in long_functions(files) + long_python_functions(python)]
    errors += [f"too long: {e}" for e in long_files(files + python)]
    for e in errors:
        print(f"check_layout: {e}", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
