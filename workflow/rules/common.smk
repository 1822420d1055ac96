"""Config validation, the run layout and the input helpers shared by every stage.

The config is loaded here, at parse time (pairbench.stages.runconfig.load_config: read, checked whole,
defaults filled, normalized), so an invalid one fails before any job runs, with every error at once,
each naming its key, file and line; then the plan is printed in words. The globals: ``CFG`` (the
loaded config), ``ROOT`` (this checkout), ``L`` (the run layout, pairbench.core.layout: every path
of results/<label>/), and ``SOURCES`` (where the config came from). Every
helper takes ``cfg`` and reads nothing else; the ones that read a checkpoint's result use
Snakemake's ``checkpoints`` object, which only exists here.
"""

import functools
import re
import sys
from pathlib import Path

# Import pairbench from THIS checkout's workflow/ (never a copy installed from another checkout).
sys.path.insert(0, str(Path(workflow.basedir) / "workflow"))

from snakemake.logging import logger

from pairbench.arms import source as pb_source
from pairbench.core import conditions as pb_conditions
from pairbench.core import config as pb_config
from pairbench.core import models as pb_models
from pairbench.core import plan as pb_plan
from pairbench.core.artifacts import read_artifact
from pairbench.core.configsource import Sources
from pairbench.core.layout import PER_ARM, Layout
from pairbench.measure import node as pb_node
from pairbench.stages import runconfig as pb_runconfig
from pairbench.stages.summary import plan_summary
from pairbench.validate import retries as pb_retries

ROOT = Path(workflow.basedir)


def config_sources(workflow, config):
    """Where the config came from: the --configfile files (each replaces config/config.yaml: the
    Snakefile reads that only without one) or config/config.yaml, then --config. A study's
    comparison (a module, its config made by workflow/rules/study.smk) names its comparison."""
    settings = workflow.config_settings
    if workflow.modifier.namespace is not None:
        study = ", ".join(pb_runconfig.display_path(f) for f in settings.configfiles)
        return Sources(context=f"{study}, comparison {config.get('label')}")
    files = [pb_runconfig.display_path(f) for f in settings.configfiles] or ["config/config.yaml"]
    return Sources.read(files, dict(settings.config))


def loaded_config(config, sources):
    """The run config (pairbench.stages.runconfig.load_config): every problem at once, each at its
    file and line, and no job runs. --config lists and maps are read as YAML (Snakemake leaves
    their numbers strings)."""
    try:
        return pb_runconfig.load_config(given=config, sources=sources, root=ROOT)
    except pb_runconfig.ConfigErrors as exc:
        sys.exit(str(exc))


SOURCES = config_sources(workflow, config)
CFG = loaded_config(config, SOURCES)
L = Layout(CFG["label"])

# The plan in words, before anything runs (a dry run too), through Snakemake's logger: on stdout
# with a run's other messages, on stderr under --dag/--rulegraph, whose stdout stays a graph. Not
# in a job that a cluster node or a group job runs (its own snakemake parses this file again).
if workflow.exec_mode.name == "DEFAULT":
    logger.info(plan_summary(CFG, SOURCES.describe()))


def arms(cfg):
    return pb_config.arm_names(cfg)


def run_layout(wildcards, output):
    """A stage's ``layout`` param (pairbench.stages.script: ``layout: Layout``): the run folder, read
    from the rule's first output, ``results/<label>/<folder>/<file>``, so a storage plugin's prefix
    comes with it."""
    return str(Path(output[0]).parent.parent)


def condition_ids(cfg):
    """The run's conditions (pairbench.core.conditions), in plan order."""
    return [c.id for c in pb_conditions.conditions(cfg)]


def load_run(cfg):
    """Whether the run is a load run (config load:): its visits measure load levels."""
    return cfg.get("load") is not None


def level_files(cfg, visit):
    """A load run's per-level private request bodies of one visit ({} for a single-stream run)."""
    return {"levels": [L.level(visit, c) for c in condition_ids(cfg)]} if load_run(cfg) else {}


def load_tables(cfg):
    """A load run's capacity tables ({} for a single-stream run)."""
    return {f"{name}_csv": L.table(name) for name in ("capacity", "capacity_paired")} if load_run(cfg) else {}


