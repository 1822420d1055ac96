"""The adapter every pipeline stage drives an engine through: launch, dialect, tokenizer, gates.

A new engine is a profile in ``config/engines/`` and, at most, a small subclass of
:class:`ArmEngine` registered under the profile's name (lm-evaluation-harness's
``@register_model``). A server that streams another shape than server-sent OpenAI chunks
overrides one method, :meth:`ArmEngine.read_line`::

    @register_adapter("my-server")
    class MyServer(ArmEngine):
        def read_line(self, result, line, now) -> bool: ...  # one line into result; True at the end

in a module of its own under ``pairbench/engines/``, imported by the package's ``__init__`` so that
it is registered before any stage asks. :func:`arm_adapter` and :func:`for_arm` build the class
registered for the arm's profile, and :class:`ArmEngine` itself for every other profile: the
embedded engine is an ordinary profile too, so a gate, the launch or the cold-cache evidence is
fixed once.

Every measured request is one :meth:`ArmEngine.exchange`: the body built from the condition (each
factor a value of the profile's request templates), the prompt counted, the flush, the stream, its
shape read and the reply gated, returned as one :class:`~pairbench.engines.exchange.Exchange`. A
load level sends many at once, so it calls the two halves around its concurrent streams:
:meth:`ArmEngine.prepare` and :meth:`ArmEngine.judge`.
"""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable

from pairbench.core.conditions import Condition
from pairbench.engines.chat import render_chat_prompt
from pairbench.engines.client import StreamResult, read_sse_line, stream_chat
from pairbench.engines.evidence import cold_cache_evidence, native_counts
from pairbench.engines.exchange import Exchange, Link, Prepared
from pairbench.engines.fastpaths import Launch
from pairbench.engines.hfmodel import encode
from pairbench.engines.policy import plan_opt_in
from pairbench.engines.profiles import REPO, EngineError, EngineProfile, LaunchSpec, arm_engine, launch_spec, load_profile
from pairbench.engines.server import ServerProcess
from pairbench.engines import serving

__all__ = ["ADAPTERS", "ArmEngine", "adapter_class", "arm_adapter", "arm_python", "for_arm", "model_arg",
           "register_adapter"]


