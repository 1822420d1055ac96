"""The stage contract (pairbench.stages.script): a rule's names are the stage function's keywords, and a
parameter typed with a class that reads a rule's plain value (``from_rule``) gets that class."""

from types import SimpleNamespace

import pytest

from pairbench.core.layout import Layout
from pairbench.stages import analysis, script


class Section(dict):
    """What Snakemake hands a script: a named list, read through ``items()``."""


def job(**sections):
    names = ("input", "output", "params", "log", "resources", "wildcards")
    return SimpleNamespace(rule="stats", **{n: Section(sections.get(n, {})) for n in names})


STATS = {"metrics": ["decode_tok_s"], "secondary": ["ttft_ms"], "memory": [], "multiplicity": "holm", "trim": None,
         "alpha": 0.05, "noise": 0.01}


def test_a_stage_gets_its_layout_and_typed_options_from_the_rule_s_plain_values():
    smk = job(input={"measures": ["m1.json"], "validations": ["v1.json"], "plan": "results/x/plan.json"},
              params={"layout": "results/x", "options": {"stats": STATS, "gates": {"allow_unproven_cold_cache": True}}})
    kwargs = script.job_kwargs(smk, analysis.stats_stage)
    assert kwargs == {"layout": Layout("x"), "measures": ["m1.json"], "validations": ["v1.json"],
                      "options": analysis.StatsOptions(metrics=("decode_tok_s",), secondary=("ttft_ms",), memory=(),
                                                       multiplicity="holm", trim=None, alpha=0.05, noise=0.01,
                                                       allow_unproven_cold_cache=True)}
    assert kwargs["layout"].summary == "results/x/stats/summary.json"
    assert kwargs["options"].summarize_kwargs() == {**STATS, "memory": []}


def test_a_name_the_stage_needs_and_the_rule_lacks_is_named():
    with pytest.raises(TypeError, match=r"rule stats: pairbench.stages.analysis.stats_stage needs layout, options, "
                                        r"measures, validations, which the rule does not name"):
        script.job_kwargs(job(), analysis.stats_stage)
