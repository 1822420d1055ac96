"""The CI shorthand: ``refs: {git, base, head, arm}`` makes the two arms of one engine at two git refs.

A pull request's benchmark is one engine at two commits. Instead of two arms that repeat everything
but the ref::

    arms:
      base: {engine: llama-server, threads: 1, source: {git: ../llama.cpp, ref: origin/main}}
      head: {engine: llama-server, threads: 1, source: {git: ../llama.cpp, ref: HEAD}}

a config (or the command line: ``--config "refs={base: <sha>, head: <sha>}"``) may say::

    refs: {git: ../llama.cpp, base: origin/main, head: HEAD, arm: {engine: llama-server, threads: 1}}

:func:`expand` writes the arms ``base`` (the baseline) and ``head`` (the candidate) from it, before
the config is checked, so every check and every stage sees ordinary arms. ``git`` defaults to
``.`` (this repository: the embedded engine's ``engine/`` at two commits) and ``arm`` to ``{}``
(the embedded engine). ``arms`` beside ``refs`` is an error: one config says which arms there are.
"""

from __future__ import annotations

import copy

KEY = "refs"
BASE, HEAD = "base", "head"
FIELDS = ("git", BASE, HEAD, "arm")


def expand(config: dict) -> tuple[dict, list[tuple[tuple, str]]]:
    """``(config, problems)``: *config* with ``refs`` turned into the arms ``base`` and ``head``
    (unchanged without ``refs``), and each problem as ``(key, message)`` (the message without its
    key); with a problem the config is returned as given, for the other checks to read."""
    refs = config.get(KEY)
    if refs is None:
        return config, []
    if not isinstance(refs, dict):
        return config, [((KEY,), f"give a map {{git, base, head, arm}}, got {refs!r}")]
    problems = []
    for key in sorted(set(refs) - set(FIELDS)):
        problems.append(((KEY, key), f"not a key of {KEY} ({', '.join(FIELDS)})"))
    for key in (BASE, HEAD):
        if not isinstance(refs.get(key), str) or not refs[key].strip():
            problems.append(((KEY, key), f"the {key} arm's branch, tag or commit is required"))
    git = refs.get("git", ".")
    if not isinstance(git, str) or not git:
        problems.append(((KEY, "git"), f"a repository path or URL, got {git!r}"))
    arm = refs.get("arm") or {}
    if not isinstance(arm, dict):
        problems.append(((KEY, "arm"), f"the keys both arms share (engine, threads, args, ...), got {arm!r}"))
    elif "source" in arm:
        problems.append(((KEY, "arm", "source"), f"each arm's source is {{git: {KEY}.git, ref: {KEY}.base or "
                                                  f"{KEY}.head}}"))
    if config.get("arms") is not None:
        problems.append(((KEY,), f"makes the arms {BASE} and {HEAD}; give {KEY} or arms, not both"))
    if problems:
        return config, problems
    out = {k: v for k, v in config.items() if k != KEY}
    out["arms"] = {name: {**copy.deepcopy(arm), "source": {"git": git, "ref": refs[name]}} for name in (BASE, HEAD)}
    out.setdefault("baseline", BASE)
    return out, []
