"""One function per pipeline stage: read input artifacts, call the library, write output artifacts.

The Snakemake scripts in workflow/scripts are thin wrappers over these (they only unpack
``snakemake.input/output/params``), so every stage can be run and tested without Snakemake.
Every artifact is read with ``read_artifact`` (schema-checked) and written with ``write_artifact``
(schema-checked, atomic), and records the sha256 of what it was derived from under ``inputs``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pairbench.arms import build as pb_build
from pairbench.engines import profiles as engines
from pairbench.core import config as pb_config
from pairbench.measure import fixtures as pb_fixtures
from pairbench.measure import visit as pb_measure
from pairbench.core import plan as pb_plan
from pairbench.arms import source as pb_source
from pairbench.core.artifacts import read_artifact, sha256_file, write_artifact
from pairbench.engines.client import http, tokenize_messages
from pairbench.engines.server import Server

log = logging.getLogger("pairbench")


def plan_stage(plan_path: str, config: dict, root: str) -> None:
    write_artifact(plan_path, "plan", pb_plan.make_plan(config, Path(root)))


def source_stage(source_path: str, tree_dir: str, arm: str, plan_path: str, root: str) -> None:
    plan = read_artifact(plan_path, "plan")
    arm_cfg = plan["arms"][arm]
    body = pb_source.export_source(arm, arm_cfg["source"], arm_cfg["patches"], tree_dir, root,
                                   plan_sha256=sha256_file(plan_path))
    log.info("exported %s@%s to %s; %d patch(es) applied, %d file(s) changed", arm_cfg["source"], body["version"],
             tree_dir, len(body["patches"]), len(body["patched"]["changed"]))
    write_artifact(source_path, "source", body)


def build_stage(build_path: str, source_path: str, arm: str, arm_dir: str, model: str, cache_dir: str,
                build_log: str, root: str) -> None:
    source = read_artifact(source_path, "source")
    info = pb_config.resolve_model(model, Path(root))
    plan = read_artifact(Path(source_path).parent.parent / "plan.json", "plan")
    if plan["arms"][arm].get("engine", "embedded") != "embedded":
        engines.plan_opt_in(plan)  # never build someone else's code without consent
        body = pb_build.build_external_arm(arm, plan["arms"][arm], arm_dir, source, info, build_log,
                                           source_sha256=sha256_file(source_path), root=root)
    else:
        body = pb_build.build_arm(arm, arm_dir, source, info, Path(root) / cache_dir, build_log,
                                  source_sha256=sha256_file(source_path), root=root)
    write_artifact(build_path, "build", body)


def _engine(arm_dir: str, build: dict, plan: dict, server_cfg: dict, arm_cfg: dict, root: str):
    """A non-embedded arm's ``engines.ArmEngine`` (None for the embedded engine). Checks opt-in first:
    nothing external is launched or contacted without ``allow_external: true``."""
    if arm_cfg.get("engine", "embedded") == "embedded":
        return None
    engines.plan_opt_in(plan)
    model = pb_build.model_arg(build, root)
    arm = {**arm_cfg, "threads": arm_cfg.get("threads") or server_cfg["threads"]}
    return engines.arm_adapter(arm, model=model, model_path=model, ctx=plan["max_context"], src_dir=arm_dir,
                               repo_root=root)


def _threads(server_cfg: dict, arm_cfg: dict):
    return arm_cfg.get("threads") or server_cfg["threads"]


def _server(arm_dir: str, build: dict, plan: dict, server_cfg: dict, arm_cfg: dict, server_log: str, root: str,
            engine=None) -> Server:
    return Server(arm_dir, pb_build.model_arg(build, root), plan["max_context"], server_log,
                  threads=_threads(server_cfg, arm_cfg), extra_args=arm_cfg["args"], env=arm_cfg["env"],
                  startup_timeout_s=server_cfg["startup_timeout_s"], stop_timeout_s=server_cfg["stop_timeout_s"],
                  launch=engine.launch if engine else None)


def _tokenizer(srv: Server, engine):
    """messages -> the server's own token ids, in that engine's dialect."""
    if engine is None:
        return lambda m: tokenize_messages(srv.url, m)
    return lambda m: engine.tokenize(http(), srv.url, m)


def fixtures_stage(fixture_paths: list[str], prompt_paths: list[str], plan_path: str, build_paths: list[str],
                   arms: list[str], arm_dirs: list[str], server_cfg: dict, arm_cfgs: dict, server_log: str,
                   root: str) -> None:
    """Fit every length's fixture with the first arm's tokenizer, then re-check with every arm's."""
    plan = read_artifact(plan_path, "plan")
    builds = {arm: read_artifact(p, "build") for arm, p in zip(arms, build_paths)}
    inputs = {"plan": sha256_file(plan_path), **{f"build.{a}": sha256_file(p) for a, p in zip(arms, build_paths)}}
    # The first arm's server fits every fixture; each other arm's server then re-tokenizes the
    # finished messages and must agree token for token. One server at a time.
    results = {}
    first = arms[0]
    eng = _engine(arm_dirs[0], builds[first], plan, server_cfg, arm_cfgs[first], root)
    with _server(arm_dirs[0], builds[first], plan, server_cfg, arm_cfgs[first], server_log, root, eng) as srv:
        for length in plan["lengths"]:
            results[length] = pb_fixtures.build_fixture(length, plan["output_tokens"], plan["seed"], plan["salts"],
                                                        first, _tokenizer(srv, eng))
            log.info("fixture %d: fitted %d round(s) with %s's tokenizer", length, plan["rounds"], first)
    for arm, arm_dir in zip(arms[1:], arm_dirs[1:]):
        eng = _engine(arm_dir, builds[arm], plan, server_cfg, arm_cfgs[arm], root)
        with _server(arm_dir, builds[arm], plan, server_cfg, arm_cfgs[arm], server_log, root, eng) as srv:
            for length in plan["lengths"]:
                pb_fixtures.check_tokenizer(*results[length], arm, _tokenizer(srv, eng))
                log.info("fixture %d: %s agrees token for token", length, arm)
    for length, fpath, ppath in zip(plan["lengths"], fixture_paths, prompt_paths):
        fixture, prompts = results[length]
        prompts["inputs"] = dict(inputs)
        psha = write_artifact(ppath, "prompts", prompts)
        fixture["inputs"] = {**inputs, "prompts": psha}
        write_artifact(fpath, "fixture", fixture)


