"""A study (workflow/rules/study.smk, docs/cluster.md) through the ``snakemake`` CLI, in a temporary
copy of the repository:

- a one-comparison study of tests/config/tiny.yaml runs end to end: the comparison's run folder is
  a complete run (audit passed, bundle verifies) and the index page links its report;
- adding a second comparison to the study redoes nothing of the first: the dry run lists only the
  new comparison's jobs and the index;
- forcing one comparison's statistics reruns only that comparison's downstream jobs;
- a bad study names the key.
"""

from __future__ import annotations

import re

import pytest
import yaml
from pairbench.core.artifacts import read_artifact
from pairbench.publish.verify import verify_bundle

from tests.workflow.test_pipeline import copy_repo, snakemake

pytestmark = pytest.mark.slow

ONE = {"study": {"name": "s", "base": "tests/config/tiny.yaml", "comparisons": {"tiny-a": None}}}
TWO = {"study": {**ONE["study"], "comparisons": {"tiny-a": None, "tiny-b": {"overrides": {"seed": 1}}}}}


def job_counts(out: str) -> dict[str, int]:
    """A dry run's 'Job stats' table as {rule: count}."""
    m = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\n\n", out, re.DOTALL)
    assert m, out[-3000:]
    return {name: int(n) for name, n in (line.split() for line in m.group(1).splitlines()) if name != "total"}


@pytest.fixture(scope="module")
def one_comparison(tmp_path_factory):
    work = copy_repo(tmp_path_factory.mktemp("study"))
    (work / "one.yaml").write_text(yaml.safe_dump(ONE))
    (work / "two.yaml").write_text(yaml.safe_dump(TWO))
    snakemake(work, "--cores", "2", "--configfile", "one.yaml")
    return work


def test_a_comparison_is_a_complete_run_and_the_index_links_its_report(one_comparison):
    res = one_comparison / "results" / "tiny-a"
    assert read_artifact(res / "audit.json", "audit")["ok"]
    assert verify_bundle(res / "publish") == []
    index = (one_comparison / "results" / "s" / "index.md").read_text()
    assert "| [tiny-a](../tiny-a/publish/README.md) | candidate vs baseline | decode_tok_s | `in400-out8` | **" in index


def test_adding_a_comparison_runs_only_its_jobs(one_comparison):
    out = snakemake(one_comparison, "-n", "--configfile", "two.yaml")
    counts = job_counts(out.stdout + out.stderr)
    assert {"study_index", "all"} <= set(counts)
    assert [r for r in counts if r not in ("study_index", "all") and not r.startswith("tiny_b_")] == [], counts
    assert counts["tiny_b_measure"] == 4


def test_rerunning_one_comparisons_statistics_touches_no_other(one_comparison):
    out = snakemake(one_comparison, "-n", "--configfile", "one.yaml", "-R", "tiny_a_stats")
    counts = job_counts(out.stdout + out.stderr)
    assert "tiny_a_stats" in counts and "tiny_a_measure" not in counts, counts
    assert set(counts) <= {"tiny_a_stats", "tiny_a_plots", "tiny_a_landing", "tiny_a_publish", "tiny_a_provenance",
                           "tiny_a_audit", "study_index", "all"}, counts


@pytest.mark.parametrize(("study", "message"), [
    ({"comparisons": {"x": {"overrides": {"label": "y"}}}, "base": "tests/config/tiny.yaml"},
     "study.comparisons.x.overrides.label: a comparison's label is its name (x)"),
    ({"comparisons": {"x": {"config": "missing.yaml"}}},
     "study.comparisons.x.config: config file missing.yaml does not exist"),
    ({"comparisons": {"x": {"patches": []}}}, "config key 'study.comparisons.x.patches': unknown key"),
])
def test_a_bad_study_names_the_key(one_comparison, study, message):
    (one_comparison / "bad.yaml").write_text(yaml.safe_dump({"study": study}))
    proc = snakemake(one_comparison, "-n", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0 and message in proc.stdout + proc.stderr, proc.stderr[-2000:]
