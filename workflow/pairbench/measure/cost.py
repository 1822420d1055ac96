"""The cost channel's measurement: simulated instructions and estimated cycles per prompt token and
per decode token, counted by valgrind's callgrind around one fixed request per condition.

Wall time on a shared 2-vCPU VM cannot resolve a 1-5% change (docs/statistics.md); a count of
what the CPU is asked to do can, because it does not depend on what else the machine runs. SQLite
times its releases this way (cachegrind's counts on a fixed workload), rustc-perf's primary metric
is instructions retired, and CodSpeed's "CPU simulation" runs each benchmark once under valgrind.
What the count is, and what it cannot see, is docs/cost.md.

Two engine kinds, one shape of result (:class:`ArmCost`):

- the embedded engine runs in process under ``callgrind --instr-atstart=no``; its driver
  (:mod:`pairbench.measure.cost_driver`, run with the arm's interpreter on the arm's tree) switches
  instrumentation on around the scheduler steps of each measured request only and dumps the prompt
  steps and the decode steps apart (:func:`run_embedded`);
- llama.cpp's ``llama-bench`` from the arm's build, relinked with ``-Wl,--wrap=<the decode
  function>`` around a wrapper (``WRAP_SOURCE``) that switches instrumentation on for the calls
  counted and dumps after each, runs under ``callgrind --instr-atstart=no``: with ``--n-depth
  <length> --n-gen <D>`` the first call reads the prompt (simulated uninstrumented unless prefill
  is counted), the next D decode one token each (:func:`run_llama_bench`). Where the relink cannot
  be made, ``--toggle-collect`` of the function does the same with everything instrumented (slower).

Estimated cycles, where the cache is simulated, are Itamar Turner-Trauring's formula as iai and
iai-callgrind compute it (https://pythonspeed.com/articles/consistent-benchmarking-in-ci/):
``L1 hits + 5 x last-level hits + 35 x RAM accesses``, over a fixed cache geometry (``GEOMETRY``,
iai's: 32 KiB 8-way L1s, an 8 MiB 16-way last level, 64-byte lines), so the figure does not depend
on the host's caches. :meth:`Counts.estimated_cycles` spells it out.

Everything that decides the count is pinned (``PINNED_ENV``; one thread; ``setarch -R`` where it
exists turns address randomisation off) and recorded with the figures. A run that cannot be made
(no valgrind, an instruction valgrind does not know, its time limit) raises :class:`CostUnavailable`
with a ``reason`` the report prints; the wall-clock channel never depends on this one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pairbench.core.steps import StepError, run_step

#: callgrind's events with the cache simulated, in its order
EVENTS = ("Ir", "Dr", "Dw", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")
#: the simulated caches: iai's geometry (size B, associativity, line B), fixed so that counts do not
#: depend on the host's caches
GEOMETRY = {"I1": (32768, 8, 64), "D1": (32768, 8, 64), "LL": (8388608, 16, 64)}
#: the cycle weights of an L1 hit, a last-level hit and a RAM access (iai, pythonspeed.com)
CYCLE_WEIGHTS = (1, 5, 35)

#: Environment of every simulated run. Hash seeds fixed (a set's order changes which code runs);
#: one OpenMP/MKL thread; MKL's SSE4.2 kernels, because valgrind 3.19 emulates every lane of an FMA
#: instruction in software (~50x a multiply and an add: measured, docs/cost.md) and MKL's AVX2
#: GEMMs are FMA throughout; torch's and the engine's AVX2 paths named, as valgrind shows an AVX2 CPU
#: (no AVX-512) whatever the host has, so the pin only makes that explicit.
PINNED_ENV = {
    "PYTHONHASHSEED": "0",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ATEN_CPU_CAPABILITY": "avx2",
    "PAIRBENCH_ENGINE_ISA": "avx2",
    "PYTHONDONTWRITEBYTECODE": "1",
}

CLIENT_SOURCE = """\
/* pairbench's cost channel: callgrind's client requests, for ctypes (measure/cost_driver.py) */
#include <valgrind/callgrind.h>
void pb_start(void) { CALLGRIND_START_INSTRUMENTATION; }
void pb_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; }
void pb_dump(const char *label) { CALLGRIND_DUMP_STATS_AT(label); }
int pb_running_on_valgrind(void) { return RUNNING_ON_VALGRIND; }
"""

#: llama-bench's wrapper of the decode function (``-Wl,--wrap=llama_process``): instrumentation on
#: only inside the calls counted (from call PAIRBENCH_COST_FROM_CALL on: 0 counts the prompt's call,
#: 1 only the decode calls), one dump after each, so the prompt a decode needs is simulated without
#: instrumentation (measured: one arm 676 s with the prompt counted, 419 s without: docs/cost.md)
WRAP_SOURCE = """\
/* pairbench's cost channel: llama-bench relinked with -Wl,--wrap=llama_process (measure/cost.py) */
#include <stdint.h>
#include <stdlib.h>
#include <valgrind/callgrind.h>
struct llama_context;
struct llama_batch;
int32_t __real_llama_process(struct llama_context *, int, const struct llama_batch *);
static long pb_calls;
int32_t __wrap_llama_process(struct llama_context *ctx, int type, const struct llama_batch *batch) {
    const char *from = getenv("PAIRBENCH_COST_FROM_CALL");
    int counted = pb_calls++ >= (from ? atol(from) : 0);
    if (counted) CALLGRIND_START_INSTRUMENTATION;
    int32_t r = __real_llama_process(ctx, type, batch);
    if (counted) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("llama_process"); }
    return r;
}
"""

DRIVER = Path(__file__).with_name("cost_driver.py")


#: why an arm was not counted: no valgrind, no client library (compiler or headers), an instruction
#: valgrind does not know, the time limit, the program failed, its output unreadable, or an engine the
#: simulator cannot run
REASONS = ("no_valgrind", "no_client", "unknown_instruction", "timeout", "failed", "unreadable", "engine")


class CostUnavailable(Exception):
    """The channel cannot count this arm here. ``reason``: one of :data:`REASONS`; the message says
    why in words."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Counts:
    """callgrind's event totals of one phase (``Ir`` always; the rest with the cache simulated)."""

    events: dict[str, int]

    @property
    def instructions(self) -> int:
        return self.events["Ir"]

    @property
    def simulated_cache(self) -> bool:
        return all(e in self.events for e in EVENTS)

    def levels(self) -> dict[str, int] | None:
        """Accesses by where they were served: ``l1_hits``, ``ll_hits``, ``ram`` (None without the
        cache simulated). Instruction fetches, data reads and data writes each count once."""
        if not self.simulated_cache:
            return None
        e = self.events
        ram = e["ILmr"] + e["DLmr"] + e["DLmw"]
        l1_misses = e["I1mr"] + e["D1mr"] + e["D1mw"]
        return {"l1_hits": e["Ir"] + e["Dr"] + e["Dw"] - l1_misses, "ll_hits": l1_misses - ram, "ram": ram}

    def estimated_cycles(self) -> int | None:
        """L1 hits + 5 x last-level hits + 35 x RAM accesses (None without the cache simulated)."""
        lv = self.levels()
        if lv is None:
            return None
        w1, wl, wr = CYCLE_WEIGHTS
        return w1 * lv["l1_hits"] + wl * lv["ll_hits"] + wr * lv["ram"]

    def __add__(self, other: "Counts") -> "Counts":
        keys = self.events.keys() & other.events.keys()
        return Counts({k: self.events[k] + other.events[k] for k in keys})


