"""Engine profiles: how pairbench launches, probes, drives and cross-checks each kind of server.

An arm names an engine profile (``engine: llama-cpp-python``; default ``embedded``). A profile is a
YAML file in ``config/engines/<name>.yaml`` validated against
``workflow/schemas/engine_profile.schema.json``. It says, for that engine:

- the launch command template (``{port}``, ``{model}``, ``{threads}``, ``{ctx}``, ``{python}``,
  ``{src}``, ``{host}``), its environment, the health probe and the readiness timeout;
- the fields added to every measured request (prefix cache off, output length forced);
- how a cold cache is proven from the server's own reply (:func:`cold_cache_evidence`), and
  where native token counts and timings come from;
- how the server's tokenizer is reached (:meth:`EngineProfile.tokenize_request`).

Opt-in: a profile marked ``external`` (code from outside this repository) or an arm whose source is
a git repository is never launched or contacted unless the config sets ``allow_external: true``
(:func:`check_opt_in`). The plan is shown instead (:func:`describe_plan`).

The process itself is started and stopped (SIGTERM, then SIGKILL, to its process group) by
``pairbench.engines.server``; this module only says *what* to run.
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
from pathlib import Path
from typing import Any

import jsonschema
import yaml

__all__ = [
    "EngineError", "ExternalEngineNotAllowed", "EngineProfile", "LaunchSpec", "PLACEHOLDERS",
    "PROFILE_DIR", "available_profiles", "load_profile", "render", "launch_spec", "arm_engine",
    "is_external", "external_arms", "describe_plan", "check_opt_in", "get_path",
    "cold_cache_evidence", "native_counts", "count_log_prefix_hits", "render_chat_prompt",
    "ArmEngine", "arm_adapter", "build_external", "plan_opt_in",
]

REPO = Path(__file__).resolve().parents[3]
PROFILE_DIR = REPO / "config" / "engines"
SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "engine_profile.schema.json"

# Placeholders a launch/build/version template may use. A value of None drops the element and, if
# the element before it is a bare flag (starts with '-'), that flag too: "--threads {threads}" with
# no threads configured leaves the server's own default.
PLACEHOLDERS = ("port", "model", "threads", "ctx", "python", "src", "host", "output_tokens")

DEFAULT_ENGINE = "embedded"


class EngineError(ValueError):
    """A profile or an arm's engine settings are invalid. The message names the file or key."""


class ExternalEngineNotAllowed(EngineError):
    """The config targets an external engine without ``allow_external: true``. Carries the plan."""


@functools.lru_cache(maxsize=1)
def _schema() -> dict:
    schema = json.loads(SCHEMA.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return schema


def available_profiles(root: str | os.PathLike | None = None) -> list[str]:
    root = Path(root) if root else PROFILE_DIR
    return sorted(p.stem for p in root.glob("*.yaml"))


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
class EngineProfile:
    """A validated profile. ``data`` is the YAML as loaded; helpers read it, never mutate it."""

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
        return {"evaluated_tokens": "strong", "cached_tokens": "weak", "none": "none"}[
            self.data["cold_cache"]["proof"]]

    def summary(self) -> dict:
        """The profile facts a run artifact records (and the report shows) for an arm."""
        cc = self.data["cold_cache"]
        return {
            "engine": self.name,
            "external": self.external,
            "api_mode": self.api_mode,
            "cold_cache_proof": self.cold_cache_proof,
            "cold_cache_how": cc["how"].strip(),
            "prefix_cache_disabled_by": self.data["prefix_cache"]["how_disabled"].strip(),
            "output_length_forced_by": self.data["request"]["output_length"]["how"].strip(),
            "engine_timings": self.data["timings"]["field"] is not None,
            "tested": self.data.get("tested", ""),
        }

    # ---- requests ------------------------------------------------------------------------
    def request_fields(self, output_tokens: int) -> dict:
        """Fields merged into every generation request: cache off + output length forced."""
        req = self.data["request"]
        fields = {**req["fields"], **req["output_length"]["fields"]}
        return render(fields, {"output_tokens": output_tokens}, where=f"{self.name}.request")

    def generation_body(self, *, messages: list[dict] | None = None, prompt: str | None = None,
                        max_tokens: int, seed: int, stream: bool = True) -> tuple[str, dict]:
        """``(path, body)`` of one measured request in this engine's dialect."""
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0, "seed": seed, "stream": stream}
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
        body.update(self.request_fields(max_tokens))
        return self.generate_path, body

    def tokenize_request(self, *, text: str | None = None, messages: list[dict] | None = None) -> tuple[str, dict]:
        """``(path, body)`` asking the server's own tokenizer for the prompt's tokens."""
        tok = self.data["tokenize"]
        want = tok.get("input", "text")
        if want == "messages" and messages is None:
            raise EngineError(f"engine {self.name}: tokenize takes messages")
        if want == "text" and text is None:
            raise EngineError(f"engine {self.name}: tokenize takes the rendered prompt text")
        body = _render_obj(copy.deepcopy(tok["body"]), {"text": text, "messages": messages})
        return tok["path"], body

    def token_count(self, reply: dict) -> int:
        """The prompt token count in a tokenize reply (the list's length, cross-checked with count)."""
        tok = self.data["tokenize"]
        ids = reply.get(tok.get("tokens_field", "tokens"))
        if not isinstance(ids, list):
            raise EngineError(f"engine {self.name}: tokenize reply has no "
                              f"{tok.get('tokens_field', 'tokens')!r} list: {str(reply)[:200]}")
        cf = tok.get("count_field")
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
            _check_placeholders(item, f"{path}: launch.argv[{i}]")
    for k, v in data["launch"].get("env", {}).items():
        _check_placeholders(v, f"{path}: launch.env.{k}")
    for section in ("build", "version"):
        cmd = (data.get(section) or {}).get("command")
        for i, item in enumerate(cmd or []):
            _check_placeholders(item, f"{path}: {section}.command[{i}]")
    sent = {**data["request"]["fields"], **data["request"]["output_length"]["fields"]}
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


