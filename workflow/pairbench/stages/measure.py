"""Stages 3-4: fixtures (fitted with the first arm's tokenizer, checked by every arm's), warmup,
one visit, a validation retry's partial visit, and the engine's own benchmark as a cross-check. Every engine is driven through its adapter
(:func:`pairbench.engines.adapter.for_arm`), the embedded one included."""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from pairbench.analysis import loadlevel
from pairbench.core import conditions, loadconfig, naming
from pairbench.core.artifacts import atomic_write_text, dumps, read_artifact, sha256_file, write_artifact
from pairbench.engines.adapter import ArmEngine, for_arm, model_arg
from pairbench.engines.client import http
from pairbench.integrity import recovery
from pairbench.measure import fixtures as pb_fixtures
from pairbench.measure import node as pb_node
from pairbench.measure import toolbench as pb_toolbench
from pairbench.measure import visit as pb_visit
from pairbench.publish import envfacts
from pairbench.validate import retries

log = logging.getLogger("pairbench")


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


def fixtures_stage(*, fixtures: list[str], prompts: list[str], plan: str, builds: list[str], arms: list[str],
                   arm_dirs: list[str], server: dict, arm_configs: dict, server_log: str, root: str) -> None:
    """Fit every condition's fixture with the first arm's tokenizer, then re-check with every arm's.
    One server at a time; every arm's server re-tokenizes the finished messages and must agree
    token for token. *fixtures* and *prompts* are in the plan's condition order."""
    plan_body = read_artifact(plan, "plan")
    build_bodies = [read_artifact(p, "build") for p in builds]
    inputs = {"plan": sha256_file(plan), **{f"build.{a}": sha256_file(p) for a, p in zip(arms, builds)}}
    engines = [for_arm(arm_configs[a], build=b, plan=plan_body, arm_dir=d, server_cfg=server, root=root)
               for a, b, d in zip(arms, build_bodies, arm_dirs)]
    conds = conditions.from_plan(plan_body)
    load = plan_body.get("load")
    per_level = load["warmup"] + load["requests"] if load and load["prefix"] == "distinct" else None
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
    for cond, fpath, ppath in zip(conds, fixtures, prompts):
        fixture, prompt_body = results[cond.id]
        prompt_body["inputs"] = dict(inputs)
        psha = write_artifact(ppath, "prompts", prompt_body)
        fixture["inputs"] = {**inputs, "prompts": psha}
        write_artifact(fpath, "fixture", fixture)


def warmup_stage(*, warmup: str, plan: str, build: str, arm: str, arm_dir: str, arm_config: dict, server: dict,
                 server_log: str, root: str) -> None:
    plan_body = read_artifact(plan, "plan")
    engine = for_arm(arm_config, build=read_artifact(build, "build"), plan=plan_body, arm_dir=arm_dir,
                     server_cfg=server, root=root)
    body = pb_visit.run_warmup(arm=arm, engine=engine, plan=plan_body, server_cfg=server, server_log=Path(server_log),
                               inputs={"plan": sha256_file(plan), "build": sha256_file(build)})
    if not body["smoke_ok"]:
        log.warning("warmup of %s: %s", arm, "; ".join(body["problems"]))
    write_artifact(warmup, "warmup", body)


def level_judge(plan: dict):
    """A load run's level judge (pairbench.measure.loadvisit.LevelJudge): the level's metrics and
    validity by pairbench.analysis.loadlevel, with the plan's SLO, percentiles and bounds; None for a
    single-stream run."""
    load = plan.get("load")
    if not load:
        return None
    slo, bounds = loadconfig.slo(load), loadlevel.Bounds(**load["validity"])
    pct = tuple(load["percentiles"])

    def judge(run: dict, cond) -> tuple[dict, dict]:
        m = loadlevel.level_metrics(run, level=cond.id, slo=slo, percentiles=pct)
        v = loadlevel.check(m, bounds).to_dict()
        return m.to_dict(), {k: v[k] for k in ("ok", "failed", "messages")}

    return judge


