"""Stage 5: validation — the configured functional cases on every steady record of one visit.

Both rules are checkpoints: whether a visit earns a validation retry (validate.retries,
validate.retry_on; pairbench.validate.retries) is known only once its validation has run, so the
jobs after it (the retry's measure_retry and validate_retry, then stats) are added to the DAG from
its result. ``retire`` then moves the retries that are no longer in any visit's chain out of the run.
"""


checkpoint validate:
    input:
        **validation_inputs(),
        measure=f"{RES}/measure/{{visit}}.json",
        outputs=expand(f"{RES}/private/outputs/{{{{visit}}}}-{{length}}.json", length=LENGTHS),
        # Ordering only: validation (sandboxed subprocesses) never runs while a visit is measuring:
        # it waits for the last visit before the next adaptive decision (or of the run).
        last_visit=lambda wc: ancient(visit_marker(RES, segment_last_visit(wc.visit))),
    output:
        validate=f"{RES}/validate/{{visit}}.json",
    params:
        **validation_params(),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/validate/{{visit}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"


# Its own checkpoint (a rule derived with `use rule` is not registered as one): the cases on
# validation retry N's records; matches_baseline compares with the baseline's output of the same
# round from its own visit. The shared inputs and params are one definition (common.smk).
checkpoint validate_retry:
    input:
        **validation_inputs(),
        measure=f"{RES}/measure/{{visit}}.retry{{n}}.json",
        outputs=f"{RES}/private/outputs/{{visit}}.retry{{n}}",
    output:
        validate=f"{RES}/validate/{{visit}}.retry{{n}}.json",
    params:
        **validation_params(),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/validate/{{visit}}.retry{{n}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/validate.py"


rule retire:
    """Retries that are no longer in their visit's chain (its validation was redone, or the config
    asks for fewer) move to private/superseded/<time>/, kept, never deleted; private/retired.json
    records every move, and the audit checks it. The one job that moves files it does not declare."""
    input:
        measures=lambda wc: chain_artifacts(0),
        validations=lambda wc: chain_artifacts(1),
    output:
        retired=f"{RES}/private/retired.json",
    params:
        chain=lambda wc: {v: len(validation_chain(v)) - 1 for v in run_visit_ids()},
        res_dir=lambda wc, output: str(Path(output.retired).parent.parent),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/retire.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/retire.py"
