"""The one helper every Snakemake script calls: logging into the job's log, then the stage function
called with keyword arguments named after the rule's inputs, outputs, params and logs.

A rule's names are the stage function's signature: ``input.plan`` → ``plan=``, ``output.measure`` →
``measure=``, ``params.server`` → ``server=``, ``log.server`` → ``server_log=``,
``resources.attempt`` → ``attempt=``. A file list arrives as ``list[str]``, a single file as ``str``.
Names the function does not take (ordering-only inputs such as ``previous``) are not passed; a name
the function needs and the rule lacks, or a name two sections of the rule share, is an error that
names both. So adding an input is one edit in the rule and one keyword in the function.

A parameter typed with a class that reads a rule's plain value (a ``from_rule`` classmethod) gets
that class: ``layout: Layout`` from ``params.layout=L.res`` (the run folder, so the stage reads every
path of the run from the one layout the rules use), ``options: StatsOptions`` from a config section.
A stage then takes a layout and a typed options object instead of a keyword per file and setting.
"""

from __future__ import annotations

import inspect
import logging
import sys
import typing
from typing import Callable


def _plain(value):
    if isinstance(value, (str, int, float, bool, dict)) or value is None:
        return value
    if isinstance(value, (list, tuple)):  # a snakemake Namedlist of files, or a plain list param
        return [_plain(v) for v in value]
    return value


def _named(section) -> dict:
    try:
        items = section.items()
    except AttributeError:
        return {}
    return {k: _plain(v) for k, v in items}


def job_kwargs(smk, fn: Callable) -> dict:
    """The keyword arguments of *fn* for Snakemake job *smk*, from the rule's names."""
    sources = {
        "input": _named(smk.input),
        "output": _named(smk.output),
        "params": _named(smk.params),
        "log": {f"{k}_log": v for k, v in _named(smk.log).items()},
        "resources": {k: v for k, v in _named(smk.resources).items() if k == "attempt"},
    }
    wanted = inspect.signature(fn).parameters
    kwargs, where = {}, {}
    for section, names in sources.items():
        for name, value in names.items():
            if name not in wanted:
                continue
            if name in kwargs:
                raise TypeError(f"rule {smk.rule}: {name!r} is named in both {where[name]} and {section}")
            kwargs[name], where[name] = value, section
    missing = [n for n, p in wanted.items() if p.default is inspect.Parameter.empty and n not in kwargs]
    if missing:
        raise TypeError(f"rule {smk.rule}: {fn.__module__}.{fn.__name__} needs {', '.join(missing)}, "
                        "which the rule does not name")
    return typed(fn, kwargs)


def typed(fn: Callable, kwargs: dict) -> dict:
    """*kwargs* with each value whose parameter is typed with a class that has ``from_rule`` read
    into that class (a rule passes plain values: a path, a dict)."""
    hints = typing.get_type_hints(fn)
    out = dict(kwargs)
    for name, value in kwargs.items():
        reader = getattr(hints.get(name), "from_rule", None)
        if reader is not None and not isinstance(value, hints[name]):
            out[name] = reader(value)
    return out


def run(smk, fn: Callable, *, progress: bool = False) -> None:
    """Run stage *fn* for Snakemake job *smk*: stderr and logging go to the job's log (``log.job``, or
    the rule's only log); with *progress*, the ``pairbench.progress`` lines also reach the console.
    A failure is also printed on the console, naming the rule and its wildcards."""
    logs = _named(smk.log)
    target = logs.get("job") or (list(smk.log)[0] if len(smk.log) else None)
    if target:
        sys.stderr = open(target, "w")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if progress:  # so a long visit visibly moves in the console Snakemake runs in
        console = logging.StreamHandler(sys.__stderr__)
        console.setFormatter(logging.Formatter("%(message)s"))
        logging.getLogger("pairbench.progress").addHandler(console)
    try:
        fn(**job_kwargs(smk, fn))
    except Exception as exc:
        wc = " ".join(str(v) for v in _named(smk.wildcards).values())
        print(f"{smk.rule}{f' {wc}' if wc else ''} FAILED: {exc}", file=sys.__stderr__)
        raise
