"""Config validation, paths and input helpers shared by every stage.

Helpers take ``config`` as an argument (never a hidden global). The config is validated here, at
parse time, so an invalid one fails before any job runs, with an error that names the key.
"""

import sys
from pathlib import Path

# Import pairbench from THIS checkout's workflow/ (never a copy installed from another checkout).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from snakemake.utils import validate

from pairbench.core import config as pb_config
from pairbench.core import plan as pb_plan
from pairbench.validate import retries as pb_retries
from pairbench.core.artifacts import load_schema, parse_schema_id, read_artifact


def own_config(config, config_settings, module):
    """With --configfile, that file (plus any --config) IS the config: config/config.yaml is dropped.

    Snakemake would otherwise deep-merge the two, so a test or A/A config naming other arms would
    silently inherit the default arms and their patches. A study's comparison (a module, its own
    config: workflow/rules/study.smk) is left as the study made it.
    """
    if config_settings.configfiles and module is None:
        config.clear()
        config.update(config_settings.overwrite_config)
    return config


def validate_config(config, schema):
    """Schema check naming the key, defaults filled in place, then what a schema cannot express."""
    pb_config.schema_check(config, Path(workflow.current_basedir.get_path_or_uri(secret_free=True)) / schema)
    validate(config, schema)
    pb_config.check_config(config, Path(workflow.basedir))
    return pb_config.normalized(config)


CFG = validate_config(own_config(config, workflow.config_settings, workflow.modifier.namespace), "../schemas/config.schema.yaml")
ROOT = Path(workflow.basedir)
RES = f"results/{CFG['label']}"
LOGS = f"logs/{CFG['label']}"
ARMS = pb_config.arm_names(CFG)
LENGTHS = [str(n) for n in CFG["lengths"]]
VISITS = pb_plan.visits(CFG)  # every visit the plan holds (up to rounds.max when adaptive)
VISIT_IDS = [v["id"] for v in VISITS]
BASELINE = pb_config.baseline_arm(CFG)
ADAPTIVE = pb_plan.adaptive(CFG)  # None: fixed rounds
ADAPT_VERSION = parse_schema_id(load_schema("adapt")["$id"])[1]  # what pairbench.analysis.adaptive writes


def crosscheck_arms(cfg):
    """[baseline, candidate]: the baseline and the first candidate (config order) whose engine
    profiles both name a cross-check tool, when crosscheck.rounds > 0; else [] (no cross-check job).
    One candidate only: the tool is an independent sanity check of the harness, not a second
    verdict per candidate, and each further arm would add its rounds of the tool to the run."""
    from pairbench.measure.crosscheck import has_crosscheck

    base = pb_config.baseline_arm(cfg)
    if cfg["crosscheck"]["rounds"] < 1 or not has_crosscheck(cfg["arms"][base]):
        return []
    cand = next((c for c in pb_config.candidate_arms(cfg) if has_crosscheck(cfg["arms"][c])), None)
    return [base, cand] if cand else []


CROSSCHECK = crosscheck_arms(CFG)
def on_cluster(workflow):
    """Whether a cluster executor runs this workflow. Read while the Snakefile is parsed, before
    Snakemake has chosen its executor: only a non-local executor keeps --jobs as cluster nodes (a
    local run turns it into --cores), and a job on a node runs in remote mode."""
    return workflow.resource_settings.nodes is not None or workflow.remote_exec


# The visits of this comparison are one Snakemake job group when a cluster executor runs them: the
# group is one job on one node, one visit at a time (the visits are chained). Only the visits:
# Snakemake rejects a group that a path through jobs outside it leads back into, and every job that
# follows a visit (a validation and its checkpoint, a validation retry, an adaptive decision, the
# cross-check) waits for validations; with those inside, a second comparison's group still in flight
# when the first one's checkpoint updated the DAG was rejected ("depends on rule(s) ... from outside
# the group"). A local run, which needs no group, has none: the ordering chain of visits leads back
# into the group as soon as a finished visit lies between two that rerun (a visit deleted and redone).
# docs/cluster.md says what a checkpoint may split, and how to redo one visit of a finished chain on
# a cluster. No warmups: every visit takes them as inputs.
MEASURE_GROUP = f"measure_{CFG['label']}" if on_cluster(workflow) else None


def measure_resources(arms):
    """Resources of a measuring job that launches *arms* (config `resources`, docs/cluster.md)."""
    return pb_config.job_resources(CFG, "measure", arms)


def other_resources():
    return pb_config.job_resources(CFG, "other", [])


wildcard_constraints:
    arm="|".join(ARMS),
    length="|".join(LENGTHS),
    visit="|".join(VISIT_IDS),
    n="[1-9][0-9]*",
    rounds="[0-9]{2}",


