"""Stage 2: build — byte-compile, cached model conversion, native version string."""


rule build:
    """Build the arm's exported tree (or check its installed engine) and read its native version."""
    input:
        plan=L.plan,
        source=L.source("{arm}"),
        model_file=model_inputs(CFG, ROOT),
    output:
        build=L.build("{arm}"),
    params:
        layout=run_layout,  # the stage reads its plan, source and tree, and writes its build, through it
        arm=lambda wc: wc.arm,
        model=CFG["model"],
        cache_dir="resources/cache/converted",
        root=lambda wildcards: str(ROOT),  # a function: the checkout root, not a file prefix
    resources:
        **other_resources(CFG),
    log:
        job=L.log("build/{arm}.log"),
        steps=L.log("build/{arm}.steps.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/build.py"
