"""Stage 3b: warmup — launch, health, first-request diagnostic and smoke check, one arm at a time."""


rule warmup:
    input:
        plan=f"{RES}/plan.json",
        build=f"{RES}/build/{{arm}}.json",
        fixtures=ancient(expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS)),
        previous=lambda wc: previous_warmup(ARMS, wc.arm, RES),
    output:
        warmup=f"{RES}/warmup/{{arm}}.json",
    params:
        arm=lambda wc: wc.arm,
        arm_dir=f"{RES}/src/{{arm}}",
        arm_config=lambda wc: CFG["arms"][wc.arm],
        server=CFG["server"],
        root=str(ROOT),
    # Not in the measuring group (common.smk: MEASURE_GROUP): every visit takes every warmup as an
    # input, so a finished visit outside the group would lead back into it.
    resources:
        **measure_resources(ARMS),
    log:
        job=f"{LOGS}/warmup/{{arm}}.log",
        server=f"{RES}/private/logs/warmup/{{arm}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/warmup.py"
