"""Stored runs' published verdicts recompute unchanged: a refactor of the statistics (issue 34's one
interval reading, say) must give the same ``stats/summary.json`` on the same measurements.

Each folder of tests/data/summaries is one real pipeline run, made with the code before issue 34:

- ``tiny``: ``snakemake --cores 1 --configfile tests/config/tiny.yaml`` (the embedded engine, stock
  against int8 KV, 2 rounds): every interval unbounded (inconclusive), KV bytes an exact ratio (smaller);
- ``fake8``: ``tests/config/fake.yaml --config rounds=8 label=fake8`` (two identical fake engines):
  bounded intervals that are inconclusive, memory exact and equivalent;
- ``load-fake8``: ``tests/load/load_fake.yaml --config rounds=8 label=load-fake8`` (the batching fake,
  a cheaper candidate): faster at every level, and the SLO capacity compared (more).

Each holds what the run published (``stats_params.json``, ``tables/measurements.csv``, from
``results/<label>/publish/``) and its ``stats/summary.json`` without ``inputs`` (artifact hashes)
and ``schema``. The test recomputes the summary from the first two, as ``verify`` does, and compares
every field. Should an artifact's shape change on purpose, remake the folder from a new run the same
way (or, for a renamed key, rename it in the stored files) and say in the commit what changed: the
load run's ``load.mode`` was renamed ``load.factor`` (stats_params v4, summary v4) after the run.
"""

import json
import math
from pathlib import Path

import pytest

from pairbench.publish.recompute import recompute

DATA = Path(__file__).resolve().parents[1] / "data" / "summaries"
RUNS = sorted(p.name for p in DATA.iterdir() if p.is_dir())


def differences(stored, got, path=""):
    """Every path where two JSON bodies differ (floats exactly: the same code path gives the same bits)."""
    if isinstance(stored, dict) and isinstance(got, dict):
        for k in sorted(set(stored) | set(got)):
            if k not in stored or k not in got:
                yield f"{path}.{k}: only {'stored' if k in stored else 'recomputed'}"
            else:
                yield from differences(stored[k], got[k], f"{path}.{k}")
    elif isinstance(stored, list) and isinstance(got, list) and len(stored) == len(got):
        for i, (a, b) in enumerate(zip(stored, got)):
            yield from differences(a, b, f"{path}[{i}]")
    elif stored != got and not (isinstance(stored, float) and isinstance(got, float)
                                and math.isnan(stored) and math.isnan(got)):
        yield f"{path}: stored {stored!r}, recomputed {got!r}"


def test_the_stored_runs_cover_every_kind_of_verdict():
    seen = set()
    for run in RUNS:
        body = json.loads((DATA / run / "summary.json").read_text())
        for pair in body["comparisons"].values():
            seen |= {e["verdict"] for cells in pair["paired"].values() for e in cells.values()}
            seen |= {("memory", e["verdict"], e["exact"]) for cells in pair["memory"].values() for e in cells.values()}
        cap = (body.get("load") or {}).get("capacity") or {"comparisons": {}}
        seen |= {("capacity", e["verdict"]) for curves in cap["comparisons"].values() for e in curves.values()}
    assert {"inconclusive", "faster", None, ("memory", "smaller", True), ("memory", "equivalent", True),
            ("capacity", "more")} <= seen, seen


@pytest.mark.parametrize("run", RUNS)
def test_a_stored_run_s_summary_recomputes_unchanged(run):
    stored = json.loads((DATA / run / "summary.json").read_text())
    _, summary = recompute(DATA / run)
    got = json.loads(json.dumps(summary))  # as written: tuples as lists, keys as strings
    assert list(differences(stored, got)) == []
