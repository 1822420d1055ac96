"""A study config → one run config per comparison.

A study (``study:`` in the config, schema workflow/schemas/study.schema.yaml) names comparisons.
Each is a full config file (``config:``) or the study's ``base:``, with ``overrides`` merged in
(mappings key by key, anything else replaced). The comparison's name is its label, so each gets its
own ``results/<name>/``; every resolved config is then checked like a run's own (common.smk).
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import yaml
from snakemake.utils import update_config

from pairbench.core.configschema import schema_check
from pairbench.core.configsource import ConfigError


def study_section(config: dict, schema: Path) -> dict:
    """The ``study:`` section of a study file, schema-checked (errors name the key), defaults filled."""
    schema_check(config, schema)
    return {"name": "study", "base": None, **config["study"]}


def merged(base: dict, overrides: dict) -> dict:
    """*base* with *overrides* merged in (Snakemake's own ``update_config``, as for --config): a
    mapping key by key, anything else replaced; neither argument is changed."""
    out = copy.deepcopy(base)
    update_config(out, copy.deepcopy(overrides))
    return out


def _load(path: str, root: Path, key: str) -> dict:
    file = root / path
    if not file.is_file():
        raise ConfigError(key, f"config file {path} does not exist")
    return yaml.safe_load(file.read_text()) or {}


def comparison_configs(study: dict, root: Path) -> dict[str, dict]:
    """{name: run config} of every comparison of *study* (the ``study:`` section), in study order."""
    out = {}
    for name, spec in study["comparisons"].items():
        key = f"study.comparisons.{name}"
        if name == study["name"]:
            raise ConfigError(key, f"the study's own name; results/{name}/ holds the study's index page")
        spec = spec or {}
        if "config" in spec:
            base = _load(spec["config"], root, f"{key}.config")
        elif study.get("base"):
            base = _load(study["base"], root, "study.base")
        else:
            raise ConfigError(key, f"names no config and the study has no base")
        overrides = spec.get("overrides") or {}
        if "label" in overrides:
            raise ConfigError(f"{key}.overrides.label", f"a comparison's label is its name ({name})")
        out[name] = {**merged(base, overrides), "label": name}
    return out


def module_names(names: list[str]) -> dict[str, str]:
    """{comparison: Snakemake module name}: a Python identifier (``tiny-a`` → ``tiny_a``), unique."""
    out: dict[str, str] = {}
    for name in names:
        mod = re.sub(r"\W", "_", name)
        if mod in out.values():
            other = next(n for n, m in out.items() if m == mod)
            raise ConfigError(("study", "comparisons", name), f"its module name {mod} is also {other}'s; rename one")
        out[name] = mod
    return out
