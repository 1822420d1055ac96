"""Functional validation cases applied to every steady record's output.

The pipeline's ``validate/r<NN>-<arm>.json`` stage calls :func:`run_cases` once per steady record
with the record (docs/contracts.md §2), the private output (``{"text", "token_ids"}``), the
fixture (``input_tokens``, ``output_tokens``, ``task``) and, for the candidate arm, the baseline arm's
output for the same fixture in the same round. Each case gives ``pass | fail | timeout | skipped``
with a reason; :func:`is_selected` says whether the record may enter the statistics.

Cases (``CASES``):

- ``token_counts``: the native counters equal the plan (``prompt_tokens == input_tokens``,
  ``completion_tokens == output_tokens``, and the private output holds that many token ids).
- ``done_marker``: :func:`extract_function` finds a complete definition of the task's function.
- ``python_function``: that function compiles and passes the task's tests in the sandbox
  (``pairbench.validate.sandbox``); a sandbox timeout is the verdict ``timeout``, never an exception.
  The verdict records which of the sandbox's isolation layers applied to that run and which were
  missing (``isolation``: ``{"applied": [...], "missing": [...]}``).
- ``matches_baseline``: the candidate's greedy token ids against the baseline's. ``agreement`` is
  the length of the common prefix divided by the longer sequence's length (1.0 = identical). After
  the first divergence a greedy decoder conditions on different text, so positions past it are
  not comparable and count as disagreement. Passes when identical, or when ``agreement >=
  options["min_agreement"]`` (default 1.0: exact). Fails when neither output holds a token id
  (nothing was compared). The baseline arm (``baseline_output is None``) is ``skipped``.

See docs/validation.md for the task catalogue, the sandbox and the evidence behind both.
"""

from __future__ import annotations

import ast
import hashlib
import re
import textwrap

from pairbench.validate import sandbox
from pairbench.core import tasks

CASES: tuple[str, ...] = ("token_counts", "done_marker", "python_function", "matches_baseline")
VERDICTS: tuple[str, ...] = ("pass", "fail", "timeout", "skipped")

DEFAULT_OPTIONS = {
    "min_agreement": 1.0,
    "timeout_s": 5.0,
    "cpu_s": 5,
    "mem_bytes": 512 << 20,
    "max_output_bytes": 64 << 10,
}

_FENCE = re.compile(r"^\s*(```|~~~)")
_CHAT_TOKEN = re.compile(r"<\|[a-z_]+\|>|</?s>")
_IMPORT = re.compile(r"^(import\s+\w|from\s+[\w.]+\s+import\s)")


def sha256_text(text: str) -> str:
    """sha256 of *text* as UTF-8: the ``output_sha256`` of a record."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- the completion parser ---------------------------------------------------------------------


def _segments(text: str) -> list[tuple[list[str], bool]]:
    """Split *text* into runs of lines separated by code fences and chat-template markers.

    Returns ``(lines, closed)`` pairs: *closed* is true when a fence (```python, ```, ~~~) or a
    chat marker (<|im_end|>) ends the run. A function is never read across a fence; an
    unterminated final fence (output cut by the token cap) leaves the last run open.
    """
    segments: list[tuple[list[str], bool]] = []
    current: list[str] = []
    for raw in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        if _CHAT_TOKEN.search(raw):
            # <|im_start|>assistant, <|im_end|>: formatting, never code. Keep what precedes it.
            head = _CHAT_TOKEN.split(raw)[0]
            if head.strip():
                current.append(head.expandtabs(4))
        elif not _FENCE.match(raw):
            current.append(raw.expandtabs(4))
            continue
        segments.append((current, True))
        current = []
    segments.append((current, False))
    return [(lines, closed) for lines, closed in segments if lines]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _is_stub(node: ast.FunctionDef) -> bool:
    """True when the body is only a docstring, ``pass`` or ``...``: the echoed signature."""
    for stmt in node.body:
        if isinstance(stmt, ast.Pass):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and (
            isinstance(stmt.value.value, str) or stmt.value.value is Ellipsis
        ):
            continue
        return False
    return True


def _function_at(lines: list[str], start: int, entry_point: str, closed: bool) -> str | None:
    """The complete function whose ``def`` is ``lines[start]``, or None.

    The block is the def line plus every following line that is blank or indented deeper. It is
    *complete* when something ends it: a dedented line, or the end of its segment when a fence or
    chat marker closes that segment (*closed*). If it runs to the very end of the output it is
    complete only when its last non-blank line is a comment: the model had moved on to the comments
    it was asked to write. A block cut off mid-statement is never taken for a finished function.
    """
    base = _indent(lines[start])
    end = start + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > base):
        end += 1
    block = lines[start:end]
    while block and not block[-1].strip():
        block.pop()
    ended = end < len(lines) or closed
    # Imports at the def's indentation above it belong with it (e.g. ``import math``).
    header = [ln for ln in lines[:start] if _indent(ln) == base and _IMPORT.match(ln.strip())]
    return _complete(header, block, entry_point, ended)


def _complete(header: list[str], block: list[str], entry_point: str, ended: bool) -> str | None:
    if not ended and not block[-1].strip().startswith("#"):
        return None
    source = textwrap.dedent("\n".join(block)) + "\n"
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    funcs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry_point]
    if len(tree.body) != 1 or not funcs or _is_stub(funcs[0]):
        return None
    if header:
        head = textwrap.dedent("\n".join(header)) + "\n"
        try:
            ast.parse(head)
            source = head + source
        except SyntaxError:
            pass
    return source


def extract_function(text: str, entry_point: str) -> str | None:
    """The source of the first complete definition of ``entry_point`` in a model's output, or None.

    Tolerates chat-template markers, fenced code (```python … ```, closed or cut off), prose before
    and after, trailing comments and output truncated by the token cap. The returned source parses
    with ``ast``, defines ``entry_point`` with a real body (not only a docstring/``pass``), and
    carries any imports that sat directly above it.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be str, got {type(text).__name__}")
    if not entry_point.isidentifier():
        raise ValueError(f"entry_point {entry_point!r} is not a Python identifier")
    def_line = re.compile(rf"^\s*(async\s+)?def\s+{re.escape(entry_point)}\s*\(")
    segments = _segments(text)
    for lines, closed in segments:
        for j, line in enumerate(lines):
            if def_line.match(line):
                found = _function_at(lines, j, entry_point, closed)
                if found is not None:
                    return found
    return None