def warmup_stage(warmup_path: str, plan_path: str, build_path: str, arm: str, arm_dir: str, arm_cfg: dict,
                 server_cfg: dict, server_log: str, root: str) -> None:
    plan = read_artifact(plan_path, "plan")
    build = read_artifact(build_path, "build")
    engine = _engine(arm_dir, build, plan, server_cfg, arm_cfg, root)
    server_cfg = {**server_cfg, "threads": _threads(server_cfg, arm_cfg)}
    body = pb_measure.run_warmup(arm=arm, arm_dir=Path(arm_dir), model_arg=pb_build.model_arg(build, root),
                                 plan=plan, server_cfg=server_cfg, arm_cfg=arm_cfg, server_log=Path(server_log),
                                 inputs={"plan": sha256_file(plan_path), "build": sha256_file(build_path)},
                                 engine=engine)
    if not body["smoke_ok"]:
        log.warning("warmup of %s: %s", arm, "; ".join(body["problems"]))
    write_artifact(warmup_path, "warmup", body)


def measure_stage(measure_path: str, output_paths: list[str], marker_path: str, plan_path: str, build_path: str,
                  fixture_paths: list[str], prompt_paths: list[str], visit: dict, arm_dir: str, arm_cfg: dict,
                  server_cfg: dict, server_log: str, root: str, attempt: int = 1,
                  pid_path: str | None = None) -> None:
    """One visit. *attempt* is Snakemake's (1 = first); *pid_path* the visits' shared server pid file.

    A watchdog ends the job, after killing its server, if the Snakemake that started it is killed, so
    the orphaned job never goes on measuring beside the rerun (see pairbench.integrity.recovery).
    """
    plan = read_artifact(plan_path, "plan")
    body, outputs, inputs = _measure(plan, plan_path, build_path, fixture_paths, prompt_paths, visit, arm_dir,
                                     arm_cfg, server_cfg, server_log, root, attempt, pid_path, lengths=None)
    for length, path in zip(plan["lengths"], output_paths):
        write_artifact(path, "output", {"visit": visit["id"], "length": length, **outputs[length],
                                        "inputs": {"plan": inputs["plan"]}})
    write_artifact(measure_path, "measure", body)
    # Ordering marker for the next visit (see workflow/rules/common.smk: previous_visit).
    Path(marker_path).parent.mkdir(parents=True, exist_ok=True)
    Path(marker_path).write_text(visit["id"] + "\n")


