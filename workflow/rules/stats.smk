"""Stage 6: statistics — measurements table, per arm x length summaries, paired ratios, verdicts."""


rule stats:
    input:
        plan=f"{RES}/plan.json",
        measures=expand(f"{RES}/measure/{{visit}}.json", visit=VISIT_IDS),
        validations=expand(f"{RES}/validate/{{visit}}.json", visit=VISIT_IDS),
    output:
        summary=f"{RES}/stats/summary.json",
        measurements=f"{RES}/tables/measurements.csv",
        summary_csv=f"{RES}/tables/summary.csv",
        paired_csv=f"{RES}/tables/paired.csv",
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
