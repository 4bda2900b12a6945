"""Parameter counts of every bundled model equal what transformers builds on the meta device."""

from __future__ import annotations

import pytest

from ftplan.catalog.models import load_model_catalog

CATALOG = load_model_catalog()


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_params_by_category_match_transformers(name):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftplan.measure.torchref import build_model, params_by_category

    entry = CATALOG[name]
    spec = entry.spec()
    real = build_model(entry.config, device="meta")
    expected = params_by_category(real)
    assert spec.params.by_category() == expected
    assert spec.params.total == sum(expected.values())
    if entry.published_params is not None and name != "deepseek-v3":
        assert spec.params.total == entry.published_params


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_entry_is_sane(name):
    entry = CATALOG[name]
    spec = entry.spec()
    p = spec.params
    assert entry.source.startswith("http")
    assert p.total > 1e8
    assert 0 < p.active <= p.total
    assert (p.active < p.total) == spec.is_moe
    assert p.lm_head == (0 if spec.tie_word_embeddings else p.embedding)


def test_llama_3_1_70b_reference_count():
    # published: 70,553,706,496 (Meta / HF safetensors metadata)
    assert CATALOG["llama-3.1-70b"].spec().params.total == 70_553_706_496