def measure_retry_stage(measure_path: str, outputs_dir: str, plan_path: str, build_path: str,
                        fixture_paths: list[str], prompt_paths: list[str], previous_measure_path: str,
                        previous_validate_path: str, retry: int, retry_on: list[str], visit: dict, arm_dir: str,
                        arm_cfg: dict, server_cfg: dict, server_log: str, root: str, attempt: int = 1,
                        pid_path: str | None = None) -> None:
    """Validation retry *retry* of one visit: re-measure the lengths whose previous measurement
    (the visit itself, or retry *retry* - 1) was excluded for a kind in *retry_on* (pairbench.validate.retries).

    Writes ``measure/<visit>.retry<N>.json`` (with ``retry`` and ``retry_reasons``) and one private
    output per re-measured length under *outputs_dir*; the previous artifacts are only read.
    """
    from pairbench.validate import retries

    plan = read_artifact(plan_path, "plan")
    previous = read_artifact(previous_measure_path, "measure")
    validation = read_artifact(previous_validate_path, "validate")
    if previous["visit"]["id"] != visit["id"] or retries.retry_number(previous) != retry - 1:
        raise ValueError(f"{previous_measure_path}: not retry {retry - 1} of visit {visit['id']}")
    if retries.validation_key(validation) != (visit["id"], retry - 1):
        raise ValueError(f"{previous_validate_path}: not the validation of retry {retry - 1} of visit {visit['id']}")
    reasons = retries.retry_reasons(validation, retry_on)
    if not reasons:
        raise ValueError(f"{visit['id']} retry {retry}: {previous_validate_path} excludes no record for "
                         f"{', '.join(retry_on)}; there is nothing to retry")
    log.info("%s retry %d: re-measuring length(s) %s: %s", visit["id"], retry, ", ".join(map(str, sorted(reasons))),
             " | ".join(f"{n}: {why['reason']}" for n, why in sorted(reasons.items())))
    body, outputs, inputs = _measure(plan, plan_path, build_path, fixture_paths, prompt_paths, visit, arm_dir,
                                     arm_cfg, server_cfg, server_log, root, attempt, pid_path,
                                     lengths=sorted(reasons))
    body["retry"] = retry
    body["retry_reasons"] = [{"length": n, "reason": why["reason"][:1000], "kinds": why["kinds"]}
                             for n, why in sorted(reasons.items())]
    body["inputs"].update({"previous_measure": sha256_file(previous_measure_path),
                           "previous_validate": sha256_file(previous_validate_path)})
    out = Path(outputs_dir)
    out.mkdir(parents=True, exist_ok=True)
    for length in sorted(reasons):
        write_artifact(out / f"{length}.json", "output", {"visit": visit["id"], "length": length, **outputs[length],
                                                          "retry": retry, "inputs": {"plan": inputs["plan"]}})
    write_artifact(measure_path, "measure", body)


