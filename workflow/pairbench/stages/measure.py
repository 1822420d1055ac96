"""Stages 3-4: fixtures (fitted with the first arm's tokenizer, checked by every arm's), warmup,
one visit, a validation retry's partial visit, the engine's own benchmark as a cross-check, and the
cost channel (each arm counted under a simulator). Every engine is driven through its adapter
(:func:`pairbench.engines.adapter.for_arm`), the embedded one included.

Each stage reads and writes its paths through the run's layout (:class:`pairbench.core.layout.Layout`,
the rule's ``params.layout``, :func:`pairbench.stages.script.typed`), and takes the arms' settings as one :class:`Arms`; the measuring itself is
:mod:`pairbench.measure`. A load run's level metrics are not computed here: a visit stores each
level's raw times, and the statistics compute the metrics (:mod:`pairbench.analysis.loadlevel`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from pairbench.core import conditions, naming
from pairbench.core.artifacts import atomic_write_text, dumps, read_artifact, sha256_file, write_artifact
from pairbench.core.layout import Layout
from pairbench.engines.adapter import ArmEngine, for_arm, model_arg
from pairbench.engines import fastpaths
from pairbench.engines.client import http
from pairbench.integrity import recovery
from pairbench.measure import cost as pb_cost
from pairbench.measure import fixtures as pb_fixtures
from pairbench.measure import node as pb_node
from pairbench.measure import toolbench as pb_toolbench
from pairbench.measure import visit as pb_visit
from pairbench.publish import envfacts
from pairbench.validate import retries

log = logging.getLogger("pairbench")


@dataclass(frozen=True)
class Arms:
    """The arms' settings a stage that launches them needs: each arm's config (``arms.<name>``), the
    ``server`` section and the checkout root the engines run from."""

    configs: dict
    server: dict
    root: str

    def engine(self, L: Layout, plan: dict, arm: str) -> ArmEngine:
        """*arm*'s adapter, from its build artifact (the opt-in checked first), launched with the
        native fast paths that any arm's code turned off turned off (every arm's build is read:
        :func:`pairbench.engines.fastpaths.resolve`)."""
        checks = {a: read_artifact(L.build(a), "build")["fast_paths"] for a in plan["arms"]}
        launch = fastpaths.resolve(arm, fastpaths.mode_of(self.configs[arm]), checks)
        return for_arm(self.configs[arm], build=read_artifact(L.build(arm), "build"), plan=plan, arm_dir=L.tree(arm),
                       server_cfg=self.server, root=self.root, fast_paths=launch)


@contextlib.contextmanager
def _tokenizing(engine: ArmEngine, server_log: str, server: dict):
    """The URL of *engine*'s running server, for its tokenizer; none is started (None) where the
    engine counts with the model directory's own tokenizer."""
    if engine.tokenizes_locally:
        yield None
        return
    with engine.server(server_log, server) as srv:
        yield srv.url


def _tokenizer(engine: ArmEngine, url: str | None):
    """messages -> the engine's token ids, in its dialect: its server's, or its model directory's."""
    client = http()
    return lambda messages: engine.tokenize(client, url, messages)


def fixtures_stage(layout: Layout, *, arms: list[str], arm_configs: dict, server: dict, root: str) -> None:
    """Fit every condition's fixture with the first arm's tokenizer, then re-check with every arm's.
    One server at a time; every arm's server re-tokenizes the finished messages and must agree
    token for token."""
    L, opts = layout, Arms(arm_configs, server, root)
    plan_body = read_artifact(L.plan, "plan")
    inputs = {"plan": sha256_file(L.plan), **{f"build.{a}": sha256_file(L.build(a)) for a in arms}}
    engines = [opts.engine(L, plan_body, a) for a in arms]
    conds = conditions.from_plan(plan_body)
    load = plan_body.get("load")
    per_level = load["warmup"] + load["requests"] if load and load["prefix"] == "distinct" else None
    server_log = L.server_log("fixtures")
    results = {}
    with _tokenizing(engines[0], server_log, server) as url:
        for cond in conds:
            results[cond.id] = pb_fixtures.build_fixture(cond, plan_body["seed"], plan_body["salts"][cond.id], arms[0],
                                                         _tokenizer(engines[0], url), requests=per_level)
            log.info("fixture %s: fitted %d round(s) with %s's tokenizer", cond.id, plan_body["rounds"], arms[0])
    for arm, engine in zip(arms[1:], engines[1:]):
        with _tokenizing(engine, server_log, server) as url:
            for cond in conds:
                pb_fixtures.check_tokenizer(*results[cond.id], arm, _tokenizer(engine, url))
                log.info("fixture %s: %s agrees token for token", cond.id, arm)
    for cond in conds:
        fixture, prompt_body = results[cond.id]
        prompt_body["inputs"] = dict(inputs)
        psha = write_artifact(L.prompts(cond.id), "prompts", prompt_body)
        fixture["inputs"] = {**inputs, "prompts": psha}
        write_artifact(L.fixture(cond.id), "fixture", fixture)


