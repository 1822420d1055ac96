"""Snakemake entry point for the `measure` and `measure_retry` rules: one visit (or a validation retry's partial visit): launch, first request, steady requests, gates, stop (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)
# Per-request progress also goes to the console Snakemake runs in, so a long run visibly moves.
_console = logging.StreamHandler(sys.__stderr__)
_console.setFormatter(logging.Formatter("%(message)s"))
logging.getLogger("pairbench.progress").addHandler(_console)

from pairbench.stages import run as stages  # noqa: E402

try:
    common = dict(visit=snakemake.params.visit, arm_dir=snakemake.params.arm_dir,
                  arm_cfg=snakemake.params.arm_config, server_cfg=snakemake.params.server,
                  server_log=snakemake.log.server, root=snakemake.params.root,
                  attempt=snakemake.resources.attempt, pid_path=snakemake.params.pid_file)
    if "n" in snakemake.wildcards.keys():  # rule measure_retry: a validation retry (a partial visit)
        stages.measure_retry_stage(
            snakemake.output.measure, snakemake.output.outputs, snakemake.input.plan, snakemake.input.build,
            list(snakemake.input.fixtures), list(snakemake.input.prompts), snakemake.input.previous_measure,
            snakemake.input.previous_validate, int(snakemake.wildcards.n), list(snakemake.params.retry_on), **common)
    else:
        stages.measure_stage(
            snakemake.output.measure, list(snakemake.output.outputs), snakemake.output.marker, snakemake.input.plan,
            snakemake.input.build, list(snakemake.input.fixtures), list(snakemake.input.prompts), **common)
except Exception as exc:  # the failing visit, arm, round and length on the console, not only in the log
    print(f"measure {Path(snakemake.output.measure).stem} FAILED: {exc}", file=sys.__stderr__)
    raise
