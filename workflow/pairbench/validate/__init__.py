"""Validation: the functional cases on every steady record's output.

- ``cases``: the cases (token counts, done marker, python function, matches baseline) and the
  function extraction from model output.
- ``tasks``: the catalogue of Python-function-completion tasks a fixture ends with.
- ``sandbox``: model-written code run in a contained subprocess.
- ``retries``: which records earn a validation retry, and which record then counts.
- ``probe``: the check that the stock model passes every task (a command, not a stage).
"""
