"""Engine profiles: how pairbench launches, probes, drives and cross-checks each kind of server.

An arm names an engine profile (``engine: llama-cpp-python``; default ``embedded``). A profile is a
YAML file in ``config/engines/<name>.yaml`` validated against
``workflow/schemas/engine_profile.schema.json``. It says, for that engine:

- the launch command template (``{port}``, ``{model}``, ``{threads}``, ``{ctx}``, ``{python}``,
  ``{bin}``, ``{src}``, ``{host}``), its environment, the health probe and the readiness timeout;
- how an arm is built from its exported tree: a command, a CMake build, or (a Python engine) an
  install into a virtual environment of the arm's own, which its server then runs from;
- which model formats the engine reads (``model_formats``: a GGUF file, a Hugging Face directory);
- the fields added to every measured request (prefix cache off, output length forced);
- how a cold cache is proven from the server's own reply (read by :mod:`pairbench.engines.evidence`),
  and where native token counts and timings come from;
- how prompts are tokenized: the server's tokenizer (:meth:`EngineProfile.tokenize_request`), or
  the model directory's own (``tokenize.route: model``).

This module loads and renders profiles, and reads them: every section the rest of the harness needs
has a typed accessor on :class:`EngineProfile` (``tokenize_spec``, ``cold_cache_spec``,
``prompt_count_route``, ``build_spec``, ``version_command``, ``crosscheck_spec``, ``model_formats``...),
:meth:`EngineProfile.build_recipe` renders one arm's build and :meth:`EngineProfile.source_route`
says whether the arm's tree runs at all. The typed values and the templating live in
:mod:`pairbench.engines.specs`. The raw YAML (``profile.data``) is read only inside
:mod:`pairbench.engines`.
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
import string
import sys
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Mapping

import jsonschema
import yaml

from pairbench.core import conditions
from pairbench.engines.specs import (ENV_DIR, PLACEHOLDERS, BuildRecipe, BuildSpec, ColdCacheSpec, CrosscheckSpec,
                                     EngineError, ExternalEngineNotAllowed, FastPathsSpec, FlushSpec, InstallRecipe, InstallSpec,
                                     LaunchSpec, TokenizeSpec, check_placeholders, env_python, is_none_placeholder,
                                     render, render_body, scripts_dir)

__all__ = [
    "BuildRecipe", "BuildSpec", "ColdCacheSpec", "CrosscheckSpec", "ENV_DIR", "EngineError",
    "ExternalEngineNotAllowed", "EngineProfile", "FastPathsSpec", "FlushSpec", "InstallRecipe", "InstallSpec", "LaunchSpec",
    "MODEL_FORMATS", "PLACEHOLDERS", "PROFILE_DIR", "TokenizeSpec", "arm_engine", "available_profiles", "is_external",
    "launch_spec", "load_profile", "render",
]

REPO = Path(__file__).resolve().parents[3]
PROFILE_DIR = REPO / "config" / "engines"
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "engine_profile.schema.json"

DEFAULT_ENGINE = "embedded"

# What a model may be (pairbench.core.models.resolve_model's kinds), in the words of an error message.
MODEL_FORMATS = {"gguf": "a GGUF file", "hf": "a Hugging Face model directory", "named": "a named built-in model"}


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def available_profiles(root: str | os.PathLike | None = None) -> list[str]:
    root = Path(root) if root else PROFILE_DIR
    return sorted(p.stem for p in root.glob("*.yaml"))


@dataclass(frozen=True)
class EngineProfile:
    """A validated profile. ``data`` is the YAML as loaded: read it through the accessors below
    (outside :mod:`pairbench.engines`, only through them), never mutate it."""

    name: str
    data: dict = field(repr=False)
    path: str = ""

    # ---- facts ---------------------------------------------------------------------------
    @property
    def external(self) -> bool:
        return bool(self.data["external"])

    @property
    def api_mode(self) -> str:
        return self.data["api"]["mode"]

    @property
    def stream_usage(self) -> bool:
        return bool(self.data["api"].get("stream_usage", True))

    @property
    def generate_path(self) -> str:
        api = self.data["api"]
        if self.api_mode == "chat":
            return api.get("chat_path", "/v1/chat/completions")
        return api.get("completions_path", "/v1/completions")

    @property
    def cold_cache_proof(self) -> str:
        """'strong' (evaluated-token count), 'weak' (cached-token count, may be absent) or 'none'."""
        return {"evaluated_tokens": "strong", "cached_tokens": "weak", "none": "none"}[self.cold_cache_spec.proof]

    @cached_property
    def cold_cache_spec(self) -> ColdCacheSpec:
        cc = self.data["cold_cache"]
        return ColdCacheSpec(proof=cc["proof"], how=cc["how"].strip(), evaluated_field=cc.get("evaluated_field"),
                             cached_field=cc.get("cached_field"), missing_means_zero=bool(cc.get("missing_means_zero")),
                             log_pattern=cc.get("log_pattern"), log_evaluated_pattern=cc.get("log_evaluated_pattern"),
                             requires_flags=tuple(cc.get("requires_flags") or ()))

    @cached_property
    def tokenize_spec(self) -> TokenizeSpec:
        tok = self.data["tokenize"]
        return TokenizeSpec(path=tok.get("path"), input=tok.get("input", "text"), body=tok.get("body"),
                            tokens_field=tok.get("tokens_field", "tokens"), count_field=tok.get("count_field"),
                            route=tok.get("route", "server"))

    @property
    def model_formats(self) -> tuple[str, ...]:
        """The model kinds this engine reads (``model_formats``, default GGUF only): ``gguf`` (a
        file), ``hf`` (a Hugging Face directory), ``named`` (a built-in model, by name)."""
        return tuple(self.data.get("model_formats") or ("gguf",))

    @property
    def prompt_count_route(self) -> str:
        """Where the native prompt token count comes from: ``reply`` (a reply field,
        :attr:`prompt_count_field`) or ``tokenize`` (the server's tokenizer, its only count)."""
        return "tokenize" if self.data["tokens"]["prompt"] == "tokenize" else "reply"

    @property
    def prompt_count_field(self) -> str | None:
        """The reply's dotted path to the prompt token count (None: :attr:`prompt_count_route` is tokenize)."""
        return None if self.prompt_count_route == "tokenize" else self.data["tokens"]["prompt"]

    @property
    def completion_count_field(self) -> str | None:
        """The reply's dotted path to the completion token count (None: the streamed chunks are counted)."""
        field_ = self.data["tokens"]["completion"]
        return None if field_ == "stream_chunks" else field_

    @property
    def flush_spec(self) -> FlushSpec | None:
        fl = self.data["request"].get("flush")
        return FlushSpec(path=fl["path"], body=fl["body"]) if fl else None

    @property
    def version_command(self) -> list[str] | None:
        """The argv template printing the native version after the build (None: none)."""
        cmd = (self.data.get("version") or {}).get("command")
        return list(cmd) if cmd else None

    @property
    def version_required(self) -> bool:
        """Whether a version command that fails or prints nothing fails the build (else: 'unknown')."""
        return bool((self.data.get("version") or {}).get("required", False))

    @property
    def version_path(self) -> str | None:
        """The HTTP path answering the version once the server is up (None: none)."""
        return (self.data.get("version") or {}).get("path")

    @cached_property
    def fast_paths_spec(self) -> FastPathsSpec | None:
        """The engine's native fast paths (``fast_paths``), or None: it has none the harness controls."""
        fp = self.data.get("fast_paths")
        if not fp:
            return None
        return FastPathsSpec(check=tuple(fp["check"]), mode_flag=fp["mode_flag"], off_flag=fp["off_flag"],
                             facts_path=fp["facts_path"], facts_field=fp["facts_field"])

    @cached_property
    def build_spec(self) -> BuildSpec:
        b = self.data.get("build") or {}
        ins = b.get("install")
        install = None if not ins else InstallSpec(
            command=tuple(ins["command"]), env=dict(ins.get("env") or {}),
            system_site_packages=bool(ins.get("system_site_packages", False)), package=ins["package"],
            module=ins["module"])
        return BuildSpec(command=tuple(b["command"]) if b.get("command") else None, step=b.get("step", "build"),
                         cmake=copy.deepcopy(b["cmake"]) if b.get("cmake") else None,
                         convert=tuple(b["convert"]) if b.get("convert") else None,
                         timeout_s=float(b.get("timeout_s") or 3600), install=install)

    def installs(self, arm: dict) -> bool:
        """Whether *arm* is installed into a virtual environment of its own: the profile says how
        (``build.install``) and the arm has a source to install (a git tag)."""
        return self.build_spec.install is not None and arm.get("source") is not None

    def source_route(self, arm: dict) -> str | None:
        """How *arm*'s exported tree reaches its server: ``install`` (the profile installs it into
        the arm's own environment, ``build.install``), ``launch`` (the server starts from the tree:
        ``{src}`` in its command line or environment, or it runs in the tree), or None: the engine
        runs an installed program, so a source or patches given to it would never run."""
        if self.build_spec.install is not None:
            return "install"
        launch = self.data["launch"]
        words = [*(arm.get("launch") or launch["argv"]), *(arm.get("args") or []), *launch.get("env", {}).values(),
                 *(arm.get("env") or {}).values()]
        if launch.get("cwd", "src") == "src" or any("{src}" in str(w) for w in words):
            return "launch"
        return None

    @cached_property
    def crosscheck_spec(self) -> CrosscheckSpec | None:
        """The engine's own benchmark tool, or None when the profile names none."""
        c = self.data.get("crosscheck")
        if not c:
            return None
        return CrosscheckSpec(tool=c["tool"], format=c["format"], commands=tuple(tuple(t) for t in c["commands"]),
                              timeout_s=float(c.get("timeout_s", 1800)), how=c.get("how", "").strip(),
                              exercise_binaries=tuple(c.get("exercise_binaries") or ()))

    def build_recipe(self, arm: dict, *, src: str | os.PathLike, commit: str | None = None, tag: str | None = None,
                     python: str = sys.executable) -> BuildRecipe:
        """*arm*'s build, rendered: the arm's own ``build`` argv (a step named ``build``) wins over the
        profile's command or CMake build, or over its install command. Templates may use ``{python}``,
        ``{bin}``, ``{src}``, ``{threads}``, ``{host}``, ``{commit}`` (the exported tag's commit, 7
        characters; ``unknown`` without one) and ``{tag}``. Where the profile installs the arm
        (:meth:`installs`), ``{python}`` is the interpreter of the arm's own environment
        (``src/<arm>/.venv``), which *python* makes."""
        spec = self.build_spec
        env_dir = Path(src).resolve() / ENV_DIR
        run_python = str(env_python(env_dir)) if self.installs(arm) else python
        values = {"python": run_python, "bin": scripts_dir(run_python), "src": str(Path(src).resolve()),
                  "threads": arm.get("threads"), "port": None, "model": None, "ctx": None, "host": "127.0.0.1",
                  "commit": commit[:7] if commit else "unknown", "tag": tag}

        def argv(template, where: str) -> tuple[str, ...] | None:
            return tuple(str(a) for a in render(list(template), values, where)) if template else None

        own = arm.get("build") is not None
        command = argv(arm["build"], "arms.build") if own else argv(spec.command, f"{self.name}.build.command")
        install = None
        if self.installs(arm):
            env = render(dict(spec.install.env), values, f"{self.name}.build.install.env")
            install = InstallRecipe(
                env_dir=str(env_dir), python=run_python, system_site_packages=spec.install.system_site_packages,
                command=command if own else argv(spec.install.command, f"{self.name}.build.install.command"),
                env={k: str(v) for k, v in env.items() if v is not None}, package=spec.install.package,
                module=spec.install.module)
            command = None
        cmake = None
        if not own and spec.cmake:
            cmake = {**spec.cmake, "flags": [str(f) for f in render(list(spec.cmake.get("flags") or []), values,
                                                                     "build.cmake.flags")]}
        return BuildRecipe(command=command, command_step="build" if own else spec.step, cmake=cmake,
                           convert=argv(spec.convert, f"{self.name}.build.convert"),
                           version=argv(self.version_command, f"{self.name}.version.command"),
                           version_required=self.version_required, timeout_s=spec.timeout_s,
                           engine=self.summary() if self.external else None, install=install,
                           fast_paths=argv(self.fast_paths_spec.check, f"{self.name}.fast_paths.check")
                           if self.fast_paths_spec else None)

    def summary(self) -> dict:
        """The profile facts a run artifact records (and the report shows) for an arm."""
        return {
            "engine": self.name,
            "external": self.external,
            "api_mode": self.api_mode,
            "cold_cache_proof": self.cold_cache_proof,
            "cold_cache_how": self.cold_cache_spec.how,
            "prefix_cache_disabled_by": self.data["prefix_cache"]["how_disabled"].strip(),
            "output_length_forced_by": self.data["request"]["output_length"]["how"].strip(),
            "engine_timings": self.data["timings"]["field"] is not None,
            "tested": self.data.get("tested", ""),
        }

    # ---- requests ------------------------------------------------------------------------
    @cached_property
    def templated_factors(self) -> frozenset[str]:
        """The condition factors the profile's request fields name as placeholders."""
        req = self.data["request"]
        found: set[str] = set()

        def walk(obj) -> None:
            if isinstance(obj, dict):
                for v in obj.values():
                    walk(v)
            elif isinstance(obj, list):
                for v in obj:
                    walk(v)
            elif isinstance(obj, str):
                found.update(n for _, n, _, _ in string.Formatter().parse(obj) if n is not None)

        walk({**req["fields"], **req["output_length"]["fields"]})
        return frozenset(found)

    def request_fields(self, factors: Mapping[str, Any]) -> dict:
        """Fields merged into every generation request (cache off, output length forced), their
        templates filled with the condition's *factors* (``{output_tokens}``, and any condition
        factor the profile names: ``temperature: "{temperature}"``). A field whose one placeholder is
        a factor this condition lacks is left out, so the harness's default stands."""
        req = self.data["request"]
        fields = {**req["fields"], **req["output_length"]["fields"]}
        values = {**{f.name: None for f in conditions.FACTORS}, **factors}
        rendered = render(fields, values, where=f"{self.name}.request")
        return {k: v for k, v in rendered.items() if v is not None or fields[k] is None}

    def generation_body(self, *, messages: list[dict] | None = None, prompt: str | None = None,
                        factors: Mapping[str, Any], seed: int, stream: bool = True) -> tuple[str, dict]:
        """``(path, body)`` of one measured request in this engine's dialect, under a condition whose
        factor values are *factors* (``output_tokens`` at least): greedy, seeded, ``max_tokens`` the
        output length, then the profile's request fields (:meth:`request_fields`), which win."""
        if "output_tokens" not in factors:
            raise EngineError(f"engine {self.name}: a request needs the condition's output_tokens "
                              f"(given: {', '.join(sorted(factors)) or 'none'})")
        unsent = [n for n in factors if n in conditions.BY_NAME and conditions.BY_NAME[n].request
                  and n not in self.templated_factors]
        if unsent:
            raise EngineError(f"{self.path or self.name}: the condition's request-visible factor(s) "
                              f"{', '.join(unsent)} reach no request field: name each in request.fields "
                              f"(e.g. {unsent[0]}: \"{{{unsent[0]}}}\"), or the engine would be measured without it")
        body: dict[str, Any] = {"max_tokens": factors["output_tokens"], "temperature": 0, "seed": seed,
                                "stream": stream}
        if self.api_mode == "chat":
            if messages is None:
                raise EngineError(f"engine {self.name}: chat mode needs messages")
            body["messages"] = messages
        else:
            if prompt is None:
                raise EngineError(f"engine {self.name}: completions mode needs the rendered prompt text")
            body["prompt"] = prompt
        if stream and self.stream_usage:
            body["stream_options"] = {"include_usage": True}
        body.update(self.request_fields(factors))
        return self.generate_path, body

    def tokenize_request(self, *, text: str | None = None, messages: list[dict] | None = None) -> tuple[str, dict]:
        """``(path, body)`` asking the server's own tokenizer for the prompt's tokens."""
        tok = self.tokenize_spec
        if tok.route != "server":
            raise EngineError(f"engine {self.name}: tokenize.route is {tok.route}: no server tokenizer is asked")
        if tok.input == "messages" and messages is None:
            raise EngineError(f"engine {self.name}: tokenize takes messages")
        if tok.input == "text" and text is None:
            raise EngineError(f"engine {self.name}: tokenize takes the rendered prompt text")
        body = render_body(copy.deepcopy(tok.body), {"text": text, "messages": messages})
        return tok.path, body

    def token_count(self, reply: dict) -> int:
        """The prompt token count in a tokenize reply (the list's length, cross-checked with count)."""
        tok = self.tokenize_spec
        ids = reply.get(tok.tokens_field)
        if not isinstance(ids, list):
            raise EngineError(f"engine {self.name}: tokenize reply has no {tok.tokens_field!r} list: "
                              f"{str(reply)[:200]}")
        cf = tok.count_field
        if cf and reply.get(cf) is not None and reply[cf] != len(ids):
            raise EngineError(f"engine {self.name}: tokenize reply says count {reply[cf]} "
                              f"but lists {len(ids)} tokens")
        return len(ids)


def load_profile(name: str, root: str | os.PathLike | None = None) -> EngineProfile:
    """Load and validate ``config/engines/<name>.yaml``; errors name the file and the field."""
    root = Path(root) if root else PROFILE_DIR
    path = root / f"{name}.yaml"
    if not path.is_file():
        raise EngineError(f"engine: no profile {name!r} (looked for {path}; "
                          f"available: {', '.join(available_profiles(root)) or 'none'})")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise EngineError(f"{path}: not valid YAML: {exc}") from None
    validator = jsonschema.Draft202012Validator(_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        err = errors[0]
        where = ".".join(str(p) for p in err.absolute_path) or "<root>"
        raise EngineError(f"{path}: field {where!r}: {err.message}")
    if data["name"] != name:
        raise EngineError(f"{path}: field 'name' is {data['name']!r}, expected the file stem {name!r}")
    _check_consistency(data, path)
    return EngineProfile(name=name, data=data, path=str(path))


def _check_consistency(data: dict, path: Path) -> None:
    """Rules a schema cannot say: placeholders known, cache-off fields really sent, modes agree."""
    for key in ("argv",):
        for i, item in enumerate(data["launch"][key]):
            check_placeholders(item, f"{path}: launch.argv[{i}]")
    for k, v in data["launch"].get("env", {}).items():
        check_placeholders(v, f"{path}: launch.env.{k}")
    for section, key in (("build", "command"), ("build", "convert"), ("version", "command")):
        cmd = (data.get(section) or {}).get(key)
        for i, item in enumerate(cmd or []):
            check_placeholders(item, f"{path}: {section}.{key}[{i}]")
    _check_install(data, path)
    for i, cmd in enumerate((data.get("crosscheck") or {}).get("commands") or []):
        for j, item in enumerate(cmd):
            check_placeholders(item, f"{path}: crosscheck.commands[{i}][{j}]")
    cmake = (data.get("build") or {}).get("cmake")
    if cmake:
        if (data.get("build") or {}).get("command"):
            raise EngineError(f"{path}: build has both command and cmake; give one")
        for i, item in enumerate(cmake.get("flags") or []):
            check_placeholders(item, f"{path}: build.cmake.flags[{i}]")
            if item.startswith("-DCMAKE_C_COMPILER_LAUNCHER") or item.startswith("-DCMAKE_CXX_COMPILER_LAUNCHER"):
                raise EngineError(f"{path}: build.cmake.flags[{i}]: the compiler launcher is set by "
                                  "build.cmake.compiler_cache, not by a flag")
    sent = {**data["request"]["fields"], **data["request"]["output_length"]["fields"]}
    _check_request_placeholders(sent, path)
    for k, v in (data["prefix_cache"].get("request_fields") or {}).items():
        if sent.get(k) != v:
            raise EngineError(f"{path}: prefix_cache.request_fields.{k} = {v!r} is not sent "
                              f"(request.fields.{k} is {sent.get(k)!r})")
    argv = data["launch"]["argv"]
    for flag in data["prefix_cache"].get("launch_flags") or []:
        if flag not in argv:
            raise EngineError(f"{path}: prefix_cache.launch_flags: {flag!r} is not in launch.argv")
    cc = data["cold_cache"]
    for flag in cc.get("requires_flags") or []:
        if flag not in argv:
            raise EngineError(f"{path}: cold_cache.requires_flags: {flag!r} is not in launch.argv")
    if cc["proof"] == "evaluated_tokens" and not (cc.get("evaluated_field") or cc.get("log_evaluated_pattern")):
        raise EngineError(f"{path}: cold_cache.proof evaluated_tokens needs cold_cache.evaluated_field "
                          "or cold_cache.log_evaluated_pattern")
    for key in ("log_pattern", "log_evaluated_pattern"):
        if cc.get(key):
            try:
                if re.compile(cc[key]).groups < 1:
                    raise EngineError(f"{path}: cold_cache.{key} needs one capturing group (the count)")
            except re.error as exc:
                raise EngineError(f"{path}: cold_cache.{key} is not a valid regex: {exc}") from None
    if cc["proof"] == "cached_tokens" and not cc.get("cached_field"):
        raise EngineError(f"{path}: cold_cache.proof cached_tokens needs cold_cache.cached_field")
    if data["tokenize"].get("input", "text") == "text" and data["api"]["mode"] == "chat":
        raise EngineError(f"{path}: tokenize.input is text but api.mode is chat: the verified text "
                          "would not be what the server tokenizes; use api.mode: completions")
    if data["tokenize"].get("route") == "model":
        if list(data.get("model_formats") or ["gguf"]) != ["hf"]:
            raise EngineError(f"{path}: tokenize.route model reads the model directory's tokenizer.json, so "
                              "model_formats must be [hf]")
        if data["tokens"]["prompt"] == "tokenize":
            raise EngineError(f"{path}: tokenize.route model with tokens.prompt tokenize would check the "
                              "prompt count against the same local tokenizer; the reply must carry the count")


def _check_request_placeholders(fields: dict, path: Path) -> None:
    """A request field's placeholders are condition factors (:data:`pairbench.core.conditions.FACTORS`):
    what one request is measured under is all a request template may name."""
    known = [f.name for f in conditions.FACTORS]

    def walk(obj, where: str) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}.{k}")
        elif isinstance(obj, list):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")
        elif isinstance(obj, str):
            for _, name, _, _ in string.Formatter().parse(obj):
                if name is not None and name not in known:
                    raise EngineError(f"{path}: {where}: unknown placeholder {{{name}}} in {obj!r} (a request "
                                      f"field may name a condition factor: {', '.join('{%s}' % k for k in known)})")

    walk(fields, "request")


def _check_install(data: dict, path: Path) -> None:
    """``build.install`` is the arm's whole build (no command or CMake beside it); its templates are known."""
    build = data.get("build") or {}
    install = build.get("install")
    if not install:
        return
    if build.get("command") or build.get("cmake"):
        raise EngineError(f"{path}: build.install installs the arm; give it without build.command or build.cmake")
    for i, item in enumerate(install["command"]):
        check_placeholders(item, f"{path}: build.install.command[{i}]")
    for k, v in (install.get("env") or {}).items():
        check_placeholders(str(v), f"{path}: build.install.env.{k}")


# ---- arms ---------------------------------------------------------------------------------

def arm_engine(arm: dict) -> str:
    return arm.get("engine") or DEFAULT_ENGINE


def is_external(arm: dict, profile: EngineProfile | None = None) -> bool:
    """An arm is external if its engine profile is, or its source is a git repository."""
    profile = profile or load_profile(arm_engine(arm))
    src = arm.get("source")
    return profile.external or (isinstance(src, dict) and "git" in src)


def launch_spec(profile: EngineProfile, arm: dict, *, port: int, model: str, ctx: int,
                src_dir: str | os.PathLike, repo_root: str | os.PathLike = REPO,
                python: str = sys.executable, host: str = "127.0.0.1") -> LaunchSpec:
    """The concrete argv/env/cwd/health of one arm's server.

    The arm may replace the argv template (``launch: [...]``), append to it (``args``),
    set ``threads`` and add ``env`` (which wins over the profile's). Arms that differ only in
    these are a valid A/B (e.g. ``threads: 1`` vs ``threads: 2`` with no patches). *python* is the
    arm's interpreter (``{python}``; its own environment's where the build installed the arm), and
    ``{bin}`` its console scripts.
    """
    values = {"port": port, "model": model, "threads": arm.get("threads"), "ctx": ctx, "python": python,
              "bin": scripts_dir(python), "src": str(Path(src_dir).resolve()), "host": host}
    argv_t = arm.get("launch") or profile.data["launch"]["argv"]
    for i, item in enumerate(argv_t):
        check_placeholders(item, f"arm launch[{i}]")
    argv = [str(a) for a in render(list(argv_t) + list(arm.get("args") or []), values, "launch")]
    env_t = {**profile.data["launch"].get("env", {}), **{k: str(v) for k, v in (arm.get("env") or {}).items()}}
    env = {}
    for k, v in env_t.items():
        if is_none_placeholder(v, values):
            continue  # e.g. OMP_NUM_THREADS={threads} with no threads set: leave it unset
        env[k] = str(render(v, values, f"env.{k}"))
    if python != sys.executable:  # the arm's own environment, as if activated: a bare `vllm` or
        # `python` in an arm's launch override runs the arm's install, never the harness's copy
        env = {"VIRTUAL_ENV": str(Path(values["bin"]).parent),
               "PATH": os.pathsep.join([values["bin"], os.environ.get("PATH", os.defpath)]), **env}
    for flag in profile.data["prefix_cache"].get("launch_flags") or []:
        if flag not in argv:
            raise EngineError(f"arm launch: engine {profile.name} needs {flag!r} in its command line "
                              "to keep prefix caching off")
    for flag in profile.cold_cache_spec.requires_flags:
        if flag not in argv:
            raise EngineError(f"arm launch: engine {profile.name} needs {flag!r} in its command line, "
                              "else it never reports cached tokens and a cold cache cannot be shown")
    cwd = str(Path(src_dir).resolve()) if profile.data["launch"].get("cwd", "src") == "src" else str(repo_root)
    h = profile.data["health"]
    return LaunchSpec(argv=argv, env=env, cwd=cwd, health_path=h["path"],
                      ready_timeout_s=float(h["ready_timeout_s"]), interval_s=float(h.get("interval_s", 0.1)),
                      port=port, host=host)
