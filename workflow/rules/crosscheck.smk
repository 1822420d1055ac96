"""Stage 6b: the cross-check — the engine's own benchmark (llama-bench) from each compared arm's
build, in rounds alternating the arms, then its comparison with pairbench's verdicts. Only when
both compared arms' engine profiles name a tool and crosscheck.rounds > 0 (common.smk: crosscheck_arms)."""


rule crosscheck:
    input:
        plan=f"{RES}/plan.json",
        builds=expand(f"{RES}/build/{{arm}}.json", arm=CROSSCHECK),
        # Ordering only: after every visit, validation and validation retry, so the tool never shares
        # the CPU with a measurement, whatever --cores is.
        after=lambda wc: [ancient(p) for p in chain_artifacts(1)],
    output:
        crosschecks=expand(f"{RES}/crosscheck/{{arm}}.json", arm=CROSSCHECK),
        raw=expand(f"{RES}/private/crosscheck/{{arm}}.json", arm=CROSSCHECK),
    params:
        arms=CROSSCHECK,
        arm_dirs=expand(f"{RES}/src/{{arm}}", arm=CROSSCHECK),
        arm_configs={a: CFG["arms"][a] for a in CROSSCHECK},
        rounds=CFG["crosscheck"]["rounds"],
        root=str(ROOT),
    resources:
        **measure_resources(ARMS),
    log:
        job=f"{LOGS}/crosscheck/crosscheck.log",
        tool=f"{LOGS}/crosscheck/tool.log",
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
    resources:
        **other_resources(),
    log:
        f"{LOGS}/crosscheck/compare.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/crosscheck_compare.py"
