"""The dataset side of planning (``ftplan.dataset``) held against the real data pipeline.

A generated JSONL file and a BPE tokenizer trained locally with ``tokenizers`` (no hub) are run
through TRL's own ``SFTTrainer._prepare_dataset`` (EOS, tokenization, truncation, bfd packing)
and collator (``DataCollatorForLanguageModeling``, padded and padding-free) in a real
``torch.utils.data.DataLoader``; ftplan's sample lengths, packs, micro-batch shapes and real vs
computed token counts must match exactly. Peak memory follows the largest batch the loader
forms, not ``--seq-len``. Malformed and huge files give one clear error or a stated sample.
"""

from __future__ import annotations

import json
import random
import types
import warnings

import pytest

from ftplan.catalog.models import resolve_model as load_model
from ftplan.dataset import (
    BATCHINGS,
    bfd_pack,
    plan_dataset,
    profile_dataset,
    profile_from_lengths,
    simulate_batches,
)
from ftplan.errors import ConfigError
from ftplan.job import Job, Layout
from ftplan.memory import estimate_memory

WORDS = ["alpha", "beta", "gamma", "delta", "omega", "tok", "fine", "tune", "plan", "gpu", "memory", "batch"]


def _write_texts(path, n=300, seed=1, longest=None):
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            k = min(int(rng.paretovariate(1.3) * 8), 600)
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(k))}) + "\n")
        if longest:
            f.write(json.dumps({"text": " ".join(WORDS[i % len(WORDS)] for i in range(longest))}) + "\n")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tokenizers = pytest.importorskip("tokenizers")
    d = tmp_path_factory.mktemp("ds")
    data = _write_texts(d / "d.jsonl")
    from tokenizers import models, pre_tokenizers, processors, trainers

    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train([str(data)], trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", tok.token_to_id("<s>"))])
    tok.save(str(d / "tokenizer.json"))
    return d, data, d / "tokenizer.json"


def _trl_prepared(data, tokenizer, max_length, packing):
    pytest.importorskip("trl")
    datasets = pytest.importorskip("datasets")
    from transformers import PreTrainedTokenizerFast
    from trl import SFTConfig
    from trl.trainer.sft_trainer import SFTTrainer

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer), bos_token="<s>", eos_token="</s>",
                                 pad_token="<pad>", unk_token="<unk>")
    ds = datasets.load_dataset("json", data_files=str(data), split="train")
    args = SFTConfig(output_dir=str(data.parent / "out"), max_length=max_length, packing=packing,
                     report_to=[], use_cpu=True, disable_tqdm=True)
    # the trainer's own preparation, without building a model around it
    ns = types.SimpleNamespace(_tokenizer=hf, chat_template=None, completion_only_loss=None,
                               _is_vision_dataset=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return hf, SFTTrainer._prepare_dataset(ns, ds, hf, args, packing, None, "train")


def _loader_batches(prepared, hf, micro_batch, padding_free):
    torch = pytest.importorskip("torch")
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    coll = DataCollatorForLanguageModeling(pad_token_id=hf.pad_token_id, padding_free=padding_free)
    cols = ["input_ids"] + (["seq_lengths"] if "seq_lengths" in prepared.column_names else [])
    rows = prepared.select_columns(cols).to_list()
    return list(torch.utils.data.DataLoader(rows, batch_size=micro_batch, shuffle=False, collate_fn=coll))


@pytest.mark.torch
def test_lengths_packs_and_batches_match_trl(corpus):
    d, data, tok = corpus
    max_length, mb = 128, 4
    prof = profile_dataset(data, tokenizer=tok, family="llama")
    assert prof.counter == "tokenizer.json" and not prof.sampled and prof.total_samples == 300

    # sample lengths: TRL's EOS + tokenization + truncation
    hf, prepared = _trl_prepared(data, tok, max_length, packing=False)
    trl_lens = [len(x) for x in prepared["input_ids"]]
    assert [min(x, max_length) for x in prof.lengths] == trl_lens

    # padded to the longest of each micro-batch, file order: shapes and token counts
    batches = _loader_batches(prepared, hf, mb, padding_free=False)
    real = sum(int(b["attention_mask"].sum()) for b in batches)
    computed = sum(b["input_ids"].numel() for b in batches)
    sim = simulate_batches(prof, "longest", max_length, mb, order="sequential")
    assert (sim.micro_batches, sim.real_tokens, sim.computed_tokens) == (len(batches), real, computed)
    worst = max(batches, key=lambda b: b["input_ids"].numel())
    assert tuple(worst["input_ids"].shape) == (sim.peak_rows, sim.peak_seq_len)
    assert sim.peak_seq_len < max_length or max(prof.lengths) >= max_length

    # padding-free without packing: one row per micro-batch
    pf = _loader_batches(prepared, hf, mb, padding_free=True)
    simpf = simulate_batches(prof, "padding-free", max_length, mb, order="sequential")
    assert all(b["input_ids"].shape[0] == 1 for b in pf)
    assert simpf.computed_tokens == sum(b["input_ids"].numel() for b in pf) == real
    assert simpf.peak_seq_len >= max(b["input_ids"].shape[1] for b in pf)

    # TRL bfd packing: the same packs, and padding-free rows of packs
    hf, packed = _trl_prepared(data, tok, max_length, packing=True)
    trl_packs = [len(x) for x in packed["input_ids"]]
    mine = [sum(b) for b in bfd_pack([min(x, max_length) for x in prof.lengths], max_length)]
    assert mine == trl_packs
    simp = simulate_batches(prof, "packed", max_length, mb, order="sequential")
    pb = _loader_batches(packed, hf, mb, padding_free=True)
    assert simp.packs == len(trl_packs) and simp.micro_batches == len(pb)
    assert simp.real_tokens == simp.computed_tokens == sum(b["input_ids"].numel() for b in pb) == real
    # the largest packed micro-batch any order can form: the mb fullest packs in one row
    assert simp.peak_rows == 1 and simp.peak_seq_len == sum(sorted(trl_packs, reverse=True)[:mb])
    assert max(b["input_ids"].shape[1] for b in pb) <= simp.peak_seq_len
    # packing wastes no compute; padding to max_length wastes most
    padded = simulate_batches(prof, "padded", max_length, mb, order="sequential")
    assert padded.computed_tokens == len(trl_lens) * max_length
    assert simp.computed_tokens < sim.computed_tokens < padded.computed_tokens


def test_peak_memory_follows_the_longest_batch(tmp_path):
    model = load_model("llama-3.1-8b")
    data = _write_texts(tmp_path / "d.jsonl", n=200, seed=3)
    prof = profile_dataset(data, family="llama", model_name="llama-3.1-8b")
    lmax = prof.max_length
    seq = 4096
    assert lmax < seq
    job = Job(method="lora", seq_len=seq, micro_batch=4, gradient_checkpointing=True)
    lay = Layout()
    # micro-batches of uneven rows are padded: the plan carries the attention mask (padded_batches)
    at_seq = estimate_memory(model, job.with_(padded_batches=True), lay).device_total_bytes
    # padded and bucketed batches peak at the longest sample, whatever --seq-len says
    for batching in ("longest", "bucketed"):
        b = simulate_batches(prof, batching, seq, job.micro_batch)
        p = plan_dataset(model, job, b, lay)
        assert (p.memory_job.micro_batch, p.memory_job.seq_len) == (4, lmax)
        assert p.memory_job.padded_batches
        assert p.memory.device_total_bytes == estimate_memory(model, job.with_(seq_len=lmax, padded_batches=True),
                                                              lay).device_total_bytes
        assert p.memory.device_total_bytes < at_seq
    # padding to max_length peaks at --seq-len
    p = plan_dataset(model, job, simulate_batches(prof, "padded", seq, 4), lay)
    assert p.memory.device_total_bytes == at_seq
    # one longer sample in the file moves the peak, with --seq-len unchanged
    data2 = _write_texts(tmp_path / "d2.jsonl", n=200, seed=3, longest=1500)
    prof2 = profile_dataset(data2, family="llama", model_name="llama-3.1-8b")
    assert prof2.max_length > lmax
    p2 = plan_dataset(model, job, simulate_batches(prof2, "longest", seq, 4), lay)
    assert p2.memory_job.seq_len == prof2.max_length
    assert p2.memory.device_total_bytes > estimate_memory(model, job.with_(seq_len=lmax), lay).device_total_bytes
    # packing fills rows up to max_length: the peak is the packed row, the compute has no padding
    pk = simulate_batches(prof, "packed", 1024, 4)
    assert pk.padding_fraction == 0.0 and pk.peak_rows == 1 and pk.peak_seq_len <= 4 * 1024


def test_time_and_cost_follow_real_tokens():
    from ftplan.catalog.gpus import load_gpus
    from ftplan.catalog.offers import load_offers

    model = load_model("qwen2.5-7b")
    prof = profile_from_lengths([50] * 90 + [2000] * 10)
    job = Job(method="lora", seq_len=2048, micro_batch=8, gradient_checkpointing=True, epochs=2)
    gpu = load_gpus()["h100-sxm"]
    offer = next(o for o in load_offers() if o.gpu == "h100-sxm" and o.gpus_per_instance == 1)
    plans = {b: plan_dataset(model, job, simulate_batches(prof, b, 2048, 8), Layout(), gpu=gpu, offer=offer)
             for b in ("padded", "longest", "packed")}
    real = plans["padded"].batches.real_tokens
    assert all(p.batches.real_tokens == real == 50 * 90 + 2000 * 10 for p in plans.values())
    # padding wastes compute: more computed tokens, more hours, more $ per real token
    assert plans["padded"].runtime.hours > plans["longest"].runtime.hours > plans["packed"].runtime.hours
    assert plans["padded"].usd_per_million_real_tokens > plans["packed"].usd_per_million_real_tokens
    # the job's tokens are the computed ones x epochs
    assert plans["padded"].runtime.total_tokens == 2 * 100 * 2048


def test_cutoff_and_histogram():
    prof = profile_from_lengths(list(range(1, 101)))
    assert prof.cutoff(95) == 95 and prof.cutoff(100) == 100 and prof.percentile(50) == 50
    assert prof.untruncated_fraction(95) == 0.95
    h = prof.histogram([0, 10, 50, 100])
    assert [c for _, _, c in h] == [10, 40, 50]
    with pytest.raises(ConfigError):
        prof.percentile(0)


def test_kinds_and_estimate(tmp_path):
    from ftplan.catalog.tokenization import token_estimate

    est = token_estimate("qwen3-8b", "qwen3")
    msgs = tmp_path / "chat.jsonl"
    text = "x" * 4000
    msgs.write_text(json.dumps({"messages": [{"role": "user", "content": text[:2000]},
                                             {"role": "assistant", "content": text[2000:]}]}) + "\n")
    p = profile_dataset(msgs, model_name="qwen3-8b", family="qwen3")
    assert p.kind == "messages" and p.counter == "estimate"
    assert p.lengths[0] == -(-4000 // est.chars_per_token) + 2 * est.per_turn + est.per_conversation
    pc = tmp_path / "pc.jsonl"
    pc.write_text(json.dumps({"prompt": "a" * 100, "completion": "b" * 100}) + "\n")
    assert profile_dataset(pc, family="qwen3").kind == "prompt-completion"
    # an exotic model family without its own entry falls back to a clear error only when unknown
    with pytest.raises(ConfigError):
        token_estimate(None, "no-such-family")


def test_bad_files_give_one_clear_error(tmp_path, monkeypatch):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": oops}\n')
    with pytest.raises(ConfigError, match="line 2 is not valid JSON"):
        profile_dataset(bad, family="llama")
    cols = tmp_path / "cols.jsonl"
    cols.write_text('{"body": "x"}\n')
    with pytest.raises(ConfigError, match="no text, messages"):
        profile_dataset(cols, family="llama")
    notobj = tmp_path / "list.jsonl"
    notobj.write_text('[1, 2]\n')
    with pytest.raises(ConfigError, match="JSON object"):
        profile_dataset(notobj, family="llama")
    with pytest.raises(ConfigError, match="not found"):
        profile_dataset(tmp_path / "missing.jsonl", family="llama")
    with pytest.raises(ConfigError, match="unknown dataset format"):
        (tmp_path / "x.csv").write_text("a,b\n")
        profile_dataset(tmp_path / "x.csv", family="llama")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    with pytest.raises(ConfigError, match="no samples"):
        profile_dataset(empty, family="llama")
    # a line longer than the bound is refused, not read into memory
    import ftplan.dataset as D

    monkeypatch.setattr(D, "MAX_LINE_BYTES", 1000)
    huge = tmp_path / "huge.jsonl"
    huge.write_text('{"text": "a"}\n' + json.dumps({"text": "y" * 5000}) + "\n")
    with pytest.raises(ConfigError, match="line 2 is longer than"):
        profile_dataset(huge, family="llama")
    with pytest.raises(ConfigError, match="not a valid tokenizer.json"):
        (tmp_path / "tok.json").write_text("{}")
        profile_dataset(tmp_path / "x.jsonl" if False else bad, tokenizer=tmp_path / "tok.json", family="llama")


def test_big_file_is_sampled_with_the_longest_kept(tmp_path):
    f = _write_texts(tmp_path / "big.jsonl", n=3000, seed=5, longest=900)
    full = profile_dataset(f, family="llama")
    s = profile_dataset(f, family="llama", max_samples=500)
    assert s.sampled and s.measured == 500 and s.total_samples == 3001 and "seed 0" in s.sampling
    assert s.max_length == full.max_length  # the longest line is always measured
    assert abs(s.total_tokens - full.total_tokens) / full.total_tokens < 0.15
    b = simulate_batches(s, "packed", 512, 2)
    assert b.real_tokens == pytest.approx(sum(min(x, 512) for x in full.lengths), rel=0.15)


def test_parquet_and_datasets_folder_read_like_jsonl(tmp_path):
    pytest.importorskip("pyarrow")
    datasets = pytest.importorskip("datasets")
    f = _write_texts(tmp_path / "d.jsonl", n=120, seed=7)
    ref = profile_dataset(f, family="llama").lengths
    ds = datasets.load_dataset("json", data_files=str(f), split="train")
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert profile_dataset(tmp_path / "d.parquet", family="llama").lengths == ref
    ds.save_to_disk(str(tmp_path / "saved"))
    p = profile_dataset(tmp_path / "saved", family="llama")
    assert p.lengths == ref and p.file_format == "arrow"
    datasets.DatasetDict({"train": ds}).save_to_disk(str(tmp_path / "dd"))
    assert profile_dataset(tmp_path / "dd", family="llama").lengths == ref


def test_batching_orders_and_errors():
    prof = profile_from_lengths([10, 200, 30, 40, 500, 60, 70, 80] * 25)
    got = {b: simulate_batches(prof, b, 256, 4, grad_accum=2) for b in BATCHINGS}
    assert all(g.real_tokens == got["padded"].real_tokens for g in got.values())
    assert got["padded"].computed_tokens >= got["longest"].computed_tokens >= got["bucketed"].computed_tokens
    assert got["bucketed"].computed_tokens >= got["packed"].computed_tokens == got["packed"].real_tokens
    assert got["longest"].truncated_samples == 25 and got["longest"].truncated_tokens == 25 * (500 - 256)
    with pytest.raises(ConfigError) as e:
        simulate_batches(prof, "packd", 256, 4)
    assert "did you mean 'packed'" in e.value.one_line()


def test_recommend_plans_from_the_dataset(tmp_path):
    from ftplan.catalog.offers import load_offers
    from ftplan.planner import recommend

    model = resolve_model_for_test("qwen2.5-7b")
    prof = profile_from_lengths([100] * 900 + [3000] * 100)
    job = Job(method="lora", seq_len=4096)
    offers = [o for o in load_offers() if o.gpu == "h100-sxm" and o.gpus_per_instance == 1][:2]
    for batching in ("longest", "packed"):
        ps = recommend(model, job, offers, dataset=prof, batching=batching)
        assert ps.plans
        for p in ps.plans:
            b = simulate_batches(prof, batching, 4096, p.job.micro_batch, grad_accum=p.job.grad_accum)
            mj = b.memory_job(p.job)
            if b.padding_free:
                mj = mj.with_(attn_impl="flash")
            assert p.memory == estimate_memory(model, mj, p.layout)
            assert p.runtime.total_tokens == b.computed_tokens
            assert p.cost.usd_per_million_tokens == pytest.approx(p.cost.usd / b.real_tokens * 1e6)
    with pytest.raises(ConfigError):
        recommend(model, job, offers, dataset=prof, batching="nope")


def resolve_model_for_test(name):
    return load_model(name)


def test_fit_reports_the_cutoff_keeping_n_percent():
    from ftplan.catalog.gpus import load_gpus
    from ftplan.planner import fit

    prof = profile_from_lengths(list(range(1, 1001)) + [200_000])
    r = fit(load_model("qwen2.5-0.5b"), Job(method="lora", seq_len=1024), load_gpus()["h100-sxm"], dataset=prof,
            keep_pct=(95, 100))
    assert r.seq_len_cutoffs == {95.0: prof.cutoff(95), 100.0: 200_000}
    assert any("95 % of the samples untruncated: `seq_len=951` fits one GPU" in n for n in r.notes)
    assert any("100 % of the samples untruncated: `seq_len=200000` does not fit" in n for n in r.notes)
