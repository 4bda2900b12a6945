"""Memory constants marked ``calibrated`` / ``checked`` are held to the GPU records they cite.

``cuda_context_bytes`` (nvidia) is the median, over the ok records of
``benchmarks/measurements/h100-sxm-*.jsonl``, of this process's NVML usage minus the caching
allocator's reserved bytes read at the same moment; ``allocator_reserve_fraction`` must stay
inside the measured spread of ``max_memory_reserved / max_memory_allocated - 1``. No torch.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from ftplan.catalog.constants import memory_constants, parse_constants
from ftplan.errors import CatalogError

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "src" / "ftplan" / "catalog" / "data" / "memory_constants.json"


def _records() -> list[dict]:
    out = []
    for path in sorted((ROOT / "benchmarks" / "measurements").glob("h100-sxm-*.jsonl")):
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if r["outcome"] == "ok" and r["run"]["device"] == "cuda":
                out.append(r["measured"])
    return out


def test_cuda_context_is_the_median_of_the_gpu_records():
    ctx = [m["nvml_process_bytes"] - m["reserved_at_nvml_bytes"] for m in _records()
           if m.get("nvml_process_bytes") and m.get("reserved_at_nvml_bytes")]
    assert len(ctx) >= 80
    c = memory_constants()
    assert c.context_bytes("nvidia") == int(statistics.median(ctx))
    # one context size for every model and job on that machine (742-766 MiB)
    assert max(ctx) - min(ctx) <= 32 * 2**20
    assert json.loads(DATA.read_text())["cuda_context_bytes"]["status"] == "calibrated"


def test_allocator_reserve_sits_inside_the_measured_spread():
    fr = sorted(m["peak_reserved_bytes"] / m["peak_allocated_bytes"] - 1 for m in _records())
    f = memory_constants().allocator_reserve_fraction
    median, p90 = statistics.median(fr), fr[int(0.9 * len(fr))]
    # not below what half the runs need, and not above what nine in ten need
    assert median <= f <= p90, (median, f, p90)


def test_a_constant_with_an_unknown_status_is_refused():
    d = json.loads(DATA.read_text())
    d["allocator_reserve_fraction"]["status"] = "guessed"
    with pytest.raises(CatalogError, match="status 'guessed'"):
        parse_constants(d, "memory_constants.json")
