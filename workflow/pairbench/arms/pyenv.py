"""A Python engine's arm, installed from its exported tree into a virtual environment of its own.

Two arms of one Python engine (vLLM, SGLang, llama-cpp-python) that both ran "the ``vllm`` on
PATH" would measure one installed package twice, and a patch would never run. So an arm whose
profile says how (``build.install``, rendered into an
:class:`~pairbench.engines.specs.InstallRecipe` by the stage) is installed, in three steps run by
the one step runner (:func:`pairbench.core.steps.run_step`):

1. ``venv``: ``python -m venv --clear`` makes ``src/<arm>/.venv`` (with ``--system-site-packages``
   where the profile says so: it then sees the packages installed beside pairbench, and what is
   installed into it shadows them: an editable install in setuptools' ``compat`` mode, a ``.pth``
   path entry, comes before the harness's site-packages; its default import hook would not);
2. ``install``: the profile's command (e.g. ``pip install --no-deps --no-build-isolation
   --config-settings editable_mode=compat -e .``,
   or vLLM's ``VLLM_USE_PRECOMPILED=1`` route), run in the tree by the environment's interpreter,
   as if the environment were activated;
3. ``environment``: the environment's interpreter reports the installed version of the profile's
   distribution (``importlib.metadata``) and where it imports the engine's module from.

The last step is the proof that the arm runs its own tree: the module must come from the arm's
tree (an editable install) or from the environment itself (a regular one). A copy of the engine
on ``PYTHONPATH`` (or, for an editable install in setuptools' default mode, whose import hook comes
after every path entry, one installed beside pairbench) would silently win over it; the build then
fails, naming the copy.
"""

from __future__ import annotations

import json
import os
import site
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from pairbench.core.steps import StepError, run_step

__all__ = ["Installed", "InstallError", "install"]

# Run by the environment's interpreter: the distribution's version and the module's location,
# found without importing it (an engine's import may take seconds or want a GPU).
PROBE = """\
import importlib.metadata as md, importlib.util as iu, json, platform, sys
pkg, mod = sys.argv[1], sys.argv[2]
try:
    version = md.version(pkg)
except md.PackageNotFoundError:
    version = None
spec = iu.find_spec(mod)
origin = None if spec is None else spec.origin or next(iter(spec.submodule_search_locations or []), None)
print(json.dumps({"version": version, "origin": origin, "python": platform.python_version()}))
"""


class InstallError(Exception):
    """The install failed, or the environment does not run the arm's tree. Names the arm and the log."""


@dataclass(frozen=True)
class Installed:
    """An installed arm: its environment, its interpreter (absolute paths), what the environment
    reports (*version* of the distribution, the interpreter's *python_version*), and where it imports
    the module from: *imports_from* ``tree`` or ``environment``, *module_path* relative to that."""

    env_dir: Path
    python: Path
    python_version: str
    version: str
    imports_from: str
    module_path: str
    steps: list


def _run(arm: str, step: str, argv, cwd: Path, log: Path, timeout_s: float, **kw):
    try:
        return run_step(step, [str(a) for a in argv], cwd=cwd, log=log, timeout_s=timeout_s,
                        subject=f"arm {arm}: build step {step!r}", **kw)
    except StepError as exc:
        raise InstallError(str(exc)) from None


def _inherit_harness(env_dir: Path) -> None:
    """Where pairbench itself runs in a virtual environment, ``--system-site-packages`` would show
    the new one the base interpreter's packages only: a ``.pth`` file adds the harness's own site
    folders after the environment's (what is installed into it still comes first)."""
    if sys.prefix == sys.base_prefix:
        return
    purelib = Path(sysconfig.get_path("purelib", vars={"base": str(env_dir), "platbase": str(env_dir)}))
    purelib.mkdir(parents=True, exist_ok=True)
    (purelib / "_pairbench_harness.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))


def install(arm: str, recipe, tree: str | os.PathLike, *, log: str | os.PathLike, timeout_s: float) -> Installed:
    """Make *recipe*'s environment, run its install command in *tree*, and check what it imports.

    Raises :class:`InstallError` naming the arm when a step fails, when the environment lacks the
    distribution afterwards, or when it imports the module from anywhere but *tree* or itself."""
    tree, log = Path(tree), Path(log)
    env_dir, python = Path(recipe.env_dir), Path(recipe.python)
    flags = ["--system-site-packages", "--without-pip"] if recipe.system_site_packages else []
    steps = [_run(arm, "venv", [sys.executable, "-m", "venv", "--clear", *flags, env_dir], tree, log,
                  timeout_s).record]
    if recipe.system_site_packages:
        _inherit_harness(env_dir)
    # GIT_CEILING_DIRECTORIES: an exported tree has no .git, and a build that asks git (setuptools-scm,
    # vLLM's precompiled-wheel lookup) must not find and use the pairbench checkout around results/
    activated = {**os.environ, **recipe.env, "VIRTUAL_ENV": str(env_dir),
                 "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
                 "GIT_CEILING_DIRECTORIES": str(tree.resolve().parent)}
    steps.append(_run(arm, "install", recipe.command, tree, log, timeout_s, env=activated).record)
    # run where no module lies (not the tree: a module found in the working folder would prove nothing)
    probe = _run(arm, "environment", [python, "-c", PROBE, recipe.package, recipe.module], env_dir, log,
                 timeout_s, capture="stdout")
    steps.append(probe.record)
    facts = json.loads(probe.stdout.strip().splitlines()[-1])
    if facts["version"] is None:
        raise InstallError(f"arm {arm}: after the install its environment has no distribution {recipe.package!r} "
                           f"(build.install.package of its engine profile); see {log}")
    if facts["origin"] is None:
        raise InstallError(f"arm {arm}: its environment cannot find module {recipe.module!r} "
                           f"(build.install.module of its engine profile); see {log}")
    origin = Path(facts["origin"]).resolve()
    for where, root in (("environment", env_dir.resolve()), ("tree", tree.resolve())):
        if origin.is_relative_to(root):
            return Installed(env_dir=env_dir, python=python, python_version=facts["python"], version=facts["version"],
                             imports_from=where, module_path=origin.relative_to(root).as_posix(), steps=steps)
    raise InstallError(f"arm {arm}: its environment imports {recipe.module!r} from {origin}, not from the arm's "
                       f"tree or environment: another copy shadows the installed one (PYTHONPATH, or a package "
                       f"beside pairbench that an editable install cannot override); see {log}")
