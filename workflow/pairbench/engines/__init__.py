"""Engines: every server an arm can run, driven through one profile-driven adapter.

- ``profiles``: load and validate ``config/engines/<name>.yaml``; render launch templates.
- ``policy``: the opt-in for external engines (nothing is built or launched without consent).
- ``adapter``: :class:`ArmEngine`, what the stages drive every engine through, the embedded one
  included: launch, request dialect, tokenizer, gates.
- ``evidence``: native token counts and the cold-cache proof, read from a reply or the server log.
- ``chat``: the prompt text a completions-mode engine is sent (the model's own chat template).
- ``server``: the server process (its own process group, health probe, SIGTERM then SIGKILL).
- ``client``: HTTP, streaming and client-side token timings.
"""

from pairbench.engines.adapter import ArmEngine, arm_adapter, for_arm
from pairbench.engines.chat import render_chat_prompt
from pairbench.engines.evidence import cold_cache_evidence, count_log_prefix_hits, get_path, native_counts
from pairbench.engines.policy import check_opt_in, describe_plan, external_arms, plan_opt_in
from pairbench.engines.profiles import (PLACEHOLDERS, PROFILE_DIR, EngineError, EngineProfile, ExternalEngineNotAllowed,
                                        LaunchSpec, arm_engine, available_profiles, is_external, launch_spec,
                                        load_profile, render)

__all__ = [
    "ArmEngine", "EngineError", "EngineProfile", "ExternalEngineNotAllowed", "LaunchSpec", "PLACEHOLDERS",
    "PROFILE_DIR", "arm_adapter", "arm_engine", "available_profiles", "check_opt_in", "cold_cache_evidence",
    "count_log_prefix_hits", "describe_plan", "external_arms", "for_arm", "get_path", "is_external",
    "launch_spec", "load_profile", "native_counts", "plan_opt_in", "render", "render_chat_prompt",
]
