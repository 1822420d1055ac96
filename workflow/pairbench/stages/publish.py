"""Stages 7-8: the report and the allowlisted, scrubbed, leak-gated bundle (pairbench.publish.assemble);
the HTML report's landing page."""

from __future__ import annotations

from pairbench.core.layout import Layout
from pairbench.publish import assemble
from pairbench.publish.landing import write_landing


def publish_stage(layout: Layout, *, root: str, measures: list[str], validations: list[str],
                  crosscheck: list[str], hosts: list[str], cost: list[str] = (),
                  gate: dict | None = None) -> None:
    """The bundle of the run *layout* describes: its visits' *measures* and *validations* (the chain
    the run used, retries included), the cross-check comparison and the cost channel's verdicts, if
    any, and the measuring jobs' node facts (*hosts*, in plan order), with the gate's decision under
    the *gate* policy (config ``gate:``); everything else is read from the layout."""
    run = assemble.Run.read(layout, measures, validations, crosscheck[0] if crosscheck else None,
                            cost[0] if cost else None)
    assemble.publish(run, root, hosts, gate)


def landing_stage(*, landing: str, paired: str, measurements: str) -> None:
    write_landing(paired, measurements, landing)
