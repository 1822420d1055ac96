"""A study: many comparisons, one command (``snakemake --configfile config/study.yaml``; docs/cluster.md).

Each comparison is the whole pipeline as a Snakemake ``module`` of this repository's Snakefile, with
that comparison's config (pairbench.study.comparisons): its rules are ``<module>_<rule>``, its files
``results/<label>/`` exactly as a single run writes them, and its validation, helpers and wildcard
constraints its own (a module is its own namespace). Adding a comparison adds only its jobs;
rerunning one touches no other's files. ``study_index`` sums every comparison up on one page.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from pairbench.core.config import ConfigError
from pairbench.stages.runconfig import display_path
from pairbench.study import comparisons as pb_study

# The study file as given (the Snakefile reads config/config.yaml only without --configfile). A
# problem with it stops the run before any job, naming the key and the file, without a traceback.
try:
    STUDY = pb_study.study_section(
        dict(workflow.config_settings.overwrite_config) if workflow.config_settings.configfiles else dict(config),
        Path(workflow.current_basedir.get_path_or_uri(secret_free=True)) / "../schemas/study.schema.yaml",
    )
    COMPARISONS = pb_study.comparison_configs(STUDY, Path(workflow.basedir))
    MODULES = pb_study.module_names(list(COMPARISONS))
except ConfigError as exc:
    sys.exit(f"pairbench: 1 config error (nothing was run):\n"
             f"  {', '.join(display_path(f) for f in workflow.config_settings.configfiles)}: {exc}")


for comparison_name, comparison_config in COMPARISONS.items():
    study_module = MODULES[comparison_name]
    study_prefix = f"{study_module}_"

    module:
        name: study_module
        snakefile: "../../Snakefile"
        config: comparison_config

    use rule * from study_module as study_prefix*


# A page from files already on the shared disk: written by the submitting host, no Slurm job (a
# site that requires --account would reject a job without one).
localrules: study_index


rule study_index:
    """One page of every comparison's verdicts, each linking its report (results/<study>/index.md)."""
    input:
        # audit.json is each comparison's last artifact (it needs every other), so asking for it
        # asks for the whole run
        audits=[f"results/{c}/audit.json" for c in COMPARISONS],
        summaries=[f"results/{c}/stats/summary.json" for c in COMPARISONS],
        reports=[f"results/{c}/publish/README.md" for c in COMPARISONS],
    output:
        index=f"results/{STUDY['name']}/index.md",
    params:
        labels=list(COMPARISONS),
        study=STUDY["name"],
    log:
        f"logs/{STUDY['name']}/study_index.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/study_index.py"
