"""Stage 5: validation — the configured functional cases on every steady record of one visit."""


rule validate:
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
