"""Stage 6: statistics — measurements table, per arm x condition summaries, paired ratios, verdicts."""


rule stats:
    """The measurements table, the summary with every verdict, and its flat tables."""
    input:
        plan=L.plan,
        # every visit's, then each validation retry's after it (common.smk: validation_chain)
        measures=lambda wc: chain_artifacts(CFG, 0),
        validations=lambda wc: chain_artifacts(CFG, 1),
        adapt=lambda wc: [path for _, path in adapt_decisions(CFG)],
    output:
        summary=L.summary,
        measurements=report(L.table("measurements"), caption="../report/measurements.rst", category="2 Measurements"),
        summary_csv=report(L.table("summary"), caption="../report/summary.rst", category="1 Summary"),
        paired_csv=report(L.table("paired"), caption="../report/paired.rst", category="1 Summary"),
        ratios_csv=L.table("ratios"),
        memory_csv=L.table("memory"),
        timing_csv=L.table("timing_agreement"),
        **load_tables(CFG),  # a load run: the SLO capacity per round, and compared
    params:
        # the stage reads and writes every path through the layout (pairbench.stages.analysis.stats_stage)
        layout=run_layout,
        options={"stats": CFG["stats"], "gates": CFG["gates"]},
    resources:
        **other_resources(CFG),
    log:
        L.log("stats.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/stats.py"


# After rounds.min rounds, and after each block since (pairbench.analysis.adaptive: interval widths
# only). It reads each visit's own measurement and validation, never its retries (a retried pair is
# dropped from the paired statistics).
checkpoint adapt:
    """Adaptive rounds: measure another block, or stop (interval widths only)."""
    input:
        plan=L.plan,
        measures=lambda wc: [L.measure(v) for v in visits_through(CFG, int(wc.rounds))],
        validations=lambda wc: [L.validate(v) for v in visits_through(CFG, int(wc.rounds))],
    output:
        adapt=L.adapt("{rounds}"),
    params:
        # only what the stopping rule reads: a change of noise, trim or the secondary lists re-decides nothing
        stats=lambda wc: {k: CFG["stats"][k] for k in ("metrics", "alpha", "multiplicity")},
        gates=CFG["gates"],
        # the rounds' time budget, not part of the plan: raising it re-decides and measures only the
        # rounds it now allows, keeping every finished one
        max_minutes=(pb_plan.adaptive(CFG) or {}).get("max_minutes"),
    resources:
        **other_resources(CFG),
    log:
        L.log("adapt/r{rounds}.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/adapt.py"
