"""Stage 6: statistics — measurements table, per arm x length summaries, paired ratios, verdicts."""


rule stats:
    input:
        plan=f"{RES}/plan.json",
        # every visit's, then each validation retry's after it (common.smk: validation_chain)
        measures=lambda wc: chain_artifacts(0),
        validations=lambda wc: chain_artifacts(1),
    output:
        summary=f"{RES}/stats/summary.json",
        measurements=report(f"{RES}/tables/measurements.csv", caption="../report/measurements.rst", category="2 Measurements"),
        summary_csv=report(f"{RES}/tables/summary.csv", caption="../report/summary.rst", category="1 Summary"),
        paired_csv=report(f"{RES}/tables/paired.csv", caption="../report/paired.rst", category="1 Summary"),
        ratios_csv=f"{RES}/tables/ratios.csv",
        timing_csv=f"{RES}/tables/timing_agreement.csv",
    params:
        stats=CFG["stats"],
    log:
        f"{LOGS}/stats.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/stats.py"
