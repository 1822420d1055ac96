"""Stage 5: validation — the configured functional cases on every steady record of one visit.

Both rules are checkpoints: whether a visit earns a validation retry (validate.retries,
validate.retry_on; pairbench.validate.retries) is known only once its validation has run, so the
jobs after it (the retry's measure_retry and validate_retry, then stats) are added to the DAG from
its result. ``retire`` then moves the retries that are no longer in any visit's chain out of the run.
"""


checkpoint validate:
    """The functional cases on every steady record of one visit."""
    input:
        **validation_inputs(CFG),
        measure=L.measure("{visit}"),
        outputs=rules.measure.output.outputs,
        # Ordering only: validation (sandboxed subprocesses) never runs while a visit is measuring:
        # it waits for the last visit before the next adaptive decision (or of the run).
        last_visit=lambda wc: ancient(L.marker(segment_last_visit(CFG, wc.visit))),
    output:
        validate=L.validate("{visit}"),
    params:
        **validation_params(CFG),
    resources:
        **other_resources(CFG),
    log:
        L.log("validate/{visit}.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"


# Its own checkpoint (a rule derived with `use rule` is not registered as one): the cases on
# validation retry N's records; matches_baseline compares with the baseline's output of the same
# round from its own visit. The shared inputs and params are one definition (common.smk).
checkpoint validate_retry:
    """The functional cases on the records of one validation retry."""
    input:
        **validation_inputs(CFG),
        measure=rules.measure_retry.output.measure,
        outputs=rules.measure_retry.output.outputs,
    output:
        validate=L.validate("{visit}", "{n}"),
    params:
        **validation_params(CFG),
    resources:
        **other_resources(CFG),
    log:
        L.log("validate/{visit}.retry{n}.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"


# Retries no longer in their visit's chain (its validation was redone, or the config asks for fewer)
# move to private/superseded/<time>/, kept, never deleted; private/retired.json records every move,
# and the audit checks it. The one job that moves files it does not declare.
rule retire:
    """Move retries no longer in their visit's chain to private/superseded/ (kept, recorded, audited)."""
    input:
        measures=lambda wc: chain_artifacts(CFG, 0),
        validations=lambda wc: chain_artifacts(CFG, 1),
    output:
        retired=L.retired,
    params:
        chain=lambda wc: {v: len(validation_chain(CFG, v)) - 1 for v in run_visit_ids(CFG)},
        layout=run_layout,
    resources:
        **other_resources(CFG),
    log:
        L.log("retire.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/retire.py"
