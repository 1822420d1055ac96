"""Views of ``gate.json`` for a CI page: a Markdown summary and JUnit XML.

Both are renderings of the record :func:`pairbench.publish.gate.decide` wrote, and compute nothing
it lacks (pytest's JUnit XML and a GitHub step summary are the shapes):

- :func:`markdown`: fit for ``$GITHUB_STEP_SUMMARY`` and a pull-request comment: the decision and
  its reason, a table of the gated cells (outcome, the run's verdict, ratio, interval, rounds, the
  rule), the policy, the arms with their refs and shas, the host, and the path of the full report
  (no links: a CI page renders it wherever it lands);
- :func:`junit`: one ``<testcase>`` per gated cell, the cost channel's gated cells included (a
  regression, or an inconclusive cell under a policy that fails it, is a ``<failure>``); a run that
  cannot be judged is one ``<testcase>`` with an ``<error>``.

The Markdown shows the cost channel's cells (``gate.json``'s ``cost``) in a table of their own after
the wall-clock one, saying whether they decide and which arms were not counted.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

MARK = {"pass": "pass", "regression": "**regression**", "inconclusive": "*inconclusive*", None: "shown, not gated"}


def _cell_text(value: str) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def _pct(x: float | None) -> str:
    return "the run's stats.noise" if x is None else f"{x:.2%}".replace(".00%", "%")


def _interval(c: dict) -> str:
    return "unbounded" if c["ci_low"] is None else f"[{c['ci_low']:.3f}, {c['ci_high']:.3f}]"


def _ratio(c: dict) -> str:
    return "n/a" if c["hl_ratio"] is None else f"{c['hl_ratio']:.3f}x"


def _policy_line(g: dict) -> str:
    p = g["policy"]
    where = "every condition" if p["conditions"] is None else ", ".join(p["conditions"])
    inc = "fails the gate (exit 2)" if p["inconclusive"] == "fail" else "passes, and is listed"
    return (f"Policy: fail on a slowdown beyond {_pct(p['fail_slower_than'])} shown on "
            f"{', '.join(p['metrics']) or 'no metric'} at {where}; a cell that cannot rule one out {inc}.")


def _cells_table(g: dict) -> list[str]:
    lines = ["| candidate | condition | metric | outcome | verdict | ratio | interval | level | rounds | rule |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in g["cells"]:
        lines.append("| " + " | ".join(_cell_text(x) for x in (
            c["candidate"], c["condition"], f"{c['metric']} ({c['unit']})", MARK[c["outcome"]], c["verdict"],
            _ratio(c), _interval(c), f"{c['ci_level']:.2%}", c["n_pairs"], c["rule"])) + " |")
    return lines


def _cost_lines(g: dict) -> list[str]:
    """The cost channel's verdicts beside the wall-clock ones, the arms it did not count, and whether
    they decide (gate.cost_metrics)."""
    cost = g.get("cost")
    if cost is None:
        return []
    gated = g["policy"].get("cost_metrics") or []
    head = (f"Cost channel (simulated counts per token, docs/cost.md): {', '.join(gated)} decide beside the "
            "wall-clock cells; the rest are shown." if gated else
            "Cost channel (simulated counts per token, docs/cost.md): shown beside the wall-clock verdicts; it "
            "decides nothing (gate.cost_metrics is empty).")
    lines = [head, ""]
    lost = [f"`{a}` ({b['reason']})" for a, b in cost["arms"].items() if b["status"] != "counted"]
    if lost:
        lines += [f"Not counted: {', '.join(lost)}: its cells are unavailable, never a pass.", ""]
    if cost["cells"]:
        lines += ["| candidate | condition | cost metric | outcome | cost verdict | ratio | wall-clock verdict | "
                  "agreement | rule |", "|---|---|---|---|---|---|---|---|---|"]
        for c in cost["cells"]:
            ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.4f}x"
            lines.append("| " + " | ".join(_cell_text(x) for x in (
                c["candidate"], c["condition"], c["metric"], MARK[c["outcome"]], c["verdict"], ratio,
                f"{c['wall_metric']} {c['wall_verdict'] or '–'}", c["agreement"], c["rule"])) + " |")
        lines.append("")
    return lines


def _arms_table(g: dict) -> list[str]:
    lines = ["| arm | role | engine | source | ref | commit | patches |", "|---|---|---|---|---|---|---|"]
    for name, a in g["arms"].items():
        commit = f"`{a['commit'][:12]}`" if a["commit"] else "—"
        ref = f"`{a['ref']}`" if a["ref"] else a["version"]
        lines.append("| " + " | ".join(_cell_text(x) for x in (
            name, a["role"], a["engine"], a["source"], ref, commit, ", ".join(a["patches"]) or "—")) + " |")
    return lines


def _host_line(g: dict) -> str:
    h = g["host"]
    parts = [h["cpu_model"], h["cpu_count_logical"] and f"{h['cpu_count_logical']} logical CPUs", h["cpu_arch"],
             h["os_distribution"] or h["os_family"], h["gpu_count"] and f"{h['gpu_count']} GPU(s)"]
    return "Host: " + (", ".join(str(p) for p in parts if p) or "not recorded") + "."


def markdown(g: dict) -> str:
    """The step summary of one gate record (Markdown, ending in a newline)."""
    title = {"pass": "no regression shown", "regression": "regression", "inconclusive": "inconclusive",
             "invalid": "run not valid"}[g["decision"]]
    out = [f"## pairbench gate `{g['label']}`: {title} (exit {g['exit_code']})", "", g["reason"][:1].upper() + g["reason"][1:], ""]
    if len(g["problems"]) > 1:
        out += [f"- {p}" for p in g["problems"]] + [""]
    if g["cells"]:
        out += _cells_table(g) + [""]
    out += _cost_lines(g)
    if g["policy"]["metrics"]:
        out += [_policy_line(g), ""]
    if g["arms"]:
        out += _arms_table(g) + [""]
    r, s = g["rounds"], g["stats"]
    if r["run"] is not None:
        rounds = f"{r['run']} of {r['planned']} planned" + (f", adaptive, stopped by {r['stopped_by']}"
                                                              if r["adaptive"] and r["stopped_by"] else "")
        out += [f"Rounds: {rounds}. Statistics: alpha {s['alpha']:g} ({s['multiplicity']}), noise {_pct(s['noise'])}.", ""]
    out += [_host_line(g), "", f"Full report: `results/{g['label']}/{g['report']}`", ""]
    return "\n".join(out)


def _detail(c: dict) -> str:
    if "n_pairs" not in c:  # a gated cost cell
        ratio = "n/a" if c["ratio"] is None else f"{c['ratio']:.4f}x"
        return (f"{c['outcome']}: the cost channel counts {ratio} the baseline's per token; its verdict: "
                f"{c['verdict']}; wall time ({c['wall_metric']}): {c['wall_verdict'] or 'not compared'}; {c['rule']}")
    return (f"{c['outcome']}: {_ratio(c)} {_interval(c)} at {c['ci_level']:.2%} over {c['n_pairs']} rounds; "
            f"the run's verdict: {c['verdict']}; {c['rule']}")


def junit(g: dict) -> str:
    """JUnit XML of one gate record: one test case per gated cell (UTF-8, with an XML declaration)."""
    cases = [*g["cells"], *(c for c in (g.get("cost") or {}).get("cells", []) if c["gated"])]
    failing = [c for c in cases if c["outcome"] == "regression"
               or (c["outcome"] == "inconclusive" and g["policy"]["inconclusive"] == "fail")]
    errors = 1 if g["decision"] == "invalid" else 0
    tests = len(cases) + errors
    counts = {"tests": str(tests), "failures": str(len(failing)), "errors": str(errors), "skipped": "0", "time": "0"}
    root = ET.Element("testsuites", {"name": "pairbench gate", **counts})
    suite = ET.SubElement(root, "testsuite", {"name": f"pairbench.gate.{g['label']}", **counts})
    props = ET.SubElement(suite, "properties")
    facts = {"decision": g["decision"], "exit_code": g["exit_code"], "reason": g["reason"],
             "fail_slower_than": g["policy"]["fail_slower_than"], "inconclusive": g["policy"]["inconclusive"],
             "report": f"results/{g['label']}/{g['report']}"}
    for name, a in g["arms"].items():
        facts[f"arm.{name}"] = " ".join(x for x in (a["role"], a["engine"], a["ref"] or a["version"], a["commit"]) if x)
    for key, value in facts.items():
        ET.SubElement(props, "property", {"name": key, "value": str(value)})
    if errors:
        case = ET.SubElement(suite, "testcase", {"classname": f"pairbench.{g['label']}", "name": "run is valid",
                                                 "time": "0"})
        err = ET.SubElement(case, "error", {"type": "invalid", "message": g["reason"]})
        err.text = "\n".join(g["problems"])
    for c in cases:
        case = ET.SubElement(suite, "testcase", {"classname": f"pairbench.{g['label']}.{c['candidate']}",
                                                 "name": f"{c['metric']} at {c['condition']}", "time": "0"})
        detail = _detail(c)
        if c in failing:
            fail = ET.SubElement(case, "failure", {"type": c["outcome"], "message": detail})
            fail.text = detail
        ET.SubElement(case, "system-out").text = detail
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=False).join(
        ['<?xml version="1.0" encoding="UTF-8"?>\n', "\n"])
