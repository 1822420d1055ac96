"""Stage 2: build — byte-compile, cached model conversion, native version string."""


rule build:
    input:
        plan=f"{RES}/plan.json",
        source=f"{RES}/source/{{arm}}.json",
        model_file=model_inputs(CFG, ROOT),
    output:
        build=f"{RES}/build/{{arm}}.json",
    params:
        arm=lambda wc: wc.arm,
        arm_dir=f"{RES}/src/{{arm}}",
        model=CFG["model"],
        cache_dir="resources/cache/converted",
        root=lambda wildcards: str(ROOT),  # a function: the checkout root, not a file prefix
    resources:
        **other_resources(),
    log:
        job=f"{LOGS}/build/{{arm}}.log",
        steps=f"{LOGS}/build/{{arm}}.steps.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/build.py"
