"""Stages 7-8: sanitization and report — the allowlisted, scrubbed, leak-gated bundle with README.md."""


rule publish:
    input:
        plan=f"{RES}/plan.json",
        sources=expand(f"{RES}/source/{{arm}}.json", arm=ARMS),
        builds=expand(f"{RES}/build/{{arm}}.json", arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
        warmups=expand(f"{RES}/warmup/{{arm}}.json", arm=ARMS),
        # every visit's, then each validation retry's after it (common.smk: validation_chain)
        measures=lambda wc: chain_artifacts(0),
        validations=lambda wc: chain_artifacts(1),
        summary=f"{RES}/stats/summary.json",
        measurements=f"{RES}/tables/measurements.csv",
        summary_csv=f"{RES}/tables/summary.csv",
        paired_csv=f"{RES}/tables/paired.csv",
        ratios_csv=f"{RES}/tables/ratios.csv",
        memory_csv=f"{RES}/tables/memory.csv",
        timing_csv=f"{RES}/tables/timing_agreement.csv",
        ratios_png=f"{RES}/plots/ratios.png",
        drift_png=f"{RES}/plots/drift.png",
        # [] unless both compared arms' engines have a cross-check tool (common.smk: crosscheck_arms)
        crosscheck=[f"{RES}/stats/crosscheck.json"] if CROSSCHECK else [],
        # the measuring nodes' facts (environment.json describes the first visit's node)
        hosts=lambda wc: [f"{RES}/private/hosts/{v}.json" for v in run_visit_ids()],
    output:
        # Files, not directory(): Snakemake would drop a .snakemake_timestamp into a directory
        # output, and the bundle must hold exactly what MANIFEST.json lists.
        manifest=f"{RES}/publish/MANIFEST.json",
        report=f"{RES}/publish/README.md",
    params:
        bundle=lambda wc, output: str(Path(output.manifest).parent),
        private_dir=lambda wc, output: str(Path(output.manifest).parent.parent / "private"),
        res_dir=lambda wc, output: str(Path(output.manifest).parent.parent),
        root=str(ROOT),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/publish.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/publish.py"