def _check_placeholders(template: str, where: str) -> None:
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
            if isinstance(item, str) and _is_none_placeholder(item, values):
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


def _is_none_placeholder(s: str, values: dict) -> bool:
    names = _fields(s)
    return bool(names) and any(n in values and values[n] is None for n in names)


def _render_obj(obj: Any, values: dict) -> Any:
    """Like :func:`render` for request bodies: ``"{messages}"`` becomes the list itself."""
    if isinstance(obj, dict):
        return {k: _render_obj(v, values) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_render_obj(v, values) for v in obj]
    if isinstance(obj, str):
        m = re.fullmatch(r"\{(\w+)\}", obj)
        if m and m.group(1) in values:
            return values[m.group(1)]
    return obj


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
    these are a valid A/B (e.g. ``threads: 1`` vs ``threads: 2`` with no patches).
    """
    values = {"port": port, "model": model, "threads": arm.get("threads"), "ctx": ctx,
              "python": python, "src": str(Path(src_dir).resolve()), "host": host}
    argv_t = arm.get("launch") or profile.data["launch"]["argv"]
    for i, item in enumerate(argv_t):
        _check_placeholders(item, f"arm launch[{i}]")
    argv = [str(a) for a in render(list(argv_t) + list(arm.get("args") or []), values, "launch")]
    env_t = {**profile.data["launch"].get("env", {}), **{k: str(v) for k, v in (arm.get("env") or {}).items()}}
    env = {}
    for k, v in env_t.items():
        if _is_none_placeholder(v, values):
            continue  # e.g. OMP_NUM_THREADS={threads} with no threads set: leave it unset
        env[k] = str(render(v, values, f"env.{k}"))
    for flag in profile.data["prefix_cache"].get("launch_flags") or []:
        if flag not in argv:
            raise EngineError(f"arm launch: engine {profile.name} needs {flag!r} in its command line "
                              "to keep prefix caching off")
    for flag in profile.data["cold_cache"].get("requires_flags") or []:
        if flag not in argv:
            raise EngineError(f"arm launch: engine {profile.name} needs {flag!r} in its command line, "
                              "else it never reports cached tokens and a cold cache cannot be shown")
    cwd = str(Path(src_dir).resolve()) if profile.data["launch"].get("cwd", "src") == "src" else str(repo_root)
    h = profile.data["health"]
    return LaunchSpec(argv=argv, env=env, cwd=cwd, health_path=h["path"],
                      ready_timeout_s=float(h["ready_timeout_s"]), interval_s=float(h.get("interval_s", 0.1)),
                      port=port, host=host)


def external_arms(config: dict) -> list[str]:
    return [name for name, arm in config["arms"].items() if is_external(arm or {})]


def describe_plan(config: dict) -> str:
    """What a run would launch and contact, arm by arm (shown when opt-in is missing)."""
    lines = [f"pairbench plan for label {config.get('label', 'default')!r}:"]
    for name, arm in config["arms"].items():
        arm = arm or {}
        profile = load_profile(arm_engine(arm))
        src = arm.get("source", "engine")
        if isinstance(src, dict) and "git" in src:
            src_s = f"git {src['git']} at tag {src.get('tag')}"
        elif isinstance(src, dict):
            src_s = f"path {src.get('path')}"
        else:
            src_s = f"path {src}"
        spec = launch_spec(profile, arm, port="<port>", model=str(config.get("model")), ctx="<ctx>",
                           src_dir=f"results/{config.get('label', 'default')}/src/{name}")
        build = arm.get("build", (profile.data.get("build") or {}).get("command"))
        lines.append(f"  arm {name}: engine {profile.name}"
                     f"{' (EXTERNAL)' if is_external(arm, profile) else ''}; source {src_s}; "
                     f"{len(arm.get('patches') or [])} patch(es)")
        if build:
            lines.append(f"    build: {' '.join(build) if isinstance(build, list) else build}")
        lines.append(f"    launch: {' '.join(spec.argv)}")
        if spec.env:
            lines.append(f"    env: {' '.join(f'{k}={v}' for k, v in sorted(spec.env.items()))}")
        lines.append(f"    requests to 127.0.0.1 ({spec.health_path}, {profile.generate_path}, "
                     f"{profile.data['tokenize']['path']}); cold-cache proof: {profile.cold_cache_proof}")
    lines.append(f"  {config.get('rounds')} rounds x lengths {config.get('lengths')} x "
                 f"{config.get('output_tokens')} output tokens")
    return "\n".join(lines)


def check_opt_in(config: dict) -> list[str]:
    """Raise :class:`ExternalEngineNotAllowed` (with the plan) unless external arms are allowed.

    Returns the external arm names (empty for an all-embedded config).
    """
    ext = external_arms(config)
    if ext and not config.get("allow_external", False):
        raise ExternalEngineNotAllowed(
            f"allow_external: arm(s) {', '.join(ext)} run an external engine, which pairbench "
            "neither builds, launches nor sends a request to without consent. Review the plan, "
            "then rerun with --config allow_external=true (or set allow_external: true).\n"
            + describe_plan(config))
    return ext


# ---- replies ------------------------------------------------------------------------------

def get_path(obj: Any, dotted: str) -> Any:
    """``get_path(reply, "usage.prompt_tokens_details.cached_tokens")``; None where missing."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _absent(obj: Any, dotted: str) -> bool:
    """True when *dotted* is missing because some dict on the way lacks the key (or holds null)."""
    cur = obj
    for part in dotted.split("."):
        if cur is None:
            return True
        if not isinstance(cur, dict):
            return False
        if part not in cur:
            return True
        cur = cur[part]
    return cur is None