def write_level_bodies(outputs: dict, visit: str, paths: dict[str, str], inputs: dict) -> None:
    """Move each level's private request body out of *outputs* into its own file (a load run);
    *inputs* are the visit's (the plan's and each fixture's sha256)."""
    for cond, texts in outputs.items():
        body = texts.pop("level", None)
        if body is not None:
            write_artifact(paths[cond], "levelrun", {"visit": visit, **body, "inputs": {
                "plan": inputs["plan"], f"fixture.{cond}": inputs[f"fixture.{cond}"]}})


def measure_stage(*, measure: str, outputs: list[str], marker: str, plan: str, build: str, fixtures: list[str],
                  prompts: list[str], visit: dict, arm_dir: str, arm_config: dict, server: dict, server_log: str,
                  root: str, attempt: int = 1, pid_file: str | None = None, host: str | None = None,
                  levels: list[str] | None = None) -> None:
    """One visit. *attempt* is Snakemake's (1 = first); *pid_file* the visits' shared server pid file;
    *host* receives the facts of the node that measured (pairbench.publish.envfacts.node_facts), which
    the bundle's environment.json describes; *levels* (a load run) the private request body of each
    level, in the plan's condition order.

    A watchdog ends the job, after killing its server, if the Snakemake that started it is killed, so
    the orphaned job never goes on measuring beside the rerun (see pairbench.integrity.recovery).
    """
    plan_body = read_artifact(plan, "plan")
    body, texts, inputs = _measure(plan_body, plan, build, fixtures, prompts, visit, arm_dir, arm_config, server,
                                   server_log, root, attempt, pid_file, only=None)
    write_level_bodies(texts, visit["id"], dict(zip(conditions.ids(plan_body["conditions"]), levels or [])), inputs)
    for cond, path in zip(conditions.ids(plan_body["conditions"]), outputs):
        write_artifact(path, "output", {"visit": visit["id"], "condition": cond, **texts[cond],
                                        "inputs": {"plan": inputs["plan"]}})
    if host:
        atomic_write_text(host, dumps(envfacts.node_facts(envfacts.collect(torch=False))))
    write_artifact(measure, "measure", body)
    # Ordering marker for the next visit (see workflow/rules/common.smk: previous_visit).
    Path(marker).parent.mkdir(parents=True, exist_ok=True)
    Path(marker).write_text(visit["id"] + "\n")


def measure_retry_stage(*, measure: str, outputs: str, plan: str, build: str, fixtures: list[str], prompts: list[str],
                        previous_measure: str, previous_validate: str, retry: int, retry_on: list[str], visit: dict,
                        arm_dir: str, arm_config: dict, server: dict, server_log: str, root: str, attempt: int = 1,
                        pid_file: str | None = None) -> None:
    """Validation retry *retry* of one visit: re-measure the conditions whose previous measurement
    (the visit itself, or retry *retry* - 1) was excluded for a kind in *retry_on* (pairbench.validate.retries).

    Writes ``measure/<visit>.retry<N>.json`` (with ``retry`` and ``retry_reasons``) and one private
    output per re-measured condition under the *outputs* folder; the previous artifacts are only read.
    """
    plan_body = read_artifact(plan, "plan")
    previous = read_artifact(previous_measure, "measure")
    validation = read_artifact(previous_validate, "validate")
    if previous["visit"]["id"] != visit["id"] or naming.retry_number(previous) != retry - 1:
        raise ValueError(f"{previous_measure}: not retry {retry - 1} of visit {visit['id']}")
    if naming.validation_key(validation) != (visit["id"], retry - 1):
        raise ValueError(f"{previous_validate}: not the validation of retry {retry - 1} of visit {visit['id']}")
    reasons = retries.retry_reasons(validation, retry_on)
    if not reasons:
        raise ValueError(f"{visit['id']} retry {retry}: {previous_validate} excludes no record for "
                         f"{', '.join(retry_on)}; there is nothing to retry")
    log.info("%s retry %d: re-measuring condition(s) %s: %s", visit["id"], retry, ", ".join(sorted(reasons)),
             " | ".join(f"{c}: {why['reason']}" for c, why in sorted(reasons.items())))
    body, texts, inputs = _measure(plan_body, plan, build, fixtures, prompts, visit, arm_dir, arm_config, server,
                                   server_log, root, attempt, pid_file, only=sorted(reasons))
    body["retry"] = retry
    body["retry_reasons"] = [{"condition": c, "reason": why["reason"][:1000], "kinds": why["kinds"]}
                             for c, why in sorted(reasons.items())]
    body["inputs"].update({"previous_measure": sha256_file(previous_measure),
                           "previous_validate": sha256_file(previous_validate)})
    out = Path(outputs)
    out.mkdir(parents=True, exist_ok=True)
    write_level_bodies(texts, visit["id"], {c: str(out / "levels" / f"{c}.json") for c in reasons}, inputs)
    for cond in sorted(reasons):
        write_artifact(out / f"{cond}.json", "output", {"visit": visit["id"], "condition": cond, **texts[cond],
                                                        "retry": retry, "inputs": {"plan": inputs["plan"]}})
    write_artifact(measure, "measure", body)


