"""pairbench: paired A/B benchmark of two engine arms. Run: snakemake --cores 1 (see README.md)."""


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
    include: "workflow/rules/plots.smk"
    include: "workflow/rules/publish.smk"
    include: "workflow/rules/audit.smk"


    rule all:
        default_target: True
        input:
            # Every artifact is named here, not only the bundle: deleting one (a visit, say) and
            # running again then redoes it and what depends on it, instead of leaving it missing.
            lambda wc: all_artifacts(CFG, RES, run_visit_ids(), LENGTHS),
            lambda wc: chain_artifacts(0, retries_only=True) + chain_artifacts(1, retries_only=True),
            f"{RES}/report/landing.rst",
            f"{RES}/private/retired.json",
            f"{RES}/provenance.json",
            f"{RES}/audit.json",
