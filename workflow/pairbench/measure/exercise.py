"""Did the candidate's patch run? The exercise probe of a compiled arm, beside the cross-check.

An "equivalent" verdict means nothing if the patched code never ran: a kernel for a quantization type
the model does not use, a path for another CPU, a branch the run's lengths never reach. Both arms then
execute the same instructions, and the statistics can only ever find them equal. This module finds out,
for an engine built from source whose profile names its programs (``crosscheck.exercise_binaries``):

1. **What the patch changed in the compiled code.** Each program of the candidate is disassembled
   (``objdump -d``) beside the baseline's, function by function, and compared after removing what
   moves without the code changing: addresses (call and jump targets keep their symbol; RIP-relative
   displacements are dropped) and the source line a failed assert or abort would print (``__LINE__``,
   the argument just before a call to an ``*abort*``/``*assert_fail*`` function, shifts whenever a
   patch adds lines above it). A patch that changes one kernel changes one function (or the functions
   it was inlined into); a patch for code this build does not compile (another architecture) changes
   none.
2. **Whether any of those functions ran.** The engine's own benchmark tool (the cross-check commands,
   at the plan's lengths, output tokens and the arm's threads) runs once under ``gdb`` with a
   breakpoint on the entry of every changed function the tool contains. Each breakpoint is removed at
   its first hit, and once every one has hit (or none is left) the tool runs on at full speed.

The record (``exercise`` in ``crosscheck/<candidate>.json``, and in ``stats/crosscheck.json``):

- ``exercised: false``: no compiled function changed, or none of the changed ones ran: the run compares
  two builds that executed the same code, and the report says so beside every verdict;
- ``exercised: true``: at least one changed function ran (``hit``);
- ``exercised: null``: unknown: some changed functions exist only in the server, where the probe
  cannot see them, and none of the others ran (or gdb/objdump are missing: ``reason`` says which).

What it cannot see: code that runs in the server but not in the tool (sampling, HTTP), paths that depend
on conditions the tool does not reproduce, and effects without a changed function (a changed constant
in a data table is caught only through the functions that read it when their code changes).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from pairbench.core.steps import public_argv

# a source line number handed to an assert or abort: the argument register set just before the call
_ABORT_CALL = re.compile(r"call\s+<[^>]*(?:abort|assert_fail)[^>]*>")
_LINE_ARG = re.compile(r"mov\s+\$0x[0-9a-f]+,%(?:esi|edx)$")
_LOOKBACK = 10  # instructions searched back from such a call for its line argument


class ExerciseError(Exception):
    """The probe could not run (a tool missing, a program unreadable); names what failed."""


def normalize(lines: list[str]) -> list[str]:
    """One function's instructions (objdump, no addresses, no raw bytes) with what moves without the
    code changing taken out: comments, absolute call/jump targets (the symbol stays), RIP-relative
    displacements, and the line number passed to an assert/abort."""
    body: list[str] = []
    for line in lines:
        ins = re.sub(r"#.*$", "", line).strip()
        if not ins:
            continue
        ins = re.sub(r"\b[0-9a-f]+ <", "<", ins)
        ins = re.sub(r"-?0x[0-9a-f]+\(%rip\)", "X(%rip)", ins)
        if _ABORT_CALL.search(ins):
            for j in range(len(body) - 1, max(len(body) - _LOOKBACK, -1), -1):
                if _LINE_ARG.match(body[j]):
                    body[j] = re.sub(r"\$0x[0-9a-f]+", "$LINE", body[j])
                    break
        body.append(ins)
    return body


def functions(binary: str | os.PathLike) -> dict[str, str]:
    """``{symbol: sha256 of its normalized code}`` for every function ``objdump -d`` shows in *binary*
    (several same-named local functions are hashed together)."""
    if shutil.which("objdump") is None:
        raise ExerciseError("objdump is not installed (Debian: apt-get install binutils)")
    try:
        out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "--no-addresses", str(binary)],
                             capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError as exc:
        raise ExerciseError(f"objdump -d {Path(binary).name} failed: {exc.stderr.strip()[:300]}") from None
    bodies: dict[str, list[str]] = {}
    name, cur = None, []
    for line in out.splitlines():
        m = re.match(r"^<(.+)>:$", line)
        if m:
            if name is not None:
                bodies.setdefault(name, []).extend(["--", *normalize(cur)])
            name, cur = m.group(1), []
        elif name is not None:
            cur.append(line)
    if name is not None:
        bodies.setdefault(name, []).extend(["--", *normalize(cur)])
    return {k: hashlib.sha256("\n".join(v).encode()).hexdigest() for k, v in bodies.items()}


def changed_functions(baseline: str | os.PathLike, candidate: str | os.PathLike) -> tuple[list[str], int]:
    """The functions whose code differs between two builds of one program (present in either), and
    how many functions the candidate has."""
    a, b = functions(baseline), functions(candidate)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k)), len(b)


def short_names(names: list[str]) -> dict[str, str]:
    """``{symbol: a short readable name}``: demangled (``c++filt``, where installed), without the
    return type and parameter list, at most 64 characters: ``rope_flt<float>`` for
    ``_Z29ggml_compute_forward_rope_fltIfEvPK19...``. For the report and the published table."""
    demangled = list(names)
    if names and shutil.which("c++filt"):
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
        if len(out) == len(names):
            demangled = out
    return {name: _short(d)[:64] for name, d in zip(names, demangled)}


def _short(d: str) -> str:
    """``void f<float>(int, char*)`` -> ``f<float>``: no trailing parameter list, no return type."""
    if d.endswith(")"):
        depth = 0
        for i in range(len(d) - 1, -1, -1):  # the outermost trailing (...)
            depth += {")": 1, "(": -1}.get(d[i], 0)
            if depth == 0:
                d = d[:i]
                break
    depth, start = 0, 0
    for i, ch in enumerate(d):  # the last space outside <...> ends the return type
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == " " and depth == 0:
            start = i + 1
    return d[start:]


def text_symbols(binary: str | os.PathLike) -> dict[str, int]:
    """``{name: offset}`` of *binary*'s code symbols (``nm``; the first of same-named local ones)."""
    out = subprocess.run(["nm", "--defined-only", str(binary)], capture_output=True, text=True).stdout
    syms: dict[str, int] = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.setdefault(parts[2], int(parts[0], 16))
    return syms