class ArmEngine:
    """One arm's engine, as the stages see it: launch, request dialect, tokenizer and gates.

    Every engine goes through this class, the embedded one included: what differs between engines
    is data in their profile, and where data cannot say it, a small subclass registered under the
    profile's name (:func:`register_adapter`). ``arm`` is the arm's normalized config
    (``engine``, ``threads``, ``args``, ``env``, ``launch``); ``model`` is what the server is handed
    as ``{model}`` and ``model_path`` the GGUF a completions-mode engine's template comes from.
    """

    def __init__(self, profile: EngineProfile, arm: dict, *, model: str, model_path: str | None, ctx: int,
                 src_dir: str | os.PathLike, repo_root: str | os.PathLike = REPO, python: str = sys.executable,
                 load: bool = False):
        self.profile = profile
        self.load = load  # a load run's server: serves several streams (pairbench.engines.serving)
        self.load_spec = serving.load_spec(profile)
        self.arm = arm
        self.model = model
        self.model_path = model_path
        self.ctx = ctx
        self.src_dir = Path(src_dir)
        self.repo_root = Path(repo_root)
        self.python = python  # {python}: the arm's own environment's interpreter where its build installed it
        self.fast_paths: Launch | None = None  # its native fast-path settings (for_arm), where the engine has any

    @property
    def name(self) -> str:
        return self.profile.name

    def launch(self, port: int) -> LaunchSpec:
        """The server's command line. A load run's drops the profile's single-stream cap, and where the
        server divides its context among its slots, hands it the context times the slots."""
        spec = launch_spec(self.profile, self.arm, port=port, model=self.model, ctx=self.ctx,
                           src_dir=self.src_dir, repo_root=self.repo_root, python=self.python)
        if not self.load:
            return spec
        if self.load_spec.shared_context and (self.slots or 1) > 1:
            spec = launch_spec(self.profile, self.arm, port=port, model=self.model, ctx=self.ctx * self.slots,
                               src_dir=self.src_dir, repo_root=self.repo_root, python=self.python)
        return replace(spec, argv=serving.without_single_stream_flags(self.load_spec, spec.argv))

    @property
    def slots(self) -> int | None:
        """Requests this arm's server serves at once (None: unknown), from its command line."""
        argv = launch_spec(self.profile, self.arm, port=0, model=self.model, ctx=self.ctx, src_dir=self.src_dir,
                           repo_root=self.repo_root, python=self.python).argv
        if self.load:
            argv = serving.without_single_stream_flags(self.load_spec, argv)
        return serving.slots_in(self.load_spec, argv)

    def wait_idle(self, http, url: str, timeout_s: float) -> dict:
        """Wait until the server reports nothing running or waiting (:func:`pairbench.engines.serving.wait_idle`)."""
        return serving.wait_idle(self.load_spec, http, url, timeout_s=timeout_s)

    def cache_state(self) -> dict:
        """How the prefix cache is kept out of a load level: ``{"how", "detail"}``. ``how`` is
        ``request`` (off in every request's fields), ``launch`` (off by a launch flag) or ``unproven``
        (only a flush before each request would defeat it, which concurrent requests cannot have)."""
        pc = self.profile.data["prefix_cache"]
        if self.profile.flush_spec is not None:
            how = "unproven"
        elif pc.get("request_fields"):
            how = "request"
        else:
            how = "launch" if pc.get("launch_flags") else "unproven"
        return {"how": how, "detail": " ".join(pc["how_disabled"].split())}

    def server(self, log_path: str | os.PathLike, server_cfg: dict, *, pid_path: str | os.PathLike | None = None,
               owner: str = "", cpus: list[int] | None = None) -> ServerProcess:
        """This arm's server, not yet started (``with engine.server(...) as srv:``). The config's
        ``server.startup_timeout_s``, when set, overrides the profile's readiness timeout; *cpus*
        pins it (``server.pin``)."""
        return ServerProcess(self.launch, log_path, startup_timeout_s=server_cfg.get("startup_timeout_s"),
                             stop_timeout_s=server_cfg["stop_timeout_s"], pid_path=pid_path, owner=owner, cpus=cpus)

    # What the server is sent, and how its tokenizer is asked. -----------------------------
    def prompt_text(self, messages: list[dict]) -> str | None:
        """The rendered prompt for completions-mode engines (None in chat mode)."""
        if self.profile.api_mode == "chat":
            return None
        if not self.model_path:
            raise EngineError(f"engine {self.name}: completions mode needs a GGUF model or a model directory "
                              "to render its chat template")
        return render_chat_prompt(self.model_path, messages)

    @property
    def tokenizes_locally(self) -> bool:
        """Whether prompts are counted with the model directory's own tokenizer (``tokenize.route:
        model``), so that no server needs to run for it."""
        return self.profile.tokenize_spec.route == "model"

    @property
    def needs_log(self) -> bool:
        """Whether the cold-cache evidence is read from the server log, request by request."""
        return self.profile.cold_cache_spec.from_log

    def flush(self, http, url: str) -> None:
        """Send the profile's unmeasured flush request (if any) so the next prompt shares no prefix."""
        fl = self.profile.flush_spec
        if fl is None:
            return
        resp = http.post(url + fl.path, json=fl.body, timeout=60.0)
        if resp.status_code != 200:
            raise EngineError(f"engine {self.name}: flush request {fl.path}: HTTP {resp.status_code}: "
                              f"{resp.text[:200]}")

    def request(self, messages: list[dict], condition: Condition, seed: int) -> tuple[str, dict]:
        """``(path, body)`` of one request under *condition*: every factor of the condition is a value
        of the profile's request templates (``{output_tokens}``, and any factor a profile names)."""
        return self.profile.generation_body(messages=messages, prompt=self.prompt_text(messages),
                                            factors=dict(condition.values), seed=seed)

    # One exchange: prepare, flush, stream, read, gate. ------------------------------------
    def prepare(self, messages: list[dict], condition: Condition, seed: int, link: Link) -> Prepared:
        """The request and, for an engine whose replies carry no prompt count, the server's count."""
        path, body = self.request(messages, condition, seed)
        return Prepared(path, body, self.prompt_count(link.http, link.url, messages))

    def read_line(self, result: StreamResult, line: str, now: float) -> bool:
        """Read one line of a streamed reply into *result* (its tokens stamped *now*); True at the
        stream's end (:data:`pairbench.engines.client.LineReader`). Server-sent events of
        OpenAI-compatible chunks; a server that streams another shape overrides this one method."""
        return read_sse_line(result, line, now)

    def stream(self, link: Link, path: str, body: dict, on_token=None) -> StreamResult:
        """Send one prepared request and time every token's arrival (a ``ClientError`` on a fault)."""
        return stream_chat(link.url, body, link.timeout_s, path=path, on_token=on_token, read_line=self.read_line)

    def judge(self, result: StreamResult, condition: Condition, tokenize_count: int | None = None,
              log_text: str | None = None) -> Exchange:
        """The gates of one completed request under *condition* (:meth:`gates`), as an exchange."""
        gates, flags, facts = self.gates(result.reply(), length=condition.input_tokens,
                                         output_tokens=condition.output_tokens,
                                         streamed_tokens=len(result.token_times), tokenize_count=tokenize_count,
                                         log_text=log_text)
        return Exchange(result=result, gates=gates, flags=flags, facts=facts)

    def exchange(self, messages: list[dict], condition: Condition, seed: int, *, link: Link,
                 on_token=None) -> Exchange:
        """One measured request end to end: built from *condition*, counted, flushed (unmeasured,
        for engines that need it), streamed, read and gated. An engine fault (the request fails,
        the stream breaks, stalls or cannot be read) raises ``ClientError`` or ``EngineError``."""
        prepared = self.prepare(messages, condition, seed, link)
        self.flush(link.http, link.url)
        start = link.log.stat().st_size if self.needs_log and link.log is not None else None
        result = self.stream(link, prepared.path, prepared.body, on_token=on_token)
        log_text = None
        if start is not None:  # what the server logged during this one request
            with open(link.log, "rb") as fh:
                fh.seek(start)
                log_text = fh.read().decode(errors="replace")
        return self.judge(result, condition, prepared.tokenize_count, log_text)

    def tokenize(self, http, url: str, messages: list[dict]) -> list[int]:
        """The token ids of *messages* as this engine will be sent them: by the server's own
        tokenizer, or (:attr:`tokenizes_locally`) by the model directory's, over the text the
        server is sent (special tokens added in completions mode; a chat template holds its own)."""
        if self.tokenizes_locally:
            if not (self.model_path and Path(self.model_path).is_dir()):
                raise EngineError(f"engine {self.name}: tokenize.route model needs a Hugging Face model directory, "
                                  f"not {self.model!r}")
            return encode(self.model_path, render_chat_prompt(self.model_path, messages),
                          add_special_tokens=self.profile.api_mode == "completions")
        if self.profile.tokenize_spec.input == "messages":
            path, body = self.profile.tokenize_request(messages=messages)
        else:
            path, body = self.profile.tokenize_request(text=self.prompt_text(messages))
        resp = http.post(url + path, json=body, timeout=60.0)
        if resp.status_code != 200:
            raise EngineError(f"engine {self.name}: POST {path}: HTTP {resp.status_code}: {resp.text[:200]}")
        reply = resp.json()
        self.profile.token_count(reply)  # cross-checks count against the list
        return list(reply[self.profile.tokenize_spec.tokens_field])

    def prompt_count(self, http, url: str, messages: list[dict]) -> int | None:
        """The prompt's native token count from the server's tokenizer, for an engine whose replies
        carry none (its profile's prompt count route is ``tokenize``); None for every other engine,
        whose reply says it (:meth:`gates`)."""
        if self.profile.prompt_count_route != "tokenize":
            return None
        return len(self.tokenize(http, url, messages))

    def version(self, http, url: str) -> str | None:
        path = self.profile.version_path
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

    def engine_facts(self, http, url: str) -> dict | None:
        """The engine's effective facts as its server reports them (the profile's ``fast_paths``:
        ``facts_path``, ``facts_field``); None where the engine reports none or the request fails."""
        spec = self.profile.fast_paths_spec
        if spec is None:
            return None
        try:
            resp = http.get(url + spec.facts_path, timeout=10.0)
            facts = resp.json().get(spec.facts_field) if resp.status_code == 200 else None
        except Exception:  # noqa: BLE001 - an older engine without the facts: recorded as none
            return None
        return facts if isinstance(facts, dict) else None

    # Gates from the reply. -----------------------------------------------------------------
    def counts(self, reply: dict, *, streamed_tokens: int) -> dict:
        """``prompt_tokens``, ``completion_tokens``, ``tokens_cached`` of a reply, where this engine
        reports them (a first-request diagnostic; steady requests go through :meth:`gates`)."""
        prompt, completion = native_counts(self.profile, reply, streamed_tokens=streamed_tokens)
        cached = cold_cache_evidence(self.profile, reply, prompt or 0)["cached_tokens"]
        return {"prompt_tokens": prompt, "completion_tokens": completion, "tokens_cached": cached}

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


