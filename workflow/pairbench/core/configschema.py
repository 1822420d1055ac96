"""The config schema (workflow/schemas/config.schema.yaml): the one place a key's type, range and
default are written, read here once.

- :func:`schema_errors`: every violation, one :class:`~pairbench.core.configsource.ConfigError` per
  culprit (each unknown key, each missing required key), carrying its key path; the message names
  the key as ``config key 'a.b': ...``;
- :func:`with_defaults`: a config with every default the schema states filled in, nested sections,
  each arm (``additionalProperties``) and the shape a ``oneOf`` value has (``rounds`` as a map)
  included. A section whose keys state no default of their own takes it from the section's default
  map (``resources.measure``: ``{cpus: 2, mem_mb: 4096, runtime_min: 5}``). A null where the schema's
  default is a map stands for that map;
- :func:`defaults`: the defaults of one section (``defaults("load")``), which the code that reads a
  section uses instead of a table of its own.

Filling defaults is not validating: :func:`pairbench.stages.runconfig.load_config` runs the schema
once (:func:`schema_errors`) and fills the defaults of a config that passed it.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

from pairbench.core.configsource import ConfigError

SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "config.schema.yaml"


@functools.lru_cache(maxsize=8)
def _read(path: str) -> dict:
    return yaml.safe_load(Path(path).read_text(encoding="utf-8"))


def schema(path: str | Path = SCHEMA) -> dict:
    """The schema at *path*, read once per process (a copy: callers may not change the cached one)."""
    return copy.deepcopy(_read(str(path)))


# ------------------------------------------------------------------------------------------ defaults

def _resolve(node: dict, root: dict) -> dict:
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{k: v for k, v in node.items() if k != "$ref"}}


_TYPES = {"object": dict, "array": list, "string": str, "null": type(None), "boolean": bool}


def _shape_of(value: Any, branches: list[dict]) -> dict | None:
    """The ``oneOf`` branch whose ``type`` the value has (``rounds``: an integer or a map)."""
    for b in branches:
        t = b.get("type")
        if isinstance(t, str) and t in _TYPES and isinstance(value, _TYPES[t]):
            return b
    return None


def _fill(value: Any, node: dict, root: dict) -> Any:
    node = _resolve(node, root)
    if value is None and isinstance(node.get("default"), dict):
        value = {}
    if not isinstance(value, dict):
        return value
    if "oneOf" in node:
        branch = _shape_of(value, node["oneOf"])
        return _fill(value, branch, root) if branch else value
    props = node.get("properties") or {}
    parent = node.get("default") if isinstance(node.get("default"), dict) else {}
    for key, sub in props.items():
        sub = _resolve(sub, root)
        if key in value or key in node.get("required", ()):  # a required key has no default (arms)
            continue
        if "default" in sub:
            value[key] = copy.deepcopy(sub["default"])
        elif key in parent:
            value[key] = copy.deepcopy(parent[key])
    for key in list(value):
        if key in props:
            value[key] = _fill(value[key], props[key], root)
        elif isinstance(node.get("additionalProperties"), dict):
            value[key] = _fill(value[key], node["additionalProperties"], root)
    return value


def with_defaults(config: dict, path: str | Path = SCHEMA) -> dict:
    """A deep copy of *config* with every default of the schema at *path* filled in (module doc)."""
    root = _read(str(path))
    return _fill(copy.deepcopy(dict(config)), root, root)


def defaults(*section: str, path: str | Path = SCHEMA) -> dict:
    """The defaults of the config section at *section* (``defaults("load")``, ``defaults("arms", "*")``
    for one arm; ``defaults()`` the top level's), as :func:`with_defaults` fills them into ``{}``."""
    root = _read(str(path))
    node = root
    for key in section:
        node = _resolve(node, root)
        node = node["additionalProperties"] if key == "*" else node["properties"][key]
    return _fill({}, node, root)


# ------------------------------------------------------------------------------------------- errors

def schema_check(config: dict, path: str | Path = SCHEMA) -> None:
    """Raise the first :class:`ConfigError` of :func:`schema_errors` (a study's section, say)."""
    errors = schema_errors(config, path)
    if errors:
        raise errors[0]


def schema_errors(config: dict, path: str | Path = SCHEMA) -> list[ConfigError]:
    """Every schema violation of *config*, one :class:`ConfigError` per culprit (each unknown key,
    each missing required key), shallowest key first."""
    import jsonschema

    errors = sorted(jsonschema.Draft202012Validator(_read(str(path))).iter_errors(config),
                    key=lambda e: (len(e.absolute_path), list(map(str, e.absolute_path))))
    out: list[ConfigError] = []
    for error in errors:
        for found in _errors(error):
            if str(found) not in {str(o) for o in out}:
                out.append(found)
    return out


def _errors(error: Any) -> list[ConfigError]:
    """One error per culprit: an unknown key each, a missing required key each, else one."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict) and error.schema.get("properties"):
        allowed = sorted(error.schema["properties"])
        return [ConfigError((*path, k), f"unknown key (allowed: {', '.join(allowed)})", schema=True, rule="unknown")
                for k in sorted(k for k in error.instance if k not in allowed)]
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [k for k in error.validator_value if k not in error.instance]
        return [ConfigError((*path, k), "missing; it has no default"
                            + (" (the arms to compare, e.g. arms: {baseline: {}, candidate: {patches: [my.patch]}})"
                               if (*path, k) == ("arms",) else ""), schema=True, rule="required")
                for k in missing]
    return [schema_error(error)]


def format_schema_error(error: Any) -> str:
    """A jsonschema ValidationError as ``config key 'a.b': message`` (:func:`schema_error`'s text)."""
    return str(schema_error(error))


def schema_error(error: Any) -> ConfigError:
    """A jsonschema ValidationError as a :class:`ConfigError` at its key.

    For a key that takes one of several shapes (``rounds``: an integer or {min, max,
    target_halfwidth}), the error is the one of the shape the value has, not "not valid under any
    of the given schemas"."""
    path = tuple(error.absolute_path)
    if error.validator == "oneOf" and error.context:
        branches: dict = {}
        for e in error.context:
            branches.setdefault(e.relative_schema_path[0], []).append(e)
        # the branch of the value's own shape: no type error at the key itself
        shaped = [errs for errs in branches.values()
                  if not any(e.validator == "type" and len(e.absolute_path) == len(path) for e in errs)]
        if shaped:
            return schema_error(max(shaped[0], key=lambda e: len(e.absolute_path)))
        types = " or ".join(repr(e.validator_value) for errs in branches.values() for e in errs if e.validator == "type")
        return ConfigError(path, f"{error.instance!r} is not of type {types}", schema=True, rule="type")
    if path == ("label",) and error.validator == "pattern":
        return ConfigError(path, f"{error.instance!r} is not a label: letters, digits and _ . - only, starting "
                           "with a letter or digit (it names the folder results/<label>/)", schema=True, rule="pattern")
    if path == ("arms",) and error.validator == "minProperties":
        arms = list(error.instance)
        return ConfigError(path, f"a paired benchmark needs at least two arms, got {len(arms)} "
                           f"({', '.join(arms) or 'none'})", schema=True, rule="minProperties")
    if error.validator == "additionalProperties" and isinstance(error.instance, dict) and error.schema.get("properties"):
        unknown = sorted(k for k in error.instance if k not in error.schema["properties"])
        return ConfigError((*path, unknown[0]), f"unknown key (allowed: {', '.join(sorted(error.schema['properties']))})",
                           schema=True, rule="unknown")
    return ConfigError(path, error.message, schema=True, rule=error.validator)
