"""NCCL communicator buffers: the constant's validation at load, and what the planner does with it.

Which process groups each engine runs its collectives on is held against real multi-process runs
in ``tests/test_distributed_memory.py``; the bytes per communicator are a literature figure
(``memory_constants.json``: NVIDIA/nccl #964), not measured here (no GPU).
"""

from __future__ import annotations

import copy
import json
from importlib import resources

import pytest

from ftplan.catalog.constants import parse_constants
from ftplan.errors import CatalogError


def _data() -> dict:
    return json.loads((resources.files("ftplan.catalog") / "data" / "memory_constants.json").read_text())


def test_bundled_constant_has_both_figures_with_a_source():
    c = parse_constants(_data(), "memory_constants.json")
    assert c.communicator_bytes(1) == 0
    assert c.communicator_bytes(2) == 544 * 2**20  # the 2-rank group of the source
    assert c.communicator_bytes(4) == c.communicator_bytes(64) == 688 * 2**20


@pytest.mark.parametrize("bad", [-1, "544MiB", True, 1.5])
def test_bad_two_rank_figure_is_a_catalog_error(bad):
    d = copy.deepcopy(_data())
    d["nccl_communicator_bytes"]["two_rank"] = bad
    with pytest.raises(CatalogError, match="two_rank"):
        parse_constants(d, "memory_constants.json")


def test_missing_source_is_a_catalog_error():
    d = copy.deepcopy(_data())
    del d["nccl_communicator_bytes"]["source"]
    with pytest.raises(CatalogError, match="nccl_communicator_bytes"):
        parse_constants(d, "memory_constants.json")


def test_single_gpu_has_no_communicator_and_a_fit_counts_them():
    from ftplan.memory import estimate_memory
    from ftplan.catalog.models import resolve_model
    from ftplan.job import Job, Layout

    m = resolve_model("llama-3.1-8b")
    job = Job(method="lora")
    one = estimate_memory(m, job, Layout())
    assert one.components["nccl_buffers"] == 0
    z3 = estimate_memory(m, job, Layout(8, 1, "zero3"))
    # the device total is what the fit compares: reserved + context + communicators
    assert z3.device_total_bytes == z3.peak_reserved_bytes + z3.components["cuda_context"] + \
        z3.components["nccl_buffers"]
    assert any("NCCL communicators" in n for n in z3.notes)
