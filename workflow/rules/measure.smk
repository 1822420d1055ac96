"""Stage 4: paired measurement — one job per visit, chained in the plan's order.

Each visit depends on the previous one (ordering only, via ``ancient``), so no two visits ever
run at the same time whatever --cores is, and re-measuring one visit leaves the others alone.
"""


rule measure:
    input:
        plan=f"{RES}/plan.json",
        build=lambda wc: f"{RES}/build/{visit_by_id(VISITS, wc.visit)['arm']}.json",
        warmups=expand(f"{RES}/warmup/{{arm}}.json", arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
        previous=lambda wc: previous_visit(VISITS, wc.visit, RES),
    output:
        measure=f"{RES}/measure/{{visit}}.json",
        outputs=expand(f"{RES}/private/outputs/{{{{visit}}}}-{{length}}.json", length=LENGTHS),
        marker=f"{RES}/private/order/{{visit}}.done",
    params:
        visit=lambda wc: visit_by_id(VISITS, wc.visit),
        arm_dir=lambda wc: f"{RES}/src/{visit_by_id(VISITS, wc.visit)['arm']}",
        arm_config=lambda wc: CFG["arms"][visit_by_id(VISITS, wc.visit)["arm"]],
        server=CFG["server"],
        root=str(ROOT),
        pid_file=f"{RES}/private/servers/measure.json",
    resources:
        # Snakemake's attempt number (1 = first), recorded in the artifact; see `retries` below.
        attempt=lambda wc, attempt: attempt,
    # An engine fault fails the visit; Snakemake re-attempts it this many times (config `retries`).
    retries: CFG["retries"]
    log:
        job=f"{LOGS}/measure/{{visit}}.log",
        server=f"{RES}/private/logs/measure/{{visit}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/measure.py"


rule measure_retry:
    """Validation retry N of one visit: a partial visit of the lengths whose previous measurement
    (the visit, or retry N-1) was excluded for a kind in validate.retry_on (pairbench.validate.retries).
    Only ever requested by the validation checkpoints (common.smk: validation_chain)."""
    input:
        plan=f"{RES}/plan.json",
        build=lambda wc: f"{RES}/build/{visit_by_id(VISITS, wc.visit)['arm']}.json",
        warmups=expand(f"{RES}/warmup/{{arm}}.json", arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
        previous_measure=lambda wc: measure_path(RES, wc.visit, int(wc.n) - 1),
        previous_validate=lambda wc: validate_path(RES, wc.visit, int(wc.n) - 1),
        # Ordering only: after every visit's own validation and every earlier visit's retries.
        after=lambda wc: retry_after(wc.visit, int(wc.n)),
    output:
        measure=f"{RES}/measure/{{visit}}.retry{{n}}.json",
        outputs=directory(f"{RES}/private/outputs/{{visit}}.retry{{n}}"),
    params:
        visit=lambda wc: visit_by_id(VISITS, wc.visit),
        arm_dir=lambda wc: f"{RES}/src/{visit_by_id(VISITS, wc.visit)['arm']}",
        arm_config=lambda wc: CFG["arms"][visit_by_id(VISITS, wc.visit)["arm"]],
        server=CFG["server"],
        root=str(ROOT),
        pid_file=f"{RES}/private/servers/measure.json",
        retry_on=CFG["validate"]["retry_on"],
    resources:
        attempt=lambda wc, attempt: attempt,
    retries: CFG["retries"]
    log:
        job=f"{LOGS}/measure/{{visit}}.retry{{n}}.log",
        server=f"{RES}/private/logs/measure/{{visit}}.retry{{n}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/measure.py"
