"""Stage 4: paired measurement — one job per visit, chained in the plan's order.

Each visit depends on the previous one (ordering only, via ``ancient``), so no two visits ever
run at the same time whatever --cores is, and re-measuring one visit leaves the others alone.
"""


rule measure:
    input:
        **visit_inputs(),
        previous=lambda wc: previous_visit(VISITS, wc.visit, RES),
    output:
        measure=f"{RES}/measure/{{visit}}.json",
        outputs=expand(f"{RES}/private/outputs/{{{{visit}}}}-{{length}}.json", length=LENGTHS),
        marker=f"{RES}/private/order/{{visit}}.done",
        host=f"{RES}/private/hosts/{{visit}}.json",  # the measuring node's facts, for environment.json
    params:
        **visit_params(),
    resources:
        **measure_resources(ARMS),
        # Snakemake's attempt number (1 = first), recorded in the artifact; see `retries` below.
        attempt=lambda wc, attempt: attempt,
    # An engine fault fails the visit; Snakemake re-attempts it this many times (config `retries`).
    retries: CFG["retries"]
    group: MEASURE_GROUP
    log:
        job=f"{LOGS}/measure/{{visit}}.log",
        server=f"{RES}/private/logs/measure/{{visit}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/measure.py"


use rule measure as measure_retry with:
    # Validation retry N of one visit: a partial visit of the lengths whose previous measurement
    # (the visit, or retry N-1) was excluded for a kind in validate.retry_on (pairbench.validate.retries).
    # Only ever requested by the validation checkpoints (common.smk: validation_chain).
    # Not in the measuring group: a retry waits for validations, which are outside it (common.smk).
    group: None
    input:
        **visit_inputs(),
        previous_measure=lambda wc: measure_path(RES, wc.visit, int(wc.n) - 1),
        previous_validate=lambda wc: validate_path(RES, wc.visit, int(wc.n) - 1),
        # Ordering only: after every visit's own validation and every earlier visit's retries.
        after=lambda wc: retry_after(wc.visit, int(wc.n)),
    output:
        measure=f"{RES}/measure/{{visit}}.retry{{n}}.json",
        outputs=directory(f"{RES}/private/outputs/{{visit}}.retry{{n}}"),
    params:
        **visit_params(),
        retry=lambda wc: int(wc.n),
        retry_on=CFG["validate"]["retry_on"],
    log:
        job=f"{LOGS}/measure/{{visit}}.retry{{n}}.log",
        server=f"{RES}/private/logs/measure/{{visit}}.retry{{n}}.log",
