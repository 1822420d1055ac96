"""Stage 0: the plan (arms, lengths, counterbalanced visit order, salts, config hash)."""


rule plan:
    output:
        plan=f"{RES}/plan.json",
    params:
        # Only the measurement config: a stats/validate/retries change must not re-plan (re-measure).
        config=pb_plan.measurement_config(CFG),
        root=str(ROOT),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/plan.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plan.py"
