"""Stages 7-8: sanitization and report — the allowlisted, scrubbed, leak-gated bundle with README.md."""


rule publish:
    """The report and the allowlisted, scrubbed, leak-gated bundle (pairbench.publish.assemble)."""
    input:
        plan=L.plan,
        sources=per_arm(CFG, "source"),
        builds=per_arm(CFG, "build"),
        warmups=per_arm(CFG, "warmup"),
        fixtures=rules.fixtures.output,
        # every visit's, then each validation retry's after it (common.smk: validation_chain)
        measures=lambda wc: chain_artifacts(CFG, 0),
        validations=lambda wc: chain_artifacts(CFG, 1),
        stats=rules.stats.output,
        plots=rules.plots.output,
        # [] unless both compared arms' engines have a cross-check tool (common.smk: crosscheck_arms)
        crosscheck=[L.crosscheck_summary] if crosscheck_arms(CFG) else [],
        # [] unless the cost channel is on (config cost.enabled; common.smk: cost_arms)
        cost=[L.cost_summary] if cost_arms(CFG) else [],
        # the measuring nodes' facts (environment.json describes the first visit's node)
        hosts=lambda wc: [L.host(v) for v in run_visit_ids(CFG)],
    output:
        # Files, not directory(): Snakemake would drop a .snakemake_timestamp into a directory
        # output, and the bundle must hold exactly what MANIFEST.json lists.
        manifest=L.manifest,
        report=L.report,
    params:
        layout=run_layout,
        root=str(ROOT),
        gate=CFG.get("gate") or {},  # the CI gate's policy (gate.json): a change re-publishes, re-measures nothing
    resources:
        **other_resources(CFG),
    log:
        L.log("publish.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/publish.py"