def _measure(plan: dict, plan_path: str, build_path: str, fixture_paths: list[str], prompt_paths: list[str],
             visit: dict, arm_dir: str, arm_cfg: dict, server_cfg: dict, server_log: str, root: str, attempt: int,
             pid_path: str | None, lengths: list[int] | None) -> tuple[dict, dict, dict]:
    """Launch, measure *lengths* (None: all) of *visit* under the orphan watchdog: (body, outputs, inputs)."""
    from pairbench.integrity import recovery

    build = read_artifact(build_path, "build")
    fixtures = {f["length"]: f for f in (read_artifact(p, "fixture") for p in fixture_paths)}
    prompts = {p["length"]: p for p in (read_artifact(p, "prompts") for p in prompt_paths)}
    inputs = {"plan": sha256_file(plan_path), "build": sha256_file(build_path),
              **{f"fixture.{n}": sha256_file(p) for n, p in zip(plan["lengths"], fixture_paths)}}
    engine = _engine(arm_dir, build, plan, server_cfg, arm_cfg, root)
    server_cfg = {**server_cfg, "threads": _threads(server_cfg, arm_cfg)}
    orphaned = (lambda: recovery.kill_stale(pid_path)) if pid_path else (lambda: None)
    with recovery.SnakemakeWatchdog(orphaned):
        body, outputs = pb_measure.run_visit(
            visit=visit, arm_dir=Path(arm_dir), model_arg=pb_build.model_arg(build, root), plan=plan,
            prompts=prompts, fixtures=fixtures, server_cfg=server_cfg, arm_cfg=arm_cfg,
            server_log=Path(server_log), inputs=inputs, attempt=attempt,
            pid_path=Path(pid_path) if pid_path else None, engine=engine, lengths=lengths)
    for rec in body["records"]:
        if not rec["ok"]:
            log.warning("%s length %d flagged: %s", visit["id"], rec["length"], "; ".join(rec["flags"]))
    return body, outputs, inputs


def validate_stage(validate_path: str, measure_path: str, output_paths: list[str], fixture_paths: list[str],
                   baseline_output_paths: list[str], cases: list[str], options: dict) -> None:
    """Run the configured functional cases on every steady record of one visit, or of one of its
    validation retries (*output_paths* may name a retry's outputs folder)."""
    from pairbench.validate import retries
    from pairbench.validate import cases as pb_validate

    measure = read_artifact(measure_path, "measure")
    output_paths = [str(f) for p in output_paths
                    for f in (sorted(Path(p).glob("*.json")) if Path(p).is_dir() else [p])]
    inputs = {"measure": sha256_file(measure_path)}

    def load(paths: list[str], kind: str, role: str) -> dict[int, dict]:
        out = {}
        for p in paths:
            body = read_artifact(p, kind)
            out[body["length"]] = body
            inputs[f"{role}.{body['length']}"] = sha256_file(p)
        return out

    fixtures = load(fixture_paths, "fixture", "fixture")
    outputs = load(output_paths, "output", "output")
    base_outputs = load(baseline_output_paths, "output", "baseline_output")
    records = []
    for rec in measure["records"]:
        n = rec["length"]
        fx = fixtures[n]
        out = {"text": outputs[n]["text"], "token_ids": outputs[n]["token_ids"]}
        base = base_outputs.get(n)
        verdicts = pb_validate.run_cases(
            cases, record=rec, output=out,
            fixture={"length": n, "output_tokens": fx["output_tokens"], "task": fx["task"]},
            baseline_output={"text": base["text"], "token_ids": base["token_ids"]} if base else None,
            options=options)
        # A failed request has no output hash in its record; its (empty) private output has one.
        entry = pb_validate.record_entry({**rec, "output_sha256": pb_validate.sha256_text(out["text"])}, fx, verdicts)
        entry.update({"ok": rec["ok"], "flags": list(rec["flags"])})  # retries are decided from this artifact
        records.append(entry)
        selected = entry["selected"]
        if not selected:
            log.warning("%s length %d not selected: %s", measure["visit"]["id"], n,
                        "; ".join(records[-1]["excluded_because"]))
    retry = retries.retry_number(measure)
    retire_later_retries(Path(validate_path).parent.parent, measure["visit"]["id"], retry)
    write_artifact(validate_path, "validate", {
        "round": measure["visit"]["round"], "arm": measure["visit"]["arm"], "attempt": measure["attempt"],
        **({"retry": retry} if retry else {}),
        "cases": list(cases), "options": options, "records": records, "inputs": inputs})


