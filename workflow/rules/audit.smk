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
    """The HTML report's landing page: the verdict table and the retries, as RST."""
    input:
        paired=rules.stats.output.paired_csv,
        measurements=rules.stats.output.measurements,
    output:
        landing=L.landing,
    resources:
        **other_resources(CFG),
    log:
        L.log("landing.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/landing.py"


rule provenance:
    """What produced the run: every artifact's sha256 and schema, the versions, the config hash."""
    input:
        plan=L.plan,
        per_arm=[L.per_arm(stage, a) for stage in PER_ARM for a in arms(CFG)],
        fixtures=rules.fixtures.output.fixtures,
        per_visit=lambda wc: [p for v in run_visit_ids(CFG) for p in (L.measure(v), L.validate(v))],
        retries=lambda wc: chain_artifacts(CFG, 0, retries_only=True) + chain_artifacts(CFG, 1, retries_only=True),
        adapt=lambda wc: [path for _, path in adapt_decisions(CFG)],
        stats=rules.stats.output,
        plots=rules.plots.output,
        landing=rules.landing.output,
        # the cross-check's artifacts, when the engines have a tool (common.smk: crosscheck_arms)
        crosscheck=[*rules.crosscheck.output.crosschecks, L.crosscheck_summary] if crosscheck_arms(CFG) else [],
        # the cost channel's artifacts, when it is on (common.smk: cost_arms)
        cost=[*rules.cost.output.costs, L.cost_summary] if cost_arms(CFG) else [],
        # retries no longer in the run are out of it before the folder is recorded
        retired=rules.retire.output.retired,
    output:
        provenance=report(L.provenance, caption="../report/provenance.rst", category="4 Audit"),
    params:
        run_dir=lambda wc, output: str(Path(output.provenance).parent),
        root=str(ROOT),
        config_sha256=pb_plan.full_config_sha256(CFG),
    resources:
        **other_resources(CFG),
    log:
        L.log("provenance.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/provenance.py"


rule audit:
    """Re-validate every artifact against its schema and walk the hash chain; any finding fails it."""
    input:
        provenance=rules.provenance.output.provenance,
        # the bundle is checked too (publish/MANIFEST.json), so it must be finished first
        publish=rules.publish.output.manifest,
    output:
        audit=report(L.audit, caption="../report/audit.rst", category="4 Audit"),
    params:
        run_dir=lambda wc, output: str(Path(output.audit).parent),
    resources:
        **other_resources(CFG),
    log:
        job=L.log("audit.log"),
        # the audit record, ok or not: Snakemake deletes a failed job's outputs but keeps its logs
        record=L.log("audit.json"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/audit.py"
