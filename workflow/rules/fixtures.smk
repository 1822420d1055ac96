"""Stage 3a: synthetic frozen fixtures, exactly N native tokens, checked by every arm's /tokenize.

One job for all lengths, so each arm's server starts once.
"""


rule fixtures:
    input:
        plan=f"{RES}/plan.json",
        builds=expand(f"{RES}/build/{{arm}}.json", arm=ARMS),
    output:
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
    params:
        arms=ARMS,
        arm_dirs=[f"{RES}/src/{arm}" for arm in ARMS],
        server=CFG["server"],
        arm_configs=CFG["arms"],
        root=str(ROOT),
    resources:
        **measure_resources(ARMS),  # it launches every arm's server
    log:
        job=f"{LOGS}/fixtures.log",
        server=f"{RES}/private/logs/fixtures.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/fixtures.py"
