"""The whole pipeline through the ``snakemake`` CLI, in a temporary copy of the repository.

- tests/config/tiny.yaml (the embedded engine's tiny model, 2 short lengths, 2 rounds) runs end to
  end; every JSON artifact under results/<label>/ validates against its schema, and the bundle
  verifies offline;
- a second dry run has nothing to do;
- deleting one visit's artifact and rerunning redoes only that visit and what depends on it,
  leaving every other visit's files byte-identical (and untouched);
- invalid configs and a non-applying patch fail with errors that name the key / the patch and hunk;
- with the fake engine misbehaving per arm, each gate fires, and flagged records are kept,
  excluded from the statistics and listed in the report;
- an output whose tests never finish times the validator out, and the visit earns a validation
  retry: its own jobs and artifacts, the original kept and superseded, the retry in the report.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest

from pairbench.core.artifacts import parse_schema_id, read_artifact, sha256_file
from pairbench.publish.verify import verify_bundle

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def copy_repo(dest: Path) -> Path:
    """Tracked and untracked-but-not-ignored files of this checkout (never results/, resources/)."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split("\0")
    for rel in filter(None, files):
        if rel.split("/")[0] in ("resources", "results", "logs", ".snakemake"):
            continue
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def snakemake(work: Path, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=work, capture_output=True, text=True,
                          env={**os.environ, **(env or {})})
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n"
                             f"{proc.stderr[-8000:]}")
    return proc


# pairbench.publish.bundle.build_bundle keeps its own leak-gate result and pseudonym map here, and each
# visit its node's facts in private/hosts/, as plain JSON without a schema id (they never leave private/).
NOT_ARTIFACTS = ("private/publish/leakgate.json", "private/publish/pseudonyms.json", "private/hosts/")


def json_artifacts(res: Path) -> list[Path]:
    return sorted(p for p in res.rglob("*.json")
                  if not p.relative_to(res).as_posix().startswith(("src/", *NOT_ARTIFACTS)))


def finished_run(tmp_path_factory, folder: str, configfile: str) -> Path:
    """A copy of the repository in which *configfile* has run to the end."""
    work = copy_repo(tmp_path_factory.mktemp(folder))
    snakemake(work, "--cores", "2", "--configfile", configfile)
    return work


def visit_spans(res: Path) -> list[list[float]]:
    """[start, end] of every visit in the plan's order, from its artifact's mtime and duration."""
    spans = []
    for v in read_artifact(res / "plan.json", "plan")["visits"]:
        m = res / "measure" / f"{v['id']}.json"
        spans.append([m.stat().st_mtime - read_artifact(m, "measure")["duration_s"], m.stat().st_mtime])
    return spans


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    work = finished_run(tmp_path_factory, "repo", "tests/config/tiny.yaml")
    # the visits' spans as this run measured them, kept before any test redoes a visit
    (work / "first-run-spans.json").write_text(json.dumps(visit_spans(work / "results" / "tiny")))
    return work


def test_every_artifact_validates_and_the_bundle_verifies(tiny_run):
    res = tiny_run / "results" / "tiny"
    found = json_artifacts(res)
    kinds = set()
    for path in found:
        data = json.loads(path.read_text())
        assert "schema" in data, f"{path} carries no schema id"
        kind, version = parse_schema_id(data["schema"])
        read_artifact(path, kind)  # raises, naming the field, if it fails its schema
        kinds.add(kind)
    assert {"plan", "source", "build", "fixture", "prompts", "warmup", "measure", "output", "validate", "summary",
            "manifest", "environment", "fixture_manifest"} <= kinds
    assert verify_bundle(res / "publish") == []
    # environment.json describes the node that measured (the first visit's), not the one that published
    env = read_artifact(res / "private" / "environment.json", "environment")
    assert env["inputs"]["host"] == sha256_file(res / "private" / "hosts" / "r01-baseline.json")
    for name in ("measurements", "summary"):
        assert (res / "tables" / f"{name}.csv").is_file()
    readme = (res / "publish" / "README.md").read_text()
    assert "0 findings by" in readme and "## Statistics" in readme
    # the visits ran one at a time, in the plan's order, even with --cores 2 (as first measured: a
    # test may have redone one since)
    spans = json.loads((tiny_run / "first-run-spans.json").read_text())
    assert len(spans) == 4 and all(a[1] <= b[0] + 0.5 for a, b in zip(spans, spans[1:])), spans


def test_second_dry_run_has_nothing_to_do(tiny_run):
    out = snakemake(tiny_run, "-n", "--configfile", "tests/config/tiny.yaml")
    assert "Nothing to be done" in out.stdout + out.stderr