def retire_later_retries(res_dir: str | Path, visit_id: str, retry: int) -> None:
    """Move the visit's retries after *retry* to ``private/superseded/``: they no longer belong to the run.

    Called by the validate stage before it validates anew (they were made from the validation being
    redone; if it still earns retries, the pipeline makes them again from the new one) and by the
    stats stage for retries beyond a visit's chain (``validate.retries`` or ``retry_on`` narrowed).
    Moving (never deleting) keeps what was measured, out of the run.
    """
    import shutil
    import time

    from pairbench.validate import retries

    res = Path(res_dir)
    stale = retries.later_retries(res, visit_id, retry)
    if not stale:
        return
    dest = res / "private" / "superseded" / time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    for path in stale:
        target = dest / path.relative_to(res)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        log.warning("%s: no longer part of the run (its validation was redone, or the config asks for fewer "
                    "retries); moved to %s", path, target)


def stats_stage(summary_path: str, measurements_csv: str, summary_csv: str, paired_csv: str, ratios_csv: str,
                timing_csv: str, plan_path: str, measure_paths: list[str], validate_paths: list[str],
                stats_cfg: dict) -> None:
    """measurements.csv from the visits and their verdicts, then the summary and its flat tables."""
    from pairbench.validate import retries
    from pairbench.analysis import stats as pb_stats
    from pairbench.analysis import tables

    plan = read_artifact(plan_path, "plan")
    measures = [read_artifact(p, "measure") for p in measure_paths]
    validations = _validations(validate_paths)
    chain_end: dict[str, int] = {}
    for m in measures:
        vid, n = retries.measure_key(m)
        chain_end[vid] = max(chain_end.get(vid, 0), n)
    for v in plan["visits"]:  # retries on disk that the config no longer asks for
        retire_later_retries(Path(summary_path).parent.parent, v["id"], chain_end.get(v["id"], 0))
    df = tables.measurements_frame(measures, validations)
    from pairbench.core.artifacts import atomic_write_text

    atomic_write_text(measurements_csv, df.to_csv(index=False))
    summary = pb_stats.summarize(df, baseline=plan["baseline"], candidate=plan["candidate"],
                                 metrics=stats_cfg["metrics"], trim=stats_cfg["trim"], alpha=stats_cfg["alpha"],
                                 noise=stats_cfg["noise"], seed=plan["seed"])
    summary["inputs"] = {"plan": sha256_file(plan_path),
                         **{f"measure.{retries.label(*retries.measure_key(m))}": sha256_file(p)
                            for m, p in zip(measures, measure_paths)},
                         **{f"validate.{retries.label(*key)}": sha256_file(p) for key, p in zip(validations, validate_paths)}}
    write_artifact(summary_path, "summary", summary)
    flat = pb_stats.summary_tables(summary)
    atomic_write_text(summary_csv, flat["summary"].to_csv(index=False))
    atomic_write_text(paired_csv, flat["paired"].to_csv(index=False))
    atomic_write_text(ratios_csv, flat["ratios"].to_csv(index=False))
    atomic_write_text(timing_csv, tables.timing_agreement(df).to_csv(index=False))


def _validations(paths: list[str]) -> dict[tuple[str, int], dict]:
    """Validate artifacts by (visit id, retry), in *paths* order."""
    from pairbench.validate.retries import validation_key

    out = {}
    for p in paths:
        v = read_artifact(p, "validate")
        out[validation_key(v)] = v
    return out


def plots_stage(ratios_png: str, drift_png: str, summary_path: str, measurements_csv: str) -> None:
    import pandas as pd

    from pairbench.analysis import plots

    summary = read_artifact(summary_path, "summary")
    plots.plot_ratios(summary, ratios_png)
    plots.plot_drift(pd.read_csv(measurements_csv), drift_png)


