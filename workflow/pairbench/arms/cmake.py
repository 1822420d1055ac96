"""A CMake build of an external arm through ccache: configure, compile the needed targets, and
record what was built with what.

An engine profile whose ``build`` has a ``cmake`` section (llama-server) is built by
:func:`cmake_build` in the arm's exported tree:

1. **configure**: ``cmake -S . -B <build_dir> <flags> -DCMAKE_{C,CXX}_COMPILER_LAUNCHER=ccache``;
2. **compile**: ``cmake --build <build_dir> --target <targets...> -j <jobs>``: only the targets the
   run needs (``llama-server``, and ``llama-bench`` for the cross-check), never the whole project.

Through ccache, with its cache in the user's cache (``~/.cache/pairbench/ccache``, or
``$CCACHE_DIR`` if set) and ``CCACHE_BASEDIR`` = the arm's tree, so compile commands name sources
by relative paths and the baseline's objects serve the candidate's identical files: the candidate
recompiles only what its patches touch (and the few sources CMake generates with absolute paths,
such as llama.cpp's unity files), and a rerun recompiles nothing. Each build's own hits and misses
come from a per-build ``CCACHE_STATSLOG``, so concurrent builds never mix their counts.

``GIT_CEILING_DIRECTORIES`` stops CMake's ``git rev-parse`` at the tree: the export has no ``.git``,
and without the ceiling git would find the enclosing pairbench checkout and stamp *its* commit into
the engine's version string.

The record (``build/<arm>.json`` → ``toolchain``) names the generator, CMake's version, the C and
C++ compiler ids and ``--version`` lines, the exact flags and targets, and the ccache counts. A
failed step raises :class:`CMakeBuildError` whose message names the arm and quotes the first
compiler (or CMake) error with the tree's absolute path removed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from pairbench.core.cache import user_cache
from pairbench.core.steps import StepError, run_step

LAUNCHERS = ("-DCMAKE_C_COMPILER_LAUNCHER=ccache", "-DCMAKE_CXX_COMPILER_LAUNCHER=ccache")

# gcc/clang diagnostics: "path:line:col: error: ..." (or "fatal error:"); then CMake's own; then a
# linker's "undefined reference"; else the first line that says error at all.
_ERROR_PATTERNS = (
    re.compile(r"^\S+?:\d+(?::\d+)?: (?:fatal )?error: .*$", re.M),
    re.compile(r"^CMake Error.*$", re.M),
    re.compile(r"^.*undefined reference to .*$", re.M),
    re.compile(r"^.*\berror\b.*$", re.M | re.I),
)


class CMakeBuildError(Exception):
    """A configure or compile step failed, or the toolchain is missing. Names the arm and the error."""


def ccache_env(tree: Path, stats_log: Path) -> dict:
    """The environment additions that route one build through the shared compiler cache."""
    return {
        "CCACHE_DIR": os.environ.get("CCACHE_DIR") or str(user_cache() / "ccache"),
        "CCACHE_BASEDIR": str(tree),
        "CCACHE_NOHASHDIR": "1",  # -g builds too: the build folder's path is not part of the key
        "CCACHE_STATSLOG": str(stats_log),
        "GIT_CEILING_DIRECTORIES": str(tree.parent),
    }


def parse_stats_log(text: str) -> dict:
    """Counts from a ccache stats log (``# <source>`` then one counter id per line, per compile)."""
    calls: list[set[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("# "):
            calls.append(set())
        elif line and calls:
            calls[-1].add(line)
    direct = sum(1 for c in calls if "direct_cache_hit" in c)
    pre = sum(1 for c in calls if "preprocessed_cache_hit" in c and "direct_cache_hit" not in c)
    misses = sum(1 for c in calls if "cache_miss" in c)
    cacheable = direct + pre + misses
    return {"calls": len(calls), "hits": direct + pre, "direct_hits": direct, "preprocessed_hits": pre,
            "misses": misses, "uncacheable": len(calls) - cacheable,
            "hit_rate": round((direct + pre) / cacheable, 4) if cacheable else None}


def first_error(text: str, tree: Path | None = None) -> str | None:
    """The first compiler/CMake/linker error in *text* (and, for a compiler's, the source line and
    caret after it), its path relative to the tree."""
    if tree is not None:
        text = text.replace(str(tree) + os.sep, "")
    for pat in _ERROR_PATTERNS:
        m = pat.search(text)
        if m:
            tail = text[m.end():].lstrip("\n").splitlines()[:2]
            if pat is _ERROR_PATTERNS[0]:  # keep gcc's source line and caret, not the next diagnostic
                tail = [t for t in tail if not re.match(r"^\S+?:\d+", t) and "***" not in t]
            else:
                tail = []
            # ccache hands the compiler paths relative to the build folder (CCACHE_BASEDIR), which
            # climb to the tree's root first: "../../../ggml/src/x.c" is the tree's ggml/src/x.c
            head = re.sub(r"^(?:\.\./)+", "", m.group(0).rstrip())
            return "\n".join([head, *[t.rstrip() for t in tail]])
    return None


def _compiler_facts(build_dir: Path, lang: str, env: dict) -> dict | None:
    """``{"id", "version", "name", "version_line"}`` of the C or CXX compiler CMake chose."""
    files = sorted(build_dir.glob(f"CMakeFiles/*/CMake{lang}Compiler.cmake"))
    if not files:
        return None
    text = files[-1].read_text(errors="replace")

    def val(key: str) -> str | None:
        m = re.search(rf'^set\(CMAKE_{lang}_{key} "([^"]*)"\)', text, re.M)
        return m.group(1) if m else None

    path = val("COMPILER") or ""
    line = _version_line([path, "--version"], env) if path else None
    return {"id": val("COMPILER_ID") or "unknown", "version": val("COMPILER_VERSION") or "unknown",
            "name": os.path.basename(path) or "unknown", "version_line": line}


def _version_line(argv: list[str], env: dict | None = None) -> str | None:
    """The first line *argv* prints (a tool's ``--version``): a fact recorded, not a step; None if it cannot run."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30, env=env)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (out.stdout.strip().splitlines() or [None])[0]


def cmake_build(arm: str, spec: dict, tree: str | os.PathLike, log: str | os.PathLike, *, flags: list[str],
                timeout_s: float) -> dict:
    """Configure and compile *tree* per the profile's ``build.cmake`` *spec* (``targets``, ``jobs``,
    ``build_dir``, ``compiler_cache``) with the rendered *flags*. Returns ``{"steps", "toolchain"}``.
    Output goes to *log*; the ccache stats log sits beside it (``<log>.ccache``)."""
    tree, log = Path(tree).resolve(), Path(log).resolve()  # ccache runs in the build's subfolders
    if shutil.which("cmake") is None:
        raise CMakeBuildError(f"arm {arm}: cmake is not installed (Debian: apt-get install cmake g++, "
                              "or ./install.sh --llama-cpp)")
    use_ccache = spec.get("compiler_cache", "ccache") == "ccache"
    stats_log = log.with_name(log.name + ".ccache")
    stats_log.unlink(missing_ok=True)
    env = dict(os.environ)
    if use_ccache:
        if shutil.which("ccache") is None:
            raise CMakeBuildError(
                f"arm {arm}: this engine is built through ccache, which is not installed "
                "(Debian: apt-get install ccache, or ./install.sh --llama-cpp)")
        env.update(ccache_env(tree, stats_log))
        Path(env["CCACHE_DIR"]).mkdir(parents=True, exist_ok=True)
    build_dir = spec.get("build_dir", "build")
    all_flags = list(flags) + (list(LAUNCHERS) if use_ccache else [])
    targets = list(spec["targets"])
    jobs = int(spec.get("jobs", 2))
    steps = []

    def run(step: str, argv: list[str]) -> None:
        try:
            steps.append(run_step(step, argv, cwd=tree, log=log, env=env, timeout_s=timeout_s,
                                  subject=f"arm {arm}: build step {step!r}", diagnose=diagnose).record)
        except StepError as exc:
            raise CMakeBuildError(str(exc)) from None

    def diagnose(output: str) -> str:
        err = first_error(output, tree)
        return "first error:\n  " + err.replace("\n", "\n  ") if err else "no error line found"

    run("configure", ["cmake", "-S", ".", "-B", build_dir, *all_flags])
    run("compile", ["cmake", "--build", build_dir, "--target", *targets, "-j", str(jobs)])
    ccache = None
    if use_ccache:
        stats = parse_stats_log(stats_log.read_text() if stats_log.is_file() else "")
        ccache = {"version": _version_line(["ccache", "--version"]) or "unknown", **stats}
    bdir = tree / build_dir
    cache_txt = (bdir / "CMakeCache.txt").read_text(errors="replace") if (bdir / "CMakeCache.txt").is_file() else ""
    gen = re.search(r"^CMAKE_GENERATOR:INTERNAL=(.*)$", cache_txt, re.M)
    toolchain = {
        "generator": gen.group(1) if gen else "unknown",
        "cmake": _version_line(["cmake", "--version"]) or "unknown",
        "c_compiler": _compiler_facts(bdir, "C", env),
        "cxx_compiler": _compiler_facts(bdir, "CXX", env),
        "flags": all_flags,
        "targets": targets,
        "jobs": jobs,
        "build_dir": build_dir,
        "ccache": ccache,
    }
    return {"steps": steps, "toolchain": toolchain}
