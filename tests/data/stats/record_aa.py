"""Freeze a real A/A run of the engine into a statistics fixture (tests/data/stats/aa_*.csv).

Not a benchmark and not run by the tests: it was run once per fixture, on the measurements table of
a real pipeline run whose two arms are the identical stock engine, so that the statistics tests and
the simulation study (tests/pairbench/test_stats_simulation.py) work on this machine's genuine
run-to-run noise. It only renames the arms to ``A`` (baseline) and ``B`` (candidate); every row and
column is kept as the pipeline wrote it (docs/contracts.md §2).

    snakemake --cores 1 --configfile <an A/A config>     # e.g. config/aa.yaml
    python3 tests/data/stats/record_aa.py results/<label>/tables/measurements.csv tests/data/stats/aa_<name>.csv

The fixtures, their configs and the machine's load while they ran are listed in docs/statistics.md
("A/A mode and the recorded fixtures").
"""

import sys

import pandas as pd


def main(src: str, dest: str, baseline: str = "baseline", candidate: str = "candidate") -> None:
    df = pd.read_csv(src)
    arms = set(df["arm"])
    if arms != {baseline, candidate}:
        raise SystemExit(f"{src}: arms {sorted(arms)}, expected {baseline} and {candidate}")
    df["arm"] = df["arm"].map({baseline: "A", candidate: "B"})
    df.to_csv(dest, index=False)


if __name__ == "__main__":
    main(*sys.argv[1:])
