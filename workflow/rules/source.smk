"""Stage 1: patch application — pristine export of each arm's source, patches checked then applied."""


rule source:
    """Export the arm's source at its tag or path, check its patches apply, then apply them."""
    input:
        plan=L.plan,
        patches=lambda wc: arm_patches(CFG, wc.arm),
        source_files=lambda wc: arm_source_files(CFG, wc.arm, ROOT),
    output:
        source=L.source("{arm}"),
        tree=directory(L.tree("{arm}")),
    params:
        arm=lambda wc: wc.arm,
        arm_config=lambda wc: CFG["arms"][wc.arm],
        # a git ref's commit, resolved when the DAG is built: a moved branch reruns this job (and what
        # follows from it), an unmoved one nothing (common.smk: git_commit)
        commit=lambda wc: git_commit(CFG, wc.arm, ROOT),
        root=str(ROOT),
    resources:
        **other_resources(CFG),
    log:
        L.log("source/{arm}.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/source.py"
