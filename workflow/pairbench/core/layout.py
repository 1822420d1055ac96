"""The run layout: every path of ``results/<label>/`` (and its job logs under ``logs/<label>/``).

One object knows where each artifact of a run lives, so the rules, the stages and the audit never
spell a path out. Each method returns a path *pattern*: pass a Snakemake wildcard (``"{arm}"``,
``"{visit}"``) or a value (``"baseline"``, ``"r01-baseline"``). docs/contracts.md lists the tree.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pairbench.core.naming import label as visit_label

TABLES = ("measurements", "summary", "paired", "ratios", "memory", "timing_agreement")
PLOTS = ("ratios", "drift")
LOAD_TABLES = ("capacity", "capacity_paired")  # a load run's, beside TABLES
LOAD_PLOTS = ("load",)
PER_ARM = ("source", "build", "warmup")  # one artifact per arm: <stage>/<arm>.json


@dataclass(frozen=True)
class Layout:
    label: str
    results: str = "results"
    logs_root: str = "logs"

    @classmethod
    def of(cls, res_dir: str | os.PathLike) -> "Layout":
        """The layout whose ``res`` is *res_dir* (``results/<label>``)."""
        res = Path(res_dir)
        return cls(label=res.name, results=str(res.parent))

    @classmethod
    def from_rule(cls, res_dir: str | os.PathLike) -> "Layout":
        """What a stage's ``layout: Layout`` gets from its rule's ``params.layout=L.res``
        (:mod:`pairbench.stages.script`)."""
        return cls.of(res_dir)

    @property
    def res(self) -> str:
        return f"{self.results}/{self.label}"

    @property
    def logs(self) -> str:
        return f"{self.logs_root}/{self.label}"

    @property
    def private(self) -> str:
        return f"{self.res}/private"

    def log(self, rel: str) -> str:
        """A job log, mirroring its output's path under ``logs/<label>/``."""
        return f"{self.logs}/{rel}"

    # --- per arm
    @property
    def plan(self) -> str:
        return f"{self.res}/plan.json"

    def per_arm(self, stage: str, arm: str) -> str:
        return f"{self.res}/{stage}/{arm}.json"

    def source(self, arm: str) -> str:
        return self.per_arm("source", arm)

    def tree(self, arm: str) -> str:
        """The arm's exported, patched source tree."""
        return f"{self.res}/src/{arm}"

    def build(self, arm: str) -> str:
        return self.per_arm("build", arm)

    def warmup(self, arm: str) -> str:
        return self.per_arm("warmup", arm)

    # --- per condition
    def fixture(self, cond: str) -> str:
        return f"{self.res}/fixtures/{cond}.json"

    def prompts(self, cond: str) -> str:
        return f"{self.private}/prompts/{cond}.json"

    # --- per visit (and validation retry)
    def measure(self, visit: str, retry: int | str = 0) -> str:
        return f"{self.res}/measure/{visit_label(visit, retry)}.json"

    def validate(self, visit: str, retry: int | str = 0) -> str:
        return f"{self.res}/validate/{visit_label(visit, retry)}.json"

    def output(self, visit: str, cond: str) -> str:
        """A visit's private output (text, token ids) of one condition."""
        return f"{self.private}/outputs/{visit}-{cond}.json"

    def retry_outputs(self, visit: str, retry: int | str) -> str:
        """The folder of a validation retry's private outputs, one file per re-measured condition."""
        return f"{self.private}/outputs/{visit_label(visit, retry)}"

    def level(self, visit: str, cond: str) -> str:
        """A load level's private request body (every request's timings, usage and gates)."""
        return f"{self.private}/levels/{visit}-{cond}.json"

    def host(self, visit: str) -> str:
        """The facts of the node that measured the visit (private; environment.json is made from them)."""
        return f"{self.private}/hosts/{visit}.json"

    def marker(self, visit: str) -> str:
        """The visit's done-marker: the next visit's ordering-only input."""
        return f"{self.private}/order/{visit}.done"

    def adapt(self, rounds: int | str) -> str:
        r = f"{rounds:02d}" if isinstance(rounds, int) else rounds
        return f"{self.res}/adapt/r{r}.json"

    # --- the run's statistics and bundle
    @property
    def summary(self) -> str:
        return f"{self.res}/stats/summary.json"

    def table(self, name: str) -> str:
        return f"{self.res}/tables/{name}.csv"

    def plot(self, name: str) -> str:
        return f"{self.res}/plots/{name}.png"

    def crosscheck(self, arm: str) -> str:
        return f"{self.res}/crosscheck/{arm}.json"

    def crosscheck_raw(self, arm: str) -> str:
        return f"{self.private}/crosscheck/{arm}.json"

    @property
    def crosscheck_summary(self) -> str:
        return f"{self.res}/stats/crosscheck.json"

    def cost(self, arm: str) -> str:
        """The arm's cost channel: instructions and estimated cycles per token (or why not counted)."""
        return f"{self.res}/cost/{arm}.json"

    @property
    def cost_summary(self) -> str:
        """The cost channel's verdicts beside the wall-clock ones."""
        return f"{self.res}/stats/cost.json"

    @property
    def bundle(self) -> str:
        return f"{self.res}/publish"

    @property
    def manifest(self) -> str:
        return f"{self.bundle}/MANIFEST.json"

    @property
    def report(self) -> str:
        return f"{self.bundle}/README.md"

    @property
    def landing(self) -> str:
        return f"{self.res}/report/landing.rst"

    @property
    def provenance(self) -> str:
        return f"{self.res}/provenance.json"

    @property
    def audit(self) -> str:
        return f"{self.res}/audit.json"

    @property
    def gate(self) -> str:
        """The CI gate's record of a passing run (rule ``gate``; the bundle's is ``publish/gate.json``)."""
        return f"{self.res}/gate/gate.json"

    @property
    def retired(self) -> str:
        return f"{self.private}/retired.json"

    def server_log(self, rel: str) -> str:
        """A server's log (private: it may name paths and hosts)."""
        return f"{self.private}/logs/{rel}.log"

    @property
    def pid_file(self) -> str:
        return f"{self.private}/servers/measure.json"
