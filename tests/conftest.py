"""Shared test setup.

* ``tests/`` is on ``sys.path`` for every test module, also those in sub-folders, so helper
  modules kept here (``_check_catalog_params.py``, ...) import the same from anywhere.
* ``.venv/validators`` (axolotl's and LLaMA-Factory's config validators, installed there without
  their dependencies by the README test command: ``tests/validators.txt``) goes at the END of
  ``sys.path`` when it exists, so the export checks run the owners' parsers; nothing else can be
  shadowed by it.
* The ``slow`` marker (registered in pyproject.toml) goes on the long benchmark-style and
  end-to-end tests listed in :data:`SLOW`. They run by default, as CI runs everything;
  ``pytest -m "not slow"`` leaves them out for a quick loop.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
pytest.register_assert_rewrite("family_checks")  # its asserts report their operands, as a test module's do
VALIDATORS = HERE.parent / ".venv" / "validators"
if VALIDATORS.is_dir() and str(VALIDATORS) not in sys.path:
    sys.path.append(str(VALIDATORS))

#: node-id fragments of the slow tests (each takes 15-45 s on the 2-core CI machine)
SLOW = (
    "test_accuracy_bench.py::",  # runs benchmarks/accuracy.py end to end, with and without peers
    "test_train.py::test_train_full_chat_end_to_end",  # real TRL training runs on CPU
    "test_train.py::test_train_lora_end_to_end",
    "test_measure_run.py::test_matrix_resumes_and_builds_once",  # a resumable measurement campaign
    "test_planner.py::test_adding_an_offer_never_makes_best_worse",  # searches over random offer sets
    "test_planner.py::test_constraints_and_pareto",
    "test_planner.py::test_cost_is_price_times_gpus_times_time",
    "test_plot.py::test_recommend_png_and_svg",  # a full search, then matplotlib
    "test_distributed_memory.py::",  # multi-process gloo runs (one 2-rank and one 4-rank spawn)
    "test_tp_memory.py::",  # two gloo processes load and step a tensor-parallel model
    "test_export_targets.py::test_best_plan_exports_and_parses",  # four searches, every target parsed
    "test_expert_parallel.py::test_ep_memory_matches_the_gloo_run",  # 2 gloo processes, transformers EP
    "test_olmo.py::test_fsdp2_casts_the_fp32_rope_tables_at_every_layer",  # 2 gloo processes, FSDP2
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if any(s in item.nodeid for s in SLOW):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def ep_gloo_runs(request: pytest.FixtureRequest) -> dict:
    """Every expert-parallel gloo case of the session in ONE two-process spawn
    (:func:`ftplan.measure.ep_run.run_ep_cases`; the spawn's imports cost ~14 s of CPU, a case
    ~0.5 s): the union of the ``EP_GLOO_CASES`` dicts (label -> case) of the collected test modules
    (tests/test_expert_parallel.py, tests/test_ep_lora.py). Per label the per-rank measurements or
    the error text a rank raised."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftplan.measure.ep_run import run_ep_cases

    cases: dict = {}
    for mod in dict.fromkeys(item.module for item in request.session.items if getattr(item, "module", None)):
        cases.update(getattr(mod, "EP_GLOO_CASES", {}))
    return run_ep_cases(cases, world=2, ep=2, batch=2, seq=32)


# One intra-op thread for the whole session and the processes it starts (CLI subprocesses, gloo
# spawns inherit the environment): the tests run tiny models, where a second OpenMP thread only adds
# synchronisation. How much it costs depends on what else runs: on the shared 2-core machine
# (session 18) tests/test_checkpointing_vs_torch.py took 69 s with two threads and 33 s with one
# under load ~7, but 10-12 s either way at load ~3 (user time still ~15 % lower with one).
# Byte counts do not depend on it. An OMP_NUM_THREADS set by the caller is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported by a plugin before this file: its pool is sized already
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
