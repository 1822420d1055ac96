"""The catalogue of Python-function-completion tasks that the validation stage checks.

Every fixture prompt ends with one of these tasks: the pipeline places ``render_task(task)`` after
its synthetic filler, in one user chat message. The model is asked to complete a small Python
function and then to keep writing comments until it is stopped (the harness forces a fixed output
length with ``ignore_eos``, so the output always runs on past the function). The validation cases
(``pairbench.validate.cases``) then extract the function from the output and run the task's tests in a
sandbox (``pairbench.validate.sandbox``).

The tasks are deliberately simple: the default subject is SmolLM2-135M-Instruct, and a functional
case is only useful if the stock model passes it. Each task here was kept because the real model,
greedy, with ~200 tokens of neutral filler before it, produced a function that passes its tests;
``python -m pairbench.validate.tasks probe`` re-runs that check and docs/validation.md records what it saw.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Task:
    """One function-completion task.

    ``signature`` is the def line plus its docstring (what the model is shown); ``tests`` is Python
    source of plain ``assert`` statements that call ``entry_point``.
    """

    name: str
    entry_point: str
    signature: str
    tests: str


TASKS: tuple[Task, ...] = (
    Task(
        name="add",
        entry_point="add",
        signature='def add(a, b):\n    """Return the sum of a and b."""',
        tests="assert add(2, 3) == 5\nassert add(-1, 1) == 0\nassert add(0, 0) == 0\n",
    ),
    Task(
        name="is_even",
        entry_point="is_even",
        signature='def is_even(n):\n    """Return True if the integer n is even, otherwise False."""',
        tests=(
            "assert is_even(4) is True\nassert is_even(7) is False\n"
            "assert is_even(0) is True\nassert is_even(-3) is False\n"
        ),
    ),
    Task(
        name="max_of_three",
        entry_point="max_of_three",
        signature='def max_of_three(a, b, c):\n    """Return the largest of the three numbers a, b and c."""',
        tests=(
            "assert max_of_three(1, 2, 3) == 3\nassert max_of_three(3, 2, 1) == 3\n"
            "assert max_of_three(1, 3, 2) == 3\nassert max_of_three(-5, -2, -9) == -2\n"
        ),
    ),
    Task(
        name="reverse_string",
        entry_point="reverse_string",
        signature='def reverse_string(s):\n    """Return the string s reversed."""',
        tests=(
            "assert reverse_string('abc') == 'cba'\nassert reverse_string('') == ''\n"
            "assert reverse_string('racecar') == 'racecar'\n"
        ),
    ),
    Task(
        name="multiply",
        entry_point="multiply",
        signature='def multiply(a, b):\n    """Return the product of a and b."""',
        tests="assert multiply(2, 3) == 6\nassert multiply(-2, 4) == -8\nassert multiply(0, 9) == 0\n",
    ),
    Task(
        name="square",
        entry_point="square",
        signature='def square(x):\n    """Return x multiplied by itself."""',
        tests="assert square(3) == 9\nassert square(-4) == 16\nassert square(0) == 0\n",
    ),
)


def get_task(name: str) -> Task:
    """The task called *name*; a KeyError naming it (and the known names) otherwise."""
    for task in TASKS:
        if isinstance(name, str) and task.name == name:
            return task
    raise KeyError(f"unknown task {name!r} (known: {', '.join(t.name for t in TASKS)})")


def render_task(task: Task) -> str:
    """The task text the model sees, placed after the filler in the same user message."""
    return (
        "Complete the following Python function. Write the whole function in a ```python code "
        "block. After the code block, keep writing Python comments (lines starting with #) about "
        "the function until you are stopped.\n\n"
        f"```python\n{task.signature}\n```"
    )


def task_for(length: int, round: int | None = None) -> Task:
    """The task for a fixture of *length* prompt tokens (and optionally a *round*).

    Deterministic across processes and machines (sha256, not Python's salted ``hash``). Both arms
    of a round see the same fixture, so ``matches_baseline`` compares like with like.
    """
    if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
        raise ValueError(f"length must be a positive int, got {length!r}")
    if round is not None and (isinstance(round, bool) or not isinstance(round, int) or round < 0):
        raise ValueError(f"round must be a non-negative int or None, got {round!r}")
    key = f"{length}" if round is None else f"{length}/{round}"
    digest = hashlib.sha256(key.encode()).digest()
    return TASKS[int.from_bytes(digest[:8], "big") % len(TASKS)]


# --- the probe: does the real model pass each task? --------------------------------------------

#: Neutral filler (~200 tokens) placed before the task in the probe, like the pipeline's filler.
PROBE_FILLER = (
    "The town library opens at nine in the morning and closes at six in the evening. On weekdays "
    "the reading room is quiet, and most visitors come to borrow novels, travel guides and cookery "
    "books. The building was restored ten years ago: the old wooden shelves were kept, new lamps "
    "were fitted above the long tables, and a small garden was planted behind the main hall. In "
    "spring the garden is full of tulips, and in summer readers often sit on the benches under the "
    "two old lime trees. Once a month the librarians hold an evening of short talks about local "
    "history, the river, the mill that once stood beside the bridge, and the families who ran the "
    "market in the square. Children have their own corner with low chairs, picture books and a "
    "puppet theatre. The library also lends maps, board games and a few musical instruments, which "
    "must be returned within two weeks. Volunteers help with the catalogue and with the annual book "
    "sale, which raises money for new shelves and for the mobile library van that visits villages."
)


def probe(gguf: Path, max_new_tokens: int = 64, names: list[str] | None = None,
          out_dir: Path | None = None) -> dict[str, str]:
    """Run every task through the real model (transformers, offline, float32, greedy).

    Returns the output text per task name (only *names*, if given), each also written to
    ``out_dir/<task>.txt`` as soon as it is generated. Slow (~8 tokens/s on a small idle CPU, far
    less on a busy one): this is the evidence behind the catalogue, not a test.
    """
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    model.eval()
    texts = {}
    for task in TASKS:
        if names and task.name not in names:
            continue
        message = PROBE_FILLER + "\n\n" + render_task(task)
        ids = tok.apply_chat_template(
            [{"role": "user", "content": message}], add_generation_prompt=True, return_tensors="pt"
        )
        if not isinstance(ids, torch.Tensor):  # newer transformers return a BatchEncoding
            ids = ids["input_ids"]
        with torch.no_grad():
            # min_new_tokens masks EOS until the cap, as the harness's ignore_eos does
            # (llama.cpp biases EOS to -inf), so the output runs on past the function.
            out = model.generate(
                ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                do_sample=False, attention_mask=torch.ones_like(ids),
            )
        texts[task.name] = tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=True)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"{task.name}.txt").write_text(texts[task.name])
        print(f"{task.name}: generated ({ids.shape[1]} prompt tokens)", file=sys.stderr, flush=True)
    return texts


def evaluate(texts: dict[str, str]) -> dict[str, dict]:
    """The done_marker and python_function verdicts of each task's output (as the pipeline runs them)."""
    from pairbench.validate import cases as validate

    rows = {}
    for name, text in texts.items():
        task = get_task(name)
        v = validate.run_cases(
            ["done_marker", "python_function"], record={}, output={"text": text, "token_ids": []},
            fixture={"length": 1, "output_tokens": 0, "task": name}, baseline_output=None,
        )
        rows[name] = {
            "output_sha256": validate.sha256_text(text),
            "done_marker": v["done_marker"]["verdict"],
            "python_function": v["python_function"]["verdict"],
            "reason": v["python_function"]["reason"],
            "entry_point": task.entry_point,
        }
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pairbench.validate.tasks", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("probe", help="run every task through the real model, store and judge the outputs")
    p.add_argument("--gguf", type=Path, default=Path("resources/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--tasks", nargs="*", default=None, help="only these tasks (default: all)")
    e = sub.add_parser("evaluate", help="judge outputs already stored in --out")
    for q in (p, e):
        q.add_argument("--out", type=Path, required=True,
                       help="folder for <task>.txt outputs and the verdicts (smollm2.json)")
    args = parser.parse_args(argv)
    if args.cmd == "probe":
        if not args.gguf.exists():
            parser.error(f"--gguf {args.gguf} does not exist (run ./install.sh)")
        for name in args.tasks or []:
            get_task(name)
        probe(args.gguf, args.max_new_tokens, args.tasks, args.out)
    texts = {t.name: (args.out / f"{t.name}.txt").read_text()
             for t in TASKS if (args.out / f"{t.name}.txt").exists()}
    if args.cmd == "evaluate":
        if not texts:
            parser.error(f"--out {args.out} holds no <task>.txt outputs")
    rows = evaluate(texts)
    summary = {"description": "SmolLM2-135M-Instruct Q4_1 outputs per task (transformers, float32, "
                              "greedy, EOS masked up to max_new_tokens like ignore_eos, PROBE_FILLER before the task) "
                              "and their verdicts",
               "max_new_tokens": getattr(args, "max_new_tokens", None), "outputs": rows}
    (args.out / "smollm2.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    for name, row in rows.items():
        print(f"{name}: done_marker={row['done_marker']} python_function={row['python_function']} "
              f"({row['reason']})")
    return 0 if all(r["python_function"] == "pass" for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
