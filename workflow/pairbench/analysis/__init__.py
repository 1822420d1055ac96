"""Analysis: comparing the arms. The verdicts are computed here, once; everything else reads them.

- ``tables``: ``tables/measurements.csv`` (one row per record, joined with its validation) and the
  flat tables of the summary.
- ``stats``: per arm × length descriptive statistics, paired ratios, intervals, tests, verdicts.
- ``plots``: the ratio and drift plots.
"""