def warmup_stage(layout: Layout, *, arm: str, arm_config: dict, server: dict, root: str) -> None:
    """Launch *arm* once: health, version, a first-request diagnostic and a smoke check."""
    L = layout
    plan_body = read_artifact(L.plan, "plan")
    engine = Arms({arm: arm_config}, server, root).engine(L, plan_body, arm)
    body = pb_visit.run_warmup(arm=arm, engine=engine, plan=plan_body, server_cfg=server,
                               server_log=Path(L.server_log(f"warmup/{arm}")),
                               inputs={"plan": sha256_file(L.plan), "build": sha256_file(L.build(arm)),
                                       **{f"build.{a}": sha256_file(L.build(a)) for a in plan_body["arms"] if a != arm}})
    if not body["smoke_ok"]:
        log.warning("warmup of %s: %s", arm, "; ".join(body["problems"]))
    for line in fastpaths.notes(arm, body["engine_facts"], body["fast_paths"]):
        log.warning("%s", line)
    write_artifact(L.warmup(arm), "warmup", body)


def write_level_bodies(outputs: dict, visit: str, paths: dict[str, str], inputs: dict) -> None:
    """Move each level's private request body out of *outputs* into its own file (a load run);
    *inputs* are the visit's (the plan's and each fixture's sha256)."""
    for cond, texts in outputs.items():
        body = texts.pop("level", None)
        if body is not None:
            write_artifact(paths[cond], "levelrun", {"visit": visit, **body, "inputs": {
                "plan": inputs["plan"], f"fixture.{cond}": inputs[f"fixture.{cond}"]}})


@dataclass(frozen=True)
class VisitJob:
    """One visit's job (the visit itself or a validation retry): the run's layout, the visit (its
    plan entry), the arms' settings, Snakemake's attempt (1 = first) and the retry (0: the visit)."""

    layout: Layout
    visit: dict
    arms: Arms
    attempt: int = 1
    retry: int = 0

    @property
    def label(self) -> str:
        return naming.label(self.visit["id"], self.retry)


def measure_stage(layout: Layout, *, visit: dict, arm_config: dict, server: dict, root: str, attempt: int = 1) -> None:
    """One visit. *attempt* is Snakemake's (1 = first). Writes the measure artifact, one private
    output per condition, the node's facts (``private/hosts/<visit>.json``, which the bundle's
    environment.json describes), a load run's private request body per level, and the done-marker.

    A watchdog ends the job, after killing its server, if the Snakemake that started it is killed, so
    the orphaned job never goes on measuring beside the rerun (see pairbench.integrity.recovery).
    """
    job = VisitJob(layout, visit, Arms({visit["arm"]: arm_config}, server, root), attempt)
    L, vid = job.layout, visit["id"]
    plan_body = read_artifact(L.plan, "plan")
    body, texts, inputs = _measure(job, plan_body, only=None)
    write_level_bodies(texts, vid, {c: L.level(vid, c) for c in conditions.ids(plan_body["conditions"])}, inputs)
    for cond in conditions.ids(plan_body["conditions"]):
        write_artifact(L.output(vid, cond), "output", {"visit": vid, "condition": cond, **texts[cond],
                                                       "inputs": {"plan": inputs["plan"]}})
    atomic_write_text(L.host(vid), dumps(envfacts.node_facts(envfacts.collect(torch=False))))
    write_artifact(L.measure(vid), "measure", body)
    # Ordering marker for the next visit (see workflow/rules/common.smk: previous_visit).
    Path(L.marker(vid)).parent.mkdir(parents=True, exist_ok=True)
    Path(L.marker(vid)).write_text(vid + "\n")


