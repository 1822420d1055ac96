"""One step runner: run a command as a named step, log it, and record it.

Every subprocess the harness keeps a record of goes through :func:`run_step`: an arm's build
command, its CMake configure and compile, the embedded engine's model conversion, the version
probe, and the engine's own benchmark tool. The step's command line and output go to its log file;
back comes the record the artifacts keep (``step``, ``argv``, ``exit_code``, ``duration_s``) with
whatever output the caller asked to capture. A step that fails raises :class:`StepError`, whose
message names the step, what went wrong (its exit status, its time limit, or a missing program)
and the log to read.

The recorded ``argv`` is public: this interpreter is ``python``, and any other absolute path is
reduced to its file name (the tree's and the model's location are private).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal

__all__ = ["StepError", "StepResult", "public_argv", "run_step"]

Capture = Literal["none", "stdout", "both"]


class StepError(Exception):
    """A step failed. ``reason`` is ``exit``, ``timeout`` or ``not_found``; ``record`` is the step's
    record as far as it got (``exit_code`` None and ``timed_out`` True after a timeout; 127 for a
    missing program); ``output`` is what the step printed (captured, or read back from the log)."""

    def __init__(self, message: str, *, step: str, reason: str, record: dict, log: Path, output: str = ""):
        super().__init__(message)
        self.step, self.reason, self.record, self.log, self.output = step, reason, record, log, output


@dataclass(frozen=True)
class StepResult:
    """A finished step: its ``record`` and the output captured (empty where it went to the log only)."""

    record: dict
    stdout: str = ""
    stderr: str = ""

    @property
    def exit_code(self) -> int:
        return self.record["exit_code"]


def public_argv(argv: list[str]) -> list[str]:
    """*argv* as an artifact may show it: this interpreter as ``python``, other absolute paths as file names."""
    return ["python" if a == sys.executable else os.path.basename(a) if os.path.isabs(a) else a for a in argv]


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def run_step(step: str, argv: list[str], *, cwd: str | os.PathLike, log: str | os.PathLike,
             env: dict | None = None, timeout_s: float | None = None, capture: Capture = "none",
             check: bool = True, subject: str | None = None,
             diagnose: Callable[[str], str | None] | None = None) -> StepResult:
    """Run *argv* in *cwd* as the step *step*, appending ``$ <argv>`` and its output to *log*.

    *capture*: ``none`` streams stdout and stderr into the log; ``stdout`` captures stdout (stderr
    streams into the log); ``both`` captures both. Captured output is appended to the log when the
    step ends. *env* is the whole environment (None: this process's). *subject* is how messages name
    the step (default ``step '<step>'``); *diagnose* turns the failed step's output into a line worth
    quoting (say, a compiler's first error).

    Returns the :class:`StepResult`. With *check* (the default) a non-zero exit raises
    :class:`StepError`; so do, always, a timeout and a missing program.
    """
    subject = subject or f"step {step!r}"
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    argv = [str(a) for a in argv]
    record = {"step": step, "argv": public_argv(argv), "exit_code": None, "duration_s": 0.0}
    t0 = time.perf_counter()
    with open(log, "a") as fh:
        fh.write(f"$ {' '.join(argv)}\n")
        fh.flush()
        start = fh.tell()
        out = subprocess.PIPE if capture in ("stdout", "both") else fh
        err = subprocess.PIPE if capture == "both" else (fh if capture == "stdout" else subprocess.STDOUT)
        try:
            proc = subprocess.run(argv, cwd=cwd, env=env, stdout=out, stderr=err, text=True, timeout=timeout_s)
        except FileNotFoundError as exc:
            record.update(exit_code=127, duration_s=time.perf_counter() - t0)
            fh.write(f"{exc.filename}: not found\n")
            raise StepError(f"{subject}: {os.path.basename(str(exc.filename))} not found; see {log}", step=step,
                            reason="not_found", record=record, log=log) from None
        except subprocess.TimeoutExpired as exc:
            record.update(duration_s=time.perf_counter() - t0, timed_out=True, timeout_s=timeout_s)
            fh.write(_text(exc.stderr) + _text(exc.stdout))
            fh.write(f"({subject} exceeded {timeout_s:g} s and was killed)\n")
            raise StepError(f"{subject} exceeded {timeout_s:g} s; see {log}", step=step, reason="timeout",
                            record=record, log=log) from None
        record.update(exit_code=proc.returncode, duration_s=time.perf_counter() - t0)
        stdout, stderr = proc.stdout or "", proc.stderr or ""
        fh.write(stderr + stdout)
    if check and proc.returncode != 0:
        output = stderr + stdout
        if capture != "both":
            with open(log, errors="replace") as fh:
                fh.seek(start)
                output = fh.read()
        extra = diagnose(output) if diagnose else None
        tail = f"{extra}\nsee {log}" if extra else f"see {log}"
        raise StepError(f"{subject} exited with status {proc.returncode}; {tail}", step=step, reason="exit",
                        record=record, log=log, output=output)
    return StepResult(record=record, stdout=stdout, stderr=stderr)
