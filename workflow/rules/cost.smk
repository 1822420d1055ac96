"""Stage 6c: the cost channel — each arm's engine counted under a simulator (callgrind: instructions
and estimated cycles per token, one fixed request per condition), then its verdicts beside the
wall-clock ones. Only when cost.enabled (common.smk: cost_arms); docs/cost.md."""


rule cost:
    """Every arm counted under callgrind, one after the other, after every visit."""
    input:
        plan=L.plan,
        builds=[L.build(a) for a in cost_arms(CFG)],
        prompts=[L.prompts(c) for c in condition_ids(CFG)] if cost_arms(CFG) else [],
        # Ordering only: after every visit, validation and validation retry, so the simulator never
        # shares the CPU with a measurement, whatever --cores is.
        after=lambda wc: [ancient(p) for p in chain_artifacts(CFG, 1)],
    output:
        costs=[L.cost(a) for a in cost_arms(CFG)],
    params:
        layout=run_layout,  # results/<label>: the stage's paths come from the run layout
        options=CFG["cost"],
        arm_configs=CFG["arms"],
        server=CFG["server"],
        root=str(ROOT),
    resources:
        **measure_resources(CFG),
    log:
        job=L.log("cost/cost.log"),
        tool=L.log("cost/tool.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/cost.py"


rule cost_compare:
    """The cost channel's verdicts (exact ratios, the one verdict rule) beside the wall-clock ones."""
    input:
        plan=L.plan,
        summary=rules.stats.output.summary,
        costs=rules.cost.output.costs,
        builds=[L.build(a) for a in cost_arms(CFG)],
    output:
        comparison=L.cost_summary,
    resources:
        **other_resources(CFG),
    log:
        L.log("cost/compare.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/cost_compare.py"
