"""torchtune's chunked-output cross-entropy (``loss=torchtune``) against real PyTorch on CPU.

``benchmarks/measurements/torchtune_loss_cpu.json`` (``benchmarks/torchtune_loss_cpu.py``, torchtune
0.3.1's loss and norm files loaded as they are) holds the bytes of torchtune's tail (final norm,
output projection per chunk, ``CEWithChunkedOutputLoss``) in bf16 for a frozen and a trained head,
eager, aot_eager and inductor (torchtune's ``compile: True``), four shapes (one whose sequence is
not a multiple of the 8 chunks). ftplan's ``(saved, forward transient, backward transient)`` must
give the bytes after the forward, the forward's peak and the step's peak. One eager case is
re-measured live (~1 s, the storage tracker); the compiled ones only by hand (inductor compiles for seconds).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ftplan.errors import ConfigError
from ftplan.job import Job, LoraSpec, validate_job
from ftplan.memory import _act_dtypes, _logits_bytes
from ftplan.model import model_from_config

RECORDS = Path(__file__).resolve().parents[1] / "benchmarks" / "measurements" / "torchtune_loss_cpu.json"
DOC = json.loads(RECORDS.read_text())


def _spec(hidden: int, vocab: int):
    return model_from_config({"model_type": "llama", "hidden_size": hidden, "intermediate_size": 2 * hidden,
                              "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                              "vocab_size": vocab, "tie_word_embeddings": False})


def _job(method: str, compiled: bool, b: int, s: int) -> Job:
    return Job(method=method, precision="bf16", micro_batch=b, seq_len=s, gradient_checkpointing=True,
               loss="torchtune", torch_compile=compiled, lora=LoraSpec(r=8, alpha=16, dropout=0.0))


def _predicted(rec: dict) -> tuple[int, int, int]:
    """(after the forward, forward peak, step peak) ftplan plans for a record's tail."""
    # aot_eager saves what eager saves (AOTAutograd without inductor's decompositions)
    job = _job(rec["method"], rec["backend"] == "inductor", rec["batch"], rec["seq_len"])
    saved, fwd, bwd = _logits_bytes(_spec(rec["hidden"], rec["vocab"]), job, _act_dtypes(job, "cpu"), 1, "cpu")
    return saved, saved + fwd, saved + max(fwd, bwd)


@pytest.mark.parametrize("rec", DOC["records"], ids=lambda r: "{method}-{backend}-b{batch}s{seq_len}".format(**r))
def test_recorded_tail_equals_formula(rec):
    saved, fwd_peak, peak = _predicted(rec)
    assert rec["forward_end_bytes"] == saved
    assert rec["peak_bytes"] - 8 <= peak <= rec["peak_bytes"] + 8  # aot_eager's scalars: 8 bytes fewer
    if rec["backend"] == "inductor" and fwd_peak == saved:
        # the forward peaks inside the last chunk's compiled kernel (its CPU scratch, < 64 bytes:
        # not planned)
        assert 0 < rec["forward_peak_bytes"] - fwd_peak < 64
    else:
        assert abs(rec["forward_peak_bytes"] - fwd_peak) <= 8
        if rec["backend"] != "aot_eager":
            assert rec["forward_peak_bytes"] == fwd_peak and rec["peak_bytes"] == peak


def test_live_eager_tail_matches():
    """Re-measured with the storage tracker (no profiler start-up): a frozen head, the LoRA rows'."""
    from ftplan.measure.torchtune_loss import measure_tail

    m = measure_tail(batch=3, seq_len=20, hidden=48, vocab=2048, method="lora", backend="eager", counter="dispatch")
    rec = {"method": "lora", "backend": "eager", "batch": 3, "seq_len": 20, "hidden": 48, "vocab": 2048}
    assert (m.forward_end_bytes, m.forward_peak_bytes, m.peak_bytes) == _predicted(rec)


def test_compiled_loss_keeps_half_the_logits_bytes():
    """torchtune's point: compiled, the loss keeps the bf16 logits (t V 2) instead of fp32
    log-probabilities (t V 4)."""
    spec = _spec(4096, 128256)
    eager, comp = (_job("lora", c, 2, 2048) for c in (False, True))
    se = _logits_bytes(spec, eager, _act_dtypes(eager, "cuda"), 1)[0]
    sc = _logits_bytes(spec, comp, _act_dtypes(comp, "cuda"), 1)[0]
    t, v = 2 * 2048, 128256
    assert se - sc == t * v * 4 - (t * v * 2 + 8 * t) + 4 * 8


def test_mixed_precision_is_refused():
    spec = _spec(64, 4096)
    with pytest.raises(ConfigError):
        validate_job(spec, _job("full", True, 2, 32).with_(precision="bf16-mixed"))



def test_torchao_nf4_storage_is_exact():
    """torchao's NF4Tensor (torchtune's QLoRA weights), as the by-hand script recorded it (torchao's
    import alone takes seconds): exactly ``nf4_tensor_bytes``; against bitsandbytes' nf4 with double
    quantization ~n / 8192 bytes less (bf16 per-256 factors)."""
    from ftplan.torchao_nf4 import nf4_tensor_bytes

    assert DOC["nf4"]
    for rec in DOC["nf4"]:
        rows, cols = rec["shape"]
        assert rec["stored_bytes"] == nf4_tensor_bytes(rows * cols), rec
    with pytest.raises(ValueError):
        nf4_tensor_bytes(64 * 255)


def test_fsdp2_without_mixed_precision_gathers_each_dtype():
    """FSDP2 with no param_dtype (pure bf16) gathers a LoRA unit's bf16 base at 2 B and its fp32
    adapters at 4 B (gloo: benchmarks/torchtune_fsdp_output_cpu.py, 139,264 B for a 256x256 bf16
    weight + an 8x256 fp32 one); an all-bf16 unit is gathered as before."""
    from fractions import Fraction

    from ftplan.sharding import Tensor, Unit, fsdp2_transient_bytes

    bf16 = [Unit("layer", (Tensor(256, 256 * 256, Fraction(2), True),), 2)]
    kw = dict(reduce_b=Fraction(2), backend="cpu")
    assert fsdp2_transient_bytes(bf16, 2, param_b=None, **kw) == fsdp2_transient_bytes(bf16, 2, param_b=Fraction(2), **kw)
    lora = [Unit("layer", (Tensor(256, 256 * 256, Fraction(2), False), Tensor(8, 8 * 256, Fraction(4), True)), 2)]
    kw = dict(reduce_b=Fraction(4), backend="cpu")
    own = fsdp2_transient_bytes(lora, 2, param_b=None, **kw)
    assert own < fsdp2_transient_bytes(lora, 2, param_b=Fraction(4), **kw)
    assert own >= 256 * 256 * 2 + 8 * 256 * 4  # at least one unit gathered in its own dtypes
