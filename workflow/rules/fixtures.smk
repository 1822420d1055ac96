"""Stage 3a: synthetic frozen fixtures, exactly N native tokens, checked by every arm's /tokenize.

One job for all conditions, so each arm's server starts once.
"""


rule fixtures:
    """One prompt per round and condition of exactly its input tokens, the same on every arm."""
    input:
        plan=L.plan,
        builds=per_arm(CFG, "build"),
    output:
        fixtures=fixtures(CFG),
        prompts=prompts(CFG),
    params:
        # every path through the run layout (pairbench.stages.measure.fixtures_stage): results/<label>
        layout=run_layout,  # results/<label>: the stage's paths come from the run layout
        arms=arms(CFG),
        server=CFG["server"],
        arm_configs=CFG["arms"],
        root=str(ROOT),
    resources:
        **measure_resources(CFG),  # it launches every arm's server
    log:
        job=L.log("fixtures.log"),
        server=L.server_log("fixtures"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/fixtures.py"
