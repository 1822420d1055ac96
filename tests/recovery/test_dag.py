"""`snakemake --rulegraph` / `--dag` print graphs that parse, so no print in the Snakefile (or in any
code it imports) can corrupt them, and the graph holds the stages users expect to see.

The dot text is parsed by pydot (a real dot grammar), not by a regex; the mermaid-js form is checked
line by line against mermaid's flowchart syntax for nodes and edges.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pydot
import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "tests" / "config" / "tiny.yaml"
STAGES = {"all", "plan", "measure", "validate", "provenance", "audit"}


def snakemake(*args: str) -> str:
    cmd = ["snakemake", "--cores", "1", *args]
    if TINY.exists():
        cmd += ["--configfile", str(TINY)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def parse_dot(text: str) -> pydot.Dot:
    graphs = pydot.graph_from_dot_data(text)
    assert graphs and len(graphs) == 1, f"stdout is not one dot graph:\n{text[:500]}"
    return graphs[0]


def labels(graph: pydot.Dot) -> set[str]:
    out = set()
    for node in graph.get_nodes():
        label = (node.get_label() or "").strip('"')
        if label:
            out.add(label.split("\\n")[0])
    return out


def test_rulegraph_is_pure_dot_with_every_stage():
    text = snakemake("--rulegraph")
    assert text.lstrip().startswith("digraph"), text[:200]
    graph = parse_dot(text)
    names = labels(graph)
    missing = {s for s in STAGES if not any(n == s or n.startswith(s) for n in names)}
    assert not missing, f"stages missing from the rule graph: {sorted(missing)} (have {sorted(names)})"
    assert len(graph.get_edges()) >= len(names) - 1  # connected enough to be a pipeline, not a list


@pytest.mark.slow
def test_dag_is_pure_dot_with_one_job_per_visit():
    graph = parse_dot(snakemake("--dag"))
    jobs = [n.get_label().strip('"') for n in graph.get_nodes() if n.get_label()]
    visits = [j for j in jobs if j.split("\\n")[0] == "measure"]
    assert len(visits) >= 2, jobs


MERMAID_LINE = re.compile(
    r"^\s*(flowchart|graph)\s+(TB|TD|BT|RL|LR)\s*$"
    r"|^\s*id\d+\[[^\]]*\]\s*$|^\s*id\d+\s*-->\s*id\d+\s*$"
    r"|^\s*(classDef|class|style|linkStyle)\s.*$|^\s*%%.*$|^\s*---\s*$|^\s*title:.*$|^\s*$"
)


def test_rulegraph_mermaid_has_only_mermaid_lines():
    text = snakemake("--rulegraph", "mermaid-js")
    bad = [line for line in text.splitlines() if not MERMAID_LINE.match(line)]
    assert not bad, f"lines that are not mermaid flowchart syntax: {bad[:5]}"
    assert re.search(r"-->", text)


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["snakemake", "--cores", "1", "--configfile", str(TINY), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_the_plan_is_printed_before_a_dry_run_and_on_stderr_under_a_graph():
    dry = run("-n")
    assert dry.stdout.startswith("pairbench plan 'tiny' -> results/tiny/ (config: "), dry.stdout[:300]
    assert "\n  visits: 4, 1 steady request(s) per condition each\n" in dry.stdout
    graph = run("--rulegraph")
    parse_dot(graph.stdout)
    assert "pairbench plan 'tiny'" in graph.stderr and "pairbench plan" not in graph.stdout


def test_every_rule_has_a_one_line_description():
    out = run("--list-rules").stdout
    rules = re.findall(r"^(\w+)(?: \((.*)\))?$", out, re.M)
    assert len(rules) >= 19 and [name for name, doc in rules if not doc] == [], out
    assert not re.search(r"^\s+\S", out, re.M), f"a description spans more than one line:\n{out}"
