"""Measurement: the fixtures every arm is sent, and one visit of one arm.

- ``fixtures``: synthetic frozen messages of exactly N native tokens per condition, checked by every arm.
- ``visit``: one visit (launch, first request, steady requests of every condition, gates, stop) and
  one warmup, through the engine's adapter (:mod:`pairbench.engines.adapter`).
- ``hostload``: load average, CPU state and pinning per visit; ``node``: which node a visit ran on.
- ``crosscheck``: the engine's own benchmark tool (llama-bench) from each compared arm's build.
"""