def visits(cfg):
    """Every visit the plan holds (up to rounds.max when adaptive), in run order."""
    return pb_plan.visits(cfg)


def visit_by_id(cfg, visit_id):
    return next(v for v in visits(cfg) if v["id"] == visit_id)


def crosscheck_arms(cfg):
    """[baseline, candidate]: the baseline and the first candidate (config order) whose engine
    profiles both name a cross-check tool, when crosscheck.rounds > 0; else [] (no cross-check job).
    One candidate only: the tool is an independent sanity check of the harness, not a second
    verdict per candidate, and each further arm would add its rounds of the tool to the run."""
    from pairbench.measure.toolbench import has_crosscheck

    base = pb_config.baseline_arm(cfg)
    if cfg["crosscheck"]["rounds"] < 1 or not has_crosscheck(cfg["arms"][base]):
        return []
    cand = next((c for c in pb_config.candidate_arms(cfg) if has_crosscheck(cfg["arms"][c])), None)
    return [base, cand] if cand else []


def cost_arms(cfg):
    """Every arm, when the cost channel is on (cost.enabled) and the run is single-stream; else []
    (no cost job). A load run's levels are many concurrent requests: one counted request is not one."""
    if not cfg["cost"]["enabled"] or cfg.get("load"):
        return []
    return arms(cfg)


def on_cluster(workflow):
    """Whether a cluster executor runs this workflow's jobs, from the executor Snakemake chose, or
    remote mode (a job on a node). Only valid once jobs are being expanded: while the Snakefile is
    parsed no executor is chosen yet and every run reads as local. (--jobs is no sign: a local
    `--cores 2 --jobs 2` keeps it too.) A dry run reads as local, whatever executor it previews."""
    return workflow.non_local_exec or workflow.remote_exec


def measure_group(cfg):
    """The ``group:`` of a visit: a function, so it is decided when the job is expanded, after
    Snakemake has chosen its executor (:func:`on_cluster`); the comparison's group on a cluster,
    None locally.

    The visits are one Snakemake job group when a cluster executor runs them: the group is one job
    on one node, one visit at a time (the visits are chained). Only the visits: Snakemake rejects a
    group that a path through jobs outside it leads back into, and every job that follows a visit (a
    validation and its checkpoint, a validation retry, an adaptive decision, the cross-check) waits
    for validations; with those inside, a second comparison's group still in flight when the first
    one's checkpoint updated the DAG was rejected ("depends on rule(s) ... from outside the group").
    A local run, which needs no group, has none: the ordering chain of visits leads back into the
    group as soon as a finished visit lies between two that rerun (a visit deleted and redone).
    docs/cluster.md says what a checkpoint may split, and how to redo one visit of a finished chain
    on a cluster. No warmups: every visit takes them as inputs.
    """
    return lambda wildcards: f"measure_{cfg['label']}" if on_cluster(workflow) else None


def measure_resources(cfg):
    """Resources of a measuring job, which launches every arm (config `resources`, docs/cluster.md)."""
    return pb_config.job_resources(cfg, "measure", arms(cfg))


def visit_resources(cfg):
    """A visit's resources: a measuring job's, and on a cluster, for the rounds after the first
    block of an adaptive run, the first block's node (``--nodelist``): each block is a job group of
    its own, which Slurm could otherwise place anywhere."""
    res = measure_resources(cfg)
    if pb_plan.adaptive(cfg) is not None:  # decided per job, once the executor is chosen
        res["slurm_extra"] = lambda wc: pinned_extra(cfg, wc.visit)
    return res


def pinned_extra(cfg, visit_id):
    first = visits(cfg)[0]["id"]
    node = None
    if on_cluster(workflow) and visit_by_id(cfg, visit_id)["round"] > pb_plan.adaptive(cfg)["min"]:
        node = read_artifact(L.output(first, condition_ids(cfg)[0]), "output").get("node")
    return pb_node.pin_extra(cfg["resources"]["extra"], node)


def other_resources(cfg):
    return pb_config.job_resources(cfg, "other", [])