def measure_retry_stage(layout: Layout, *, visit: dict, retry: int, retry_on: list[str], arm_config: dict, server: dict,
                        root: str, attempt: int = 1) -> None:
    """Validation retry *retry* of one visit: re-measure the conditions whose previous measurement
    (the visit itself, or retry *retry* - 1) was excluded for a kind in *retry_on* (pairbench.validate.retries).

    Writes ``measure/<visit>.retry<N>.json`` (with ``retry`` and ``retry_reasons``) and one private
    output per re-measured condition under its outputs folder; the previous artifacts are only read.
    """
    job = VisitJob(layout, visit, Arms({visit["arm"]: arm_config}, server, root), attempt, retry)
    L, vid = job.layout, visit["id"]
    reasons, previous = _retry_reasons(L, visit, retry, retry_on)
    log.info("%s retry %d: re-measuring condition(s) %s: %s", vid, retry, ", ".join(sorted(reasons)),
             " | ".join(f"{c}: {why['reason']}" for c, why in sorted(reasons.items())))
    body, texts, inputs = _measure(job, read_artifact(L.plan, "plan"), only=sorted(reasons))
    body["retry"] = retry
    body["retry_reasons"] = [{"condition": c, "reason": why["reason"][:1000], "kinds": why["kinds"]}
                             for c, why in sorted(reasons.items())]
    body["inputs"].update({"previous_measure": sha256_file(previous[0]), "previous_validate": sha256_file(previous[1])})
    out = Path(L.retry_outputs(vid, retry))
    out.mkdir(parents=True, exist_ok=True)
    write_level_bodies(texts, vid, {c: str(out / "levels" / f"{c}.json") for c in reasons}, inputs)
    for cond in sorted(reasons):
        write_artifact(out / f"{cond}.json", "output", {"visit": vid, "condition": cond, **texts[cond],
                                                        "retry": retry, "inputs": {"plan": inputs["plan"]}})
    write_artifact(L.measure(vid, retry), "measure", body)


def _retry_reasons(L: Layout, visit: dict, retry: int, retry_on: list[str]) -> tuple[dict, tuple[str, str]]:
    """``({condition: why}, (previous measure, previous validate))`` of retry *retry*: the previous
    measurement and its validation must be retry *retry* - 1 of *visit*, and must exclude something
    for a kind in *retry_on*."""
    vid = visit["id"]
    prev_m, prev_v = L.measure(vid, retry - 1), L.validate(vid, retry - 1)
    previous, validation = read_artifact(prev_m, "measure"), read_artifact(prev_v, "validate")
    if previous["visit"]["id"] != vid or naming.retry_number(previous) != retry - 1:
        raise ValueError(f"{prev_m}: not retry {retry - 1} of visit {vid}")
    if naming.validation_key(validation) != (vid, retry - 1):
        raise ValueError(f"{prev_v}: not the validation of retry {retry - 1} of visit {vid}")
    reasons = retries.retry_reasons(validation, retry_on)
    if not reasons:
        raise ValueError(f"{vid} retry {retry}: {prev_v} excludes no record for {', '.join(retry_on)}; there is "
                         f"nothing to retry")
    return reasons, (prev_m, prev_v)


