"""The study's index page: one line per comparison and primary question, its verdict, and a link to
each comparison's report (``results/<label>/publish/README.md``)."""

from __future__ import annotations

from pathlib import Path

from pairbench.core.artifacts import atomic_write_text, read_artifact


def pair_bodies(summary: dict) -> list[dict]:
    """The pair bodies of a ``stats/summary.json``, one per candidate, in the run's candidate order."""
    return [summary["comparisons"][c] for c in summary["candidates"]]


def _ratio(p: dict) -> str:
    if p["hl_ratio"] is None:
        return "n/a"
    low = "…" if p["ci_low"] is None else f"{p['ci_low']:.3f}"
    high = "…" if p["ci_high"] is None else f"{p['ci_high']:.3f}"
    return f"{p['hl_ratio']:.3f} [{low}, {high}]"


def rows(label: str, summary: dict) -> list[str]:
    """Markdown table rows of one comparison: every primary (tested) metric at every condition."""
    out = []
    for pair in pair_bodies(summary):
        arms = f"{pair['candidate']} vs {pair['baseline']}"
        for cond in (c["id"] for c in pair["conditions"]):
            for metric, p in sorted(pair["paired"].get(cond, {}).items()):
                if p["role"] == "primary":
                    out.append(f"| [{label}](../{label}/publish/README.md) | {arms} | {metric} | `{cond}` | "
                               f"**{p['verdict']}** | {_ratio(p)} |")
    return out


def render(study: str, summaries: dict[str, str]) -> str:
    """The index page of *study*; *summaries* maps each comparison's label to its stats/summary.json."""
    lines = [f"# Study {study}", "",
             (f"{len(summaries)} comparison(s); each links to its own report. Ratio: candidate/baseline, "
              "Hodges-Lehmann estimate [interval]."), "",
             "| comparison | arms | metric | condition | verdict | ratio |", "|---|---|---|---|---|---|"]
    for label, path in summaries.items():
        lines += rows(label, read_artifact(path, "summary"))
    return "\n".join(lines) + "\n"


def write_index(*, index: str, summaries: list[str], labels: list[str], study: str) -> None:
    """The ``study_index`` rule: *summaries* in the order of *labels*."""
    atomic_write_text(Path(index), render(study, dict(zip(labels, summaries))))
