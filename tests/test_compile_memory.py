"""torch.compile's saved activations against real PyTorch on CPU.

Each decoder layer of a tiny real Hugging Face model is compiled (``torch.compile(layer)``, as
torchtitan and torchtune compile each transformer block) with ``backend="aot_eager"``, which in
torch 2.13 partitions with ``min_cut_rematerialization_partition`` as inductor does (inductor
saves the same bytes on these layers: ``benchmarks/compile_saved_cpu.py --inductor``, by hand, as
inductor compiles too slowly for CI; not on a compiled loss, where only inductor's decompositions
let the partitioner recompute the log-softmax: benchmarks/notes/compile_saved.md). What the compiled layers save is counted through
``saved_tensors_hooks`` (AOTAutograd's ``CompiledFunction`` saves through
``ctx.save_for_backward``, so the hooks see every tensor) and must equal ftplan's compiled rule
(``memory._compiled_layer_saved_bytes``) exactly: full fine-tuning (HF Trainer's autocast: llama;
pure bf16 with per-head q/k norms: qwen3), PEFT LoRA with dropout (q/k/v biases and tied
embeddings: qwen2), and checkpointing (each checkpointed layer keeps only its input, as eager). The
embedding, the final norm, the head and the loss run eager, as in a per-block compile. LoRA
without dropout, more families and inductor itself are in the by-hand script (PEFT's layers make
a LoRA compile take ~10 s here).
"""

from __future__ import annotations

import functools

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")

import ftplan.measure.torchref as TR  # noqa: E402
from ftplan.measure.compileref import CompiledSaved, compiled_saved  # noqa: E402
from ftplan.job import Job, LoraSpec  # noqa: E402
from ftplan.memory import (_autocast_weight_elems, _head_copy_elems, estimate_memory, model_states,  # noqa: E402
                           saved_activation_bytes)
from ftplan.model import model_from_config  # noqa: E402

pytestmark = pytest.mark.torch


@functools.lru_cache(maxsize=None)
def _measure(family: str, method: str, precision: str, dropout: float, ckpt: bool) -> CompiledSaved:
    """One compiled model's forward, measured once per module run."""
    r = compiled_saved(TR.TINY_CONFIGS[family], method=method, precision=precision, dropout=dropout,
                       gradient_checkpointing=ckpt, backend="aot_eager", batch=2, seq_len=24)
    assert r.checkpoint_calls == (TR.TINY_CONFIGS[family]["num_hidden_layers"] if ckpt else 0)
    return r


def _job(family, method, precision, dropout, ckpt, batch=2, seq=24):
    return Job(method=method, precision=precision, micro_batch=batch, seq_len=seq, gradient_checkpointing=ckpt,
               attn_impl="sdpa", lora=LoraSpec(r=8, alpha=16, dropout=dropout), loss="hf", torch_compile=True)


def _weight_copies(spec, job) -> int:
    """Autocast's compute-dtype weight copies the layers save (compiled as eager: every matmul
    weight's in full fine-tuning, the adapters' under LoRA), checked against eager PyTorch in
    tests/test_memory_vs_torch.py; counted with the weights, not the activations."""
    if not job.precision.endswith("-mixed"):
        return 0
    if job.method == "full" and job.gradient_checkpointing:
        return 2 * _head_copy_elems(spec, job)  # the checkpointed layers' copies are remade in backward
    if job.method == "full":
        return 2 * _autocast_weight_elems(spec, backend="cpu")
    return model_states(spec, job).master_weights


CASES = [
    ("llama", "full", "bf16-mixed", 0.0, False),
    ("qwen2", "lora", "bf16-mixed", 0.05, False),
    ("qwen3", "full", "bf16", 0.0, False),
    ("llama", "full", "bf16-mixed", 0.0, True),
]


@pytest.mark.parametrize("family,method,precision,dropout,ckpt", CASES)
def test_compiled_saved_activations_exact(family, method, precision, dropout, ckpt):
    spec = model_from_config(TR.TINY_CONFIGS[family])
    job = _job(family, method, precision, dropout, ckpt)
    r = _measure(family, method, precision, dropout, ckpt)
    assert _weight_copies(spec, job) == r.weight_copy_bytes
    assert saved_activation_bytes(spec, job, backend="cpu") == r.saved_bytes - r.weight_copy_bytes


def test_compile_saves_less_than_eager():
    """The partitioner's point: without checkpointing a compiled llama layer saves less than eager
    (the norms' fp32 upcasts and normalised tensors, SiLU's output are recomputed)."""
    spec = model_from_config(TR.TINY_CONFIGS["llama"])
    job = _job("llama", "full", "bf16-mixed", 0.0, False)
    assert saved_activation_bytes(spec, job, backend="cpu") < saved_activation_bytes(
        spec, job.with_(torch_compile=False), backend="cpu")


def test_compile_note_says_what_is_modelled():
    spec = model_from_config(TR.TINY_CONFIGS["llama"])
    notes = estimate_memory(spec, _job("llama", "full", "bf16-mixed", 0.0, False)).notes
    assert any(n.startswith("torch.compile: decoder layers' saved activations as AOTAutograd") for n in notes)
    moe = model_from_config(TR.TINY_CONFIGS["mixtral"])
    job = _job("mixtral", "lora", "bf16-mixed", 0.0, False)
    notes = estimate_memory(moe, job).notes
    assert any(n.startswith("torch.compile: saved activations planned as eager") and "MoE" in n for n in notes)
    assert saved_activation_bytes(moe, job) == saved_activation_bytes(moe, job.with_(torch_compile=False))