def cold_cache_evidence(profile: EngineProfile, reply: dict, prompt_tokens: int, log_text: str | None = None) -> dict:
    """Judge one request's cold-cache gate from the server's own reply fields (or its log).

    *reply* holds the final reply's top-level fields (``usage``, ``timings``, ``tokens_cached``...);
    *log_text* is what the server logged during this one request (engines with log evidence).
    Returns ``{"proof": strong|weak|none, "cold": True|False|None, "evaluated_tokens",
    "cached_tokens", "flag"}``: ``cold`` None means unproven (never counted as a pass silently).
    """
    cc = profile.data["cold_cache"]
    out = {"proof": profile.cold_cache_proof, "cold": None, "evaluated_tokens": None,
           "cached_tokens": None, "flag": None}
    cached = get_path(reply, cc["cached_field"]) if cc.get("cached_field") else None
    if cached is None and cc.get("missing_means_zero") and cc["proof"] == "cached_tokens" \
            and _absent(reply, cc["cached_field"]):
        cached = 0  # omitted on a miss (only a well-formed absence counts, never a malformed field)
    out["cached_tokens"] = cached
    if cc["proof"] == "evaluated_tokens":
        if cc.get("evaluated_field"):
            ev, where = get_path(reply, cc["evaluated_field"]), f"reply lacks {cc['evaluated_field']}"
        else:
            found = [int(m.group(1)) for m in re.finditer(cc["log_evaluated_pattern"], log_text or "")]
            ev = found[-1] if len(found) == 1 else None
            where = (f"server log has {len(found)} prompt-evaluation lines for this request, expected 1"
                     if log_text is not None else "no server log to read the evaluated count from")
            hits = count_log_prefix_hits(profile, log_text or "")
            if hits:
                cached = out["cached_tokens"] = sum(hits)
            elif log_text is not None and cc.get("log_pattern"):
                cached = out["cached_tokens"] = 0
        out["evaluated_tokens"] = ev
        if not isinstance(ev, int):
            out["flag"] = f"cold_cache: {where}"
            return out
        out["cold"] = ev == prompt_tokens and (cached in (None, 0))
        if not out["cold"]:
            out["flag"] = (f"cold_cache: evaluated {ev} of {prompt_tokens} prompt tokens"
                           + (f", {cached} cached" if cached else ""))
        return out
    if cc["proof"] == "cached_tokens":
        if not isinstance(cached, int):
            out["flag"] = f"cold_cache: {cc['cached_field']} is not a count ({cached!r})"
            return out
        out["cold"] = cached == 0
        if cached:
            out["flag"] = f"cold_cache: {cached} of {prompt_tokens} prompt tokens served from cache"
        return out
    out["flag"] = f"cold_cache: unproven (engine {profile.name} reports no cache evidence)"
    return out


