"""One registry per concept: where a schema or a default must spell out names, they agree with the
registry (metrics, condition factors), and every artifact kind's version is its schema's ``$id``."""

import json
from pathlib import Path

import pytest
import yaml

from pairbench.analysis import loadlevel, tables
from pairbench.core import artifacts, conditions
from pairbench.core.config import STATS_DEFAULTS
from pairbench.core.metrics import (COST_METRICS, DEFAULT_MEMORY, DEFAULT_METRICS, DEFAULT_SECONDARY, MEMORY_METRICS, METRICS,
                                    PERCENTILES, SPEED_METRICS)
from pairbench.core.slo import SLO

SCHEMAS = Path(__file__).resolve().parents[2] / "workflow" / "schemas"


def test_the_config_schema_lists_the_registry_s_metrics_and_defaults():
    stats = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())["properties"]["stats"]["properties"]
    for key, allowed, default in (("metrics", SPEED_METRICS, DEFAULT_METRICS),
                                  ("secondary", SPEED_METRICS, DEFAULT_SECONDARY),
                                  ("memory", MEMORY_METRICS, DEFAULT_MEMORY)):
        assert stats[key]["items"]["enum"] == list(allowed), key
        assert stats[key]["default"] == list(default) == STATS_DEFAULTS[key], key


def test_stats_params_lists_the_registry_s_metrics():
    props = json.loads((SCHEMAS / "stats_params.schema.json").read_text())["properties"]
    assert props["metrics"]["items"]["enum"] == props["secondary"]["items"]["enum"] == list(SPEED_METRICS)
    assert props["memory"]["items"]["enum"] == list(MEMORY_METRICS)


def records(kind: str) -> dict:
    """The measure schema's record of *kind*: ``steady`` (one request) or ``level`` (a load level)."""
    return json.loads((SCHEMAS / "measure.schema.json").read_text())["$defs"][kind]


def level_metric_keys() -> set[str]:
    """The keys of a level's metrics as the statistics compute them (pairbench.analysis.loadlevel),
    at every percentile the registry knows: a load level's record holds them under ``metrics`` once
    judged, never as measured."""
    req = {"index": 0, "warmup": False, "stream": 0, "scheduled_s": 0.0, "sent_s": 0.0, "end_s": 0.2,
           "token_s": [0.1, 0.15], "completion_tokens": 2, "error_kind": None, "error": None}
    client = {"wall_s": 0.2, "cpu_s": 0.01, "offered_rate_rps": None, "requests": [req]}
    return set(loadlevel.level_metrics(client, level="c1", slo=SLO(ttft_ms=100), percentiles=PERCENTILES).to_dict())


def test_every_metric_has_a_column_and_a_record_field():
    cols = tables.columns(["input_tokens", "output_tokens"], scopes=("request", "level"))
    assert set(METRICS) <= set(cols)
    level_keys = level_metric_keys()
    for name, m in METRICS.items():
        if m.scope == "level":
            assert m.record == ("metrics", name) and name in level_keys, name
            continue
        node = records("steady")
        for key in m.record or (name,):
            assert key in node["properties"], f"{name}: {key} is not a field of a steady record"
            node = node["properties"][key]
            node = next((b for b in node.get("anyOf", node.get("oneOf", [node])) if b.get("properties")), node)


def test_condition_factors_are_record_fields_and_plan_enums():
    plan = json.loads((SCHEMAS / "plan.schema.json").read_text())["properties"]
    names = [f.name for f in conditions.FACTORS]
    steady = [n for n in names if n not in conditions.LOAD_FACTORS]
    assert set(steady) <= set(records("steady")["properties"])
    assert set(names) <= set(records("level")["properties"])
    assert plan["factors"]["items"]["enum"] == names
    assert set(names) <= set(plan["conditions"]["items"]["properties"])


@pytest.mark.parametrize("path", sorted(SCHEMAS.glob("*.schema.json")), ids=lambda p: p.name)
def test_each_schema_s_id_is_its_kind_and_version(path):
    s = json.loads(path.read_text())
    kind = path.name.removesuffix(".schema.json")
    got_kind, version = artifacts.parse_schema_id(s["$id"])
    assert got_kind == kind and version >= 1
    const = s.get("properties", {}).get("schema", {}).get("const")
    assert const in (None, s["$id"]), f"{path.name}: schema.const {const} is not its $id {s['$id']}"


def test_a_loader_rejects_an_unknown_version_naming_it(tmp_path):
    body = {"schema": "pairbench.plan/v1", "label": "x"}
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(body))
    current = artifacts.current_version("plan")
    with pytest.raises(artifacts.ArtifactError,
                       match=rf"plan.json: unknown version v1 of plan \(this pairbench reads plan v{current}"):
        artifacts.read_artifact(path, "plan")


# Modules that spell a metric's name, each with its reason.
SPELLS_A_METRIC = {
    "core/metrics.py": "the registry",
    "core/slo.py": "the SLO's bounds are keyed by the latencies they bound (config load.slo.*): BOUNDS",
}


def metric_literals(path: Path) -> list[tuple[int, str]]:
    """(line, name) of every string literal in *path* that is a metric's name (docstrings aside)."""
    import ast

    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in {**METRICS, **COST_METRICS}
            and id(n) not in docs]


def test_no_module_but_the_registry_spells_a_metric_name():
    pkg = SCHEMAS.parent / "pairbench"
    found = {str(p.relative_to(pkg)): metric_literals(p) for p in sorted(pkg.rglob("*.py"))}
    assert {p: hits for p, hits in found.items() if hits and p not in SPELLS_A_METRIC} == {}


def test_the_slo_bounds_are_the_schema_s():
    from pairbench.core.slo import BOUND_WORDS, BOUNDS

    slo = yaml.safe_load((SCHEMAS / "config.schema.yaml").read_text())["properties"]["load"]["properties"]["slo"]
    assert [k for k in slo["properties"] if k != "attainment"] == list(BOUNDS) == list(BOUND_WORDS)