# --- the cases ---------------------------------------------------------------------------------


def _verdict(verdict: str, reason: str, **extra) -> dict:
    return {"verdict": verdict, "reason": reason, **extra}


def _require(mapping: dict, keys: tuple[str, ...], what: str) -> None:
    if not isinstance(mapping, dict):
        raise ValueError(f"{what} must be a dict, got {type(mapping).__name__}")
    missing = [k for k in keys if k not in mapping]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(repr(k) for k in missing)}")


def _token_ids(output: dict, what: str) -> list[int]:
    ids = output.get("token_ids")
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise ValueError(f"{what}['token_ids'] must be a list of int")
    return ids


def case_token_counts(record: dict, output: dict, fixture: dict) -> dict:
    """Native counters equal the plan, and the private output holds the planned number of ids."""
    problems = []
    if record["prompt_tokens"] != fixture["input_tokens"]:
        problems.append(f"prompt_tokens: got {record['prompt_tokens']}, planned {fixture['input_tokens']}")
    if record["completion_tokens"] != fixture["output_tokens"]:
        problems.append(
            f"completion_tokens: got {record['completion_tokens']}, planned {fixture['output_tokens']}"
        )
    ids = _token_ids(output, "output")
    if len(ids) != fixture["output_tokens"]:
        problems.append(f"token_ids: got {len(ids)}, planned {fixture['output_tokens']}")
    if problems:
        return _verdict("fail", "; ".join(problems))
    return _verdict("pass", f"prompt {fixture['input_tokens']} and completion {fixture['output_tokens']} "
                            "tokens as planned")


def case_done_marker(output: dict, task: tasks.Task) -> dict:
    """A complete definition of the task's function is in the output."""
    text = output.get("text")
    if not isinstance(text, str):
        raise ValueError("output['text'] must be a str")
    if not text.strip():
        return _verdict("fail", "empty output")
    if extract_function(text, task.entry_point) is None:
        return _verdict("fail", f"no complete definition of {task.entry_point}() in the output")
    return _verdict("pass", f"complete definition of {task.entry_point}() found")


def case_python_function(output: dict, task: tasks.Task, options: dict) -> dict:
    """The extracted function compiles and passes the task's tests in the sandbox."""
    text = output.get("text")
    if not isinstance(text, str):
        raise ValueError("output['text'] must be a str")
    source = extract_function(text, task.entry_point)
    if source is None:
        return _verdict("fail", f"no complete definition of {task.entry_point}() to test")
    result = sandbox.run_python_tests(
        source, task.tests, timeout_s=options["timeout_s"], cpu_s=options["cpu_s"],
        mem_bytes=options["mem_bytes"], max_output_bytes=options["max_output_bytes"],
    )
    verdict = result["verdict"]
    if verdict == "error":  # the sandbox could not run: not the engine's fault, but not a pass
        verdict = "fail"
        reason = f"sandbox error: {result['reason']}"
    else:
        reason = result["reason"]
    isolation = {"applied": list(result["isolation"]), "missing": sandbox.missing_layers(result["isolation"])}
    return _verdict(verdict, reason, duration_s=result["duration_s"], isolation=isolation)


