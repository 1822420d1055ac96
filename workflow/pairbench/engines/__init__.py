"""Engines: every server an arm can run, each described by a profile and driven through its adapter.

- ``profiles``: load and validate ``config/engines/<name>.yaml``, the typed accessors every other
  layer reads a profile through (``tokenize_spec``, ``cold_cache_spec``, ``build_spec``,
  ``build_recipe``, ``crosscheck_spec``, ``model_formats``, ``source_route``...), and the launch.
- ``specs``: the typed values a profile hands out (a launch, a build recipe, an install into an
  arm's own environment...) and the ``{placeholder}`` templating.
- ``policy``: the opt-in for external engines (nothing is built or launched without consent) and
  the check that every arm's engine has a valid profile, reads the model's format, and runs the
  arm's source and patches.
- ``adapter``: :class:`ArmEngine`, what the stages drive every engine through, the embedded one
  included (launch, request dialect, tokenizer, gates), and the registry of its subclasses by
  profile name (:func:`register_adapter`): a new engine is a profile plus, at most, a small
  subclass in a module of its own here, imported below.
- ``evidence``: native token counts and the cold-cache proof, read from a reply or the server log.
- ``chat``: the prompt text a completions-mode engine is sent (the model's own chat template).
- ``hfmodel``: a local Hugging Face model directory's chat template and tokenizer.
- ``server``: the server process (its own process group, health probe, SIGTERM then SIGKILL).
- ``pidfile``: crash hygiene for servers (a pid file per running server; a stale one is killed).
- ``exchange``: the values of one exchange with a server (:class:`Link`, :class:`Prepared`,
  :class:`Exchange`: what streamed, the gates and their facts).
- ``client``: HTTP, streaming (a stream's shape read line by line) and client-side token timings.
- ``loadclient``: a load level's concurrent streams on one event loop, timed per request.
- ``serving``: a load run's server: its slots, its idle probe.
"""

from pairbench.engines.adapter import (ArmEngine, adapter_class, arm_adapter, arm_python, for_arm, model_arg,
                                       register_adapter)
from pairbench.engines.chat import render_chat_prompt
from pairbench.engines.exchange import Exchange, Link, Prepared
from pairbench.engines.evidence import cold_cache_evidence, count_log_prefix_hits, get_path, native_counts
from pairbench.engines.policy import (check_engines, check_opt_in, check_source_runs, describe_plan, external_arms,
                                      plan_opt_in)
from pairbench.engines.profiles import (PLACEHOLDERS, PROFILE_DIR, BuildRecipe, BuildSpec, ColdCacheSpec,
                                        CrosscheckSpec, EngineError, EngineProfile, ExternalEngineNotAllowed,
                                        FlushSpec, InstallRecipe, InstallSpec, LaunchSpec, TokenizeSpec, arm_engine,
                                        available_profiles, is_external, launch_spec, load_profile, render)

# Adapter subclasses register themselves by profile name when their module is imported: import
# each one here (none is needed yet: every shipped engine is data in its profile).

__all__ = [
    "ArmEngine", "BuildRecipe", "BuildSpec", "ColdCacheSpec", "CrosscheckSpec", "EngineError", "EngineProfile",
    "Exchange", "ExternalEngineNotAllowed", "FlushSpec", "InstallRecipe", "InstallSpec", "LaunchSpec", "Link", "PLACEHOLDERS",
    "PROFILE_DIR", "Prepared", "TokenizeSpec", "adapter_class", "arm_adapter", "arm_engine", "arm_python", "available_profiles",
    "check_engines", "check_opt_in", "check_source_runs",
    "cold_cache_evidence", "count_log_prefix_hits", "describe_plan", "external_arms", "for_arm", "get_path",
    "is_external", "launch_spec", "load_profile", "model_arg", "native_counts", "plan_opt_in", "register_adapter",
    "render", "render_chat_prompt",
]
