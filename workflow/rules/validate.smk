"""Stage 5: validation — the configured functional cases on every steady record of one visit.

Both rules are checkpoints: whether a visit earns a validation retry (validate.retries,
validate.retry_on; pairbench.validate.retries) is known only once its validation has run, so the jobs after
it (the retry's measure_retry and validate_retry, then stats) are added to the DAG from its result.
"""


checkpoint validate:
    input:
        measure=f"{RES}/measure/{{visit}}.json",
        outputs=expand(f"{RES}/private/outputs/{{{{visit}}}}-{{length}}.json", length=LENGTHS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        baseline_outputs=lambda wc: baseline_outputs(VISITS, wc.visit, BASELINE, LENGTHS, RES),
        # Ordering only: validation (sandboxed subprocesses) never runs while a visit is measuring.
        last_visit=ancient(visit_marker(RES, VISIT_IDS[-1])),
    output:
        validate=f"{RES}/validate/{{visit}}.json",
    params:
        cases=CFG["validate"]["cases"],
        options=validate_options(CFG),
    log:
        f"{LOGS}/validate/{{visit}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"


checkpoint validate_retry:
    """The cases on validation retry N's records; matches_baseline compares with the baseline's
    output of the same round from its own visit."""
    input:
        measure=f"{RES}/measure/{{visit}}.retry{{n}}.json",
        outputs=f"{RES}/private/outputs/{{visit}}.retry{{n}}",
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        baseline_outputs=lambda wc: baseline_outputs(VISITS, wc.visit, BASELINE, LENGTHS, RES),
    output:
        validate=f"{RES}/validate/{{visit}}.retry{{n}}.json",
    params:
        cases=CFG["validate"]["cases"],
        options=validate_options(CFG),
    log:
        f"{LOGS}/validate/{{visit}}.retry{{n}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"
