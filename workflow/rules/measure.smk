"""Stage 4: paired measurement — one job per visit, chained in the plan's order.

Each visit depends on the previous one (ordering only, via ``ancient``), so no two visits ever
run at the same time whatever --cores is, and re-measuring one visit leaves the others alone.
"""


rule measure:
    """One visit: launch the arm, a first request, the steady requests of every condition, stop."""
    input:
        **visit_inputs(CFG),
        previous=lambda wc: previous_visit(CFG, wc.visit),
    output:
        measure=L.measure("{visit}"),
        outputs=[L.output("{visit}", c) for c in condition_ids(CFG)],
        marker=L.marker("{visit}"),
        host=L.host("{visit}"),  # the measuring node's facts, for environment.json
        **level_files(CFG, "{visit}"),  # a load run: every level's requests (private)
    params:
        **visit_params(CFG),
    resources:
        **visit_resources(CFG),
        # Snakemake's attempt number (1 = first), recorded in the artifact; see `retries` below.
        attempt=lambda wc, attempt: attempt,
    # An engine fault fails the visit; Snakemake re-attempts it this many times (config `retries`).
    retries: CFG["retries"]
    group: measure_group(CFG)
    log:
        job=L.log("measure/{visit}.log"),
        server=L.server_log("measure/{visit}"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/measure.py"


use rule measure as measure_retry with:
    """A validation retry: a partial visit of the conditions whose validation earned one."""
    # Validation retry N of one visit: a partial visit of the conditions whose previous measurement
    # (the visit, or retry N-1) was excluded for a kind in validate.retry_on (pairbench.validate.retries).
    # Only ever requested by the validation checkpoints (common.smk: validation_chain).
    # Not in the measuring group: a retry waits for validations, which are outside it (common.smk).
    group: None
    input:
        **visit_inputs(CFG),
        previous_measure=lambda wc: L.measure(wc.visit, int(wc.n) - 1),
        previous_validate=lambda wc: L.validate(wc.visit, int(wc.n) - 1),
        # Ordering only: after every visit's own validation and every earlier visit's retries.
        after=lambda wc: retry_after(CFG, wc.visit, int(wc.n)),
    output:
        measure=L.measure("{visit}", "{n}"),
        outputs=directory(L.retry_outputs("{visit}", "{n}")),
    params:
        **visit_params(CFG),
        retry=lambda wc: int(wc.n),
        retry_on=CFG["validate"]["retry_on"],
    log:
        job=L.log("measure/{visit}.retry{n}.log"),
        server=L.server_log("measure/{visit}.retry{n}"),
