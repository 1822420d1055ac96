"""Fidelity of the native fast paths: each runs only where this tree's Python code is the code it
stands in for.

The engine has native stand-ins for parts of ``engine/model.py`` (the reference): the fused decode
block and the single-token attention kernel (``engine.kernels.FusedDecode``,
``Attention.decode_attention``: RMSNorm, the projections, RoPE, attention and the SwiGLU MLP in
``engine/csrc/kernels.cpp``), and the weight formats that replace ``Linear`` and ``Embedding``
(``engine.kernels.QuantLinear`` and friends). A patch to the Python code they replace would change
prefill but not decode (or nothing at all), and a benchmark would publish a verdict about code that
never ran. So the code each fast path was written against is recorded beside the kernels, in
``engine/csrc/fastpaths.json``: per fast path, the objects of ``engine/model.py`` it stands in for and
a fingerprint of each. At load (``engine.weights.build_model``) the tree's own objects are
fingerprinted and compared; where one differs, that fast path is off (``fused_decode: auto``), or the
load is refused (``on``).

A fingerprint is the sha256 of the object's syntax tree with docstrings dropped, written out by
``canonical`` below with the fields that are empty left out (so that the same code reads the same
on every Python that parses it). Comments, docstrings, blank lines and line wrapping change nothing;
any change to code does. The objects are read live from the imported module (``inspect``), so code
that rebinds one at import time (``FeedForward.forward = mine``) is seen as a change too.

A change to the model code that the kernels *do* follow (kernels.cpp changed to match) records the
new fingerprints: ``python -m engine fastpaths --record``; ``tests/engine/test_fastpaths.py`` keeps
the committed record true to the committed code.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import textwrap
from dataclasses import dataclass
from pathlib import Path

RECORD = Path(__file__).resolve().parent / "csrc" / "fastpaths.json"
RECORD_SCHEMA = "pairbench-engine.fastpaths/v1"
#: ``fused_decode`` settings: auto (a fast path runs where its code matches and it can run), on
#: (refuse to load unless every fast path runs), off (the Python decode path, whatever the code)
MODES = ("auto", "on", "off")
#: The environment's default for ``fused_decode`` where no argument gives one
ENV = "PAIRBENCH_ENGINE_FUSED_DECODE"


class FastPathRefused(ValueError):
    """``fused_decode: on`` where a fast path cannot run: the message names the cause (the object
    whose code differs, or why the native kernels cannot run)."""


def canonical(node) -> str:
    """A syntax tree as text: node type and its non-empty fields, recursively. Positions are not
    fields, so they never count; fields a newer Python added empty (``type_params``) are skipped."""
    if isinstance(node, ast.AST):
        parts = [f"{name}={canonical(value)}" for name, value in ast.iter_fields(node)
                 if value is not None and value != []]
        return f"{type(node).__name__}({','.join(parts)})"
    if isinstance(node, list):
        return "[" + ",".join(canonical(v) for v in node) + "]"
    return repr(node)


def _drop_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def fingerprint_source(source: str) -> str:
    """sha256 (16 hex digits) of a definition's code, comments and docstrings aside."""
    tree = _drop_docstrings(ast.parse(textwrap.dedent(source)))
    return hashlib.sha256(canonical(tree).encode()).hexdigest()[:16]


def _live(module, name: str):
    """The object ``name`` (``Block.forward``, ``Attention``, ``apply_rope``) of ``module``, as it is
    bound now; None when the module has no such object."""
    obj = module
    for part in name.split("."):
        obj = (vars(obj).get(part) if inspect.isclass(obj) else getattr(obj, part, None))
        if obj is None:
            return None
    return obj


def _rebound(cls) -> list[str]:
    """Methods of ``cls`` not defined in its own class statement (bound from outside at run time)."""
    out = []
    for name, value in vars(cls).items():
        fn = getattr(value, "__func__", value)
        if inspect.isfunction(fn) and fn.__qualname__ != f"{cls.__qualname__}.{name}":
            out.append(f"{cls.__name__}.{name} (rebound to {fn.__qualname__})")
    return out


def fingerprint(module, name: str) -> str | None:
    """The fingerprint of ``module``'s object ``name`` as it is now; None when it is missing."""
    obj = _live(module, name)
    if obj is None:
        return None
    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    return fingerprint_source(source)


