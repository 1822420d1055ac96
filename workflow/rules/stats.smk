"""Stage 6: statistics — measurements table, per arm x length summaries, paired ratios, verdicts."""


rule stats:
    input:
        plan=f"{RES}/plan.json",
        # every visit's, then each validation retry's after it (common.smk: validation_chain)
        measures=lambda wc: chain_artifacts(0),
        validations=lambda wc: chain_artifacts(1),
        adapt=lambda wc: [path for _, path in adapt_decisions()],
    output:
        summary=f"{RES}/stats/summary.json",
        measurements=report(f"{RES}/tables/measurements.csv", caption="../report/measurements.rst", category="2 Measurements"),
        summary_csv=report(f"{RES}/tables/summary.csv", caption="../report/summary.rst", category="1 Summary"),
        paired_csv=report(f"{RES}/tables/paired.csv", caption="../report/paired.rst", category="1 Summary"),
        ratios_csv=f"{RES}/tables/ratios.csv",
        memory_csv=f"{RES}/tables/memory.csv",
        timing_csv=f"{RES}/tables/timing_agreement.csv",
    params:
        stats=CFG["stats"],
        gates=CFG["gates"],
    resources:
        **other_resources(),
    log:
        f"{LOGS}/stats.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/stats.py"


checkpoint adapt:
    """Adaptive rounds: after rounds.min rounds, and after each block since, whether to measure
    another block (pairbench.analysis.adaptive: interval widths only). Each visit's own measurement
    and validation, never its retries (a retried pair is dropped from the paired statistics)."""
    input:
        plan=f"{RES}/plan.json",
        measures=lambda wc: [measure_path(RES, v, 0) for v in visits_through(int(wc.rounds))],
        validations=lambda wc: [validate_path(RES, v, 0) for v in visits_through(int(wc.rounds))],
    output:
        adapt=f"{RES}/adapt/r{{rounds}}.json",
    params:
        # only what the stopping rule reads: a change of noise, trim or the secondary lists re-decides nothing
        stats=lambda wc: {k: CFG["stats"][k] for k in ("metrics", "alpha", "multiplicity")},
        gates=CFG["gates"],
    resources:
        **other_resources(),
    log:
        f"{LOGS}/adapt/r{{rounds}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/adapt.py"