def parse_callgrind(text: str) -> tuple[str | None, Counts]:
    """One callgrind output file: (its dump's label, or None; its totals). The label is what the
    program passed to ``CALLGRIND_DUMP_STATS_AT`` ("Client Request: <label>"); a dump made by
    ``--dump-after`` says which function triggered it."""
    events = totals = label = None
    for line in text.splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith("totals:") or (totals is None and line.startswith("summary:")):
            totals = [int(x) for x in line.split()[1:]]
        elif line.startswith("desc: Trigger:"):
            trigger = line[len("desc: Trigger:"):].strip()
            label = trigger[len("Client Request:"):].strip() if trigger.startswith("Client Request:") else trigger
    if events is None or totals is None:
        raise CostUnavailable("unreadable", "a callgrind output has no events or totals line")
    totals += [0] * (len(events) - len(totals))  # callgrind leaves trailing zero events out
    return label, Counts(dict(zip(events, totals)))


def read_dumps(out_dir: Path, prefix: str) -> list[tuple[str | None, Counts]]:
    """Every dump of one callgrind run, in the order written (``<prefix>.<n>``; the final one, with no
    number, last)."""
    def order(p: Path):
        tail = p.name[len(prefix):].lstrip(".")
        return (0, int(tail)) if tail.isdigit() else (1, 0)

    files = sorted((p for p in out_dir.iterdir() if p.name.startswith(prefix)), key=order)
    return [parse_callgrind(p.read_text(errors="replace")) for p in files]