def publish_stage(*, publish_dir: str, private_dir: str, plan_path: str, source_paths: list[str],
                  build_paths: list[str], fixture_paths: list[str], prompt_paths: list[str], warmup_paths: list[str],
                  measure_paths: list[str], validate_paths: list[str], summary_path: str, tables: dict[str, str],
                  plots: dict[str, str], res_dir: str, root: str) -> None:
    """The report and the allowlisted, scrubbed, leak-gated bundle (pairbench.publish.bundle.build_bundle)."""
    import pandas as pd
    import yaml

    from pairbench.publish import envfacts
    from pairbench.publish import bundle as publish
    from pairbench.publish import report
    from pairbench.analysis import stats as pb_stats
    from pairbench.analysis import tables as pb_tables
    plan = read_artifact(plan_path, "plan")
    sources = {s["arm"]: s for s in (read_artifact(p, "source") for p in source_paths)}
    builds = {b["arm"]: b for b in (read_artifact(p, "build") for p in build_paths)}
    fixtures = {f["length"]: f for f in (read_artifact(p, "fixture") for p in fixture_paths)}
    prompts = {p["length"]: p for p in (read_artifact(p, "prompts") for p in prompt_paths)}
    warmups = {w["arm"]: w for w in (read_artifact(p, "warmup") for p in warmup_paths)}
    measures = [read_artifact(p, "measure") for p in measure_paths]
    validations = _validations(validate_paths)
    summary = read_artifact(summary_path, "summary")
    df = pd.read_csv(tables["measurements"])
    agreement = pb_tables.timing_agreement(df)

    facts = envfacts.collect(engine_version=builds[plan["baseline"]]["native_version"])
    identifiers = envfacts.identifiers(facts)
    # Absolute paths of this checkout are private too (they name users and machines).
    identifiers.setdefault("path", [])
    identifiers["path"] = sorted({*identifiers["path"], str(Path(root).resolve())})
    env_path = Path(private_dir) / "environment.json"
    write_artifact(env_path, "environment", envfacts.public(facts, inputs={"plan": sha256_file(plan_path)}))
    first_round = min(int(r) for r in plan["salts"])
    fx_manifest = publish.fixture_manifest(
        [{"length": n, "messages": next(r for r in prompts[n]["rounds"] if r["round"] == first_round)["messages"],
          "prompt_tokens": fixtures[n]["length"]} for n in sorted(prompts)],
        inputs={f"fixture.{n}": sha256_file(p) for n, p in zip(sorted(fixtures), fixture_paths)})
    fx_path = Path(private_dir) / "fixtures.json"
    write_artifact(fx_path, "fixture_manifest", fx_manifest)
    files = {
        "environment.json": str(env_path),
        "fixtures.json": str(fx_path),
        "config.resolved.yaml": yaml.safe_dump({k: v for k, v in plan.items() if k not in ("visits", "inputs", "schema")},
                                               sort_keys=True, default_style="\"").encode(),  # quoted: digests read as digests
        **{f"tables/{name}.csv": path for name, path in tables.items()},
        **{f"plots/{name}.png": path for name, path in plots.items()},
    }
    # stats/summary.json itself is not bundled: its free-text fields (reasons, method names) fail
    # publish's field check. Its numbers are in tables/*.csv and its words in README.md.
    cand = plan["candidate"]
    patches = {Path(p["path"]).name: str(Path(root) / p["path"]) for p in sources[cand]["patches"]}
    base_src = sources[plan["baseline"]]
    clean_source, patched = None, None
    if patches and not base_src["patches"] and base_src["source"] == sources[cand]["source"]:
        clean_source = Path(res_dir) / "src" / plan["baseline"]
        tree = Path(res_dir) / "src" / cand
        patched = {f"engine/{rel}": sha256_file(tree / "engine" / rel)
                   for rel in sources[cand]["patched"]["changed"] if (tree / "engine" / rel).is_file()}
    listing = [*files, *(f"patches/{n}" for n in patches), "README.md"]
    files["README.md"] = report.render(
        plan=plan, sources=sources, builds=builds, fixtures=fixtures, warmups=warmups, measures=measures,
        validations=validations, df=df, agreement=agreement, stats_markdown=pb_stats.report_markdown(summary),
        files=listing).encode()
    result = publish.build_bundle(publish_dir, files, identifiers=identifiers, private_dir=Path(private_dir) / "publish",
                                  patches=patches, clean_source=clean_source, patched_files=patched,
                                  patch_roots=[str(Path(root).resolve())])
    log.info("published %s: %s (excluded by the allowlist: %s)", publish_dir, result["report_line"],
             ", ".join(result["excluded"]) or "nothing")
