"""A run's config, checked as a whole before any job: every problem at once, each at its file and line.

workflow/rules/common.smk and ``python -m pairbench plan`` both call :func:`problems` and, when
there are any, print :func:`report` and stop, without a traceback:

    pairbench: 2 config errors (nothing was run):
      tests/config/bad.yaml:4: config key 'colour': unknown key (allowed: ...)
      tests/config/bad.yaml:9: lengths[1]: 3000 input + 8 output tokens (+16 margin) exceed ...

The checks are the schema's (every violation, :func:`pairbench.core.config.schema_errors`), what
a schema cannot say (:func:`pairbench.core.config.config_errors`, skipping what reads a key the schema
rejected) and each arm's engine profile (:func:`pairbench.engines.policy.check_engines`).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from pairbench.core.config import TOP_DEFAULTS, ConfigError, config_errors, normalized, resolve_model, schema_errors
from pairbench.core.configsource import Sources, coerce_cli, key_text, load_with_lines
from pairbench.engines.policy import check_engines, check_slots

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


def with_cli(config: dict, cli: dict) -> dict:
    """*config* with the ``--config`` pairs *cli* applied again, their lists' and maps' strings read
    as numbers where they are numbers (:func:`pairbench.core.configsource.coerce_cli`): a map merged
    key by key, as Snakemake merges it, anything else replacing the value."""
    out = dict(config)
    for key, value in cli.items():
        value = coerce_cli(value)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _merged(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        out[k] = _merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def problems(config: dict, root: Path, schema: Path = SCHEMA) -> list[ConfigError]:
    """Every reason *config* cannot run, each naming its key (empty: it can)."""
    found = schema_errors(config, schema)
    # An unknown key is dropped and the rest of its section checked; any other rejected top-level key
    # leaves out the checks that read it.
    repaired = copy.deepcopy(config)
    rejected = set()
    for e in found:
        if str(e).endswith(")") and ": unknown key (allowed: " in str(e) and e.key:
            _drop(repaired, e.key)
        elif e.key:
            rejected.add(e.key[0])
    # the model's format is checked against each arm's engine only for a model that resolves (a bad
    # model is named once, by config_errors)
    model = None if "model" in rejected else repaired.get("model", TOP_DEFAULTS["model"])
    try:
        if model is not None:
            resolve_model(model, root)
    except ConfigError:
        model = None
    if "arms" not in rejected and isinstance(repaired.get("arms"), dict):
        for name, arm in repaired["arms"].items():
            try:
                check_engines({"arms": {name: arm}, "model": model}, root)
            except ConfigError as exc:  # named once, here: the checks below see the default engine
                found.append(exc)
                arm.pop("engine", None)
    found += config_errors(repaired, root, skip=rejected)
    if not rejected & {"arms", "load"}:
        found += check_slots(normalized(repaired))
    return found


def _drop(config: dict, path: tuple) -> None:
    node = config
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, dict) else None
    if isinstance(node, dict):
        node.pop(path[-1], None)


def report(found: list[ConfigError], sources: Sources) -> str:
    """The message a user sees: one line per problem, ``<file>:<line>: <key>: <what>``."""
    n = len(found)
    lines = [f"pairbench: {n} config error{'s' if n != 1 else ''} (nothing was run):"]
    located = [(sources.locate(err.key), err) for err in found]
    order = {name: i for i, (name, _) in enumerate(sources.files)}

    cli = list(sources.cli)

    def position(item):  # file by file as the sources come, top to bottom; then --config in its order
        where = item[0]
        name, _, line = where.rpartition(":")
        if line.isdigit() and name in order:
            return (order[name], int(line))
        if where.startswith("--config ") and where[len("--config "):] in cli:
            return (len(order), cli.index(where[len("--config "):]))
        return (order.get(where, len(order)), 0)

    for where, err in sorted(located, key=position):
        lines.append(f"  {where}: {err}{_cli_hint(err, where)}")
    return "\n".join(lines)


def _cli_hint(err: ConfigError, where: str) -> str:
    """How to write a list or a map on the command line, where one was expected and a string came."""
    if not where.startswith("--config ") or "is not of type" not in str(err):
        return ""
    key = key_text(err.key[:1])
    if "'array'" in str(err):
        return f' (write a list as --config "{key}=[256, 1024]", quoted)'
    if "'object'" in str(err):
        return f' (write a map as --config "{key}={{a: 1, b: 2}}", quoted)'
    return ""


def display_path(path: str | Path) -> str:
    """*path* relative to the working directory when it lies below it (as the user typed it, usually)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return os.fspath(path)


def load_files(files: list[str | Path], cli: dict | None = None) -> tuple[dict, Sources]:
    """The config that *files* (merged in order, as Snakemake merges ``--configfile``s) and the
    ``--config`` pairs *cli* make, and its :class:`Sources`. A YAML syntax error is a
    :class:`pairbench.core.configsource.YamlSyntaxError` naming the file and line."""
    config: dict = {}
    for f in files:
        data, _ = load_with_lines(f)
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(f"config: {display_path(f)} is not a map of keys (it holds a {type(data).__name__})")
        config = _merged(config, data)
    cli = dict(cli or {})
    return with_cli(config, cli), Sources.read([display_path(f) for f in files], cli)
