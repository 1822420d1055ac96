"""Build an arm: byte-compile its exported source, convert the model, read its native version string.

Steps (each a subprocess run from ``src/<arm>/`` with its output appended to the build log):

1. ``python -m compileall -q engine`` — a syntax error in a patched file fails here, not mid-run;
2. for a GGUF model, ``python -m engine convert <gguf> <dir>`` into the engine's fast-loading
   format. Conversions are cached by content: the key is the sha256 of (patched source tree, model
   file), so an unchanged source, patch set and model never convert again, whichever run label asks;
3. ``python -m engine --version`` — the native engine string recorded with every result.

An external arm (:func:`build_external_arm`) runs its build command instead, or, for a profile with
``build.cmake`` (llama-server), a CMake build of only the needed targets through ccache
(:mod:`pairbench.arms.cmake`), and then its version command.

A failing step raises :class:`BuildError` naming the step, its exit code and the log.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pairbench.arms.cmake import CMakeBuildError, cmake_build
from pairbench.core.artifacts import sha256_file
from pairbench.engines.profiles import arm_engine, load_profile, render


class BuildError(Exception):
    """A build step failed; the message names the arm, the step, its exit code and the log file."""


def _run(step: str, argv: list[str], cwd: Path, log: Path, arm: str) -> dict:
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=fh, text=True)
        fh.write(proc.stdout)
    step_rec = {"step": step, "argv": ["python", *argv[1:]] if argv[0] == sys.executable else argv,
                "exit_code": proc.returncode, "duration_s": time.perf_counter() - t0}
    if proc.returncode != 0:
        raise BuildError(f"arm {arm}: build step {step!r} exited with status {proc.returncode}; see {log}")
    step_rec["stdout"] = proc.stdout
    return step_rec


def converts_model(arm_cfg: dict) -> bool:
    """Whether the pipeline builds this arm itself (its profile's ``build.pipeline: embedded``:
    byte-compile and convert the model) rather than running a build command."""
    profile = load_profile(arm_engine(arm_cfg))
    return (profile.data.get("build") or {}).get("pipeline", "command") == "embedded"


def conversion_key(patched_tree_sha256: str, model_sha256: str) -> str:
    return hashlib.sha256(f"{patched_tree_sha256}:{model_sha256}".encode()).hexdigest()


def build_arm(arm: str, arm_dir: str | Path, source: dict, model: dict, cache_dir: str | Path,
              log: str | Path, source_sha256: str, root: str | Path) -> dict:
    """Build one arm; return the ``build`` artifact body.

    *source* is the arm's ``source`` artifact; *model* is ``config.resolve_model``'s answer.
    """
    arm_dir, cache_dir, log, root = Path(arm_dir), Path(cache_dir), Path(log), Path(root)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    t0 = time.perf_counter()
    py = sys.executable
    steps = [_run("byte_compile", [py, "-m", "compileall", "-q", "engine"], arm_dir, log, arm)]
    conversion = None
    if model["kind"] == "gguf":
        gguf = Path(model["path"])
        model_sha = sha256_file(gguf)
        key = conversion_key(source["patched"]["tree_sha256"], model_sha)
        out = cache_dir / key
        if (out / ".complete").is_file():
            cached = True
        else:
            cached = False
            # A folder of our own: builds of two arms (or two comparisons of a study) with the same
            # key may convert at once, and must not delete or rename each other's partial output.
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.partial-", dir=cache_dir))
            steps.append(_run("convert", [py, "-m", "engine", "convert", str(gguf.resolve()), str(tmp.resolve())],
                              arm_dir, log, arm))
            (tmp / ".complete").write_text(key + "\n")
            if (out / ".complete").is_file():
                shutil.rmtree(tmp)  # another build finished the same conversion first: keep its copy
            else:
                if out.exists():
                    shutil.rmtree(out)  # an incomplete leftover of a crashed build
                tmp.rename(out)
        try:
            rel = out.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            rel = str(out.resolve())
        conversion = {"key": key, "cached": cached, "model_sha256": model_sha, "path": rel}
        model_arg = str(out.resolve())
    else:
        model_arg = model["name"]
    version = _run("version", [py, "-m", "engine", "--version"], arm_dir, log, arm)
    native = version.pop("stdout").strip()
    for s in steps:
        s.pop("stdout", None)
    steps.append(version)
    if not native:
        raise BuildError(f"arm {arm}: `python -m engine --version` printed nothing; see {log}")
    return {
        "arm": arm,
        "native_version": native,
        "source_version": source["version"],
        "patched_tree_sha256": source["patched"]["tree_sha256"],
        "model": {"name": model["name"], "kind": model["kind"], "arg": model_arg if model["kind"] == "named" else None},
        "conversion": conversion,
        "steps": steps,
        "exit_code": 0,
        "duration_s": time.perf_counter() - t0,
        "python": sys.version.split()[0],
        "inputs": {"source": source_sha256},
    }


def model_arg(build: dict, root: str | Path) -> str:
    """What to pass as ``--model`` to this arm's server."""
    if build["conversion"] is not None:
        p = Path(build["conversion"]["path"])
        return str(p if p.is_absolute() else (Path(root) / p).resolve())
    if build["model"]["kind"] == "gguf" and build["model"]["arg"]:  # a non-embedded engine reads the GGUF
        p = Path(build["model"]["arg"])
        return str(p if p.is_absolute() else (Path(root) / p).resolve())
    return build["model"]["arg"]


