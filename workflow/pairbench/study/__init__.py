"""Studies: many comparisons, one command (workflow/rules/study.smk, docs/cluster.md).

``comparisons`` turns a study config into one full run config per comparison; ``index`` writes the
study's index page from each comparison's statistics."""
