"""pairbench: paired A/B benchmark of two engine arms. Run: snakemake --cores 1 (see README.md)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from pairbench.core.configsource import yaml_syntax_error

# --configfile replaces config/config.yaml (config/README.md), so the default is read only without
# one: Snakemake then neither merges the two nor says it did. Its YAML is checked first, since
# Snakemake's own message for a syntax error names neither file nor line.
if not workflow.config_settings.configfiles:
    if yaml_syntax_error("config/config.yaml"):
        sys.exit(yaml_syntax_error("config/config.yaml"))

    configfile: "config/config.yaml"



# A study (a config with `study:`, e.g. config/study.yaml) runs this Snakefile once per comparison,
# as a module (workflow/rules/study.smk); anything else is one run.
if "study" in config:

    include: "workflow/rules/study.smk"

    # Here, not in study.smk: an included file's default target does not outlive the include.
    rule all:
        default_target: True
        input:
            f"results/{STUDY['name']}/index.md",
            # every comparison's every artifact (its own `all`), so deleting one redoes it
            *(item for m in MODULES.values() for item in getattr(rules, f"{m}_all").input),

else:

    include: "workflow/rules/common.smk"
    include: "workflow/rules/plan.smk"
    include: "workflow/rules/source.smk"
    include: "workflow/rules/build.smk"
    include: "workflow/rules/fixtures.smk"
    include: "workflow/rules/warmup.smk"
    include: "workflow/rules/measure.smk"
    include: "workflow/rules/validate.smk"
    include: "workflow/rules/stats.smk"
    include: "workflow/rules/crosscheck.smk"
    include: "workflow/rules/cost.smk"
    include: "workflow/rules/plots.smk"
    include: "workflow/rules/publish.smk"
    include: "workflow/rules/audit.smk"
    include: "workflow/rules/gate.smk"


    rule all:
        """Every artifact of the run, the audit last."""
        default_target: True
        input:
            # Every artifact is named here, not only the bundle: deleting one (a visit, say) and
            # running again then redoes it and what depends on it, instead of leaving it missing.
            rules.plan.output,
            *(L.per_arm(stage, a) for stage in PER_ARM for a in arms(CFG)),
            rules.fixtures.output.fixtures,
            # each visit's own artifacts by name (a checkpoint being redone must not hide the others),
            # then the retries its validation earned
            lambda wc: [p for v in run_visit_ids(CFG) for p in (L.measure(v), L.validate(v))],
            lambda wc: chain_artifacts(CFG, 0, retries_only=True) + chain_artifacts(CFG, 1, retries_only=True),
            lambda wc: [path for _, path in adapt_decisions(CFG)],
            rules.stats.output,
            rules.plots.output,
            rules.crosscheck_compare.output if crosscheck_arms(CFG) else [],
            rules.cost.output.costs,
            rules.cost_compare.output if cost_arms(CFG) else [],
            rules.publish.output,
            rules.landing.output,
            rules.retire.output,
            rules.provenance.output,
            rules.audit.output,