def test_deleting_one_visit_redoes_only_it_and_its_dependents(tiny_run):
    res = tiny_run / "results" / "tiny"
    before = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in json_artifacts(res)}
    victim = res / "measure" / "r01-candidate.json"
    victim.unlink()
    snakemake(tiny_run, "--cores", "1", "--configfile", "tests/config/tiny.yaml")
    assert victim.is_file()
    redone = {res / "measure" / "r01-candidate.json", res / "validate" / "r01-candidate.json",
              res / "stats" / "summary.json", res / "provenance.json", res / "audit.json",
              res / "private" / "retired.json",  # it records the chains it read (nothing was retired)
              *(res / "private" / "outputs").glob("r01-candidate-*.json")}
    for path, (data, mtime) in before.items():
        rel = path.relative_to(res).as_posix()
        # the bundle and what publish writes for it (environment, fixtures, stats_params, the gate's
        # decision over the new summary) are rebuilt
        if path in redone or rel.startswith(("publish/", "private/publish/", "private/environment",
                                             "private/fixtures", "private/stats_params", "private/gate")):
            continue
        assert path.read_bytes() == data and path.stat().st_mtime_ns == mtime, f"{rel} was redone"
    assert res.joinpath("validate/r01-candidate.json").stat().st_mtime > victim.stat().st_mtime - 1e-3


def test_the_cost_channel_on_a_finished_run_counts_every_arm_and_reports_beside_wall_time(tiny_run):
    """cost.enabled added to a finished run: the cost jobs and what reads them run, no visit does; each
    arm is counted under callgrind, and the report shows each cost verdict beside the wall-clock one.
    After the other tests of tiny_run (the config it leaves differs from tests/config/tiny.yaml)."""
    if shutil.which("valgrind") is None:
        pytest.skip("valgrind is not installed (./install.sh --test)")
    res = tiny_run / "results" / "tiny"
    visits = {p: p.stat().st_mtime_ns for p in (res / "measure").glob("*.json")}
    cost_cfg = "cost: {enabled: true, conditions: [in400-out8], decode_tokens: 2}\n"
    (tiny_run / "tests/config/tiny-cost.yaml").write_text((tiny_run / "tests/config/tiny.yaml").read_text() + cost_cfg)
    snakemake(tiny_run, "--cores", "2", "--configfile", "tests/config/tiny-cost.yaml")
    assert {p: p.stat().st_mtime_ns for p in visits} == visits
    for arm in ("baseline", "candidate"):
        body = read_artifact(res / "cost" / f"{arm}.json", "cost")
        assert (body["status"], [(r["condition"], r["phase"]) for r in body["rows"]]) == ("counted", [("in400-out8", "decode")])
        assert body["facts"]["torch_threads"] == 1 and body["rows"][0]["tokens"] == 2
    summary = read_artifact(res / "stats" / "summary.json", "summary")
    wall = summary["comparisons"]["candidate"]["paired"]["in400-out8"]["decode_tok_s"]["verdict"]
    rows = read_artifact(res / "stats" / "cost.json", "cost_summary")["rows"]
    assert sorted((r["metric"], r["wall_verdict"]) for r in rows) == [("decode_cycles_per_tok", wall),
                                                                     ("decode_instructions_per_tok", wall)]
    readme = (res / "publish" / "README.md").read_text()
    assert "## Cost channel" in readme and f"`decode_tok_s` {wall}" in readme
    assert not (res / "private" / "cost").exists()  # the job's scratch is gone with the job
    # verify recomputes stats/cost.json from the run folder; the gate shows the cost cells, ungated
    from pairbench.integrity.gate import check_run

    assert verify_bundle(res / "publish", run_dir=res) == []
    result = check_run(res)
    assert result.published and {(c["metric"], c["gated"]) for c in result.record["cost"]["cells"]} == \
        {("decode_cycles_per_tok", False), ("decode_instructions_per_tok", False)}
    # a count changed after the verdicts were made: verify names the file and the field, the gate is invalid
    victim = res / "cost" / "candidate.json"
    original = victim.read_bytes()
    body = json.loads(original)
    body["rows"][0]["metrics"] = {m: v * 2 for m, v in body["rows"][0]["metrics"].items()}
    victim.write_text(json.dumps(body))
    try:
        problems = verify_bundle(res / "publish", run_dir=res)
        assert problems[0].startswith("cost/candidate.json: its sha256 is not the one stats/cost.json was computed from")
        assert any(p.startswith("stats/cost.json: rows[") and ".candidate_per_tok is " in p for p in problems)
        tampered = check_run(res)
        assert tampered.exit_code == 3 and "cost/candidate.json: its sha256" in tampered.reason
    finally:
        victim.write_bytes(original)


BAD_CONFIGS = {
    "unknown key": ("colour: blue\n", "config key 'colour': unknown key"),
    "wrong type": ("rounds: two\n", "config key 'rounds': 'two' is not of type 'integer' or 'object'"),
    "adaptive without a target": ("rounds: {min: 4, max: 8}\n", "config key 'rounds': 'target_halfwidth' is a required property"),
    "same question twice": ("stats: {metrics: [prefill_tok_s, ttft_ms]}\n",
                            "stats.metrics: prefill_tok_s and ttft_ms answer the same question (prefill)"),
    "zero rounds": ("rounds: 0\n", "config key 'rounds': 0 is less than the minimum of 1"),
    "above context": ("lengths: [400, 9000]\n", "lengths[1]: 9000 input + 8 output tokens"),
    "missing patch": ("arms:\n  baseline: {}\n  candidate: {patches: [config/patches/missing.patch]}\n",
                      "arms.candidate.patches[0]: patch file config/patches/missing.patch does not exist"),
    "one arm": ("arms:\n  baseline: {}\n", "a paired benchmark needs at least two arms, got 1"),
    "a candidate twice": ("candidates: [candidate, candidate]\n", "candidates[1]: 'candidate' is listed twice"),
    "williams block": ("arms: {a: {}, b: {}, c: {}}\norder: williams\nrounds: {min: 3, max: 6, target_halfwidth: 0.02}\n",
                       "rounds.min: 3 is not a multiple of 6, the counterbalanced block of order 'williams'"),
}


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return copy_repo(tmp_path_factory.mktemp("scratch"))


