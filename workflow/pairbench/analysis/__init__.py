"""Analysis: comparing the arms. The verdicts are computed here, once; everything else reads them.

- ``tables``: ``tables/measurements.csv`` (one row per record, joined with its validation) and the
  flat tables of the summary.
- ``measurements``: the table as the statistics read it (checked, typed, one selected row per cell).
- ``describe``: per arm × condition × metric descriptive statistics and outlying samples.
- ``pairing``: the paired unit (a visit) and the pairs by round.
- ``signrank``: the exact Wilcoxon test and its Hodges–Lehmann interval; ``verdicts``: the rules and Holm.
- ``compare``: one candidate's pair body (speed, memory, disclosures) from typed inputs.
- ``stats``: ``summarize_all``, every candidate against the baseline in one multiplicity family.
- ``adaptive``: the stopping rule of adaptive rounds (interval widths only).
- ``coldcheck``: the client-clock cold-cache cross-check; ``runfacts``: what the report states about the run.
- ``crosscheck``: the engine's own benchmark beside pairbench's verdicts.
- ``plots``: the ratio and drift plots.
"""
