"""The CI gate (docs/ci.md): ``snakemake --cores 1 gate`` runs the whole run, then ends in its decision.

Not part of ``rule all``: a run whose candidate is slower on purpose (the default config's int8 KV
cache) is a result, not a failure. As a target, ``gate`` needs the audit, so everything runs first;
then the job fails unless the decision is a pass (exit 0 of ``python -m pairbench gate``), its reason
in the job's log. The Markdown summary and JUnit XML are logs, kept whatever the decision (Snakemake
deletes a failed job's outputs); for the exit status 1, 2 or 3 itself, run ``python -m pairbench gate``.
"""


rule gate:
    """End in the CI gate: fails unless the run's published gate.json passes."""
    input:
        audit=rules.audit.output.audit,
        manifest=rules.publish.output.manifest,
    output:
        gate=L.gate,
    params:
        layout=run_layout,
    resources:
        **other_resources(CFG),
    log:
        job=L.log("gate.log"),
        markdown=L.log("gate/summary.md"),
        junit=L.log("gate/junit.xml"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/gate.py"
