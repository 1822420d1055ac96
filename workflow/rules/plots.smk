"""Stage 6b: plots — paired ratios with their CI band per length, and per-arm drift by round."""


rule plots:
    input:
        summary=f"{RES}/stats/summary.json",
        measurements=f"{RES}/tables/measurements.csv",
    output:
        ratios=f"{RES}/plots/ratios.png",
        drift=f"{RES}/plots/drift.png",
    log:
        f"{LOGS}/plots.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plots.py"
