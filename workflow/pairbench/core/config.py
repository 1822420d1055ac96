"""Run configuration: its normalized form, and the checks a JSON Schema cannot express.

The schema (workflow/schemas/config.schema.yaml, read by :mod:`pairbench.core.configschema`) catches
unknown keys, wrong types and out-of-range numbers, and states every default. What needs the
filesystem or the model lives here, in plain functions that take the config as an argument: fewer
than two arms, a patch or source path that does not exist, a length that does not fit in the
model's context. Every error is a :class:`ConfigError` carrying its key, and :func:`config_errors`
finds every one of them at once (:func:`check_config` raises the first).
:func:`pairbench.stages.runconfig.load_config` is the one place a run's config is read, checked and
normalized; everything downstream reads its result.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Callable, Iterator

from pairbench.core import configschema, loadconfig
from pairbench.core.conditions import BY_NAME, conditions, levels
from pairbench.core.configsource import ConfigError
from pairbench.core.metrics import check_metric_lists
from pairbench.core.models import model_context
from pairbench.core.order import block_length

__all__ = ["ConfigError", "normalized", "config_errors", "check_config", "job_resources", "arm_names",
           "baseline_arm", "candidate_arms", "check_arm_roles", "serve_context"]

# The schema's defaults (the one place they are written): the top level's, one arm's, the stats'.
TOP_DEFAULTS = {k: v for k, v in configschema.defaults().items() if not isinstance(v, dict)}
ARM_DEFAULTS = configschema.defaults("arms", "*")
STATS_DEFAULTS = configschema.defaults("stats")
EMBEDDED_SOURCE = "engine"  # an embedded-engine arm's source when it names none
# Headroom above the longest prompt + output for the server's KV cache (the first-request
# diagnostic and the smoke request are short, so they always fit).
CONTEXT_MARGIN = 16


def normalized(config: dict) -> dict:
    """A deep copy of *config* with every default filled and every value in one spelling.

    Defaults are the schema's (:func:`pairbench.core.configschema.with_defaults`), each arm's and a
    load run's ``stats`` lists (:func:`pairbench.core.loadconfig.stats_defaults`) included. Then:
    an embedded arm's null source is ``engine``, ``{path: x}`` is ``x``; ``engine_options.fused_decode``
    given as YAML's bare ``on``/``off`` (true/false) is ``"on"``/``"off"``; ``allow_external`` and
    ``server.pin`` given as the strings ``"true"``/``"false"`` (``--config``) are booleans; a
    ``load`` section that says nothing beyond its defaults is dropped (not a load run: its config
    hash is a single-stream run's). Normalizing a normalized config changes nothing.
    """
    cfg = copy.deepcopy(dict(config))
    load = loadconfig.section(cfg)
    if load is not None:  # a load run's stats defaults first: the schema's are the single-stream ones
        stats = cfg["stats"] = dict(cfg.get("stats") or {})
        for key, value in loadconfig.stats_defaults(cfg).items():
            stats.setdefault(key, value)
    cfg = configschema.with_defaults(cfg)
    if load is None:
        cfg.pop("load", None)
    cfg.setdefault("arms", {})
    for arm in cfg["arms"].values():
        # source null: engine/ for the embedded engine; an installed package (no tree) for the others.
        if arm["source"] is None and arm["engine"] == ARM_DEFAULTS["engine"]:
            arm["source"] = EMBEDDED_SOURCE
        if isinstance(arm["source"], dict) and set(arm["source"]) == {"path"}:
            arm["source"] = arm["source"]["path"]
        options = arm["engine_options"]
        if isinstance(options.get("fused_decode"), bool):  # YAML's bare on/off
            options["fused_decode"] = "on" if options["fused_decode"] else "off"
    cfg["allow_external"] = cfg["allow_external"] in (True, "true")
    if cfg["server"]["pin"] in ("true", "false"):
        cfg["server"]["pin"] = cfg["server"]["pin"] == "true"
    return cfg


def job_resources(config: dict, kind: str, arms: list[str]) -> dict:
    """The Snakemake resources of one job of *kind* (``measure`` or ``other``) that launches *arms*
    (the Slurm executor's names: docs/cluster.md); a key left null is left out."""
    res = config["resources"]
    job = res[kind]
    out = {"cpus_per_task": job["cpus"], "mem_mb": job["mem_mb"], "runtime": job["runtime_min"],
           "slurm_partition": res["partition"], "slurm_account": res["account"], "slurm_extra": res["extra"],
           "gpu": max((res["gpus"].get(a, 0) for a in arms), default=0) or None}
    return {k: v for k, v in out.items() if v is not None}


def arm_names(config: dict) -> list[str]:
    """Arms in config order."""
    return list(config["arms"])


def baseline_arm(config: dict) -> str:
    return config.get("baseline") or arm_names(config)[0]


def candidate_arms(config: dict) -> list[str]:
    """The arms compared with the baseline, in order: ``candidates``, or ``[candidate]`` (its
    one-element shorthand), or every other arm in config order."""
    if config.get("candidates"):
        return list(config["candidates"])
    if config.get("candidate"):
        return [config["candidate"]]
    base = baseline_arm(config)
    return [a for a in arm_names(config) if a != base]


def check_arm_roles(cfg: dict) -> None:
    """``baseline``, ``candidate`` and ``candidates`` name arms, once each, none the baseline."""
    arms = arm_names(cfg)
    if cfg.get("baseline") is not None and cfg["baseline"] not in cfg["arms"]:
        raise ConfigError("baseline", f"{cfg['baseline']!r} is not one of the arms ({', '.join(arms)})")
    if cfg.get("candidate") is not None and cfg.get("candidates") is not None:
        raise ConfigError("candidates", "give either candidates (a list) or candidate (one arm), not both")
    if cfg.get("candidates") is not None:
        named = [(f"candidates[{i}]", name) for i, name in enumerate(cfg["candidates"])]
    else:
        named = [("candidate", cfg["candidate"])] if cfg.get("candidate") is not None else []
    base = baseline_arm(cfg)
    seen: set[str] = set()
    for where, name in named:
        if name not in cfg["arms"]:
            raise ConfigError(where, f"{name!r} is not one of the arms ({', '.join(arms)})")
        if name == base:
            raise ConfigError(where, f"{name!r} is the baseline; a candidate must differ from it")
        if name in seen:
            raise ConfigError(where, f"{name!r} is listed twice")
        seen.add(name)


def serve_context(config: dict) -> int:
    """The ``--max-context`` every server gets: the longest request plus a small margin."""
    return max(c.input_tokens + c.output_tokens for c in conditions(config)) + CONTEXT_MARGIN


def check_config(config: dict, root: Path) -> None:
    """Raise the first :class:`ConfigError` (naming the key) if *config* (already schema-valid) cannot run."""
    errors = config_errors(config, root)
    if errors:
        raise errors[0]


def config_errors(config: dict, root: Path, skip: frozenset | set = frozenset()) -> list[ConfigError]:
    """Every reason *config* cannot run, each a :class:`ConfigError` naming its key, in check order.

    A check that reads a top-level key in *skip* (one the schema already rejected) is left out, so a
    schema-invalid config still gets every other finding; that key's defaults stand in for it.
    """
    root = Path(root)
    cfg = normalized({k: v for k, v in config.items() if k not in skip})
    out: list[ConfigError] = []
    for keys, check in CHECKS:
        if keys & set(skip) or (keys & {"arms"} and len(cfg["arms"]) < 2 and check is not _check_arm_count):
            continue
        try:
            found = list(check(cfg, root))
        except ConfigError as exc:  # a check that cannot go on (a model file it cannot read)
            found = [exc]
        out.extend(e for e in found if str(e) not in {str(o) for o in out})
    return out


def _check_arm_count(cfg: dict, root: Path) -> Iterator[ConfigError]:
    arms = arm_names(cfg)
    if len(arms) < 2:
        yield ConfigError("arms", f"a paired benchmark needs at least two arms, got {len(arms)} ({', '.join(arms) or 'none'})")


def _check_roles(cfg: dict, root: Path) -> Iterator[ConfigError]:
    try:
        check_arm_roles(cfg)
    except ConfigError as exc:
        yield exc


def _check_sources(cfg: dict, root: Path) -> Iterator[ConfigError]:
    """Each arm's source directory and patch files exist (its engine profile: engines.policy)."""
    for name, arm in cfg["arms"].items():
        if isinstance(arm["source"], str):
            src = root / arm["source"]
            if not src.is_dir():
                yield ConfigError(("arms", name, "source"), f"directory {arm['source']} does not exist")
            elif arm["engine"] == ARM_DEFAULTS["engine"] and not (src / "VERSION").is_file():
                yield ConfigError(("arms", name, "source"), f"{arm['source']} has no VERSION file")
        elif arm["source"] is None and arm["patches"]:
            yield ConfigError(("arms", name, "patches"), f"engine {arm['engine']} has no source to patch "
                              f"(give arms.{name}.source: {{git: ..., tag: ...}} or a path)")
        for i, patch in enumerate(arm["patches"]):
            if not (root / patch).is_file():
                yield ConfigError(("arms", name, "patches", i), f"patch file {patch} does not exist")


def _check_patch_names(cfg: dict, root: Path) -> Iterator[ConfigError]:
    bundled: dict[str, str] = {}  # the bundle's patches/ holds one file per name, from every arm
    for name, arm in cfg["arms"].items():
        for i, patch in enumerate(arm["patches"]):
            first = bundled.setdefault(Path(patch).name, patch)
            if first != patch and (root / first).is_file() and (root / patch).is_file() \
                    and (root / first).read_bytes() != (root / patch).read_bytes():
                yield ConfigError(("arms", name, "patches", i), f"{patch} has the file name of another arm's "
                                  f"patch {first} but other content; the published bundle keeps one file "
                                  "per name, so rename one")


def _check_gpus(cfg: dict, root: Path) -> Iterator[ConfigError]:
    for name in cfg["resources"]["gpus"]:
        if name not in cfg["arms"]:
            yield ConfigError(("resources", "gpus", name), f"not one of the arms ({', '.join(arm_names(cfg))})")


def _check_context(cfg: dict, root: Path) -> Iterator[ConfigError]:
    # which engine reads which kind of model: its profile's model_formats (engines.policy.check_engines)
    context = model_context(cfg["model"], root)
    longest_out = max(levels(cfg, BY_NAME["output_tokens"]))
    for i, length in enumerate(cfg["lengths"]):
        if length + longest_out + CONTEXT_MARGIN > context:
            yield ConfigError(("lengths", i), f"{length} input + {longest_out} output tokens (+{CONTEXT_MARGIN} "
                              f"margin) exceed the context of model {cfg['model']!r} ({context})")


def _check_metrics(cfg: dict, root: Path) -> Iterator[ConfigError]:
    st = cfg["stats"]
    try:
        check_metric_lists(st["metrics"], st["secondary"], st["memory"],
                           scope="level" if loadconfig.is_load(cfg) else "request")
    except ConfigError as exc:
        yield exc


def _check_load(cfg: dict, root: Path) -> Iterator[ConfigError]:
    """The ``load`` section (pairbench.core.loadconfig); its slots per arm need the arm's engine
    profile: :func:`pairbench.engines.policy.check_slots`."""
    yield from loadconfig.checks(cfg)


def _check_rounds(cfg: dict, root: Path) -> Iterator[ConfigError]:
    rounds, arms = cfg["rounds"], arm_names(cfg)
    if isinstance(rounds, dict):
        block = block_length(len(arms), cfg["order"])
        if rounds["max"] < rounds["min"]:
            yield ConfigError(("rounds", "max"), f"{rounds['max']} is less than rounds.min ({rounds['min']})")
        for key in ("min", "max"):
            if rounds[key] % block:
                yield ConfigError(("rounds", key), f"{rounds[key]} is not a multiple of {block}, the counterbalanced "
                                  f"block of order {cfg['order']!r} with {len(arms)} arms (every block of rounds "
                                  f"measured must be a whole counterbalanced block)")


def _check_trim(cfg: dict, root: Path) -> Iterator[ConfigError]:
    rounds = cfg["rounds"]
    least = rounds["min"] if isinstance(rounds, dict) else rounds
    trim = cfg["stats"]["trim"]
    if trim is not None and 2 * trim >= least:
        yield ConfigError(("stats", "trim"), f"trimming {trim} from each end leaves nothing of {least} rounds")


# (the top-level keys a check reads, the check): config_errors skips a check whose keys the schema rejected
def _check_cost(cfg: dict, root: Path) -> Iterator[ConfigError]:
    """The cost channel's conditions are planned ones (ids, as the plan spells them)."""
    wanted = cfg["cost"]["conditions"]
    if wanted is None or wanted == "shortest":
        return
    planned = [c.id for c in conditions(cfg)]
    for i, cid in enumerate(wanted):
        if cid not in planned:
            yield ConfigError(("cost", "conditions", i), f"{cid!r} is not a planned condition (planned: {', '.join(planned)})")


CHECKS: list[tuple[frozenset, Callable[[dict, Path], Iterator[ConfigError]]]] = [
    (frozenset({"cost", "lengths", "output_tokens", "load"}), _check_cost),
    (frozenset({"arms"}), _check_arm_count),
    (frozenset({"arms", "baseline", "candidate", "candidates"}), _check_roles),
    (frozenset({"arms"}), _check_sources),
    (frozenset({"arms"}), _check_patch_names),
    (frozenset({"arms", "resources"}), _check_gpus),
    (frozenset({"model", "lengths", "output_tokens"}), _check_context),
    (frozenset({"stats", "load"}), _check_metrics),
    (frozenset({"load", "repeats", "output_tokens"}), _check_load),
    (frozenset({"rounds", "order", "arms"}), _check_rounds),
    (frozenset({"rounds", "stats"}), _check_trim),
]