# Run inside gdb (gdb -batch -nx -x <this> --args PROGRAM ...): a breakpoint on every listed entry
# offset (of a position-independent executable: relative to its load address), each removed at its
# first hit and written to PROBE_OUT at once; detach when none is left.
GDB_SCRIPT = r'''
import gdb, json, os
out = os.environ["PROBE_OUT"]
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("set print thread-events off")
gdb.execute("set startup-with-shell off")
gdb.execute("starti", to_string=True)
exe = os.path.realpath(gdb.current_progspace().filename)
base = 0
with open(exe, "rb") as fh:
    pie = fh.read(18)[16] == 3  # e_type ET_DYN
if pie:
    with open("/proc/%d/maps" % gdb.selected_inferior().pid) as fh:
        for line in fh:
            p = line.split()
            if len(p) >= 6 and os.path.realpath(p[5]) == exe and int(p[2], 16) == 0:
                base = int(p[0].split("-")[0], 16)
                break
bps = {}
for item in json.loads(os.environ["PROBE_FUNCS"]):
    a = base + item[1]
    bps[a] = (item[0], gdb.Breakpoint("*" + hex(a), internal=True))
hits = []
def save():
    with open(out, "w") as fh:
        json.dump(hits, fh)
save()
while bps and gdb.selected_inferior().pid:
    try:
        gdb.execute("continue")
    except gdb.error as exc:
        print("probe: continue failed:", exc)
        break
    if not gdb.selected_inferior().pid:
        break
    pc = gdb.selected_frame().pc()
    if pc in bps:
        name, bp = bps.pop(pc)
        bp.delete()
        hits.append(name)
        save()
if gdb.selected_inferior().pid:
    gdb.execute("detach")
'''


