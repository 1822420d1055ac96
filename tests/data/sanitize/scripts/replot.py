"""Redraw the plots from tables/measurements.csv (bundled helper)."""
import csv

DATA = "/home/zq_alice/pb/results/smoke/publish/tables/measurements.csv"


def rows(path=DATA):
    with open(path) as fh:
        return list(csv.DictReader(fh))
