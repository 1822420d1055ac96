"""Stage 1: patch application — pristine export of each arm's source, patches checked then applied."""


rule source:
    input:
        plan=f"{RES}/plan.json",
        patches=lambda wc: arm_patches(CFG, wc.arm),
        source_files=lambda wc: arm_source_files(CFG, wc.arm, ROOT),
    output:
        source=f"{RES}/source/{{arm}}.json",
        tree=directory(f"{RES}/src/{{arm}}"),
    params:
        arm=lambda wc: wc.arm,
        arm_config=lambda wc: CFG["arms"][wc.arm],
        root=str(ROOT),
    resources:
        **other_resources(),
    log:
        f"{LOGS}/source/{{arm}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/source.py"