def agreement(candidate: list[int], baseline: list[int]) -> float:
    """Common-prefix length over the longer sequence's length; 1.0 iff identical (both empty: 1.0)."""
    longest = max(len(candidate), len(baseline))
    if longest == 0:
        return 1.0
    prefix = 0
    for a, b in zip(candidate, baseline):
        if a != b:
            break
        prefix += 1
    return prefix / longest


def case_matches_baseline(output: dict, baseline_output: dict | None, options: dict) -> dict:
    """The candidate's greedy token ids against the baseline's for the same fixture and round."""
    if baseline_output is None:
        return _verdict("skipped", "this is the baseline arm (or no baseline output to compare)")
    cand = _token_ids(output, "output")
    base = _token_ids(baseline_output, "baseline_output")
    if not cand and not base:  # agreement 1.0 by definition, but nothing was compared
        return _verdict("fail", "nothing to compare: neither output holds a token id")
    value = agreement(cand, base)
    first = next((i for i, (a, b) in enumerate(zip(cand, base)) if a != b), min(len(cand), len(base)))
    extra = {"agreement": round(value, 6), "first_divergence": None if value == 1.0 else first}
    if value == 1.0:
        return _verdict("pass", f"identical to the baseline ({len(cand)} tokens)", **extra)
    minimum = options["min_agreement"]
    detail = (f"agreement {value:.4f} (first divergence at token {first} of "
              f"{max(len(cand), len(base))}), minimum {minimum:g}")
    return _verdict("pass" if value >= minimum else "fail", detail, **extra)


def _options(options: dict | None) -> dict:
    merged = dict(DEFAULT_OPTIONS)
    for key, value in (options or {}).items():
        if key not in DEFAULT_OPTIONS:
            raise ValueError(f"unknown validate option {key!r} (known: {', '.join(DEFAULT_OPTIONS)})")
        merged[key] = value
    m = merged["min_agreement"]
    if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0.0 <= m <= 1.0:
        raise ValueError(f"validate option 'min_agreement' must be a number in [0, 1], got {m!r}")
    return merged


def run_cases(
    cases: list[str],
    *,
    record: dict,
    output: dict,
    fixture: dict,
    baseline_output: dict | None,
    options: dict | None = None,
) -> dict[str, dict]:
    """Apply each named case to one steady record; returns ``{case: {"verdict", "reason", ...}}``.

    Raises ValueError for an unknown case name or malformed input (naming it); never for anything
    the model's output or its code does.
    """
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        raise ValueError(f"unknown validation case {unknown[0]!r} (known: {', '.join(CASES)})")
    opts = _options(options)
    _require(output, ("text", "token_ids"), "output")
    _require(fixture, ("input_tokens", "output_tokens", "task"), "fixture")
    try:
        task = tasks.get_task(fixture["task"])
    except KeyError as exc:
        raise ValueError(f"fixture['task']: {exc.args[0]}") from None
    verdicts: dict[str, dict] = {}
    for case in cases:
        if case == "token_counts":
            _require(record, ("prompt_tokens", "completion_tokens"), "record")
            verdicts[case] = case_token_counts(record, output, fixture)
        elif case == "done_marker":
            verdicts[case] = case_done_marker(output, task)
        elif case == "python_function":
            verdicts[case] = case_python_function(output, task, opts)
        elif case == "matches_baseline":
            verdicts[case] = case_matches_baseline(output, baseline_output, opts)
    return verdicts


def is_selected(verdicts: dict[str, dict]) -> bool:
    """A record is selected iff every configured case passed or was skipped (and none is missing)."""
    if not isinstance(verdicts, dict):
        raise ValueError("verdicts must be a dict of case -> verdict")
    return all(
        isinstance(v, dict) and v.get("verdict") in ("pass", "skipped") for v in verdicts.values()
    )


def record_entry(record: dict, fixture: dict, verdicts: dict[str, dict]) -> dict:
    """One ``records[]`` entry of the validate artifact (``validate.schema.json``): verdicts (with
    the sandbox's isolation layers for ``python_function``), the output's sha256 and the
    selection, never the output text."""
    _require(record, ("condition", "output_sha256"), "record")
    clean = {}
    for case, v in verdicts.items():
        entry = {"verdict": v["verdict"], "reason": str(v.get("reason", ""))[:1000]}
        for key in ("agreement", "first_divergence", "duration_s", "isolation"):
            if key in v:
                entry[key] = v[key]
        clean[case] = entry
    selected = is_selected(clean)
    return {
        "condition": record["condition"],
        "task": fixture["task"],
        "output_sha256": record["output_sha256"],
        "selected": selected,
        "excluded_because": [] if selected else [
            f"{case}: {v['verdict']}: {v['reason']}"[:1000]
            for case, v in clean.items() if v["verdict"] not in ("pass", "skipped")
        ],
        "verdicts": clean,
    }