# ---------------------------------------------------------------------------------------------------
# what the host offers


def valgrind_version() -> str:
    """``valgrind-3.19.0`` or the like; :class:`CostUnavailable` (``no_valgrind``) without one."""
    exe = shutil.which("valgrind")
    if exe is None:
        raise CostUnavailable("no_valgrind", "valgrind is not installed (Debian: apt-get install valgrind)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise CostUnavailable("no_valgrind", f"valgrind --version failed: {exc}") from None
    if out.returncode != 0:
        raise CostUnavailable("no_valgrind", f"valgrind --version exited {out.returncode}")
    return out.stdout.strip()


def hardware_counters() -> str | None:
    """Whether ``perf stat -e instructions:u`` counts on this host: None if it does, else why not
    (a VM without a virtual PMU reports ``<not supported>``)."""
    perf = shutil.which("perf")
    if perf is None:
        return "perf is not installed"
    try:
        out = subprocess.run([perf, "stat", "-x,", "-e", "instructions:u", "true"], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"perf stat failed: {exc}"
    line = next((ln for ln in out.stderr.splitlines() if "instructions" in ln), "")
    if out.returncode != 0 or not line or not line.split(",")[0].strip().isdigit():
        return f"perf stat -e instructions:u: {line.split(',')[0].strip() or out.stderr.strip()[-200:] or 'no count'}"
    return None


def client_library(cache_dir: Path | None = None) -> Path:
    """The C library of callgrind's client requests (``CLIENT_SOURCE``), compiled once per source and
    compiler into the user's cache. :class:`CostUnavailable` (``no_client``) without a C compiler or
    valgrind's headers."""
    return _compiled(CLIENT_SOURCE, "libpbcost.so", ["-shared", "-fPIC"], cache_dir)


def wrap_object(cache_dir: Path | None = None) -> Path:
    """llama-bench's wrapper of the decode function (``WRAP_SOURCE``) as an object file, compiled
    once into the user's cache; :class:`CostUnavailable` (``no_client``) as :func:`client_library`."""
    return _compiled(WRAP_SOURCE, "pbwrap.o", ["-c", "-fPIC"], cache_dir)


def _compiled(source: str, name: str, flags: list[str], cache_dir: Path | None) -> Path:
    from pairbench.core.cache import user_cache

    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        raise CostUnavailable("no_client", "no C compiler (cc, gcc, clang) to build callgrind's client requests")
    key = hashlib.sha256((source + cc).encode()).hexdigest()[:16]
    out_dir = (cache_dir or user_cache() / "cost") / key
    out = out_dir / name
    if out.is_file():
        return out
    out_dir.mkdir(parents=True, exist_ok=True)
    src = out_dir / (Path(name).stem + ".c")
    src.write_text(source)
    tmp = out_dir / f".build-{os.getpid()}{Path(name).suffix}"
    r = subprocess.run([cc, "-O2", *flags, str(src), "-o", str(tmp)], capture_output=True, text=True)
    if r.returncode != 0:
        tmp.unlink(missing_ok=True)
        why = "valgrind's headers (valgrind/callgrind.h) are missing" if "callgrind.h" in r.stderr else r.stderr[-400:]
        raise CostUnavailable("no_client", f"cannot build callgrind's client requests: {why}")
    os.replace(tmp, out)
    return out


# ---------------------------------------------------------------------------------------------------
# running


@dataclass(frozen=True)
class CostOptions:
    """What one arm's simulated run does: ``decode_tokens`` per request, the cache simulated or not
    (estimated cycles need it; it costs ~1.2x on decode and ~4x on a prompt), the wall-clock limit
    of the whole run, and which phases are counted (``prefill`` is the slow one: docs/cost.md)."""

    decode_tokens: int = 8
    cache_sim: bool = True
    timeout_s: float = 900.0
    phases: tuple[str, ...] = ("prefill", "decode")
    warmup_tokens: int = 32


@dataclass
class PhaseCost:
    """One phase of one request: its counts, and how many tokens they are spread over."""

    counts: Counts
    tokens: int

    def per_token(self) -> dict:
        c = self.counts
        cyc = c.estimated_cycles()
        return {"instructions": c.instructions / self.tokens,
                "estimated_cycles": None if cyc is None else cyc / self.tokens, "tokens": self.tokens,
                "events": dict(sorted(c.events.items()))}


@dataclass
class ArmCost:
    """An arm's counts per condition and phase, with what produced them."""

    source: str  # "valgrind-callgrind"
    tool_version: str
    conditions: dict[str, dict[str, PhaseCost]] = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    duration_s: float = 0.0


def callgrind_argv(out_file: Path, opts: CostOptions, *, instr_atstart: bool = True,
                   toggle_collect: str | None = None, dump_after: str | None = None) -> list[str]:
    """valgrind's command line up to the program (``setarch -R`` first where it exists)."""
    argv = []
    setarch = shutil.which("setarch")
    if setarch:
        argv += [setarch, os.uname().machine, "-R"]
    argv += ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
             f"--instr-atstart={'yes' if instr_atstart else 'no'}", "--trace-children=no"]
    if opts.cache_sim:
        argv += ["--cache-sim=yes", *(f"--{k}={','.join(map(str, v))}" for k, v in GEOMETRY.items())]
    if toggle_collect:
        argv.append(f"--toggle-collect={toggle_collect}")
    if dump_after:
        argv.append(f"--dump-after={dump_after}")
    return argv


_UNKNOWN_INSN = re.compile(r"unhandled instruction bytes|Illegal opcode|SIGILL")


def _run_simulated(subject: str, argv: list[str], *, cwd: Path, env: dict, log: Path, timeout_s: float):
    """Run one simulated program; its failures as :class:`CostUnavailable` with a reason."""
    try:
        return run_step("cost", argv, cwd=cwd, env=env, log=log, timeout_s=timeout_s, capture="stdout",
                        subject=subject)
    except StepError as exc:
        if exc.reason == "timeout":
            raise CostUnavailable("timeout", f"{subject} exceeded its limit of {timeout_s:g} s "
                                             "(cost.timeout_s)") from None
        if exc.reason == "not_found":
            raise CostUnavailable("no_valgrind", str(exc)) from None
        if _UNKNOWN_INSN.search(exc.output):
            line = next((ln for ln in exc.output.splitlines() if _UNKNOWN_INSN.search(ln)), "")
            raise CostUnavailable("unknown_instruction", f"{subject}: valgrind cannot run an instruction of "
                                                         f"this program ({line.strip()[:200]})") from None
        raise CostUnavailable("failed", str(exc)) from None


def _env(arm_env: dict | None = None) -> dict:
    """The simulated run's environment: ours, the arm's own (its launch ``env``), then the pins,
    which win (an arm's ``OMP_NUM_THREADS`` would put a barrier into the count)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VALGRIND_", "LD_PRELOAD"))}
    env.update(arm_env or {})
    env.update(PINNED_ENV)
    return env


def _link(work: Path, name: str, target: str | os.PathLike) -> Path:
    link = work / name
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(target).resolve())
    return link


def run_embedded(*, python: str, src: Path, model: str, serve_args: list[str], requests: list[dict],
                 opts: CostOptions, work: Path, log: Path, env: dict | None = None) -> ArmCost:
    """Count the embedded engine of one arm: *requests* is ``[{"condition", "ids"}]`` (the
    condition's real prompt, as token ids), run in that order in one process after an uncounted
    warm-up. *serve_args* are the arm's ``python -m engine serve`` flags, in which an argument equal
    to *model* is the model. Returns per condition the counts of each phase of ``opts.phases``:
    ``prefill`` over its prompt tokens, ``decode`` over its decode steps. *env* is the arm's own
    launch environment (the pins of ``PINNED_ENV`` win over it).

    *work* must be the same folder for every arm of a comparison: the process runs a copy of the
    arm's tree there (``work/src``) and sees the model through a link (``work/model``), so that
    every path it holds, and so every allocation those paths make, is the same in both arms; a path
    one character longer moves what glibc's malloc does later, and so the count (docs/cost.md,
    "Determinism"). A copy, not a link: the engine resolves its own path (``Path(__file__).resolve()``)."""
    version = valgrind_version()
    lib = client_library()
    work = Path(work).resolve()  # valgrind and the driver run in it: every path they are handed is absolute
    work.mkdir(parents=True, exist_ok=True)
    for old in work.glob("callgrind.out*"):
        old.unlink()
    src_copy = work / "src"
    if src_copy.is_symlink() or src_copy.is_file():
        src_copy.unlink()
    elif src_copy.exists():
        shutil.rmtree(src_copy)
    shutil.copytree(src, src_copy, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__"))
    _byte_compile(python, src_copy)
    model_link = str(_link(work, "model", model)) if Path(model).exists() else model
    args = [model_link if a == model else a for a in serve_args]
    req = {"src": str(src_copy), "serve_args": args, "client_library": str(lib),
           "warmup_tokens": opts.warmup_tokens, "warmup_decode": 2,
           "requests": [{"condition": r["condition"], "ids": list(r["ids"]), "decode_tokens": opts.decode_tokens,
                         "phases": list(opts.phases)} for r in requests]}
    req_file = work / "request.json"
    req_file.write_text(json.dumps(req))
    out = work / "callgrind.out"
    argv = [*callgrind_argv(out, opts, instr_atstart=False), _real_interpreter(python), str(DRIVER), str(req_file)]
    res = _run_simulated("the cost driver", argv, cwd=work, env=_env(env), log=log, timeout_s=opts.timeout_s)
    try:
        ran = json.loads(res.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        raise CostUnavailable("unreadable", f"the cost driver printed no result; see {log}") from None
    dumps = {label: counts for label, counts in read_dumps(work, out.name) if label}
    cost = ArmCost("valgrind-callgrind", version, duration_s=res.record["duration_s"],
                   facts={k: v for k, v in ran.items() if k != "requests"})
    for r in ran["requests"]:
        c = r["condition"]
        tokens = {"prefill": r["prompt_tokens"], "decode": r["decode_steps"]}
        try:
            cost.conditions[c] = {p: PhaseCost(dumps[f"{c}:{p}"], tokens[p]) for p in opts.phases}
        except KeyError as exc:
            raise CostUnavailable("unreadable", f"condition {c}: callgrind wrote no dump {exc}; see {log}") from None
    return cost


def _byte_compile(python: str, tree: Path) -> None:
    """Byte-compile the work copy where it lies, natively (outside the simulator): a ``.pyc`` records
    the path it was compiled at, and importing one compiled elsewhere rewrites every code object's
    file name at load time, a different allocation history per arm (measured: 0.05% of a prefill's
    instructions between two copies of one tree compiled at paths of different lengths)."""
    r = subprocess.run([python, "-m", "compileall", "-q", str(tree)], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise CostUnavailable("failed", f"byte-compiling the arm's tree for the cost driver failed: "
                                        f"{(r.stdout + r.stderr).strip()[-400:]}")


def _real_interpreter(python: str) -> str:
    """The interpreter binary itself: a pyenv shim is a shell script, and valgrind without
    ``--trace-children`` would count the shell. A virtual environment's ``python`` link is kept as
    it is (resolved, it would run without the environment)."""
    p = Path(python)
    if p.is_file() and p.read_bytes()[:4] == b"\x7fELF":
        return str(p)
    out = subprocess.run([python, "-c", "import sys; print(sys.executable)"], capture_output=True, text=True,
                         timeout=60)
    exe = out.stdout.strip()
    if out.returncode != 0 or not exe:
        raise CostUnavailable("failed", f"cannot find the interpreter behind {python}")
    return exe


def relink_counted(binary: Path, out: Path, *, function: str, log: Path) -> str | None:
    """Relink the arm's ``llama-bench`` (*binary*, ``<build>/bin/llama-bench``) as *out* with
    *function* wrapped (``-Wl,--wrap``, :data:`WRAP_SOURCE`), from the link command CMake wrote for
    it (``CMakeFiles/llama-bench.dir/link.txt``): the same objects and libraries, so the same code,
    plus the wrapper. None when made; else why not, and the caller counts with ``--toggle-collect``."""
    build = Path(binary).resolve().parent.parent
    link = build / "tools" / "llama-bench" / "CMakeFiles" / "llama-bench.dir" / "link.txt"
    if not link.is_file():
        link = next(iter(sorted(build.glob("**/CMakeFiles/llama-bench.dir/link.txt"))), None)
        if link is None:
            return f"no CMake link command for llama-bench under {build.name}/"
    try:
        obj = wrap_object()
    except CostUnavailable as exc:
        return str(exc)
    try:
        line = next((ln for ln in link.read_text().splitlines() if " -o " in f" {ln} "), None)
        argv = shlex.split(line) if line else []
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return f"cannot read {link.name}: {exc}"
    if "-o" not in argv:
        return f"{link.name} has no command with -o"
    i = argv.index("-o") + 1
    # the wrapper before the libraries, which the linker then searches for the function it calls
    argv[i:i + 1] = [str(out), f"-Wl,--wrap={function}", str(obj)]
    out.unlink(missing_ok=True)
    try:
        run_step("cost", argv, cwd=link.parent.parent.parent, log=log, timeout_s=600, capture="stdout",
                 subject="llama-bench relinked for the cost channel")
    except StepError as exc:
        return str(exc)[-400:]
    return None


def run_llama_bench(*, binary: Path, model: str, requests: list[dict], opts: CostOptions, collect: str,
                    work: Path, log: Path, cwd: Path, relink: bool = True) -> ArmCost:
    """Count llama.cpp through ``llama-bench`` from the arm's build: per request (``{"condition",
    "input_tokens"}``) one ``--n-depth <input_tokens> --n-gen <decode_tokens>`` run, one thread, no
    warm-up run, counting only inside *collect* (the function each prompt batch and each decode
    token passes through once, e.g. ``llama_process``). The first call is the prompt (its batch of
    ``input_tokens`` tokens; llama-bench's own token ids, not the fixture's), the next
    ``decode_tokens`` one token each.

    The binary run is the arm's llama-bench relinked with *collect* wrapped (:func:`relink_counted`),
    under ``--instr-atstart=no``: the wrapper instruments the calls counted only, so when prefill is
    not counted the prompt runs uninstrumented. Where the relink cannot be made, the arm's own binary
    runs under ``--toggle-collect`` of *collect*, everything instrumented, both phases counted
    (``facts["counting"]`` says which); so does every request when the relinked binary never calls
    *collect* (a llama-bench that reaches it only from inside the library)."""
    version = valgrind_version()
    work = Path(work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    counted_bin = work / "llama-bench-counted"  # one name for every arm: the paths the process holds
    why_not = (relink_counted(Path(binary), counted_bin, function=collect, log=log) if relink
               else f"the relinked llama-bench never called {collect}")
    wrapped = why_not is None
    from_call = 1 if wrapped and "prefill" not in opts.phases else 0
    facts = {"tool": "llama-bench", "collect": collect, "counting": "wrapped" if wrapped else "toggle-collect"}
    if not wrapped:
        facts["relink"] = _without_paths(why_not)
    cost = ArmCost("valgrind-callgrind", version, facts=facts)
    for r in requests:
        c, n = r["condition"], int(r["input_tokens"])
        stem = work / f"callgrind.{c}.out"
        for old in work.glob(stem.name + "*"):
            old.unlink()
        if wrapped:
            head, env = [*callgrind_argv(stem, opts, instr_atstart=False), str(counted_bin)], \
                {**_env(), "PAIRBENCH_COST_FROM_CALL": str(from_call)}
        else:
            head, env = [*callgrind_argv(stem, opts, toggle_collect=collect, dump_after=collect), str(binary)], _env()
        argv = [*head, "--model", model, "--threads", "1", "--n-prompt", "0", "--n-gen", str(opts.decode_tokens),
                "--n-depth", str(n), "--repetitions", "1", "--no-warmup", "--output", "json"]
        res = _run_simulated(f"llama-bench ({c})", argv, cwd=cwd, env=env, log=log, timeout_s=opts.timeout_s)
        cost.duration_s += res.record["duration_s"]
        calls = [counts for label, counts in read_dumps(work, stem.name) if label and label != "Program termination"]
        if wrapped and not calls:
            # the wrapper never ran: this llama-bench reaches the function from inside the library
            # (no call to wrap); count it the slow way, every request alike
            return run_llama_bench(binary=binary, model=model, requests=requests, opts=opts, collect=collect,
                                   work=work, log=log, cwd=cwd, relink=False)
        if len(calls) != 1 - from_call + opts.decode_tokens:
            raise CostUnavailable("unreadable", f"llama-bench ({c}): expected {1 - from_call + opts.decode_tokens} "
                                                f"calls of {collect}, callgrind dumped {len(calls)}; see {log}")
        decode = calls[1 - from_call]
        for more in calls[2 - from_call:]:
            decode = decode + more
        cost.conditions[c] = {"decode": PhaseCost(decode, opts.decode_tokens)}
        if not from_call:
            cost.conditions[c] = {"prefill": PhaseCost(calls[0], n), **cost.conditions[c]}
    return cost


# ---------------------------------------------------------------------------------------------------
# one arm of a run, as the cost stage asks for it

#: llama.cpp's function that every prompt batch and every decode token passes through once, at the
#: tag the llama-server profile builds (docs/cost.md, "llama.cpp")
LLAMA_COLLECT = "llama_process"


def count_arm(engine, requests: list[dict], opts: CostOptions, *, work: Path, log: Path,
              llama_bench: str | None = None) -> ArmCost:
    """Count one arm, whatever its engine: *engine* is its :class:`~pairbench.engines.adapter.ArmEngine`,
    *requests* ``[{"condition", "ids", "input_tokens"}]`` (the condition's round-1 prompt). The
    embedded engine runs in process (:func:`run_embedded`) with the arm's own launch flags and
    environment; an engine with llama.cpp's ``llama-bench`` (*llama_bench*: the arm's build of it)
    through it (:func:`run_llama_bench`). Any other engine (a GPU engine, an external server) raises
    :class:`CostUnavailable` (``engine``): the simulator cannot run it."""
    if engine.name == "embedded":
        spec = engine.launch(0)
        argv = list(spec.argv)
        if "serve" not in argv:
            raise CostUnavailable("engine", f"the arm's launch command has no `serve` to count: {' '.join(argv)}")
        i = argv.index("serve")
        return run_embedded(python=argv[0], src=Path(engine.src_dir), model=engine.model, serve_args=argv[i + 1:],
                            requests=requests, opts=opts, work=work, log=log, env=spec.env)
    if llama_bench is not None:
        if not Path(llama_bench).is_file():
            raise CostUnavailable("failed", f"the arm's build has no {llama_bench}")
        return run_llama_bench(binary=Path(llama_bench), model=engine.model, requests=requests, opts=opts,
                               collect=LLAMA_COLLECT, work=work, log=log, cwd=Path(engine.src_dir))
    raise CostUnavailable("engine", f"engine {engine.name}: the simulator runs the embedded engine and llama.cpp's "
                                    "llama-bench only (a GPU engine or an external server cannot be counted)")


def phase_rows(cost: ArmCost) -> list[dict]:
    """The per-arm artifact's ``rows``: per condition and phase its tokens, callgrind's event totals
    and the registry's metrics per token (:data:`pairbench.core.metrics.COST_METRICS`; cycles null
    without the cache simulated)."""
    from pairbench.core.metrics import cost_metric

    rows = []
    for cond, phases in cost.conditions.items():
        for phase, pc in phases.items():
            per = pc.per_token()
            rows.append({"condition": cond, "phase": phase, "tokens": pc.tokens,
                         "events": dict(sorted(pc.counts.events.items())),
                         "metrics": {cost_metric(phase, "instructions"): per["instructions"],
                                     cost_metric(phase, "cycles"): per["estimated_cycles"]}})
    return rows


def artifact_body(arm: str, engine: str, opts: CostOptions, *, cost: ArmCost | None = None,
                  unavailable: CostUnavailable | None = None) -> dict:
    """The ``cost`` artifact's body (without ``inputs``): counted, or why not."""
    body = {"arm": arm, "engine": engine, "status": "counted" if cost is not None else "unavailable",
            "reason": None, "message": None, "source": None, "tool_version": None, "duration_s": 0.0,
            "options": {"decode_tokens": opts.decode_tokens, "cache_sim": opts.cache_sim,
                        "phases": list(opts.phases), "timeout_s": opts.timeout_s},
            "geometry": {k: list(v) for k, v in GEOMETRY.items()}, "cycle_weights": list(CYCLE_WEIGHTS),
            "pinned_env": dict(PINNED_ENV), "facts": {}, "rows": []}
    if cost is not None:
        body.update(source=cost.source, tool_version=cost.tool_version, duration_s=round(cost.duration_s, 3),
                    facts=_public_facts(cost.facts), rows=phase_rows(cost))
    else:
        body.update(reason=unavailable.reason, message=_without_paths(str(unavailable)))
    return body


_PATH = re.compile(r"[^\s;:,()'\"]*/[^\s;:,()'\"]+")


def _without_paths(text: str) -> str:
    """*text* with every path cut to its last part: the message is published in the report,
    and a path may name the user or the host (the job's log has the whole text)."""
    return _PATH.sub(lambda m: os.path.basename(m.group(0).rstrip("/")) or "/", text)


def _public_facts(facts: dict) -> dict:
    """The driver's facts that say what ran (ISA path, threads, formats), not where (no paths)."""
    keep = ("on_valgrind", "isa", "linear", "kv", "torch_threads", "native_threads", "slots", "batch_tokens",
            "malloc", "load_seconds", "tool", "collect", "counting", "relink")
    return {k: facts[k] for k in keep if k in facts}


if __name__ == "__main__":  # pragma: no cover - a quick look: python -m pairbench.measure.cost
    print(json.dumps({"valgrind": valgrind_version(), "hardware_counters": hardware_counters() or "available",
                      "client": str(client_library()), "python": sys.executable,
                      "tmp": tempfile.gettempdir()}, indent=1))