def tiny_with(override: str) -> str:
    import yaml

    cfg = yaml.safe_load((REPO / "tests/config/tiny.yaml").read_text())
    cfg.update(yaml.safe_load(override))
    return yaml.safe_dump(cfg)


def results_tree(work: Path) -> dict[str, int]:
    """{path: mtime_ns} of everything under results/ (empty when there is none)."""
    return {p.relative_to(work).as_posix(): p.stat().st_mtime_ns for p in (work / "results").rglob("*")}


@pytest.mark.parametrize("case", sorted(BAD_CONFIGS))
def test_invalid_config_fails_before_any_job_naming_the_key(scratch, case):
    override, message = BAD_CONFIGS[case]
    cfg = scratch / f"bad-{case.replace(' ', '-')}.yaml"
    cfg.write_text(tiny_with(override))
    before = results_tree(scratch)  # scratch is shared: other tests' runs may have left results
    proc = snakemake(scratch, "-n", "--configfile", str(cfg), check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, proc.stderr[-3000:]
    assert results_tree(scratch) == before, "no job may run, nothing may be written, for an invalid config"


# What a new user gets wrong first, as written (lines matter: each message names its file and line).
# Each gets exactly one message, naming the culprit, and no traceback. (yaml text, extra args, the line)
TINY_HEAD = "label: newcomer\nmodel: tiny\n"
NEWCOMER_CONFIGS = {
    "a typo in a key": (TINY_HEAD + "arms:\n  baseline: {}\n  candidate: {}\nround: 4\n", [],
                        "{cfg}:6: config key 'round': unknown key (allowed: allow_external, arms, baseline, "),
    "a patch path that is not there": (
        TINY_HEAD + "arms:\n  baseline: {}\n  candidate:\n    patches: [my-fix.patch]\n", [],
        "{cfg}:6: arms.candidate.patches[0]: patch file my-fix.patch does not exist"),
    "one arm": (TINY_HEAD + "arms:\n  baseline: {}\n", [],
                "{cfg}:3: config key 'arms': a paired benchmark needs at least two arms, got 1 (baseline)"),
    "no arms at all": (TINY_HEAD + "lengths: [400]\n", [],
                       "{cfg}: config key 'arms': missing; it has no default (the arms to compare, e.g. arms: "
                       "{{baseline: {{}}, candidate: {{patches: [my.patch]}}}})"),
    "a length beyond the model's context": (
        TINY_HEAD + "arms: {baseline: {}, candidate: {}}\nlengths:\n  - 400\n  - 9000\n", [],
        "{cfg}:6: lengths[1]: 9000 input + 64 output tokens (+16 margin) exceed the context of model 'tiny' (8192)"),
    "an engine that does not exist": (
        TINY_HEAD + "arms:\n  baseline: {}\n  candidate: {engine: llamacpp}\n", [],
        "{cfg}:5: arms.candidate.engine: engine: no profile 'llamacpp' (looked for "),
    "a list on the command line, unquoted": (
        TINY_HEAD + "arms: {baseline: {}, candidate: {}}\n", ["--config", "lengths=400,480"],
        "--config lengths: config key 'lengths': '400,480' is not of type 'array' (write a list as --config "
        "\"lengths=[256, 1024]\", quoted)"),
}


@pytest.mark.parametrize("case", sorted(NEWCOMER_CONFIGS))
def test_a_newcomers_broken_config_gets_one_message_at_its_line(scratch, case):
    text, extra, line = NEWCOMER_CONFIGS[case]
    cfg = scratch / f"newcomer-{case.replace(' ', '-').replace(',', '')}.yaml"
    cfg.write_text(text)
    before = results_tree(scratch)  # the shared scratch folder may hold other tests' runs
    proc = snakemake(scratch, "-n", "--configfile", str(cfg), *extra, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    # the file as given, relative to the working directory (the scratch copy) where it lies below it
    assert "pairbench: 1 config error (nothing was run):\n  " + line.format(cfg=cfg.name) in out, out[-3000:]
    assert "Traceback" not in out and 'File "' not in out, out[-3000:]
    assert results_tree(scratch) == before, "no job may run for an invalid config"


def test_a_yaml_syntax_error_in_the_default_config_names_its_line(tmp_path):
    work = copy_repo(tmp_path)
    default = work / "config" / "config.yaml"
    default.write_text(default.read_text().replace("lengths: [256, 1024]", "lengths: [256, 1024"))
    proc = snakemake(work, "-n", check=False)
    assert proc.returncode != 0
    assert ("config/config.yaml:9:14: YAML syntax error: expected ',' or ']', but got ':' (while parsing a flow "
            "sequence opened at line 8, column 10)") in proc.stderr, proc.stderr[-3000:]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_config_lists_and_maps_on_the_command_line_and_every_error_at_once(scratch):
    proc = snakemake(scratch, "-n", "--configfile", "tests/config/tiny.yaml", "--config", "lengths=[400, 512]",
                     "rounds={min: 2, max: 4, target_halfwidth: 0.05}", "label=cli")
    assert ("  conditions (2): in400-out8, in512-out8; model tiny\n"
            "  rounds: 2, then blocks of 2 until every primary interval is within +-5%, at most 4 (order abba)\n"
            ) in proc.stdout
    cfg = scratch / "many-errors.yaml"
    cfg.write_text("label: many\nmodel: tiny\ncolour: blue\narms:\n  baseline: {}\n"
                   "  candidate: {patches: [nope.patch]}\nrounds: 0\n")
    proc = snakemake(scratch, "-n", "--configfile", str(cfg), "--config", "lengths=[400, 9000]", check=False)
    err = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "pairbench: 4 config errors (nothing was run):" in err, err[-3000:]
    listed = err.split("pairbench: 4 config errors (nothing was run):\n", 1)[1].splitlines()[:4]
    assert [line.split(": ", 2)[:2] for line in listed] == [
        [f"  {cfg.name}:3", "config key 'colour'"], [f"  {cfg.name}:6", "arms.candidate.patches[0]"],
        [f"  {cfg.name}:7", "config key 'rounds'"], ["  --config lengths", "lengths[1]"]]


def test_a_configfile_replaces_the_default_and_says_nothing_else(scratch):
    proc = snakemake(scratch, "-n", "--configfile", "tests/config/tiny.yaml")
    out = proc.stdout + proc.stderr
    assert "is extended by additional config" not in out
    assert "pairbench plan 'tiny' -> results/tiny/ (config: tests/config/tiny.yaml)" in out


def test_non_applying_patch_names_the_patch_and_hunk(scratch):
    (scratch / "stale.patch").write_text(textwrap.dedent("""\
        --- a/engine/VERSION
        +++ b/engine/VERSION
        @@ -1 +1 @@
        -0.0.0-not-this-version
        +0.0.1
        """))
    cfg = scratch / "stale.yaml"
    cfg.write_text(tiny_with("label: stale\narms:\n  baseline: {}\n  candidate: {patches: [stale.patch]}\n"))
    proc = snakemake(scratch, "results/stale/source/candidate.json", "--cores", "1", "--configfile", str(cfg),
                     check=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert ("arms.candidate.patches[0]: patch stale.patch does not apply: first failure at engine/VERSION "
            "(hunk at line 1)") in out, out[-3000:]
    assert not (scratch / "results/stale/src/candidate").exists()


GATES_CONFIG = """\
label: gates
model: tiny
arms:
  baseline: {source: tests/fakes/engine}
  prompt: {source: tests/fakes/engine, args: [--prompt-extra, "1"]}
  completion: {source: tests/fakes/engine, env: {FAKE_ENGINE_COMPLETION_SHORT: "2"}}
  cache: {source: tests/fakes/engine, args: [--report-cached, "7"]}
baseline: baseline
candidate: cache
lengths: [400, 480]
output_tokens: 8
rounds: 2
seed: 0
# gate failures alone earn a retry: only the cache arm's (the others also fail token_counts)
validate: {cases: [token_counts], retries: 1, retry_on: [gate]}
"""


def test_each_gate_fires_and_flagged_records_are_kept_and_disclosed(scratch):
    cfg = scratch / "gates.yaml"
    cfg.write_text(GATES_CONFIG)
    snakemake(scratch, "--cores", "1", "--configfile", str(cfg))
    res = scratch / "results" / "gates"
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert len(df) == 4 * 2 * 2 + 2 * 2, "every record is kept, the cache arm's retried records too"
    latest = df[~df["reason"].fillna("").str.startswith("superseded")]
    by_arm = {arm: g for arm, g in latest.groupby("arm")}
    assert by_arm["baseline"]["selected"].all()
    for arm, gate in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"), ("cache", "cold_cache")):
        g = by_arm[arm]
        assert len(g) == 4 and not g["ok"].any() and not g["selected"].any()
        assert g["reason"].str.match(rf"gate [a-z_ ]*\b{gate}\b").all(), g["reason"].tolist()
    flags = [f for p in sorted((res / "measure").glob("*-cache*.json")) for r in read_artifact(p, "measure")["records"]
             for f in r["flags"]]
    found = [re.fullmatch(r"cold_cache: evaluated (\d+) of (\d+) prompt tokens, 7 cached", f) for f in flags]
    assert len(flags) == 8 and all(m and int(m[2]) - int(m[1]) == 7 for m in found), flags
    # retry_on: [gate] retried the cache arm's records (a gate failure and nothing else), not the
    # others' (their token_counts case failed too); the retry failed the gate again
    assert sorted(p.name for p in (res / "measure").glob("*.retry*")) == ["r01-cache.retry1.json",
                                                                          "r02-cache.retry1.json"]
    readme = (res / "publish" / "README.md").read_text()
    assert "16 failed a gate and are excluded from the statistics" in readme
    assert "prompt_tokens: got 401, planned 400" in readme
    assert "completion_tokens: got 6, planned 8" in readme
    assert "and 2 partial-visit validation retry(ies) (2 gate failure)." in readme
    assert readme.count("(partial visit, gate failure): the visit's own measurement was excluded: gate cold_cache") == 4
    assert readme.count("its new record was excluded too;") == 4
    summary = read_artifact(res / "stats" / "summary.json", "summary")["comparisons"]["cache"]
    assert summary["counts"]["excluded"] >= 4
    # too few clean pairs for any claim: every tested (primary) comparison is inconclusive;
    # secondary metrics are shown, never tested (verdict null), memory has its own family
    primary = [v for by_m in summary["paired"].values() for v in by_m.values() if v["role"] == "primary"]
    assert primary and all(v["verdict"] == "inconclusive" for v in primary), [v["verdict"] for v in primary]


RETRY_CONFIG = """\
label: vretry
model: tiny
arms:
  baseline: {source: tests/fakes/engine, env: {FAKE_ENGINE_OUTPUT_TEXT: &add "def add(a, b):\\n    return a + b\\n\\n# done\\n"}}
  candidate:
    source: tests/fakes/engine
    # the candidate's first 5 steady requests answer with an endless loop: both conditions of its
    # visits r01-candidate and r02-candidate, then r01-candidate's retry 1 at 412
    env: {FAKE_ENGINE_OUTPUT_TEXT: *add, FAKE_ENGINE_ONCE_COUNT: "5",
          FAKE_ENGINE_ONCE_TEXT: "def add(a, b):\\n    while True:\\n        pass\\n"}
baseline: baseline
candidate: candidate
lengths: [412, 452]  # both fixtures ask for add() (pairbench.core.tasks.task_for)
output_tokens: 48
rounds: 2
seed: 0
validate: {cases: [token_counts, done_marker, python_function], timeout_s: 1, retries: 2}
"""


def test_validator_timeout_earns_a_disclosed_partial_visit_retry(scratch):
    cfg = scratch / "vretry.yaml"
    cfg.write_text(RETRY_CONFIG)
    once = scratch / "once-vretry"  # the fake's shared count, outside the config (never published)
    env = {"FAKE_ENGINE_ONCE_FILE": str(once)}
    proc = snakemake(scratch, "--cores", "2", "--configfile", str(cfg), env=env)
    assert once.read_text() == "5", "every endless loop was sent"
    res = scratch / "results" / "vretry"
    log = proc.stdout + proc.stderr
    assert "rule measure_retry:" in log and "checkpoint validate_retry:" in log, "retries are their own jobs"

    def conditions(name):
        return [r["condition"] for r in read_artifact(res / "measure" / name, "measure")["records"]]

    def python_function(name):
        return {r["condition"]: r["verdicts"]["python_function"]["verdict"]
                for r in read_artifact(res / "validate" / name, "validate")["records"]}

    # the originals are kept, untouched; each retry re-measured only what timed out, and a retry
    # that timed out again earned the next (validate.retries: 2)
    original = read_artifact(res / "measure" / "r01-candidate.json", "measure")
    a, b = "in412-out48", "in452-out48"
    assert conditions("r01-candidate.json") == [a, b] and "retry" not in original
    assert python_function("r01-candidate.json") == {a: "timeout", b: "timeout"}
    assert python_function("r02-candidate.json") == {a: "timeout", b: "timeout"}
    assert conditions("r01-candidate.retry1.json") == [a, b]
    assert python_function("r01-candidate.retry1.json") == {a: "timeout", b: "pass"}
    assert conditions("r01-candidate.retry2.json") == [a]
    assert python_function("r01-candidate.retry2.json") == {a: "pass"}
    assert conditions("r02-candidate.retry1.json") == [a, b]
    assert python_function("r02-candidate.retry1.json") == {a: "pass", b: "pass"}
    assert sorted(p.name for p in (res / "measure").glob("*.retry*")) == [
        "r01-candidate.retry1.json", "r01-candidate.retry2.json", "r02-candidate.retry1.json"]
    retry = read_artifact(res / "measure" / "r01-candidate.retry2.json", "measure")
    assert retry["retry"] == 2 and retry["retry_reasons"][0]["condition"] == a
    assert retry["retry_reasons"][0]["reason"].startswith("case python_function timeout:")
    # retries run one at a time, after every visit and validation, in plan order
    jobs = re.findall(r"^\s+output: \S+/measure/(\S+)\.json", log, re.M)
    assert jobs.index("r01-candidate.retry1") > max(jobs.index(v) for v in ("r01-baseline", "r02-baseline"))
    assert jobs.index("r01-candidate.retry1") < jobs.index("r01-candidate.retry2") < jobs.index(
        "r02-candidate.retry1"), jobs

    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert len(df) == 2 * 2 * 2 + 5
    cell = df[(df["round"] == 1) & (df["arm"] == "candidate") & (df["condition"] == a)]
    assert cell[["retry", "selected"]].values.tolist() == [[0, False], [1, False], [2, True]]
    assert cell["reason"].tolist()[:2] == ["superseded by retry 2", "superseded by retry 2"]
    assert df["selected"].sum() == 8, "every (round, arm, condition) has exactly one selected record"
    summary = read_artifact(res / "stats" / "summary.json", "summary")["comparisons"]["candidate"]
    assert sorted((r["round"], r["condition"], r["retry"], r["selected"]) for r in summary["disclosures"]["retries"]) == [
        (1, a, 1, False), (1, a, 2, True), (1, b, 1, True), (2, a, 1, True), (2, b, 1, True)]

    readme = (res / "publish" / "README.md").read_text()
    assert ("Retries: 3 disclosed: 0 engine-fault re-attempt(s) of a measurement job and 3 partial-visit "
            "validation retry(ies) (3 validator timeout).") in readme
    assert "- r01-candidate retry 1, `in412-out48` (partial visit, validator timeout): the visit's own " \
           "measurement was excluded: case python_function timeout:" in readme
    assert "- r01-candidate retry 2, `in412-out48` (partial visit, validator timeout): retry 1 was excluded" in readme
    assert readme.count("its new record passed and is the one used") == 4
    assert readme.count("its new record was excluded too") == 1
    landing = (res / "report" / "landing.rst").read_text()
    assert "- 1\n     - candidate\n     - in412-out48\n     - 1\n     - 2\n     - used" in landing, landing
    assert read_artifact(res / "audit.json", "audit")["ok"]
    assert verify_bundle(res / "publish") == []

    # resumable: nothing left to do, and deleting a retry's artifact redoes that retry alone
    assert "Nothing to be done" in snakemake(scratch, "-n", "--configfile", str(cfg), env=env).stdout
    (res / "measure" / "r02-candidate.retry1.json").unlink()
    dry = snakemake(scratch, "-n", "--configfile", str(cfg), env=env).stdout
    assert "measure_retry" in dry and not re.search(r"^rule measure:", dry, re.M), dry[-3000:]

    # re-measuring the visit itself (its output passes now) retires the retries it no longer
    # needs: moved under private/superseded/, out of the run, which audits clean
    (res / "measure" / "r01-candidate.json").unlink()
    snakemake(scratch, "--cores", "1", "--configfile", str(cfg), env=env)
    assert not list(res.glob("*/r01-candidate.retry*")) and not list(res.glob("private/outputs/r01-*.retry*"))
    assert list((res / "private" / "superseded").glob("*/validate/r01-candidate.retry2.json"))
    assert sorted(p.name for p in (res / "measure").glob("*.retry*")) == ["r02-candidate.retry1.json"]
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert len(df) == 10 and df["selected"].sum() == 8
    assert read_artifact(res / "audit.json", "audit")["ok"]

    # lowering validate.retries to 0 (not part of the plan: nothing is re-measured) leaves the
    # remaining retry out of the run: the stats stage moves it under private/superseded/
    cfg0 = scratch / "vretry0.yaml"
    cfg0.write_text(RETRY_CONFIG.replace("retries: 2}", "retries: 0}"))
    proc = snakemake(scratch, "--cores", "1", "--configfile", str(cfg0), env=env)
    assert not re.search(r"rule (measure|measure_retry|validate|validate_retry):", proc.stdout + proc.stderr)
    assert not list(res.glob("*/*.retry*")) and not list(res.glob("private/outputs/*.retry*"))
    assert list((res / "private" / "superseded").glob("*/measure/r02-candidate.retry1.json"))
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert len(df) == 8 and df["selected"].sum() == 6, "r02-candidate's timed-out records are excluded again"
    assert "Retries: none (" in (res / "publish" / "README.md").read_text()
    assert read_artifact(res / "audit.json", "audit")["ok"]


# The fake decodes at 10 ms a token (its default 1 ms made "wide" flaky: a full suite once read its
# 8-token decode rates at 260-1,520 tok/s within one round, a log half-width of 0.91 at 8 rounds
# against the target's log 1.9 = 0.64, and the run went on to 10 rounds).
ADAPTIVE_CONFIG = """\
label: {label}
model: tiny
arms:
  baseline: {{source: tests/fakes/engine, env: {{FAKE_ENGINE_DECODE_MS: "10"}}}}
  candidate: {{source: tests/fakes/engine, env: {{FAKE_ENGINE_DECODE_MS: "10"}}}}
lengths: [400, 480]
output_tokens: 8
rounds: {{min: 8, max: 10, target_halfwidth: {target}}}
repeats: 2
seed: 0
validate: {{cases: [token_counts, matches_baseline]}}
stats: {{metrics: [decode_tok_s]}}
"""


@pytest.mark.parametrize("label, target, run, decision", [("wide", 0.9, 8, "stop"), ("narrow", 0.0001, 10, "continue")])
def test_adaptive_rounds_add_blocks_until_the_intervals_are_narrow_enough(scratch, label, target, run, decision):
    cfg = scratch / f"{label}.yaml"
    cfg.write_text(ADAPTIVE_CONFIG.format(label=label, target=target))
    snakemake(scratch, "--cores", "1", "--configfile", str(cfg))
    res = scratch / "results" / label
    # the last decision is taken at the stop, at max too: it records the final widths and time
    decisions = {p.name: read_artifact(p, "adapt") for p in sorted((res / "adapt").iterdir())}
    assert list(decisions) == ["r08.json"] + (["r10.json"] if run == 10 else [])
    assert decisions["r08.json"]["decision"] == decision
    last = decisions[f"r{run:02d}.json"]
    assert (last["decision"], last["stopped_by"]) == ("stop", "target" if decision == "stop" else "max")
    assert last["budget"]["used_s"] > 0 and len(last["budget"]["round_s"]) == run
    assert len(list((res / "measure").glob("r*.json"))) == 2 * run  # visits of rounds 1..run only
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert df["round"].max() == run and set(df["repeat"]) == {1, 2}
    summary = read_artifact(res / "stats" / "summary.json", "summary")
    r = summary["run"]["rounds"]
    assert (r["adaptive"], r["planned"], r["run"]) == (True, 10, run)
    assert r["stop_reason"].startswith("stopped after 8 rounds" if decision == "stop" else "stopped at the maximum of 10")
    assert r["budget"]["stopped_by"] == last["stopped_by"] and r["budget"]["max_minutes"] is None
    assert r["budget"]["used_minutes"] == pytest.approx(last["budget"]["used_s"] / 60)
    readme = (res / "publish" / "README.md").read_text()
    assert f"- Rounds: adaptive, 8 to 10 in blocks of 2 (target half-width ±{target:.1%}" in readme
    assert verify_bundle(res / "publish") == []
    # nothing left to do, and the no-op dry run stays cheap
    out = snakemake(scratch, "-n", "--configfile", str(cfg))
    assert "Nothing to be done" in out.stdout + out.stderr


BUDGET_CONFIG = """\
label: budget
model: tiny
arms:
  baseline: {{source: tests/fakes/engine}}
  candidate: {{source: tests/fakes/engine}}
lengths: [400]
output_tokens: 8
rounds: {{min: 2, max: 4, target_halfwidth: 0.0001, max_minutes: {budget}}}
seed: 0
validate: {{cases: [token_counts]}}
stats: {{metrics: [decode_tok_s]}}
"""


def test_a_larger_budget_measures_only_the_rounds_it_allows(scratch):
    """The rounds' time budget is not part of the plan: raised after a run it stopped, the finished
    rounds are kept byte for byte and only the rounds it now allows are measured (docs/ci.md)."""
    cfg = scratch / "budget.yaml"
    cfg.write_text(BUDGET_CONFIG.format(budget=0.001))
    snakemake(scratch, "--cores", "1", "--configfile", str(cfg))
    res = scratch / "results" / "budget"
    assert read_artifact(res / "adapt" / "r02.json", "adapt")["stopped_by"] == "budget"
    first = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (res / "measure").glob("*.json")}
    plan = (res / "plan.json").read_bytes()
    assert sorted(first) == ["r01-baseline.json", "r01-candidate.json", "r02-baseline.json", "r02-candidate.json"]
    cfg.write_text(BUDGET_CONFIG.format(budget=100))
    snakemake(scratch, "--cores", "1", "--configfile", str(cfg))
    assert (res / "plan.json").read_bytes() == plan
    now = {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (res / "measure").glob("*.json")}
    assert {k: v for k, v in now.items() if k in first} == first  # the finished rounds, untouched
    assert sorted(set(now) - set(first)) == ["r03-baseline.json", "r03-candidate.json", "r04-baseline.json",
                                             "r04-candidate.json"]
    last = read_artifact(res / "adapt" / "r04.json", "adapt")
    assert (last["stopped_by"], last["budget"]["max_minutes"]) == ("max", 100)
    assert read_artifact(res / "stats" / "summary.json", "summary")["run"]["rounds"]["run"] == 4


@pytest.fixture(scope="module")
def tiny3_run(tmp_path_factory):
    """tests/config/tiny3.yaml: stock against two candidates (int8 KV, growing KV) in one run."""
    return finished_run(tmp_path_factory, "repo3", "tests/config/tiny3.yaml")


def test_three_arm_run_passes_the_audit_and_verifies(tiny3_run):
    from pairbench.core.artifacts import sha256_file

    res = tiny3_run / "results" / "tiny3"
    for path in json_artifacts(res):
        kind, version = parse_schema_id(json.loads(path.read_text())["schema"])
        read_artifact(path, kind)
    assert read_artifact(res / "audit.json", "audit")["ok"] is True
    # every candidate's patches re-applied alone to the clean source, every verdict recomputed
    assert verify_bundle(res / "publish", clean_source=res / "src" / "baseline") == []
    manifest = json.loads((res / "publish" / "MANIFEST.json").read_text())
    assert {c: s["patches"] for c, s in manifest["source"]["candidates"].items()} == {
        "int8": ["patches/int8-kv.patch"], "grow": ["patches/kv-grow.patch"]}

    plan = read_artifact(res / "plan.json", "plan")
    assert (plan["baseline"], plan["candidates"], plan["order"]) == ("baseline", ["int8", "grow"], "williams")
    order = [[v["arm"] for v in plan["visits"] if v["round"] == r] for r in range(1, 7)]
    assert order == [["baseline", "int8", "grow"], ["int8", "grow", "baseline"], ["grow", "baseline", "int8"],
                     ["grow", "int8", "baseline"], ["baseline", "grow", "int8"], ["int8", "baseline", "grow"]]
    # matches_baseline: each candidate against the baseline's output of the same round
    for v in plan["visits"]:
        if v["arm"] != "baseline":
            body = read_artifact(res / "validate" / f"{v['id']}.json", "validate")
            own = res / "private" / "outputs" / f"r{v['round']:02d}-baseline-in400-out8.json"
            assert body["inputs"]["baseline_output.in400-out8"] == sha256_file(own), v["id"]

    summary = read_artifact(res / "stats" / "summary.json", "summary")
    # the order is candidates' (an artifact's keys are written sorted)
    assert summary["candidates"] == ["int8", "grow"] and sorted(summary["comparisons"]) == ["grow", "int8"]
    assert summary["params"]["family_size"] == 2 * 2 * 1  # candidates x primary metrics x conditions
    ranks = sorted(p["family_rank"] for c in summary["comparisons"].values()
                   for by in c["paired"].values() for p in by.values() if p["role"] == "primary")
    assert ranks == [1, 2, 3, 4]
    paired = pd.read_csv(res / "tables" / "paired.csv")
    assert list(dict.fromkeys(paired["candidate"])) == ["int8", "grow"]
    memory = pd.read_csv(res / "tables" / "memory.csv").set_index(["candidate", "metric"])
    assert memory.loc[("int8", "kv_bytes"), "verdict"] == "smaller"  # int8 KV: 9/16 of the bytes
    assert memory.loc[("grow", "kv_bytes"), "verdict"] == "equivalent"

    readme = (res / "publish" / "README.md").read_text()
    assert "# pairbench: `int8`, `grow` against `baseline`" in readme
    assert "Holm's step-down procedure across the 4 primary comparisons (2 candidates" in readme
    # one verdict table over both candidates, in the candidates' order
    verdicts = [m.group(1, 2) for m in re.finditer(r"^\| `(\w+)` \| `in400-out8` \| `(\w+)` \| \*\*", readme, re.M)]
    assert verdicts == [("int8", "decode_tok_s"), ("int8", "prefill_tok_s"), ("grow", "decode_tok_s"),
                        ("grow", "prefill_tok_s")]
    landing = (res / "report" / "landing.rst").read_text()
    assert "``int8``" in landing and "``grow``" in landing


def test_two_output_lengths_are_two_conditions_end_to_end(tmp_path_factory):
    """output_tokens as a list: every condition is measured, gated, tabled, judged and reported,
    and the bundle recomputes."""
    work = finished_run(tmp_path_factory, "outputs2", "tests/config/outputs2.yaml")
    res = work / "results" / "outputs2"
    plan = read_artifact(res / "plan.json", "plan")
    assert plan["factors"] == ["input_tokens", "output_tokens"]
    assert plan["conditions"] == [{"id": "in400-out4", "input_tokens": 400, "output_tokens": 4},
                                  {"id": "in400-out8", "input_tokens": 400, "output_tokens": 8}]
    assert sorted(p.name for p in (res / "fixtures").iterdir()) == ["in400-out4.json", "in400-out8.json"]
    for v in plan["visits"]:
        records = read_artifact(res / "measure" / f"{v['id']}.json", "measure")["records"]
        assert [(r["condition"], r["completion_tokens"]) for r in records] == [("in400-out4", 4), ("in400-out8", 8)]
        assert all(r["ok"] and r["gates"]["completion_tokens"] for r in records)
    df = pd.read_csv(res / "tables" / "measurements.csv")
    assert list(df.columns[:5]) == ["round", "arm", "condition", "input_tokens", "output_tokens"]
    assert df.groupby("condition")["completion_tokens"].unique().to_dict() == {"in400-out4": [4], "in400-out8": [8]}
    paired = pd.read_csv(res / "tables" / "paired.csv")
    primary = paired[paired["role"] == "primary"]
    assert primary[["condition", "output_tokens", "metric"]].values.tolist() == [
        ["in400-out4", 4, "decode_tok_s"], ["in400-out4", 4, "prefill_tok_s"],
        ["in400-out8", 8, "decode_tok_s"], ["in400-out8", 8, "prefill_tok_s"]]
    summary = read_artifact(res / "stats" / "summary.json", "summary")
    assert summary["params"]["family_size"] == 2 * 2  # primary metrics x conditions
    readme = (res / "publish" / "README.md").read_text()
    assert "`in400-out4` (400 input tokens, 4 output tokens); `in400-out8` (400 input tokens, 8 output tokens)" in readme
    assert read_artifact(res / "audit.json", "audit")["ok"] is True
    assert verify_bundle(res / "publish") == []
