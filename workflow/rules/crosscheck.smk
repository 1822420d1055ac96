"""Stage 6b: the cross-check — the engine's own benchmark (llama-bench) from each compared arm's
build, then its comparison with pairbench's verdicts. Only when both compared arms' engine profiles
name a tool and crosscheck.repetitions > 0 (common.smk: crosscheck_arms)."""


rule crosscheck:
    input:
        plan=f"{RES}/plan.json",
        build=f"{RES}/build/{{arm}}.json",
        # Ordering only: after every visit, validation and validation retry, and after the previous
        # arm's cross-check, so the tool never shares the CPU with a measurement, whatever --cores is.
        after=lambda wc: [ancient(p) for p in chain_artifacts(1)] + previous_crosscheck(CROSSCHECK, wc.arm, RES),
    output:
        crosscheck=f"{RES}/crosscheck/{{arm}}.json",
        raw=f"{RES}/private/crosscheck/{{arm}}.json",
    params:
        arm=lambda wc: wc.arm,
        arm_dir=f"{RES}/src/{{arm}}",
        arm_config=lambda wc: CFG["arms"][wc.arm],
        repetitions=CFG["crosscheck"]["repetitions"],
        root=str(ROOT),
    log:
        job=f"{LOGS}/crosscheck/{{arm}}.log",
        tool=f"{LOGS}/crosscheck/{{arm}}.tool.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/crosscheck.py"


rule crosscheck_compare:
    input:
        plan=f"{RES}/plan.json",
        summary=f"{RES}/stats/summary.json",
        crosschecks=expand(f"{RES}/crosscheck/{{arm}}.json", arm=CROSSCHECK),
    output:
        comparison=f"{RES}/stats/crosscheck.json",
    log:
        f"{LOGS}/crosscheck/compare.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/crosscheck_compare.py"
