"""Imports flow one way, function-level imports included (shared/DESIGN.md, workflow/pairbench/README.md).

Every ``pairbench.X`` import in ``workflow/pairbench`` (read with ``ast``: module level, inside
functions, under ``if TYPE_CHECKING``) stays in its own package or goes to a lower layer. The layers,
lowest first: ``core``; ``arms`` and ``engines``, side by side (both stand on core and neither imports
the other: a stage hands a build its recipe); ``measure``; ``validate``; ``analysis``; ``publish``;
``integrity``; ``stages`` (the rule layer); ``study`` (above one run); ``__main__`` (the commands).
"""

import ast
import re
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "workflow" / "pairbench"

LAYERS = [("core",), ("arms", "engines"), ("measure",), ("validate",), ("analysis",), ("publish",), ("integrity",),
          ("stages",), ("study",), ("__main__",)]
RANK = {pkg: i for i, layer in enumerate(LAYERS) for pkg in layer}

# Back-arrows outside the engines and arms layer, reported to the lead (issue 22). Each must still
# exist, so that fixing one fails here until its line is removed.
KNOWN_BACK_ARROWS: set = set()
KNOWN_CYCLES: set = set()


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        parts = ("pairbench", *path.relative_to(PKG).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(module: str, path: Path, known: dict) -> list[tuple[str, int]]:
    """``(imported pairbench module, line)`` for every import in *path*, at any depth."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level-1 packages
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:  # `from pkg import submodule` imports the submodule
                sub = f"{base}.{a.name}"
                found.append((sub if sub in known else base, node.lineno))
    return [(name, line) for name, line in found if name == "pairbench" or name.startswith("pairbench.")]


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None  # None: the root package (its __version__ only)


def graph() -> dict[str, list[tuple[str, int]]]:
    known = modules()
    return {m: [(n, line) for n, line in imports(m, p, known) if n in known] for m, p in known.items()}


def test_every_package_has_a_layer():
    assert {layer(m) for m in modules()} - {None} == set(RANK)


def test_imports_flow_down_the_layers_function_level_included():
    back = set()
    where = {}
    for module, targets in graph().items():
        for target, line in targets:
            src, dst = layer(module), layer(target)
            if dst is None or src == dst or (src is not None and RANK[dst] < RANK[src]):
                continue
            back.add((module, target))
            where[(module, target)] = f"{module} (line {line}) imports {target}: {src} may not import {dst}"
    assert sorted(where[e] for e in back - KNOWN_BACK_ARROWS) == []
    assert sorted(KNOWN_BACK_ARROWS - back) == [], "fixed: remove these from KNOWN_BACK_ARROWS"


def test_no_import_cycle_between_modules():
    edges = {m: {t for t, _ in ts if t != m and not m.startswith(t + ".")} for m, ts in graph().items()}
    index, low, stack, cycles = {}, {}, [], set()

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.add(frozenset(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    assert sorted(map(sorted, cycles - KNOWN_CYCLES)) == []
    assert sorted(map(sorted, KNOWN_CYCLES - cycles)) == [], "fixed: remove these from KNOWN_CYCLES"


@pytest.mark.parametrize("pattern", [r"\bprofile\.data\b",
                                     r"\.data\[\"(tokenize|tokens|cold_cache|build|version|crosscheck|request)"])
def test_the_raw_profile_is_read_only_inside_engines(pattern):
    leaks = [f"{p.relative_to(PKG)}:{i}" for p in PKG.rglob("*.py") if p.relative_to(PKG).parts[0] != "engines"
             for i, line in enumerate(p.read_text().splitlines(), 1) if re.search(pattern, line)]
    assert leaks == []


# Issue 34's size rules: no function over 100 lines; no stage function with more than 8 parameters
# (a stage takes a Layout and a typed options object instead).


def functions():
    for path in sorted(PKG.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
                yield str(path.relative_to(PKG)), node, n


def test_no_function_is_over_100_lines_and_no_stage_takes_more_than_8_parameters():
    long = [f"{p}:{f.lineno} {f.name} ({f.end_lineno - f.lineno + 1} lines)" for p, f, _ in functions()
            if f.end_lineno - f.lineno + 1 > 100]
    wide = [f"{p}:{f.lineno} {f.name} ({n} parameters)" for p, f, n in functions()
            if p.startswith("stages/") and n > 8]
    assert long == [] and wide == []
