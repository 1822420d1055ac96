"""Where each config key came from: the file and line of every key, YAML syntax errors, ``--config``.

A config is assembled from sources, later ones winning: the config files (``config/config.yaml``,
or every ``--configfile`` in order), then ``--config key=value`` pairs. An error about a key is
only useful if it says where to fix it, so :class:`Sources` maps a key path such as
``("arms", "candidate", "patches", 0)`` to ``config/my.yaml:7`` or ``--config arms``. Lines come
from PyYAML's composer (the node tree keeps each node's position), so nothing beyond PyYAML is
needed.

``--config`` values: Snakemake parses each as an int, a float, True/False, or else YAML with
PyYAML's BaseLoader, whose scalars are all strings, so ``--config "lengths=[256, 9000]"`` gives
``["256", "9000"]``. :func:`coerce_cli` reads the strings inside such lists and maps as YAML 1.2's
core schema would (integers, floats, true/false, null), and leaves every other string alone.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

Key = tuple  # a key path: str for a mapping key, int for a list index


def key_text(path: Key) -> str:
    """``("arms", "candidate", "patches", 0)`` → ``arms.candidate.patches[0]``."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<root>"


_KEY_PART = re.compile(r"\.?([^.\[\]]+)|\[(\d+)\]")


def parse_key(text: str) -> Key:
    """The inverse of :func:`key_text`; ``lengths.1`` (jsonschema's spelling) is ``("lengths", 1)``."""
    out: list = []
    for m in _KEY_PART.finditer(text):
        if m.group(2) is not None:
            out.append(int(m.group(2)))
        else:
            out.append(int(m.group(1)) if m.group(1).isdigit() else m.group(1))
    return tuple(out)


class ConfigError(ValueError):
    """A config that cannot run: the key at fault, what is wrong with it, and (once located against
    the config's :class:`Sources`) the file and line, or ``--config``, where that key was given.

    *key* is a key path (``("arms", "b", "patches", 0)``) or its text (``arms.b.patches[0]``); ``()``
    is the whole config. The message reads ``<key>: <message>``, or, for a schema violation
    (*schema*), ``config key '<a.b>': <message>`` as jsonschema spells the path. *rule* says which
    check found it where another check must know (``unknown``: a key the schema does not allow).
    Nothing ever reads a key back out of the message text.
    """

    def __init__(self, key: Key | str, message: str, *, schema: bool = False, rule: str | None = None,
                 where: str | None = None):
        self.key: Key = parse_key(key) if isinstance(key, str) else tuple(key)
        self.message, self.schema, self.rule, self.where = message, schema, rule, where
        super().__init__(self._text())

    def _text(self) -> str:
        if self.schema:
            return f"config key '{'.'.join(map(str, self.key)) or '<root>'}': {self.message}"
        return f"{key_text(self.key)}: {self.message}" if self.key else self.message

    def located(self, sources: "Sources") -> "ConfigError":
        """This error with ``where`` set to where *sources* say its key was given."""
        return ConfigError(self.key, self.message, schema=self.schema, rule=self.rule,
                           where=sources.locate(self.key))

    def __reduce__(self):  # pickled (Snakemake's subprocesses) with its fields, not its text
        return (_config_error, (self.key, self.message, self.schema, self.rule, self.where))


def _config_error(key, message, schema, rule, where) -> ConfigError:
    return ConfigError(key, message, schema=schema, rule=rule, where=where)


class ConfigErrors(ValueError):
    """Every reason a config cannot run, each located; its text is the report a user sees
    (``pairbench: 2 config errors (nothing was run):`` and one ``<file>:<line>: <error>`` line each)."""

    def __init__(self, errors: list[ConfigError], sources: "Sources"):
        self.errors, self.sources = list(errors), sources
        super().__init__(report(self.errors, sources))


def report(found: list[ConfigError], sources: "Sources") -> str:
    """The message a user sees: one line per problem, ``<file>:<line>: <key>: <what>``, file by file
    as the sources come and top to bottom, then ``--config`` in its order."""
    n = len(found)
    lines = [f"pairbench: {n} config error{'s' if n != 1 else ''} (nothing was run):"]
    order = {name: i for i, (name, _) in enumerate(sources.files)}
    cli = list(sources.cli)

    def position(err: ConfigError):
        name, _, line = err.where.rpartition(":")
        if line.isdigit() and name in order:
            return (order[name], int(line))
        if err.where.startswith("--config ") and err.where[len("--config "):] in cli:
            return (len(order), cli.index(err.where[len("--config "):]))
        return (order.get(err.where, len(order)), 0)

    located = [e if e.where is not None else e.located(sources) for e in found]
    for err in sorted(located, key=position):
        lines.append(f"  {err.where}: {err}{_cli_hint(err)}")
    return "\n".join(lines)


