"""pairbench: reproducible paired A/B benchmarks of LLM inference engines.

The harness library behind the Snakemake pipeline. Measuring (client, measure), comparing (stats)
and reporting (report, sanitize) live in separate modules; Snakemake scripts in workflow/scripts are
thin wrappers over these functions.
"""

__version__ = "0.1.0"