def _measure(job: VisitJob, plan: dict, only: list[str] | None) -> tuple[dict, dict, dict]:
    """Launch, measure the conditions *only* (None: all) of the job's visit under the orphan
    watchdog: (body, outputs, inputs)."""
    L, arm = job.layout, job.visit["arm"]
    cids = conditions.ids(plan["conditions"])
    fixtures = {c: read_artifact(L.fixture(c), "fixture") for c in cids}
    prompts = {c: read_artifact(L.prompts(c), "prompts") for c in cids}
    inputs = {"plan": sha256_file(L.plan), "build": sha256_file(L.build(arm)),
              **{f"fixture.{c}": sha256_file(L.fixture(c)) for c in cids}}
    engine = job.arms.engine(L, plan, arm)
    orphaned = lambda: recovery.kill_stale(L.pid_file)  # noqa: E731
    with recovery.SnakemakeWatchdog(orphaned):
        body, outputs = pb_visit.run_visit(
            visit=job.visit, engine=engine, plan=plan, prompts=prompts, fixtures=fixtures, server_cfg=job.arms.server,
            server_log=Path(L.server_log(f"measure/{job.label}")), inputs=inputs, attempt=job.attempt,
            pid_path=Path(L.pid_file), only=only, secret=pb_node.run_secret([L.prompts(c) for c in cids]))
    for rec in body["records"]:
        if not rec["ok"]:
            log.warning("%s %s flagged: %s", job.visit["id"], rec["condition"], "; ".join(rec["flags"]))
    return body, outputs, inputs


def crosscheck_stage(layout: Layout, *, arms: list[str], arm_configs: dict, rounds: int, root: str,
                     tool_log: str) -> None:
    """The engine's own benchmark (llama-bench) from each arm's build, at the plan's input and output
    token counts, in rounds that alternate the arms; after every visit and validation (ordering
    inputs of the rule)."""
    L = layout
    plan_body = read_artifact(L.plan, "plan")
    arms_in = {a: {"config": arm_configs[a], "src_dir": L.tree(a), "model": model_arg(read_artifact(L.build(a), "build"),
                                                                                        root)} for a in arms}
    conds = conditions.from_plan(plan_body)
    lengths, outs = sorted({c.input_tokens for c in conds}), sorted({c.output_tokens for c in conds})
    bodies = pb_toolbench.run_toolbench(arms_in, lengths=lengths, output_tokens=outs, rounds=rounds,
                                        raw_out={a: L.crosscheck_raw(a) for a in arms}, log=tool_log)
    base = plan_body["baseline"]
    for a in arms:  # did each candidate's patch run at all? (pairbench.measure.exercise)
        bodies[a]["exercise"] = None if a == base else pb_toolbench.exercise_candidate(
            arms_in, base, a, lengths=lengths, output_tokens=outs, log=tool_log)
        if bodies[a]["exercise"]:
            log.info("%s: exercised %s: %s", a, bodies[a]["exercise"]["exercised"], bodies[a]["exercise"]["reason"])
    for a in arms:
        body = {**bodies[a], "inputs": {"plan": sha256_file(L.plan), "build": sha256_file(L.build(a))}}
        log.info("%s: %s", a, ", ".join(f"{t['test']}@d{t['n_depth']} {t['avg_tok_s']:.1f} tok/s" for t in body["tests"]))
        write_artifact(L.crosscheck(a), "crosscheck", body)


@dataclass(frozen=True)
class CostChannel:
    """What the cost stage reads of the config (its ``cost`` section, config/README.md): which
    conditions (None: every planned one; "shortest": the one with the shortest prompt), which
    phases, decode tokens per request, the cache simulated or not, the time limit of one arm's
    simulated run."""

    conditions: tuple[str, ...] | str | None
    phases: tuple[str, ...]
    decode_tokens: int
    cache_sim: bool
    timeout_s: float

    @classmethod
    def from_rule(cls, params: dict) -> "CostChannel":
        conds = params.get("conditions")
        return cls(conditions=conds if conds is None or isinstance(conds, str) else tuple(conds),
                   phases=tuple(params["phases"]), decode_tokens=int(params["decode_tokens"]), cache_sim=bool(params["cache_sim"]),
                   timeout_s=float(params["timeout_s"]))

    def runner(self) -> pb_cost.CostOptions:
        return pb_cost.CostOptions(decode_tokens=self.decode_tokens, cache_sim=self.cache_sim,
                                   timeout_s=self.timeout_s, phases=self.phases)

    def selected(self, plan: dict) -> list[conditions.Condition]:
        """The planned conditions this channel counts, in the plan's order (a condition the plan
        lacks is an error naming it and the planned ones)."""
        try:
            return conditions.selected(conditions.from_plan(plan), self.conditions)
        except ValueError as exc:
            raise ValueError(f"config cost.conditions: {exc}") from None


