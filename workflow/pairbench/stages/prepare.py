"""Stages 0-2: the plan, each arm's source (pristine export, patches applied) and its build."""

from __future__ import annotations

import logging
from pathlib import Path

from pairbench.arms import build as pb_build
from pairbench.arms import source as pb_source
from pairbench.core import config as pb_config
from pairbench.core import models as pb_models
from pairbench.core import plan as pb_plan
from pairbench.core.artifacts import read_artifact, sha256_file, write_artifact
from pairbench.core.layout import Layout
from pairbench.engines.policy import plan_opt_in
from pairbench.engines.profiles import arm_engine, is_external, load_profile

log = logging.getLogger("pairbench")


def plan_stage(*, plan: str, config: dict, root: str) -> None:
    write_artifact(plan, "plan", pb_plan.make_plan(config, Path(root)))


def source_stage(*, source: str, tree: str, plan: str, arm: str, root: str, commit: str | None = None) -> None:
    """Export one arm; *commit* is the sha its git ref named when the pipeline planned the job (a
    parameter, so a moved branch re-exports and an unmoved one reruns nothing)."""
    arm_cfg = read_artifact(plan, "plan")["arms"][arm]
    # the embedded engine at a git ref: its package of that commit, not the whole repository
    paths = (pb_config.EMBEDDED_SOURCE,) if arm_cfg["engine"] == pb_config.ARM_DEFAULTS["engine"] else ()
    body = pb_source.export_source(arm, arm_cfg["source"], arm_cfg["patches"], tree, root,
                                   plan_sha256=sha256_file(plan), commit=commit, paths=paths)
    log.info("exported %s@%s to %s; %d patch(es) applied, %d file(s) changed", arm_cfg["source"], body["version"],
             tree, len(body["patches"]), len(body["patched"]["changed"]))
    write_artifact(source, "source", body)


def build_stage(layout: Layout, *, arm: str, model: str, cache_dir: str, steps_log: str, root: str) -> None:
    """Build *arm*'s exported tree as its engine profile says (one path for every engine:
    :mod:`pairbench.arms.build`), once the config has opted in to external code; its plan, source
    artifact, tree and build artifact are where *layout* says."""
    source, plan = layout.source(arm), layout.plan
    src = read_artifact(source, "source")
    info = pb_models.resolve_model(model, Path(root))
    plan_body = read_artifact(plan, "plan")
    arm_cfg = plan_body["arms"][arm]
    profile = load_profile(arm_engine(arm_cfg))
    if is_external(arm_cfg, profile):
        plan_opt_in(plan_body)  # never build someone else's code without consent
    git = src.get("git") or {}
    tree = layout.tree(arm)
    recipe = profile.build_recipe(arm_cfg, src=tree, commit=git.get("commit"), tag=git.get("tag"))
    body = pb_build.build_arm(arm, tree, recipe, source=src, model=info, cache_dir=Path(root) / cache_dir,
                              log=steps_log, source_sha256=sha256_file(source), root=root)
    body["inputs"]["plan"] = sha256_file(plan)
    write_artifact(layout.build(arm), "build", body)
