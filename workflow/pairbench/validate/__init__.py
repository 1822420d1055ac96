"""Validation: the functional cases on every steady record's output.

(The tasks themselves are :mod:`pairbench.core.tasks`: the fixtures end with one.)

- ``cases``: the cases (token counts, done marker, python function, matches baseline) and the
  function extraction from model output.
- ``sandbox``: model-written code run in a contained subprocess; ``runner``: the program inside it;
  ``assertions``: a task's tests as the supervisor runs them (the child evaluates, the harness compares).
- ``retries``: which records earn a validation retry, and which record then counts.
- ``probe``: the check that the stock model passes every task (a command, not a stage).
"""
