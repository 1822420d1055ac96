"""Stage 3b: warmup — launch, health, first-request diagnostic and smoke check, one arm at a time."""


rule warmup:
    """Launch the arm once: health, version, a first-request diagnostic and a smoke check."""
    input:
        plan=L.plan,
        build=L.build("{arm}"),
        # every arm's: each is launched with the native fast paths any arm's code turned off turned off
        # (pairbench.engines.fastpaths)
        builds=per_arm(CFG, "build"),
        fixtures=ancient(fixtures(CFG)),
        previous=lambda wc: previous_warmup(CFG, wc.arm),
    output:
        warmup=L.warmup("{arm}"),
    params:
        # every path through the run layout (pairbench.stages.measure.warmup_stage): results/<label>
        layout=run_layout,  # results/<label>: the stage's paths come from the run layout
        arm=lambda wc: wc.arm,
        arm_config=lambda wc: CFG["arms"][wc.arm],
        server=CFG["server"],
        root=str(ROOT),
    # Not in the measuring group (common.smk: measure_group): every visit takes every warmup as an
    # input, so a finished visit outside the group would lead back into it.
    resources:
        **measure_resources(CFG),
    log:
        job=L.log("warmup/{arm}.log"),
        server=L.server_log("warmup/{arm}"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/warmup.py"
