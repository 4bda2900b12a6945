"""ftplan's memory model against the peaks measured on a real GPU (no GPU needed to run this).

``benchmarks/measurements/h100-sxm-*.jsonl`` hold ``ftplan measure`` records taken on one NVIDIA
H100 80GB HBM3 (torch 2.11, transformers 5.23, peft 0.21.2, trl 1.16, bitsandbytes 0.50.2; random
weights, ftplan's printed defaults unless a row says otherwise; see the matrices in
``benchmarks/matrices/``). ``ftplan validate`` re-predicts each record with the current formulas;
these tests hold the predictions to stated tolerances, so that a formula change that moves a
measured configuration out of them fails here. ``campaign1``, ``throughput1``, ``large``,
``eager1`` and the two peak-anatomy files are what the QLoRA, eager-attention and full
fine-tuning terms were read from; ``holdout1`` was measured before them (its eager-attention row
prompted ``eager1``; its other rows were not used to write them), and ``holdout2`` after them (its attention-only LoRA row then gave the frozen down
projection's working set, so that row is no longer held out); ``moe1`` (a 30B MoE with PEFT's
wrapped fused experts) is held out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftplan.measure import validate as V
from ftplan.measure.records import load_records

ROOT = Path(__file__).resolve().parents[2]
FILES = sorted((ROOT / "benchmarks" / "measurements").glob("h100-sxm-*.jsonl"))
#: peak allocated, % of measured: never more than this below (a false fit is the costly error)...
UNDER_PCT = 3.0
#: ... nor more than this above
OVER_PCT = 5.0


def _rows() -> list[dict]:
    recs, problems = load_records(FILES)
    assert not problems, problems
    latest, _ = V.latest_per_configuration(recs)
    return [V.evaluate_record(r) for r in latest]


ROWS = _rows()


def test_the_gpu_campaigns_are_there():
    names = {f.name for f in FILES}
    assert {"h100-sxm-campaign1.jsonl", "h100-sxm-large.jsonl", "h100-sxm-throughput1.jsonl",
            "h100-sxm-holdout1.jsonl", "h100-sxm-eager1.jsonl", "h100-sxm-holdout2.jsonl", "h100-sxm-moe1.jsonl"} <= names
    ok = [r for r in ROWS if r["outcome"] == "ok"]
    assert len(ok) >= 88
    assert {r["method"] for r in ok} == {"full", "lora", "qlora"}


@pytest.mark.parametrize("row", [r for r in ROWS if r["outcome"] == "ok"],
                         ids=lambda r: r["source"].split("/")[-1])
def test_peak_allocated_within_the_stated_band(row):
    err = row["peak_allocated_err_pct"]
    assert -UNDER_PCT <= err <= OVER_PCT, (row["model"], row["job"], err)


@pytest.mark.parametrize("row", [r for r in ROWS if r["outcome"] == "ok"],
                         ids=lambda r: r["source"].split("/")[-1])
def test_model_states_and_saved_activations_exact(row):
    """The tensors ftplan counts one by one (parameters, gradients, optimizer states; what autograd
    saves in the forward) equal the measured ones: 0 % (eager attention's saved set on gemma2,
    whose soft-capping ftplan counts as one more score-sized tensor, within 3 %)."""
    assert abs(row["model_states_err_pct"]) < 0.01
    if row["activations_err_pct"] is not None:
        assert abs(row["activations_err_pct"]) < 3.0


def test_out_of_memory_runs_were_predicted_not_to_fit():
    ooms = [r for r in ROWS if r["outcome"] == "oom"]
    assert ooms
    assert not any(r["false_fit"] for r in ROWS)
    assert all(r["predicted_fits"] is False for r in ooms), [(r["model"], r["job"]) for r in ooms]
