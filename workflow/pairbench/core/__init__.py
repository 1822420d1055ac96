"""Core: what every stage stands on. It imports nothing else of pairbench.

- ``artifacts``: versioned, schema-checked JSON artifacts, written atomically, with sha256 helpers;
  an artifact kind's version is its schema's ``$id``.
- ``conditions``: what a request is measured under (the factors, the condition ids).
- ``metrics``: the registry of metrics (unit, orientation, question, where a record holds it).
- ``config``: the defaults, the checks a JSON Schema cannot express, and resolved views of the config;
  ``configsource``: where each key came from (file and line, ``--config``), YAML syntax errors.
- ``order``: visit orders (abba, random, williams); ``plan``: the run plan (arms, conditions,
  visit order, salts, the config hash); ``naming``: visit and retry names.
- ``layout``: every path of a run folder.
- ``tasks``: the catalogue of Python-function-completion tasks a fixture ends with.
- ``cache``: the user's pairbench cache folder (made-once things shared across runs).
- ``trees``: a folder tree's sha256 manifest and one hash over it (an arm's source; the audit).
- ``steps``: the one step runner (a subprocess as a named step: logged, recorded, its failure named).
"""