def arm_patches(cfg, arm):
    return list(cfg["arms"][arm]["patches"])


def arm_source_files(cfg, arm, root):
    """Every file of the arm's source tree, so editing the source re-exports it."""
    from pairbench.arms.source import source_files

    if not isinstance(cfg["arms"][arm]["source"], str):
        return []  # a git tag is immutable; an installed engine has no source tree
    src = Path(cfg["arms"][arm]["source"])
    return [str(src / f) for f in source_files(root / src)]


def model_inputs(cfg, root):
    info = pb_config.resolve_model(cfg["model"], root)
    return [info["path"]] if info["kind"] == "gguf" else []


def visit_by_id(visits, visit_id):
    return next(v for v in visits if v["id"] == visit_id)


def previous_visit(visits, visit_id, res):
    """The previous visit's done-marker, as an ordering-only input.

    The previous visit must *finish* first, so no two visits ever overlap whatever --cores is; but
    re-measuring it must not make this visit out of date. Hence ``ancient()``, and a marker rather
    than the measure artifact itself: Snakemake honours ``ancient`` only for files that exist, and
    "delete one visit's artifact, rerun" must redo that visit alone.
    """
    v = visit_by_id(visits, visit_id)
    if v["index"] == 1:
        return []
    return [ancient(visit_marker(res, visits[v["index"] - 2]["id"]))]


def visit_marker(res, visit_id):
    return f"{res}/private/order/{visit_id}.done"


def previous_warmup(arms, arm, res):
    """Warmups run one after another (ordering only), after the fixtures job's servers are gone."""
    i = arms.index(arm)
    return [ancient(f"{res}/warmup/{arms[i - 1]}.json")] if i else []


def baseline_outputs(visits, visit_id, baseline, lengths, res):
    """The baseline arm's outputs in the same round (for the matches_baseline case)."""
    v = visit_by_id(visits, visit_id)
    if v["arm"] == baseline:
        return []
    return [f"{res}/private/outputs/r{v['round']:02d}-{baseline}-{n}.json" for n in lengths]


def validation_inputs():
    """The inputs every validation takes, a visit's and a validation retry's alike."""
    return dict(
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        baseline_outputs=lambda wc: baseline_outputs(VISITS, wc.visit, BASELINE, LENGTHS, RES),
    )


def validation_params():
    """The params every validation takes (pairbench.stages.validate.validate_stage's keywords)."""
    return dict(cases=CFG["validate"]["cases"], options=validate_options(CFG))


def validate_options(cfg):
    """The validation options handed to pairbench.validate.cases.run_cases."""
    v = cfg["validate"]
    return {"min_agreement": v["agreement"], "timeout_s": v["timeout_s"]}


def visit_inputs():
    """The inputs every visit's job takes, the visit's own and a validation retry's alike."""
    return dict(
        plan=f"{RES}/plan.json",
        build=lambda wc: f"{RES}/build/{visit_by_id(VISITS, wc.visit)['arm']}.json",
        warmups=expand(f"{RES}/warmup/{{arm}}.json", arm=ARMS),
        fixtures=expand(f"{RES}/fixtures/{{length}}.json", length=LENGTHS),
        prompts=expand(f"{RES}/private/prompts/{{length}}.json", length=LENGTHS),
    )


def visit_params():
    """The params every visit's job takes (pairbench.stages.measure.measure_stage's keywords)."""
    return dict(
        visit=lambda wc: visit_by_id(VISITS, wc.visit),
        arm_dir=lambda wc: f"{RES}/src/{visit_by_id(VISITS, wc.visit)['arm']}",
        arm_config=lambda wc: CFG["arms"][visit_by_id(VISITS, wc.visit)["arm"]],
        server=CFG["server"],
        root=str(ROOT),
        pid_file=f"{RES}/private/servers/measure.json",
    )


def measure_path(res, visit_id, n):
    """The visit's own measure artifact (n = 0) or that of its validation retry n."""
    return f"{res}/measure/{pb_retries.label(visit_id, n)}.json"


def validate_path(res, visit_id, n):
    return f"{res}/validate/{pb_retries.label(visit_id, n)}.json"


