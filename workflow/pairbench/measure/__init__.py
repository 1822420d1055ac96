"""Measurement: the fixtures every arm is sent, one visit of one arm, and the engine's own benchmark.

- ``fixtures``: synthetic frozen messages of exactly N native tokens per condition, checked by every arm.
- ``visit``: one visit (launch, first request, steady requests of every condition, gates, stop) and
  one warmup, through
  the engine's adapter (:mod:`pairbench.engines.adapter`).
- ``hostload``: the host's load average, CPU frequency and the server's pinning, per visit.
- ``node``: the pseudonym of the node a visit ran on.
- ``toolbench``: the engine's own benchmark tool (llama-bench) run from each arm's build, in
  alternating rounds: the numbers :mod:`pairbench.analysis.crosscheck` compares with pairbench's.
"""
