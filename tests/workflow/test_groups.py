"""The measuring job group (workflow/rules/common.smk: one Slurm job per comparison's visits) exists
only under a cluster executor; the real-Slurm test (tests/cluster/) checks that it does there."""

import pytest

from tests.engines.pipeline_support import copy_checkout, snakemake

pytestmark = pytest.mark.slow


def test_a_local_run_given_jobs_has_no_measuring_group(tmp_path):
    # --jobs is kept beside --cores by a local run too: it used to be read as "on a cluster"
    work = copy_checkout(tmp_path / "repo")
    proc = snakemake(work, "-n", "--jobs", "2", "--configfile", "tests/config/tiny.yaml")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    assert "rule measure:" in out
    assert "Group job" not in out, out[-3000:]
