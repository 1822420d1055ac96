"""Stage 4: paired measurement — one job per visit, chained in the plan's order.

Each visit depends on the previous one (ordering only, via ``ancient``), so no two visits ever
run at the same time whatever --cores is, and re-measuring one visit leaves the others alone.
"""


rule measure:
    input:
        plan=f"{RES}/plan.json",
        build=lambda wc: f"{RES}/build/{visit_by_id(VISITS, wc.visit)['arm']}.json",
        warmups=expand(f"{RES}/warmup/{{arm}}.json", arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
        previous=lambda wc: previous_visit(VISITS, wc.visit, RES),
    output:
        measure=f"{RES}/measure/{{visit}}.json",
        outputs=expand(f"{RES}/private/outputs/{{{{visit}}}}-{{length}}.json", length=LENGTHS),
        marker=f"{RES}/private/order/{{visit}}.done",
    params:
        visit=lambda wc: visit_by_id(VISITS, wc.visit),
        arm_dir=lambda wc: f"{RES}/src/{visit_by_id(VISITS, wc.visit)['arm']}",
        arm_config=lambda wc: CFG["arms"][visit_by_id(VISITS, wc.visit)["arm"]],
        server=CFG["server"],
        root=str(ROOT),
    log:
        job=f"{LOGS}/measure/{{visit}}.log",
        server=f"{RES}/private/logs/measure/{{visit}}.log",
    conda:
        "../envs/pairbench.yaml"
    script:
        "../scripts/measure.py"
