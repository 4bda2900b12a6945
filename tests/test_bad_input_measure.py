"""``ftplan measure`` refuses bad run options and setups before anything runs or is recorded
(issue 16, item 10), and the planner's shared SearchCache changes no plan (item 12)."""

from __future__ import annotations

import importlib.util
import random

import pytest

import ftplan.measure.run as mrun
from ftplan.errors import ConfigError, FtplanError
from ftplan.job import Job

TORCH = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("transformers") is not None


@pytest.mark.parametrize("kwargs, words", [
    ({"steps": 0}, "steps"),
    ({"steps": 10**9}, "steps"),
    ({"steps": 2.5}, "steps"),
    ({"warmup": -1}, "warmup"),
    ({"seed": 2**40}, "seed"),
    ({"out": "/nonexistent-folder/r.jsonl"}, "does not exist"),
    ({"out": "a\rb.jsonl"}, "control"),
])
def test_run_options_are_refused_before_the_model(tmp_path, kwargs, words, monkeypatch):
    monkeypatch.setattr(mrun, "import_torch", lambda: pytest.fail("torch imported before the options were checked"))
    with pytest.raises(ConfigError, match=words):
        mrun.measure("llama-3.2-1b", Job(), **kwargs)


@pytest.mark.parametrize("job, words", [
    (Job(loss="hf-legacy"), "transformers < 4.46"),
    (Job(loss="hf", keep_output=True), "drops the model output"),
    (Job(loss="liger"), "liger-kernel"),
])
def test_jobs_measure_does_not_run_are_refused_before_torch(tmp_path, job, words, monkeypatch):
    """ftplan measure runs HF Trainer's step on the installed transformers: a loss path or loop it
    cannot run is bad input, refused before torch is imported and never recorded."""
    monkeypatch.setattr(mrun, "import_torch", lambda: pytest.fail("torch imported before the job was checked"))
    out = tmp_path / "records.jsonl"
    with pytest.raises(ConfigError, match=words):
        mrun.measure("llama-3.2-1b", job, out=str(out))
    assert not out.exists()


def test_out_that_is_a_folder(tmp_path):
    with pytest.raises(ConfigError, match="not a regular file"):
        mrun.check_run_options(1, None, 0, str(tmp_path))


@pytest.mark.skipif(not TORCH, reason="needs torch and transformers")
def test_setup_errors_are_not_recorded_as_outcomes(tmp_path, monkeypatch):
    out = tmp_path / "records.jsonl"
    with pytest.raises(ConfigError, match="attn=flash"):
        mrun.measure("llama-3.2-1b", Job(attn_impl="flash"), device="cpu", tiny=True, steps=1, out=str(out))
    real = importlib.util.find_spec
    monkeypatch.setattr(mrun.importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(FtplanError, match="needs the peft package"):
        mrun.measure("llama-3.2-1b", Job(method="lora"), device="cpu", tiny=True, steps=1, out=str(out))
    assert not out.exists()  # nothing recorded: these are inputs, not measurements


def test_search_cache_changes_no_plan():
    """Searches sharing a SearchCache (as the web app's do) return exactly the plans, runtimes,
    costs and why-not of searches without it, whatever the order and the data sizes."""
    from ftplan.catalog.models import get_model
    from ftplan.catalog.offers import load_offers
    from ftplan.job import LoraSpec
    from ftplan.planner import SearchCache, recommend

    offers = load_offers()
    rng = random.Random(3)
    cases = []
    for _ in range(5):
        name = rng.choice(["llama-3.2-1b", "qwen2.5-0.5b", "qwen3-30b-a3b", "llama-3.1-8b"])
        method = rng.choice(["full", "lora", "qlora"])
        lora = LoraSpec(dropout=0.0) if name == "qwen3-30b-a3b" else LoraSpec()
        cases.append((name, Job(method=method, seq_len=rng.choice([512, 2048]), lora=lora,
                                dataset_tokens=rng.choice([10**5, 10**7, 123_457]), epochs=rng.choice([1.0, 2.5])),
                       {"objective": rng.choice(["cost", "time"]), "global_batch": rng.choice([None, 64]),
                        "max_gpus": rng.choice([None, 16])}))

    def sig(ps):
        return [(p.offer, p.layout, p.job, p.memory, p.runtime, p.cost, p.cheapest, p.fastest, p.pareto, p.notes)
                for p in ps.plans], ps.infeasible, ps.stats.memory_evals, ps.stats.runtime_evals, ps.stats.candidates

    want = [sig(recommend(get_model(m).spec(), j, offers, **kw)) for m, j, kw in cases]
    cache = SearchCache()
    for order in (cases, cases[::-1]):
        for m, j, kw in order:
            got = sig(recommend(get_model(m).spec(), j, offers, cache=cache, **kw))
            assert got == want[cases.index((m, j, kw))]
    assert cache.hits > 0