def validation_chain(visit_id):
    """[(measure, validate), ...] of one visit: the visit itself, then each validation retry it earned.

    Retry n+1 is earned when retry n's validation excludes a record for a kind in validate.retry_on
    and fewer than validate.retries retries were made. Reading a validation needs it to exist: until
    it does, the checkpoint raises and Snakemake adds its job and asks again once it has run.
    """
    n = 0
    chain = [(measure_path(RES, visit_id, 0), validate_path(RES, visit_id, 0))]
    while n < CFG["validate"]["retries"]:
        if n == 0:
            checkpoints.validate.get(visit=visit_id)
        else:
            checkpoints.validate_retry.get(visit=visit_id, n=str(n))
        if not pb_retries.retry_reasons(read_artifact(chain[-1][1], "validate"), CFG["validate"]["retry_on"]):
            break
        n += 1
        chain.append((measure_path(RES, visit_id, n), validate_path(RES, visit_id, n)))
    return chain


def adapt_decisions():
    """The adaptive-rounds decisions the run consulted, in order: [(rounds done, path)], [] for fixed
    rounds. Reading a decision needs it to exist: until it does, the checkpoint raises and Snakemake
    adds its job (after the visits it reads) and asks again."""
    if ADAPTIVE is None:
        return []
    out, r = [], ADAPTIVE["min"]
    while r <= ADAPTIVE["max"]:  # the last at max itself: it records the final widths and time
        path = checkpoints.adapt.get(rounds=f"{r:02d}").output.adapt
        out.append((r, path))
        if read_artifact(path, "adapt", ADAPT_VERSION)["decision"] == "stop":
            break
        r += ADAPTIVE["block"]
    return out


def run_rounds():
    """Rounds this run measures: the plan's, or as far as the adaptive decisions went."""
    if ADAPTIVE is None:
        return pb_plan.rounds_bounds(CFG)[1]
    decisions = adapt_decisions()
    if not decisions:
        return ADAPTIVE["min"]  # min == max: nothing to decide
    last_r, last = decisions[-1]
    return last_r if read_artifact(last, "adapt", ADAPT_VERSION)["decision"] == "stop" else last_r + ADAPTIVE["block"]


def run_visit_ids():
    """The visits this run measures, in plan order."""
    n = run_rounds()
    return [v["id"] for v in VISITS if v["round"] <= n]


def segment_last_visit(visit_id):
    """The last visit of the stretch of rounds measured before the next decision (the whole run for
    fixed rounds): a visit's validation waits for it, so no validation runs beside a measurement."""
    if ADAPTIVE is None:
        return VISIT_IDS[-1]
    r = visit_by_id(VISITS, visit_id)["round"]
    end = ADAPTIVE["min"]
    while end < r:
        end += ADAPTIVE["block"]
    return [v["id"] for v in VISITS if v["round"] <= end][-1]


def visits_through(rounds):
    return [v["id"] for v in VISITS if v["round"] <= rounds]


def chain_artifacts(kind, retries_only=False):
    """Every measured visit's measure (kind 0) or validate (kind 1) artifacts, its retries' included."""
    return [pair[kind] for v in run_visit_ids() for pair in validation_chain(v)[1 if retries_only else 0:]]


def retry_after(visit_id, n):
    """Ordering-only inputs of a visit's validation retry n (every n): retries run one at a time,
    after every visit was measured and validated, in plan order: every earlier visit's whole chain
    of retries first (not only the previous visit's, which may have none). Nothing else (no visit,
    no validation, no other retry) runs beside one, whatever --cores is, in a resumed run too."""
    v = visit_by_id(VISITS, visit_id)
    measured = run_visit_ids()
    after = [validate_path(RES, u, 0) for u in measured]
    after += [validation_chain(u["id"])[-1][1] for u in VISITS[: v["index"] - 1] if u["id"] in measured]
    return [ancient(p) for p in dict.fromkeys(after)]


def all_artifacts(cfg, res, visit_ids, lengths):
    """Every artifact of a run, stage by stage (the inputs of rule all); *visit_ids* the measured ones."""
    arms = list(cfg["arms"])
    return [
        f"{res}/plan.json",
        *(f"{res}/{kind}/{arm}.json" for kind in ("source", "build", "warmup") for arm in arms),
        *(f"{res}/fixtures/{n}.json" for n in lengths),
        *(f"{res}/{kind}/{v}.json" for kind in ("measure", "validate") for v in visit_ids),
        *(path for _, path in adapt_decisions()),
        f"{res}/stats/summary.json",
        *(f"{res}/tables/{t}.csv" for t in ("measurements", "summary", "paired", "ratios", "memory", "timing_agreement")),
        *(f"{res}/plots/{p}.png" for p in ("ratios", "drift")),
        *(f"{res}/crosscheck/{arm}.json" for arm in crosscheck_arms(cfg)),
        *([f"{res}/stats/crosscheck.json"] if crosscheck_arms(cfg) else []),
        f"{res}/publish/MANIFEST.json",
        f"{res}/publish/README.md",
    ]
