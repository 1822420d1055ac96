"""What an engine profile says, as typed values, and the templates it fills in.

:mod:`pairbench.engines.profiles` loads a profile and hands out these frozen values (a launch, the
tokenizer route, the cold-cache evidence, a build and its rendered recipe, an install into an arm's
own environment, the engine's own benchmark); the template functions here fill a profile's
``{placeholder}`` strings. Everything is re-exported by ``profiles``, where callers import it from.
"""

from __future__ import annotations

import os
import re
import string
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BuildRecipe", "BuildSpec", "ColdCacheSpec", "CrosscheckSpec", "ENV_DIR", "EngineError", "ExternalEngineNotAllowed",
    "FlushSpec", "InstallRecipe", "InstallSpec", "LaunchSpec", "PLACEHOLDERS", "TokenizeSpec", "check_placeholders",
    "env_python", "is_none_placeholder", "render", "render_body", "scripts_dir",
]

# Placeholders a launch/build/version template may use. A value of None drops the element and, if
# the element before it is a bare flag (starts with '-'), that flag too: "--threads {threads}" with
# no threads configured leaves the server's own default. {python} is the arm's interpreter (its own
# environment's, where the profile installs the arm: build.install) and {bin} that interpreter's
# folder of console scripts; {tag} is the exported git tag (build.install only).
PLACEHOLDERS = ("port", "model", "threads", "ctx", "python", "bin", "src", "host", "output_tokens", "commit",
                "lengths", "tag")

# An arm installed by its profile (build.install) gets a virtual environment of its own here, inside
# its exported tree (src/<arm>/.venv): the build's output, as a CMake build folder is (never source).
ENV_DIR = ".venv"


def env_python(env_dir: str | os.PathLike) -> Path:
    """The interpreter of the virtual environment *env_dir* (POSIX layout)."""
    return Path(env_dir) / "bin" / "python"


def scripts_dir(python: str) -> str:
    """``{bin}``: the console-scripts folder of the interpreter *python*: this process's scheme for
    the harness's own interpreter, else the folder the interpreter lies in (a virtual environment's
    ``bin/``)."""
    return sysconfig.get_path("scripts") if python == sys.executable else str(Path(python).parent)


class EngineError(ValueError):
    """A profile or an arm's engine settings are invalid. The message names the file or key."""


class ExternalEngineNotAllowed(EngineError):
    """The config targets an external engine without ``allow_external: true``. Carries the plan."""


@dataclass(frozen=True)
class LaunchSpec:
    """Everything needed to start one arm's server and know when it is ready."""

    argv: list[str]
    env: dict[str, str]  # additions to the inherited environment
    cwd: str
    health_path: str
    ready_timeout_s: float
    interval_s: float
    port: int
    host: str = "127.0.0.1"

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def health_url(self) -> str:
        return self.url + self.health_path

    def public(self) -> dict:
        """argv/env with this machine's paths replaced by their roles (for artifacts)."""
        return {"argv": [_basename_paths(a) for a in self.argv],
                "env_keys": sorted(self.env), "health_path": self.health_path,
                "ready_timeout_s": self.ready_timeout_s}


def _basename_paths(arg: str) -> str:
    return os.path.basename(arg) if os.path.isabs(arg) else arg


@dataclass(frozen=True)
class TokenizeSpec:
    """How prompts are tokenized (``tokenize``). *route* ``server``: POST *path* with *body*, which
    takes the rendered prompt ``text`` or the ``messages`` (*input*); the ids are in *tokens_field*.
    *route* ``model``: the model directory's own ``tokenizer.json`` (a Hugging Face directory), on
    the text the server is sent (*path* and *body* are then None)."""

    path: str | None
    input: str
    body: dict | None
    tokens_field: str
    count_field: str | None
    route: str = "server"


@dataclass(frozen=True)
class ColdCacheSpec:
    """Where a cold cache is shown (``cold_cache``): *proof* is ``evaluated_tokens``,
    ``cached_tokens`` or ``none``; the fields are dotted reply paths, the patterns log regexes."""

    proof: str
    how: str
    evaluated_field: str | None = None
    cached_field: str | None = None
    missing_means_zero: bool = False
    log_pattern: str | None = None
    log_evaluated_pattern: str | None = None
    requires_flags: tuple[str, ...] = ()

    @property
    def from_log(self) -> bool:
        """Whether the evaluated-token count is read from the server log, request by request."""
        return self.proof == "evaluated_tokens" and not self.evaluated_field


@dataclass(frozen=True)
class FlushSpec:
    """An unmeasured request sent before each steady one, so that it shares no prefix (``request.flush``)."""

    path: str
    body: dict


@dataclass(frozen=True)
class BuildSpec:
    """How an arm of this engine is built (``build``), as templates: a *command* (its step named
    *step*), or a CMake build (*cmake*: ``targets``, ``flags``, ``jobs``, ``build_dir``,
    ``compiler_cache``), or nothing; then, with *convert*, a cached conversion of a GGUF model."""

    command: tuple[str, ...] | None
    step: str
    cmake: dict | None
    convert: tuple[str, ...] | None
    timeout_s: float
    install: "InstallSpec | None" = None


