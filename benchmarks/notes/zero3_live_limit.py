"""By hand: DeepSpeed ZeRO-3's per-rank transient with stage3_max_live_parameters /
stage3_max_reuse_distance lowered under the tiny models' size, measured on 2 gloo ranks against
ftplan's upper bound (``sharding._ds_capped_gather_elems``); CI holds one case
(tests/test_zero3_live_limit.py). About 70 s per limit on 2 cores.

    PYTHONPATH=src python benchmarks/notes/zero3_live_limit.py [--limits 20000,50000,100000]
        [--prefetch 5000] [--families llama,qwen2,mixtral] [--methods full,lora] [--trace]

``--trace`` (one family/method/limit) prints what is gathered at each rank's peak and the module
fetches/releases before it (``FTPLAN_DIST_DEBUG``: the coordinator's own count of gathered elements
after each), as read for benchmarks/notes/distributed_cpu.md.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--limits", default="20000,50000,100000")
    ap.add_argument("--prefetch", type=int, default=5000)
    ap.add_argument("--families", default="llama,qwen2,mixtral")
    ap.add_argument("--methods", default="full,lora")
    ap.add_argument("--trace", action="store_true")
    a = ap.parse_args()
    if a.trace:
        os.environ["FTPLAN_DIST_DEBUG"] = "1"
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
    from test_zero3_live_limit import slack

    from test_distributed_memory import _predict

    from ftplan.measure.distributed import Case, run_cases

    for limit in map(int, a.limits.split(",")):
        cases = [Case(family=f, engine="deepspeed", zero_stage=3, method=m, steps=2, max_live=limit,
                      reuse_distance=limit, prefetch_bucket=a.prefetch)
                 for f in a.families.split(",") for m in a.methods.split(",")]
        for case, res in zip(cases, run_cases(cases, 2, timeout_s=600)):
            if isinstance(res, str):
                print(case.label, "did not run:", res.splitlines()[0])
                continue
            p = float(_predict(case, 2)["transient"])
            meas = [m.engine_transient_peak for m in res]
            ok = all(0 <= p - x <= slack(case) for x in meas)
            print(f"{case.label}: measured {meas} B, predicted {p:.0f} B (upper bound), over by "
                  f"{[round(p - x) for x in meas]}, slack {slack(case)}: {'ok' if ok else 'OUTSIDE'}")
            if a.trace:
                for m in res:
                    _print_peak(m)


def _print_peak(m) -> None:
    ev = m.detail["events"]
    cur = peak = 0
    live: dict = {}
    best: dict = {}
    at = -1
    for _ph, sid, d, _where, _role, is_eng, i in ev:
        if not is_eng:
            continue
        cur += d
        live[sid] = live.get(sid, 0) + d
        if cur > peak:
            peak, at, best = cur, i, {k: v for k, v in live.items() if v}
    where = {sid: w for _ph, sid, _d, w, *_ in ev}
    print(f"  rank {m.rank}: peak {peak} B at event {at}; live engine storages (bytes x count, allocated by):")
    agg = collections.Counter((v, where[k]) for k, v in best.items())
    for (v, w), n in sorted(agg.items(), key=lambda x: -x[0][0]):
        print(f"    {v:>9} x{n}  {w}")
    first = min(i for *_, i in ev)
    trace = [t for t in m.detail.get("ds_trace", []) if t[0] >= first]
    j = max((k for k, t in enumerate(trace) if t[0] <= at), default=0)
    print("  module trace before the peak (event, F/R + f/b, ds_id, class, coordinator's gathered elements):")
    for t in trace[max(0, j - 12): j + 3]:
        print("    ", "*" if t is trace[j] else " ", tuple(t))


if __name__ == "__main__":
    main()