def _measure(plan: dict, plan_path: str, build_path: str, fixture_paths: list[str], prompt_paths: list[str],
             visit: dict, arm_dir: str, arm_cfg: dict, server_cfg: dict, server_log: str, root: str, attempt: int,
             pid_path: str | None, only: list[str] | None) -> tuple[dict, dict, dict]:
    """Launch, measure the conditions *only* (None: all) of *visit* under the orphan watchdog:
    (body, outputs, inputs)."""
    build = read_artifact(build_path, "build")
    fixtures = {f["condition"]: f for f in (read_artifact(p, "fixture") for p in fixture_paths)}
    prompts = {p["condition"]: p for p in (read_artifact(p, "prompts") for p in prompt_paths)}
    inputs = {"plan": sha256_file(plan_path), "build": sha256_file(build_path),
              **{f"fixture.{f['condition']}": sha256_file(p) for f, p in
                 zip((fixtures[c] for c in conditions.ids(plan["conditions"])), fixture_paths)}}
    engine = for_arm(arm_cfg, build=build, plan=plan, arm_dir=arm_dir, server_cfg=server_cfg, root=root)
    orphaned = (lambda: recovery.kill_stale(pid_path)) if pid_path else (lambda: None)
    with recovery.SnakemakeWatchdog(orphaned):
        body, outputs = pb_visit.run_visit(
            visit=visit, engine=engine, plan=plan, prompts=prompts, fixtures=fixtures, server_cfg=server_cfg,
            server_log=Path(server_log), inputs=inputs, attempt=attempt,
            pid_path=Path(pid_path) if pid_path else None, only=only, judge=level_judge(plan))
    # where it ran: the pseudonym is public, the real name goes only into the private outputs
    host = pb_node.hostname()
    body["host"]["node"] = pb_node.pseudonym(host, pb_node.run_secret(prompt_paths))
    outputs = {c: {**texts, "node": host} for c, texts in outputs.items()}
    for rec in body["records"]:
        if not rec["ok"]:
            log.warning("%s %s flagged: %s", visit["id"], rec["condition"], "; ".join(rec["flags"]))
    return body, outputs, inputs


def crosscheck_stage(*, crosschecks: list[str], raw: list[str], plan: str, builds: list[str], arms: list[str],
                     arm_dirs: list[str], arm_configs: dict, rounds: int, root: str, tool_log: str) -> None:
    """The engine's own benchmark (llama-bench) from each arm's build, at the plan's input and output
    token counts, in rounds that alternate the arms; after every visit and validation (ordering
    inputs of the rule)."""
    plan_body = read_artifact(plan, "plan")
    arms_in = {a: {"config": arm_configs[a], "src_dir": d, "model": model_arg(read_artifact(b, "build"), root)}
               for a, d, b in zip(arms, arm_dirs, builds)}
    conds = conditions.from_plan(plan_body)
    bodies = pb_toolbench.run_toolbench(arms_in, lengths=sorted({c.input_tokens for c in conds}),
                                        output_tokens=sorted({c.output_tokens for c in conds}),
                                        rounds=rounds, raw_out=dict(zip(arms, raw)), log=tool_log)
    for a, out, b in zip(arms, crosschecks, builds):
        body = {**bodies[a], "inputs": {"plan": sha256_file(plan), "build": sha256_file(b)}}
        log.info("%s: %s", a, ", ".join(f"{t['test']}@d{t['n_depth']} {t['avg_tok_s']:.1f} tok/s" for t in body["tests"]))
        write_artifact(out, "crosscheck", body)