def _cli_hint(err: ConfigError) -> str:
    """How to write a list or a map on the command line, where one was expected and a string came."""
    if not (err.where or "").startswith("--config ") or err.rule != "type":
        return ""
    key = key_text(err.key[:1])
    if "'array'" in err.message:
        return f' (write a list as --config "{key}=[256, 1024]", quoted)'
    if "'object'" in err.message:
        return f' (write a map as --config "{key}={{a: 1, b: 2}}", quoted)'
    return ""


class YamlSyntaxError(ValueError):
    """A config file that is not YAML; the message is ``file:line:column: problem``."""


def yaml_syntax_error(path: str | Path) -> str | None:
    """``file:line:column: YAML syntax error: <problem>`` if *path* is not valid YAML, else None.

    Snakemake's own message ("Config file is not valid JSON or YAML") names neither."""
    try:
        load_with_lines(path)
    except YamlSyntaxError as exc:
        return str(exc)
    return None


def load_with_lines(path: str | Path) -> tuple[Any, dict[Key, int]]:
    """``(data, {key path: 1-based line})`` of one YAML file; raises :class:`YamlSyntaxError`."""
    text = Path(path).read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        opened = ""
        if exc.context and exc.context_mark and exc.context_mark is not mark:
            opened = f" ({exc.context} opened at line {exc.context_mark.line + 1}, column {exc.context_mark.column + 1})"
        raise YamlSyntaxError(f"{where}: YAML syntax error: {exc.problem or exc.context}{opened}") from None
    except yaml.YAMLError as exc:
        raise YamlSyntaxError(f"{path}: YAML syntax error: {exc}") from None
    lines: dict[Key, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def _walk(node: yaml.Node, path: Key, lines: dict[Key, int]) -> None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            sub = (*path, key_node.value)
            lines[sub] = key_node.start_mark.line + 1
            _walk(value_node, sub, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            lines[(*path, i)] = item.start_mark.line + 1
            _walk(item, (*path, i), lines)


_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")


def _scalar(text: str) -> Any:
    """A BaseLoader string read as YAML 1.2's core schema reads a plain scalar."""
    if _INT.fullmatch(text):
        return int(text)
    if _FLOAT.fullmatch(text):
        return float(text)
    if text in ("true", "True", "TRUE", "false", "False", "FALSE"):
        return text.lower() == "true"
    if text in ("null", "Null", "NULL", "~"):
        return None
    return text


def coerce_cli(value: Any) -> Any:
    """Strings inside a ``--config`` list or map read as numbers, booleans and nulls (see module doc).

    A top-level string is left as Snakemake parsed it (``--config label=007`` is Snakemake's 7)."""
    if isinstance(value, dict) or hasattr(value, "items"):
        return {k: _coerce_inner(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_coerce_inner(v) for v in value]
    return value


def _coerce_inner(value: Any) -> Any:
    if isinstance(value, str):
        return _scalar(value)
    return coerce_cli(value)


def _holds(cli: dict, path: Key) -> bool:
    """Whether the ``--config`` pairs set *path*: a map given there is merged key by key into the
    files' map, anything else replaces the files' value whole."""
    node: Any = cli
    for part in path:
        if not isinstance(node, dict):
            return True
        if part not in node:
            return False
        node = node[part]
    return True


@dataclass
class Sources:
    """The config's sources, lowest precedence first: files (with their key lines), then ``--config``."""

    files: list[tuple[str, dict[Key, int]]] = field(default_factory=list)
    cli: dict = field(default_factory=dict)
    context: str = ""  # e.g. "comparison aa" in a study, where no file holds the merged config

    @classmethod
    def read(cls, files: list[str | Path], cli: dict | None = None, context: str = "") -> "Sources":
        """Sources of config *files* (unreadable ones get no lines) and the ``--config`` pairs *cli*."""
        out = []
        for f in files:
            try:
                out.append((str(f), load_with_lines(f)[1]))
            except (OSError, YamlSyntaxError):
                out.append((str(f), {}))
        return cls(out, dict(cli or {}), context)

    def describe(self) -> str:
        """``config/my.yaml, --config lengths rounds``: the sources in one phrase."""
        parts = [name for name, _ in self.files] + ([f"--config {' '.join(self.cli)}"] if self.cli else [])
        return ", ".join(parts) or self.context

    def locate(self, path: Key) -> str:
        """``file:line`` of the source *path* (or its nearest given parent) came from; ``--config key``
        when the command line set it; the last file's name when no source holds it (a default)."""
        if path and _holds(self.cli, path):
            return f"--config {path[0]}"
        best, best_len = None, -1
        for name, lines in self.files:
            for n in range(len(path), 0, -1):
                if path[:n] in lines:
                    if n >= best_len:  # a later file wins ties: it overrode the earlier one
                        best, best_len = f"{name}:{lines[path[:n]]}", n
                    break
        if best is not None:
            return best
        return self.files[-1][0] if self.files else (self.context or "config")
