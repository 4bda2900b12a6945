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


@pytest.mark.torch
@pytest.mark.parametrize("name", sorted(CATALOG))
def test_tiny_config_of_every_catalog_entry_builds(name):
    """``ftplan measure NAME --tiny``: the catalog entry's tiny config builds in transformers (token
    ids and LongRoPE factors shrunk with the vocabulary and the head) and ftplan counts its
    parameters as transformers does."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from ftplan.measure.configs import tiny_config
    from ftplan.measure.torchref import build_model, params_by_category
    from ftplan.model import model_from_config

    tiny = tiny_config(CATALOG[name].config)
    assert model_from_config(tiny).params.by_category() == params_by_category(build_model(tiny, device="meta"))


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


def test_gpt_oss_counts_match_the_model_card():
    """gpt-oss model card (arXiv 2508.10925, table 1): 20.91B / 116.83B parameters in all, 3.61B /
    5.13B active; the card leaves the 0.58B embedding out of the active count, ftplan counts it."""
    for name, total_b, active_b in (("gpt-oss-20b", 20.91, 3.61), ("gpt-oss-120b", 116.83, 5.13)):
        p = CATALOG[name].spec().params
        assert round(p.total / 1e9, 2) == total_b
        assert round((p.active - p.embedding) / 1e9, 2) == active_b
