"""Build an arm in its exported tree, and read its native version string: one path for every engine.

What is run comes from the arm's engine profile, rendered for the arm
(:meth:`pairbench.engines.profiles.EngineProfile.build_recipe`; the stage hands it over, so this
module never reads a profile). Each step is a subprocess run from ``src/<arm>/`` by the one step
runner (:func:`pairbench.core.steps.run_step`), its output appended to the build log, in order:

1. the build: the arm's own ``build`` argv or the profile's command (the embedded engine's is
   ``python -m compileall -q engine``, so a syntax error in a patched file fails here, not mid-run),
   or the profile's CMake build of only the needed targets through ccache
   (:mod:`pairbench.arms.cmake`), or a Python engine's install into the arm's own environment
   (:mod:`pairbench.arms.pyenv`), or nothing (an engine installed beside pairbench);
2. with a conversion command (the embedded engine's ``python -m engine convert``) and a GGUF model,
   the model converted into the engine's fast-loading format, which the server is then handed.
   Conversions are cached by content: the key is the sha256 of (patched source tree, model file),
   so an unchanged source, patch set and model never convert again, whichever run label asks; two
   builds of one key take turns on its lock file, so neither removes what the other made;
3. the version command: its first line is the native engine string recorded with every result
   (``unknown`` where it fails, unless the profile requires it);
4. with a fast-paths check (the embedded engine's ``python -m engine fastpaths``, the profile's
   ``fast_paths.check``), which native fast paths the arm's code permits, recorded as ``fast_paths``
   (:mod:`pairbench.engines.fastpaths` launches every arm with what any arm's code turned off); an
   older tree without the check records null and says so in the log;
5. the tree check: what the build added to the arm's tree is named (``tree_outputs``: a CMake
   build folder, the arm's environment, generated files), and the tree without it must still hash
   to the patched source: a build that changed the source it claims to build fails.

A failing step raises :class:`BuildError` naming the arm, the step, its exit code and the log.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from pairbench.arms.cmake import CMakeBuildError, cmake_build
from pairbench.arms.pyenv import InstallError, install
from pairbench.core.artifacts import fsync_dir, sha256_file
from pairbench.core.steps import StepError, run_step
from pairbench.core.trees import build_outputs, manifest, tree_sha256


class BuildError(Exception):
    """A build step failed; the message names the arm, the step, its exit code and the log file."""


def conversion_key(patched_tree_sha256: str, model_sha256: str) -> str:
    return hashlib.sha256(f"{patched_tree_sha256}:{model_sha256}".encode()).hexdigest()


def _rel(path: Path, root: Path, *, link: bool = False) -> str:
    """*path* relative to the repository root where it lies inside it (artifacts name no machine
    paths). With *link*, a last component that is a symbolic link is kept as named (an environment's
    ``bin/python``, a link to the base interpreter)."""
    path = path.parent.resolve() / path.name if link else path.resolve()
    try:
        return path.relative_to(root.resolve()).as_posix()
    except ValueError:
        return str(path)


@contextlib.contextmanager
def _locked(path: Path):
    """Hold an exclusive ``flock`` on *path* (made if missing) for the block; the kernel releases it
    if this process dies, so a crashed build never leaves the key locked."""
    with open(path, "a") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _convert(arm: str, argv: list[str], gguf: Path, source: dict, *, arm_dir: Path, cache_dir: Path, log: Path,
             timeout_s: float, root: Path) -> tuple[dict, dict | None]:
    """``(conversion record, step record or None when cached)``: *gguf* converted once per
    (patched tree, model) into ``<cache_dir>/<key>/`` by ``argv + [gguf, out]``.

    Builds of two arms (or two comparisons of a study, or two runs) with the same key take turns on
    the key's lock file (``.<key>.lock``): the first converts, the others wait and find it done. So
    no build deletes or renames a folder another is writing or serving from; a leftover without
    ``.complete`` (a crashed conversion) is moved aside and removed under the lock, and the finished
    folder is renamed into place and the rename synced to disk."""
    model_sha = sha256_file(gguf)
    key = conversion_key(source["patched"]["tree_sha256"], model_sha)
    out = cache_dir / key
    step = None
    cache_dir.mkdir(parents=True, exist_ok=True)
    with _locked(cache_dir / f".{key}.lock"):
        cached = (out / ".complete").is_file()
        if not cached:
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}.partial-", dir=cache_dir))
            try:
                step = _step(arm, "convert", [*argv, str(gguf.resolve()), str(tmp.resolve())], arm_dir, log,
                             timeout_s).record
                (tmp / ".complete").write_text(key + "\n")
                if out.exists():  # an incomplete leftover of a crashed build: nobody can be using it
                    stale = Path(tempfile.mkdtemp(prefix=f".{key}.stale-", dir=cache_dir))
                    os.replace(out, stale / key)
                    shutil.rmtree(stale)
                os.replace(tmp, out)
                fsync_dir(cache_dir)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)  # a failed conversion's partial output
    return {"key": key, "cached": cached, "model_sha256": model_sha, "path": _rel(out, root)}, step


def _step(arm: str, step: str, argv, cwd: Path, log: Path, timeout_s: float):
    try:
        return run_step(step, list(argv), cwd=cwd, log=log, timeout_s=timeout_s,
                        subject=f"arm {arm}: build step {step!r}")
    except StepError as exc:
        raise BuildError(str(exc)) from None


def _version(arm: str, recipe, arm_dir: Path, log: Path) -> tuple[str | None, dict | None]:
    """``(native version or None, step record)``: the first line the version command prints (on
    stdout, else stderr: llama.cpp's tools print ``--version`` there). Unless the profile requires
    it, a missing program or a failure leaves the version unknown: launch will tell."""
    if not recipe.version:
        return None, None
    subject = f"arm {arm}: build step 'version'"
    # an installed arm's version is read where no copy of its module lies: `python -c "import x"` in
    # the tree would import the tree's uncompiled copy instead of what the environment runs
    cwd = Path(recipe.install.env_dir) if recipe.install is not None else arm_dir
    try:
        res = run_step("version", list(recipe.version), cwd=cwd, log=log, timeout_s=recipe.timeout_s,
                       capture="both", check=recipe.version_required, subject=subject)
    except StepError as exc:
        if recipe.version_required or exc.reason != "not_found":
            raise BuildError(str(exc)) from None
        with open(log, "a") as fh:  # e.g. `vllm --version` where only the server's /version can tell
            fh.write("(the version is left unknown)\n")
        return None, {**exc.record, "argv": exc.record["argv"][:1]}
    lines = (res.stdout.strip() or res.stderr.strip()).splitlines()
    native = lines[0].strip() if lines and res.exit_code == 0 else None
    if native is None:
        if recipe.version_required:
            raise BuildError(f"{subject}: `{' '.join(res.record['argv'])}` printed nothing; see {log}")
        with open(log, "a") as fh:  # a version string is a record, not a gate
            fh.write(f"(exit status {res.exit_code}: the version is left unknown)\n")
    return native, res.record


def _fast_paths(arm: str, recipe, arm_dir: Path, log: Path) -> tuple[dict | None, dict | None]:
    """``(the check's JSON or None, step record)``: which native fast paths the arm's code permits
    (``{fast path: {matches, differs, error, objects}}``). A tree whose engine has no such check (an
    older tag) leaves it None, said in the log: its fast paths cannot be judged, and run as it decides."""
    if not recipe.fast_paths:
        return None, None
    res = run_step("fast_paths", list(recipe.fast_paths), cwd=arm_dir, log=log, timeout_s=recipe.timeout_s,
                   capture="stdout", check=False, subject=f"arm {arm}: build step 'fast_paths'")
    try:
        found = json.loads(res.stdout) if res.exit_code == 0 else None
    except ValueError:
        found = None
    keys = {"matches", "differs", "error", "objects"}
    if not (isinstance(found, dict) and all(isinstance(v, dict) and set(v) == keys for v in found.values())):
        with open(log, "a") as fh:
            fh.write(f"(exit status {res.exit_code}: no fast-paths check in this tree; its fast paths are left "
                     "unjudged)\n")
        return None, res.record
    return found, res.record


def _check_tree(arm: str, tree: Path, source: dict, log: Path) -> tuple[list[str], str]:
    """``(what the build added to *tree*, the tree's sha256 without it)``; the hash must be the
    patched source's (*source*: the arm's ``source`` artifact), else :class:`BuildError` names the
    files the build changed."""
    pristine = source["pristine"]["manifest"]
    changed = set(source["patched"]["changed"])
    outputs = build_outputs(tree, set(pristine) | changed)
    now = manifest(tree, outputs)
    sha = tree_sha256(now)
    if sha != source["patched"]["tree_sha256"]:
        culprits = sorted(p for p in set(now) | set(pristine) if p not in changed and now.get(p) != pristine.get(p))
        named = ", ".join(culprits) or f"one of the patched files ({', '.join(sorted(changed))})"
        raise BuildError(f"arm {arm}: the build changed the source it builds ({named} in {tree}); a build may add "
                         f"files to its tree, never change the exported ones; see {log}")
    return outputs, sha


def _environment(installed, tree_sha: str, recipe, root: Path) -> dict:
    """The ``environment`` record of an installed arm: where it is, what it runs, from which tree."""
    return {"kind": "venv", "path": _rel(installed.env_dir, root), "python": _rel(installed.python, root, link=True),
            "python_version": installed.python_version, "system_site_packages": recipe.system_site_packages,
            "package": recipe.package, "version": installed.version, "module": recipe.module,
            "imports_from": installed.imports_from, "module_path": installed.module_path, "tree_sha256": tree_sha}


def build_arm(arm: str, arm_dir: str | Path, recipe, *, source: dict, model: dict, cache_dir: str | Path,
              log: str | Path, source_sha256: str, root: str | Path) -> dict:
    """Build one arm by its *recipe* (a :class:`pairbench.engines.profiles.BuildRecipe`); return
    the ``build`` artifact body (without ``inputs.plan``).

    *source* is the arm's ``source`` artifact; *model* is ``pairbench.core.models.resolve_model``'s answer;
    *cache_dir* holds model conversions. The recorded ``model.arg`` is what the server is handed
    unless the model was converted (then None: ``conversion.path`` is): a named model's name, or
    the GGUF file's or Hugging Face directory's path relative to *root*. ``environment`` records an
    installed arm's environment (else None), ``tree_outputs`` what the build added to the tree.
    """
    arm_dir, cache_dir, log, root = Path(arm_dir), Path(cache_dir), Path(log), Path(root)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("")
    t0 = time.perf_counter()
    steps, toolchain, installed = [], None, None
    if recipe.command:
        steps.append(_step(arm, recipe.command_step, recipe.command, arm_dir, log, recipe.timeout_s).record)
    elif recipe.install:
        try:
            installed = install(arm, recipe.install, arm_dir, log=log, timeout_s=recipe.timeout_s)
        except InstallError as exc:
            raise BuildError(str(exc)) from None
        steps.extend(installed.steps)
    elif recipe.cmake:
        try:
            out = cmake_build(arm, recipe.cmake, arm_dir, log, flags=recipe.cmake["flags"], timeout_s=recipe.timeout_s)
        except CMakeBuildError as exc:
            raise BuildError(str(exc)) from None
        steps.extend(out["steps"])
        toolchain = out["toolchain"]
    conversion = None
    if recipe.convert and model["kind"] == "gguf":
        conversion, step = _convert(arm, list(recipe.convert), Path(model["path"]), source, arm_dir=arm_dir,
                                    cache_dir=cache_dir, log=log, timeout_s=recipe.timeout_s, root=root)
        steps += [step] if step else []
    native, step = _version(arm, recipe, arm_dir, log)
    steps += [step] if step else []
    fast_paths, step = _fast_paths(arm, recipe, arm_dir, log)
    steps += [step] if step else []
    # the embedded engine's source is src/<arm>/engine/ (a folder name); a git tag's is src/<arm>/ itself
    outputs, tree_sha = _check_tree(arm, arm_dir / "engine" if isinstance(source["source"], str) else arm_dir,
                                    source, log)
    arg = None if conversion else (model["name"] if model["kind"] == "named" else _rel(Path(model["path"]), root))
    body = {
        "arm": arm,
        "native_version": native or "unknown",
        "source_version": source["version"],
        "patched_tree_sha256": source["patched"]["tree_sha256"],
        "model": {"name": model["name"], "kind": model["kind"], "arg": arg},
        "conversion": conversion,
        "steps": steps,
        "exit_code": 0,
        "duration_s": time.perf_counter() - t0,
        "python": sys.version.split()[0],
        "toolchain": toolchain,
        "environment": _environment(installed, tree_sha, recipe.install, root) if installed else None,
        "tree_outputs": outputs,
        "fast_paths": fast_paths,
        "inputs": {"source": source_sha256},
    }
    if recipe.engine is not None:
        body["engine"] = recipe.engine
    return body