wildcard_constraints:
    arm="|".join(arms(CFG)),
    condition="|".join(re.escape(c) for c in condition_ids(CFG)),
    visit="|".join(v["id"] for v in visits(CFG)),
    n="[1-9][0-9]*",
    rounds="[0-9]{2}",


def arm_patches(cfg, arm):
    return list(cfg["arms"][arm]["patches"])


def arm_source_files(cfg, arm, root):
    """Every file of the arm's source tree, so editing the source re-exports it."""
    from pairbench.core.trees import source_files

    if not isinstance(cfg["arms"][arm]["source"], str):
        return []  # a git tag is immutable; an installed engine has no source tree
    src = Path(cfg["arms"][arm]["source"])
    return [str(src / f) for f in source_files(root / src)]


def git_commit(cfg, arm, root):
    """The commit an arm's git source names now (None for any other source), resolved once per
    snakemake invocation (pairbench.arms.source.resolve_source)."""
    source = cfg["arms"][arm]["source"]
    if not pb_source.is_git_source(source):
        return None
    return _resolved_commit(str(root), tuple(sorted(source.items())))


@functools.lru_cache(maxsize=None)
def _resolved_commit(root, source):
    return pb_source.resolve_source(dict(source), root).commit


def model_inputs(cfg, root):
    return pb_models.model_files(pb_models.resolve_model(cfg["model"], root))


def per_arm(cfg, stage):
    """Every arm's artifact of a per-arm *stage* (source, build, warmup), in arm order."""
    return [L.per_arm(stage, a) for a in arms(cfg)]


def fixtures(cfg):
    return [L.fixture(c) for c in condition_ids(cfg)]


def prompts(cfg):
    return [L.prompts(c) for c in condition_ids(cfg)]


def previous_visit(cfg, visit_id):
    """The previous visit's done-marker, as an ordering-only input.

    The previous visit must *finish* first, so no two visits ever overlap whatever --cores is; but
    re-measuring it must not make this visit out of date. Hence ``ancient()``, and a marker rather
    than the measure artifact itself: Snakemake honours ``ancient`` only for files that exist, and
    "delete one visit's artifact, rerun" must redo that visit alone.
    """
    vs = visits(cfg)
    v = visit_by_id(cfg, visit_id)
    return [ancient(L.marker(vs[v["index"] - 2]["id"]))] if v["index"] > 1 else []


def previous_warmup(cfg, arm):
    """Warmups run one after another (ordering only), after the fixtures job's servers are gone."""
    names = arms(cfg)
    i = names.index(arm)
    return [ancient(L.warmup(names[i - 1]))] if i else []


def baseline_outputs(cfg, visit_id):
    """The baseline arm's outputs in the same round (for the matches_baseline case)."""
    v = visit_by_id(cfg, visit_id)
    base = pb_config.baseline_arm(cfg)
    if v["arm"] == base:
        return []
    return [L.output(f"r{v['round']:02d}-{base}", c) for c in condition_ids(cfg)]


def validation_inputs(cfg):
    """The inputs every validation takes, a visit's and a validation retry's alike (the plan: a load
    level's validity is judged by its load parameters, pairbench.analysis.loadlevel)."""
    return dict(plan=L.plan, fixtures=fixtures(cfg), baseline_outputs=lambda wc: baseline_outputs(cfg, wc.visit))


def validation_params(cfg):
    """The params every validation takes (pairbench.stages.validate.validate_stage's keywords)."""
    v = cfg["validate"]
    return dict(cases=v["cases"], options={"min_agreement": v["agreement"], "timeout_s": v["timeout_s"]})


def visit_inputs(cfg):
    """The inputs every visit's job takes, the visit's own and a validation retry's alike."""
    return dict(
        plan=L.plan,
        build=lambda wc: L.build(visit_by_id(cfg, wc.visit)["arm"]),
        builds=per_arm(cfg, "build"),  # the fast paths any arm's code turned off (pairbench.engines.fastpaths)
        warmups=per_arm(cfg, "warmup"),
        fixtures=fixtures(cfg),
        prompts=prompts(cfg),
    )


