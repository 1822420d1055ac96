"""Snakemake entry point for the `publish` rule: report and sanitized bundle (the logic lives in pairbench.stages.run)."""
import sys

sys.stderr = open(snakemake.log[0], "w")

import logging  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # this checkout's pairbench, never an installed copy
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
logging.getLogger("httpx").setLevel(logging.WARNING)

from pairbench.stages import run as stages  # noqa: E402

i = snakemake.input
stages.publish_stage(
    publish_dir=snakemake.params.bundle, private_dir=snakemake.params.private_dir, plan_path=i.plan,
    source_paths=list(i.sources), build_paths=list(i.builds), fixture_paths=list(i.fixtures),
    prompt_paths=list(i.prompts), warmup_paths=list(i.warmups), measure_paths=list(i.measures),
    validate_paths=list(i.validations), summary_path=i.summary,
    tables={"measurements": i.measurements, "summary": i.summary_csv, "paired": i.paired_csv,
            "ratios": i.ratios_csv, "timing_agreement": i.timing_csv},
    plots={"ratios": i.ratios_png, "drift": i.drift_png}, res_dir=snakemake.params.res_dir,
    root=snakemake.params.root,
)
