"""Probe the task catalogue with the real model: does stock SmolLM2 pass every task?

``python -m pairbench.validate.probe probe --gguf <gguf> --out DIR`` generates each task's output
with HF transformers (greedy, EOS masked like ``ignore_eos``), stores it, and judges it with the
validation cases the pipeline runs; ``evaluate --out DIR`` re-judges stored outputs. A task is only
kept in :mod:`pairbench.core.tasks` when the stock model passes it (docs/validation.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pairbench.validate import cases as validate
from pairbench.core.tasks import TASKS, get_task, render_task

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
    rows = {}
    for name, text in texts.items():
        task = get_task(name)
        v = validate.run_cases(
            ["done_marker", "python_function"], record={}, output={"text": text, "token_ids": []},
            fixture={"input_tokens": 1, "output_tokens": 0, "task": name}, baseline_output=None,
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
    parser = argparse.ArgumentParser(prog="python -m pairbench.validate.probe", description=__doc__.split("\n")[0])
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
