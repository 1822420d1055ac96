"""The opt-in policy: nothing external is built, launched or contacted without consent; and every
arm's engine has a valid profile that runs what the arm claims (:func:`check_engines`, at parse
time): the model in a format the engine reads, and the arm's source and patches, which the engine
must install, build or launch from.

A profile marked ``external`` (code from outside this repository) or an arm whose source is a git
repository is never built, launched or sent a request unless the config sets
``allow_external: true`` (:func:`check_opt_in`); the plan is shown instead (:func:`describe_plan`).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pairbench.core import conditions as pb_conditions
from pairbench.core.configsource import ConfigError
from pairbench.core.models import resolve_model
from pairbench.core.loadconfig import section as load_section
from pairbench.engines import fastpaths, serving
from pairbench.engines.profiles import (ENV_DIR, MODEL_FORMATS, REPO, EngineError, EngineProfile,
                                        ExternalEngineNotAllowed, arm_engine, is_external, launch_spec, load_profile)
from pairbench.engines.specs import env_python


def check_engines(config: dict, root: str | Path = REPO) -> None:
    """Raise :class:`~pairbench.core.configsource.ConfigError` naming the key unless every arm's engine
    has a valid profile (``arms.<arm>.engine``), reads the model's format (``model``), and runs the
    arm's source and patches (``arms.<arm>.source``, ``arms.<arm>.patches``: :func:`check_source_runs`).
    *config* is schema-valid; *root* is the checkout the model path is relative to; a ``model`` of
    None (one already refused) skips the format check."""
    model = config.get("model")
    kind = resolve_model(model, Path(root))["kind"] if model is not None else None
    for name, arm in config["arms"].items():
        arm = arm or {}
        try:
            profile = load_profile(arm_engine(arm))
        except EngineError as exc:
            raise ConfigError(("arms", name, "engine"), str(exc)) from None
        if kind is not None and kind not in profile.model_formats:
            takes = " or ".join(MODEL_FORMATS[f] for f in profile.model_formats)
            raise ConfigError("model", f"{config['model']!r} is {MODEL_FORMATS[kind]}, but arm {name}'s engine "
                              f"{profile.name} reads {takes} only (model_formats in {_shown(profile)})")
        check_source_runs(name, arm, profile)
        mode = fastpaths.mode_of(arm)
        if mode != "auto" and profile.fast_paths_spec is None:
            raise ConfigError(("arms", name, "engine_options", "fused_decode"),
                              f"engine {profile.name} has no native fast paths to set (no fast_paths in "
                              f"{_shown(profile)}); fused_decode {mode} applies to the embedded engine")


def _shown(profile: EngineProfile) -> str:
    path = Path(profile.path)
    return path.relative_to(REPO).as_posix() if path.is_relative_to(REPO) else str(path)


def check_source_runs(name: str, arm: dict, profile: EngineProfile) -> None:
    """An arm that gives a source (a git tag) or patches must have them run: its engine's profile
    installs the tree into the arm's own environment, or launches from it (after building it there).
    Else both arms would run the one engine installed beside pairbench, and a patch would never run:
    :class:`~pairbench.core.configsource.ConfigError` naming ``arms.<arm>.patches`` or ``arms.<arm>.source``."""
    source, patches = arm.get("source"), arm.get("patches") or []
    route = profile.source_route(arm)
    if route == "install" and source is not None and not (isinstance(source, dict) and "git" in source):
        raise ConfigError(
            ("arms", name, "source"), f"engine {profile.name} installs its arm from a git tag or ref "
            "({git: <repo>, tag: <tag>} or {git: <repo>, ref: <ref>}); "
            "a directory is exported as an embedded-engine package (src/<arm>/engine/), which the install "
            "would not find. Commit the tree and name the tag")
    if route is not None or not (patches or source is not None):
        return
    if patches:
        key, what = "patches", "its patches would never run"
    else:
        key, what = "source", (f"tag {source['tag']}" if isinstance(source, dict) and "tag" in source
                               else f"ref {source['ref']}" if isinstance(source, dict) and "ref" in source
                               else "its source") + " would never run"
    raise ConfigError(
        ("arms", name, key), f"engine {profile.name} installs no source: its profile ({_shown(profile)}) has no "
        f"build.install, and its server runs an installed program, not the arm's tree, so {what} (both arms would "
        "measure the same installed engine). Use an engine profile that installs or builds the tree, or drop "
        f"arms.{name}.source and arms.{name}.patches to compare the installed engine's settings")


def check_slots(config: dict) -> list[ConfigError]:
    """A closed-loop load run's highest concurrency against each arm's slots (its engine profile's
    ``load.slots``, read from the arm's command line): more streams than slots would wait in the
    server's queue, which a run measures only when ``load.allow_queueing`` says so. Each error names
    ``arms.<arm>.args``; an arm whose slots are unknown is not checked."""
    load = load_section(config)
    if load is None or not load.get("concurrency"):
        return []
    top, out = max(load["concurrency"]), []
    for name, arm in config["arms"].items():
        arm = arm or {}
        try:
            profile = load_profile(arm_engine(arm))
            spec = serving.load_spec(profile)
            argv = launch_spec(profile, arm, port=0, model="model", ctx=1, src_dir=".").argv
            slots = serving.slots_in(spec, serving.without_single_stream_flags(spec, argv))
        except EngineError as exc:
            out.append(ConfigError(("arms", name, "args"), str(exc)))
            continue
        if slots is not None and top > slots and not load["allow_queueing"]:
            flag = spec.slots_flag or "its slots"
            out.append(ConfigError(
                ("arms", name, "args"), f"arm {name} serves {slots} request(s) at once ({flag} {slots}), fewer than "
                f"load.concurrency's {top} streams: the rest would wait in its queue. Give it [{flag}, \"{top}\"] "
                f"in args, or set load.allow_queueing: true to measure the queue on purpose"))
    return out


def external_arms(config: dict) -> list[str]:
    return [name for name, arm in config["arms"].items() if is_external(arm or {})]


def describe_plan(config: dict, condition_ids: list[str] | None = None) -> str:
    """What a run would launch and contact, arm by arm, and the conditions it measures (the config's,
    or *condition_ids*: a plan's), shown when opt-in is missing."""
    lines = [f"pairbench plan for label {config.get('label', 'default')!r}:"]
    for name, arm in config["arms"].items():
        arm = arm or {}
        profile = load_profile(arm_engine(arm))
        src = arm.get("source") or ("engine" if profile.name == "embedded" else None)
        if src is None:
            src_s = "none: the engine installed beside pairbench"
        elif isinstance(src, dict) and "git" in src:
            src_s = (f"git {src['git']} at ref {src['ref']}" if "ref" in src
                     else f"git {src['git']} at tag {src.get('tag')}")
        elif isinstance(src, dict):
            src_s = f"path {src.get('path')}"
        else:
            src_s = f"path {src}"
        src_dir = f"results/{config.get('label', 'default')}/src/{name}"
        python = str(env_python(Path(src_dir) / ENV_DIR)) if profile.installs(arm) else sys.executable
        spec = launch_spec(profile, arm, port="<port>", model=str(config.get("model")), ctx="<ctx>",
                           src_dir=src_dir, python=python)
        build = arm.get("build") or profile.build_spec.command
        if profile.installs(arm):
            install = profile.build_spec.install
            cmd = " ".join([*(f"{k}={v}" for k, v in install.env.items()), *(arm.get("build") or install.command)])
            build = f"install into results/{config.get('label', 'default')}/src/{name}/.venv: {cmd}"
        elif not build and profile.build_spec.cmake:
            build = f"CMake, targets {', '.join(profile.build_spec.cmake['targets'])}"
        lines.append(f"  arm {name}: engine {profile.name}"
                     f"{' (EXTERNAL)' if is_external(arm, profile) else ''}; source {src_s}; "
                     f"{len(arm.get('patches') or [])} patch(es)")
        if build:
            lines.append(f"    build: {build if isinstance(build, str) else ' '.join(build)}")
        lines.append(f"    launch: {' '.join(spec.argv)}")
        if spec.env:
            lines.append(f"    env: {' '.join(f'{k}={v}' for k, v in sorted(spec.env.items()))}")
        tokenizer = profile.tokenize_spec.path or "the model directory's tokenizer.json"
        lines.append(f"    requests to 127.0.0.1 ({spec.health_path}, {profile.generate_path}, "
                     f"{tokenizer}); cold-cache proof: {profile.cold_cache_proof}")
    if condition_ids is None:
        condition_ids = [c.id for c in pb_conditions.conditions(config)]
    lines.append(f"  {config.get('rounds')} rounds x {len(condition_ids)} condition(s): {', '.join(condition_ids)}")
    return "\n".join(lines)


def check_opt_in(config: dict, condition_ids: list[str] | None = None) -> list[str]:
    """Raise :class:`ExternalEngineNotAllowed` (with the plan: :func:`describe_plan`) unless external
    arms are allowed.

    Returns the external arm names (empty for an all-embedded config).
    """
    ext = external_arms(config)
    if ext and not config.get("allow_external", False):
        raise ExternalEngineNotAllowed(
            f"allow_external: arm(s) {', '.join(ext)} run an external engine, which pairbench "
            "neither builds, launches nor sends a request to without consent. Review the plan, "
            "then rerun with --config allow_external=true (or set allow_external: true).\n"
            + describe_plan(config, condition_ids))
    return ext


def plan_opt_in(plan: dict) -> list[str]:
    """:func:`check_opt_in` over a ``plan.json`` body: its arms, allow_external and conditions."""
    cfg = {"label": plan.get("label"), "model": (plan.get("model") or {}).get("name"), "rounds": plan.get("rounds"),
           "arms": plan["arms"], "allow_external": plan.get("allow_external", False)}
    return check_opt_in(cfg, [c["id"] for c in plan.get("conditions", [])])