ADAPTERS: dict[str, type[ArmEngine]] = {}
"""Profile name -> the :class:`ArmEngine` subclass registered for it (:func:`register_adapter`)."""


def register_adapter(profile_name: str) -> Callable[[type[ArmEngine]], type[ArmEngine]]:
    """Class decorator: arms whose engine profile is *profile_name* are driven by this subclass."""

    def register(cls: type[ArmEngine]) -> type[ArmEngine]:
        if not (isinstance(cls, type) and issubclass(cls, ArmEngine)):
            raise TypeError(f"register_adapter({profile_name!r}): {cls!r} is not a subclass of ArmEngine")
        if ADAPTERS.get(profile_name, cls) is not cls:
            raise ValueError(f"register_adapter({profile_name!r}): {ADAPTERS[profile_name].__qualname__} "
                             f"is already registered for engine profile {profile_name!r}")
        ADAPTERS[profile_name] = cls
        return cls

    return register


def adapter_class(profile_name: str) -> type[ArmEngine]:
    """The class that drives *profile_name*'s arms: its registered subclass, else :class:`ArmEngine`."""
    return ADAPTERS.get(profile_name, ArmEngine)


def arm_adapter(arm: dict, *, model: str, model_path: str | None, ctx: int, src_dir: str | os.PathLike,
                repo_root: str | os.PathLike = REPO, python: str = sys.executable,
                load: bool = False) -> ArmEngine:
    """The adapter for one arm, whatever its engine (default: the embedded one). An engine without a
    profile fails here, naming it (:class:`~pairbench.engines.profiles.EngineError`). *load*: the
    arm serves a load run."""
    profile = load_profile(arm_engine(arm))
    return adapter_class(profile.name)(profile, arm, model=model, model_path=model_path, ctx=ctx, src_dir=src_dir,
                                       repo_root=repo_root, python=python, load=load)