def visit_params(cfg):
    """The params every visit's job takes (pairbench.stages.measure.measure_stage's keywords; its
    paths come from the run layout)."""
    return dict(
        layout=run_layout,  # results/<label>: the stage's paths come from the run layout
        visit=lambda wc: visit_by_id(cfg, wc.visit),
        arm_config=lambda wc: cfg["arms"][visit_by_id(cfg, wc.visit)["arm"]],
        server=cfg["server"],
        root=str(ROOT),
    )


def validation_chain(cfg, visit_id):
    """[(measure, validate), ...] of one visit: the visit itself, then each validation retry it earned.

    Retry n+1 is earned when retry n's validation excludes a record for a kind in validate.retry_on
    and fewer than validate.retries retries were made. Reading a validation needs it to exist: until
    it does, the checkpoint raises and Snakemake adds its job and asks again once it has run.
    """
    n = 0
    chain = [(L.measure(visit_id), L.validate(visit_id))]
    while n < cfg["validate"]["retries"]:
        if n == 0:
            checkpoints.validate.get(visit=visit_id)
        else:
            checkpoints.validate_retry.get(visit=visit_id, n=str(n))
        if not pb_retries.retry_reasons(read_artifact(chain[-1][1], "validate"), cfg["validate"]["retry_on"]):
            break
        n += 1
        chain.append((L.measure(visit_id, n), L.validate(visit_id, n)))
    return chain


def adapt_decisions(cfg):
    """The adaptive-rounds decisions the run consulted, in order: [(rounds done, path)], [] for fixed
    rounds. Reading a decision needs it to exist: until it does, the checkpoint raises and Snakemake
    adds its job (after the visits it reads) and asks again."""
    a = pb_plan.adaptive(cfg)
    if a is None:
        return []
    out, r = [], a["min"]
    while r <= a["max"]:  # the last at max itself: it records the final widths and time
        path = checkpoints.adapt.get(rounds=f"{r:02d}").output.adapt
        out.append((r, path))
        if read_artifact(path, "adapt")["decision"] == "stop":
            break
        r += a["block"]
    return out


def run_rounds(cfg):
    """Rounds this run measures: the plan's, or as far as the adaptive decisions went."""
    a = pb_plan.adaptive(cfg)
    if a is None:
        return pb_plan.rounds_bounds(cfg)[1]
    decisions = adapt_decisions(cfg)
    if not decisions:
        return a["min"]  # min == max: nothing to decide
    last_r, last = decisions[-1]
    return last_r if read_artifact(last, "adapt")["decision"] == "stop" else last_r + a["block"]


def run_visit_ids(cfg):
    """The visits this run measures, in plan order."""
    n = run_rounds(cfg)
    return [v["id"] for v in visits(cfg) if v["round"] <= n]


def segment_last_visit(cfg, visit_id):
    """The last visit of the stretch of rounds measured before the next decision (the whole run for
    fixed rounds): a visit's validation waits for it, so no validation runs beside a measurement."""
    a = pb_plan.adaptive(cfg)
    vs = visits(cfg)
    if a is None:
        return vs[-1]["id"]
    r = visit_by_id(cfg, visit_id)["round"]
    end = a["min"]
    while end < r:
        end += a["block"]
    return [v["id"] for v in vs if v["round"] <= end][-1]


def visits_through(cfg, rounds):
    return [v["id"] for v in visits(cfg) if v["round"] <= rounds]


def chain_artifacts(cfg, kind, retries_only=False):
    """Every measured visit's measure (kind 0) or validate (kind 1) artifacts, its retries' included."""
    return [pair[kind] for v in run_visit_ids(cfg) for pair in validation_chain(cfg, v)[1 if retries_only else 0:]]


def retry_after(cfg, visit_id, n):
    """Ordering-only inputs of a visit's validation retry n (every n): retries run one at a time,
    after every visit was measured and validated, in plan order: every earlier visit's whole chain
    of retries first (not only the previous visit's, which may have none). Nothing else (no visit,
    no validation, no other retry) runs beside one, whatever --cores is, in a resumed run too."""
    v = visit_by_id(cfg, visit_id)
    measured = run_visit_ids(cfg)
    after = [L.validate(u) for u in measured]
    after += [validation_chain(cfg, u["id"])[-1][1] for u in visits(cfg)[: v["index"] - 1] if u["id"] in measured]
    return [ancient(p) for p in dict.fromkeys(after)]
