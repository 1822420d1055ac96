"""Stage 0: the plan (arms, conditions, counterbalanced visit order, salts, config hash)."""


rule plan:
    """The run plan, a pure function of the measurement config."""
    output:
        plan=L.plan,
    params:
        # Only the measurement config: a stats/validate/retries change must not re-plan (re-measure).
        config=pb_plan.measurement_config(CFG),
        root=str(ROOT),
    resources:
        **other_resources(CFG),
    log:
        L.log("plan.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plan.py"
