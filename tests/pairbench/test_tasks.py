"""The task catalogue: well-formed tasks whose tests accept a right answer and reject a wrong one,
the task message, and the deterministic task choice."""

import ast
import dataclasses
import subprocess
import sys

import pytest

from pairbench.core import tasks
from pairbench.validate.sandbox import run_python_tests

# One right and one plausible wrong body per task: the tests must tell them apart.
REFERENCE = {
    "add": ("return a + b", "return a - b"),
    "is_even": ("return n % 2 == 0", "return n % 2 == 1"),
    "max_of_three": ("return max(a, b, c)", "return max(a, b)"),
    "reverse_string": ("return s[::-1]", "return s"),
    "multiply": ("return a * b", "return a + b"),
    "square": ("return x * x", "return x * 2"),
}


def _with_body(task, body):
    return f"{task.signature}\n    {body}\n"


def test_catalogue_is_small_unique_and_frozen():
    assert 4 <= len(tasks.TASKS) <= 8
    names = [t.name for t in tasks.TASKS]
    assert len(set(names)) == len(names)
    with pytest.raises(dataclasses.FrozenInstanceError):
        tasks.TASKS[0].name = "x"
    assert set(names) == set(REFERENCE), "every task needs a reference answer in this test"


@pytest.mark.parametrize("task", tasks.TASKS, ids=lambda t: t.name)
def test_task_is_well_formed(task):
    tree = ast.parse(task.signature + "\n    pass\n")
    (func,) = tree.body
    assert isinstance(func, ast.FunctionDef) and func.name == task.entry_point
    assert ast.get_docstring(func)
    test_tree = ast.parse(task.tests)
    assert test_tree.body and all(isinstance(s, ast.Assert) for s in test_tree.body)
    assert task.entry_point in task.tests


@pytest.mark.parametrize("task", tasks.TASKS, ids=lambda t: t.name)
def test_tests_accept_the_right_answer_and_reject_a_wrong_one(task):
    right, wrong = REFERENCE[task.name]
    assert run_python_tests(_with_body(task, right), task.tests)["verdict"] == "pass"
    assert run_python_tests(_with_body(task, wrong), task.tests)["verdict"] == "fail"


def test_render_task_shows_the_signature_and_asks_for_comments():
    task = tasks.get_task("add")
    text = tasks.render_task(task)
    assert task.signature in text
    assert "```python" in text
    assert "comment" in text.lower() and "until you are stopped" in text


def test_task_for_is_deterministic_across_processes(repo_root):
    here = [tasks.task_for(n).name for n in (64, 128, 256, 512, 1024, 2048)]
    code = ("from pairbench.core import tasks; "
            "print(','.join(tasks.task_for(n).name for n in (64, 128, 256, 512, 1024, 2048)))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={"PYTHONPATH": str(repo_root / "workflow"), "PYTHONHASHSEED": "123"})
    assert there.stdout.strip().split(",") == here


def test_task_for_uses_the_whole_catalogue_and_the_round():
    chosen = {tasks.task_for(n).name for n in range(1, 200)}
    assert chosen == {t.name for t in tasks.TASKS}
    by_round = {tasks.task_for(256, r).name for r in range(50)}
    assert len(by_round) > 1
    assert tasks.task_for(256, 3) == tasks.task_for(256, 3)


@pytest.mark.parametrize("length, rnd", [(0, None), (-5, None), (True, None), ("256", None), (256, -1)])
def test_task_for_rejects_bad_arguments(length, rnd):
    with pytest.raises(ValueError):
        tasks.task_for(length, rnd)


def test_get_task_names_the_unknown_task():
    with pytest.raises(KeyError, match="'nope'.*add"):
        tasks.get_task("nope")