@dataclass(frozen=True)
class InstallSpec:
    """How an arm of a Python engine is installed from its exported tree into a virtual environment
    of its own (``build.install``), as templates: *command* (run in the tree by the environment's
    ``{python}``, with *env* added to its environment), the environment made with
    ``--system-site-packages`` when *system_site_packages*; then the environment is asked for the
    installed version of the distribution *package* and where it imports *module* from."""

    command: tuple[str, ...]
    env: dict
    system_site_packages: bool
    package: str
    module: str


@dataclass(frozen=True)
class InstallRecipe:
    """One arm's install, rendered (:mod:`pairbench.arms.pyenv` runs it): a virtual environment at
    *env_dir* (absolute) made by this interpreter, then *command* with *env* added, in the tree; then
    *package*'s version and *module*'s location, read by the environment's interpreter *python*."""

    env_dir: str
    python: str
    system_site_packages: bool
    command: tuple[str, ...]
    env: dict
    package: str
    module: str


@dataclass(frozen=True)
class BuildRecipe:
    """One arm's build, rendered from its profile: what :func:`pairbench.arms.build.build_arm` runs.

    In order: *command* (a step named *command_step*) or the CMake build *cmake* (its ``flags``
    rendered) or the *install* into the arm's own environment, or none of them; with *convert* and a GGUF model, ``convert + [<gguf>, <out dir>]``
    (cached per patched tree and model; the server then gets the converted folder); then *version*,
    whose first output line is the native version string (a failure fails the build only when
    *version_required*). Every step has *timeout_s*. *engine* is the profile summary the build
    artifact records (external engines), else None. *fast_paths*: the argv that prints, as JSON, which
    native fast paths the arm's code permits (the profile's ``fast_paths.check``), else None.
    """

    command: tuple[str, ...] | None
    command_step: str
    cmake: dict | None
    convert: tuple[str, ...] | None
    version: tuple[str, ...] | None
    version_required: bool
    timeout_s: float
    engine: dict | None
    install: InstallRecipe | None = None
    fast_paths: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FastPathsSpec:
    """An engine's native fast paths (the profile's ``fast_paths``): the check the build runs, the
    launch flags that set the mode and turn one off, and where the server reports its facts."""

    check: tuple[str, ...]
    mode_flag: str
    off_flag: str
    facts_path: str
    facts_field: str

    def launch_args(self, mode: str, off) -> list[str]:
        """The flags for *mode* (``auto`` adds none) and each fast path in *off*."""
        args = [] if mode == "auto" else [self.mode_flag, mode]
        for name in sorted(off):
            args += [self.off_flag, name]
        return args


@dataclass(frozen=True)
class CrosscheckSpec:
    """The engine's own benchmark tool (``crosscheck``): argv templates that print *format*."""

    tool: str
    format: str
    commands: tuple[tuple[str, ...], ...]
    timeout_s: float
    how: str = ""
    exercise_binaries: tuple[str, ...] = ()  # programs whose code the exercise probe compares (relative to the tree)


def check_placeholders(template: str, where: str) -> None:
    for _, name, _, _ in string.Formatter().parse(template):
        if name is not None and name not in PLACEHOLDERS:
            raise EngineError(f"{where}: unknown placeholder {{{name}}} in {template!r} "
                              f"(known: {', '.join('{%s}' % p for p in PLACEHOLDERS)})")


def render(obj: Any, values: dict, where: str = "template") -> Any:
    """Fill placeholders in every string of *obj* (str, list, dict).

    A string that is exactly one placeholder keeps the value's type (``"{output_tokens}"`` → 64).
    In a list, an element whose placeholder value is None is dropped with its preceding bare flag.
    """
    if isinstance(obj, dict):
        return {k: render(v, values, f"{where}.{k}") for k, v in obj.items()}
    if isinstance(obj, list):
        out: list = []
        for i, item in enumerate(obj):
            if isinstance(item, str) and is_none_placeholder(item, values):
                if out and isinstance(out[-1], str) and out[-1].startswith("-") and i > 0 \
                        and isinstance(obj[i - 1], str) and not _fields(obj[i - 1]):
                    out.pop()
                continue
            out.append(render(item, values, f"{where}[{i}]"))
        return out
    if isinstance(obj, str):
        names = _fields(obj)
        for n in names:
            if n not in values:
                raise EngineError(f"{where}: placeholder {{{n}}} has no value here "
                                  f"(given: {', '.join(sorted(values))})")
        if len(names) == 1 and obj == "{%s}" % names[0]:
            return values[names[0]]
        return obj.format_map({k: ("" if v is None else v) for k, v in values.items()}) if names else obj
    return obj


def _fields(s: str) -> list[str]:
    return [n for _, n, _, _ in string.Formatter().parse(s) if n is not None]


def is_none_placeholder(s: str, values: dict) -> bool:
    names = _fields(s)
    return bool(names) and any(n in values and values[n] is None for n in names)


def render_body(obj: Any, values: dict) -> Any:
    """Like :func:`render` for request bodies: ``"{messages}"`` becomes the list itself."""
    if isinstance(obj, dict):
        return {k: render_body(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [render_body(v, values) for v in obj]
    if isinstance(obj, str):
        m = re.fullmatch(r"\{(\w+)\}", obj)
        if m and m.group(1) in values:
            return values[m.group(1)]
    return obj


