"""Stage 6b: the cross-check — the engine's own benchmark (llama-bench) from each compared arm's
build, in rounds alternating the arms, then its comparison with pairbench's verdicts. Only when
both compared arms' engine profiles name a tool and crosscheck.rounds > 0 (common.smk: crosscheck_arms)."""


rule crosscheck:
    """The engine's own benchmark tool from each compared arm's build, after every visit."""
    input:
        plan=L.plan,
        builds=[L.build(a) for a in crosscheck_arms(CFG)],
        # Ordering only: after every visit, validation and validation retry, so the tool never shares
        # the CPU with a measurement, whatever --cores is.
        after=lambda wc: [ancient(p) for p in chain_artifacts(CFG, 1)],
    output:
        crosschecks=[L.crosscheck(a) for a in crosscheck_arms(CFG)],
        raw=[L.crosscheck_raw(a) for a in crosscheck_arms(CFG)],
    params:
        # every path through the run layout (pairbench.stages.measure.crosscheck_stage): results/<label>
        layout=run_layout,  # results/<label>: the stage's paths come from the run layout
        arms=crosscheck_arms(CFG),
        arm_configs={a: CFG["arms"][a] for a in crosscheck_arms(CFG)},
        rounds=CFG["crosscheck"]["rounds"],
        root=str(ROOT),
    resources:
        **measure_resources(CFG),
    log:
        job=L.log("crosscheck/crosscheck.log"),
        tool=L.log("crosscheck/tool.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/crosscheck.py"


rule crosscheck_compare:
    """The tool's ratios beside pairbench's verdicts: do they agree on direction and size?"""
    input:
        plan=L.plan,
        summary=rules.stats.output.summary,
        crosschecks=rules.crosscheck.output.crosschecks,
    output:
        comparison=L.crosscheck_summary,
    resources:
        **other_resources(CFG),
    log:
        L.log("crosscheck/compare.log"),
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/crosscheck_compare.py"