def _cost_requests(L: Layout, conds: list) -> list[dict]:
    """One request per condition: its round-1 prompt's token ids (private/prompts), as measured."""
    out = []
    for c in conds:
        first = read_artifact(L.prompts(c.id), "prompts")["rounds"][0]
        out.append({"condition": c.id, "ids": first["token_ids"], "input_tokens": c.input_tokens})
    return out


def _llama_bench(L: Layout, arm_cfg: dict, arm: str, engine: ArmEngine) -> str | None:
    """The arm's own ``llama-bench`` (its profile's cross-check tool, from the arm's build), or None
    for an engine without one (the embedded engine is counted in process)."""
    if engine.name == "embedded" or not pb_toolbench.has_crosscheck(arm_cfg):
        return None
    try:
        cmds = pb_toolbench.tool_commands(arm, arm_cfg, src_dir=L.tree(arm), model=engine.model, lengths=[1],
                                          output_tokens=[1])
    except pb_toolbench.ToolbenchError:
        return None
    return cmds[0][0] if cmds and os.path.basename(cmds[0][0]) == "llama-bench" else None


def cost_stage(layout: Layout, options: CostChannel, *, arm_configs: dict, server: dict, root: str,
               tool_log: str) -> None:
    """The cost channel: each arm's engine counted under callgrind, one fixed request per selected
    condition (:func:`pairbench.measure.cost.count_arm`), one arm after the other in one work folder
    shared by the arms (so every path the counted process holds is the same length: docs/cost.md),
    after every visit (ordering inputs of the rule). An arm that cannot be counted gets an artifact
    that says why; the wall-clock channel never waits on this one."""
    L, arms = layout, Arms(arm_configs, server, root)
    plan_body = read_artifact(L.plan, "plan")
    conds = options.selected(plan_body)
    requests = _cost_requests(L, conds)
    work = Path(L.private) / "cost" / "work"
    for a in plan_body["arms"]:
        build_path = L.build(a)
        engine = arms.engine(L, plan_body, a)
        try:
            counted = pb_cost.count_arm(engine, requests, options.runner(), work=work, log=Path(tool_log),
                                        llama_bench=_llama_bench(L, arms.configs[a], a, engine))
            body = pb_cost.artifact_body(a, engine.name, options.runner(), cost=counted)
            log.info("%s: counted in %.0f s: %s", a, counted.duration_s, "; ".join(
                f"{r['condition']} {r['phase']} {r['events']['Ir'] / r['tokens']:,.0f} instructions/token"
                for r in body["rows"]))
        except pb_cost.CostUnavailable as exc:
            body = pb_cost.artifact_body(a, engine.name, options.runner(), unavailable=exc)
            log.warning("%s: not counted (%s): %s", a, exc.reason, exc)
        except Exception as exc:  # a bug of the channel must not keep the wall-clock report from being made
            log.exception("%s: the cost channel failed", a)
            why = pb_cost.CostUnavailable("failed", f"the cost channel failed on arm {a}: {type(exc).__name__}: {exc}")
            body = pb_cost.artifact_body(a, engine.name, options.runner(), unavailable=why)
        body["inputs"] = {"plan": sha256_file(L.plan), "build": sha256_file(build_path),
                          **{f"prompts.{r['condition']}": sha256_file(L.prompts(r["condition"])) for r in requests}}
        write_artifact(L.cost(a), "cost", body)
    drop_scratch(work)


def drop_scratch(work: Path) -> None:
    """Remove the cost job's work folder (``private/cost/work``) and ``private/cost`` when that is
    then empty. It is scratch, not a record: a byte-compiled copy of the last arm's tree, a link to
    the model and the last arm's callgrind dumps only (each arm clears the one before's), so what it
    held after the job described one arm of the run at most. The counts are in ``cost/<arm>.json``,
    the tool's output in the job's log; the next cost job makes the folder again, at the same path
    (docs/cost.md, "Determinism")."""
    shutil.rmtree(work, ignore_errors=True)
    with contextlib.suppress(OSError):
        work.parent.rmdir()
