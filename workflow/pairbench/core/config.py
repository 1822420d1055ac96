"""Run configuration: the checks a JSON Schema cannot express, and resolved views of the config.

The schema (workflow/schemas/config.schema.yaml, applied by ``snakemake.utils.validate`` in
workflow/rules/common.smk) catches unknown keys, wrong types and out-of-range numbers. What needs
the filesystem or the model lives here, in plain functions that take the config as an argument:
fewer than two arms, a patch or source path that does not exist, a length that does not fit in the
model's context. Every error is a :class:`ConfigError` whose message starts with the config key,
and :func:`config_errors` finds every one of them at once (:func:`check_config` raises the first).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Callable, Iterator

from pairbench.core.conditions import BY_NAME, conditions, levels
from pairbench.core.metrics import DEFAULT_MEMORY, DEFAULT_METRICS, DEFAULT_SECONDARY, check_metric_lists
from pairbench.core.configsource import parse_key
from pairbench.core import loadconfig
from pairbench.core.order import block_length

# The named models. "tiny" is the embedded engine's deterministic random-weight test model; its
# context is fixed by engine/ (keep in step with engine's tiny config).
MODEL_FILES = {"smollm2-135m": "resources/SmolLM2-135M-Instruct.Q4_1.gguf"}
NAMED_CONTEXT = {"tiny": 2048}

# The top-level keys with a default (the schema's defaults; tests/pairbench/test_config.py keeps the
# two in step). `arms` has none: what is compared is the one thing a config must say.
TOP_DEFAULTS = {"label": "default", "model": "smollm2-135m", "lengths": [256, 1024], "output_tokens": 64,
                "rounds": 6, "repeats": 1, "seed": 0, "order": "abba", "retries": 0}

EMBEDDED_SOURCE = "engine"
ARM_DEFAULTS = {"source": None, "patches": [], "args": [], "env": {}, "engine": "embedded", "threads": None,
                "build": None, "launch": None}
SERVER_DEFAULTS = {"threads": None, "startup_timeout_s": 120, "request_timeout_s": 300, "stop_timeout_s": 10,
                   "pin": False, "external_load": 0.5, "quiet_wait_s": 0}
VALIDATE_DEFAULTS = {"cases": ["token_counts", "done_marker", "python_function", "matches_baseline"], "timeout_s": 5,
                     "agreement": 1.0, "retries": 1, "retry_on": ["timeout"]}
CROSSCHECK_DEFAULTS = {"rounds": 3}
STATS_DEFAULTS = {
    "metrics": list(DEFAULT_METRICS),
    "secondary": list(DEFAULT_SECONDARY),
    "memory": list(DEFAULT_MEMORY),
    "multiplicity": "holm",
    "trim": None,
    "alpha": 0.05,
    "noise": 0.01,
}
GATES_DEFAULTS = {"allow_unproven_cold_cache": False}
# What each job asks of a scheduler (docs/cluster.md); `measure` is per measuring job, `other` per
# other job. Keep in step with the schema's defaults.
JOB_RESOURCES_DEFAULTS = {"measure": {"cpus": 2, "mem_mb": 4096, "runtime_min": 5},
                          "other": {"cpus": 1, "mem_mb": 2048, "runtime_min": 30}}
RESOURCES_DEFAULTS = {"partition": None, "account": None, "extra": None, "gpus": {}}
# Headroom above the longest prompt + output for the server's KV cache (the first-request
# diagnostic and the smoke request are short, so they always fit).
CONTEXT_MARGIN = 16


class ConfigError(ValueError):
    """A config that cannot run. The message starts with the offending key."""

    @property
    def key(self) -> tuple:
        """The key path the message starts with: ``arms.b.patches[0]: ...`` → ``("arms", "b", "patches", 0)``;
        ``config key 'lengths.1': ...`` → ``("lengths", 1)``; ``()`` for the whole config."""
        msg = str(self)
        if msg.startswith("config key '"):
            text = msg[len("config key '"):].split("'", 1)[0]
            return () if text == "<root>" else parse_key(text)
        head = msg.split(": ", 1)[0]
        return parse_key(head) if head and " " not in head else ()


def normalized(config: dict) -> dict:
    """A deep copy of *config* with every optional section filled with its defaults.

    ``snakemake.utils.validate`` fills top-level defaults but not those inside each arm (a schema
    under ``additionalProperties``), so every consumer reads the config through this.
    """
    cfg = copy.deepcopy(dict(config))
    for key, value in TOP_DEFAULTS.items():
        cfg.setdefault(key, copy.deepcopy(value))
    cfg["arms"] = {
        name: {**copy.deepcopy(ARM_DEFAULTS), **(arm or {})} for name, arm in cfg.get("arms", {}).items()
    }
    for arm in cfg["arms"].values():
        # source null: engine/ for the embedded engine; an installed package (no tree) for the others.
        if arm["source"] is None and arm["engine"] == ARM_DEFAULTS["engine"]:
            arm["source"] = EMBEDDED_SOURCE
        if isinstance(arm["source"], dict) and set(arm["source"]) == {"path"}:
            arm["source"] = arm["source"]["path"]
    cfg["allow_external"] = cfg.get("allow_external", False) in (True, "true")
    cfg["server"] = {**SERVER_DEFAULTS, **(cfg.get("server") or {})}
    cfg["validate"] = {**copy.deepcopy(VALIDATE_DEFAULTS), **(cfg.get("validate") or {})}
    load = loadconfig.section(cfg)  # not a load run: no key at all, so its config hash is as before
    if load is None:
        cfg.pop("load", None)
    else:
        cfg["load"] = load
    cfg["stats"] = {**copy.deepcopy(STATS_DEFAULTS), **loadconfig.stats_defaults(cfg), **(cfg.get("stats") or {})}
    cfg["crosscheck"] = {**CROSSCHECK_DEFAULTS, **(cfg.get("crosscheck") or {})}
    cfg["gates"] = {**GATES_DEFAULTS, **(cfg.get("gates") or {})}
    cfg["resources"] = _resources(cfg.get("resources") or {})
    if cfg["server"]["pin"] in ("true", "false"):
        cfg["server"]["pin"] = cfg["server"]["pin"] == "true"
    cfg.setdefault("baseline", None)
    cfg.setdefault("candidate", None)
    cfg.setdefault("candidates", None)
    return cfg


def _resources(given: dict) -> dict:
    res = {**copy.deepcopy(RESOURCES_DEFAULTS), **given}
    for kind, defaults in JOB_RESOURCES_DEFAULTS.items():
        res[kind] = {**defaults, **(given.get(kind) or {})}
    return res


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
        raise ConfigError(f"baseline: {cfg['baseline']!r} is not one of the arms ({', '.join(arms)})")
    if cfg.get("candidate") is not None and cfg.get("candidates") is not None:
        raise ConfigError("candidates: give either candidates (a list) or candidate (one arm), not both")
    if cfg.get("candidates") is not None:
        named = [(f"candidates[{i}]", name) for i, name in enumerate(cfg["candidates"])]
    else:
        named = [("candidate", cfg["candidate"])] if cfg.get("candidate") is not None else []
    base = baseline_arm(cfg)
    seen: set[str] = set()
    for where, name in named:
        if name not in cfg["arms"]:
            raise ConfigError(f"{where}: {name!r} is not one of the arms ({', '.join(arms)})")
        if name == base:
            raise ConfigError(f"{where}: {name!r} is the baseline; a candidate must differ from it")
        if name in seen:
            raise ConfigError(f"{where}: {name!r} is listed twice")
        seen.add(name)


def resolve_model(model: str, root: Path) -> dict:
    """``{"name", "kind": "named"|"gguf"|"hf", "path"}`` for a config ``model`` value.

    Named models are picked by explicit name, never by sniffing a path string; anything else is a
    path: a .gguf file (``gguf``), or a directory holding ``config.json``, a local Hugging Face
    model (``hf``: its tokenizer files and ``*.safetensors`` beside it). Which engines read which
    kind is their profiles' to say (``model_formats``: pairbench.engines.policy.check_engines).
    """
    root = Path(root)
    if model in NAMED_CONTEXT:
        return {"name": model, "kind": "named", "path": None}
    if model in MODEL_FILES:
        return {"name": model, "kind": "gguf", "path": str(root / MODEL_FILES[model])}
    path = Path(model).expanduser()
    if not path.is_absolute():
        path = root / path
    if path.suffix == ".gguf":
        return {"name": path.stem, "kind": "gguf", "path": str(path)}
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ConfigError(f"model: directory {model} has no config.json (a Hugging Face model directory holds "
                              "config.json, the tokenizer files and *.safetensors)")
        return {"name": path.name, "kind": "hf", "path": str(path)}
    hub = (f"; if it is a Hugging Face model id, pairbench does not download it: fetch it into a folder first "
           f"(huggingface-cli download {model} --local-dir resources/{Path(model).name}) and give that folder"
           if model.count("/") == 1 else "")
    raise ConfigError(
        f"model: {model!r} is neither a known model ({', '.join(sorted([*NAMED_CONTEXT, *MODEL_FILES]))}), "
        f"nor a path to a .gguf file, nor a Hugging Face model directory (a folder with config.json){hub}"
    )


def model_files(info: dict) -> list[str]:
    """The files a build depends on for the model *info* (:func:`resolve_model`): the GGUF file,
    or every file of a Hugging Face directory (hidden ones, such as a download's cache, left out)."""
    if info["kind"] == "gguf":
        return [info["path"]]
    if info["kind"] == "hf":
        root = Path(info["path"])
        return sorted(str(p) for p in root.rglob("*")
                      if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    return []


# GGUF metadata value types (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): struct
# format of each fixed-size scalar; 8 = string, 9 = array.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def gguf_metadata(path: str | Path) -> dict:
    """Scalar and string metadata from a GGUF header, read directly (arrays are skipped).

    ``gguf.GGUFReader`` maps every tensor too, which takes seconds on a 100 MB model; the config
    is checked on every snakemake invocation (a no-op rerun included), so only the header is read.
    """
    import struct

    def read(fh, fmt):
        size = struct.calcsize(fmt)
        data = fh.read(size)
        if len(data) != size:
            raise ConfigError(f"model: {path} ends inside its GGUF header")
        return struct.unpack(fmt, data)[0]

    def read_str(fh):
        return fh.read(read(fh, "<Q")).decode("utf-8", errors="replace")

    def skip(fh, vtype):
        if vtype in _GGUF_SCALARS:
            fh.seek(struct.calcsize(_GGUF_SCALARS[vtype]), 1)
        elif vtype == 8:
            fh.seek(read(fh, "<Q"), 1)
        elif vtype == 9:
            itype, n = read(fh, "<I"), read(fh, "<Q")
            if itype in _GGUF_SCALARS:
                fh.seek(n * struct.calcsize(_GGUF_SCALARS[itype]), 1)
            else:
                for _ in range(n):
                    skip(fh, itype)
        else:
            raise ConfigError(f"model: {path} has an unknown GGUF metadata type {vtype}")

    out: dict = {}
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ConfigError(f"model: {path} is not a GGUF file (bad magic)")
        version = read(fh, "<I")
        if version < 2:
            raise ConfigError(f"model: {path} is GGUF version {version}; only v2+ is supported")
        read(fh, "<Q")  # tensor count
        for _ in range(read(fh, "<Q")):
            key, vtype = read_str(fh), read(fh, "<I")
            if vtype in _GGUF_SCALARS:
                out[key] = read(fh, _GGUF_SCALARS[vtype])
            elif vtype == 8:
                out[key] = read_str(fh)
            else:
                skip(fh, vtype)
    return out


def gguf_context(path: str | Path) -> int:
    """The trained context length from a GGUF file's metadata (``<arch>.context_length``)."""
    meta = gguf_metadata(path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise ConfigError(f"model: {path} has no general.architecture in its GGUF metadata")
    ctx = meta.get(f"{arch}.context_length")
    if ctx is None:
        raise ConfigError(f"model: {path} has no {arch}.context_length in its GGUF metadata")
    return int(ctx)


def hf_context(directory: str | Path) -> int:
    """The trained context length a Hugging Face model directory's ``config.json`` states."""
    path = Path(directory) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model: {path} is not valid JSON ({exc})") from None
    cfg = {**cfg.get("text_config", {}), **cfg} if isinstance(cfg.get("text_config"), dict) else cfg
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        if isinstance(cfg.get(key), int):
            return cfg[key]
    raise ConfigError(f"model: {path} states no context length (max_position_embeddings)")


def model_context(model: str, root: Path) -> int:
    info = resolve_model(model, root)
    if info["kind"] == "named":
        return NAMED_CONTEXT[info["name"]]
    if info["kind"] == "hf":
        return hf_context(info["path"])
    path = Path(info["path"])
    if not path.is_file():
        hint = " (run ./install.sh)" if model in MODEL_FILES else ""
        raise ConfigError(f"model: file {path} does not exist{hint}")
    return gguf_context(path)


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
        yield ConfigError(f"arms: a paired benchmark needs at least two arms, got {len(arms)} ({', '.join(arms) or 'none'})")


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
                yield ConfigError(f"arms.{name}.source: directory {arm['source']} does not exist")
            elif arm["engine"] == ARM_DEFAULTS["engine"] and not (src / "VERSION").is_file():
                yield ConfigError(f"arms.{name}.source: {arm['source']} has no VERSION file")
        elif arm["source"] is None and arm["patches"]:
            yield ConfigError(f"arms.{name}.patches: engine {arm['engine']} has no source to patch "
                              f"(give arms.{name}.source: {{git: ..., tag: ...}} or a path)")
        for i, patch in enumerate(arm["patches"]):
            if not (root / patch).is_file():
                yield ConfigError(f"arms.{name}.patches[{i}]: patch file {patch} does not exist")


def _check_patch_names(cfg: dict, root: Path) -> Iterator[ConfigError]:
    bundled: dict[str, str] = {}  # the bundle's patches/ holds one file per name, from every arm
    for name, arm in cfg["arms"].items():
        for i, patch in enumerate(arm["patches"]):
            first = bundled.setdefault(Path(patch).name, patch)
            if first != patch and (root / first).is_file() and (root / patch).is_file() \
                    and (root / first).read_bytes() != (root / patch).read_bytes():
                yield ConfigError(f"arms.{name}.patches[{i}]: {patch} has the file name of another arm's "
                                  f"patch {first} but other content; the published bundle keeps one file "
                                  "per name, so rename one")


def _check_gpus(cfg: dict, root: Path) -> Iterator[ConfigError]:
    for name in cfg["resources"]["gpus"]:
        if name not in cfg["arms"]:
            yield ConfigError(f"resources.gpus.{name}: not one of the arms ({', '.join(arm_names(cfg))})")


def _check_context(cfg: dict, root: Path) -> Iterator[ConfigError]:
    # which engine reads which kind of model: its profile's model_formats (engines.policy.check_engines)
    context = model_context(cfg["model"], root)
    longest_out = max(levels(cfg, BY_NAME["output_tokens"]))
    for i, length in enumerate(cfg["lengths"]):
        if length + longest_out + CONTEXT_MARGIN > context:
            yield ConfigError(
                f"lengths[{i}]: {length} input + {longest_out} output tokens "
                f"(+{CONTEXT_MARGIN} margin) exceed the context of model {cfg['model']!r} ({context})"
            )


def _check_metrics(cfg: dict, root: Path) -> Iterator[ConfigError]:
    st = cfg["stats"]
    try:
        check_metric_lists(st["metrics"], st["secondary"], st["memory"],
                           scope="level" if loadconfig.is_load(cfg) else "request")
    except ValueError as exc:
        yield ConfigError(str(exc))


def _check_load(cfg: dict, root: Path) -> Iterator[ConfigError]:
    """The ``load`` section (pairbench.core.loadconfig); its slots per arm: pairbench.engines.slots."""
    for problem in loadconfig.checks(cfg):
        yield ConfigError(str(problem))


def _check_rounds(cfg: dict, root: Path) -> Iterator[ConfigError]:
    rounds, arms = cfg["rounds"], arm_names(cfg)
    if isinstance(rounds, dict):
        block = block_length(len(arms), cfg["order"])
        if rounds["max"] < rounds["min"]:
            yield ConfigError(f"rounds.max: {rounds['max']} is less than rounds.min ({rounds['min']})")
        for key in ("min", "max"):
            if rounds[key] % block:
                yield ConfigError(f"rounds.{key}: {rounds[key]} is not a multiple of {block}, the counterbalanced "
                                  f"block of order {cfg['order']!r} with {len(arms)} arms (every block of rounds "
                                  f"measured must be a whole counterbalanced block)")


def _check_trim(cfg: dict, root: Path) -> Iterator[ConfigError]:
    rounds = cfg["rounds"]
    least = rounds["min"] if isinstance(rounds, dict) else rounds
    trim = cfg["stats"]["trim"]
    if trim is not None and 2 * trim >= least:
        yield ConfigError(f"stats.trim: trimming {trim} from each end leaves nothing of {least} rounds")


# (the top-level keys a check reads, the check): config_errors skips a check whose keys the schema rejected
CHECKS: list[tuple[frozenset, Callable[[dict, Path], Iterator[ConfigError]]]] = [
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


def schema_check(config: dict, schema_path: str | Path) -> None:
    """Raise :class:`ConfigError` naming the key of the first schema violation (JSON Schema 2020-12).

    ``snakemake.utils.validate`` (run afterwards, to fill defaults) reports the same problems, but
    as a dump of the schema; this names the key first.
    """
    errors = schema_errors(config, schema_path)
    if errors:
        raise errors[0]


def schema_errors(config: dict, schema_path: str | Path) -> list[ConfigError]:
    """Every schema violation of *config*, one :class:`ConfigError` per key (an unknown key each),
    shallowest key first."""
    import jsonschema
    import yaml

    schema = yaml.safe_load(Path(schema_path).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(config),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    out: list[ConfigError] = []
    for error in errors:
        for message in _messages(error):
            if message not in {str(o) for o in out}:
                out.append(ConfigError(message))
    return out


def _messages(error: Any) -> list[str]:
    """One message per culprit: an unknown key each, a missing required key each, else one."""
    path = ".".join(str(p) for p in error.absolute_path)
    where = f"{path}." if path else ""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict) and error.schema.get("properties"):
        allowed = sorted(error.schema["properties"])
        return [f"config key '{where}{k}': unknown key (allowed: {', '.join(allowed)})"
                for k in sorted(k for k in error.instance if k not in allowed)]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        return [f"config key '{where}{k}': missing; it has no default"
                + (" (the arms to compare, e.g. arms: {baseline: {}, candidate: {patches: [my.patch]}})"
                   if f"{where}{k}" == "arms" else "")
                for k in missing]
    return [format_schema_error(error)]


def format_schema_error(error: Any) -> str:
    """A jsonschema ValidationError as ``config key 'a.b': message``.

    For a key that takes one of several shapes (``rounds``: an integer or {min, max,
    target_halfwidth}), the message is the one of the shape the value has, not "not valid under any
    of the given schemas"."""
    if error.validator == "oneOf" and error.context:
        branches: dict = {}
        for e in error.context:
            branches.setdefault(e.relative_schema_path[0], []).append(e)
        own = len(error.absolute_path)
        # the branch of the value's own shape: no type error at the key itself
        shaped = [errs for errs in branches.values()
                  if not any(e.validator == "type" and len(e.absolute_path) == own for e in errs)]
        if shaped:
            return format_schema_error(max(shaped[0], key=lambda e: len(e.absolute_path)))
        types = " or ".join(repr(e.validator_value) for errs in branches.values() for e in errs if e.validator == "type")
        return f"config key '{'.'.join(str(p) for p in error.absolute_path)}': {error.instance!r} is not of type {types}"
    path = ".".join(str(p) for p in error.absolute_path)
    if path == "label" and error.validator == "pattern":
        return (f"config key 'label': {error.instance!r} is not a label: letters, digits and _ . - only, "
                "starting with a letter or digit (it names the folder results/<label>/)")
    if path == "arms" and error.validator == "minProperties":
        arms = list(error.instance)
        return (f"config key 'arms': a paired benchmark needs at least two arms, got {len(arms)} "
                f"({', '.join(arms) or 'none'})")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(k for k in error.instance if k not in allowed)
        if error.schema.get("properties"):
            where = f"{path}." if path else ""
            return f"config key '{where}{unknown[0]}': unknown key (allowed: {', '.join(sorted(allowed))})"
    return f"config key '{path or '<root>'}': {error.message}"
