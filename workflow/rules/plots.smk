"""Stage 6b: plots — paired ratios with their CI band per length, and per-arm drift by round."""


rule plots:
    input:
        summary=f"{RES}/stats/summary.json",
        measurements=f"{RES}/tables/measurements.csv",
    output:
        ratios=report(f"{RES}/plots/ratios.png", caption="../report/plots.rst", category="3 Plots"),
        drift=report(f"{RES}/plots/drift.png", caption="../report/drift.rst", category="3 Plots"),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/plots.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plots.py"