@dataclass(frozen=True)
class Check:
    """One fast path against this tree: ``differs`` names every object whose code is not the
    recorded code (missing, rebound or changed); ``error`` says why nothing could be compared."""

    name: str
    objects: tuple[str, ...]
    differs: tuple[str, ...] = ()
    error: str | None = None

    @property
    def matches(self) -> bool:
        return not self.differs and self.error is None

    def why(self) -> str:
        if self.error:
            return self.error
        return "the code it stands in for differs from its record: " + ", ".join(self.differs)


def read_record(path: Path = RECORD) -> dict:
    """The record's ``fast_paths`` ({name: {"native": str, "stands_in_for": {object: fingerprint}}}).
    Raises ValueError naming the file when it is missing or malformed."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot read the fast paths' record ({e})") from e
    paths = doc.get("fast_paths") if isinstance(doc, dict) else None
    if doc.get("schema") != RECORD_SCHEMA or not isinstance(paths, dict) or not all(
            isinstance(p, dict) and isinstance(p.get("stands_in_for"), dict) for p in paths.values()):
        raise ValueError(f"{path}: not a {RECORD_SCHEMA} record")
    return paths


#: The fast paths the engine knows, whether or not the record lists them: one missing from the
#: record is unverified, so it does not run under ``auto``. ``native_kv`` (the whole decode step in
#: one native call, the KV write included) needs ``fused_decode``.
KNOWN = ("fused_decode", "native_kv", "weight_formats")
#: Names of fast paths to turn off, comma-separated, where no argument gives them (a harness turns
#: off in every arm of a comparison what any arm's code turned off)
OFF_ENV = "PAIRBENCH_ENGINE_FAST_PATHS_OFF"


def check(module=None, path: Path = RECORD) -> dict[str, Check]:
    """Every fast path in ``KNOWN`` against ``module`` (default: ``engine.model`` as imported)."""
    if module is None:
        from . import model as module
    try:
        record = read_record(path)
    except ValueError as e:
        return {name: Check(name, (), error=str(e)) for name in KNOWN}
    out = {}
    for name in KNOWN:
        entry = record.get(name)
        if entry is None:
            out[name] = Check(name, (), error=f"{path} has no entry for {name}")
            continue
        differs = []
        for obj, want in entry["stands_in_for"].items():
            got = fingerprint(module, obj)
            if got is None:
                differs.append(f"{obj} (missing)")
            elif got != want:
                differs.append(obj)
            live = _live(module, obj)
            if inspect.isclass(live):
                differs += _rebound(live)
        out[name] = Check(name, tuple(entry["stands_in_for"]), tuple(differs))
    return out


def record(module=None, path: Path = RECORD) -> dict:
    """Write the current fingerprints of the objects each recorded fast path lists (after a change to
    the model code that the kernels follow). Returns the new record."""
    if module is None:
        from . import model as module
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    for name, entry in doc["fast_paths"].items():
        for obj in entry["stands_in_for"]:
            got = fingerprint(module, obj)
            if got is None:
                raise ValueError(f"{path}: {name} lists {obj}, which engine/model.py does not define")
            entry["stands_in_for"][obj] = got
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return doc


def mode(value: str | None) -> str:
    """The ``fused_decode`` setting: ``value``, else ``$PAIRBENCH_ENGINE_FUSED_DECODE``, else auto."""
    chosen = value if value is not None else (os.environ.get(ENV) or "auto")
    if chosen not in MODES:
        where = "fused_decode" if value is not None else f"${ENV}"
        raise ValueError(f"{where} {chosen!r} is not one of {', '.join(MODES)}")
    return chosen


def off_set(value=None) -> frozenset[str]:
    """The fast paths turned off: ``value`` (names, or a comma-separated string), else
    ``$PAIRBENCH_ENGINE_FAST_PATHS_OFF``; an unknown name is a ValueError naming it."""
    if value is None:
        value = os.environ.get(OFF_ENV, "")
    names = [n.strip() for n in (value.split(",") if isinstance(value, str) else value) if n.strip()]
    unknown = sorted(set(names) - set(KNOWN))
    if unknown:
        raise ValueError(f"fast path(s) {', '.join(unknown)} unknown; known: {', '.join(KNOWN)}")
    return frozenset(names)


def _warn(message: str) -> None:
    import sys

    print(f"pairbench-engine: warning: {message}", file=sys.stderr, flush=True)


def weight_kind(linear: str, resolve, check: Check, mode: str, off: frozenset) -> tuple[str, dict]:
    """The weight format: ``resolve()`` (``engine.weights.resolve_linear``), unless the code the
    formats stand in for (``Linear``, ``linear``, ``Embedding``) differs from the record or
    ``weight_formats`` is turned off: then ``auto`` takes fp32, which runs that code. Returns (kind,
    the weight_formats fact)."""
    fact = {"on": True, "differs": list(check.differs), "why": None}
    cause = "turned off (fast_paths_off)" if "weight_formats" in off else None if check.matches else check.why()
    if cause is None:
        kind = resolve()
    elif mode == "on":
        raise FastPathRefused(f"fused_decode on: the weight formats cannot run: {cause}")
    elif linear == "auto":
        kind, fact["why"] = "fp32", cause
        if not check.matches:
            _warn(f"weight formats off: {cause}; every product runs engine/model.py's Linear in fp32 (slower)")
    else:  # asked for by name: kept, and said
        kind, fact["why"] = resolve(), f"linear {linear} asked for, although {cause}"
        _warn(f"linear {linear}: its modules replace engine/model.py's Linear, although {cause}: that code "
              "does not run")
    fact.update(on=kind != "fp32", linear=kind)
    return kind, fact


def decode_allowed(mode: str, check: Check, kind: str, cfg, off: frozenset) -> tuple[bool, dict]:
    """Whether the native decode fast paths (the fused block, the attention kernel) may run. Returns
    (allowed, the fused_decode fact; ``layers`` is filled in by ``fuse``)."""
    from . import native

    fact = {"on": False, "attention_kernel": False, "layers": 0, "differs": list(check.differs), "why": None}
    if mode == "off" or "fused_decode" in off:
        fact["why"] = "fused_decode: off" if mode == "off" else "turned off (fast_paths_off)"
        return False, fact
    cannot = None
    if not check.matches:
        cannot = check.why()
    elif not native.available():
        cannot = f"the native kernels are unavailable ({native.unavailable_reason()})"
    elif kind == "fp32":
        cannot = "the weights are fp32 (linear fp32)"
    elif not native.attention_supported(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim):
        cannot = f"the native attention kernel does not take {cfg.n_heads}/{cfg.n_kv_heads} heads of {cfg.head_dim}"
    if cannot and mode == "on":
        raise FastPathRefused(f"fused_decode on: the fused decode cannot run: {cannot}")
    if cannot:
        fact["why"] = cannot
        if not check.matches:
            _warn(f"fused decode off: {cannot}; every decode step runs engine/model.py's Python code (slower)")
        return False, fact
    return True, fact


def step_not_fused(decode_fact: dict, check: Check) -> dict:
    """The native_kv fact where the fused decode does not run."""
    return {"on": False, "differs": list(check.differs), "why": "needs the fused decode, which is off"}


def fuse(model, decode_fact: dict, kv_check: Check, mode: str, off: frozenset, norm_eps: float) -> dict:
    """Set the native attention kernel and ``Block.fused_decode`` on every block whose weights the
    native block takes, and ``Transformer.fused_step`` where every block has it and the KV cache is
    the recorded code. Fills in ``decode_fact``; returns the native_kv fact."""
    from . import native
    from .kernels import FusedDecode, FusedStep

    for layer in model.layers:
        layer.attention.decode_attention = native.attention_decode
        if FusedDecode.supported(layer):
            layer.fused_decode = FusedDecode(layer, norm_eps)
    n = len(model.layers)
    decode_fact["attention_kernel"] = True
    decode_fact["layers"] = sum(layer.fused_decode is not None for layer in model.layers)
    decode_fact["on"] = decode_fact["layers"] == n
    if not decode_fact["on"]:
        decode_fact["why"] = (f"{n - decode_fact['layers']} of {n} blocks hold weights in no native block format "
                              "(the fused block needs q4_1/q8_0 weights)")
        if mode == "on":
            raise FastPathRefused(f"fused_decode on: {decode_fact['why']}")
        return step_not_fused(decode_fact, kv_check)
    fact = {"on": False, "differs": list(kv_check.differs), "why": None}
    if "native_kv" in off:
        fact["why"] = "turned off (fast_paths_off)"
    elif not kv_check.matches:
        if mode == "on":
            raise FastPathRefused(f"fused_decode on: the native KV write cannot run: {kv_check.why()}")
        # not a warning: each block still runs natively, around the patched KVCache.update in Python
        fact["why"] = kv_check.why() + "; each block calls the Python KVCache.update between its two native halves"
    else:
        model.fused_step = FusedStep(model)
        fact["on"] = True
    return fact
