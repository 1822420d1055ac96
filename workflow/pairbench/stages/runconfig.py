"""A run's config, read once: :func:`load_config` reads it, checks it whole before any job (every
problem at once, each at its file and line), fills its defaults and normalizes it. Every consumer
(workflow/rules/common.smk, ``python -m pairbench plan``, a study's comparison) calls it and reads
its result; nothing else reads a config file or fills a default.

When there are problems it raises :class:`~pairbench.core.configsource.ConfigErrors`, whose text is
what a user sees, without a traceback:

    pairbench: 2 config errors (nothing was run):
      tests/config/bad.yaml:4: config key 'colour': unknown key (allowed: ...)
      tests/config/bad.yaml:9: lengths[1]: 3000 input + 8 output tokens (+16 margin) exceed ...

The checks (:func:`problems`) are the schema's, run once (every violation,
:func:`pairbench.core.configschema.schema_errors`), what a schema cannot say
(:func:`pairbench.core.config.config_errors`, skipping what reads a key the schema rejected) and each
arm's engine profile (:func:`pairbench.engines.policy.check_engines`, ``check_slots``). Each error
carries its key; where it was given is looked up from the key, never read from the message.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

from pairbench.core.config import TOP_DEFAULTS, ConfigError, config_errors, normalized
from pairbench.core.configschema import SCHEMA, schema_errors
from pairbench.core.configsource import ConfigErrors, Sources, YamlSyntaxError, coerce_cli, load_with_lines, report
from pairbench.core.models import resolve_model
from pairbench.core.refs import expand as expand_refs
from pairbench.engines.policy import check_engines, check_slots

__all__ = ["load_config", "read_config", "problems", "report", "with_cli", "display_path", "ConfigErrors", "SCHEMA"]
REPO = Path(__file__).resolve().parents[3]
DEFAULT_FILE = "config/config.yaml"


def load_config(files: list[str | Path] = (), cli: dict | None = None, *, root: str | Path = REPO,
                given: dict | None = None, sources: Sources | None = None) -> dict:
    """The run config of the config *files* (merged in order, as ``--configfile`` merges them) and
    the ``--config`` pairs *cli*: read, checked, defaulted and normalized
    (:func:`pairbench.core.config.normalized`); the CI shorthand ``refs`` is first made the arms
    ``base`` and ``head`` (:func:`pairbench.core.refs.expand`). *given* is a config already read (Snakemake's
    ``config``, a study's comparison), *sources* where it came from. Raises
    :class:`~pairbench.core.configsource.ConfigErrors` with every problem, each located; a file that
    is not YAML is one of them, at its line and column."""
    if given is None:
        given, sources = read_config(files, cli)
    else:
        sources = sources or Sources.read(files, cli)
        given = with_cli(given, sources.cli)
    given, shorthand = expand_refs(given)  # the CI shorthand refs: the arms base and head, checked as arms
    found = [ConfigError(key, message) for key, message in shorthand] or problems(given, Path(root))
    if found:
        raise ConfigErrors([e.located(sources) for e in found], sources)
    return normalized(given)


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
        if e.rule == "unknown":
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


def display_path(path: str | Path) -> str:
    """*path* relative to the working directory when it lies below it (as the user typed it, usually)."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return os.fspath(path)


def read_config(files: list[str | Path], cli: dict | None = None) -> tuple[dict, Sources]:
    """The config that *files* (merged in order, as Snakemake merges ``--configfile``s) and the
    ``--config`` pairs *cli* make, as given (no default filled), and its :class:`Sources`. A file that
    is not YAML, or not a map of keys, raises :class:`ConfigErrors` naming it (a YAML error at its
    line and column)."""
    config: dict = {}
    shown = [display_path(f) for f in files]
    cli = dict(cli or {})
    for f, name in zip(files, shown):
        try:
            data, _ = load_with_lines(f)
        except YamlSyntaxError as exc:
            where, _, what = str(exc).partition(": ")
            raise ConfigErrors([ConfigError((), what, where=where)], Sources.read(shown, cli)) from None
        except OSError as exc:
            raise ConfigErrors([ConfigError((), f"cannot be read ({exc.strerror})", where=name)],
                               Sources.read(shown, cli)) from None
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigErrors([ConfigError((), f"not a map of keys (it holds a {type(data).__name__})", where=name)],
                               Sources.read(shown, cli))
        config = _merged(config, data)
    return with_cli(config, cli), Sources.read(shown, cli)