def build_external_arm(arm: str, arm_cfg: dict, arm_dir: str | Path, source: dict, model: dict, log: str | Path,
                       source_sha256: str, root: str | Path) -> dict:
    """Build a non-embedded arm with its engine profile's (or the arm's) build command; the
    ``build`` artifact body. The server later reads the GGUF itself (no conversion)."""
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    t0 = time.perf_counter()
    out = build_external(arm, arm_cfg, arm_dir, log, commit=(source.get("git") or {}).get("commit"))
    path = Path(model["path"]).resolve() if model.get("path") else None
    try:
        rel = path.relative_to(Path(root).resolve()).as_posix() if path else None
    except ValueError:
        rel = str(path)
    return {
        "arm": arm,
        "native_version": out["native_version"] or "unknown",
        "source_version": source["version"],
        "patched_tree_sha256": source["patched"]["tree_sha256"],
        "model": {"name": model["name"], "kind": model["kind"], "arg": rel},
        "conversion": None,
        "steps": out["steps"],
        "exit_code": 0,
        "duration_s": time.perf_counter() - t0,
        "python": sys.version.split()[0],
        "engine": out["profile"],
        "toolchain": out["toolchain"],
        "inputs": {"source": source_sha256},
    }


def build_external(arm_name: str, arm: dict, arm_dir: str | os.PathLike, log: str | os.PathLike,
                   timeout_s: float | None = None, python: str = sys.executable, commit: str | None = None) -> dict:
    """Build a non-embedded arm in its exported tree, then run its version command. Returns
    ``{"steps": [...], "native_version": str|None, "profile": {...}, "toolchain": {...}|None}``.

    The arm's own ``build`` argv wins; else a profile with ``build.cmake`` is configured and compiled
    through ccache (:mod:`pairbench.arms.cmake`, which fills ``toolchain``); else the profile's
    ``build.command`` runs. *commit* (the exported tag's commit) fills ``{commit}`` (its first 7
    characters, ``unknown`` without one). Each step's output is appended to *log*; a failure raises
    :class:`BuildError` naming the arm and the step (and, for CMake, the first compiler error).
    """
    profile = load_profile(arm_engine(arm))
    arm_dir, log = Path(arm_dir).resolve(), Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    values = {"python": python, "src": str(arm_dir), "threads": arm.get("threads"), "port": None,
              "model": None, "ctx": None, "host": "127.0.0.1", "commit": commit[:7] if commit else "unknown"}
    bspec = profile.data.get("build") or {}
    own = "build" in arm and arm["build"] is not None
    build_t = arm["build"] if own else bspec.get("command")
    timeout_s = timeout_s or bspec.get("timeout_s") or 3600
    steps, native, toolchain = [], None, None

    def run(step: str, argv: list[str], optional: bool = False) -> str | None:
        t0 = time.perf_counter()
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            fh.flush()
            try:
                # stderr too is captured for the version step: llama.cpp's tools print --version there
                proc = subprocess.run(argv, cwd=arm_dir, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE if optional else fh, text=True, timeout=timeout_s)
            except FileNotFoundError as exc:
                if optional:  # e.g. `vllm --version` where only the server's /version can tell
                    fh.write(f"{exc.filename}: not found; the version is left unknown\n")
                    steps.append({"step": step, "argv": argv[:1], "exit_code": 127,
                                  "duration_s": time.perf_counter() - t0})
                    return None
                raise BuildError(f"arm {arm_name}: build step {step!r}: {exc.filename} not found") from None
            except subprocess.TimeoutExpired:
                raise BuildError(f"arm {arm_name}: build step {step!r} exceeded {timeout_s:g} s; see {log}") from None
            fh.write(proc.stdout)
            if optional:
                fh.write(proc.stderr)
        steps.append({"step": step, "argv": [os.path.basename(a) if os.path.isabs(a) else a for a in argv],
                      "exit_code": proc.returncode, "duration_s": time.perf_counter() - t0})
        if proc.returncode != 0 and optional:
            with open(log, "a") as fh:  # a version string is a record, not a gate: launch will tell
                fh.write(f"(exit status {proc.returncode}: the version is left unknown)\n")
            return None
        if proc.returncode != 0:
            raise BuildError(f"arm {arm_name}: build step {step!r} exited with status {proc.returncode}; see {log}")
        return proc.stdout if (proc.stdout or "").strip() or not optional else proc.stderr

    if not own and bspec.get("cmake"):
        spec = bspec["cmake"]
        flags = [str(f) for f in render(list(spec.get("flags") or []), values, "build.cmake.flags")]
        try:
            out = cmake_build(arm_name, spec, arm_dir, log, flags=flags, timeout_s=timeout_s)
        except CMakeBuildError as exc:
            raise BuildError(str(exc)) from None
        steps.extend(out["steps"])
        toolchain = out["toolchain"]
    elif build_t:
        run("build", [str(a) for a in render(list(build_t), values, f"arms.{arm_name}.build")])
    ver_t = (profile.data.get("version") or {}).get("command")
    if ver_t:
        out = run("version", [str(a) for a in render(list(ver_t), values, "version")], optional=True)
        native = (out or "").strip().splitlines()[0] if (out or "").strip() else None
    return {"steps": steps, "native_version": native, "profile": profile.summary(), "toolchain": toolchain}
