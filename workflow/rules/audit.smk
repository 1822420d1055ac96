"""Provenance and audit (issue 7): what produced the run, and a re-check of every artifact.

``provenance`` runs once every stage that writes under results/<label>/ (outside private/, src/ and
publish/) is done, so it covers the whole folder; when a stage is added that writes there, add its
outputs to the provenance rule's inputs (the audit flags any file provenance did not record).
``audit`` re-validates every artifact and walks the hash chain (pairbench.integrity.audit); any finding fails
the job, naming the file, after writing the record (ok: false, the findings) to logs/<label>/audit.json.

Also the HTML report's landing page (``snakemake --report report.html``): workflow/report/workflow.rst.
"""


report: "../report/workflow.rst"


rule landing:
    input:
        paired=f"{RES}/tables/paired.csv",
        measurements=f"{RES}/tables/measurements.csv",
    output:
        landing=f"{RES}/report/landing.rst",
    resources:
        **other_resources(),
    log:
        f"{LOGS}/landing.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/landing.py"


rule provenance:
    input:
        plan=f"{RES}/plan.json",
        per_arm=expand(f"{RES}/{{stage}}/{{arm}}.json", stage=["source", "build", "warmup"], arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        per_visit=lambda wc: expand(f"{RES}/{{stage}}/{{visit}}.json", stage=["measure", "validate"],
                                    visit=run_visit_ids()),
        adapt=lambda wc: [path for _, path in adapt_decisions()],
        retries=lambda wc: chain_artifacts(0, retries_only=True) + chain_artifacts(1, retries_only=True),
        stats=rules.stats.output,
        plots=rules.plots.output,
        landing=rules.landing.output,
        # the cross-check's artifacts, when the engines have a tool (common.smk: crosscheck_arms)
        crosscheck=expand(f"{RES}/crosscheck/{{arm}}.json", arm=CROSSCHECK)
        + ([f"{RES}/stats/crosscheck.json"] if CROSSCHECK else []),
        # retries no longer in the run are out of it before the folder is recorded
        retired=f"{RES}/private/retired.json",
    output:
        provenance=report(f"{RES}/provenance.json", caption="../report/provenance.rst", category="4 Audit"),
    params:
        run_dir=lambda wc, output: str(Path(output.provenance).parent),
        root=str(ROOT),
        config_sha256=pb_plan.full_config_sha256(CFG),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/provenance.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/provenance.py"


rule audit:
    input:
        provenance=f"{RES}/provenance.json",
        # the bundle is checked too (publish/MANIFEST.json), so it must be finished first
        publish=f"{RES}/publish/MANIFEST.json",
    output:
        audit=report(f"{RES}/audit.json", caption="../report/audit.rst", category="4 Audit"),
    params:
        run_dir=lambda wc, output: str(Path(output.audit).parent),
    resources:
        **other_resources(),
    log:
        job=f"{LOGS}/audit.log",
        # the audit record, ok or not: Snakemake deletes a failed job's outputs but keeps its logs
        record=f"{LOGS}/audit.json",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/audit.py"
