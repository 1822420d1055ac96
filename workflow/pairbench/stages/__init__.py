"""The stage layer: one function per Snakemake rule, keyword arguments named after the rule's names.

Each reads its input artifacts (schema-checked), calls the library, and writes its output artifacts
(schema-checked, atomic), recording the sha256 of what it was derived from under ``inputs``. The
scripts in ``workflow/scripts`` only call :func:`pairbench.stages.script.run` with one of these, so
every stage runs and is tested without Snakemake.

- ``prepare``: plan, source (pristine export + patches), build
- ``measure``: fixtures, warmup, one visit, a validation retry's partial visit
- ``validate``: the functional cases of one visit (or retry); retiring retries no longer in the run
- ``analysis``: statistics and tables, plots
- ``publish``: the report and the sanitized bundle, the HTML report's landing page
- ``integrity``: provenance and the audit

Before any rule: ``runconfig`` checks the config whole (every error at once, at its file and line)
and ``summary`` puts the plan in words (workflow/rules/common.smk; ``python -m pairbench plan``).
"""
