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
