"""Catalog loading speed: a generated offers CSV of N rows (default 200,000) through ``load_offers``.

    python benchmarks/catalog_load.py [--rows 200000] [--runs 3] [--json]

Every row is valid (random bundled GPU, price, date, region), so the whole validation path runs.
Reports the median wall time and rows per second; goal: 200k rows in a few seconds on one core
(the GPU-name index used to be rebuilt for every row, which made this minutes).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path


def write_offers(path: Path, rows: int, seed: int = 0) -> None:
    from ftplan.catalog.gpus import load_gpus
    from ftplan.catalog.offers import OFFER_COLUMNS

    names = sorted(load_gpus())
    rnd = random.Random(seed)
    lines = [",".join(OFFER_COLUMNS)]
    pad = "," * (len(OFFER_COLUMNS) - 13)  # the optional columns after notes, blank
    for i in range(rows):
        lines.append(f"prov{i % 40},sku-{i},{rnd.choice(names)},1,{rnd.uniform(0.2, 9):.3f},on-demand,r{i % 7},,,"
                     f"3600,2025-0{1 + i % 9}-1{i % 10},https://example.com/{i},{pad}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    from ftplan.catalog.offers import load_offers

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "offers.csv"
        write_offers(path, a.rows)
        walls = []
        for _ in range(a.runs):
            t0 = time.perf_counter()
            n = len(load_offers(path, include_bundled=False, latest_only=False))
            walls.append(time.perf_counter() - t0)
    med = statistics.median(walls)
    res = {"rows": a.rows, "loaded": n, "runs": a.runs, "median_s": med, "rows_per_s": a.rows / med,
           "walls_s": walls}
    if a.json:
        print(json.dumps(res, indent=2))
    else:
        print(f"load_offers: {a.rows:,} rows in {med:.2f} s (median of {a.runs}), {a.rows / med:,.0f} rows/s")
    return 0 if n == a.rows else 1


if __name__ == "__main__":
    sys.exit(main())
