"""Measurement: the fixtures every arm is sent, and one visit of one arm.

- ``fixtures``: synthetic frozen messages of exactly N native tokens, checked by every arm.
- ``visit``: one visit (launch, first request, steady requests, gates, stop) and one warmup, through
  the engine's adapter (:mod:`pairbench.engines.adapter`).
"""