def native_counts(profile: EngineProfile, reply: dict, *, tokenize_count: int | None = None,
                  streamed_tokens: int | None = None) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` from where this engine reports them."""
    t = profile.data["tokens"]
    prompt = tokenize_count if t["prompt"] == "tokenize" else get_path(reply, t["prompt"])
    completion = streamed_tokens if t["completion"] == "stream_chunks" else get_path(reply, t["completion"])
    return prompt, completion


def count_log_prefix_hits(profile: EngineProfile, log_text: str) -> list[int] | None:
    """Reused-prefix token counts the server logged (``cold_cache.log_pattern``); None if no pattern."""
    pat = profile.data["cold_cache"].get("log_pattern")
    if not pat:
        return None
    return [int(m.group(1)) for m in re.finditer(pat, log_text)]


# ---- prompt text for completions-mode engines ----------------------------------------------

@functools.lru_cache(maxsize=4)
def _gguf_chat(path: str) -> tuple[str, str, str]:
    from gguf import GGUFReader

    reader = GGUFReader(path)

    def value(key: str):
        f = reader.fields.get(key)
        if f is None:
            return None
        return f.contents() if hasattr(f, "contents") else f.parts[f.data[0]]

    tmpl = value("tokenizer.chat_template")
    if tmpl is None:
        raise EngineError(f"model: {path} has no tokenizer.chat_template in its GGUF metadata")
    if not isinstance(tmpl, str):
        tmpl = bytes(tmpl).decode()
    tokens = reader.fields["tokenizer.ggml.tokens"]

    def token(id_key: str) -> str:
        f = reader.fields.get(id_key)
        if f is None:
            return ""
        idx = int(f.parts[f.data[0]][0])
        return bytes(tokens.parts[tokens.data[idx]]).decode()

    return tmpl, token("tokenizer.ggml.bos_token_id"), token("tokenizer.ggml.eos_token_id")


def render_chat_prompt(model_path: str | os.PathLike, messages: list[dict]) -> str:
    """The model's own chat template (from GGUF metadata) applied to *messages*, generation prompt
    added: the exact text a completions-mode engine is sent and whose token count is verified.

    Rendered like Hugging Face ``apply_chat_template`` (sandboxed jinja2, trim/lstrip blocks).
    """
    import jinja2
    import jinja2.sandbox

    tmpl, bos, eos = _gguf_chat(str(model_path))

    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env.from_string(tmpl).render(messages=messages, add_generation_prompt=True,
                                        bos_token=bos, eos_token=eos)


# ---- the per-arm adapter the pipeline stages use --------------------------------------------

class ArmEngine:
    """One arm's engine, as the stages see it: launch, request dialect, tokenizer and gates.

    ``arm`` is the arm's normalized config (``engine``, ``threads``, ``args``, ``env``, ``launch``);
    ``model_path`` is the GGUF (or model directory) handed to the server as ``{model}``.
    """

    def __init__(self, profile: EngineProfile, arm: dict, *, model: str, model_path: str | None, ctx: int,
                 src_dir: str | os.PathLike, repo_root: str | os.PathLike = REPO):
        self.profile = profile
        self.arm = arm
        self.model = model
        self.model_path = model_path
        self.ctx = ctx
        self.src_dir = Path(src_dir)
        self.repo_root = Path(repo_root)

    @property
    def name(self) -> str:
        return self.profile.name

    def launch(self, port: int) -> LaunchSpec:
        return launch_spec(self.profile, self.arm, port=port, model=self.model, ctx=self.ctx,
                           src_dir=self.src_dir, repo_root=self.repo_root)

    # What the server is sent, and how its tokenizer is asked. -----------------------------
    def prompt_text(self, messages: list[dict]) -> str | None:
        """The rendered prompt for completions-mode engines (None in chat mode)."""
        if self.profile.api_mode == "chat":
            return None
        if not self.model_path:
            raise EngineError(f"engine {self.name}: completions mode needs a GGUF model to render its chat template")
        return render_chat_prompt(self.model_path, messages)

    @property
    def needs_log(self) -> bool:
        """Whether the cold-cache evidence is read from the server log, request by request."""
        cc = self.profile.data["cold_cache"]
        return cc["proof"] == "evaluated_tokens" and not cc.get("evaluated_field")

    def flush(self, http, url: str) -> None:
        """Send the profile's unmeasured flush request (if any) so the next prompt shares no prefix."""
        fl = self.profile.data["request"].get("flush")
        if not fl:
            return
        resp = http.post(url + fl["path"], json=fl["body"], timeout=60.0)
        if resp.status_code != 200:
            raise EngineError(f"engine {self.name}: flush request {fl['path']}: HTTP {resp.status_code}: {resp.text[:200]}")

    def request(self, messages: list[dict], max_tokens: int, seed: int) -> tuple[str, dict]:
        return self.profile.generation_body(messages=messages, prompt=self.prompt_text(messages),
                                            max_tokens=max_tokens, seed=seed)

    def tokenize(self, http, url: str, messages: list[dict]) -> list[int]:
        """The server's own token ids for *messages* as this engine will be sent them."""
        tok = self.profile.data["tokenize"]
        if tok.get("input", "text") == "messages":
            path, body = self.profile.tokenize_request(messages=messages)
        else:
            path, body = self.profile.tokenize_request(text=self.prompt_text(messages))
        resp = http.post(url + path, json=body, timeout=60.0)
        if resp.status_code != 200:
            raise EngineError(f"engine {self.name}: POST {path}: HTTP {resp.status_code}: {resp.text[:200]}")
        reply = resp.json()
        self.profile.token_count(reply)  # cross-checks count against the list
        return list(reply[tok.get("tokens_field", "tokens")])

    def version(self, http, url: str) -> str | None:
        path = (self.profile.data.get("version") or {}).get("path")
        if not path:
            return None
        try:
            resp = http.get(url + path, timeout=10.0)
            if resp.status_code != 200:
                return None
            body = resp.json()
        except Exception:  # noqa: BLE001 - a version string is a nicety, never a failure
            return None
        return body.get("native") or (f"{self.name} {body['version']}" if body.get("version") else None)

    # Gates from the reply. -----------------------------------------------------------------
    def gates(self, reply: dict, *, length: int, output_tokens: int, streamed_tokens: int,
              tokenize_count: int | None, log_text: str | None = None) -> tuple[dict, list[str], dict]:
        """``({gate: bool|None}, [flag], facts)`` for one steady request.

        ``cold_cache`` is None when this engine cannot prove it (flagged, never a silent pass).
        facts: ``prompt_tokens``, ``completion_tokens``, ``tokens_cached``, ``cold_cache_proof``.
        """
        prompt, completion = native_counts(self.profile, reply, tokenize_count=tokenize_count,
                                           streamed_tokens=streamed_tokens)
        flags = []
        g_prompt = prompt == length
        if not g_prompt:
            flags.append(f"prompt_tokens: got {prompt}, planned {length}" if prompt is not None
                         else f"prompt_tokens: engine {self.name} reported no prompt token count")
        g_completion = completion == output_tokens and streamed_tokens == output_tokens
        if completion != output_tokens:
            flags.append(f"completion_tokens: got {completion}, planned {output_tokens}" if completion is not None
                         else f"completion_tokens: engine {self.name} reported no completion token count")
        elif streamed_tokens != output_tokens:
            flags.append(f"completion_tokens: {streamed_tokens} tokens streamed, planned {output_tokens}")
        ev = cold_cache_evidence(self.profile, reply, length, log_text=log_text)
        if ev["flag"]:
            flags.append(ev["flag"])
        facts = {"prompt_tokens": prompt, "completion_tokens": completion, "tokens_cached": ev["cached_tokens"],
                 "cold_cache_proof": ev["proof"]}
        return {"prompt_tokens": g_prompt, "completion_tokens": g_completion, "cold_cache": ev["cold"]}, flags, facts


def arm_adapter(arm: dict, *, model: str, model_path: str | None, ctx: int, src_dir: str | os.PathLike,
                repo_root: str | os.PathLike = REPO) -> ArmEngine | None:
    """The adapter for a non-embedded arm; None for the embedded engine (the stages' own path)."""
    profile = load_profile(arm_engine(arm))
    if profile.name == DEFAULT_ENGINE:
        return None
    return ArmEngine(profile, arm, model=model, model_path=model_path, ctx=ctx, src_dir=src_dir,
                     repo_root=repo_root)


def plan_opt_in(plan: dict) -> list[str]:
    """:func:`check_opt_in` over a ``plan.json`` body (which records arms and allow_external)."""
    cfg = {"label": plan.get("label"), "model": (plan.get("model") or {}).get("name"),
           "rounds": plan.get("rounds"), "lengths": plan.get("lengths"),
           "output_tokens": plan.get("output_tokens"), "arms": plan["arms"],
           "allow_external": plan.get("allow_external", False)}
    return check_opt_in(cfg)


def build_external(arm_name: str, arm: dict, arm_dir: str | os.PathLike, log: str | os.PathLike,
                   timeout_s: float | None = None, python: str = sys.executable) -> dict:
    """Run a non-embedded arm's build command (arm ``build`` or the profile's) in its exported tree,
    then its version command. Returns ``{"steps": [...], "native_version": str|None, "profile": {...}}``.

    Each step's output is appended to *log*; a non-zero exit raises :class:`EngineError` naming the
    arm, the step, the status and the log.
    """
    import subprocess
    import time

    profile = load_profile(arm_engine(arm))
    arm_dir, log = Path(arm_dir).resolve(), Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    values = {"python": python, "src": str(arm_dir), "threads": arm.get("threads"), "port": None,
              "model": None, "ctx": None, "host": "127.0.0.1"}
    build_t = arm["build"] if "build" in arm and arm["build"] is not None else (profile.data.get("build") or {}).get("command")
    timeout_s = timeout_s or (profile.data.get("build") or {}).get("timeout_s") or 3600
    steps, native = [], None

    def run(step: str, argv: list[str], optional: bool = False) -> str | None:
        t0 = time.perf_counter()
        with open(log, "a") as fh:
            fh.write(f"$ {' '.join(argv)}\n")
            fh.flush()
            try:
                proc = subprocess.run(argv, cwd=arm_dir, stdout=subprocess.PIPE, stderr=fh, text=True,
                                      timeout=timeout_s)
            except FileNotFoundError as exc:
                if optional:  # e.g. `vllm --version` where only the server's /version can tell
                    fh.write(f"{exc.filename}: not found; the version is left unknown\n")
                    steps.append({"step": step, "argv": argv[:1], "exit_code": 127,
                                  "duration_s": time.perf_counter() - t0})
                    return None
                raise EngineError(f"arm {arm_name}: build step {step!r}: {exc.filename} not found") from None
            except subprocess.TimeoutExpired:
                raise EngineError(f"arm {arm_name}: build step {step!r} exceeded {timeout_s:g} s; see {log}") from None
            fh.write(proc.stdout)
        steps.append({"step": step, "argv": [os.path.basename(a) if os.path.isabs(a) else a for a in argv],
                      "exit_code": proc.returncode, "duration_s": time.perf_counter() - t0})
        if proc.returncode != 0 and optional:
            with open(log, "a") as fh:  # a version string is a record, not a gate: launch will tell
                fh.write(f"(exit status {proc.returncode}: the version is left unknown)\n")
            return None
        if proc.returncode != 0:
            raise EngineError(f"arm {arm_name}: build step {step!r} exited with status {proc.returncode}; see {log}")
        return proc.stdout

    if build_t:
        run("build", [str(a) for a in render(list(build_t), values, f"arms.{arm_name}.build")])
    ver_t = (profile.data.get("version") or {}).get("command")
    if ver_t:
        out = run("version", [str(a) for a in render(list(ver_t), values, "version")], optional=True)
        native = (out or "").strip().splitlines()[0] if (out or "").strip() else None
    return {"steps": steps, "native_version": native, "profile": profile.summary()}
