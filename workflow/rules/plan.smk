"""Stage 0: the plan (arms, lengths, counterbalanced visit order, salts, config hash)."""


rule plan:
    output:
        plan=f"{RES}/plan.json",
    params:
        config=CFG,
        root=str(ROOT),
    log:
        f"{LOGS}/plan.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/plan.py"