def _under_root(path: str, root: str | os.PathLike) -> str:
    p = Path(path)
    return str(p if p.is_absolute() else (Path(root) / p).resolve())


def model_arg(build: dict, root: str | os.PathLike) -> str:
    """What an arm's server is handed as ``{model}``, from the arm's ``build`` artifact: the
    converted folder where the build converted the model, else the GGUF file or the Hugging Face
    directory, else the model's name."""
    if build["conversion"] is not None:
        return _under_root(build["conversion"]["path"], root)
    if build["model"]["kind"] in ("gguf", "hf") and build["model"]["arg"]:  # an engine that reads it itself
        return _under_root(build["model"]["arg"], root)
    return build["model"]["arg"]


def arm_python(build: dict, root: str | os.PathLike) -> str:
    """The interpreter an arm's server runs with (``{python}``), from its ``build`` artifact: its own
    environment's where the build installed the arm (which must still be there), else pairbench's."""
    env = build.get("environment")
    if not env:
        return sys.executable
    # not resolved: the environment's python is a link to the base interpreter, which would run without it
    python = Path(os.path.abspath(Path(root) / env["python"]))
    if not python.is_file():
        raise EngineError(f"arm {build['arm']}: its environment's interpreter {env['python']} is gone; "
                          "rebuild the arm (its build artifact records an environment that no longer exists)")
    return str(python)


def for_arm(arm_cfg: dict, *, build: dict, plan: dict, arm_dir: str | os.PathLike, server_cfg: dict,
            root: str | os.PathLike, fast_paths: Launch | None = None) -> ArmEngine:
    """The adapter a stage uses for one arm of *plan*, from its build artifact. Checks the opt-in
    first: nothing external is launched or contacted without ``allow_external: true``. *fast_paths*:
    the arm's native fast-path settings (:func:`pairbench.engines.fastpaths.resolve`), passed as the
    profile's launch flags before the arm's own ``args``."""
    plan_opt_in(plan)
    model = model_arg(build, root)
    arm = {**arm_cfg, "threads": arm_cfg.get("threads") or server_cfg["threads"]}
    spec = load_profile(arm_engine(arm)).fast_paths_spec
    if fast_paths is not None and spec is not None:
        arm["args"] = [*spec.launch_args(fast_paths.mode, fast_paths.off), *(arm.get("args") or [])]
    engine = arm_adapter(arm, model=model, model_path=model, ctx=plan["max_context"], src_dir=arm_dir,
                         repo_root=root, python=arm_python(build, root), load=plan.get("load") is not None)
    engine.fast_paths = fast_paths if spec is not None else None
    return engine