def probe(commands: list[list[str]], funcs: dict[str, int], *, cwd: str | os.PathLike, log: str | os.PathLike,
          timeout_s: float) -> list[str]:
    """Run every argv of *commands* under gdb with breakpoints on *funcs* (name -> entry offset in the
    program the commands run); returns the names that ran, in order of their first hit."""
    if shutil.which("gdb") is None:
        raise ExerciseError("gdb is not installed (Debian: apt-get install gdb)")
    hits: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pairbench-exercise-") as tmp:
        script = Path(tmp) / "probe.py"
        script.write_text(GDB_SCRIPT)
        for i, argv in enumerate(commands):
            left = {k: v for k, v in funcs.items() if k not in hits}
            if not left:
                break
            out = Path(tmp) / f"hits{i}.json"
            env = {**os.environ, "PROBE_OUT": str(out), "PROBE_FUNCS": json.dumps(sorted(left.items()))}
            with open(log, "ab") as fh:
                fh.write(f"\n# exercise probe: gdb ... {Path(argv[0]).name} {' '.join(argv[1:])}\n".encode())
                fh.flush()
                try:
                    subprocess.run(["gdb", "-batch", "-nx", "-x", str(script), "--args", *argv], cwd=cwd, env=env,
                                   stdout=fh, stderr=subprocess.STDOUT, timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    raise ExerciseError(f"the probe of {Path(argv[0]).name} ran past {timeout_s:g} s") from None
            if not out.is_file():
                raise ExerciseError(f"gdb did not run {Path(argv[0]).name} (see the tool log)")
            hits += [h for h in json.loads(out.read_text()) if h not in hits]
    return hits


def exercise(*, baseline_dir: str | os.PathLike, candidate_dir: str | os.PathLike, binaries: list[str],
             commands: list[list[str]], log: str | os.PathLike, timeout_s: float) -> dict:
    """The ``exercise`` record of a candidate against the baseline (module docstring). *binaries* are
    paths relative to each arm's tree (the server first); *commands* the candidate's rendered tool
    commands, whose program must be one of *binaries*."""
    t0 = time.monotonic()
    rec = {"binaries": [Path(b).name for b in binaries], "changed": {}, "functions": {}, "probed": [],
           "hit": [], "exercised": None, "reason": None, "commands": [public_argv(c) for c in commands],
           "short": {}}
    try:
        for b in binaries:
            base, cand = Path(baseline_dir) / b, Path(candidate_dir) / b
            for p in (base, cand):
                if not p.is_file():
                    raise ExerciseError(f"{p.name} is not built in {p.parent} (build.cmake.targets)")
            rec["changed"][base.name], rec["functions"][base.name] = changed_functions(base, cand)
        tool = Path(commands[0][0]).name if commands else None
        changed = sorted({f for fs in rec["changed"].values() for f in fs})
        rec["short"] = short_names(changed)
        nice = lambda fs: ", ".join(rec["short"].get(f, f) for f in fs[:5]) + (" …" if len(fs) > 5 else "")
        if not changed:
            rec.update(exercised=False, reason="the patch leaves the code of every function of "
                       + " and ".join(rec["binaries"]) + " identical to the baseline's build")
            return rec
        if tool not in rec["changed"]:
            raise ExerciseError(f"the tool {tool} is not among the compared programs {rec['binaries']}")
        syms = text_symbols(Path(candidate_dir) / binaries[rec["binaries"].index(tool)])
        probed = {f: syms[f] for f in changed if f in syms}
        rec["probed"] = sorted(probed)
        rec["hit"] = probe(commands, probed, cwd=candidate_dir, log=log, timeout_s=timeout_s) if probed else []
        unseen = [f for f in changed if f not in syms]
        if rec["hit"]:
            rec.update(exercised=True, reason=f"{len(rec['hit'])} of the {len(changed)} changed functions ran "
                       f"under {tool}: {nice(rec['hit'])}")
        elif unseen:
            rec["reason"] = (f"none of the {len(probed)} changed functions that {tool} contains ran; "
                             f"{len(unseen)} changed functions exist only outside {tool} "
                             f"({nice(unseen)}), where the probe cannot see them")
        else:
            rec.update(exercised=False, reason=f"the patch changes {len(changed)} compiled function"
                       f"{'s' if len(changed) != 1 else ''} ({nice(changed)}) and none of them ran under {tool} "
                       "at the plan's lengths, output tokens and threads")
    except ExerciseError as exc:
        rec.update(exercised=None, reason=f"not probed: {exc}")
    finally:
        rec["duration_s"] = round(time.monotonic() - t0, 3)
    return rec


def status(rec: dict | None) -> dict | None:
    """The short, publishable form of an exercise record: ``exercised``, a ``status`` label, the counts,
    and up to 8 short function names (those that ran, else those that changed)."""
    if rec is None:
        return None
    changed = sorted({f for fs in rec["changed"].values() for f in fs})
    if rec["exercised"] is True:
        label = "exercised"
    elif rec["exercised"] is False:
        label = "not exercised: identical code" if not changed else "not exercised: no changed function ran"
    else:
        label = "unknown: not probed" if str(rec["reason"]).startswith("not probed") else "unknown: changes outside the tool"
    names = rec["hit"] or changed
    return {"exercised": rec["exercised"], "status": label, "changed": len(changed), "probed": len(rec["probed"]),
            "hit": len(rec["hit"]), "functions": [rec["short"].get(f, f)[:64] for f in names[:8]]}
