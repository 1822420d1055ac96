"""Stage 6b: plots — paired ratios with their CI band per condition, and per-arm drift by round."""


rule plots:
    """Paired ratios with their intervals, and each arm's primary metrics by round."""
    input:
        summary=rules.stats.output.summary,
        measurements=rules.stats.output.measurements,
    output:
        ratios=report(L.plot("ratios"), caption="../report/plots.rst", category="3 Plots"),
        drift=report(L.plot("drift"), caption="../report/drift.rst", category="3 Plots"),
        # a load run: throughput and the primary latency against the load, both arms
        **({"load": report(L.plot("load"), caption="../report/load.rst", category="3 Plots")} if load_run(CFG) else {}),
    resources:
        **other_resources(CFG),
    log:
        L.log("plots.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plots.py"
