"""``ftplan measure`` / ``ftplan train`` resolve the job's automatic defaults from the model, as
``estimate`` does: LoRA dropout 0 where PEFT wraps a transformers-5 MoE model's fused experts
(ParamWrapper refuses dropout), 0.05 elsewhere."""

from __future__ import annotations

import pytest

from ftplan import api
from ftplan.cli.measure import _row_job


@pytest.mark.parametrize("model,dropout", [("mixtral-8x7b", 0.0), ("qwen3-30b-a3b", 0.0), ("llama-3.2-1b", 0.05)])
def test_matrix_row_gets_the_models_lora_dropout(model, dropout):
    job = _row_job({"model": model, "method": "lora"}, "matrix.yaml: row 1")
    assert job.lora.dropout == dropout
    # an explicit value is kept
    assert _row_job({"model": model, "method": "lora", "lora_dropout": 0.1}, "row").lora.dropout == 0.1


@pytest.mark.parametrize("model,dropout", [("mixtral-8x7b", 0.0), ("llama-3.2-1b", 0.05)])
def test_measure_passes_the_models_lora_dropout(monkeypatch, model, dropout):
    import ftplan.measure.run as run

    seen = {}

    def fake_measure(model_ref, job, layout, **kw):
        seen["job"] = job
        return {"outcome": "ok"}

    monkeypatch.setattr(run, "measure", fake_measure)
    api.measure(model, method="lora", tiny=True)
    assert seen["job"].lora.dropout == dropout


def test_unresolvable_model_leaves_the_default_to_the_run():
    assert api._spec_for_defaults("no-such-model-xyz") is None
    assert api._spec_for_defaults(None) is None
